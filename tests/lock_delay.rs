//! Lock-delay end to end: a lease acquired with `LeaseOptions::lock_delay`
//! keeps its key taken on the server for ttl + lock-delay from the grant and
//! from every renewal, while its holder's token still fires within the ttl;
//! a release frees the key at once.
//!
//! Every lease here has a 1 s ttl and a 2 s lock-delay. The witness is the
//! server's own state, read on a side connection the fault does not touch
//! (`EXISTS`, `PTTL`), and whether another manager is granted the key; on
//! the memory backend, its own record on tokio's paused clock.

use std::time::Duration;

use leasehold::backend::LeaseBackend;
use leasehold::redis::{RedisBackend, RedlockBackend};
use leasehold::{
    LeaseError, LeaseKey, LeaseManager, LeaseOptions, LossReason, MemoryBackend, ReleaseOutcome,
    Ttl,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::{Instant, timeout};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(1);
const DELAY: Duration = Duration::from_secs(2);
/// Far beyond every wait here: a broken mechanism fails the test instead of
/// hanging it.
const LIMIT: Duration = Duration::from_secs(10);

/// How far a witness's reading on a side connection may lag the server
/// moment it judges, on a loaded 2-core machine: the scheduling of the
/// test's task and of the watchdog, the millisecond PTTL answers in (1 ms)
/// and the one the server rounds an expiry to (1 ms). Measured lags: PTTL
/// right after a grant 2999–3000 ms (0–1 ms short of ttl + delay), at the
/// firing 2089–2112 ms against a promised 2112 ms (Redis 7.0.15 and
/// Valkey 8.0.1, five runs; the tests run one at a time), so at most
/// 23 ms. 30 ms fails a safety margin cut in half (seen red: 2061 ms at
/// the firing against 2082 ms), which the 52 ms allowed before passed.
const EPSILON: Duration = Duration::from_millis(30);

/// The safety margin plus the drift allowance of `options`: how long
/// before its validity ends on the server the token fires, at least.
fn promised(options: &LeaseOptions) -> Duration {
    options.safety_margin() + leasehold::backend::clock_drift(options.ttl().get())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// 1 s ttl (renewed every 333 ms, 100 ms safety margin), 2 s lock-delay.
fn delayed() -> Result<LeaseOptions, Error> {
    Ok(LeaseOptions::builder()
        .ttl(Ttl::new(TTL)?)
        .lock_delay(DELAY)
        .build()?)
}

/// Another holder's options: one attempt, or a wait.
fn other(wait: Option<Duration>) -> Result<LeaseOptions, Error> {
    let builder = LeaseOptions::builder().ttl(Ttl::new(TTL)?);
    Ok(match wait {
        Some(wait) => builder.wait(wait),
        None => builder,
    }
    .build()?)
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

/// Polls `EXISTS` until the key is gone; returns when it was last seen.
async fn gone_after(side: &mut MultiplexedConnection, key: &str) -> Result<Instant, Error> {
    let mut seen = Instant::now();
    loop {
        let asked = Instant::now();
        let exists: bool = side.exists(key).await?;
        if !exists {
            return Ok(seen);
        }
        seen = asked;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A holder cut off from the server (its link blackholed, so no release
/// can get through): its token fires while the server still keeps the key
/// for more than a ttl; past the ttl the key still exists and another
/// manager is refused; the key is gone no sooner than ttl + delay after
/// the last renewal (at most a renew interval before the cut), and another
/// manager then gets it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_keeps_the_key_for_the_delay_and_stops_within_its_ttl() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let link = Proxy::start(server.addr()).await?;
    let holder = LeaseManager::new(
        RedisBackend::builder(link.url())
            .op_timeout(Duration::from_millis(200))
            .connect()
            .await?,
    )?;
    let others = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let mut side = side(&server).await?;
    let key = redis_key("ld-cut");

    let lease = holder.acquire("ld-cut", &delayed()?).await?;
    let granted_pttl: i64 = side.pttl(&key).await?;
    let pttl = granted_pttl;
    // The grant sets ttl + delay; the read comes at most EPSILON later.
    assert!(
        pttl > ms(TTL + DELAY / 2) && pttl >= ms(TTL + DELAY - EPSILON) && pttl <= ms(TTL + DELAY),
        "right after the grant the server keeps the key for {pttl} ms, not ttl + delay (less {EPSILON:?})"
    );

    // Held past ttl + delay from the grant: only renewals keep it, and
    // each must give the key ttl + delay again.
    tokio::time::sleep(TTL + DELAY + Duration::from_millis(500)).await;
    assert_eq!(lease.loss_reason(), None, "lost before the cut");
    assert!(lease.renewals() > 0);
    let renewed_pttl: i64 = side.pttl(&key).await?;
    let pttl = renewed_pttl;
    // Each renewal gives ttl + delay again, and the next one is sent at
    // most a renew interval after the last.
    let renew = delayed()?.renew_interval();
    assert!(
        pttl > ms(TTL) && pttl >= ms(TTL + DELAY - renew - EPSILON),
        "after renewals the server keeps the key for {pttl} ms, less than ttl + delay - renew interval ({renew:?}) - {EPSILON:?}"
    );

    let token = lease.token();
    let cut = Instant::now();
    link.set_mode(ProxyMode::Blackhole);
    timeout(LIMIT, token.cancelled()).await?;
    let fired = Instant::now();
    let pttl_at_fire: i64 = side.pttl(&key).await?;
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    // The holder's validity counts from the ttl: it stops with the whole
    // delay still ahead on the server, plus the safety margin and drift
    // allowance it keeps anyway (100 + 12 ms), less the read's lag.
    let at_least = DELAY + promised(&delayed()?) - EPSILON;
    assert!(
        pttl_at_fire > ms(TTL) && pttl_at_fire >= ms(at_least),
        "the token fired when the server kept the key for only {pttl_at_fire} ms more, not the delay plus the safety margin and drift allowance, less {EPSILON:?} ({at_least:?}): the holder's validity stretched, its margin shrank, or the key's expiry is short"
    );

    // Past the ttl since the last renewal (sent before the cut): taken.
    tokio::time::sleep_until(cut + TTL + Duration::from_millis(200)).await;
    let exists: bool = side.exists(&key).await?;
    assert!(exists, "the key was gone within the ttl after the cut");
    match others.acquire("ld-cut", &other(None)?).await {
        Err(LeaseError::NotAcquired { holder, .. }) => {
            let left = holder.ttl_left.ok_or("the server reported no ttl")?;
            assert!(left > Duration::ZERO && left <= TTL + DELAY, "{left:?}");
        }
        result => return Err(format!("expected the key to be held, got {result:?}").into()),
    }

    let seen = timeout(LIMIT, gone_after(&mut side, &key)).await??;
    let kept = seen.saturating_duration_since(cut);
    // The last renewal was sent at most a renew interval before the cut
    // and none got through after it: the key lasts ttl + delay from a
    // moment in [cut - renew interval, cut]; the poll (every 5 ms) sees
    // its end at most 5 ms + EPSILON late.
    let (least, most) = (
        TTL + DELAY - renew - Duration::from_millis(5) - EPSILON,
        TTL + DELAY + EPSILON,
    );
    assert!(
        kept > TTL + DELAY / 2 && kept >= least && kept <= most,
        "the key was last seen {kept:?} after the cut, outside [{least:?}, {most:?}]: ttl + delay from the last renewal"
    );
    let next = others.acquire("ld-cut", &other(None)?).await?;
    assert!(next.fencing_token() > lease.fencing_token());
    println!(
        "PTTL after the grant {granted_pttl} ms, after renewals {renewed_pttl} ms, when the token fired {pttl_at_fire} ms; token fired {:?} after the cut; key last seen {kept:?} after the cut",
        fired - cut
    );

    // Closing the proxy lets the cut-off holder's release fail at once.
    drop(link);
    drop(lease);
    assert_eq!(next.release().await?, ReleaseOutcome::Released);
    timeout(LIMIT, holder.shutdown()).await?;
    timeout(LIMIT, others.shutdown()).await?;
    Ok(())
}

/// A release frees the key at once, whatever its lock-delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_frees_the_key_at_once() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let holder = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let others = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let mut side = side(&server).await?;
    let key = redis_key("ld-release");

    let lease = holder.acquire("ld-release", &delayed()?).await?;
    let pttl: i64 = side.pttl(&key).await?;
    assert!(
        pttl > ms(TTL) && pttl >= ms(TTL + DELAY - EPSILON),
        "{pttl} ms: not ttl + delay (less {EPSILON:?})"
    );
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    let exists: bool = side.exists(&key).await?;
    assert!(!exists, "the key outlived its release");
    let next = others.acquire("ld-release", &other(None)?).await?;
    assert_eq!(next.release().await?, ReleaseOutcome::Released);
    timeout(LIMIT, holder.shutdown()).await?;
    timeout(LIMIT, others.shutdown()).await?;
    Ok(())
}

/// Redlock: every master keeps the key for ttl + delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_redlock_master_keeps_the_key_for_ttl_plus_delay() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let servers = [
        RedisServer::start()?,
        RedisServer::start()?,
        RedisServer::start()?,
    ];
    let manager = LeaseManager::new(
        RedlockBackend::builder(servers.iter().map(RedisServer::url))
            .connect()
            .await?,
    )?;
    let key = redis_key("ld-redlock");
    let lease = manager.acquire("ld-redlock", &delayed()?).await?;
    for server in &servers {
        let pttl: i64 = side(server).await?.pttl(&key).await?;
        // Read after the acquisition and a fresh connection: EPSILON.
        assert!(
            pttl > ms(TTL + DELAY / 2)
                && pttl >= ms(TTL + DELAY - EPSILON)
                && pttl <= ms(TTL + DELAY),
            "a master keeps the key for {pttl} ms, not ttl + delay (less {EPSILON:?})"
        );
    }
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    timeout(LIMIT, manager.shutdown()).await?;
    Ok(())
}

/// The same rules on the memory backend, on the paused clock: a holder
/// whose renewals fail stops at least the delay before the backend frees
/// the key; another manager is refused until then and gets it after.
#[tokio::test(start_paused = true)]
async fn on_the_memory_backend_the_holder_stops_a_delay_before_the_key_frees() -> TestResult {
    let backend = MemoryBackend::new();
    let holder = LeaseManager::new(backend.clone())?;
    let others = LeaseManager::new(backend.clone())?;
    let key = LeaseKey::new("ld-memory")?;

    let lease = holder.acquire("ld-memory", &delayed()?).await?;
    tokio::time::sleep(TTL + DELAY + Duration::from_millis(500)).await;
    assert_eq!(lease.loss_reason(), None, "lost before the fault");
    assert!(lease.renewals() > 0);
    let left = backend
        .inspect(&key)
        .await?
        .and_then(|info| info.ttl_left)
        .ok_or("no lease")?;
    // On the paused clock renewals come exactly a renew interval apart.
    let renew = delayed()?.renew_interval();
    assert!(
        left > TTL && left >= TTL + DELAY - renew,
        "renewals keep the key for only {left:?}, less than ttl + delay - renew interval"
    );
    // Nothing runs between the read and the fault: the key frees then.
    let frees_at = Instant::now() + left;
    backend.fail_next(u64::MAX);

    timeout(LIMIT, lease.token().cancelled()).await?;
    let fired = Instant::now();
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    assert!(
        fired + DELAY <= frees_at,
        "the token fired {:?} before the key frees, less than the delay",
        frees_at - fired
    );
    backend.fail_next(0);
    match others.acquire("ld-memory", &other(None)?).await {
        Err(LeaseError::NotAcquired { holder, .. }) => {
            assert_eq!(holder.ttl_left, Some(frees_at - Instant::now()));
        }
        result => return Err(format!("expected the key to be held, got {result:?}").into()),
    }
    let next = others.acquire("ld-memory", &other(Some(LIMIT))?).await?;
    assert!(Instant::now() >= frees_at, "granted before the key freed");
    assert!(next.fencing_token() > lease.fencing_token());
    drop(lease);
    assert_eq!(next.release().await?, ReleaseOutcome::Released);
    tokio::time::timeout(std::time::Duration::from_secs(10), holder.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    tokio::time::timeout(std::time::Duration::from_secs(10), others.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}
