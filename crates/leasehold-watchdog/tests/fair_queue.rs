//! Fair mode through the manager, on `MemoryBackend` and tokio's paused
//! clock. Witnesses: the order in which this test started the waiters (a
//! history the library does not shape) against the order of the grants'
//! fencing tokens, and the backend's own store (`inspect`).

mod common;

use std::collections::VecDeque;
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

/// `MemoryBackend` with its fair queue, watched and steered from outside
/// the library: it counts the releases of each kind, stamps every fair
/// call, fails the fair calls it is told to (and no other), and passes the
/// release notices on only when built to.
#[derive(Clone, Default)]
struct FairProbe {
    inner: MemoryBackend,
    notices: bool,
    seen: Arc<Mutex<Seen>>,
}

#[derive(Default)]
struct Seen {
    /// Plain releases, fair releases.
    releases: (u32, u32),
    /// When each fair call was made.
    fair_calls: Vec<Instant>,
    /// What the next fair calls fail with, first to last.
    failures: VecDeque<BackendError>,
}

/// More fair calls than any test here makes: a waiter that asks again
/// without waiting (which the paused clock would never move past) spends
/// it in a moment and is refused for good instead of hanging the test.
const CALL_BUDGET: usize = 10_000;

impl FairProbe {
    /// A probe over `inner` (shared with other managers), with release
    /// notices or without.
    fn over(inner: &MemoryBackend, notices: bool) -> Self {
        Self {
            inner: inner.clone(),
            notices,
            seen: Arc::default(),
        }
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("not poisoned")
    }

    fn counts(&self) -> (u32, u32) {
        self.seen().releases
    }

    /// The next fair calls fail with `errors`, in order.
    fn fail_next(&self, errors: impl IntoIterator<Item = BackendError>) {
        self.seen().failures.extend(errors);
    }

    /// When each fair call was made, after `start`.
    fn calls_since(&self, start: Instant) -> Vec<Duration> {
        self.seen()
            .fair_calls
            .iter()
            .map(|at| at.duration_since(start))
            .collect()
    }
}

impl LeaseBackend for FairProbe {
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
        self.seen().releases.0 += 1;
        self.inner.release(key, holder).await
    }

    async fn inspect(
        &self,
        key: &leasehold_core::LeaseKey,
    ) -> Result<Option<leasehold_core::LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
    }

    async fn watch_releases(
        &self,
        key: &leasehold_core::LeaseKey,
        policy: leasehold_core::WatchPolicy,
    ) -> Result<leasehold_core::ReleaseWatch, BackendError> {
        if self.notices {
            self.inner.watch_releases(key, policy).await
        } else {
            Ok(leasehold_core::ReleaseWatch::unsupported())
        }
    }

    fn fair(&self) -> Option<&impl leasehold_core::FairBackend> {
        Some(self)
    }
}

impl leasehold_core::FairBackend for FairProbe {
    async fn try_acquire_fair(
        &self,
        request: &leasehold_core::AcquireRequest,
        place_ttl: leasehold_core::PlaceTtl,
        handover: Option<Duration>,
    ) -> Result<leasehold_core::FairOutcome, BackendError> {
        let failure = {
            let mut seen = self.seen();
            seen.fair_calls.push(Instant::now());
            if seen.fair_calls.len() > CALL_BUDGET {
                Some(BackendError::InvalidRequest {
                    op: "acquire_fair",
                    key: request.key.to_string(),
                    reason: "the probe's call budget is spent: a waiter asks again without waiting",
                })
            } else {
                seen.failures.pop_front()
            }
        };
        if let Some(error) = failure {
            return Err(error);
        }
        self.inner
            .try_acquire_fair(request, place_ttl, handover)
            .await
    }

    async fn release_fair(
        &self,
        key: &leasehold_core::LeaseKey,
        holder: &leasehold_core::HolderId,
    ) -> Result<leasehold_core::ReleaseOutcome, BackendError> {
        self.seen().releases.1 += 1;
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
    let backend = FairProbe::default();
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

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// The gaps between consecutive calls.
fn gaps(calls: &[Duration]) -> Vec<Duration> {
    calls.windows(2).map(|w| w[1] - w[0]).collect()
}

/// A fair call that fails for now (a timeout) is made again after the
/// backoff, each time, until one is answered; the wait then ends with the
/// lease. The failures are injected on the fair calls alone.
#[tokio::test(start_paused = true)]
async fn a_fair_call_that_fails_for_now_is_made_again_after_the_backoff() -> TestResult {
    let probe = FairProbe::default();
    let timeout = || BackendError::Timeout {
        op: "acquire_fair",
        key: "fair-retry".into(),
        after: ms(1),
    };
    probe.fail_next([timeout(), timeout()]);
    let manager = LeaseManager::new(probe.clone())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(ms(40)))
        .release_notices(false)
        .fair(Fair::default().with_place_ttl(Duration::from_secs(30)))
        .build()?;
    let start = Instant::now();
    let lease = within(
        Duration::from_secs(10),
        "the acquisition",
        manager.acquire("fair-retry", &options),
    )
    .await?;
    assert_eq!(probe.calls_since(start), [ms(0), ms(40), ms(80)]);
    lease.release().await?;
    Ok(())
}

/// A fair call that fails for good (the key holds another type) ends the
/// wait at once with that error, after that one call, and leaves nothing
/// taken.
#[tokio::test(start_paused = true)]
async fn a_fair_call_that_fails_for_good_ends_the_wait() -> TestResult {
    let probe = FairProbe::default();
    probe.fail_next([BackendError::WrongType {
        key: "fair-wrong".into(),
    }]);
    let manager = LeaseManager::new(probe.clone())?;
    let options = fair(ms(40), Duration::from_secs(30));
    let start = Instant::now();
    let outcome = within(
        Duration::from_secs(10),
        "the refusal",
        manager.acquire("fair-wrong", &options),
    )
    .await;
    assert!(
        matches!(
            outcome,
            Err(LeaseError::Backend(BackendError::WrongType { .. }))
        ),
        "{outcome:?}"
    );
    assert_eq!(probe.calls_since(start), [ms(0)]);
    assert_eq!(probe.inspect(&key("fair-wrong")).await?, None);
    Ok(())
}

/// A lease held in fair mode, with two waiters queued behind it 1 ms
/// apart, each in its own manager over a probe: polls every 50 ms, places
/// kept 30 s (refreshed every 10 s).
struct Queued {
    held: leasehold_watchdog::Lease,
    head: FairProbe,
    behind: FairProbe,
    /// When the head started waiting.
    start: Instant,
    tasks: Vec<tokio::task::JoinHandle<Result<leasehold_watchdog::Lease, LeaseError>>>,
}

/// [`Queued`] on `lease`, the waiters' probes passing release notices on
/// when `notices`.
async fn queued(lease: &'static str, notices: bool) -> Result<Queued, Box<dyn std::error::Error>> {
    let inner = MemoryBackend::new();
    let options = fair(ms(50), Duration::from_secs(30));
    let held = LeaseManager::new(inner.clone())?
        .acquire(lease, &options)
        .await?;
    let (head, behind) = (
        FairProbe::over(&inner, notices),
        FairProbe::over(&inner, notices),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for probe in [&head, &behind] {
        let manager = LeaseManager::new(probe.clone())?;
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            manager.acquire(lease, &options).await
        }));
        sleep(ms(1)).await;
    }
    Ok(Queued {
        held,
        head,
        behind,
        start,
        tasks,
    })
}

impl Queued {
    /// Releases the held lease, then each waiter's once it has it.
    async fn drain(self) -> TestResult {
        self.held.release().await?;
        for task in self.tasks {
            within(Duration::from_secs(30), "a waiter", task)
                .await??
                .release()
                .await?;
        }
        Ok(())
    }
}

/// With release notices, the head of the queue still polls on the
/// backoff (a notice may be missed, or the holder may die), while the
/// waiter behind it asks only to keep its place, every third of the place
/// ttl, and whatever the holder's lease has left.
#[tokio::test(start_paused = true)]
async fn the_head_polls_on_the_backoff_and_the_waiter_behind_on_the_place_refresh() -> TestResult {
    let queue = queued("fair-plan", true).await?;
    let (head, behind, start) = (&queue.head, &queue.behind, queue.start);
    sleep(ms(24_990)).await;
    // The head asked every 50 ms; the waiter behind every 10 s (the
    // holder's lease, renewed, had 1.3 to 2 s left at each call).
    let head_calls = head.calls_since(start);
    assert_eq!(head_calls.len(), 500, "{head_calls:?}");
    assert!(
        gaps(&head_calls).iter().all(|gap| *gap == ms(50)),
        "{head_calls:?}"
    );
    let s = Duration::from_secs;
    assert_eq!(
        behind.calls_since(start),
        [ms(1), s(10) + ms(1), s(20) + ms(1)],
        "the waiter behind the head"
    );
    queue.drain().await
}

/// The head asks again a millisecond after the holder's lease runs out,
/// however long its backoff and its place refresh: a holder that died
/// (or never renews) costs the queue nothing beyond its ttl.
#[tokio::test(start_paused = true)]
async fn the_head_asks_again_a_millisecond_after_the_holders_lease_runs_out() -> TestResult {
    let inner = MemoryBackend::new();
    let lease = key("fair-expiry");
    let start = Instant::now();
    let taken = inner
        .try_acquire(&leasehold_core::AcquireRequest::new(
            lease.clone(),
            leasehold_core::HolderId::generate()?,
            Ttl::parse("300ms")?,
        ))
        .await?;
    assert!(matches!(taken, leasehold_core::AcquireOutcome::Acquired(_)));
    let head = FairProbe::over(&inner, true);
    let manager = LeaseManager::new(head.clone())?;
    let options = fair(Duration::from_secs(10), Duration::from_secs(30));
    let won = within(
        Duration::from_secs(30),
        "the head",
        manager.acquire(lease.as_str(), &options),
    )
    .await?;
    assert_eq!(head.calls_since(start), [ms(0), ms(301)]);
    assert_eq!(
        inner
            .inspect(&lease)
            .await?
            .and_then(|info| info.fencing_token),
        Some(won.fencing_token())
    );
    won.release().await?;
    Ok(())
}

/// A waiter four releases from its turn (three places ahead of it and a
/// holder) asks again after every second release notice, then after every
/// one once its turn is one or two releases away: four calls in all, the
/// last one granted. Each waiter ahead holds for 100 ms, so the releases
/// come one at a time (the holder's at 1 ms, then at 101, 201, 301 ms).
#[tokio::test(start_paused = true)]
async fn a_waiter_four_releases_away_asks_again_after_every_second_notice() -> TestResult {
    let inner = MemoryBackend::new();
    let options = fair(Duration::from_secs(10), Duration::from_secs(30));
    let holder = LeaseManager::new(inner.clone())?;
    let held = holder.acquire("fair-count", &options).await?;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let manager = LeaseManager::new(inner.clone())?;
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            let lease = manager.acquire("fair-count", &options).await?;
            sleep(ms(100)).await;
            lease.release().await?;
            Ok::<_, LeaseError>(())
        }));
        sleep(ms(1)).await;
    }
    let last = FairProbe::over(&inner, true);
    let manager = LeaseManager::new(last.clone())?;
    let start = Instant::now();
    let waiting = tokio::spawn(async move { manager.acquire("fair-count", &options).await });
    sleep(ms(1)).await;
    held.release().await?;
    let won = within(Duration::from_secs(30), "the last waiter", waiting).await??;
    for task in tasks {
        within(Duration::from_secs(30), "a waiter ahead", task).await??;
    }
    assert_eq!(last.calls_since(start), [ms(0), ms(101), ms(201), ms(301)]);
    won.release().await?;
    Ok(())
}

/// Without release notices (a backend that has none) every waiter polls
/// on the backoff, the head and the waiters behind it alike, and none asks
/// again sooner.
#[tokio::test(start_paused = true)]
async fn without_notices_every_waiter_polls_on_the_backoff() -> TestResult {
    let queue = queued("fair-deaf", false).await?;
    let (head, behind, start) = (&queue.head, &queue.behind, queue.start);
    sleep(Duration::from_secs(1) - ms(1)).await;
    for (name, probe, first) in [("head", &head, ms(0)), ("behind", &behind, ms(1))] {
        let calls = probe.calls_since(start);
        // Asked, subscribed (nothing to hear) and asked again at once,
        // then every 50 ms.
        assert_eq!(calls[..2], [first, first], "{name}");
        assert!(
            gaps(&calls[1..]).iter().all(|gap| *gap == ms(50)),
            "{name}: {calls:?}"
        );
        assert!(calls.len() >= 2 + 19, "{name}: {calls:?}");
    }
    queue.drain().await
}
