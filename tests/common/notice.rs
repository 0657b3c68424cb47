//! The check each topology's release-notice test ends with: once the
//! waiter listens, a release hands it the lease well within its fallback
//! poll, which only a release notice makes possible.
//!
//! Included with `#[path]` by the tests that need it, apart from `mod.rs`,
//! whose campaign client they do not use.

use std::fmt::Display;
use std::time::Duration;

use leasehold::backend::LeaseBackend;
use leasehold::{Backoff, Lease, LeaseError, LeaseManager, LeaseOptions, Ttl};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The waiters' fallback poll: far longer than a notice takes.
pub(crate) const FALLBACK: Duration = Duration::from_secs(5);

/// Options for holder and waiter: a 10 s lease, waiting up to 30 s,
/// polling only every [`FALLBACK`].
pub(crate) fn options() -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("10s").expect("a valid ttl"))
        .wait(Duration::from_secs(30))
        .backoff(Backoff::fixed(FALLBACK))
        .build()
        .expect("valid options")
}

/// A waiter's task: when it got the lease, and the lease.
pub(crate) type Waiter = JoinHandle<Result<(Instant, Lease), LeaseError>>;

/// Starts a task that waits for `key` in `manager`.
pub(crate) fn spawn_waiter<B: LeaseBackend>(
    manager: &LeaseManager<B>,
    key: &str,
    options: &LeaseOptions,
) -> Waiter {
    let (manager, key, options) = (manager.clone(), key.to_owned(), options.clone());
    tokio::spawn(async move {
        manager
            .acquire(&key, &options)
            .await
            .map(|lease| (Instant::now(), lease))
    })
}

/// Waits (up to 10 s, looking every 5 ms: the subscription is the server's
/// state, with no signal to wait on) until `subscribed` says the waiter
/// listens; then releases `lease` and checks that the waiter got the lease
/// within a tenth of [`FALLBACK`]. Releases the waiter's lease at the end.
pub(crate) async fn release_wakes<E: Display>(
    what: &str,
    lease: Lease,
    waiter: Waiter,
    mut subscribed: impl FnMut() -> Result<bool, E>,
) -> Result<(), LeaseError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match subscribed() {
            Ok(true) => break,
            Ok(false) => {}
            Err(error) => panic!("{what}: cannot count the subscribers: {error}"),
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let released_at = Instant::now();
    lease.release().await?;
    // The waiter gives up after its 30 s wait; beyond that, only a hang is left.
    let (acquired_at, theirs) = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .unwrap_or_else(|_| panic!("{what}: the waiter neither got the lease nor gave up"))
        .expect("the waiter's task panicked")?;
    let gap = acquired_at - released_at;
    println!("{what}: the waiter acquired {gap:?} after the release");
    assert!(
        gap < FALLBACK / 10,
        "{what}: the waiter polled instead of waking ({gap:?})"
    );
    theirs.release().await?;
    Ok(())
}
