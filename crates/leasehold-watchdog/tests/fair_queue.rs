//! Fair mode through the manager, on `MemoryBackend` and tokio's paused
//! clock. Witnesses: the order in which this test started the waiters (a
//! history the library does not shape) against the order of the grants'
//! fencing tokens, and the backend's own store (`inspect`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{RequiredOnly, TestResult, key, within};
use leasehold_core::{BackendError, FencingToken, LeaseBackend, MemoryBackend, Ttl};
use leasehold_watchdog::{Backoff, Fair, LeaseError, LeaseManager, LeaseOptions};
use tokio::time::{Instant, sleep};

/// Fair options: waits up to a minute, polls every `poll`.
fn fair(poll: Duration, place_ttl: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("2s").expect("valid ttl"))
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(poll))
        .fair(Fair::default().with_place_ttl(place_ttl))
        .build()
        .expect("valid options")
}

/// Six waiters, each in its own manager, start one after another while
/// the lease is held, without release notices, each polling sooner than
/// the one before it (so that without the queue the latest to arrive would
/// ask first after every release). They get the lease in the order they
/// started, their fencing tokens rising in that order.
#[tokio::test(start_paused = true)]
async fn waiters_of_every_manager_get_the_lease_in_arrival_order() -> TestResult {
    let backend = MemoryBackend::new();
    let lease = key("fair:order");
    let first = LeaseManager::new(backend.clone())?;
    let held = first
        .acquire(
            lease.as_str(),
            &fair(Duration::from_millis(5), Duration::from_secs(10)),
        )
        .await?;
    let grants: Arc<Mutex<Vec<(usize, FencingToken)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..6u64 {
        let manager = LeaseManager::new(backend.clone())?;
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("2s")?)
            .wait(Duration::from_secs(60))
            .backoff(Backoff::fixed(Duration::from_millis(70 - 10 * i)))
            .release_notices(false)
            .fair(Fair::default().with_place_ttl(Duration::from_secs(10)))
            .build()?;
        let (lease, grants) = (lease.clone(), Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            let won = manager.acquire(lease.as_str(), &options).await?;
            grants
                .lock()
                .expect("not poisoned")
                .push((i as usize, won.fencing_token()));
            sleep(Duration::from_millis(3)).await;
            won.release().await?;
            Ok::<_, LeaseError>(())
        }));
        // The paused clock moves only once every task waits: by then this
        // waiter has asked once and holds its place.
        sleep(Duration::from_millis(1)).await;
    }
    held.release().await?;
    for task in tasks {
        within(Duration::from_secs(30), "a waiter", task).await??;
    }
    let grants = grants.lock().expect("not poisoned").clone();
    let order: Vec<usize> = grants.iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2, 3, 4, 5], "grants out of arrival order");
    assert!(grants.windows(2).all(|w| w[0].1 < w[1].1), "{grants:?}");
    Ok(())
}

/// The head waits for the release notice, not for its poll: with a poll of
/// 10 s it has the lease the moment the holder releases.
#[tokio::test(start_paused = true)]
async fn the_head_is_woken_by_the_release_notice() -> TestResult {
    let backend = MemoryBackend::new();
    let lease = key("fair:notice");
    let options = fair(Duration::from_secs(10), Duration::from_secs(30));
    let holder = LeaseManager::new(backend.clone())?;
    let held = holder.acquire(lease.as_str(), &options).await?;
    let waiter = LeaseManager::new(backend.clone())?;
    let (lease2, options2) = (lease.clone(), options.clone());
    let task = tokio::spawn(async move {
        let won = waiter.acquire(lease2.as_str(), &options2).await?;
        Ok::<_, LeaseError>((Instant::now(), won))
    });
    sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    held.release().await?;
    let (granted, won) = within(Duration::from_secs(5), "the waiter", task).await??;
    assert!(
        granted - released < Duration::from_millis(50),
        "granted {:?} after the release",
        granted - released
    );
    let info = backend.inspect(&lease).await?.expect("held");
    assert_eq!(info.fencing_token, Some(won.fencing_token()));
    won.release().await?;
    Ok(())
}

/// A waiter whose wait was dropped (as a killed process's) keeps its place
/// until the place ttl runs out, then is skipped: the waiter behind it gets
/// the lease no sooner than the dead place expired, and within one refresh
/// (a third of the place ttl) of it.
#[tokio::test(start_paused = true)]
async fn a_dead_waiters_place_is_skipped_once_it_expires() -> TestResult {
    let backend = MemoryBackend::new();
    let lease = key("fair:dead");
    let place_ttl = Duration::from_millis(300);
    let options = fair(Duration::from_millis(20), place_ttl);
    let holder = LeaseManager::new(backend.clone())?;
    let held = holder.acquire(lease.as_str(), &options).await?;
    let dead = LeaseManager::new(backend.clone())?;
    let (lease2, options2) = (lease.clone(), options.clone());
    let dying = tokio::spawn(async move { dead.acquire(lease2.as_str(), &options2).await });
    sleep(Duration::from_millis(1)).await;
    // Its last refresh was its first call, at `placed`.
    let placed = Instant::now() - Duration::from_millis(1);
    dying.abort();
    let alive = LeaseManager::new(backend.clone())?;
    let (lease3, options3) = (lease.clone(), options.clone());
    let task = tokio::spawn(async move {
        let won = alive.acquire(lease3.as_str(), &options3).await?;
        Ok::<_, LeaseError>((Instant::now(), won))
    });
    sleep(Duration::from_millis(1)).await;
    held.release().await?;
    let (granted, won) = within(Duration::from_secs(5), "the waiter behind", task).await??;
    let after = granted - placed;
    assert!(
        after >= place_ttl,
        "granted {after:?} after the dead place was taken"
    );
    assert!(
        after <= place_ttl + place_ttl / 3 + Duration::from_millis(5),
        "skipped only {after:?} after the dead place was taken"
    );
    won.release().await?;
    Ok(())
}

/// A waiter that gives up leaves its place at once: the waiter behind it
/// gets the lease on the holder's release, long before the place would
/// have expired.
#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_leaves_its_place() -> TestResult {
    let backend = MemoryBackend::new();
    let lease = key("fair:give-up");
    let options = fair(Duration::from_millis(20), Duration::from_secs(30));
    let holder = LeaseManager::new(backend.clone())?;
    let held = holder.acquire(lease.as_str(), &options).await?;
    let quitter = LeaseManager::new(backend.clone())?;
    let short = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .wait(Duration::from_millis(100))
        .fair(Fair::default().with_place_ttl(Duration::from_secs(30)))
        .build()?;
    let lease2 = lease.clone();
    let quitting = tokio::spawn(async move { quitter.acquire(lease2.as_str(), &short).await });
    sleep(Duration::from_millis(1)).await;
    let next = LeaseManager::new(backend.clone())?;
    let (lease3, options3) = (lease.clone(), options.clone());
    let task = tokio::spawn(async move {
        let won = next.acquire(lease3.as_str(), &options3).await?;
        Ok::<_, LeaseError>((Instant::now(), won))
    });
    let gave_up = within(Duration::from_secs(5), "the quitter", quitting).await?;
    assert!(
        matches!(gave_up, Err(LeaseError::NotAcquired { .. })),
        "{gave_up:?}"
    );
    sleep(Duration::from_millis(400)).await;
    let released = Instant::now();
    held.release().await?;
    let (granted, won) = within(Duration::from_secs(60), "the waiter behind", task).await??;
    assert!(
        granted - released < Duration::from_millis(50),
        "granted {:?} after the release",
        granted - released
    );
    won.release().await?;
    Ok(())
}

/// A lease won in fair mode is an ordinary lease: the watchdog renews it
/// past its ttl, and the store keeps it under its fencing token.
#[tokio::test(start_paused = true)]
async fn a_fair_lease_is_renewed_as_any_other() -> TestResult {
    let backend = MemoryBackend::new();
    let lease = key("fair:renewed");
    let manager = LeaseManager::new(backend.clone())?;
    let won = manager
        .acquire(
            lease.as_str(),
            &fair(Duration::from_millis(20), Duration::from_secs(2)),
        )
        .await?;
    sleep(Duration::from_secs(7)).await;
    assert_eq!(won.loss_reason(), None);
    assert!(won.renewals() >= 3, "{} renewals", won.renewals());
    let info = backend.inspect(&lease).await?.expect("still held");
    assert_eq!(info.fencing_token, Some(won.fencing_token()));
    won.release().await?;
    assert!(backend.inspect(&lease).await?.is_none());
    Ok(())
}

/// A backend without a fair queue refuses fair mode with a typed error.
#[tokio::test(start_paused = true)]
async fn a_backend_without_a_fair_queue_refuses_fair_mode() -> TestResult {
    let manager = LeaseManager::new(RequiredOnly(MemoryBackend::new()))?;
    let refused = manager
        .acquire(
            "fair:refused",
            &fair(Duration::from_millis(20), Duration::from_secs(2)),
        )
        .await;
    assert!(
        matches!(
            &refused,
            Err(LeaseError::Backend(BackendError::Unsupported {
                op: "acquire_fair",
                ..
            }))
        ),
        "{refused:?}"
    );
    Ok(())
}

/// The gauge of places queued on the server, as the last reply to this
/// process reported it, for lease name `name`.
fn fair_queued(snapshotter: &metrics_util::debugging::Snapshotter, name: &str) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, value)| {
            let key = key.key();
            let named = key.labels().any(|l| l.key() == "name" && l.value() == name);
            match value {
                metrics_util::debugging::DebugValue::Gauge(g)
                    if key.name() == leasehold_watchdog::metrics::FAIR_QUEUED && named =>
                {
                    Some(g.0)
                }
                _ => None,
            }
        })
}

/// The gauge of waiters queued on the server follows the queue: three
/// while three wait behind the holder, none once the last was granted.
#[tokio::test(start_paused = true)]
async fn the_queue_gauge_counts_the_waiters_on_the_server() -> TestResult {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install()?;
    let backend = MemoryBackend::new();
    let lease = key("fair:gauge");
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(Duration::from_millis(20)))
        .name("fair-gauge")
        .fair(Fair::default())
        .build()?;
    let holder = LeaseManager::new(backend.clone())?;
    let held = holder.acquire(lease.as_str(), &options).await?;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let manager = LeaseManager::new(backend.clone())?;
        let (lease, options) = (lease.clone(), options.clone());
        tasks.push(tokio::spawn(async move {
            let won = manager.acquire(lease.as_str(), &options).await?;
            sleep(Duration::from_millis(5)).await;
            won.release().await?;
            Ok::<_, LeaseError>(())
        }));
        sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(fair_queued(&snapshotter, "fair-gauge"), Some(3.0));
    held.release().await?;
    for task in tasks {
        within(Duration::from_secs(30), "a waiter", task).await??;
    }
    assert_eq!(fair_queued(&snapshotter, "fair-gauge"), Some(0.0));
    Ok(())
}

/// A place ttl out of its bounds is refused when the options are built.
#[test]
fn a_place_ttl_out_of_bounds_is_refused() {
    for bad in [Duration::from_millis(10), Duration::from_secs(120)] {
        let built = LeaseOptions::builder()
            .fair(Fair::default().with_place_ttl(bad))
            .build();
        assert!(
            matches!(&built, Err(LeaseError::Invalid(_))),
            "{bad:?}: {built:?}"
        );
    }
    let fair = LeaseOptions::builder()
        .fair(Fair::default())
        .build()
        .expect("valid");
    assert_eq!(
        fair.fair().map(|f| f.place_ttl()),
        Some(Duration::from_secs(2))
    );
    assert_eq!(fair.fair().map(|f| f.handover()), Some(true));
    assert_eq!(LeaseOptions::default().fair(), None);
}

/// Fair mode is for exclusive leases: asked for a permit, a reader's or a
/// writer's share, it is refused as not applicable, not silently ignored, and
/// the backend is never asked.
#[tokio::test(start_paused = true)]
async fn fair_mode_is_refused_for_permits_and_shares() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = fair(Duration::from_millis(100), Duration::from_secs(5));
    let limit = leasehold_watchdog::PermitLimit::new(2)?;
    let refusals = [
        manager.acquire_permit("pool", limit, &options).await.err(),
        manager.acquire_read("doc", &options).await.err(),
        manager.acquire_write("doc", &options).await.err(),
    ];
    for refused in refusals {
        assert!(
            matches!(
                &refused,
                Some(LeaseError::NotApplicable { option: "fair", .. })
            ),
            "{refused:?}"
        );
    }
    for k in ["{pool}:permit:0", "{doc}:write"] {
        assert_eq!(backend.inspect(&key(k)).await?, None, "{k} was not taken");
    }
    Ok(())
}

/// `MemoryBackend` with its fair queue, counting the releases of each kind.
#[derive(Clone, Default)]
struct CountingReleases {
    inner: MemoryBackend,
    /// Plain releases, fair releases.
    counts: Arc<Mutex<(u32, u32)>>,
}

impl CountingReleases {
    fn counts(&self) -> (u32, u32) {
        *self.counts.lock().expect("not poisoned")
    }
}

impl LeaseBackend for CountingReleases {
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
        key: &leasehold_core::LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<leasehold_core::ReleaseReport, BackendError> {
        self.counts.lock().expect("not poisoned").0 += 1;
        self.inner.release(key, holder).await
    }

    async fn inspect(
        &self,
        key: &leasehold_core::LeaseKey,
    ) -> Result<Option<leasehold_core::LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
    }

    fn fair(&self) -> Option<&impl leasehold_core::FairBackend> {
        Some(self)
    }
}

impl leasehold_core::FairBackend for CountingReleases {
    async fn try_acquire_fair(
        &self,
        request: &leasehold_core::AcquireRequest,
        place_ttl: leasehold_core::PlaceTtl,
        handover: Option<Duration>,
    ) -> Result<leasehold_core::FairOutcome, BackendError> {
        self.inner
            .try_acquire_fair(request, place_ttl, handover)
            .await
    }

    async fn release_fair(
        &self,
        key: &leasehold_core::LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<leasehold_core::ReleaseOutcome, BackendError> {
        self.counts.lock().expect("not poisoned").1 += 1;
        self.inner.release(key, holder).await.map(|r| r.outcome())
    }

    async fn watch_handover(
        &self,
        key: &leasehold_core::LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<leasehold_core::HandoverWatch, BackendError> {
        self.inner.watch_handover(key, holder).await
    }

    async fn leave_fair_queue(
        &self,
        key: &leasehold_core::LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<(), BackendError> {
        self.inner.leave_fair_queue(key, holder).await
    }
}

/// A lease taken in fair mode is released through the fair queue (which,
/// on a server that hands over, gives it to the queue's head in the same
/// step); any other lease by a plain release.
#[tokio::test(start_paused = true)]
async fn a_fair_lease_is_released_through_the_fair_queue() -> TestResult {
    let backend = CountingReleases::default();
    let manager = LeaseManager::new(backend.clone())?;
    let fair = fair(Duration::from_millis(10), Duration::from_secs(2));
    manager.acquire("fair-one", &fair).await?.release().await?;
    assert_eq!(backend.counts(), (0, 1));
    let plain = LeaseOptions::builder().ttl(Ttl::parse("2s")?).build()?;
    manager
        .acquire("plain-one", &plain)
        .await?
        .release()
        .await?;
    assert_eq!(backend.counts(), (1, 1));
    within(Duration::from_secs(10), "the shutdown", manager.shutdown()).await;
    Ok(())
}

/// A fair grant whose reply arrives when its deadline has come is not
/// handed out (no time is left to use it) and is given back; a
/// millisecond earlier, it is handed out.
#[tokio::test(start_paused = true)]
async fn a_fair_grant_answered_at_its_deadline_is_given_back() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .fair(Fair::default())
        .build()?;
    backend.set_latency(options.deadline_after());
    let late = within(
        Duration::from_secs(30),
        "the late grant",
        manager.acquire("fair-late", &options),
    )
    .await;
    assert!(
        matches!(late, Err(LeaseError::NotAcquired { .. })),
        "a fair grant answered at its deadline was handed out: {late:?}"
    );
    backend.set_latency(Duration::ZERO);
    within(Duration::from_secs(5), "the late grant's release", async {
        while backend.inspect(&key("fair-late")).await?.is_some() {
            sleep(Duration::from_millis(1)).await;
        }
        Ok::<_, BackendError>(())
    })
    .await?;

    backend.set_latency(options.deadline_after() - Duration::from_millis(1));
    let lease = within(
        Duration::from_secs(30),
        "the grant",
        manager.acquire("fair-late", &options),
    )
    .await?;
    assert_eq!(lease.loss_reason(), None);
    Ok(())
}
