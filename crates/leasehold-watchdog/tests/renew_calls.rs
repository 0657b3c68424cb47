//! The renewal calls the watchdog makes, on `MemoryBackend` and tokio's
//! paused clock, as seen by a wrapper that records when every `renew_many`
//! call reached the backend, and by the server's own expiry: each retry
//! comes its own delay after a failure (5 ms, 20 ms, 80 ms, then a quarter
//! of the renew interval).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    MemoryBackend, ReleaseOutcome, RenewOutcome, RenewRequest, Ttl,
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
    ) -> Result<ReleaseOutcome, BackendError> {
        self.inner.release(key, holder).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
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
