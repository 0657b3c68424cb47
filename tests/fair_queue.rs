//! Fair mode through managers on real servers (standalone and Sentinel),
//! judged by witnesses the library does not control: the order in which
//! this test started the waiters, each start confirmed by the server's
//! queue read on a side connection, against the order of the grants; and
//! the server's clock (a grant's fencing token is the server's TIME in
//! microseconds) against the expiry the server recorded for a dead
//! waiter's place.

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{
    Backoff, Fair, FencingToken, LeaseKey, LeaseManager, LeaseOptions, LossReason, Ttl,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer, SentinelSet};

use holders::{Error, within};

/// The Redis key of a lease (default namespace).
fn stored(key: &LeaseKey) -> String {
    leasehold::redis::KeyLayout::default().lease(key)
}

type TestResult = Result<(), Error>;

fn fair(place_ttl: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("5s").expect("valid ttl"))
        .wait(Duration::from_secs(30))
        .backoff(Backoff::fixed(Duration::from_millis(200)))
        .fair(Fair::default().with_place_ttl(place_ttl))
        .build()
        .expect("valid options")
}

/// How many places the server's queue of `key` has.
fn queued(server: &RedisServer, key: &LeaseKey) -> Result<usize, Error> {
    Ok(server
        .cli(&["ZCARD", &format!("{}:fair", stored(key))])?
        .parse()?)
}

/// Waits (bounded) until the server's queue of `key` has `n` places.
async fn until_queued(server: &RedisServer, key: &LeaseKey, n: usize) -> Result<(), Error> {
    within(Duration::from_secs(10), "a place in the queue", async {
        while queued(server, key)? != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok::<_, Error>(())
    })
    .await
}

/// Waits (bounded) until the head of `key`'s queue listens: with
/// `handover`, until the server holds its ask for a handover (made by the
/// call after it subscribed); without, until its process subscribed to the
/// lease's release channel. A place alone is not enough: the first call
/// takes it before the waiter subscribes.
async fn until_listening(server: &RedisServer, key: &LeaseKey, handover: bool) -> TestResult {
    let layout = leasehold::redis::KeyLayout::default();
    within(Duration::from_secs(10), "the head listening", async {
        loop {
            let listening = if handover {
                server.cli(&["HLEN", &format!("{}:fair-asks", stored(key))])? == "1"
            } else {
                let reply = server.cli(&["PUBSUB", "NUMSUB", &layout.released(key)])?;
                reply.lines().nth(1).is_some_and(|n| n.trim() != "0")
            };
            if listening {
                return Ok::<_, Error>(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

/// `waiters` managers, each on its own connection, start waiting one
/// after another while the lease is held (each start confirmed by the
/// server's queue growing by one); they get the lease in that order, with
/// rising fencing tokens.
async fn grants_follow_arrivals(url: &str, server: &RedisServer, waiters: usize) -> TestResult {
    let key = LeaseKey::new("fair:arrivals")?;
    let options = fair(Duration::from_secs(5));
    let first = LeaseManager::new(RedisBackend::connect(url).await?)?;
    let held = first.acquire(key.as_str(), &options).await?;
    let grants: Arc<Mutex<Vec<(usize, FencingToken)>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
        let (key2, options, grants) = (key.clone(), options.clone(), Arc::clone(&grants));
        tasks.push(tokio::spawn(async move {
            let lease = manager.acquire(key2.as_str(), &options).await?;
            grants
                .lock()
                .expect("not poisoned")
                .push((i, lease.fencing_token()));
            tokio::time::sleep(Duration::from_millis(10)).await;
            lease.release().await?;
            Ok::<_, Error>(())
        }));
        until_queued(server, &key, i + 1).await?;
    }
    held.release().await?;
    for task in tasks {
        within(Duration::from_secs(30), "a waiter", task).await??;
    }
    let grants = grants.lock().expect("not poisoned").clone();
    let order: Vec<usize> = grants.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..waiters).collect::<Vec<_>>(),
        "grants out of arrival order"
    );
    assert!(grants.windows(2).all(|w| w[0].1 < w[1].1), "{grants:?}");
    assert_eq!(queued(server, &key)?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_eight_managers_get_the_lease_in_arrival_order() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    grants_follow_arrivals(&server.url(), &server, 8).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_waiters_get_the_lease_in_arrival_order() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let set = tokio::task::block_in_place(SentinelSet::start)?;
    grants_follow_arrivals(&set.url(), set.master(), 4).await
}

/// Without handovers, a waiter in a process that dies (a runtime of its
/// own, dropped) keeps its place until it expires on the server, and the
/// waiter behind it gets the lease after that expiry and within a third of
/// a place ttl (its refresh) of it, by the server's clock: the grant's
/// fencing token is the server's TIME in microseconds, the place's expiry
/// its score.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_is_skipped_once_its_place_expires() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    dead_waiter_is_skipped(false).await
}

/// With handovers (the default), the release hands the lease to the dead
/// waiter at the head, and the server keeps it for the handover time from
/// that waiter's last call (four thirds of the place ttl, plus the safety
/// margin and the drift allowance: 1,200 + 500 + 52 ms here), read from the
/// server's own record of the call and the lease's expiry time (one
/// `PEXPIRETIME`, not a `PTTL` and a `TIME` read one after the other, whose
/// gap would count as time kept); the waiter behind
/// gets the lease after that expiry, by the server's clock, and within a
/// third of a place ttl of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_head_handed_the_lease_holds_the_queue_up_for_its_handover_time() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    dead_waiter_is_skipped(true).await
}

async fn dead_waiter_is_skipped(handover: bool) -> TestResult {
    let server = RedisServer::start()?;
    let key = LeaseKey::new("fair:dead")?;
    // A place ttl with room for the side reads and the second waiter's
    // start between the death and the release, on a loaded machine: the
    // dead place must still be the head when the lease is released.
    let place_ttl = Duration::from_millis(900);
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("5s")?)
        .wait(Duration::from_secs(30))
        .backoff(Backoff::fixed(Duration::from_millis(200)))
        .fair(
            Fair::default()
                .with_place_ttl(place_ttl)
                .with_handover(handover),
        )
        .build()?;
    let first = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let held = first.acquire(key.as_str(), &options).await?;
    // The dying process: it queues, then its runtime is dropped.
    let (url, key2, options2) = (server.url(), key.clone(), options.clone());
    let (die_tx, die_rx) = std::sync::mpsc::channel::<()>();
    let dying = std::thread::spawn(move || -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.spawn(async move {
            let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
            let lease = manager.acquire(key2.as_str(), &options2).await?;
            drop(lease);
            Ok::<_, Error>(())
        });
        die_rx.recv()?;
        drop(runtime);
        Ok(())
    });
    // Dead while listening: its place taken and, with `handover`, its ask
    // made (the call after it subscribed). Killed between its first call
    // and its ask, it would be a head that never asked, and a release
    // would rightly hand it nothing.
    until_queued(&server, &key, 1).await?;
    until_listening(&server, &key, handover).await?;
    die_tx.send(())?;
    tokio::task::block_in_place(|| {
        leasehold_testkit::join_within(dying, std::time::Duration::from_secs(30))
    })??;
    let dead = server.cli(&["ZRANGE", &format!("{}:fair", stored(&key)), "0", "0"])?;
    let dead = dead.trim().to_owned();
    let mut expires_ms: u64 = server
        .cli(&["ZSCORE", &format!("{}:fair-places", stored(&key)), &dead])?
        .parse::<f64>()? as u64;
    let asked = server.cli(&["HGET", &format!("{}:fair-asks", stored(&key)), &dead])?;
    let second = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let (key3, options3) = (key.clone(), options.clone());
    let waiting = tokio::spawn(async move { second.acquire(key3.as_str(), &options3).await });
    until_queued(&server, &key, 2).await?;
    held.release().await?;
    if handover {
        // The lease went to the dead head; it expires a handover time
        // after the head's last call, as the server recorded that call.
        // Its expiry is the server's own, in one read: the server's clock
        // read after a PTTL, plus that PTTL, would add the time between the
        // two reads (a few ms on a loaded machine), and fail a correct
        // handover time or a grant that came right at the real expiry.
        let value = server.cli(&["GET", &stored(&key)])?;
        assert!(value.starts_with(&dead), "not handed to the head: {value}");
        let expiry: i64 = server.cli(&["PEXPIRETIME", &stored(&key)])?.parse()?;
        expires_ms = u64::try_from(expiry)
            .map_err(|_| format!("the handed-over lease has no expiry: {expiry}"))?;
        let called_ms: u64 = asked.split(':').next().ok_or("no call time")?.parse()?;
        let hold_ms = expires_ms - called_ms;
        assert!(
            (1_750..=1_756).contains(&hold_ms),
            "kept {hold_ms} ms after the dead head's last call"
        );
    } else {
        assert!(
            asked.is_empty() || asked == "(nil)",
            "a handover asked for: {asked}"
        );
    }
    let lease = within(Duration::from_secs(10), "the waiter behind", waiting).await??;
    let granted_ms = lease.fencing_token().0 / 1000;
    assert!(
        granted_ms >= expires_ms,
        "granted {} ms before the dead place expired",
        expires_ms - granted_ms
    );
    let late = granted_ms - expires_ms;
    let bound = u64::try_from((place_ttl / 3).as_millis())? + 150;
    assert!(
        late <= bound,
        "granted {late} ms after the dead place expired"
    );
    lease.release().await?;
    Ok(())
}

/// Fair options for the handover tests: a 30 s backoff, so that the head
/// polls no sooner than the holder's ttl and only a release can wake it.
fn fair_waiting_for_a_release(
    ttl: &str,
    place_ttl: Duration,
    handover: bool,
) -> Result<LeaseOptions, Error> {
    Ok(LeaseOptions::builder()
        .ttl(Ttl::parse(ttl)?)
        .wait(Duration::from_secs(30))
        .backoff(Backoff::fixed(Duration::from_secs(30)))
        .fair(
            Fair::default()
                .with_place_ttl(place_ttl)
                .with_handover(handover),
        )
        .build()?)
}

/// A lease of `key` held on `server` while a head (its manager connected
/// to `head_url`) waits in the server's queue and listens (asking for
/// a handover when `handover`), then released: the head's
/// lease, once its acquisition returns. `released` runs just before the
/// release.
async fn released_to_the_head(
    server: &RedisServer,
    key: &LeaseKey,
    options: &LeaseOptions,
    head_url: String,
    handover: bool,
    released: impl FnOnce() -> Result<(), Error>,
) -> Result<leasehold::Lease, Error> {
    let first = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let held = first.acquire(key.as_str(), options).await?;
    let head = LeaseManager::new(RedisBackend::connect(head_url).await?)?;
    let (key2, options2) = (key.clone(), options.clone());
    let waiting = tokio::spawn(async move { head.acquire(key2.as_str(), &options2).await });
    until_queued(server, key, 1).await?;
    until_listening(server, key, handover).await?;
    released()?;
    held.release().await?;
    Ok(within(Duration::from_secs(10), "the head", waiting).await??)
}

/// How many times the server ran `command` since its stats were reset.
fn calls(server: &RedisServer, command: &str) -> Result<u64, Error> {
    Ok(server.command_calls(command)?)
}

/// Uncontended, fair mode costs the server what the default mode does:
/// per acquisition one script call to acquire and one to release, no place
/// taken in the queue (`ZADD`), no queue read on release (`ZRANGEBYSCORE`),
/// and no subscription, judged by the server's own command statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_fair_acquisition_takes_no_place_and_no_subscription() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    const CYCLES: u64 = 10;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(server.url()).await?)?;
    let options = fair_waiting_for_a_release("5s", Duration::from_secs(30), true)?;
    server.cli(&["CONFIG", "RESETSTAT"])?;
    for _ in 0..CYCLES {
        let lease = manager.acquire("fair:alone", &options).await?;
        lease.release().await?;
    }
    assert_eq!(calls(&server, "evalsha")?, 2 * CYCLES, "script calls");
    assert_eq!(calls(&server, "zadd")?, 0, "places taken");
    assert_eq!(calls(&server, "zrangebyscore")?, 0, "queue reads");
    assert_eq!(calls(&server, "subscribe")?, 0, "subscriptions");
    assert_eq!(queued(&server, &LeaseKey::new("fair:alone")?)?, 0);
    Ok(())
}

/// With handovers, the head of the queue holds the lease after the fair
/// release without a call of its own: from the release on, the server runs
/// no place call (every `fair.lua` call adds a place with `ZADD`; the
/// release does not), and the lease it holds is the one the server stores.
/// The head polls no sooner than the holder's ttl (5 s) or its backoff
/// (30 s), so only the release's notice or handover can wake it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_head_holds_the_lease_without_asking_again() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    for handover in [true, false] {
        let server = RedisServer::start()?;
        let key = LeaseKey::new("fair:no-call")?;
        let options = fair_waiting_for_a_release("5s", Duration::from_secs(30), handover)?;
        let lease = released_to_the_head(&server, &key, &options, server.url(), handover, || {
            server.cli(&["CONFIG", "RESETSTAT"])?;
            Ok(())
        })
        .await?;
        let value = server.cli(&["GET", &stored(&key)])?;
        let token = value.split(':').nth(1).ok_or("no token stored")?;
        assert_eq!(token, lease.fencing_token().0.to_string());
        let places = calls(&server, "zadd")?;
        if handover {
            assert_eq!(places, 0, "the head asked again after the release");
        } else {
            assert!(places > 0, "without handovers the head asks");
        }
        lease.release().await?;
    }
    Ok(())
}

/// A head handed the lease and then cut off (its link blackholed, so its
/// first renewal never lands) fires its token before the server drops the
/// lease: the handed-over grant's validity, counted from the head's last
/// place call, ends before the server's key does. Judged on the wall
/// clock against a side connection polling `EXISTS` on the server itself
/// (the last instant the key was certainly there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_head_cut_off_fires_its_token_before_the_server_drops_the_lease() -> TestResult
{
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let key = LeaseKey::new("fair:cut-off")?;
    let options = fair_waiting_for_a_release("3s", Duration::from_secs(1), true)?;
    let link = Proxy::start(server.addr()).await?;
    let lease = released_to_the_head(&server, &key, &options, link.url(), true, || Ok(())).await?;
    link.set_mode(ProxyMode::Blackhole);
    let token = lease.token();
    let fired = tokio::spawn(async move {
        tokio::time::timeout(Duration::from_secs(10), token.cancelled())
            .await
            .ok()
            .map(|()| std::time::SystemTime::now())
    });
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let stored_key = stored(&key);
    let gone = within(Duration::from_secs(10), "the lease to expire", async {
        let mut still_there = std::time::SystemTime::now();
        loop {
            let sent = std::time::SystemTime::now();
            let exists: bool = redis::cmd("EXISTS")
                .arg(&stored_key)
                .query_async(&mut side)
                .await?;
            if !exists {
                return Ok::<_, Error>(still_there);
            }
            still_there = sent;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await?;
    let fired = fired.await?.ok_or("the token never fired")?;
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    let margin = gone.duration_since(fired).map_err(|late| {
        format!(
            "the token fired {:?} after the server dropped the lease",
            late.duration()
        )
    })?;
    // The promise (docs/design.md): the handed-over grant is valid for the
    // handover time less the drift allowance from the *sending* of the
    // head's last place call, its deadline a safety margin before that,
    // and the server keeps the key for the handover time from when it ran
    // that call: the token fires at least the safety margin plus the drift
    // allowance (300 + 32 ms at this 3 s ttl) before the key can go. Less
    // what the witness adds: the poll's 1 ms sleep and its round trip
    // (`gone` is the send of the last EXISTS that found the key), the
    // millisecond the server rounds its expiry to, and the scheduling of
    // the watchdog and the task that notes the firing on the loaded 2-core
    // machine (50 ms, the campaigns' allowance). Measured: 329–332 ms when
    // the head's first renewal did not reach the server, 1.67 s when it
    // did and only its reply was cut (the server then keeps the key a full
    // ttl from it); with the safety margin removed from the deadline,
    // 28 ms.
    let promised = (options.safety_margin() + leasehold::backend::clock_drift(options.ttl().get()))
        .saturating_sub(Duration::from_millis(2) + Duration::from_millis(50));
    println!(
        "the token fired {margin:?} before the server dropped the lease (promised at least {promised:?})"
    );
    assert!(
        margin > Duration::ZERO && margin >= promised,
        "the token fired only {margin:?} before the server dropped the lease: less than the safety margin plus the drift allowance, less scheduling ({promised:?})"
    );
    drop(lease);
    drop(link);
    Ok(())
}

/// A head handed the lease and left alone keeps it past its handover time:
/// its first renewal, halfway to the handed-over grant's deadline (its
/// renew interval, 3 s, would come after that deadline, 1.33 s after its
/// last call), extends the lease on the server to the full ttl. Judged by
/// the server's PTTL well after the handover time (2.3 s) ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_lease_is_renewed_to_its_full_ttl_in_time() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let key = LeaseKey::new("fair:renewed")?;
    let options = fair_waiting_for_a_release("9s", Duration::from_secs(1), true)?;
    let mut released = tokio::time::Instant::now();
    let lease = released_to_the_head(&server, &key, &options, server.url(), true, || {
        released = tokio::time::Instant::now();
        Ok(())
    })
    .await?;
    let value = server.cli(&["GET", &stored(&key)])?;
    let token = value.split(':').nth(1).ok_or("no token stored")?;
    assert_eq!(token, lease.fencing_token().0.to_string());
    tokio::time::sleep_until(released + Duration::from_millis(2_600)).await;
    assert_eq!(lease.loss_reason(), None);
    let pttl: i64 = server.cli(&["PTTL", &stored(&key)])?.parse()?;
    assert!(
        pttl > 5_000,
        "{pttl} ms left: the lease was not renewed to its ttl"
    );
    lease.release().await?;
    Ok(())
}
