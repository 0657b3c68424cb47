//! Registering and forgetting leases while the watchdog task sleeps, on
//! `MemoryBackend` and tokio's paused clock. A new lease reaches the
//! watchdog without waking it when its first renewal is due after the
//! watchdog's next wake anyway; these tests hold it to that "anyway": each
//! sets up a watchdog asleep until a long lease's renewal and then does
//! something that must not wait for it. The witnesses are the backend's own
//! state (`inspect`, which expires keys on the tokio clock) and a record of
//! the renewal calls that reached it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, HolderId,
    LeaseBackend, LeaseInfo, LeaseKey, MemoryBackend, ReleaseOutcome, ReleaseReport, RenewOutcome,
    RenewRequest, Ttl,
};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep, sleep_until, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A `MemoryBackend` that records when each key's renewals reached it.
#[derive(Clone, Default)]
struct Recording {
    inner: MemoryBackend,
    renewals: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Recording {
    /// When `key`'s renewals reached the backend.
    fn renewals_of(&self, key: &str) -> Vec<Instant> {
        self.renewals
            .lock()
            .expect("not poisoned")
            .iter()
            .filter(|(_, k)| k == key)
            .map(|(at, _)| *at)
            .collect()
    }

    async fn held(&self, key: &str) -> Result<bool, Box<dyn std::error::Error>> {
        Ok(self.inner.inspect(&LeaseKey::new(key)?).await?.is_some())
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
        let now = Instant::now();
        self.renewals
            .lock()
            .expect("not poisoned")
            .extend(requests.iter().map(|r| (now, r.key.to_string())));
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
        self.inner.watch_changes().await
    }
}

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::with_ttl(Ttl::parse(ttl).expect("valid ttl"))
}

/// A manager whose watchdog sleeps until a 30 s lease's first renewal,
/// about 10 s from now, and the long lease (kept by the caller).
async fn asleep_until_ten_seconds(
    backend: &Recording,
) -> Result<(LeaseManager<Recording>, leasehold_watchdog::Lease), Box<dyn std::error::Error>> {
    let manager = LeaseManager::new(backend.clone())?;
    let long = manager.acquire("long", &options("30s")).await?;
    // The watchdog takes the long lease and goes back to sleep.
    sleep(Duration::from_millis(100)).await;
    Ok((manager, long))
}

/// A 3 s lease registered while the watchdog sleeps until 10 s must still
/// be renewed at a third of its ttl (or up to one grid step, 1/16 of that,
/// earlier), and so be held by the server past its first ttl.
#[tokio::test(start_paused = true)]
async fn a_shorter_lease_is_renewed_at_its_third_while_the_watchdog_slept() -> TestResult {
    let backend = Recording::default();
    let (manager, _long) = asleep_until_ten_seconds(&backend).await?;
    let acquired = Instant::now();
    let short = manager.acquire("short", &options("3s")).await?;
    sleep_until(acquired + Duration::from_millis(3500)).await;
    let renewals = backend.renewals_of("short");
    let first = renewals
        .first()
        .map(|at| *at - acquired)
        .ok_or("the short lease was never renewed")?;
    assert!(
        first <= Duration::from_secs(1) && first >= Duration::from_millis(1000 - 63),
        "first renewal {first:?} after the acquisition, not at a third of 3 s"
    );
    assert!(backend.held("short").await?, "the server let it expire");
    assert_eq!(short.loss_reason(), None);
    Ok(())
}

/// A lease dropped before the watchdog woke is released on the server at
/// once, not left to expire: the release finds the registration that had
/// not reached the watchdog yet.
#[tokio::test(start_paused = true)]
async fn a_lease_dropped_before_the_watchdog_woke_is_released() -> TestResult {
    let backend = Recording::default();
    let (manager, _long) = asleep_until_ten_seconds(&backend).await?;
    let dropped = manager.acquire("dropped", &options("30s")).await?;
    assert!(backend.held("dropped").await?);
    drop(dropped);
    let released = async {
        while backend.held("dropped").await.unwrap_or(true) {
            sleep(Duration::from_millis(1)).await;
        }
    };
    timeout(Duration::from_millis(50), released)
        .await
        .map_err(|_| "the dropped lease is still held on the server")?;
    Ok(())
}

/// A lease released before the watchdog woke is never renewed: the
/// watchdog learns of the release before it sends the renewals that fall
/// due when it wakes.
#[tokio::test(start_paused = true)]
async fn a_lease_released_before_the_watchdog_woke_is_renewed_no_more() -> TestResult {
    let backend = Recording::default();
    let (manager, long) = asleep_until_ten_seconds(&backend).await?;
    let released = manager.acquire("released", &options("30s")).await?;
    let outcome = timeout(Duration::from_secs(1), released.release()).await??;
    assert_eq!(outcome, ReleaseOutcome::Released);
    sleep(Duration::from_secs(25)).await;
    assert_eq!(
        backend.renewals_of("released"),
        [],
        "the released lease was renewed"
    );
    // The watchdog did wake meanwhile, for the long lease.
    assert_eq!(backend.renewals_of("long").len(), 2);
    assert_eq!(long.loss_reason(), None);
    Ok(())
}

/// Shutdown releases a lease whose registration had not reached the
/// watchdog yet, and fires its token, as it does every other lease's.
#[tokio::test(start_paused = true)]
async fn shutdown_releases_a_lease_registered_while_the_watchdog_slept() -> TestResult {
    let backend = Recording::default();
    let (manager, long) = asleep_until_ten_seconds(&backend).await?;
    let late = manager.acquire("late", &options("30s")).await?;
    timeout(Duration::from_secs(1), manager.shutdown())
        .await
        .map_err(|_| "shutdown did not finish")?;
    assert_eq!(late.loss_reason(), Some(LossReason::Shutdown));
    assert!(late.token().is_cancelled());
    assert!(!backend.held("late").await?, "the late lease is still held");
    assert!(!backend.held("long").await?, "the long lease is still held");
    assert_eq!(long.loss_reason(), Some(LossReason::Shutdown));
    Ok(())
}

/// A manager whose watchdog is gone (its runtime shut down, without
/// `shutdown`) hands out no lease that nothing would renew or end: the
/// acquisition fails with `ManagerStopped`.
#[test]
fn no_lease_is_registered_once_the_watchdog_is_gone() -> TestResult {
    let backend = Recording::default();
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let manager = first.block_on(async { LeaseManager::new(backend.clone()) })?;
    // Dropping the runtime drops the watchdog task with it.
    drop(first);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let acquired = second.block_on(async {
        timeout(
            Duration::from_secs(5),
            manager.acquire("orphaned", &options("30s")),
        )
        .await
    })?;
    assert!(
        matches!(
            acquired,
            Err(leasehold_watchdog::LeaseError::ManagerStopped)
        ),
        "acquired with no watchdog: {acquired:?}"
    );
    Ok(())
}
