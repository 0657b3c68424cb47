//! A maximum hold and a progress window against a real server, judged by a
//! side connection that reads the key's `PTTL` and `EXISTS` on the server
//! itself, never by the library's `valid_until`.
//!
//! Both leases have a 2 s ttl (renewed every 667 ms, 200 ms safety margin,
//! 22 ms drift allowance). Each firing is bounded on both sides:
//!
//! - the server's `PTTL` read at the firing is at least the safety margin
//!   plus the drift allowance, less [`READ_SLACK`];
//! - the maximum hold fires within the last renew interval before
//!   `maximum − safety margin` (the watchdog stops renewing when a renewal
//!   would keep the lease past the maximum), and never after it;
//! - the stall fires within one renew interval after the window, plus
//!   [`TIMER_SLACK`].

use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{Lease, LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep, timeout};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

/// Between the token firing and the side connection's `PTTL` reply: the
/// wake-up of this test's task and one loopback round trip. Serial runs
/// here read 1–3 ms; 30 ms covers a loaded two-core machine and is still
/// a seventh of the 222 ms promised.
const READ_SLACK: Duration = Duration::from_millis(30);

/// How late a watchdog timer may fire on a loaded two-core machine (serial
/// runs here: under 5 ms).
const TIMER_SLACK: Duration = Duration::from_millis(100);

/// The least `PTTL` the server may show when a lease's token fires: the
/// safety margin and the drift allowance, less [`READ_SLACK`].
fn least_pttl(options: &LeaseOptions, ttl: Ttl) -> i64 {
    let drift = leasehold::backend::clock_drift(ttl.get());
    let least = (options.safety_margin() + drift).saturating_sub(READ_SLACK);
    i64::try_from(least.as_millis()).unwrap_or(i64::MAX)
}

/// The Redis key of lease `name`.
fn redis_key(name: &str) -> String {
    format!("leasehold:{{{name}}}")
}

async fn side(server: &RedisServer) -> Result<MultiplexedConnection, Error> {
    Ok(redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// Waits for the lease's token, then reads the key's remaining life on
/// the server at once: the token must fire while the key still lives.
async fn pttl_when_fired(
    lease: &Lease,
    side: &mut MultiplexedConnection,
    key: &str,
) -> Result<(Instant, i64), Error> {
    timeout(Duration::from_secs(15), lease.token().cancelled())
        .await
        .map_err(|_| "the token did not fire within 15 s")?;
    let fired = Instant::now();
    let pttl: i64 = side.pttl(key).await?;
    Ok((fired, pttl))
}

/// Polls `EXISTS` on the side connection until the key is gone; when.
async fn gone(side: &mut MultiplexedConnection, key: &str) -> Result<Instant, Error> {
    timeout(Duration::from_secs(5), async {
        loop {
            let exists: bool = side.exists(key).await?;
            if !exists {
                return Ok::<_, Error>(Instant::now());
            }
            sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .map_err(|_| "the key was still there 5 s later")?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_maximum_hold_fires_before_the_server_expires_the_lease() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(&server.url()).await?)?;
    let mut side = side(&server).await?;
    let max = Duration::from_secs(5);
    let ttl = Ttl::parse("2s")?;
    let options = LeaseOptions::builder().ttl(ttl).hold_at_most(max).build()?;
    // Before the acquisition was sent, so `fired - before` bounds the hold
    // from below.
    let before = Instant::now();
    let lease = manager.acquire("max-hold", &options).await?;
    // After the acquisition was sent, so `fired - start` bounds the hold
    // from above.
    let start = Instant::now();
    let key = redis_key("max-hold");
    let (fired, pttl) = pttl_when_fired(&lease, &mut side, &key).await?;
    assert_eq!(lease.loss_reason(), Some(LossReason::MaxHold));
    let least = least_pttl(&options, ttl);
    assert!(
        pttl >= least,
        "the server's key had {pttl} ms left when the token fired, less than {least} ms"
    );
    assert!(
        fired - start <= max - options.safety_margin(),
        "fired {:?} after the acquisition",
        fired - start
    );
    let earliest = max - options.renew_interval() - options.safety_margin() - TIMER_SLACK;
    assert!(
        fired - before >= earliest,
        "fired {:?} after the acquisition, before {earliest:?}: the lease was cut short",
        fired - before
    );
    assert!(lease.renewals() >= 3, "{} renewals", lease.renewals());
    // Gone soon after, the handle still held.
    let gone_at = gone(&mut side, &key).await?;
    println!(
        "max hold: fired {:?} after acquisition with PTTL {pttl} ms left; gone {:?} later",
        fired - start,
        gone_at - fired
    );
    drop(lease);
    timeout(Duration::from_secs(10), manager.shutdown()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_job_loses_its_lease_before_expiry_and_another_node_takes_over() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(&server.url()).await?)?;
    let other = LeaseManager::new(RedisBackend::connect(&server.url()).await?)?;
    let mut side = side(&server).await?;
    let window = Duration::from_secs(1);
    let ttl = Ttl::parse("2s")?;
    let options = LeaseOptions::builder()
        .ttl(ttl)
        .progress_window(window)
        .wait(Duration::from_secs(10))
        .build()?;
    let lease = manager.acquire("stalls", &options).await?;
    let key = redis_key("stalls");
    let progress = lease.progress();
    // Progress every 200 ms for 2 s (three renewals), then none.
    for _ in 0..10 {
        sleep(Duration::from_millis(200)).await;
        progress.report();
    }
    let last_report = Instant::now();
    assert_eq!(lease.loss_reason(), None, "lost while reporting");
    let (fired, pttl) = pttl_when_fired(&lease, &mut side, &key).await?;
    assert_eq!(lease.loss_reason(), Some(LossReason::Stalled));
    let least = least_pttl(&options, ttl);
    assert!(
        pttl >= least,
        "the server's key had {pttl} ms left when the token fired, less than {least} ms"
    );
    let stalled_for = fired - last_report;
    assert!(
        stalled_for > window && stalled_for <= window + options.renew_interval() + TIMER_SLACK,
        "fired {stalled_for:?} after the last report"
    );
    // Released, not expired: gone before the server would have dropped it.
    let gone_at = gone(&mut side, &key).await?;
    let expiry = fired + Duration::from_millis(u64::try_from(pttl)?);
    assert!(
        gone_at < expiry,
        "the key lived until it expired ({:?} after)",
        gone_at - expiry
    );
    println!(
        "stalled: fired {stalled_for:?} after the last report with PTTL {pttl} ms left; gone {:?} later",
        gone_at - fired
    );
    // Another node takes over while the stalled holder keeps its handle.
    let taken = other.acquire("stalls", &options).await?;
    assert!(taken.fencing_token() > lease.fencing_token());
    taken.release().await?;
    drop(lease);
    timeout(Duration::from_secs(10), manager.shutdown()).await?;
    timeout(Duration::from_secs(10), other.shutdown()).await?;
    Ok(())
}
