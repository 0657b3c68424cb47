//! Who leads, watched (`LeaseManager::watch_leader`, `Election::watch_leader`)
//! on a `MemoryBackend` and the paused clock: every change of leader
//! reaches every observer at the instant it happens, and a lease whose
//! holder vanished is reported gone at its expiry.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{AcquireRequest, HolderId, LeaseBackend, LeaseKey, MemoryBackend, Ttl};
use leasehold_watchdog::{CancellationToken, Election, Leader, LeaseManager, LeaseOptions};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// What an observer saw: when, and the leader's fencing token (`None`: no one).
type Seen = Arc<Mutex<Vec<(Instant, Option<u64>)>>>;

/// Each term as its leader saw it: fencing token, when granted, when it
/// stepped down.
type Terms = Arc<Mutex<Vec<(u64, Instant, Option<Instant>)>>>;

/// Records every value `leader` takes, starting with the current one.
fn record(mut leader: watch::Receiver<Option<Leader>>) -> Seen {
    let seen: Seen = Arc::default();
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let token = leader
                .borrow_and_update()
                .as_ref()
                .map(|l| l.fencing_token.map_or(0, |t| t.get()));
            out.lock()
                .expect("not poisoned")
                .push((Instant::now(), token));
            if leader.changed().await.is_err() {
                break;
            }
        }
    });
    seen
}

/// Three candidates, each with a manager of its own (a client of its own,
/// as a process of its own), lead in turn: each term lasts 1 s, then the
/// leader steps down. Every candidate's watch and a fourth manager that
/// never campaigns must see each term start at the instant it was granted
/// and end at the instant it was released: on the paused clock no time
/// passes between a signal and the read it causes, while the fallback
/// timer (at the lease's expiry, 3 s out) would see a release 2 s late and
/// a new leader never.
#[tokio::test(start_paused = true)]
async fn every_observer_sees_every_term_at_the_instant_it_changes() -> TestResult {
    const TERMS: usize = 6;
    let backend = MemoryBackend::new();
    let observer = LeaseManager::new(backend.client())?;
    let mut watched = vec![record(observer.watch_leader("scheduler").await?)];
    // (token, granted at, stepped down at), as the candidates saw them.
    let terms: Terms = Arc::default();
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    let mut elections = Vec::new();
    for i in 0..3 {
        let manager = LeaseManager::new(backend.client())?;
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("3s")?)
            .label(format!("candidate-{i}"))
            .build()?;
        let election = Arc::new(
            Election::new(manager, "scheduler", options)?.pause(Duration::from_millis(500)),
        );
        watched.push(record(election.watch_leader().await?));
        elections.push(election);
    }
    // Every observer watches before the first campaign.
    for election in elections {
        let (terms, stop) = (Arc::clone(&terms), stop.clone());
        runs.push(tokio::spawn(async move {
            let run_election = Arc::clone(&election);
            run_election
                .run(stop.clone(), |work| {
                    let (token, fencing_token) = (work.token().clone(), work.fencing_token());
                    let (terms, stop, election) =
                        (Arc::clone(&terms), stop.clone(), Arc::clone(&election));
                    async move {
                        assert!(election.is_leader(), "leading, yet not is_leader()");
                        let term = {
                            let mut terms = terms.lock().expect("not poisoned");
                            terms.push((fencing_token.get(), Instant::now(), None));
                            terms.len()
                        };
                        tokio::select! {
                            () = token.cancelled() => {}
                            () = sleep(Duration::from_secs(1)) => {}
                        }
                        terms.lock().expect("not poisoned")[term - 1].2 = Some(Instant::now());
                        if term == TERMS {
                            stop.cancel();
                        }
                    }
                })
                .await
        }));
    }
    for run in runs {
        timeout(Duration::from_secs(60), run)
            .await??
            .map_err(|e| e.to_string())?;
    }
    let terms = terms.lock().expect("not poisoned").clone();
    assert_eq!(terms.len(), TERMS);
    for (o, seen) in watched.iter().enumerate() {
        let seen = seen.lock().expect("not poisoned").clone();
        assert_eq!(
            seen[0].1, None,
            "observer {o}: a leader before the first grant"
        );
        // Each term, from the instant it was seen to the instant the next
        // value (no one, or the next term when it was granted at the very
        // instant of the release) replaced it.
        let seen_terms: Vec<(u64, Instant, Option<Instant>)> = seen
            .iter()
            .enumerate()
            .filter_map(|(i, (at, token))| {
                token.map(|token| (token, *at, seen.get(i + 1).map(|(next, _)| *next)))
            })
            .collect();
        assert_eq!(
            seen_terms.iter().map(|t| t.0).collect::<Vec<_>>(),
            terms.iter().map(|t| t.0).collect::<Vec<_>>(),
            "observer {o} saw other leaders than were granted: {seen:?}"
        );
        for ((token, start, end), (_, granted, released)) in seen_terms.iter().zip(&terms) {
            assert_eq!(start, granted, "observer {o}: term {token} seen late");
            assert_eq!(end, released, "observer {o}: term {token}'s end seen late");
        }
    }
    Ok(())
}

/// A holder that vanished (it took the lease and never renewed it, as a
/// crashed process) is reported gone at the lease's expiry, not later: by
/// the timer at the remaining ttl read, since a memory backend, like a
/// server between two expiry cycles, reports no expiry.
#[tokio::test(start_paused = true)]
async fn a_vanished_holder_is_reported_gone_at_its_expiry() -> TestResult {
    let backend = MemoryBackend::new();
    let observer = LeaseManager::new(backend.client())?;
    let mut leader = observer.watch_leader("scheduler").await?;
    assert!(leader.borrow().is_none());

    let crashed = backend.client();
    let ttl = Ttl::parse("2s")?;
    let request = AcquireRequest::new(LeaseKey::new("scheduler")?, HolderId::generate()?, ttl)
        .with_label("crashed")?;
    let granted = Instant::now();
    crashed.try_acquire(&request).await?;
    timeout(Duration::from_secs(1), leader.changed()).await??;
    {
        let seen = leader.borrow_and_update();
        let seen = seen.as_ref().ok_or("no leader seen")?;
        assert_eq!(seen.label.as_deref(), Some("crashed"));
        assert_eq!(seen.since, granted, "the grant was seen late");
    }

    timeout(Duration::from_secs(10), leader.changed()).await??;
    assert!(leader.borrow().is_none());
    let late = Instant::now() - (granted + ttl.get());
    assert!(
        late <= Duration::from_millis(5),
        "reported gone {late:?} after the lease expired"
    );
    Ok(())
}

/// `has_leader` follows the watched value and `is_leader` the candidate's
/// own lease: false once it is released, without a round trip.
#[tokio::test(start_paused = true)]
async fn readiness_answers_follow_the_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.client())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .label("me")
        .build()?;
    let election = Election::new(manager, "scheduler", options)?;
    let mut leader = election.watch_leader().await?;
    assert!(!election.is_leader() && !election.has_leader());

    let lease = election.campaign().await?;
    assert!(election.is_leader());
    timeout(Duration::from_secs(1), leader.wait_for(Option::is_some)).await??;
    assert!(election.has_leader());

    lease.release().await?;
    assert!(!election.is_leader(), "is_leader after the release");
    timeout(Duration::from_secs(1), leader.wait_for(Option::is_none)).await??;
    assert!(!election.has_leader());

    // A lease dropped without a release: the watchdog releases it, and
    // is_leader says no once it has.
    let lease = election.campaign().await?;
    assert!(election.is_leader());
    drop(lease);
    timeout(Duration::from_secs(1), async {
        while election.is_leader() {
            // No signal says when the watchdog let the lease go.
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .map_err(|_| "is_leader after the lease was dropped and released")?;
    timeout(Duration::from_secs(1), leader.wait_for(Option::is_none)).await??;

    // Someone else leads: has_leader, not is_leader.
    let other = LeaseManager::new(backend.client())?;
    let theirs = other.acquire("scheduler", &LeaseOptions::default()).await?;
    timeout(Duration::from_secs(1), leader.wait_for(Option::is_some)).await??;
    assert!(election.has_leader() && !election.is_leader());
    theirs.release().await?;
    Ok(())
}

/// A watch whose last receiver was dropped ends its task; watching the key
/// again, at once or after the task ended, gets a watch that still follows
/// the lease (not the ended task's stale value).
#[tokio::test(start_paused = true)]
async fn watching_again_after_the_last_receiver_went_still_follows_the_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let observer = LeaseManager::new(backend.client())?;
    let holder = LeaseManager::new(backend.client())?;
    for wait_for_the_task_to_end in [false, true] {
        drop(observer.watch_leader("scheduler").await?);
        if wait_for_the_task_to_end {
            // The task ends at its next poll, which this lets happen.
            sleep(Duration::from_millis(1)).await;
        }
        let mut leader = observer.watch_leader("scheduler").await?;
        assert!(leader.borrow_and_update().is_none());
        let lease = holder
            .acquire("scheduler", &LeaseOptions::default())
            .await?;
        timeout(Duration::from_secs(1), leader.wait_for(Option::is_some)).await??;
        lease.release().await?;
        timeout(Duration::from_secs(1), leader.wait_for(Option::is_none)).await??;
    }
    Ok(())
}

/// A backend that reports no changes and no releases (as a Redis Cluster
/// reports no changes): only what it must implement.
#[derive(Clone)]
struct Unreporting(MemoryBackend);

impl LeaseBackend for Unreporting {
    async fn try_acquire(
        &self,
        request: &AcquireRequest,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::BackendError> {
        self.0.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[leasehold_core::RenewRequest],
    ) -> Vec<Result<leasehold_core::RenewOutcome, leasehold_core::BackendError>> {
        self.0.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<leasehold_core::ReleaseReport, leasehold_core::BackendError> {
        self.0.release(key, holder).await
    }

    async fn inspect(
        &self,
        key: &LeaseKey,
    ) -> Result<Option<leasehold_core::LeaseInfo>, leasehold_core::BackendError> {
        self.0.inspect(key).await
    }
}

/// Where the backend reports nothing, a watch reads the key again every
/// `UNREPORTED_RECHECK` (and no later than the holder's expiry): a new
/// holder and its release are each seen within that, not never.
#[tokio::test(start_paused = true)]
async fn without_reports_a_watch_reads_again_every_recheck() -> TestResult {
    let backend = MemoryBackend::new();
    let observer = LeaseManager::new(Unreporting(backend.client()))?;
    let mut leader = observer.watch_leader("scheduler").await?;
    let other = backend.client();
    let (key, holder) = (LeaseKey::new("scheduler")?, HolderId::generate()?);
    let request = AcquireRequest::new(key.clone(), holder, Ttl::parse("30s")?);
    for what in ["grant", "release"] {
        let changed_at = Instant::now();
        if what == "grant" {
            other.try_acquire(&request).await?;
        } else {
            other.release(&key, &holder).await?;
        }
        timeout(leasehold_watchdog::UNREPORTED_RECHECK * 2, leader.changed())
            .await
            .map_err(|_| format!("the {what} was never seen"))??;
        let late = Instant::now() - changed_at;
        assert!(
            late <= leasehold_watchdog::UNREPORTED_RECHECK,
            "the {what} was seen {late:?} after it happened"
        );
        assert_eq!(leader.borrow_and_update().is_some(), what == "grant");
    }
    Ok(())
}

/// Reading the same state again publishes nothing: a free key read every
/// recheck stays one `None`, and a holder renewing its lease (a new ttl
/// each read) stays one term. A watcher is woken only by a change.
#[tokio::test(start_paused = true)]
async fn reading_the_same_term_again_publishes_nothing() -> TestResult {
    let backend = MemoryBackend::new();
    let observer = LeaseManager::new(Unreporting(backend.client()))?;
    let mut leader = observer.watch_leader("scheduler").await?;
    let recheck = leasehold_watchdog::UNREPORTED_RECHECK;
    tokio::time::sleep(recheck / 10).await;
    leader.borrow_and_update();
    tokio::time::sleep(recheck * 5).await;
    assert!(
        !leader.has_changed()?,
        "a free key read again was published again: {:?}",
        *leader.borrow()
    );

    let other = backend.client();
    let (key, holder) = (LeaseKey::new("scheduler")?, HolderId::generate()?);
    let ttl = Ttl::parse("3s")?;
    other
        .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
        .await?;
    timeout(recheck * 2, leader.changed()).await??;
    assert!(leader.borrow_and_update().is_some());
    for _ in 0..5 {
        tokio::time::sleep(recheck).await;
        other
            .renew(&leasehold_core::RenewRequest::new(key.clone(), holder, ttl))
            .await?;
    }
    assert!(
        !leader.has_changed()?,
        "a renewed term was published again: {:?}",
        *leader.borrow()
    );
    Ok(())
}

/// A backend whose reads fail once `failing` is set, counting them.
#[derive(Clone)]
struct Unreadable {
    inner: MemoryBackend,
    failing: Arc<std::sync::atomic::AtomicBool>,
    reads: Arc<std::sync::atomic::AtomicUsize>,
}

impl LeaseBackend for Unreadable {
    async fn try_acquire(
        &self,
        request: &AcquireRequest,
    ) -> Result<leasehold_core::AcquireOutcome, leasehold_core::BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[leasehold_core::RenewRequest],
    ) -> Vec<Result<leasehold_core::RenewOutcome, leasehold_core::BackendError>> {
        self.inner.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<leasehold_core::ReleaseReport, leasehold_core::BackendError> {
        self.inner.release(key, holder).await
    }

    async fn inspect(
        &self,
        key: &LeaseKey,
    ) -> Result<Option<leasehold_core::LeaseInfo>, leasehold_core::BackendError> {
        if !self.failing.load(std::sync::atomic::Ordering::Relaxed) {
            return self.inner.inspect(key).await;
        }
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Err(leasehold_core::BackendError::UnexpectedReply {
            op: "inspect",
            key: key.to_string(),
            detail: "unreadable on purpose".to_owned(),
        })
    }
}

/// A watch whose reads fail keeps the last leader it read and tries again
/// every 250 ms: four reads a second, not a loop that spins.
#[tokio::test(start_paused = true)]
async fn failing_reads_are_retried_at_a_pace() -> TestResult {
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let backend = Unreadable {
        inner: MemoryBackend::new(),
        failing: Arc::clone(&failing),
        reads: Arc::clone(&reads),
    };
    let observer = LeaseManager::new(backend)?;
    let leader = observer.watch_leader("scheduler").await?;
    failing.store(true, std::sync::atomic::Ordering::Relaxed);
    // The free key is read again after the recheck (1 s), then, failing,
    // every 250 ms: at 1, 1.25, ... 3 s.
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let n = reads.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        (8..=10).contains(&n),
        "{n} failed reads in 3.1 s: not one at the recheck and then one every 250 ms"
    );
    assert!(leader.borrow().is_none());
    Ok(())
}
