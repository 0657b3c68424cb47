//! What the manager's tests of counting and read-write leases share: waits
//! with a bound, options, and a backend with only the methods every
//! backend must have.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    MemoryBackend, ReleaseReport, RenewOutcome, RenewRequest, Ttl,
};
use leasehold_watchdog::{Backoff, Lease, LeaseError, LeaseManager, LeaseOptions, LossReason};
use tokio::time::Instant;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl std::future::Future<Output = T>,
) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

pub(crate) fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).expect("valid key")
}

/// Waits up to a minute, polling every `poll`.
pub(crate) fn waiting(ttl: &str, poll: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(poll))
        .build()
        .expect("valid options")
}

/// `MemoryBackend` with only the required methods: its capability
/// accessors answer `None`, so a manager refuses permits and read-write
/// leases (`Unsupported`).
#[derive(Clone)]
pub(crate) struct RequiredOnly(pub(crate) MemoryBackend);

impl LeaseBackend for RequiredOnly {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.0.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.0.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        self.0.release(key, holder).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.0.inspect(key).await
    }
}

/// Three ttls on (paused clock), the store still has `lease` with its
/// fencing token: the watchdog renewed it. Then the store loses it, and
/// the lease's token fires with `Lost` within a bound.
pub(crate) async fn check_renewed_then_lost(backend: &MemoryBackend, lease: Lease) -> TestResult {
    tokio::time::sleep(Duration::from_millis(1800)).await;
    // Three ttls on, the store still has it: the watchdog renewed it.
    let info = backend.inspect(&lease.server_key()).await?;
    assert_eq!(
        info.and_then(|i| i.fencing_token),
        Some(lease.fencing_token())
    );
    assert!(lease.renewals() >= 4, "renewals: {}", lease.renewals());
    assert_eq!(lease.loss_reason(), None);
    assert!(backend.vanish(&lease.server_key()));
    let reason = within(Duration::from_secs(10), "the token", lease.lost()).await;
    assert_eq!(reason, LossReason::Lost);
    assert!(lease.token().is_cancelled());
    Ok(())
}

/// A worker that releases what `acquire` takes (a permit, a write lease)
/// and asks again at once, as a loop does, while a waiter of another
/// manager heard the release: that waiter gets it first (the releasing
/// manager yields), and the worker gets it after that waiter's release,
/// with a higher fencing token. `what` names it in failures.
pub(crate) async fn check_not_taken_straight_back<F, Fut>(what: &str, acquire: F) -> TestResult
where
    F: Fn(LeaseManager<MemoryBackend>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<Lease, LeaseError>> + Send,
{
    let backend = MemoryBackend::new();
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let ours = acquire(here.clone()).await?;
    let take = acquire.clone();
    let theirs = tokio::spawn(async move {
        let lease = take(elsewhere).await?;
        Ok::<_, LeaseError>((Instant::now(), lease))
    });
    // The waiter's first attempt is refused; it subscribes and listens.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!theirs.is_finished(), "the waiter got a {what} beside ours");
    let again = tokio::spawn(async move {
        ours.release().await?;
        let lease = acquire(here).await?;
        Ok::<_, LeaseError>((Instant::now(), lease))
    });
    let (their_at, their_lease) = within(Duration::from_secs(90), "the waiter elsewhere", theirs)
        .await?
        .map_err(|e| {
            format!("the waiter elsewhere never got the {what} (taken straight back by the releasing manager?): {e}")
        })?;
    assert!(
        !again.is_finished(),
        "the releasing manager took the {what} straight back"
    );
    let their_token = their_lease.fencing_token();
    their_lease.release().await?;
    let (our_at, our_lease) =
        within(Duration::from_secs(90), "the releasing worker", again).await??;
    assert!(our_at > their_at);
    assert!(our_lease.fencing_token() > their_token);
    Ok(())
}
