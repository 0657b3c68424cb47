//! The minimum hold end to end on a real server: a lease acquired with
//! `LeaseOptions::hold_at_least` and released before grant + minimum stays
//! taken, still its holder's, until then by the server's clock; released
//! after it, the key is freed at once; a waiter (of another manager, or of
//! the same one, whose release would otherwise hand the lease over) is
//! granted within a few milliseconds of the server freeing the key.
//!
//! The witness is the server: `TIME` read on a side connection around the
//! acquisition brackets the grant by the server's clock, `PEXPIRETIME`
//! (Redis 7.0) says when the server will free the key, `EXISTS` and `GET`
//! what it holds. No number the library computed is trusted.

use std::time::Duration;

use futures_util::StreamExt;
use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, RenewOutcome,
    RenewRequest,
};
use leasehold::redis::{RedisBackend, RedlockBackend};
use leasehold::{LeaseKey, LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::timeout;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Error = Box<dyn std::error::Error + Send + Sync>;

/// Far longer than the minimum: a key kept for the ttl instead of the
/// minimum shows.
const TTL: Duration = Duration::from_secs(30);
const MINIMUM: Duration = Duration::from_millis(1_500);
/// Far beyond every wait here: a broken mechanism fails the test instead
/// of hanging it.
const LIMIT: Duration = Duration::from_secs(10);

/// How late after the server freed the key a waiter may be granted it.
/// The waiter asks again 1 ms after the time left its last refusal
/// reported (`waiting.rs`), the timer rounding up by at most 1 ms more;
/// the server measured that time left before its reply's trip, so the
/// retry arrives at the key's end + 1–2 ms + one loopback round trip
/// (well under 1 ms). The grant is judged as the server records it: the
/// waiter's key is written with `PX ttl` at its grant, so its
/// `PEXPIRETIME` less the ttl is the server's time of the grant. 25 ms
/// leaves the rest for scheduling on a loaded 2-core machine; a waiter
/// that polled on its backoff alone would be up to its 500 ms cap late.
const GRANT_BOUND_MS: i64 = 25;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn options() -> Result<LeaseOptions, Error> {
    Ok(LeaseOptions::builder()
        .ttl(Ttl::new(TTL)?)
        .hold_at_least(MINIMUM)
        .wait(LIMIT)
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

/// The server's clock, in milliseconds since 1970.
async fn server_ms(side: &mut MultiplexedConnection) -> Result<i64, Error> {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(side).await?;
    Ok(secs * 1_000 + micros / 1_000)
}

/// When the server will free `key`, in milliseconds since 1970 (-2: gone,
/// -1: no expiry).
async fn expires_at(side: &mut MultiplexedConnection, key: &str) -> Result<i64, Error> {
    Ok(redis::cmd("PEXPIRETIME").arg(key).query_async(side).await?)
}

/// (1) and (4): released 200 ms after the grant, the key stays, with the
/// holder's value, until grant + minimum by the server's clock: between
/// `TIME` before the acquisition + minimum and `TIME` after it + minimum +
/// 1 ms (Redis keeps expiries in whole milliseconds, truncating the clock
/// it adds to). The bound's width is the acquisition's round trip as the
/// server's clock saw it. Another holder can neither release nor renew
/// the kept key, nor take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_release_keeps_the_key_until_grant_plus_minimum() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let manager = LeaseManager::new(backend.clone())?;
    let mut side = side(&server).await?;
    let key = redis_key("mh-early");

    let before = server_ms(&mut side).await?;
    let lease = manager.acquire("mh-early", &options()?).await?;
    let after = server_ms(&mut side).await?;
    let value: Option<String> = side.get(&key).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);

    let end = expires_at(&mut side, &key).await?;
    let (low, high) = (before + ms(MINIMUM), after + ms(MINIMUM) + 1);
    assert!(
        (low..=high).contains(&end),
        "after an early release the server frees the key at {end}, not within [{low}, {high}] (grant + minimum by its clock; {} ms after the grant)",
        end - before
    );
    eprintln!(
        "kept until {} ms after TIME before the acquisition (minimum {} ms, acquisition bracket {} ms)",
        end - before,
        ms(MINIMUM),
        after - before
    );
    let kept: Option<String> = side.get(&key).await?;
    assert_eq!(
        kept, value,
        "the kept key does not carry the holder's value"
    );

    // (4) A stranger cannot end, extend or take the kept key.
    let lease_key = LeaseKey::new("mh-early")?;
    let stranger = HolderId::generate()?;
    assert_eq!(
        backend.release(&lease_key, &stranger).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    let renewal = RenewRequest::new(lease_key.clone(), stranger, Ttl::new(TTL)?);
    assert_eq!(backend.renew(&renewal).await?, RenewOutcome::Lost);
    let request = AcquireRequest::new(lease_key, stranger, Ttl::new(TTL)?);
    assert!(matches!(
        backend.try_acquire(&request).await?,
        AcquireOutcome::Held(_)
    ));
    assert_eq!(
        expires_at(&mut side, &key).await?,
        end,
        "a stranger moved the end"
    );
    let still: Option<String> = side.get(&key).await?;
    assert_eq!(still, value);

    // Freed by the server, by itself, at its end.
    let left = u64::try_from(end - server_ms(&mut side).await?).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(left + 20)).await;
    let exists: bool = side.exists(&key).await?;
    assert!(!exists, "the kept key outlived grant + minimum");
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// (2) Released after the minimum, the key is freed at once: gone when the
/// release returns, and announced on its release channel (heard on a side
/// subscription), as a release without a minimum is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_the_minimum_frees_the_key_at_once() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let mut side = side(&server).await?;
    let key = redis_key("mh-late");
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(TTL)?)
        .hold_at_least(Duration::from_millis(300))
        .build()?;
    let mut notices = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    notices.subscribe(format!("{key}:released")).await?;
    let granted = {
        let before = server_ms(&mut side).await?;
        let lease = manager.acquire("mh-late", &options).await?;
        (lease, before)
    };
    // Past the minimum by the server's clock, whatever the client's says.
    while server_ms(&mut side).await? < granted.1 + 400 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(granted.0.release().await?, ReleaseOutcome::Released);
    let exists: bool = side.exists(&key).await?;
    assert!(!exists, "a release after the minimum left the key taken");
    let mut heard = notices.on_message();
    let notice = timeout(Duration::from_secs(1), heard.next()).await;
    assert!(
        matches!(notice, Ok(Some(_))),
        "a release after the minimum sent no release notice"
    );
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// (3) A waiter is granted the key within `GRANT_BOUND_MS` of the moment
/// the server freed it (`PEXPIRETIME` read after the release), and not
/// before: the grant is bracketed by the server's `TIME`.
async fn waiter_is_granted_when_the_key_is_freed(
    server: &RedisServer,
    holder: &LeaseManager<RedisBackend>,
    waiter: &LeaseManager<RedisBackend>,
    name: &str,
) -> TestResult {
    let mut side = side(server).await?;
    let key = redis_key(name);
    let options = options()?;
    let before = server_ms(&mut side).await?;
    let lease = holder.acquire(name, &options).await?;
    let after = server_ms(&mut side).await?;
    let wait = {
        let (waiter, options, name) = (waiter.clone(), options.clone(), name.to_owned());
        tokio::spawn(async move { waiter.acquire(name, &options).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    lease.release().await?;
    let end = expires_at(&mut side, &key).await?;
    let (low, high) = (before + ms(MINIMUM), after + ms(MINIMUM) + 1);
    assert!(
        (low..=high).contains(&end),
        "after the release the server frees the key at {end}, not within [{low}, {high}] (grant + minimum by its clock): the release freed it, or handed it over"
    );

    let next = timeout(LIMIT, wait).await???;
    // The server's record of the grant: no renewal has come yet (the first
    // is a third of the ttl away), so the key's expiry is grant + ttl.
    let now_end = expires_at(&mut side, &key).await?;
    assert!(now_end > end, "the key is not the waiter's");
    let gap = now_end - ms(TTL) - end;
    eprintln!("{name}: granted {gap} ms after the server freed the key");
    assert!(
        (0..=GRANT_BOUND_MS).contains(&gap),
        "the server granted the waiter the key {gap} ms after it freed it, not within 0..={GRANT_BOUND_MS}"
    );
    next.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_elsewhere_is_granted_when_the_server_frees_the_key() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let holder = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let waiter = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    waiter_is_granted_when_the_key_is_freed(&server, &holder, &waiter, "mh-elsewhere").await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), holder.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    tokio::time::timeout(std::time::Duration::from_secs(10), waiter.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// The same manager: its release finds the waiter's offer (`handover.lua`)
/// and must not hand the lease over under the minimum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_is_not_handed_the_lease_under_the_minimum() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    waiter_is_granted_when_the_key_is_freed(&server, &manager, &manager, "mh-local").await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// A minimum-hold mark expires by itself: after the kept key is freed,
/// nothing of the lease but its fencing counter is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_but_the_counter_is_left_behind() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let mut side = side(&server).await?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(TTL)?)
        .hold_at_least(Duration::from_millis(300))
        .build()?;
    manager
        .acquire("mh-left", &options)
        .await?
        .release()
        .await?;
    let mark = format!("{}:held-until", redis_key("mh-left"));
    let pttl: i64 = side.pttl(&mark).await?;
    assert!(pttl > 0 && pttl <= 300, "the mark's PTTL is {pttl}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut keys: Vec<String> = side.keys("*").await?;
    keys.sort();
    assert_eq!(keys, vec![format!("{}:fence", redis_key("mh-left"))]);
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// Redlock refuses a minimum hold (its masters would each keep their key on
/// the give-back of a lost vote), and takes nothing on any master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_a_minimum_hold() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let servers = [
        RedisServer::start()?,
        RedisServer::start()?,
        RedisServer::start()?,
    ];
    let backend = RedlockBackend::builder(servers.iter().map(RedisServer::url))
        .connect()
        .await?;
    let request = AcquireRequest::new(
        LeaseKey::new("mh-redlock")?,
        HolderId::generate()?,
        Ttl::new(TTL)?,
    )
    .with_hold_at_least(MINIMUM)?;
    let refused = backend.try_acquire(&request).await;
    assert!(
        matches!(refused, Err(BackendError::Unsupported { .. })),
        "{refused:?}"
    );
    for server in &servers {
        assert_eq!(server.cli(&["EXISTS", &redis_key("mh-redlock")])?, "0");
    }
    Ok(())
}

/// With a lock-delay beside it (the key stored for ttl + delay at the grant
/// and every renewal), an early release still keeps the key until grant +
/// minimum by the server's clock, not ttl + delay; the bracket is as in
/// the first test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_beside_it_changes_nothing_of_the_minimum() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let mut side = side(&server).await?;
    let key = redis_key("mh-delay");
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(Duration::from_secs(1))?)
        .lock_delay(Duration::from_secs(5))
        .hold_at_least(MINIMUM)
        .build()?;
    let before = server_ms(&mut side).await?;
    let lease = manager.acquire("mh-delay", &options).await?;
    let after = server_ms(&mut side).await?;
    let stored = expires_at(&mut side, &key).await?;
    assert!(
        stored >= before + 6_000,
        "stored for {} ms, not ttl + delay",
        stored - before
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    lease.release().await?;
    let end = expires_at(&mut side, &key).await?;
    let (low, high) = (before + ms(MINIMUM), after + ms(MINIMUM) + 1);
    assert!(
        (low..=high).contains(&end),
        "with a lock-delay, an early release frees the key at {end}, not within [{low}, {high}]"
    );
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}
