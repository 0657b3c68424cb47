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
//!
//! Run by `scripts/test.sh`, which installs the server and libfaketime.

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::time::Duration;

use futures_util::StreamExt;
use leasehold::redis::RedisBackend;
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::{LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::{RedisServer, ShiftedClock, faketime_server};
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
    let (server, clock) = start()?;
    server.cli(&["CONFIG", "SET", "notify-keyspace-events", "Ex"])?;
    let holder = manager(&server, None).await?;
    let other = manager(&server, None).await?;
    let mut events = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    events.subscribe("__keyevent@0__:expired").await?;
    let mut events = events.into_on_message();

    let lease = holder.acquire("report", &options("3s")).await?;
    let token = lease.fencing_token();
    let fired = {
        let lease_token = lease.token();
        tokio::spawn(async move {
            lease_token.cancelled().await;
            Instant::now()
        })
    };
    // Just after a renewal, so that the next one is a full interval away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    jump(&server, &clock, 10_000)?;

    let expired_at = within(
        Duration::from_secs(2),
        "the server's expiry notice",
        async {
            loop {
                let message = events.next().await.ok_or("the event subscription ended")?;
                let key: String = message.get_payload()?;
                if key == "leasehold:{report}" {
                    return Ok::<_, Error>(Instant::now());
                }
            }
        },
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
