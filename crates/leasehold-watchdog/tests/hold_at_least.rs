//! The minimum hold through the manager, on `MemoryBackend` and tokio's
//! paused clock: a handle released early ends at once, while the key stays
//! taken until the grant + the minimum; a waiter of the same manager (the
//! local handover) or of another one (another process) gets the lease only
//! then, and at once then; permits and read-write leases refuse it. The
//! backend's record (`inspect`) and the waiters' grant times are the
//! witnesses.

use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend, PermitLimit, ReleaseOutcome};
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions};
use tokio::time::{Instant, sleep};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MINIMUM: Duration = Duration::from_secs(5);

/// The waiter asks again 1 ms after the time left it was told
/// (`waiting.rs`), and the memory backend answers at once: a grant later
/// than this after the key's end is not "soon after".
const GRANT_BOUND: Duration = Duration::from_millis(5);

fn options() -> Result<LeaseOptions, LeaseError> {
    LeaseOptions::builder()
        .ttl(Duration::from_secs(30))
        .hold_at_least(MINIMUM)
        .wait(Duration::from_secs(60))
        .build()
}

/// Releases `holder`'s lease 1 s after its grant while `waiter` waits, and
/// checks the release returned at once (the handle ends as after any
/// release: its token is left alone, as `Lease::token` says), the key stayed taken until grant +
/// minimum, and the waiter was granted within `GRANT_BOUND` after that.
async fn early_release_then_wait(
    backend: &MemoryBackend,
    holder: &LeaseManager<MemoryBackend>,
    waiter: &LeaseManager<MemoryBackend>,
) -> TestResult {
    let options = options()?;
    let granted = Instant::now();
    let lease = holder.acquire("nightly", &options).await?;
    let wait = {
        let (waiter, options) = (waiter.clone(), options.clone());
        tokio::spawn(async move {
            let lease = waiter.acquire("nightly", &options).await;
            (Instant::now(), lease)
        })
    };
    sleep(Duration::from_secs(1)).await;
    let released = Instant::now();
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    assert_eq!(released.elapsed(), Duration::ZERO, "the release waited");
    let key = LeaseKey::new("nightly")?;
    let info = backend.inspect(&key).await?.ok_or("the key was freed")?;
    assert_eq!(info.ttl_left, Some(MINIMUM - Duration::from_secs(1)));

    let (at, next) = tokio::time::timeout(Duration::from_secs(70), wait).await??;
    let next = next?;
    let after = at.saturating_duration_since(granted + MINIMUM);
    assert!(
        at >= granted + MINIMUM,
        "the waiter got the lease {:?} before the minimum ran out",
        (granted + MINIMUM) - at
    );
    assert!(
        after <= GRANT_BOUND,
        "granted {after:?} after the key's end"
    );
    next.release().await?;
    Ok(())
}

/// Same manager: the release finds the waiter's offer, and must not hand
/// the lease over under the minimum.
#[tokio::test(start_paused = true)]
async fn a_local_waiter_gets_the_lease_when_the_minimum_runs_out() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    early_release_then_wait(&backend, &manager, &manager).await?;
    shut_down(&manager).await?;
    Ok(())
}

/// Another manager (another process): no release notice comes, the
/// waiter asks again when the time left runs out.
#[tokio::test(start_paused = true)]
async fn another_process_gets_the_lease_when_the_minimum_runs_out() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    );
    early_release_then_wait(&backend, &a, &b).await?;
    shut_down(&a).await?;
    shut_down(&b).await?;
    Ok(())
}

/// After the minimum, a release frees the key at once: the waiter, told by
/// the notice, has it the same instant.
#[tokio::test(start_paused = true)]
async fn after_the_minimum_a_release_frees_at_once() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    );
    let options = options()?;
    let lease = a.acquire("nightly", &options).await?;
    sleep(MINIMUM + Duration::from_secs(1)).await;
    let wait = {
        let (b, options) = (b.clone(), options.clone());
        tokio::spawn(async move { b.acquire("nightly", &options).await.map(|_| Instant::now()) })
    };
    sleep(Duration::from_secs(2)).await;
    let released = Instant::now();
    lease.release().await?;
    let at = tokio::time::timeout(Duration::from_secs(70), wait).await???;
    assert!(
        at - released <= Duration::from_millis(1),
        "{:?}",
        at - released
    );
    shut_down(&a).await?;
    shut_down(&b).await?;
    Ok(())
}

/// Every other way a lease ends by a release keeps the minimum too: a
/// dropped handle (released in the background) and a manager's shutdown.
#[tokio::test(start_paused = true)]
async fn a_dropped_handle_and_a_shutdown_keep_the_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options()?;
    let dropped = manager.acquire("dropped", &options).await?;
    let _shut = manager.acquire("shut", &options).await?;
    sleep(Duration::from_secs(1)).await;
    drop(dropped);
    shut_down(&manager).await?;
    // The background release and the shutdown's have run; both keys stay,
    // each until its grant + the minimum.
    sleep(Duration::from_millis(10)).await;
    for key in ["dropped", "shut"] {
        let info = backend
            .inspect(&LeaseKey::new(key)?)
            .await?
            .ok_or(format!("{key} was freed"))?;
        let left = info.ttl_left.ok_or("no ttl")?;
        assert_eq!(left, MINIMUM - Duration::from_millis(1_010), "{key}");
    }
    Ok(())
}

/// Permits and read-write leases refuse options that carry a minimum as
/// not applicable to their kind; nothing is taken.
#[tokio::test(start_paused = true)]
async fn permits_and_shares_refuse_a_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options()?;
    for (refused, asked) in [
        (
            manager
                .acquire_permit("pool", PermitLimit::new(2)?, &options)
                .await
                .err(),
            "a permit",
        ),
        (
            manager.acquire_read("doc", &options).await.err(),
            "a read share",
        ),
        (
            manager.acquire_write("doc", &options).await.err(),
            "a write share",
        ),
    ] {
        assert!(
            matches!(refused, Some(LeaseError::NotApplicable { option: "hold_at_least", kind, .. }) if kind == asked),
            "{refused:?}"
        );
    }
    for key in ["{pool}:permit:0", "{pool}:permit:1", "{doc}:write"] {
        assert_eq!(backend.inspect(&LeaseKey::new(key)?).await?, None);
    }
    shut_down(&manager).await?;
    Ok(())
}

/// Shuts `manager` down, failing the test if that does not end within
/// 10 s (tokio time: on the paused clock the runtime advances to it).
async fn shut_down(manager: &LeaseManager<MemoryBackend>) -> TestResult {
    tokio::time::timeout(Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}
