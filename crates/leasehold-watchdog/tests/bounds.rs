//! A maximum hold and a progress window, on `MemoryBackend` and tokio's
//! paused clock. The backend's own record of the key is the witness; the
//! handle's `valid_until` is never used to judge.

use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend, Ttl};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep, sleep_until};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time), so that a broken mechanism fails the test
/// instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).expect("valid key")
}

/// With a 3 s ttl (renewed every second, 300 ms margin) and a 10 s
/// maximum, the token fires at or before max − margin and after
/// max − margin − renew interval; the backend still has the lease then,
/// and the watchdog frees it a margin later though the handle is kept.
#[tokio::test(start_paused = true)]
async fn a_maximum_hold_fires_the_token_before_the_maximum() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let max = Duration::from_millis(10_500);
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .hold_at_most(max)
        .build()?;
    let margin = options.safety_margin();
    let start = Instant::now();
    let lease = manager.acquire("bounded", &options).await?;
    assert_eq!(
        within(Duration::from_secs(30), "the max-hold token", lease.lost()).await,
        LossReason::MaxHold
    );
    let fired = Instant::now();
    assert!(
        fired <= start + max - margin,
        "fired {:?} after max − margin",
        fired - (start + max - margin)
    );
    assert!(
        fired > start + max - margin - options.renew_interval(),
        "fired {:?} after the start, too early",
        fired - start
    );
    // Renewed meanwhile, and still held on the backend when the token fired.
    assert!(lease.renewals() >= 6, "{} renewals", lease.renewals());
    assert!(backend.inspect(&key("bounded")).await?.is_some());
    // Released by the watchdog a margin later, though the handle lives on.
    sleep(margin + Duration::from_millis(10)).await;
    assert!(backend.inspect(&key("bounded")).await?.is_none());
    drop(lease);
    Ok(())
}

/// A job that reports progress every 700 ms, then stops: its lease is lost
/// as stalled within window + one renew interval of its last report, never
/// within the window, while the backend still has it; the watchdog then
/// frees it though the handle is kept, and another holder can take it.
#[tokio::test(start_paused = true)]
async fn a_job_that_stops_reporting_loses_its_lease_after_its_window() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let window = Duration::from_secs(2);
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .progress_window(window)
        .build()?;
    let lease = manager.acquire("stalls", &options).await?;
    let progress = lease.progress();
    assert!(progress.is_bound());
    let start = Instant::now();
    for n in 1..=6u32 {
        sleep_until(start + Duration::from_millis(700) * n).await;
        progress.clone().report();
    }
    let last_report = Instant::now();
    assert!(!lease.token().is_cancelled());
    assert_eq!(
        within(Duration::from_secs(30), "the stalled token", lease.lost()).await,
        LossReason::Stalled
    );
    let fired = Instant::now();
    assert!(
        fired > last_report + window,
        "fired {:?} after the last report, within the window",
        fired - last_report
    );
    assert!(
        fired <= last_report + window + options.renew_interval(),
        "fired {:?} after the last report",
        fired - last_report
    );
    assert!(backend.inspect(&key("stalls")).await?.is_some());
    sleep(options.safety_margin() + Duration::from_millis(10)).await;
    assert!(backend.inspect(&key("stalls")).await?.is_none());
    let next = manager.acquire("stalls", &options).await?;
    drop(lease);
    next.release().await?;
    Ok(())
}

/// A job that keeps reporting keeps its lease across many renewals; a
/// lease without a window ignores reports and is renewed all the same.
#[tokio::test(start_paused = true)]
async fn a_job_that_keeps_reporting_keeps_its_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .progress_window(Duration::from_secs(2))
        .build()?;
    let lease = manager.acquire("busy", &options).await?;
    let progress = lease.progress();
    for _ in 0..40 {
        sleep(Duration::from_millis(900)).await;
        progress.report();
    }
    assert_eq!(lease.loss_reason(), None);
    assert!(lease.renewals() >= 30, "{} renewals", lease.renewals());
    assert!(backend.inspect(&key("busy")).await?.is_some());
    lease.release().await?;

    let plain = manager
        .acquire("plain", &LeaseOptions::with_ttl(Ttl::parse("3s")?))
        .await?;
    assert!(!plain.progress().is_bound());
    sleep(Duration::from_secs(20)).await;
    assert_eq!(plain.loss_reason(), None);
    plain.release().await?;
    Ok(())
}

/// A renewal that waits for a free call slot is sent later than the
/// watchdog decided to send it, and would reach past the maximum: its
/// validity is cut at the maximum, so the token still fires by
/// max − margin. Twenty-four other leases, each with a ttl of its own (so
/// a renewal time of its own), fall due just before it on a backend that
/// has turned slow (900 ms a call), and fill every call slot.
#[tokio::test(start_paused = true)]
async fn a_renewal_sent_late_is_never_valid_past_the_maximum() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let max = Duration::from_secs(4);
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .hold_at_most(max)
        .build()?;
    // The paused clock stands still until every task waits, and the
    // backend answers at once: every acquisition is sent at this instant.
    let sent = Instant::now();
    let bounded = manager.acquire("late", &options).await?;
    let mut fillers = Vec::new();
    for i in 0..24u64 {
        let ttl = Ttl::new(Duration::from_millis(2400 + 10 * i))?;
        fillers.push(
            manager
                .acquire(format!("filler-{i}"), &LeaseOptions::with_ttl(ttl))
                .await?,
        );
    }
    assert_eq!(Instant::now(), sent);
    backend.set_latency(Duration::from_millis(900));
    assert_eq!(
        within(
            Duration::from_secs(30),
            "the max-hold token",
            bounded.lost()
        )
        .await,
        LossReason::MaxHold
    );
    let fired = Instant::now();
    // Renewed once, late: at 1 s it was still allowed (valid until
    // 3.968 s < 4 s), but sent only when a slot came free.
    assert!(bounded.renewals() >= 1, "never renewed");
    assert!(
        fired - sent <= max - options.safety_margin(),
        "fired {:?} after max − margin",
        (fired - sent) - (max - options.safety_margin())
    );
    Ok(())
}
