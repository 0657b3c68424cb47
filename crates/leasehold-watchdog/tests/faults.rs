//! `MemoryBackend`'s injected faults as an application would use them: to
//! test its own loss handling, deterministically, on the paused clock.
//! (Hangs, vanishing leases and hand-overs are covered in watchdog.rs.)

use std::time::Duration;

use leasehold_core::{BackendError, LeaseBackend, LeaseKey, MemoryBackend, Ttl};
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::with_ttl(Ttl::parse(ttl).expect("valid ttl"))
}

#[tokio::test(start_paused = true)]
async fn a_few_failed_renewals_are_retried_and_the_lease_is_kept() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let lease = manager.acquire("flaky", &options("3s")).await?;
    // The first renewal (due at 1 s) and its first retry fail.
    backend.fail_next(2);
    tokio::time::sleep_until(start + Duration::from_millis(999)).await;
    assert_eq!(lease.renewals(), 0, "renewed before it was due");
    // Retries follow soon (5 ms, then 20 ms later, each delay kept whole;
    // tests/renew_calls.rs pins the instants): a broken connection is the
    // commonest failure, and the client reconnects on it.
    tokio::time::sleep_until(start + Duration::from_millis(1100)).await;
    assert_eq!(
        lease.renewals(),
        1,
        "the retry after the failures did not renew"
    );
    assert_eq!(lease.loss_reason(), None);
    sleep(Duration::from_secs(10)).await;
    assert_eq!(lease.loss_reason(), None);
    assert!(lease.renewals() >= 10);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn renewals_that_keep_failing_fire_the_deadline_while_the_lease_still_exists() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    let lease = manager.acquire("broken", &options).await?;
    let valid_until = lease.valid_until();
    backend.fail_next(u64::MAX);
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Deadline
    );
    assert_eq!(Instant::now(), valid_until - options.safety_margin());
    backend.fail_next(0);
    // The server would still have it: the holder stopped first.
    assert!(backend.inspect(&LeaseKey::new("broken")?).await?.is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn latency_below_the_renew_interval_is_ridden_out_and_above_the_deadline_is_not() -> TestResult
{
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    backend.set_latency(Duration::from_millis(500));
    let started = Instant::now();
    let lease = manager.acquire("slow", &options).await?;
    assert_eq!(Instant::now(), started + Duration::from_millis(500));
    // Validity counts from when the request was sent, not when it answered.
    assert_eq!(
        lease.valid_until(),
        started + Duration::from_secs(3) - leasehold_core::clock_drift(Duration::from_secs(3))
    );
    sleep(Duration::from_secs(10)).await;
    assert_eq!(lease.loss_reason(), None);

    // Every answer now comes after the lease's certain validity.
    backend.set_latency(Duration::from_secs(4));
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Deadline
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn acquire_retries_transient_failures_within_its_wait() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    backend.fail_next(3);
    let waiting = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(5))
        .build()?;
    let lease = manager.acquire("retry", &waiting).await?;
    assert_eq!(lease.loss_reason(), None);
    lease.release().await?;

    // Without a wait, the failure is reported as it is: transient.
    backend.fail_next(1);
    match manager.acquire("retry", &options("3s")).await {
        Err(LeaseError::Backend(error @ BackendError::Unavailable { .. })) => {
            assert!(error.is_transient());
            assert_eq!(error.key(), "retry");
        }
        other => return Err(format!("expected an Unavailable error, got {other:?}").into()),
    }
    Ok(())
}

/// A grant whose reply arrives when its deadline has come (the request
/// took ttl − drift − margin to be answered) is not handed out: no time is
/// left to use it, so the caller is refused and the lease given back at
/// once. A millisecond earlier, it is handed out.
#[tokio::test(start_paused = true)]
async fn a_grant_answered_at_its_deadline_is_given_back() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    let key = LeaseKey::new("late")?;
    backend.set_latency(options.deadline_after());
    let late = within(
        Duration::from_secs(10),
        "the late grant",
        manager.acquire("late", &options),
    )
    .await;
    assert!(
        matches!(late, Err(LeaseError::NotAcquired { .. })),
        "a grant answered at its deadline was handed out: {late:?}"
    );
    backend.set_latency(Duration::ZERO);
    within(Duration::from_secs(1), "the late grant's release", async {
        while backend.inspect(&key).await?.is_some() {
            sleep(Duration::from_millis(1)).await;
        }
        Ok::<_, BackendError>(())
    })
    .await?;

    backend.set_latency(options.deadline_after() - Duration::from_millis(1));
    let lease = within(
        Duration::from_secs(10),
        "the grant",
        manager.acquire("late", &options),
    )
    .await?;
    assert_eq!(lease.loss_reason(), None);
    Ok(())
}
