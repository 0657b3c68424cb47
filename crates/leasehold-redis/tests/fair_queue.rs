//! Fair mode's server-side queue against real servers, judged by the
//! server's own state read on a side connection (the queue's sorted sets,
//! the lease's value, EXISTS/PTTL) and by the order in which this test
//! asked, which the library does not shape.

mod common;

use std::time::Duration;

use common::{
    TestResult, acquire, assert_expires, connect, expires_at, holder, key, server_ms, storage_key,
    ttl,
};
use futures_util::StreamExt;
use leasehold_core::{
    AcquireRequest, BackendError, FairBackend, FairOutcome, FairPlace, Grant, HolderId,
    LeaseBackend, LeaseKey, LockDelay, PlaceTtl, ReleaseOutcome, WatchPolicy,
};
use leasehold_redis::{RedisBackend, RedlockBackend};
use leasehold_testkit::{RedisCluster, RedisServer};
use tokio::time::{Instant, timeout};

fn place_ttl(ms: u64) -> PlaceTtl {
    PlaceTtl::new(Duration::from_millis(ms)).expect("a valid place ttl")
}

async fn fair(
    backend: &impl FairBackend,
    lease: &LeaseKey,
    who: HolderId,
    place: PlaceTtl,
) -> Result<FairOutcome, BackendError> {
    asking(backend, lease, who, place, None).await
}

/// A place call that asks for a handover kept `handover` from the call.
async fn asking(
    backend: &impl FairBackend,
    lease: &LeaseKey,
    who: HolderId,
    place: PlaceTtl,
    handover: Option<Duration>,
) -> Result<FairOutcome, BackendError> {
    let request = AcquireRequest::new(lease.clone(), who, ttl("30s"));
    timeout(
        Duration::from_secs(5),
        backend.try_acquire_fair(&request, place, handover),
    )
    .await
    .expect("the call answers")
}

/// The holder (hex) and fencing token stored in `lease` on the server.
fn stored_on_server(
    server: &RedisServer,
    lease: &LeaseKey,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let value = server.cli(&["GET", &storage_key(lease)])?;
    let mut parts = value.split(':');
    let holder = parts.next().unwrap_or_default().to_owned();
    let token = parts.next().unwrap_or_default().to_owned();
    Ok((holder, token))
}

fn waiting(outcome: FairOutcome) -> FairPlace {
    match outcome {
        FairOutcome::Waiting(place) => place,
        FairOutcome::Acquired { grant, .. } => panic!("not our turn, yet granted: {grant:?}"),
    }
}

fn granted(outcome: FairOutcome) -> Grant {
    match outcome {
        FairOutcome::Acquired { grant, .. } => grant,
        FairOutcome::Waiting(place) => panic!("our turn, yet refused: {place:?}"),
    }
}

/// The holder ids in the queue of `lease`, first first, as the server keeps them.
fn queue(
    server: &RedisServer,
    lease: &LeaseKey,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let raw = server.cli(&["ZRANGE", &format!("{}:fair", storage_key(lease)), "0", "-1"])?;
    Ok(raw
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty() && l != "(empty array)")
        .collect())
}

/// The holder (hex) of `lease` on the server, if any.
fn holder_on_server(
    server: &RedisServer,
    lease: &LeaseKey,
) -> Result<String, Box<dyn std::error::Error>> {
    let value = server.cli(&["GET", &storage_key(lease)])?;
    Ok(value.split(':').next().unwrap_or_default().to_owned())
}

/// Three waiters queue while the lease is held, in an order this test
/// chooses. After the release the lease stays free while the later ones
/// ask (the server's EXISTS says so), goes to the first to arrive when it
/// asks, and on each release to the next: the server's value names each
/// in arrival order and their fencing tokens rise in that order.
#[tokio::test]
async fn the_lease_goes_to_the_waiters_in_arrival_order() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:order");
    let place = place_ttl(5_000);
    let first = holder();
    let mut grant = acquire(&backend, &lease, first, ttl("30s")).await?;
    let arrivals = [holder(), holder(), holder()];
    for (i, who) in arrivals.iter().enumerate() {
        let place = waiting(fair(&backend, &lease, *who, place).await?);
        assert_eq!((place.ahead, place.queued), (i as u32, i as u32 + 1));
        assert!(place.holder.is_some(), "{place:?}");
    }
    let hex: Vec<String> = arrivals.iter().map(HolderId::to_hex).collect();
    assert_eq!(queue(&server, &lease)?, hex);
    for (turn, who) in arrivals.iter().enumerate() {
        assert_eq!(
            backend.release(&lease, &grant.holder).await?.outcome(),
            ReleaseOutcome::Released
        );
        // The later waiters ask first, in reverse: refused, the lease left free.
        for later in arrivals[turn + 1..].iter().rev() {
            let place = waiting(fair(&backend, &lease, *later, place).await?);
            assert!(place.holder.is_none() && place.ahead > 0, "{place:?}");
            assert_eq!(server.cli(&["EXISTS", &storage_key(&lease)])?, "0");
        }
        let next = granted(fair(&backend, &lease, *who, place).await?);
        assert_eq!(holder_on_server(&server, &lease)?, who.to_hex());
        assert!(next.fencing_token > grant.fencing_token);
        assert_eq!(queue(&server, &lease)?, hex[turn + 1..]);
        grant = next;
    }
    Ok(())
}

/// A waiter that stops asking (it died) holds up the one behind it until
/// its place expires, and no longer: the one behind is refused while the
/// dead place lives (the server still lists it) and granted once it has
/// expired, judged on the server's clock: the grant's fencing token (the
/// server's time in µs) against the dead place's arrival (also the
/// server's µs). The server keeps a place's expiry in whole milliseconds
/// (its arrival's millisecond plus the place ttl), so the place lives at
/// least the place ttl less 1 ms. The queue's keys then expire with the
/// last place in them.
#[tokio::test]
async fn a_dead_waiters_place_expires_and_is_skipped() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:dead");
    let (dead, alive) = (holder(), holder());
    let first = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let placed = Instant::now();
    waiting(fair(&backend, &lease, dead, place_ttl(400)).await?);
    // A score below 2^53 (µs since the epoch): exact as a float, however
    // the server formats it.
    let queue_key = format!("{}:fair", storage_key(&lease));
    let arrival = server
        .cli(&["ZSCORE", &queue_key, &dead.to_hex()])?
        .parse::<f64>()? as u64;
    waiting(fair(&backend, &lease, alive, place_ttl(5_000)).await?);
    backend.release(&lease, &first.holder).await?;
    let mut refused = 0;
    let grant = loop {
        match fair(&backend, &lease, alive, place_ttl(5_000)).await? {
            FairOutcome::Waiting(place) => {
                assert_eq!(place.ahead, 1, "{place:?}");
                assert_eq!(queue(&server, &lease)?[0], dead.to_hex());
                refused += 1;
            }
            FairOutcome::Acquired { grant, .. } => break grant,
        }
        assert!(placed.elapsed() < Duration::from_secs(3), "never skipped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let waited_us = grant.fencing_token.0.saturating_sub(arrival);
    assert!(
        waited_us >= 400_000 - 1_000,
        "granted {waited_us} µs after the dead place's arrival, on the server's clock, before it expired"
    );
    assert!(refused > 0);
    assert_eq!(holder_on_server(&server, &lease)?, alive.to_hex());
    assert_eq!(grant.holder, alive);
    assert!(queue(&server, &lease)?.is_empty());
    // A queue whose waiter vanished leaves nothing behind once its place expires.
    let (other, vanished) = (key("fair:vanished"), holder());
    acquire(&backend, &other, holder(), ttl("30s")).await?;
    waiting(fair(&backend, &other, vanished, place_ttl(300)).await?);
    let fair_key = format!("{}:fair", storage_key(&other));
    let pttl: i64 = server.cli(&["PTTL", &fair_key])?.parse()?;
    assert!((1..=300).contains(&pttl), "{pttl}");
    // Not before it either: each queue key is freed no earlier than the
    // place's expiry, the score the server keeps for it (both by the
    // server's clock), so a live waiter's place is never lost with them.
    let places = format!("{fair_key}-places");
    let place_ends = server
        .cli(&["ZSCORE", &places, &vanished.to_hex()])?
        .parse::<f64>()? as i64;
    for queue_key in [&fair_key, &places] {
        let end = expires_at(&server, queue_key)?;
        assert!(
            end >= place_ends,
            "{queue_key} is freed at {end}, before the place in it expires at {place_ends}"
        );
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        server.cli(&["EXISTS", &fair_key, &format!("{fair_key}-places")])?,
        "0"
    );
    Ok(())
}

/// A holder granted in fair mode that asks again (as after a grant whose
/// reply was lost) keeps its token, and the lease for the new ttl, by the
/// server's clock (`PEXPIRETIME` against `TIME` read around the call).
#[tokio::test]
async fn a_fair_holder_asking_again_keeps_its_lease_for_the_new_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (lease, who) = (key("fair:again"), holder());
    let ask = |t| AcquireRequest::new(lease.clone(), who, ttl(t));
    let place = place_ttl(5_000);
    let first = granted(
        timeout(
            Duration::from_secs(5),
            backend.try_acquire_fair(&ask("1s"), place, None),
        )
        .await??,
    );
    let before = server_ms(&server)?;
    let again = granted(
        timeout(
            Duration::from_secs(5),
            backend.try_acquire_fair(&ask("20s"), place, None),
        )
        .await??,
    );
    let after = server_ms(&server)?;
    assert_eq!(again.fencing_token, first.fencing_token);
    assert_expires(
        &server,
        &storage_key(&lease),
        (before, after),
        20_000,
        "a fair holder asking again",
    )?;
    Ok(())
}

/// A waiter that leaves gives its place up at once: the one behind is head.
#[tokio::test]
async fn a_waiter_that_leaves_lets_the_next_go_first() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:leave");
    let grant = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let (gone, next) = (holder(), holder());
    waiting(fair(&backend, &lease, gone, place_ttl(30_000)).await?);
    waiting(fair(&backend, &lease, next, place_ttl(30_000)).await?);
    backend.leave_fair_queue(&lease, &gone).await?;
    assert_eq!(queue(&server, &lease)?, [next.to_hex()]);
    backend.release(&lease, &grant.holder).await?;
    granted(fair(&backend, &lease, next, place_ttl(30_000)).await?);
    assert_eq!(holder_on_server(&server, &lease)?, next.to_hex());
    Ok(())
}

/// On a cluster the lease, its counter and the queue's keys hash to one
/// slot (else the script would fail with CROSSSLOT), and the queue works
/// there: the first waiter is granted, the second waits; a plain release
/// lets the second ask for it, and a fair release hands it to a third
/// that asked, told over the sharded channel of its process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_queue_lives_in_its_leases_cluster_slot() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    for name in ["fair:cluster", "order:{42}"] {
        let lease = key(name);
        let (a, b, c) = (holder(), holder(), holder());
        let grant = granted(fair(&backend, &lease, a, place_ttl(5_000)).await?);
        let place = waiting(fair(&backend, &lease, b, place_ttl(5_000)).await?);
        assert_eq!((place.ahead, place.queued), (0, 1));
        let _channel = backend.watch_releases(&lease, WatchPolicy::Counted).await?;
        let mut told_c = backend.watch_handover(&lease, &c).await?;
        let hold = Some(Duration::from_secs(5));
        waiting(asking(&backend, &lease, c, place_ttl(5_000), hold).await?);
        let prefix = backend.layout().lease(&lease);
        let slot = cluster.keyslot(&prefix)?;
        let master = &cluster.nodes()[cluster.master_of_slot(slot)?];
        for redis_key in [
            prefix.clone(),
            backend.layout().fence(&lease),
            format!("{prefix}:fair"),
            format!("{prefix}:fair-places"),
            format!("{prefix}:fair-asks"),
        ] {
            assert_eq!(cluster.keyslot(&redis_key)?, slot, "{redis_key}");
            assert_eq!(master.cli(&["EXISTS", &redis_key])?, "1", "{redis_key}");
        }
        backend.release(&lease, &grant.holder).await?;
        let next = granted(fair(&backend, &lease, b, place_ttl(5_000)).await?);
        assert!(next.fencing_token > grant.fencing_token);
        backend.release_fair(&lease, &b).await?;
        let token = timeout(Duration::from_secs(5), told_c.handed_over())
            .await
            .map_err(|_| "the head was never told of a handover")?;
        assert!(token > next.fencing_token);
        let value = master.cli(&["GET", &prefix])?;
        assert!(
            value.starts_with(&format!("{}:{}:", c.to_hex(), token.0)),
            "{value}"
        );
    }
    Ok(())
}

/// Redlock refuses fair mode with a typed error, before asking any master.
#[tokio::test]
async fn redlock_refuses_fair_mode() -> TestResult {
    let masters = leasehold_testkit::independent_masters(3)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    let refused = fair(&backend, &key("fair:redlock"), holder(), place_ttl(1_000)).await;
    assert!(
        matches!(
            &refused,
            Err(BackendError::Unsupported {
                op: "acquire_fair",
                ..
            })
        ),
        "{refused:?}"
    );
    for master in &masters {
        assert_eq!(master.cli(&["DBSIZE"])?, "0");
    }
    Ok(())
}

/// A fair release hands the lease to the head that asked for it, in the
/// same script: the server's value names the head and the token its
/// process was told, the head leaves the queue, and the next waiter is not
/// told anything. That one's turn comes with the next fair release; with
/// no one left, a fair release only frees the lease (EXISTS 0) and leaves
/// no queue key behind. A process listening on the lease's release
/// channel (a side subscriber) hears no handover, only that last release.
#[tokio::test]
async fn a_fair_release_hands_the_lease_to_the_head_that_asked() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:handover");
    let first = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let (a, b) = (holder(), holder());
    // The waiters' process listens on the lease's channel, as a waiter does.
    let _channel = backend.watch_releases(&lease, WatchPolicy::Counted).await?;
    let mut told_a = backend.watch_handover(&lease, &a).await?;
    let mut told_b = backend.watch_handover(&lease, &b).await?;
    let hold = Some(Duration::from_secs(5));
    waiting(asking(&backend, &lease, a, place_ttl(2_000), hold).await?);
    waiting(asking(&backend, &lease, b, place_ttl(2_000), hold).await?);

    let mut side = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    side.subscribe(backend.layout().released(&lease)).await?;
    let mut heard = side.on_message();

    let released = backend.release_fair(&lease, &first.holder).await?;
    assert_eq!(released, ReleaseOutcome::Released);
    let token_a = timeout(Duration::from_secs(5), told_a.handed_over())
        .await
        .map_err(|_| "the head was never told of a handover")?;
    assert_eq!(
        stored_on_server(&server, &lease)?,
        (a.to_hex(), token_a.0.to_string())
    );
    assert!(token_a > first.fencing_token);
    let pttl: i64 = server.cli(&["PTTL", &storage_key(&lease)])?.parse()?;
    assert!((1..=5_000).contains(&pttl), "kept {pttl} ms");
    assert_eq!(queue(&server, &lease)?, [b.to_hex()]);
    assert!(
        timeout(Duration::from_millis(200), told_b.handed_over())
            .await
            .is_err(),
        "the second waiter was told of a handover that was not its own"
    );

    backend.release_fair(&lease, &a).await?;
    let token_b = timeout(Duration::from_secs(5), told_b.handed_over())
        .await
        .map_err(|_| "the second waiter was never told")?;
    assert_eq!(
        stored_on_server(&server, &lease)?,
        (b.to_hex(), token_b.0.to_string())
    );
    assert!(token_b > token_a);
    assert!(queue(&server, &lease)?.is_empty());

    assert_eq!(
        backend.release_fair(&lease, &b).await?,
        ReleaseOutcome::Released
    );
    // The side subscriber heard one message: the last, plain release.
    let message = timeout(Duration::from_secs(5), heard.next())
        .await?
        .ok_or("the subscription ended")?;
    assert_eq!(message.get_payload::<String>()?, "1");
    assert!(
        timeout(Duration::from_millis(200), heard.next())
            .await
            .is_err()
    );
    let prefix = storage_key(&lease);
    assert_eq!(
        server.cli(&[
            "EXISTS",
            &prefix,
            &format!("{prefix}:fair"),
            &format!("{prefix}:fair-places"),
            &format!("{prefix}:fair-asks"),
        ])?,
        "0"
    );
    // Not ours any more: nothing changes.
    assert_eq!(
        backend.release_fair(&lease, &b).await?,
        ReleaseOutcome::NotHeld
    );
    Ok(())
}

/// A handed-over lease, released late (400 ms after the head's call), is
/// still on the server when the head's validity ends (the grant's
/// `valid_until`, counted from when the head sent its call), and gone
/// within its handover time of the head's call: a head that died is not
/// waited for longer. Both read on the server (EXISTS), not computed.
#[tokio::test]
async fn a_handed_over_lease_outlives_the_heads_validity_and_no_more() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:handover-time");
    let first = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let head = holder();
    let hold = Duration::from_millis(1_500);
    let _channel = backend.watch_releases(&lease, WatchPolicy::Counted).await?;
    let mut told = backend.watch_handover(&lease, &head).await?;
    let sent = Instant::now();
    waiting(asking(&backend, &lease, head, place_ttl(2_000), Some(hold)).await?);
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_millis(400)).await;
    backend.release_fair(&lease, &first.holder).await?;
    let token = timeout(Duration::from_secs(5), told.handed_over())
        .await
        .map_err(|_| "the head was never told of a handover")?;
    let grant = Grant::handed_over(lease.clone(), head, token, ttl("30s"), sent, hold);
    assert!(
        grant.valid_until <= sent + hold,
        "a validity beyond the handover time"
    );
    tokio::time::sleep_until(grant.valid_until - Duration::from_millis(20)).await;
    assert_eq!(
        server.cli(&["EXISTS", &storage_key(&lease)])?,
        "1",
        "the lease was gone before the head's validity ended"
    );
    let gone = timeout(Duration::from_secs(5), async {
        while server.cli(&["EXISTS", &storage_key(&lease)])? != "0" {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok::<_, Box<dyn std::error::Error>>(Instant::now())
    })
    .await
    .map_err(|_| "the handed-over lease never expired")??;
    assert!(
        gone <= answered + hold + Duration::from_millis(60),
        "kept {:?} after the head's call answered",
        gone - answered
    );
    Ok(())
}

/// A lease handed over to a head whose request has a lock-delay is kept on
/// the server for the handover time plus that delay, as any grant is kept
/// for its validity plus its lock-delay (the server's PTTL right after).
#[tokio::test]
async fn a_handed_over_lease_is_kept_for_its_lock_delay_too() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:handover-delay");
    let first = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let head = holder();
    let _channel = backend.watch_releases(&lease, WatchPolicy::Counted).await?;
    let mut told = backend.watch_handover(&lease, &head).await?;
    let request = AcquireRequest::new(lease.clone(), head, ttl("30s"))
        .with_lock_delay(LockDelay::new(Duration::from_secs(1))?);
    let asked = timeout(
        Duration::from_secs(5),
        backend.try_acquire_fair(&request, place_ttl(5_000), Some(Duration::from_secs(3))),
    )
    .await?;
    waiting(asked?);
    backend.release_fair(&lease, &first.holder).await?;
    timeout(Duration::from_secs(5), told.handed_over())
        .await
        .map_err(|_| "the head was never told of a handover")?;
    let pttl: i64 = server.cli(&["PTTL", &storage_key(&lease)])?.parse()?;
    assert!(
        (3_001..=4_000).contains(&pttl),
        "kept {pttl} ms: the handover time (3 s) and the lock-delay (1 s)"
    );
    Ok(())
}

/// A place call that asks for a handover on a backend that never listened
/// for one (`watch_handover`) records no ask: a fair release then frees
/// the lease (EXISTS 0) instead of handing it to a waiter that would never
/// hear of it and would hold the queue up for its handover time.
#[tokio::test]
async fn a_handover_no_one_listens_for_is_not_asked_for() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:unheard");
    let first = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let deaf = holder();
    let hold = Some(Duration::from_secs(5));
    waiting(asking(&backend, &lease, deaf, place_ttl(2_000), hold).await?);
    let asks = format!("{}:fair-asks", storage_key(&lease));
    assert_eq!(server.cli(&["HEXISTS", &asks, &deaf.to_hex()])?, "0");
    backend.release_fair(&lease, &first.holder).await?;
    assert_eq!(server.cli(&["EXISTS", &storage_key(&lease)])?, "0");
    assert_eq!(queue(&server, &lease)?, [deaf.to_hex()]);
    Ok(())
}

/// How many times `server` ran `command` since its stats were reset.
fn calls(server: &RedisServer, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(server.command_calls(command)?)
}

/// `WatchPolicy::AlreadyListening` sends nothing: on a channel this
/// process never subscribed it gives an unsupported watch (the server saw
/// no `SUBSCRIBE`, and counts no subscriber); on a channel still
/// subscribed from an earlier watch, since dropped, a working one, which
/// hears the next release, still with the one `SUBSCRIBE` of the earlier
/// watch on the server.
#[tokio::test]
async fn a_watch_already_listening_subscribes_to_nothing() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let lease = key("fair:listening");
    let channel = backend.layout().released(&lease);
    let subscribers = |server: &RedisServer| -> Result<String, Box<dyn std::error::Error>> {
        let reply = server.cli(&["PUBSUB", "NUMSUB", &channel])?;
        Ok(reply.lines().nth(1).unwrap_or_default().trim().to_owned())
    };
    server.cli(&["CONFIG", "RESETSTAT"])?;

    let cold = backend
        .watch_releases(&lease, WatchPolicy::AlreadyListening)
        .await?;
    assert!(
        !cold.is_supported(),
        "a watch with no subscription behind it"
    );
    assert_eq!(calls(&server, "subscribe")?, 0);
    assert_eq!(subscribers(&server)?, "0");

    drop(
        backend
            .watch_releases(&lease, WatchPolicy::Uncounted)
            .await?,
    );
    assert_eq!(calls(&server, "subscribe")?, 1);
    let mut warm = backend
        .watch_releases(&lease, WatchPolicy::AlreadyListening)
        .await?;
    assert!(warm.is_supported(), "the lingering channel was not reused");
    assert_eq!(calls(&server, "subscribe")?, 1);
    assert_eq!(subscribers(&server)?, "1");

    let other = connect(&server).await;
    let held = acquire(&other, &lease, holder(), ttl("30s")).await?;
    other.release_fair(&lease, &held.holder).await?;
    timeout(Duration::from_secs(5), warm.released())
        .await
        .map_err(|_| "the reused watch never heard the release")?;
    Ok(())
}
