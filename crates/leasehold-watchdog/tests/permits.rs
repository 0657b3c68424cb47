//! Counting leases through the manager, on `MemoryBackend` and tokio's
//! paused clock. The backend's own store (`inspect` of each permit key) is
//! the witness of who holds what.

mod common;

use common::{
    RequiredOnly, TestResult, check_not_taken_straight_back, check_renewed_then_lost, key, waiting,
    within,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{BackendError, LeaseBackend, LeaseKey, MemoryBackend, PermitLimit, Ttl};
use leasehold_watchdog::{Backoff, LeaseError, LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep};

fn limit(n: u32) -> PermitLimit {
    PermitLimit::new(n).expect("valid limit")
}

/// How many of `semaphore`'s first `n` permit keys the backend holds.
async fn held(backend: &MemoryBackend, semaphore: &LeaseKey, n: u32) -> usize {
    let mut held = 0;
    for i in 0..n {
        let permit = semaphore.permit(i).expect("permit key");
        if backend.inspect(&permit).await.expect("inspect").is_some() {
            held += 1;
        }
    }
    held
}

#[tokio::test(start_paused = true)]
async fn many_tasks_never_hold_more_than_the_limit() -> TestResult {
    let backend = MemoryBackend::new();
    backend.set_latency(Duration::from_millis(3));
    let semaphore = key("jobs");
    // Holders outlive their 1.5 s ttl: only renewal keeps their permits.
    let options = waiting("1500ms", Duration::from_millis(700));
    let managers = [
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    ];
    let believing = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..24 {
        let manager = managers[i % managers.len()].clone();
        let (backend, semaphore, options) = (backend.clone(), semaphore.clone(), options.clone());
        let (believing, most) = (Arc::clone(&believing), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let permit = manager
                .acquire_permit(semaphore.as_str(), limit(3), &options)
                .await?;
            let now = believing.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // Every holder's belief is backed by a permit in the store.
            let in_store = held(&backend, &semaphore, 4).await;
            assert!(now <= 3, "{now} holders believe they hold a permit");
            assert!(in_store <= 3, "{in_store} permits in the store");
            assert!(backend.inspect(&permit.server_key()).await?.is_some());
            sleep(Duration::from_millis(2000 + 100 * (i as u64 % 5))).await;
            assert_eq!(permit.loss_reason(), None, "a holder lost its permit");
            believing.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            Ok::<_, LeaseError>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(120), "a contender", task).await??;
    }
    assert_eq!(most.load(Ordering::SeqCst), 3, "the permits were shared");
    assert_eq!(held(&backend, &semaphore, 3).await, 0);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_waiter_wakes_when_a_permit_is_released() -> TestResult {
    let backend = MemoryBackend::new();
    let holder = LeaseManager::new(backend.clone())?;
    let waiter = LeaseManager::new(backend.clone())?;
    let poll = Duration::from_secs(30);
    let options = waiting("20s", poll);
    let first = holder.acquire_permit("exports", limit(2), &options).await?;
    let second = holder.acquire_permit("exports", limit(2), &options).await?;
    let waiting = tokio::spawn(async move {
        let permit = waiter.acquire_permit("exports", limit(2), &options).await?;
        Ok::<_, LeaseError>((Instant::now(), permit))
    });
    // The waiter's first attempt is refused; it subscribes and retries.
    sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished());
    let released_at = Instant::now();
    let freed = second.server_key();
    second.release().await?;
    let (acquired_at, permit) = within(Duration::from_secs(90), "the waiter", waiting).await??;
    // Woken by the release, not by its poll (at least 18 s away: the
    // holder's remaining ttl bounds it).
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "the waiter got a permit {:?} after the release",
        acquired_at - released_at
    );
    assert_eq!(permit.server_key(), freed);
    assert!(first.fencing_token() < permit.fencing_token());
    Ok(())
}

/// A worker that releases its permit and asks again at once, as a loop
/// does, while a waiter elsewhere heard the release: the waiter gets the
/// permit first (the releasing manager yields, as after an exclusive
/// lease's release), and the worker gets it after that waiter's release.
/// The semaphore's name is spelled both ways a backend keeps in one place.
#[tokio::test(start_paused = true)]
async fn a_permit_released_to_a_waiter_elsewhere_is_not_taken_straight_back() -> TestResult {
    for semaphore in ["exports", "{exports}"] {
        let options = waiting("20s", Duration::from_secs(30));
        check_not_taken_straight_back("permit", move |manager| {
            let options = options.clone();
            async move { manager.acquire_permit(semaphore, limit(1), &options).await }
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_permit_is_renewed_and_its_loss_fires_the_token() -> TestResult {
    let backend = MemoryBackend::new();
    // Changes are not reported: only a renewal can tell of the loss.
    backend.cut_changes();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::with_ttl(Ttl::parse("600ms")?);
    let permit = manager.acquire_permit("render", limit(2), &options).await?;
    check_renewed_then_lost(&backend, permit).await
}

#[tokio::test(start_paused = true)]
async fn a_limit_mismatch_ends_the_wait_at_once() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = waiting("10s", Duration::from_secs(1));
    let _held = manager.acquire_permit("pool", limit(2), &options).await?;
    let started = Instant::now();
    let error = within(
        Duration::from_secs(90),
        "the mismatch",
        manager.acquire_permit("pool", limit(3), &options),
    )
    .await
    .expect_err("a permit under another limit");
    // Not retried: no attempt after the first (retries are a second apart).
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    match &error {
        LeaseError::Backend(BackendError::PermitLimitMismatch { key, asked, held }) => {
            assert_eq!((key.as_str(), *asked, *held), ("pool", 3, 2));
        }
        other => panic!("not a limit mismatch: {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("limit of 2") && text.contains("same limit"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_backend_without_permits_is_a_final_error() -> TestResult {
    let manager = LeaseManager::new(RequiredOnly(MemoryBackend::new()))?;
    let options = waiting("10s", Duration::from_secs(1));
    let started = Instant::now();
    let error = within(
        Duration::from_secs(90),
        "the refusal",
        manager.acquire_permit("pool", limit(3), &options),
    )
    .await
    .expect_err("no permits");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(error, LeaseError::Backend(BackendError::Unsupported { .. })),
        "{error:?}"
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise_across_permits() -> TestResult {
    let backend = MemoryBackend::new();
    let managers = [
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    ];
    let options = waiting("10s", Duration::from_secs(1));
    let mut held = Vec::new();
    let mut tokens = Vec::new();
    // Take all three, then cycle: each new permit (whichever key it gets)
    // must carry a token above every earlier one.
    for round in 0..12 {
        if held.len() == 3 {
            let oldest: leasehold_watchdog::Lease = held.remove(round % 3);
            oldest.release().await?;
        }
        let permit = managers[round % 2]
            .acquire_permit("fence", limit(3), &options)
            .await?;
        tokens.push((permit.server_key(), permit.fencing_token()));
        held.push(permit);
    }
    let keys: std::collections::HashSet<_> = tokens.iter().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys.len(), 3, "every permit key was used: {keys:?}");
    for pair in tokens.windows(2) {
        assert!(pair[0].1 < pair[1].1, "tokens did not rise: {tokens:?}");
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_exclusive_lease_and_a_semaphore_of_one_name_do_not_mix() -> TestResult {
    // One manager, one name, both kinds: releases of either kind never
    // hand the other kind's waiter a lease it did not ask for.
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = waiting("10s", Duration::from_secs(5));
    let exclusive = manager.acquire("mixed", &options).await?;
    let permit = manager.acquire_permit("mixed", limit(1), &options).await?;
    let (m1, o1) = (manager.clone(), options.clone());
    let permit_waiter =
        tokio::spawn(async move { m1.acquire_permit("mixed", limit(1), &o1).await });
    sleep(Duration::from_millis(100)).await;
    // The exclusive lease's release finds the permit waiter at the head of
    // the queue of "mixed": it must not grant it the exclusive lease.
    exclusive.release().await?;
    sleep(Duration::from_millis(100)).await;
    assert!(
        !permit_waiter.is_finished(),
        "a permit waiter got the exclusive lease"
    );
    let freed = permit.server_key();
    permit.release().await?;
    let got = within(Duration::from_secs(60), "the permit waiter", permit_waiter).await??;
    assert_eq!(got.server_key(), freed);
    assert_eq!(backend.inspect(&key("mixed")).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn waiters_for_a_full_semaphore_obey_the_wait_and_the_bound() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::builder(backend.clone())
        .max_waiters(1)
        .start()?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("30s")?)
        .wait(Duration::from_secs(2))
        .backoff(Backoff::fixed(Duration::from_millis(400)))
        .label("holder-1")
        .build()?;
    let held = manager.acquire_permit("full", limit(1), &options).await?;
    // The queue's one place is taken: a second waiter is refused at once.
    let first = {
        let (manager, options) = (manager.clone(), options.clone());
        tokio::spawn(async move { manager.acquire_permit("full", limit(1), &options).await })
    };
    sleep(Duration::from_millis(100)).await;
    let busy = manager.acquire_permit("full", limit(1), &options).await;
    assert!(
        matches!(&busy, Err(LeaseError::Busy { key, waiters: 1 }) if key == "full"),
        "{busy:?}"
    );
    let started = Instant::now() - Duration::from_millis(100);
    match within(Duration::from_secs(60), "the waiter", first).await? {
        Err(LeaseError::NotAcquired {
            key,
            waited,
            holder,
        }) => {
            assert_eq!(key, "full");
            assert!(waited >= Duration::from_secs(2), "{waited:?}");
            assert_eq!(holder.label.as_deref(), Some("holder-1"));
        }
        other => panic!("the wait should have run out: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(backend.inspect(&held.server_key()).await?.is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_dropped_permit_and_a_shut_down_manager_free_their_permits() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = waiting("10s", Duration::from_secs(1));
    let dropped = manager.acquire_permit("freed", limit(2), &options).await?;
    let dropped_key = dropped.server_key();
    drop(dropped);
    within(
        Duration::from_secs(5),
        "the dropped permit's release",
        async {
            while backend.inspect(&dropped_key).await.ok().flatten().is_some() {
                sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    let kept = manager.acquire_permit("freed", limit(2), &options).await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    assert_eq!(kept.loss_reason(), Some(LossReason::Shutdown));
    assert_eq!(backend.inspect(&kept.server_key()).await?, None);
    assert_eq!(held(&backend, &key("freed"), 2).await, 0);
    Ok(())
}

/// A `MemoryBackend` with two twists on its permits, as a backend of
/// another kind might have them: with `own_keys`, each semaphore's one
/// permit is kept under a key of the backend's choosing
/// (`<semaphore>-own`), not the permit keys the manager would derive;
/// while `lose` is set, a permit acquisition is granted and then never
/// answered (the reply lost on the way back).
#[derive(Clone)]
struct PermitTwists {
    inner: MemoryBackend,
    own_keys: bool,
    lose: Arc<std::sync::atomic::AtomicBool>,
}

impl PermitTwists {
    fn new(inner: MemoryBackend, own_keys: bool, lose: bool) -> Self {
        Self {
            inner,
            own_keys,
            lose: Arc::new(std::sync::atomic::AtomicBool::new(lose)),
        }
    }
}

impl LeaseBackend for PermitTwists {
    async fn try_acquire(
        &self,
        request: &leasehold_core::AcquireRequest,
    ) -> Result<leasehold_core::AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[leasehold_core::RenewRequest],
    ) -> Vec<Result<leasehold_core::RenewOutcome, BackendError>> {
        self.inner.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<leasehold_core::ReleaseReport, BackendError> {
        self.inner.release(key, holder).await
    }

    async fn inspect(
        &self,
        key: &LeaseKey,
    ) -> Result<Option<leasehold_core::LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
    }

    fn permits(&self) -> Option<&impl leasehold_core::PermitBackend> {
        Some(self)
    }
}

impl leasehold_core::PermitBackend for PermitTwists {
    async fn try_acquire_permit(
        &self,
        request: &leasehold_core::AcquireRequest,
        limit: PermitLimit,
    ) -> Result<leasehold_core::AcquireOutcome, BackendError> {
        let outcome = if self.own_keys {
            let own = LeaseKey::new(format!("{}-own", request.key)).map_err(|e| {
                BackendError::UnexpectedReply {
                    op: "acquire_permit",
                    key: request.key.as_str().to_owned(),
                    detail: e.to_string(),
                }
            })?;
            let mut mine = request.clone();
            mine.key = own;
            self.inner.try_acquire(&mine).await
        } else {
            self.inner.try_acquire_permit(request, limit).await
        };
        if self.lose.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        outcome
    }
}

/// A permit acquisition abandoned after the server granted it a permit
/// (the reply lost on the way back) leaves no permit behind: which permit
/// it took is unknown, so the watchdog releases each of the semaphore's
/// (only the holder's own is deleted), and the permit is free again
/// long before its ttl.
#[tokio::test(start_paused = true)]
async fn an_abandoned_permit_acquisition_that_took_a_permit_leaves_none_behind() -> TestResult {
    let memory = MemoryBackend::new();
    let backend = PermitTwists::new(memory.clone(), false, true);
    let manager = LeaseManager::new(backend.clone())?;
    let semaphore = key("orphans");
    let options = LeaseOptions::with_ttl(Ttl::parse("30s")?);
    let attempt = tokio::time::timeout(
        Duration::from_secs(1),
        manager.acquire_permit(semaphore.as_str(), limit(3), &options),
    )
    .await;
    assert!(attempt.is_err(), "the reply was lost: {attempt:?}");
    backend.lose.store(false, Ordering::SeqCst);
    assert_eq!(held(&memory, &semaphore, 3).await, 1, "taken on the server");
    within(
        Duration::from_secs(5),
        "the orphan permit's release",
        async {
            while held(&memory, &semaphore, 3).await > 0 {
                sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    Ok(())
}

/// A permit granted under a key the backend chose is kept, renewed and
/// released under that key: the release frees it on the server.
#[tokio::test(start_paused = true)]
async fn a_permit_under_a_key_the_backend_chose_is_released_there() -> TestResult {
    let memory = MemoryBackend::new();
    let manager = LeaseManager::new(PermitTwists::new(memory.clone(), true, false))?;
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let permit = manager.acquire_permit("pool", limit(2), &options).await?;
    let own = key("pool-own");
    assert!(memory.inspect(&own).await?.is_some(), "granted there");
    // Renewed there: alive past its first ttl.
    sleep(Duration::from_secs(4)).await;
    assert_eq!(permit.loss_reason(), None);
    assert_eq!(
        permit.release().await?,
        leasehold_core::ReleaseOutcome::Released
    );
    assert_eq!(memory.inspect(&own).await?, None, "released there");
    Ok(())
}
