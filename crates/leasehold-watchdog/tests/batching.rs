//! Batched renewals on `MemoryBackend` and tokio's paused clock: renewals
//! due close together (on one step of the renewal grid, a sixteenth of the
//! renew interval) share one `renew_many` call, none is sent late, a batch
//! that hangs delays no other lease, and at most sixteen calls are in flight
//! at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    MemoryBackend, ReleaseReport, RenewOutcome, RenewRequest, Ttl, clock_drift,
};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep_until};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

const MS: Duration = Duration::from_millis(1);

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::with_ttl(Ttl::parse(ttl).expect("valid ttl"))
}

/// Asserts that a renewal due at `due` was sent at `at`: never late, and
/// early by less than one grid step.
fn assert_sent_early_by_less_than(at: Instant, due: Instant, step: Duration) {
    assert!(at <= due, "sent {:?} late", at - due);
    assert!(due - at < step, "sent {:?} early", due - at);
}

/// One `renew_many` call: when it was made and the keys it renewed.
type Call = (Instant, Vec<String>);

/// A `MemoryBackend` that records every `renew_many` call (when, and which
/// keys) and hangs forever the calls that contain a chosen key.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryBackend,
    calls: Arc<Mutex<Vec<Call>>>,
    hung_keys: Arc<Mutex<HashSet<String>>>,
}

impl Recording {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("not poisoned").clone()
    }

    fn hang_key(&self, key: &str) {
        self.hung_keys
            .lock()
            .expect("not poisoned")
            .insert(key.to_owned());
    }
}

impl LeaseBackend for Recording {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew(&self, request: &RenewRequest) -> Result<RenewOutcome, BackendError> {
        let mut outcomes = self.renew_many(std::slice::from_ref(request)).await;
        outcomes.pop().expect("one outcome per request")
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let keys: Vec<String> = requests.iter().map(|r| r.key.to_string()).collect();
        let hang = {
            let hung = self.hung_keys.lock().expect("not poisoned");
            keys.iter().any(|k| hung.contains(k))
        };
        self.calls
            .lock()
            .expect("not poisoned")
            .push((Instant::now(), keys));
        if hang {
            std::future::pending::<()>().await;
        }
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
}

#[tokio::test(start_paused = true)]
async fn renewals_due_within_the_window_share_one_call_and_none_is_late() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    // ttl 3 s: renew interval 1 s, grid step 1 s / 16 = 62.5 ms.
    let start = Instant::now();
    let a = manager.acquire("a", &options("3s")).await?;
    sleep_until(start + 20 * MS).await;
    let b = manager.acquire("b", &options("3s")).await?;
    sleep_until(start + 60 * MS).await;
    let c = manager.acquire("c", &options("3s")).await?;
    // On another step of the grid: renewed on its own timer.
    sleep_until(start + 200 * MS).await;
    let d = manager.acquire("d", &options("3s")).await?;

    sleep_until(start + Duration::from_millis(1300)).await;
    let calls = backend.calls();
    let keys: Vec<Vec<String>> = calls.iter().map(|(_, k)| k.clone()).collect();
    assert_eq!(keys, vec![vec!["a", "b", "c"], vec!["d"]], "{calls:?}");
    // Sent when a fell due: b and c early by 20 and 60 ms, none late.
    assert_eq!(calls[0].0, start + Duration::from_secs(1));
    let step = Duration::from_micros(62_500);
    assert_sent_early_by_less_than(calls[1].0, start + Duration::from_millis(1200), step);
    for lease in [&a, &b, &c, &d] {
        assert_eq!(lease.renewals(), 1, "{}", lease.key());
    }
    // Renewed together, they stay together: one call per round from now on.
    let renewed_at = start + Duration::from_secs(1);
    assert_eq!(
        c.valid_until(),
        renewed_at + Duration::from_secs(3) - clock_drift(Duration::from_secs(3))
    );
    sleep_until(start + Duration::from_millis(3300)).await;
    let rounds: Vec<usize> = backend.calls().iter().map(|(_, k)| k.len()).collect();
    assert_eq!(rounds, vec![3, 1, 3, 1, 3, 1]);
    for lease in [&a, &b, &c, &d] {
        assert_eq!(lease.renewals(), 3, "{}", lease.key());
        assert!(!lease.token().is_cancelled());
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lease_with_a_shorter_interval_is_not_pulled_by_a_longer_window() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    // ttl 30 s: interval 10 s, grid step 625 ms. ttl 3 s: step 62.5 ms.
    let long = manager.acquire("long", &options("30s")).await?;
    sleep_until(start + Duration::from_secs(9)).await;
    // Due at 10.1 s: within a step of the long lease's renewal, but each
    // lease keeps to its own grid.
    sleep_until(start + Duration::from_millis(9100)).await;
    let short = manager.acquire("short", &options("3s")).await?;
    sleep_until(start + Duration::from_millis(10_050)).await;
    let calls = backend.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].1, vec!["long"]);
    assert_eq!(calls[0].0, start + Duration::from_secs(10));
    sleep_until(start + Duration::from_millis(10_150)).await;
    let calls = backend.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1].1, vec!["short".to_owned()]);
    assert_sent_early_by_less_than(
        calls[1].0,
        start + Duration::from_millis(10_100),
        Duration::from_micros(62_500),
    );
    assert_eq!((long.renewals(), short.renewals()), (1, 1));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_hung_batch_delays_neither_the_deadline_nor_the_renewals_of_another() -> TestResult {
    let backend = Recording::default();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    let start = Instant::now();
    let a = manager.acquire("a", &options).await?;
    // Far outside a's window: b's renewals go in batches of their own.
    sleep_until(start + Duration::from_millis(500)).await;
    let b = manager.acquire("b", &options).await?;
    backend.hang_key("a");

    // a's first renewal hangs; its token fires on its own deadline.
    assert_eq!(
        within(Duration::from_secs(10), "a's token", a.lost()).await,
        LossReason::Deadline
    );
    assert_eq!(Instant::now(), a.valid_until() - options.safety_margin());
    assert_eq!(a.renewals(), 0);

    // Meanwhile b was renewed on time, every interval, while a's call hung.
    let b_calls: Vec<Instant> = backend
        .calls()
        .into_iter()
        .filter(|(_, keys)| keys == &["b"])
        .map(|(at, _)| at)
        .collect();
    let expected: Vec<Instant> = (0..b_calls.len())
        .map(|n| start + Duration::from_millis(1500 + 1000 * n as u64))
        .collect();
    assert!(b_calls.len() >= 2, "{b_calls:?}");
    assert_eq!(b_calls, expected);
    assert_eq!(b.renewals() as usize, b_calls.len());
    assert!(!b.token().is_cancelled());

    // And b goes on being renewed long after a ended.
    sleep_until(start + Duration::from_millis(10_600)).await;
    assert_eq!(b.renewals(), 10);
    assert_eq!(b.loss_reason(), None);
    Ok(())
}

/// A `MemoryBackend` whose renewal calls each take 50 ms, recording when
/// each call started and how many leases it carried.
#[derive(Clone, Default)]
struct Slow {
    inner: MemoryBackend,
    calls: Arc<Mutex<Vec<(Instant, usize)>>>,
}

impl LeaseBackend for Slow {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.calls
            .lock()
            .expect("not poisoned")
            .push((Instant::now(), requests.len()));
        tokio::time::sleep(50 * MS).await;
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
}

#[tokio::test(start_paused = true)]
async fn at_most_sixteen_renewal_calls_are_in_flight_and_the_rest_follow() -> TestResult {
    let backend = Slow::default();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    let start = Instant::now();
    let mut leases = Vec::with_capacity(20_000);
    for i in 0..20_000 {
        leases.push(manager.acquire(format!("many:{i}"), &options).await?);
    }
    // All acquired at one instant (the clock is paused): all due at 1 s.
    assert_eq!(Instant::now(), start);
    sleep_until(start + Duration::from_millis(1200)).await;
    let calls = backend.calls.lock().expect("not poisoned").clone();
    let first = start + Duration::from_secs(1);
    let at: Vec<Instant> = calls.iter().map(|(at, _)| *at).collect();
    let mut expected = vec![first; 16];
    expected.extend([first + 50 * MS; 4]);
    assert_eq!(at, expected);
    assert!(calls.iter().all(|(_, size)| *size == 1000), "{calls:?}");
    // The later calls count their validity from their own send.
    let late = leases
        .iter()
        .filter(|l| {
            l.valid_until()
                == first + 50 * MS + Duration::from_secs(3) - clock_drift(Duration::from_secs(3))
        })
        .count();
    assert_eq!(late, 4000);
    assert!(
        leases
            .iter()
            .all(|l| l.renewals() == 1 && l.loss_reason().is_none())
    );
    Ok(())
}
