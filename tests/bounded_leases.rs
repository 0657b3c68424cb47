//! A maximum hold and a progress window against a real server, judged by a
//! side connection that reads the key's `PTTL` and `EXISTS` on the server
//! itself, never by the library's `valid_until`.
//!
//! Both leases have a 2 s ttl (renewed every 667 ms, 200 ms safety margin,
//! 22 ms drift allowance).

use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{Lease, LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, sleep, timeout};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

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
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .hold_at_most(max)
        .build()?;
    let lease = manager.acquire("max-hold", &options).await?;
    // After the acquisition was sent, so `fired - start` bounds the hold
    // from above.
    let start = Instant::now();
    let key = redis_key("max-hold");
    let (fired, pttl) = pttl_when_fired(&lease, &mut side, &key).await?;
    assert_eq!(lease.loss_reason(), Some(LossReason::MaxHold));
    assert!(
        pttl > 0,
        "the server had no live key when the token fired (PTTL {pttl})"
    );
    assert!(
        fired - start <= max - options.safety_margin(),
        "fired {:?} after the acquisition",
        fired - start
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
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
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
    assert!(
        pttl > 0,
        "the server had no live key when the token fired (PTTL {pttl})"
    );
    let stalled_for = fired - last_report;
    assert!(
        stalled_for > window
            && stalled_for <= window + options.renew_interval() + Duration::from_millis(100),
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
