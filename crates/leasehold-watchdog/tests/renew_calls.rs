//! The renewal calls the watchdog makes, on `MemoryBackend` and tokio's
//! paused clock, as seen by a wrapper that records when every `renew_many`
//! call reached the backend, and by the server's own expiry: each retry
//! comes its own delay after a failure (5 ms, 20 ms, 80 ms, then a quarter
//! of the renew interval).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeFeed, ChangeWatch, HolderId,
    LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, MemoryBackend, ReleaseOutcome, ReleaseReport,
    RenewOutcome, RenewRequest, Ttl,
};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep_until, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One `renew_many` call: when it was made and the keys it renewed.
type Call = (Instant, Vec<String>);

/// A `MemoryBackend` that records each `renew_many` call: when it was
/// made, and the keys it renewed.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryBackend,
    calls: Arc<Mutex<Vec<Call>>>,
    /// The changes this backend reports: only those the test makes.
    feed: Arc<Mutex<ChangeFeed>>,
}

impl Recording {
    /// When the calls so far were made, as offsets from `start`.
    fn calls_since(&self, start: Instant) -> Vec<Duration> {
        self.calls
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(at, _)| *at - start)
            .collect()
    }

    /// Reports a change of `key`, whether or not anything changed.
    fn report(&self, key: &str) -> TestResult {
        let change = LeaseChange::Changed(LeaseKey::new(key)?);
        self.feed.lock().expect("not poisoned").report(&change);
        Ok(())
    }

    /// The keys of the calls so far, call by call.
    fn keys(&self) -> Vec<Vec<String>> {
        self.calls
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|(_, keys)| keys.clone())
            .collect()
    }
}

impl LeaseBackend for Recording {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let keys = requests.iter().map(|r| r.key.to_string()).collect();
        self.calls
            .lock()
            .expect("not poisoned")
            .push((Instant::now(), keys));
        self.inner.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        self.inner.release(key, holder).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
    }

    fn changes(&self) -> Option<&impl ChangeBackend> {
        Some(self)
    }
}

impl ChangeBackend for Recording {
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        Ok(self.feed.lock().expect("not poisoned").subscribe())
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A 3 s ttl is renewed every second; its renewal grid's step is 62.5 ms,
/// longer than the first three retry delays. The first renewal, due at 1 s,
/// fails four times in a row: the retries go out 5, 20, 80 and then 250 ms
/// (a quarter of the renew interval) after each failure, not rounded down
/// onto the grid (which would send the first two at once, with no delay).
#[tokio::test(start_paused = true)]
async fn each_retry_waits_its_own_delay_after_the_failure() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let lease = manager.acquire("flaky", &options).await?;
    backend.inner.fail_next(4);

    sleep_until(start + ms(1400)).await;
    assert_eq!(
        backend.calls_since(start),
        [ms(1000), ms(1005), ms(1025), ms(1105), ms(1355)],
        "renew_many calls, from the acquisition"
    );
    assert_eq!(lease.renewals(), 1);
    assert_eq!(lease.loss_reason(), None);
    // The server extended the lease when the fifth call reached it.
    let left = backend
        .inspect(&LeaseKey::new("flaky")?)
        .await?
        .and_then(|info| info.ttl_left);
    assert_eq!(left, Some(ms(3000 + 1355 - 1400)));
    Ok(())
}

/// With the default 30 s ttl the grid's step (625 ms) is longer than every
/// retry delay. A backend that fails at once, over and over, is still asked
/// no more often than the delays allow: a thousand failures are not used
/// up in an instant, and the deadline fires while they last.
#[tokio::test(start_paused = true)]
async fn a_backend_failing_at_once_is_not_retried_in_a_tight_loop() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::default();
    let lease = manager.acquire("down", &options).await?;
    backend.inner.fail_next(1000);

    let reason = timeout(Duration::from_secs(60), lease.lost()).await?;
    assert_eq!(reason, LossReason::Deadline);
    let calls = backend.calls_since(start);
    // Renewal at 10 s, then retries 5, 20, 80 and 320 ms apart until the
    // deadline at 30 s − 302 ms − 3 s = 26.698 s.
    let mut expected = vec![ms(10_000), ms(10_005), ms(10_025), ms(10_105)];
    let mut at = ms(10_105) + ms(320);
    while at < ms(26_698) {
        expected.push(at);
        at += ms(320);
    }
    assert_eq!(calls, expected);
    assert_eq!(Instant::now(), start + ms(26_698));
    Ok(())
}

/// Released by its handle, a lease leaves the watchdog: no renewal of it
/// is sent afterwards, although the watchdog would learn nothing from one
/// (the lease is gone, and a claimed release reports no loss).
#[tokio::test(start_paused = true)]
async fn a_lease_released_by_its_handle_is_never_renewed_again() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let released = manager.acquire("released", &options).await?;
    let kept = manager.acquire("kept", &options).await?;
    sleep_until(start + ms(500)).await;
    assert_eq!(released.release().await?, ReleaseOutcome::Released);

    sleep_until(start + ms(3500)).await;
    // One call a second, for the lease still held, and nothing else.
    assert_eq!(backend.calls_since(start), [ms(1000), ms(2000), ms(3000)]);
    assert_eq!(backend.keys(), vec![vec!["kept".to_owned()]; 3]);
    assert_eq!(kept.renewals(), 3);
    Ok(())
}

/// A cap of two renewals: exactly two calls reach the server, at 1 s and
/// 2 s, and the token fires a safety margin before the second renewal's
/// validity ends (2 s + 3 s − 32 ms drift − 300 ms), while the server still
/// has the lease. A cap of none fires before the first renewal.
#[tokio::test(start_paused = true)]
async fn a_capped_lease_is_renewed_exactly_its_cap_and_ends_in_time() -> TestResult {
    for (cap, calls, fires_at) in [
        (2, vec![ms(1000), ms(2000)], ms(4668)),
        (0, vec![], ms(2668)),
    ] {
        let backend = Recording::default();
        let manager = LeaseManager::new(backend.clone())?;
        let start = Instant::now();
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("3s")?)
            .max_renewals(cap)
            .build()?;
        let lease = manager.acquire("capped", &options).await?;
        let reason = timeout(Duration::from_secs(30), lease.lost()).await?;
        assert_eq!(reason, LossReason::RenewalLimit, "cap {cap}");
        assert_eq!(Instant::now() - start, fires_at, "cap {cap}");
        assert_eq!(backend.calls_since(start), calls, "cap {cap}");
        let left = backend
            .inspect(&LeaseKey::new("capped")?)
            .await?
            .and_then(|info| info.ttl_left);
        assert_eq!(left, Some(ms(332)), "cap {cap}");
        // Nothing more is sent.
        sleep_until(start + ms(10_000)).await;
        assert_eq!(backend.calls_since(start), calls, "cap {cap}");
    }
    Ok(())
}

/// A renew interval shorter than the grid has steps (16 ns) has no grid:
/// the lease is renewed as asked, on the timer's millisecond resolution,
/// rather than the watchdog dividing by a zero step.
#[tokio::test(start_paused = true)]
async fn a_renew_interval_finer_than_the_grid_still_renews() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("100ms")?)
        .renew_interval(Duration::from_nanos(10))
        .build()?;
    let lease = manager.acquire("fine", &options).await?;
    sleep_until(start + ms(10)).await;
    assert!(lease.renewals() >= 1);
    assert_eq!(lease.loss_reason(), None);
    // Unrenewed, the server would have 90 ms left.
    let left = backend
        .inspect(&LeaseKey::new("fine")?)
        .await?
        .and_then(|info| info.ttl_left);
    assert!(left > Some(ms(90)), "{left:?} left");
    Ok(())
}

/// A change renews the held leases of its key at once, in one call, and
/// leaves alone a lease that ended (it stays lost) and one past its cap
/// (it is not renewed beyond it, and ends by its cap).
#[tokio::test(start_paused = true)]
async fn a_change_renews_held_leases_at_once_and_no_ended_or_capped_one() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let capped = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .max_renewals(0)
        .build()?;
    let held = manager.acquire("held", &options).await?;
    let lost = manager.acquire("lost", &options).await?;
    let at_cap = manager.acquire("at-cap", &capped).await?;

    sleep_until(start + ms(100)).await;
    backend
        .inner
        .hand_over(&LeaseKey::new("lost")?, Ttl::parse("3s")?)?;
    backend.report("lost")?;
    let reason = timeout(Duration::from_secs(1), lost.lost()).await?;
    assert_eq!(reason, LossReason::Lost);
    assert_eq!(Instant::now(), start + ms(100));

    sleep_until(start + ms(200)).await;
    for key in ["held", "lost", "at-cap"] {
        backend.report(key)?;
    }
    sleep_until(start + ms(300)).await;
    assert_eq!(backend.calls_since(start), [ms(100), ms(200)]);
    assert_eq!(
        backend.keys(),
        [vec!["lost".to_owned()], vec!["held".to_owned()]]
    );
    assert_eq!(held.renewals(), 1);
    // The server saw the renewal at 200 ms.
    let left = backend
        .inspect(&LeaseKey::new("held")?)
        .await?
        .and_then(|info| info.ttl_left);
    assert_eq!(left, Some(ms(2900)));

    let reason = timeout(Duration::from_secs(10), at_cap.lost()).await?;
    assert_eq!(reason, LossReason::RenewalLimit);
    assert_eq!(Instant::now(), start + ms(2668));
    assert_eq!(lost.loss_reason(), Some(LossReason::Lost));
    Ok(())
}

/// A renewal that hangs ends the lease at its deadline, the acquisition's
/// validity less the safety margin (3 s − 32 ms − 300 ms), however long the
/// call stays in flight; the server still had the lease then: the hung
/// call, let through afterwards, finds it and extends it.
#[tokio::test(start_paused = true)]
async fn a_hung_renewal_ends_the_lease_at_its_deadline() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let lease = manager.acquire("hung", &options).await?;
    backend.inner.hang();
    let reason = timeout(Duration::from_secs(10), lease.lost()).await?;
    assert_eq!(reason, LossReason::Deadline);
    assert_eq!(Instant::now() - start, ms(2668));
    assert_eq!(backend.calls_since(start), [ms(1000)]);

    backend.inner.resume();
    sleep_until(start + ms(2700)).await;
    let left = backend
        .inspect(&LeaseKey::new("hung")?)
        .await?
        .and_then(|info| info.ttl_left);
    // Renewed when it went through, at 2668 ms, for 3 s.
    assert_eq!(left, Some(ms(2668 + 3000 - 2700)));
    // A late success does not revive the lease.
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    assert_eq!(lease.renewals(), 0);
    Ok(())
}
