//! Acquisitions and releases in flight together go out as one script call,
//! each with its own outcome; a lone one is sent at once, alone.
//!
//! `join_all` polls every future once before any reply can come: the first
//! finds its lane idle and is sent alone, the others find it busy and go
//! out together when its reply is in. The server's own records (its
//! command counts, MONITOR, the keys) witness what was sent and done.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{
    TestResult, acquire, assert_expires, connect, holder, key, server_ms, storage_key, ttl,
};
use futures_util::StreamExt;
use futures_util::future::join_all;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, HolderId, LeaseBackend, LeaseKey,
    ReleaseOutcome, ReleaseReport,
};
use leasehold_redis::redis::cluster_routing::Slot;
use leasehold_redis::{KeyLayout, RedisBackend};
use leasehold_testkit::{Proxy, ProxyMode, RedisCluster, RedisServer, redis_cli_binary};

/// A backend with one call of each kind in flight, so that requests sent
/// together while it is out wait and go as one batch (the default lets
/// 16 go alone first).
async fn batching(server: &RedisServer) -> RedisBackend {
    RedisBackend::builder(server.url())
        .calls_in_flight(1)
        .connect()
        .await
        .expect("connect to the test server")
}

/// Far above any reply on an idle server: only a missing one reaches it.
const BOUND: Duration = Duration::from_secs(10);

/// How many times the server ran `command` since the last `CONFIG
/// RESETSTAT`: the server's own count.
fn calls(server: &RedisServer, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(server.command_calls(command)?)
}

/// Loads the scripts, the one-lease ones and the batch ones (a first call
/// answers NOSCRIPT and loads them), in the slot of each of `keys`, then
/// clears the servers' command counts.
async fn warm_up(
    backend: &RedisBackend,
    servers: &[&RedisServer],
    keys: &[LeaseKey],
) -> TestResult {
    for k in keys {
        let me = holder();
        let three: Vec<LeaseKey> = (0..3).map(|i| key(&format!("{k}-{i}"))).collect();
        let acquired = join_all(three.iter().map(|k| acquire(backend, k, me, ttl("30s")))).await;
        for grant in acquired {
            grant?;
        }
        let released = join_all(three.iter().map(|k| backend.release(k, &me))).await;
        for outcome in released {
            assert_eq!(outcome?.outcome(), ReleaseOutcome::Released);
        }
    }
    for server in servers {
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    }
    Ok(())
}

fn request(k: &LeaseKey, h: HolderId) -> AcquireRequest {
    AcquireRequest::new(k.clone(), h, ttl("30s"))
}

/// The stored value's holder id and fencing token, read on the server.
fn stored(server: &RedisServer, k: &LeaseKey) -> Result<(String, u64), Box<dyn std::error::Error>> {
    let value = server.cli(&["GET", &storage_key(k)])?;
    let mut parts = value.splitn(3, ':');
    let (Some(h), Some(token)) = (parts.next(), parts.next()) else {
        return Err(format!("{k} holds {value:?}, not a lease").into());
    };
    Ok((h.to_owned(), token.parse()?))
}

fn pttl(server: &RedisServer, k: &LeaseKey) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(server.cli(&["PTTL", &storage_key(k)])?.parse()?)
}

fn counter(server: &RedisServer, k: &LeaseKey) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(server
        .cli(&["GET", &KeyLayout::default().fence(k)])?
        .parse()?)
}

/// Some keys free, some held by another holder, one of another type: the
/// free ones are granted, the held ones reported with their holder's ttl,
/// the bad one fails alone; in two script calls (the first request alone,
/// the others together).
#[tokio::test]
async fn a_batch_grants_the_free_keys_and_reports_the_held_ones() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let other = connect(&server).await;
    let keys: Vec<LeaseKey> = (0..6).map(|i| key(&format!("mixed-{i}"))).collect();
    let (me, them) = (holder(), holder());
    // 1 and 3 are someone else's, for 20 s; 5 is not a lease at all.
    acquire(&other, &keys[1], them, ttl("20s")).await?;
    acquire(&other, &keys[3], them, ttl("20s")).await?;
    assert_eq!(server.cli(&["LPUSH", &storage_key(&keys[5]), "x"])?, "1");
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");

    let requests: Vec<AcquireRequest> = keys.iter().map(|k| request(k, me)).collect();
    let outcomes = tokio::time::timeout(
        BOUND,
        join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await?;

    // One call for the first, one for the five that waited.
    assert_eq!(calls(&server, "evalsha")?, 2);
    // The batch reads the clock once for its two grants, and writes each
    // lease and each counter once (the lone call: its lease and counter).
    assert_eq!(calls(&server, "time")?, 2);
    assert_eq!(calls(&server, "set")?, 6);
    for (i, (k, outcome)) in keys.iter().zip(outcomes).enumerate() {
        match i {
            0 | 2 | 4 => {
                let AcquireOutcome::Acquired(grant) = outcome? else {
                    panic!("{k} is free and should be granted");
                };
                assert_eq!(stored(&server, k)?, (me.to_hex(), grant.fencing_token.0));
                assert_eq!(counter(&server, k)?, grant.fencing_token.0);
                let left = pttl(&server, k)?;
                assert!(20_000 < left && left <= 30_000, "{k}: PTTL {left}");
            }
            1 | 3 => {
                let AcquireOutcome::Held(info) = outcome? else {
                    panic!("{k} is held and should be reported so");
                };
                assert_eq!(stored(&server, k)?.0, them.to_hex());
                let shown = info.ttl_left.ok_or("no ttl shown")?;
                assert!(shown <= Duration::from_secs(20), "{shown:?}");
                let left = pttl(&server, k)?;
                assert!(0 < left && left <= 20_000, "{k}: PTTL {left}");
            }
            _ => assert!(
                matches!(outcome, Err(BackendError::WrongType { .. })),
                "{outcome:?}"
            ),
        }
    }
    Ok(())
}

/// A batch writes the expiries asked for, by the server's clock
/// (`PEXPIRETIME` against `TIME` read around the batch, see
/// `common::assert_expires`): each lease it grants for its ttl and, over a
/// tracking connection (which writes the batch's counters at its end),
/// each counter for the retention; each lease its holder takes again in a
/// batch, for the new ttl.
#[tokio::test]
async fn a_batch_writes_the_expiries_asked_for() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    assert!(backend.tracks_lease_changes());
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let me = holder();
    let keys: Vec<LeaseKey> = (0..4).map(|i| key(&format!("expiring-{i}"))).collect();
    let retention = i64::try_from(KeyLayout::DEFAULT_FENCE_RETENTION.as_millis())?;
    // (what, ttl, in ms, whether it grants, so writes the counters)
    for (what, ttl_text, ms, grants) in [
        ("a batched grant", "20s", 20_000, true),
        ("a batched re-acquisition", "40s", 40_000, false),
    ] {
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
        let requests: Vec<AcquireRequest> = keys
            .iter()
            .map(|k| AcquireRequest::new(k.clone(), me, ttl(ttl_text)))
            .collect();
        let before = server_ms(&server)?;
        let outcomes = tokio::time::timeout(
            BOUND,
            join_all(requests.iter().map(|r| backend.try_acquire(r))),
        )
        .await?;
        let after = server_ms(&server)?;
        for outcome in outcomes {
            assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
        }
        // One call for the first, one for the three that waited.
        assert_eq!(calls(&server, "evalsha")?, 2);
        for k in &keys[1..] {
            assert_expires(&server, &storage_key(k), (before, after), ms, what)?;
            if grants {
                let fence = KeyLayout::default().fence(k);
                assert_expires(
                    &server,
                    &fence,
                    (before, after),
                    retention,
                    "a batch's counter",
                )?;
            }
        }
    }
    Ok(())
}

/// Fencing tokens strictly increase per key within a batch (two holders
/// of one key: the first gets it) and across batches, as the counter on
/// the server shows; releases in flight together are batched too.
#[tokio::test]
async fn fencing_tokens_rise_across_a_batch_and_across_batches() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let contested = key("contested");
    let others: Vec<LeaseKey> = (0..3).map(|i| key(&format!("side-{i}"))).collect();
    let mut last: Option<u64> = None;
    for _round in 0..3 {
        let (first, second) = (holder(), holder());
        // A lone key first, then the contested key twice and the others.
        let mut requests = vec![request(&others[0], first)];
        requests.push(request(&contested, first));
        requests.push(request(&contested, second));
        requests.extend(others[1..].iter().map(|k| request(k, first)));
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
        let outcomes = tokio::time::timeout(
            BOUND,
            join_all(requests.iter().map(|r| backend.try_acquire(r))),
        )
        .await?;
        assert_eq!(calls(&server, "evalsha")?, 2);
        let mut outcomes = outcomes.into_iter();
        let lone = outcomes.next().ok_or("no outcome")??;
        let (won, lost) = (
            outcomes.next().ok_or("no outcome")??,
            outcomes.next().ok_or("no outcome")??,
        );
        let AcquireOutcome::Acquired(grant) = won else {
            panic!("the first request for a free key should win it: {won:?}");
        };
        assert!(matches!(lost, AcquireOutcome::Held(_)), "{lost:?}");
        let token = grant.fencing_token.0;
        assert_eq!(counter(&server, &contested)?, token);
        assert_eq!(stored(&server, &contested)?, (first.to_hex(), token));
        if let Some(before) = last {
            assert!(token > before, "token {token} after {before}");
        }
        last = Some(token);
        assert!(matches!(lone, AcquireOutcome::Acquired(_)));
        for outcome in outcomes {
            assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
        }

        // Every lease given back at once: one call alone, one for the rest.
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
        let mut releases: Vec<(LeaseKey, HolderId)> =
            others.iter().map(|k| (k.clone(), first)).collect();
        releases.push((contested.clone(), second));
        releases.push((contested.clone(), first));
        let released = tokio::time::timeout(
            BOUND,
            join_all(releases.iter().map(|(k, h)| backend.release(k, h))),
        )
        .await?;
        assert_eq!(calls(&server, "evalsha")?, 2);
        let released: Vec<ReleaseOutcome> = released
            .into_iter()
            .map(|r| r.map(ReleaseReport::outcome))
            .collect::<Result<_, _>>()?;
        assert_eq!(
            released,
            [
                ReleaseOutcome::Released,
                ReleaseOutcome::Released,
                ReleaseOutcome::Released,
                // The second holder of the contested key never had it.
                ReleaseOutcome::NotHeld,
                ReleaseOutcome::Released,
            ]
        );
        for k in others.iter().chain([&contested]) {
            assert_eq!(server.cli(&["EXISTS", &storage_key(k)])?, "0", "{k}");
        }
    }
    Ok(())
}

/// Leases acquired with a minimum hold (each by the lone acquire.lua) and
/// released together, the first alone and the others as one batch
/// (release_many.lua): every key is kept until its minimum, 60 s, beyond
/// its 30 s ttl, and no notice goes out; the server's PTTL says so.
#[tokio::test]
async fn batched_releases_keep_leases_under_their_minimum() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let keys: Vec<LeaseKey> = (0..3).map(|i| key(&format!("kept-{i}"))).collect();
    let me = holder();
    let minimum = Duration::from_secs(60);
    let requests: Vec<AcquireRequest> = keys
        .iter()
        .map(|k| request(k, me).with_hold_at_least(minimum))
        .collect::<Result<_, _>>()?;
    let granted = join_all(requests.iter().map(|r| backend.try_acquire(r))).await;
    for outcome in granted {
        assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
    }
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let released = tokio::time::timeout(
        BOUND,
        join_all(keys.iter().map(|k| backend.release(k, &me))),
    )
    .await?;
    for outcome in released {
        assert_eq!(outcome?, ReleaseReport::Released { heard: false });
    }
    for k in &keys {
        let left = pttl(&server, k)?;
        assert!(
            (30_001..=60_000).contains(&left),
            "{k}: PTTL {left} after its release, not kept to its 60 s minimum"
        );
    }
    assert_eq!(calls(&server, "publish")?, 0, "a kept lease was announced");
    assert_eq!(calls(&server, "del")?, 0, "a kept lease was deleted");
    Ok(())
}

/// A release notice is published for every lease of a batched release,
/// and only for those released.
#[tokio::test]
async fn batched_releases_publish_their_notices() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let keys: Vec<LeaseKey> = (0..4).map(|i| key(&format!("noticed-{i}"))).collect();
    let (me, them) = (holder(), holder());
    for k in &keys[..3] {
        acquire(&backend, k, me, ttl("30s")).await?;
    }
    acquire(&backend, &keys[3], them, ttl("30s")).await?;
    let layout = KeyLayout::default();
    let mut subscriber = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    for k in &keys {
        subscriber.subscribe(layout.released(k)).await?;
    }
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let released = tokio::time::timeout(
        BOUND,
        join_all(keys.iter().map(|k| backend.release(k, &me))),
    )
    .await?;
    assert_eq!(calls(&server, "evalsha")?, 2);
    let released: Vec<ReleaseReport> = released.into_iter().collect::<Result<_, _>>()?;
    assert_eq!(
        released,
        [
            ReleaseReport::Released { heard: true },
            ReleaseReport::Released { heard: true },
            ReleaseReport::Released { heard: true },
            ReleaseReport::NotHeld,
        ]
    );
    let mut heard = Vec::new();
    let mut messages = subscriber.on_message();
    for _ in 0..3 {
        let message = tokio::time::timeout(BOUND, messages.next())
            .await?
            .ok_or("the subscription ended")?;
        heard.push(message.get_channel_name().to_owned());
    }
    heard.sort();
    let mut expected: Vec<String> = keys[..3].iter().map(|k| layout.released(k)).collect();
    expected.sort();
    assert_eq!(heard, expected);
    // Nothing for the lease that was not ours, which is still held.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), messages.next())
            .await
            .is_err()
    );
    assert_eq!(stored(&server, &keys[3])?.0, them.to_hex());
    Ok(())
}

/// `redis-cli MONITOR` on a side connection, its lines read on a thread.
struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Result<Self, Box<dyn std::error::Error>> {
        let mut child = Command::new(redis_cli_binary()?)
            .args(["-p", &server.port().to_string(), "MONITOR"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let monitor = Self { child, lines };
        // MONITOR answers OK once it is on.
        let first = monitor.lines.recv_timeout(BOUND)?;
        assert_eq!(first, "OK");
        Ok(monitor)
    }

    /// The key counts of the next `count` EVALSHA calls, in order.
    fn evalsha_key_counts(&self, count: usize) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let mut counts = Vec::new();
        while counts.len() < count {
            let line = self.lines.recv_timeout(BOUND)?;
            // `<time> [0 <addr>] "EVALSHA" "<sha>" "<numkeys>" ...`
            let Some(rest) = line.split_once("\"EVALSHA\" ").map(|(_, r)| r) else {
                continue;
            };
            let numkeys = rest.split(' ').nth(1).ok_or("no key count")?;
            counts.push(numkeys.trim_matches('"').to_owned());
        }
        Ok(counts)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Acquires the free `keys` (three) at once, each for its own holder, and
/// checks on `MONITOR` that the first went alone and the two others (four
/// keys) in one call.
async fn acquired_as_one_then_two(
    backend: &RedisBackend,
    monitor: &Monitor,
    keys: &[LeaseKey],
) -> TestResult {
    let requests: Vec<AcquireRequest> = keys.iter().map(|k| request(k, holder())).collect();
    let outcomes = tokio::time::timeout(
        BOUND,
        join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await?;
    for outcome in outcomes {
        assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
    }
    // The first alone, then the two others (four keys) in one call.
    assert_eq!(monitor.evalsha_key_counts(2)?, ["2", "4"]);
    Ok(())
}

/// A lone acquisition goes out at once as a one-lease call; acquisitions
/// that come while one is out go together, after it.
#[tokio::test]
async fn a_lone_acquisition_is_sent_at_once_alone() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let monitor = Monitor::start(&server)?;
    acquire(&backend, &key("lone"), holder(), ttl("30s")).await?;
    // A lease and its counter: two keys.
    assert_eq!(monitor.evalsha_key_counts(1)?, ["2"]);

    let keys: Vec<LeaseKey> = (0..3).map(|i| key(&format!("together-{i}"))).collect();
    acquired_as_one_then_two(&backend, &monitor, &keys).await
}

/// Only a `CROSSSLOT` refusal turns batching by slot on: after another
/// error reply (a key of another type), acquisitions of keys in different
/// slots still go out as one call on a server that is one node.
#[tokio::test]
async fn an_error_reply_other_than_crossslot_keeps_batches_across_slots() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let wrong = key("a-hash");
    server.cli(&["HSET", &storage_key(&wrong), "field", "value"])?;
    let refused = backend.inspect(&wrong).await;
    assert!(
        matches!(refused, Err(BackendError::WrongType { .. })),
        "{refused:?}"
    );
    let monitor = Monitor::start(&server)?;
    let keys: Vec<LeaseKey> = (0..3).map(|i| key(&format!("after-{i}"))).collect();
    let slots: std::collections::HashSet<Slot> =
        keys.iter().map(|k| Slot::for_key(storage_key(k))).collect();
    assert_eq!(slots.len(), 3, "three keys, three slots");
    acquired_as_one_then_two(&backend, &monitor, &keys).await
}

/// On a cluster, acquisitions in flight together are grouped per slot:
/// each slot's group goes to its own master as one call, and each is
/// granted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_split_across_slots_is_granted_on_each_master() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = RedisBackend::builder(cluster.url())
        .calls_in_flight(1)
        .connect()
        .await?;
    // Two hash tags whose slots live on different masters.
    let mut tags: Vec<(String, usize)> = Vec::new();
    for tag in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        let slot = cluster.keyslot(&storage_key(&key(&format!("{{{tag}}}-0"))))?;
        let master = cluster.master_of_slot(slot)?;
        if tags.iter().all(|(_, m)| *m != master) {
            tags.push((tag.to_owned(), master));
        }
        if tags.len() == 2 {
            break;
        }
    }
    let [(a, ma), (b, mb)] = &tags[..] else {
        return Err("no two tags on different masters".into());
    };
    let group = |tag: &str| -> Vec<LeaseKey> {
        (0..3)
            .map(|i| key(&format!("{{{tag}}}-{i}")))
            .collect::<Vec<_>>()
    };
    let (ka, kb) = (group(a), group(b));
    let (na, nb) = (&cluster.nodes()[*ma], &cluster.nodes()[*mb]);
    warm_up(
        &backend,
        &[na, nb],
        &[key(&format!("{{{a}}}-warm")), key(&format!("{{{b}}}-warm"))],
    )
    .await?;
    // Interleaved: each slot's first is sent alone, its others together.
    // Each master holds back writes (scripts included) for a while, so
    // that its lone call is still out when the others queue behind it,
    // however late a loaded machine schedules them: without it a lone
    // call's reply could come back before the next request was queued,
    // and that request would go alone too.
    for node in [na, nb] {
        assert_eq!(node.cli(&["CLIENT", "PAUSE", "500", "WRITE"])?, "OK");
    }
    let me = holder();
    let mut requests = Vec::new();
    for (x, y) in ka.iter().zip(&kb) {
        requests.push(request(x, me));
        requests.push(request(y, me));
    }
    let outcomes = tokio::time::timeout(
        BOUND,
        join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await?;
    for outcome in outcomes {
        assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
    }
    for (node, keys) in [(na, &ka), (nb, &kb)] {
        assert_eq!(calls(node, "evalsha")?, 2, "one lone call, one batch");
        for k in keys {
            assert_eq!(stored(node, k)?.0, me.to_hex(), "{k} on its master");
        }
    }
    Ok(())
}

/// A batch whose reply is lost (it reaches the server, its reply comes
/// after the op timeout): every caller of the lone call and of the batch
/// behind it gets the timeout, the outcome unknown; the leases the server
/// granted meanwhile are held by no one and run out after their ttl.
#[tokio::test]
async fn a_batch_whose_reply_is_lost_times_out_for_every_caller() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let op_timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(proxy.url())
        .calls_in_flight(1)
        .op_timeout(op_timeout)
        .connect()
        .await?;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let keys: Vec<LeaseKey> = (0..4).map(|i| key(&format!("lost-{i}"))).collect();
    let requests: Vec<AcquireRequest> = keys
        .iter()
        .map(|k| AcquireRequest::new(k.clone(), holder(), ttl("3s")))
        .collect();
    // Requests reach the server 400 ms late; replies come 800 ms after
    // they were sent, past the 300 ms bound.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
    let outcomes = tokio::time::timeout(
        BOUND,
        join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await?;
    for outcome in outcomes {
        assert!(
            matches!(outcome, Err(BackendError::Timeout { .. })),
            "{outcome:?}"
        );
    }
    // Both calls went out and were run, the lone one and the batch: every
    // lease was granted, to a holder that never heard of it.
    let deadline = tokio::time::Instant::now() + BOUND;
    while calls(&server, "evalsha")? < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(calls(&server, "evalsha")?, 2);
    for k in &keys {
        let left = pttl(&server, k)?;
        assert!(0 < left && left <= 3000, "{k}: PTTL {left}");
    }
    // Held by no one, they run out within their ttl: nothing is left behind.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3) + BOUND;
    for k in &keys {
        while server.cli(&["EXISTS", &storage_key(k)])? != "0" {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{k} outlived its ttl"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The lanes are free again: the next acquisition goes through.
    proxy.set_mode(ProxyMode::Pass);
    let again =
        tokio::time::timeout(BOUND, acquire(&backend, &keys[0], holder(), ttl("1s"))).await?;
    again?;
    Ok(())
}

/// Waits until the server has run `count` script calls since its counts
/// were cleared (a call delayed by the proxy, whose reply the backend gave
/// up on).
async fn until_run(server: &RedisServer, count: u64) -> TestResult {
    let deadline = tokio::time::Instant::now() + BOUND;
    while calls(server, "evalsha")? < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a call never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Only the release of a lease acquired with a minimum hold reads the
/// hold's mark, and it does even when a reply was lost: a lease acquired
/// without one is released with no `GETEX` run on the server; one whose
/// acquisition's reply was lost (the server granted and marked it), and
/// one whose first release's reply was lost (sent again, and again once
/// answered), are each kept
/// by the server to their 60 s minimum, beyond their 3 s ttl.
#[tokio::test]
async fn only_a_lease_with_a_minimum_hold_has_its_mark_read_whatever_replies_were_lost()
-> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let backend = RedisBackend::builder(proxy.url())
        .calls_in_flight(1)
        .op_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let minimum = Duration::from_secs(60);
    let held = |name: &str| {
        AcquireRequest::new(key(name), holder(), ttl("3s")).with_hold_at_least(minimum)
    };

    let me = holder();
    acquire(&backend, &key("plain"), me, ttl("3s")).await?;
    let released = tokio::time::timeout(BOUND, backend.release(&key("plain"), &me)).await??;
    assert_eq!(released, ReleaseReport::Released { heard: false });
    assert_eq!(server.cli(&["EXISTS", &storage_key(&key("plain"))])?, "0");
    assert_eq!(calls(&server, "getex")?, 0, "a plain release read a mark");

    // The acquisition's reply is lost: requests reach the server 400 ms
    // late, replies 800 ms after they were sent, past the 300 ms bound.
    let orphan = held("orphan")?;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
    let lost = tokio::time::timeout(BOUND, backend.try_acquire(&orphan)).await?;
    assert!(
        matches!(lost, Err(BackendError::Timeout { .. })),
        "{lost:?}"
    );
    until_run(&server, 1).await?;
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(stored(&server, &orphan.key)?.0, orphan.holder.to_hex());
    tokio::time::timeout(BOUND, backend.release(&orphan.key, &orphan.holder)).await??;
    let left = pttl(&server, &orphan.key)?;
    assert!(
        (3_001..=60_000).contains(&left),
        "PTTL {left}: an acquisition whose reply was lost was freed under its minimum"
    );

    // The first release's reply is lost; the release is sent again.
    let again = held("again")?;
    let granted = tokio::time::timeout(BOUND, backend.try_acquire(&again)).await??;
    assert!(matches!(granted, AcquireOutcome::Acquired(_)));
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(400)));
    let lost = tokio::time::timeout(BOUND, backend.release(&again.key, &again.holder)).await?;
    assert!(
        matches!(lost, Err(BackendError::Timeout { .. })),
        "{lost:?}"
    );
    until_run(&server, 1).await?;
    proxy.set_mode(ProxyMode::Pass);
    // Answered twice now, and kept each time: still the holder's.
    for _ in 0..2 {
        let released =
            tokio::time::timeout(BOUND, backend.release(&again.key, &again.holder)).await??;
        assert_eq!(released, ReleaseReport::Released { heard: false });
        let left = pttl(&server, &again.key)?;
        assert!(
            (3_001..=60_000).contains(&left),
            "PTTL {left}: a release sent again freed the key under its minimum"
        );
    }
    Ok(())
}

/// The number of keys in the server's tracking table: the server's own
/// count, which the backend does not shape.
fn tracked_keys(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let stats = server.cli(&["INFO", "stats"])?;
    let count = stats
        .lines()
        .find_map(|l| l.strip_prefix("tracking_total_keys:"))
        .ok_or("no tracking_total_keys in INFO stats")?;
    Ok(count.trim().parse()?)
}

/// Over a tracking connection, a batch's grants leave each lease tracked
/// and no counter (the server's tracking table counts one key per lease),
/// and a write behind a holder of a batched grant is reported for it.
#[tokio::test]
async fn a_batch_over_a_tracking_connection_tracks_its_leases_not_their_counters() -> TestResult {
    let server = RedisServer::start()?;
    let backend = batching(&server).await;
    assert!(backend.tracks_lease_changes());
    warm_up(&backend, &[&server], &[key("warm")]).await?;
    let mut watch = backend.watch_changes().await?;
    let before = tracked_keys(&server)?;
    let keys: Vec<LeaseKey> = (0..5).map(|i| key(&format!("watched-{i}"))).collect();
    let requests: Vec<AcquireRequest> = keys.iter().map(|k| request(k, holder())).collect();
    let outcomes = tokio::time::timeout(
        BOUND,
        join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await?;
    for outcome in outcomes {
        assert!(matches!(outcome?, AcquireOutcome::Acquired(_)));
    }
    assert_eq!(calls(&server, "evalsha")?, 2);
    assert_eq!(tracked_keys(&server)? - before, 5);
    // The last lease came in the batch: overwritten behind its holder, it
    // is reported.
    let last = &keys[4];
    assert_eq!(
        server.cli(&["SET", &storage_key(last), "someone-else", "PX", "60000"])?,
        "OK"
    );
    let change = tokio::time::timeout(BOUND, watch.next())
        .await?
        .ok_or("the backend stopped reporting changes")?;
    assert_eq!(change, leasehold_core::LeaseChange::Changed(last.clone()));
    Ok(())
}
