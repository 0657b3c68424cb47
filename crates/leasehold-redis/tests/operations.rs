//! The lease operations against a real `redis-server`: acquire, renew,
//! renew_many, release, inspect, force_release, fencing tokens and the key
//! layout.

mod common;

use std::time::Duration;

use common::{
    TestResult, acquire, assert_expires, connect, held, holder, key, server_ms, storage_key, ttl,
};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FairBackend, FencingToken, HandoverBackend,
    HandoverOutcome, LeaseBackend, LeaseKey, PermitBackend, ReadWriteBackend, ReleaseOutcome,
    ReleaseReport, RenewOutcome, RenewRequest, WatchPolicy,
};
use leasehold_redis::{KeyLayout, RedisBackend};
use leasehold_testkit::{Proxy, ProxyMode, RedisCluster, RedisServer};
use tokio::time::Instant;

#[tokio::test]
async fn acquire_held_reacquire_release() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a, b, ttl) = (key("reports:nightly"), holder(), holder(), ttl("30s"));

    let before = Instant::now();
    let request = AcquireRequest::new(k.clone(), a, ttl).with_label("worker:a")?;
    let AcquireOutcome::Acquired(grant) = backend.try_acquire(&request).await? else {
        panic!("a free lease must be acquired");
    };
    assert_eq!(
        (grant.key.clone(), grant.holder, grant.ttl),
        (k.clone(), a, ttl)
    );
    assert!(grant.valid_until >= before + Duration::from_millis(29_000));
    assert!(grant.valid_until <= Instant::now() + ttl.get());

    // Someone else sees it held, with the label and token but not the holder.
    let info = held(&backend, &k, ttl).await?;
    assert_eq!(info.label.as_deref(), Some("worker:a"));
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    assert!(
        info.ttl_left
            .is_some_and(|left| left > Duration::from_secs(29) && left <= ttl.get())
    );

    // The holder acquiring again keeps its token and takes the new label.
    let again = AcquireRequest::new(k.clone(), a, ttl).with_label("worker:a2")?;
    let AcquireOutcome::Acquired(regrant) = backend.try_acquire(&again).await? else {
        panic!("re-acquire by the holder must succeed");
    };
    assert_eq!(regrant.fencing_token, grant.fencing_token);
    let info = backend.inspect(&k).await?.expect("held");
    assert_eq!(info.label.as_deref(), Some("worker:a2"));
    assert_eq!(info.fencing_token, Some(grant.fencing_token));

    // The stored value never leaves the server with the holder id in it.
    assert!(!format!("{info:?}").contains(&a.to_hex()));
    assert!(
        server
            .cli(&["GET", &storage_key(&k)])?
            .starts_with(&a.to_hex())
    );

    assert_eq!(
        backend.release(&k, &b).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        backend.release(&k, &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend.release(&k, &a).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(backend.inspect(&k).await?, None);

    let next = acquire(&backend, &k, b, ttl).await?;
    assert!(next.fencing_token > grant.fencing_token);
    Ok(())
}

/// Every expiry the lease scripts write is the one asked for, by the
/// server's own clock (`PEXPIRETIME` against `TIME` read around each call,
/// see `common::assert_expires`): a grant keeps the lease for its ttl and
/// its counter for the retention; the holder taking it again, for the new
/// ttl; a handover, for the waiter's ttl, with the waiter's minimum-hold
/// mark ending its minimum after the handover. An inspection shows no
/// more than the ttl and no less than the server's `PTTL` read after it.
#[tokio::test]
async fn every_expiry_written_is_the_one_asked_for() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a, b) = (key("expiries"), holder(), holder());
    let (p, fence) = (storage_key(&k), KeyLayout::default().fence(&k));
    let retention = i64::try_from(KeyLayout::DEFAULT_FENCE_RETENTION.as_millis())?;

    let before = server_ms(&server)?;
    acquire(&backend, &k, a, ttl("20s")).await?;
    let after = server_ms(&server)?;
    assert_expires(&server, &p, (before, after), 20_000, "a grant")?;
    assert_expires(
        &server,
        &fence,
        (before, after),
        retention,
        "a grant's counter",
    )?;

    let before = server_ms(&server)?;
    acquire(&backend, &k, a, ttl("40s")).await?;
    let after = server_ms(&server)?;
    assert_expires(
        &server,
        &p,
        (before, after),
        40_000,
        "the holder taking it again",
    )?;

    let shown = backend
        .inspect(&k)
        .await?
        .ok_or("the lease is held")?
        .ttl_left
        .ok_or("no ttl shown")?;
    let left: u64 = server.cli(&["PTTL", &p])?.parse()?;
    assert!(
        Duration::from_millis(left) <= shown && shown <= Duration::from_secs(40),
        "an inspection shows {shown:?} left; the server had {left} ms left just after it, of 40 s"
    );

    let minimum = Duration::from_secs(5);
    let next = AcquireRequest::new(k.clone(), b, ttl("25s")).with_hold_at_least(minimum)?;
    let before = server_ms(&server)?;
    let HandoverOutcome::HandedOver(grant) = backend.release_to(&k, &a, &next).await? else {
        panic!("not handed over, with no one else listening");
    };
    let after = server_ms(&server)?;
    assert_eq!(grant.holder, b);
    assert_expires(&server, &p, (before, after), 25_000, "a handover")?;
    let mark = format!("{p}:held-until");
    assert_expires(
        &server,
        &mark,
        (before, after),
        5_000,
        "the handed-over grant's mark",
    )?;
    let value = server.cli(&["GET", &mark])?;
    let end: i64 = value
        .strip_prefix(&format!("{}:", b.to_hex()))
        .ok_or_else(|| format!("the mark {value:?} is not the waiter's"))?
        .parse()?;
    assert!(
        (before + 5_000..=after + 5_000).contains(&end),
        "the mark ends at {end}, not the minimum after the handover ({before}..{after} + 5000)"
    );
    // Released under the minimum, the handed-over lease is kept, still
    // the waiter's, to the mark's end: the release read the mark.
    assert_eq!(
        backend.release(&k, &b).await?,
        ReleaseReport::Released { heard: false }
    );
    let left: i64 = server.cli(&["PTTL", &p])?.parse()?;
    assert!(
        (1..=5_000).contains(&left),
        "PTTL {left} after an early release of a handed-over lease with a 5 s minimum"
    );
    assert!(server.cli(&["GET", &p])?.starts_with(&b.to_hex()));
    Ok(())
}

#[tokio::test]
async fn renew_is_compare_and_pexpire() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("renewed"), holder());
    let p = storage_key(&k);

    acquire(&backend, &k, a, ttl("1s")).await?;
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("60s")))
            .await?,
        RenewOutcome::Renewed
    );
    let pttl: u64 = server.cli(&["PTTL", &p])?.parse()?;
    assert!(pttl > 59_000, "renewal set the new ttl: {pttl}");

    // Someone else's holder id does not renew and does not touch the expiry.
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), holder(), ttl("1h")))
            .await?,
        RenewOutcome::Lost
    );
    let pttl: u64 = server.cli(&["PTTL", &p])?.parse()?;
    assert!(pttl <= 60_000);

    // Deleted behind the holder's back: lost.
    server.cli(&["DEL", &p])?;
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("60s")))
            .await?,
        RenewOutcome::Lost
    );
    assert_eq!(
        server.cli(&["EXISTS", &p])?,
        "0",
        "a lost renewal creates nothing"
    );

    // Overwritten by another program: lost, and left alone.
    acquire(&backend, &k, a, ttl("60s")).await?;
    server.cli(&["SET", &p, "someone-else"])?;
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("60s")))
            .await?,
        RenewOutcome::Lost
    );
    assert_eq!(server.cli(&["GET", &p])?, "someone-else");
    assert_eq!(server.cli(&["PTTL", &p])?, "-1");

    // Our holder id anywhere but at the start (here: inside another
    // holder's label, or without its ':' after it) is not ours.
    let ours = String::from_utf8(a.to_hex_bytes().to_vec())?;
    let other = String::from_utf8(holder().to_hex_bytes().to_vec())?;
    for value in [format!("{other}:7:{ours}"), format!("{ours}7:label")] {
        server.cli(&["SET", &p, &value])?;
        assert_eq!(
            backend
                .renew(&RenewRequest::new(k.clone(), a, ttl("60s")))
                .await?,
            RenewOutcome::Lost,
            "{value}"
        );
        assert_eq!(server.cli(&["PTTL", &p])?, "-1", "{value} left alone");
    }
    Ok(())
}

#[tokio::test]
async fn renew_many_gives_one_outcome_per_request_in_one_call() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let ttl = ttl("30s");
    let a = holder();
    let keys: Vec<_> = (0..6).map(|i| key(&format!("batch:{i}"))).collect();
    for k in &keys[..5] {
        acquire(&backend, k, a, ttl).await?;
    }
    server.cli(&["DEL", &storage_key(&keys[2])])?; // gone
    server.cli(&["SET", &storage_key(&keys[3]), "overwritten"])?; // someone else's value
    server.cli(&["DEL", &storage_key(&keys[4])])?;
    server.cli(&["HSET", &storage_key(&keys[4]), "f", "v"])?; // another type
    // keys[5] was never acquired.
    // Load the script first, so that the count below has no NOSCRIPT retry.
    backend
        .renew(&RenewRequest::new(keys[0].clone(), a, ttl))
        .await?;

    let calls_before = evalsha_calls(&server)?;
    let requests: Vec<_> = keys
        .iter()
        .map(|k| RenewRequest::new(k.clone(), a, ttl))
        .collect();
    let outcomes = backend.renew_many(&requests).await;
    assert_eq!(
        evalsha_calls(&server)? - calls_before,
        1,
        "one round trip for the batch"
    );
    let outcomes: Vec<_> = outcomes.into_iter().collect::<Result<_, _>>()?;
    use RenewOutcome::{Lost, Renewed};
    assert_eq!(outcomes, [Renewed, Renewed, Lost, Lost, Lost, Lost]);

    assert!(backend.renew_many(&[]).await.is_empty());
    Ok(())
}

/// On a cluster, a batch of renewals across slots is sent per slot, and
/// each request gets its own lease's outcome: renewed where the holder
/// still holds it (its master shows the new expiry), lost where it was
/// deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_many_on_a_cluster_gives_each_request_its_own_outcome() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    let a = holder();
    // Two keys share a hash tag (one slot); the others spread over slots.
    let keys: Vec<LeaseKey> = ["{job}:a", "solo-1", "{job}:b", "solo-2", "solo-3"]
        .iter()
        .map(|name| key(name))
        .collect();
    for k in &keys {
        acquire(&backend, k, a, ttl("5s")).await?;
    }
    let node_of = |k: &LeaseKey| -> Result<&RedisServer, Box<dyn std::error::Error>> {
        let slot = cluster.keyslot(&storage_key(k))?;
        Ok(&cluster.nodes()[cluster.master_of_slot(slot)?])
    };
    node_of(&keys[3])?.cli(&["DEL", &storage_key(&keys[3])])?;
    let requests: Vec<RenewRequest> = keys
        .iter()
        .map(|k| RenewRequest::new(k.clone(), a, ttl("60s")))
        .collect();
    let outcomes: Vec<RenewOutcome> =
        tokio::time::timeout(Duration::from_secs(10), backend.renew_many(&requests))
            .await?
            .into_iter()
            .collect::<Result<_, _>>()?;
    use RenewOutcome::{Lost, Renewed};
    assert_eq!(outcomes, [Renewed, Renewed, Renewed, Lost, Renewed]);
    for (k, outcome) in keys.iter().zip(&outcomes) {
        let pttl: i64 = node_of(k)?.cli(&["PTTL", &storage_key(k)])?.parse()?;
        if *outcome == Renewed {
            assert!(pttl > 5_000, "{k} renewed to 60 s on its master: {pttl} ms");
        } else {
            assert_eq!(pttl, -2, "{k} is gone");
        }
    }
    Ok(())
}

/// A batch whose leases share a ttl sends it once; a mixed batch sends one
/// per lease. Either way each lease gets the ttl of its own request.
#[tokio::test]
async fn renew_many_gives_each_lease_its_own_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let a = holder();
    let keys: Vec<_> = (0..4).map(|i| key(&format!("ttls:{i}"))).collect();
    for k in &keys {
        acquire(&backend, k, a, ttl("5s")).await?;
    }
    server.cli(&["DEL", &storage_key(&keys[2])])?;
    let pttl = |k| -> Result<i64, Box<dyn std::error::Error>> {
        Ok(server.cli(&["PTTL", &storage_key(k)])?.parse()?)
    };

    // Mixed: 20 s, 60 s, a lost one, 20 s.
    let ttls = [ttl("20s"), ttl("1m"), ttl("20s"), ttl("20s")];
    let requests: Vec<_> = keys
        .iter()
        .zip(ttls)
        .map(|(k, ttl)| RenewRequest::new(k.clone(), a, ttl))
        .collect();
    use RenewOutcome::{Lost, Renewed};
    assert_eq!(
        renew_all(&backend, &requests).await?,
        [Renewed, Renewed, Lost, Renewed]
    );
    for (k, (low, high)) in keys.iter().zip([
        (19_000, 20_000),
        (59_000, 60_000),
        (-2, -2),
        (19_000, 20_000),
    ]) {
        let left = pttl(k)?;
        assert!((low..=high).contains(&left), "{k}: PTTL {left}");
    }

    // Shared: every lease gets the one ttl sent.
    let requests: Vec<_> = [&keys[0], &keys[1], &keys[3]]
        .into_iter()
        .map(|k| RenewRequest::new(k.clone(), a, ttl("45s")))
        .collect();
    assert_eq!(
        renew_all(&backend, &requests).await?,
        [Renewed, Renewed, Renewed]
    );
    for k in [&keys[0], &keys[1], &keys[3]] {
        let left = pttl(k)?;
        assert!((44_000..=45_000).contains(&left), "{k}: PTTL {left}");
    }
    Ok(())
}

/// `renew_many` of `requests`, each outcome known.
async fn renew_all(
    backend: &RedisBackend,
    requests: &[RenewRequest],
) -> Result<Vec<RenewOutcome>, leasehold_core::BackendError> {
    backend.renew_many(requests).await.into_iter().collect()
}

#[tokio::test]
async fn renew_many_splits_large_batches_and_keeps_the_order() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (a, ttl) = (holder(), ttl("30s"));
    let keys: Vec<_> = (0..2_500).map(|i| key(&format!("many:{i}"))).collect();
    for k in &keys {
        acquire(&backend, k, a, ttl).await?;
    }
    for lost in [0, 999, 1_000, 1_777, 2_499] {
        server.cli(&["DEL", &storage_key(&keys[lost])])?;
    }
    backend
        .renew(&RenewRequest::new(keys[1].clone(), a, ttl))
        .await?;
    let calls_before = evalsha_calls(&server)?;
    let requests: Vec<_> = keys
        .iter()
        .map(|k| RenewRequest::new(k.clone(), a, ttl))
        .collect();
    let outcomes = backend.renew_many(&requests).await;
    assert_eq!(
        evalsha_calls(&server)? - calls_before,
        3,
        "1000 renewals per call"
    );
    assert_eq!(outcomes.len(), keys.len());
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let want = if [0, 999, 1_000, 1_777, 2_499].contains(&i) {
            RenewOutcome::Lost
        } else {
            RenewOutcome::Renewed
        };
        assert_eq!(outcome?, want, "request {i}");
    }
    Ok(())
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_over_1000_cycles() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, ttl) = (key("fenced"), ttl("10s"));
    let mut last = FencingToken(0);
    for cycle in 0..1_000 {
        let h = holder();
        let grant = acquire(&backend, &k, h, ttl).await?;
        assert!(
            grant.fencing_token > last,
            "cycle {cycle}: {} after {last}",
            grant.fencing_token
        );
        last = grant.fencing_token;
        assert_eq!(
            backend.release(&k, &h).await?.outcome(),
            ReleaseOutcome::Released
        );
    }
    Ok(())
}

/// A lease with no counter yet gets the server clock in microseconds as its
/// token: at least the clock before the grant, at most the clock after it,
/// both read by the server's own `TIME`. Leases are granted until twenty
/// were granted within the first tenth of a second (a microsecond count of
/// fewer than six digits, which the token must pad), within a bound.
#[tokio::test]
async fn a_first_token_is_the_server_clock_in_microseconds() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let grants = async {
        let mut padded = 0;
        for i in 0.. {
            let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut side).await?;
            let before = s * 1_000_000 + us;
            let k = key(&format!("clock-{i}"));
            let token = acquire(&backend, &k, holder(), ttl("10s"))
                .await?
                .fencing_token
                .0;
            let (s2, us2): (u64, u64) = redis::cmd("TIME").query_async(&mut side).await?;
            let after = s2 * 1_000_000 + us2;
            assert!(
                before <= token && token <= after,
                "lease {i}: token {token}, server clock {before}..{after}"
            );
            if s == s2 && us2 < 100_000 {
                padded += 1;
                if padded == 20 {
                    break;
                }
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    tokio::time::timeout(Duration::from_secs(10), grants)
        .await
        .map_err(|_| "no twenty grants within a tenth of a second's start in 10 s")??;
    Ok(())
}

#[tokio::test]
async fn a_counter_ahead_of_the_clock_is_followed_and_a_bad_one_refused() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    // A counter far ahead of the server clock in microseconds (as after a
    // clock that stepped back): the next token is one past it, not the clock.
    let k = key("ahead");
    let fence = format!("{}:fence", storage_key(&k));
    server.cli(&["SET", &fence, "5000000000000000"])?;
    let h = holder();
    let grant = acquire(&backend, &k, h, ttl("10s")).await?;
    assert_eq!(grant.fencing_token, FencingToken(5_000_000_000_000_001));
    assert_eq!(server.cli(&["GET", &fence])?, "5000000000000001");
    assert_eq!(
        backend.release(&k, &h).await?.outcome(),
        ReleaseOutcome::Released
    );
    let next = acquire(&backend, &k, holder(), ttl("10s")).await?;
    assert_eq!(next.fencing_token, FencingToken(5_000_000_000_000_002));

    // A counter that is not a number stops acquisition and is left as it
    // was; so does one as long as the clock's microseconds and below them
    // in text order, which a comparison of text alone would let through.
    for (name, counter) in [
        ("not-a-number", "twelve"),
        ("digits-and-x", "1000000000000x00"),
    ] {
        let bad = key(name);
        let fence = format!("{}:fence", storage_key(&bad));
        server.cli(&["SET", &fence, counter])?;
        let err = backend
            .try_acquire(&AcquireRequest::new(bad.clone(), holder(), ttl("10s")))
            .await
            .expect_err("a counter that is not a number");
        assert!(err.to_string().contains("not an integer"), "{err}");
        assert_eq!(server.cli(&["GET", &fence])?, counter);
        assert_eq!(backend.inspect(&bad).await?, None, "no lease was written");
    }

    // The same for a handover, which grants the same way: refused before
    // the lease is touched, so the releasing holder still holds it.
    let handed = key("handover-not-a-number");
    let releasing = holder();
    acquire(&backend, &handed, releasing, ttl("10s")).await?;
    let fence = format!("{}:fence", storage_key(&handed));
    server.cli(&["SET", &fence, "twelve"])?;
    let next = AcquireRequest::new(handed.clone(), holder(), ttl("10s"));
    let err = backend
        .release_to(&handed, &releasing, &next)
        .await
        .expect_err("a counter that is not a number");
    assert!(err.to_string().contains("not an integer"), "{err}");
    assert_eq!(server.cli(&["GET", &fence])?, "twelve");
    assert_eq!(
        backend.release(&handed, &releasing).await?.outcome(),
        ReleaseOutcome::Released,
        "the releasing holder still held it"
    );
    Ok(())
}

/// A release offered to a request for another lease, or of a read share,
/// hands nothing over: the lease is released, and no one is granted
/// (a share's grant is decided against the lease's other shares).
#[tokio::test]
async fn only_the_same_exclusive_lease_is_handed_over() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, other, a) = (key("handed"), key("another"), holder());
    acquire(&backend, &k, a, ttl("30s")).await?;
    let elsewhere = AcquireRequest::new(other.clone(), holder(), ttl("30s"));
    assert_eq!(
        backend.release_to(&k, &a, &elsewhere).await?,
        HandoverOutcome::Released
    );
    assert_eq!(server.cli(&["EXISTS", &storage_key(&k)])?, "0");
    assert_eq!(server.cli(&["EXISTS", &storage_key(&other)])?, "0");

    let doc = key("doc");
    let r = holder();
    let AcquireOutcome::Acquired(share) = backend
        .try_acquire_read(&AcquireRequest::new(doc, r, ttl("30s")))
        .await?
    else {
        return Err("a free read share was refused".into());
    };
    let stored = format!("leasehold:{}", share.key);
    assert_eq!(server.cli(&["EXISTS", &stored])?, "1");
    let next = AcquireRequest::new(share.key.clone(), holder(), ttl("30s"));
    assert_eq!(
        backend.release_to(&share.key, &r, &next).await?,
        HandoverOutcome::Released
    );
    assert_eq!(
        server.cli(&["EXISTS", &stored])?,
        "0",
        "no share handed over"
    );
    Ok(())
}

/// A minimum hold is refused, by name, on an acquisition that is not of
/// an exclusive lease (a permit, a read or write share, a fair-queue
/// grant), rather than granted without it; nothing is written.
#[tokio::test]
async fn a_minimum_hold_is_refused_where_it_cannot_apply() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let request = AcquireRequest::new(key("shared"), holder(), ttl("30s"))
        .with_hold_at_least(Duration::from_secs(5))?;
    let place = leasehold_core::PlaceTtl::new(Duration::from_secs(5))?;
    let permits = leasehold_core::PermitLimit::new(2)?;
    let refusals = [
        (
            "acquire_permit",
            backend.try_acquire_permit(&request, permits).await.err(),
        ),
        (
            "acquire_read",
            backend.try_acquire_read(&request).await.err(),
        ),
        (
            "acquire_write",
            backend.try_acquire_write(&request).await.err(),
        ),
        (
            "acquire_fair",
            backend.try_acquire_fair(&request, place, None).await.err(),
        ),
    ];
    for (op, refused) in refusals {
        assert!(
            matches!(&refused, Some(BackendError::Unsupported { op: o, reason, .. })
                if *o == op && reason.contains("minimum hold")),
            "{op}: {refused:?}"
        );
    }
    assert_eq!(server.cli(&["DBSIZE"])?, "0", "nothing written");
    Ok(())
}

/// Each watch policy costs what it says, by the server's own counts: a
/// counted watch asks how many processes listen (`PUBSUB NUMSUB`), an
/// uncounted one does not; a watch of a channel still subscribed (watched,
/// or lingering after its last watch) sends no `SUBSCRIBE`, unless it is to
/// listen afresh (at the end of the subscribers' order).
#[tokio::test]
async fn each_watch_policy_costs_what_it_says() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let k = key("watched");
    let counts = || -> Result<(u64, u64), Box<dyn std::error::Error>> {
        Ok((
            server.command_calls("pubsub|numsub")?,
            server.command_calls("subscribe")?,
        ))
    };
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let uncounted = backend.watch_releases(&k, WatchPolicy::Uncounted).await?;
    assert_eq!(counts()?, (0, 1), "uncounted: subscribed, not counted");
    let counted = backend.watch_releases(&k, WatchPolicy::Counted).await?;
    assert_eq!(counts()?, (1, 1), "counted: no second SUBSCRIBE");
    // No one watches now: the channel lingers, subscribed, for a while.
    drop((uncounted, counted));
    let again = backend.watch_releases(&k, WatchPolicy::Counted).await?;
    assert_eq!(
        counts()?,
        (2, 1),
        "a lingering channel is watched again as it is"
    );
    drop(again);
    let afresh = backend.watch_releases(&k, WatchPolicy::Afresh).await?;
    assert_eq!(counts()?, (3, 2), "afresh: counted, and subscribed anew");
    drop(afresh);
    Ok(())
}

/// A release sent while this backend's first `SUBSCRIBE` to the lease's
/// channel is still on its way counts no subscriber as its own: the
/// server has none of ours yet, so a waiter elsewhere that hears the
/// notice makes it heard. Every chunk through the proxy is 500 ms late,
/// so the release reaches the server 500 ms after it is sent, and the
/// `SUBSCRIBE`, sent once `HELLO` is answered, after 1.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_our_subscribe_is_on_its_way_is_heard_elsewhere() -> TestResult {
    const BOUND: Duration = Duration::from_secs(10);
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let backend = RedisBackend::builder(proxy.url())
        .op_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let elsewhere = connect(&server).await;
    let (k, me) = (key("on-its-way"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    let mut theirs = elsewhere.watch_releases(&k, WatchPolicy::Uncounted).await?;
    let channel = KeyLayout::default().released(&k);
    let subscribers = || -> Result<String, Box<dyn std::error::Error>> {
        let reply = server.cli(&["PUBSUB", "NUMSUB", &channel])?;
        Ok(reply.lines().nth(1).unwrap_or_default().to_owned())
    };
    assert_eq!(subscribers()?, "1");

    let open = proxy.open_connections();
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(500)));
    let ours = tokio::spawn({
        let (backend, k) = (backend.clone(), k.clone());
        async move { backend.watch_releases(&k, WatchPolicy::Uncounted).await }
    });
    // Our watch has its channel once its connection is being made.
    tokio::time::timeout(BOUND, async {
        while proxy.open_connections() == open {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await?;
    let released = tokio::time::timeout(BOUND, backend.release(&k, &me)).await??;
    // The window was real: the server had no subscriber of ours when the
    // release's reply came back.
    assert_eq!(subscribers()?, "1", "our SUBSCRIBE came before the release");
    assert_eq!(released, ReleaseReport::Released { heard: true });
    tokio::time::timeout(BOUND, theirs.released()).await?;
    tokio::time::timeout(BOUND, ours).await???;
    assert_eq!(subscribers()?, "2");
    Ok(())
}

#[tokio::test]
async fn leases_expire_on_the_server() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("short"), holder());
    let first = acquire(&backend, &k, a, ttl("100ms")).await?;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(backend.inspect(&k).await?, None);
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("1s")))
            .await?,
        RenewOutcome::Lost
    );
    let second = acquire(&backend, &k, holder(), ttl("1s")).await?;
    assert!(second.fencing_token > first.fencing_token);
    Ok(())
}

#[tokio::test]
async fn keys_written_by_others_show_as_held_without_token() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let k = key("foreign");
    server.cli(&["SET", &storage_key(&k), "locked-by-a-shell-script"])?;
    let info = backend.inspect(&k).await?.expect("the key exists");
    assert_eq!(
        (info.label, info.fencing_token, info.ttl_left),
        (None, None, None)
    );
    let info = held(&backend, &k, ttl("1s")).await?;
    assert_eq!((info.fencing_token, info.ttl_left), (None, None));
    assert_eq!(
        backend.release(&k, &holder()).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        server.cli(&["GET", &storage_key(&k)])?,
        "locked-by-a-shell-script"
    );
    Ok(())
}

#[tokio::test]
async fn key_layout_on_the_server() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .namespace("billing")
        .connect()
        .await?;
    assert_eq!(backend.namespace(), "billing");
    let (tagged, plain, a) = (key("order:{42}"), key("nightly"), holder());
    // The layout the backend shows is the one it writes by.
    assert_eq!(backend.layout().lease(&tagged), "billing:order:{42}");
    assert_eq!(backend.layout().fence(&plain), "billing:{nightly}:fence");
    let grant = acquire(&backend, &tagged, a, ttl("30s")).await?;
    acquire(&backend, &plain, a, ttl("30s")).await?;
    let mut keys: Vec<String> = server
        .cli(&["KEYS", "*"])?
        .lines()
        .map(str::to_owned)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "billing:order:{42}",
            "billing:order:{42}:fence",
            "billing:{nightly}",
            "billing:{nightly}:fence"
        ]
    );
    assert_eq!(
        server.cli(&["GET", "billing:order:{42}"])?,
        format!("{}:{}:", a.to_hex(), grant.fencing_token)
    );
    assert_eq!(
        server.cli(&["GET", "billing:order:{42}:fence"])?,
        grant.fencing_token.to_string()
    );
    // The tokens start from the server clock in microseconds.
    let now_us = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros(),
    )?;
    assert!(
        grant.fencing_token.get().abs_diff(now_us) < 60_000_000,
        "{} vs {now_us}",
        grant.fencing_token
    );
    Ok(())
}

#[tokio::test]
async fn force_release_takes_over_and_keeps_tokens_rising() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("stuck"), holder());
    let old = acquire(&backend, &k, a, ttl("1h")).await?;
    assert!(backend.force_release(&k).await?);
    assert!(!backend.force_release(&k).await?);
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("1h")))
            .await?,
        RenewOutcome::Lost
    );
    let new = acquire(&backend, &k, holder(), ttl("1h")).await?;
    assert!(new.fencing_token > old.fencing_token);
    Ok(())
}

#[tokio::test]
async fn clones_share_the_connection_and_debug_shows_no_password() -> TestResult {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("hunter2-secret")
        .start()?;
    let url = format!("redis://:hunter2-secret@127.0.0.1:{}", server.port());
    let backend = RedisBackend::connect(url).await?;
    let clone = backend.clone();
    let (k, a) = (key("shared"), holder());
    acquire(&backend, &k, a, ttl("30s")).await?;
    assert_eq!(
        clone.release(&k, &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    let shown = format!("{backend:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains(":***@127.0.0.1"), "{shown}");
    // Clones share both connections: the one for operations and the one for renewals.
    let list = server.cli(&["CLIENT", "LIST"])?;
    let mut names: Vec<&str> = list
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("name=")))
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["leasehold-ops", "leasehold-renew"], "{list}");
    Ok(())
}

/// How many times the server ran `EVALSHA`.
fn evalsha_calls(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let stats = server.cli(&["INFO", "commandstats"])?;
    let line = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or("calls=0,");
    let calls = line
        .split(['=', ','])
        .skip_while(|part| !part.ends_with("calls"))
        .nth(1)
        .unwrap_or("0");
    Ok(calls.parse()?)
}

#[tokio::test]
async fn resp3_connections_read_the_same_replies() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(format!("{}/?protocol=resp3", server.url())).await?;
    let (k, a) = (key("resp3"), holder());
    assert_eq!(backend.inspect(&k).await?, None);
    let grant = acquire(&backend, &k, a, ttl("30s")).await?;
    let info = held(&backend, &k, ttl("30s")).await?;
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    let outcomes = backend
        .renew_many(&[RenewRequest::new(k.clone(), a, ttl("30s"))])
        .await;
    assert!(matches!(outcomes.as_slice(), [Ok(RenewOutcome::Renewed)]));
    assert_eq!(
        backend.release(&k, &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}
