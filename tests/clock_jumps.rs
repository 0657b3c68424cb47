//! A server whose wall clock jumps: a Valkey server under libfaketime (see
//! `leasehold_testkit::faketime_server`), judged by the server's own record
//! (its `TIME`, and its keyspace notice of the lease's expiry on a side
//! connection).
//!
//! - Stepped back by less than the fencing counters' retention, the
//!   server still hands out rising tokens: the counter is ahead of the
//!   clock's floor.
//! - Stepped back by more than the retention after the counter expired,
//!   tokens can go back: the stated limit is the real one.
//! - Jumped forward past the ttl, the server drops a held lease at once,
//!   before any client-side margin can help (the Redis lock critique's
//!   case). The holder learns it from the server's invalidation (client
//!   tracking) within a bound, not at its next renewal; a second holder can
//!   be granted in that window, with a higher fencing token, which is what
//!   a store that checks tokens relies on.
//! - On Sentinel (every node under libfaketime, each with its own clock):
//!   the master's clock jumps, as on one server; and a replica whose clock
//!   is ahead is promoted, dropping the leases it took over at once, while
//!   their holders learn only when their renewals reach it.
//!
//! Run by `scripts/test.sh`, which installs the server and libfaketime.

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::time::Duration;

use futures_util::StreamExt;
use leasehold::redis::RedisBackend;
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::{Lease, LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::{RedisServer, SentinelSet, ShiftedClock, faketime_server};
use tokio::time::Instant;

use holders::{Error, within};

type TestResult = Result<(), Error>;

/// How soon after the server drops a lease its holder's token must fire:
/// the invalidation is pushed in the same event-loop turn as the expiry, so
/// this is one loopback delivery plus the watchdog's wake-up, on a loaded
/// two-core machine.
const NOTICE_BOUND: Duration = Duration::from_millis(50);

fn start() -> Result<(RedisServer, ShiftedClock), Error> {
    let (builder, clock) = faketime_server()?;
    Ok((builder.start()?, clock))
}

async fn manager(
    server: &RedisServer,
    retention: Option<Duration>,
) -> Result<LeaseManager<RedisBackend>, Error> {
    let mut builder = RedisBackend::builder(server.url());
    if let Some(retention) = retention {
        builder = builder.fence_retention(retention);
    }
    Ok(LeaseManager::new(builder.connect().await?)?)
}

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .build()
        .expect("valid options")
}

/// The server's clock, in microseconds.
fn server_micros(server: &RedisServer) -> Result<i128, Error> {
    let time = server.cli(&["TIME"])?;
    let mut parts = time.split_whitespace().map(str::parse::<i128>);
    match (parts.next(), parts.next()) {
        (Some(Ok(s)), Some(Ok(us))) => Ok(s * 1_000_000 + us),
        _ => Err(format!("TIME answered {time:?}").into()),
    }
}

/// Moves the server's clock by `offset_ms` and checks, by its own `TIME`,
/// that it moved (at least 90 % of the way, the rest being time passing).
fn jump(server: &RedisServer, clock: &ShiftedClock, offset_ms: i64) -> Result<(), Error> {
    let before = server_micros(server)?;
    clock.set_offset_ms(offset_ms)?;
    let moved = server_micros(server)? - before;
    let want = i128::from(offset_ms) * 1000;
    assert!(
        (moved - want).abs() < want.abs() / 10,
        "the server's clock moved by {moved} us, not {want} us"
    );
    Ok(())
}

#[tokio::test]
async fn tokens_rise_when_the_server_clock_steps_back_within_the_retention() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let (server, clock) = start()?;
    // The default retention (1 h): a 30 s step back is well within it.
    let manager = manager(&server, None).await?;
    let first = manager.acquire("nightly", &options("5s")).await?;
    let token = first.fencing_token();
    first.release().await?;

    jump(&server, &clock, -30_000)?;
    let next = manager.acquire("nightly", &options("5s")).await?;
    assert!(
        next.fencing_token() > token,
        "a token after the clock stepped back 30 s ({}) is above the one before ({token})",
        next.fencing_token()
    );
    next.release().await?;
    Ok(())
}

/// The stated limit: once the counter has expired, a clock stepped back by
/// more than the retention gives a lower token. (If this ever passed the
/// other way, docs/design.md's guarantee would be understated, not wrong.)
#[tokio::test]
async fn a_step_back_beyond_the_retention_after_the_counter_expired_can_lower_tokens() -> TestResult
{
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let (server, clock) = start()?;
    let manager = manager(&server, Some(Duration::from_secs(1))).await?;
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let first = manager.acquire("nightly", &options("5s")).await?;
    let token = first.fencing_token();
    first.release().await?;
    within(Duration::from_secs(3), "the counter to expire", async {
        loop {
            let exists: bool = side.exists("leasehold:{nightly}:fence").await?;
            if !exists {
                return Ok::<_, Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    jump(&server, &clock, -30_000)?;
    let next = manager.acquire("nightly", &options("5s")).await?;
    assert!(
        next.fencing_token() < token,
        "with no counter and the clock 30 s back, the token ({}) comes from the clock, below {token}",
        next.fencing_token()
    );
    next.release().await?;
    Ok(())
}

/// The server's clock jumps 10 s forward while a lease of 3 s is held: the
/// server drops it at once. Its holder's token fires within
/// [`NOTICE_BOUND`] of the server's own notice of the expiry (a keyspace
/// event heard on a side connection), long before its next renewal would
/// have told it; a second holder granted in that window gets a higher
/// token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_jump_ends_a_lease_and_its_holder_hears_at_once() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let (server, clock) = start()?;
    let holder = manager(&server, None).await?;
    let other = manager(&server, None).await?;
    let expired = expiry_of(&server, "report").await?;

    let lease = holder.acquire("report", &options("3s")).await?;
    let token = lease.fencing_token();
    let fired = token_fired(&lease);
    // Just after a renewal, so that the next one is a full interval away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    jump(&server, &clock, 10_000)?;

    let expired_at = within(
        Duration::from_secs(2),
        "the server's expiry notice",
        expired,
    )
    .await?;
    let next = other.acquire("report", &options("3s")).await?;
    let fired_at = within(Duration::from_secs(2), "the holder's token", fired).await?;
    let late = fired_at.saturating_duration_since(expired_at);
    assert!(
        late <= NOTICE_BOUND,
        "the holder believed in a lease the server had dropped for {late:?} (bound {NOTICE_BOUND:?})"
    );
    assert_eq!(lease.loss_reason(), Some(LossReason::Lost));
    assert!(
        next.fencing_token() > token,
        "the second holder's token ({}) is above the first's ({token})",
        next.fencing_token()
    );
    println!("clock jump: the holder heard {late:?} after the server's expiry notice");
    next.release().await?;
    Ok(())
}

/// The instant `lease`'s token fires, taken by a task of its own so that
/// it is the firing's time, not the time the test gets round to asking.
fn token_fired(lease: &Lease) -> tokio::task::JoinHandle<Instant> {
    let token = lease.token();
    tokio::spawn(async move {
        token.cancelled().await;
        Instant::now()
    })
}

/// A Sentinel set whose master, replica and sentinels all run under
/// libfaketime, each with a clock of its own (kept alive beside the set).
struct SkewedSet {
    set: SentinelSet,
    master_clock: ShiftedClock,
    replica_clock: ShiftedClock,
    _sentinel_clocks: Vec<ShiftedClock>,
}

fn skewed_sentinel_set() -> Result<SkewedSet, Error> {
    let (master, master_clock) = faketime_server()?;
    let (replica, replica_clock) = faketime_server()?;
    let mut sentinel_clocks = Vec::new();
    let mut failed = None;
    let set =
        SentinelSet::start_with_builders(Duration::from_millis(1000), master, replica, || {
            match faketime_server() {
                Ok((builder, clock)) => {
                    sentinel_clocks.push(clock);
                    builder
                }
                Err(error) => {
                    // Started as a plain server instead; reported below.
                    failed = Some(error);
                    RedisServer::builder()
                }
            }
        })?;
    if let Some(error) = failed {
        return Err(error.into());
    }
    Ok(SkewedSet {
        set,
        master_clock,
        replica_clock,
        _sentinel_clocks: sentinel_clocks,
    })
}

async fn sentinel_manager(set: &SentinelSet) -> Result<LeaseManager<RedisBackend>, Error> {
    Ok(LeaseManager::new(RedisBackend::connect(&set.url()).await?)?)
}

/// Subscribes to `server`'s expiry events and returns a future that
/// resolves at the first one for `leasehold:{<key>}`.
async fn expiry_of(
    server: &RedisServer,
    key: &'static str,
) -> Result<impl std::future::Future<Output = Result<Instant, Error>> + use<>, Error> {
    server.cli(&["CONFIG", "SET", "notify-keyspace-events", "Ex"])?;
    let mut events = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    events.subscribe("__keyevent@0__:expired").await?;
    let wanted = format!("leasehold:{{{key}}}");
    // A task of its own, listening from now on: the notice is stamped when
    // it arrives, not when the test gets round to awaiting it (after the
    // clock jump, which takes longer than the holder needs to hear).
    let listening = tokio::spawn(async move {
        let mut events = events.into_on_message();
        loop {
            let message = events.next().await.ok_or("the event subscription ended")?;
            let expired: String = message.get_payload()?;
            if expired == wanted {
                return Ok::<_, Error>(Instant::now());
            }
        }
    });
    Ok(async move { listening.await? })
}

/// Sentinel, the master's clock jumps forward: as on a standalone server,
/// the master drops the lease at once and its holder (connected through
/// the sentinels, tracking on the master) hears within [`NOTICE_BOUND`]
/// of the master's own expiry notice; the next holder's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_forward_jump_of_the_master_ends_a_lease_and_its_holder_hears_at_once()
-> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let skewed = skewed_sentinel_set()?;
    let master = skewed.set.master();
    let holder = sentinel_manager(&skewed.set).await?;
    let other = sentinel_manager(&skewed.set).await?;
    let expired = expiry_of(master, "report").await?;

    let lease = holder.acquire("report", &options("3s")).await?;
    let token = lease.fencing_token();
    let fired = token_fired(&lease);
    tokio::time::sleep(Duration::from_millis(100)).await;
    jump(master, &skewed.master_clock, 10_000)?;

    let expired_at = within(
        Duration::from_secs(2),
        "the master's expiry notice",
        expired,
    )
    .await?;
    let next = other.acquire("report", &options("3s")).await?;
    let fired_at = within(Duration::from_secs(2), "the holder's token", fired).await?;
    let late = fired_at.saturating_duration_since(expired_at);
    assert!(
        late <= NOTICE_BOUND,
        "the holder believed in a lease the master had dropped for {late:?} (bound {NOTICE_BOUND:?})"
    );
    assert_eq!(lease.loss_reason(), Some(LossReason::Lost));
    assert!(
        next.fencing_token() > token,
        "the second holder's token ({}) is above the first's ({token})",
        next.fencing_token()
    );
    println!(
        "sentinel, master clock jump: the holder heard {late:?} after the master's expiry notice"
    );
    next.release().await?;
    Ok(())
}

/// Resolves at the first instant `url`'s server answers `ROLE` as a
/// master (polled every 2 ms, on a fresh connection whenever one closes).
fn promotion_of(url: String) -> tokio::task::JoinHandle<Result<Instant, Error>> {
    tokio::spawn(async move {
        let client = redis::Client::open(url)?;
        loop {
            if let Ok(mut connection) = client.get_multiplexed_async_connection().await {
                loop {
                    let role: Result<Vec<redis::Value>, _> =
                        redis::cmd("ROLE").query_async(&mut connection).await;
                    match role.as_deref() {
                        Ok([redis::Value::BulkString(role), ..]) if role == b"master" => {
                            return Ok(Instant::now());
                        }
                        Ok(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                        Err(_) => break,
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
}

/// How soon after the sentinels name the new master the old holder learns
/// its lease is gone: the backend hears the sentinels' `+switch-master`
/// and reports every lease as possibly changed, so the watchdog renews
/// them at once on the new master, which answers that the lease is not
/// there. Without that subscription, losing the tracking connection
/// reported them all and the renewals were retried every 320 ms at most
/// (`timing.rs`) until a lookup through the sentinels named the new
/// master: the bound allows that path, plus slack for a loaded two-core
/// machine. Measured 0–20 ms after the test's poll saw two sentinels name
/// the new master (often before it: the poll lags the announcement); 90–175
/// ms before the subscription. With tracking off (the red check) the
/// holder learns at its next scheduled renewal, about 1 s after.
const RECONNECT_BOUND: Duration = Duration::from_millis(500);

/// How late past its deadline a token may fire: the watchdog's timer
/// wake-up on a loaded two-core machine.
const TIMER_SLACK: Duration = Duration::from_millis(100);

/// Sentinel, a replica whose clock runs 60 s ahead is promoted: every
/// lease it took over by replication is already past its expiry on its
/// clock, so it drops them at once. This is the jump no client-side margin
/// covers: a second holder is granted while the first may still believe,
/// and only fencing keeps the two apart (the second token is higher). The
/// first holder's token fires at the latest at its deadline counted from
/// its last renewal, which was sent before the master was killed: by the
/// kill + `deadline_after` (ttl − drift allowance − safety margin) +
/// [`TIMER_SLACK`]. The window in which it believed while the new master
/// had dropped the lease is measured and printed (docs/reliability.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_promoted_replica_whose_clock_is_ahead_drops_leases_and_fencing_keeps_order()
-> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let mut skewed = skewed_sentinel_set()?;
    jump(skewed.set.replica(), &skewed.replica_clock, 60_000)?;
    let mut promoted = promotion_of(skewed.set.replica().url());
    let holder = sentinel_manager(&skewed.set).await?;
    let options = options("10s");

    let lease = holder.acquire("report", &options).await?;
    let token = lease.fencing_token();
    let fired = token_fired(&lease);
    // Replicated before the kill, so that the promoted replica has it (its
    // own reads already hide the key: on its clock it has expired).
    let acked = skewed.set.master().cli(&["WAIT", "1", "2000"])?;
    assert_eq!(acked.trim(), "1", "the replica acknowledged the lease");
    let killed_at = Instant::now();
    skewed.set.kill_master()?;
    let failover = tokio::task::block_in_place(|| skewed.set.wait_for_failover())?;
    let failover_seen_at = Instant::now();
    // Sentinel closes the promoted replica's client connections, so its
    // expiry notice cannot be heard; the lease is dropped as it becomes
    // master (on its clock the key has long expired, and its own reads
    // already hid it before).
    let expired_at = within(
        Duration::from_secs(5),
        "the replica's promotion",
        &mut promoted,
    )
    .await;
    // The poller loops until it sees a master: stop it once it has.
    promoted.abort();
    let expired_at = expired_at??;

    let other = sentinel_manager(&skewed.set).await?;
    let next = other.acquire("report", &options).await?;
    let granted_at = Instant::now();
    let fired_at = within(
        options.deadline_after() + Duration::from_secs(2),
        "the holder's token",
        fired,
    )
    .await?;
    assert!(
        next.fencing_token() > token,
        "the second holder's token ({}) is above the first's ({token})",
        next.fencing_token()
    );
    let latest = killed_at + options.deadline_after() + TIMER_SLACK;
    assert!(
        fired_at <= latest,
        "the holder's token fired {:?} after the kill, past its deadline bound {:?}",
        fired_at - killed_at,
        latest - killed_at
    );
    let after_failover = fired_at.saturating_duration_since(failover_seen_at);
    assert!(
        after_failover <= RECONNECT_BOUND,
        "the holder learned {after_failover:?} after the sentinels named the new master (bound {RECONNECT_BOUND:?})"
    );
    println!(
        "sentinel, promoted replica 60 s ahead: failover {failover:?}; the replica became master, dropping the lease, {:?} after the kill; a second holder was granted {:?} after the kill; the first holder's token fired {:?} after the kill ({:?} after the drop, {after_failover:?} after the test saw the sentinels name the new master; its reason: {:?})",
        expired_at - killed_at,
        granted_at - killed_at,
        fired_at - killed_at,
        fired_at.saturating_duration_since(expired_at),
        lease.loss_reason()
    );
    next.release().await?;
    Ok(())
}
