//! Counting leases (permits) against real servers, judged by the server's
//! own state read on a side connection: how many permit keys exist, their
//! PTTL, the semaphore's fencing counter and limit, the messages on its
//! release channel, the cluster slot of each key.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestResult, assert_expires, connect, holder, key, server_ms, ttl};
use futures_util::StreamExt;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, FairBackend, FencingToken, Grant,
    HolderId, LeaseBackend, LeaseChange, LeaseKey, PermitBackend, PermitLimit, ReleaseOutcome, Ttl,
    WatchPolicy,
};
use leasehold_redis::redis::{self, AsyncCommands};
use leasehold_redis::{KeyLayout, RedisBackend, RedlockBackend};
use leasehold_testkit::{RedisCluster, RedisServer};
use tokio::time::{Instant, timeout};

fn limit(n: u32) -> PermitLimit {
    PermitLimit::new(n).expect("a valid limit")
}

async fn side(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// Takes a permit that must be free.
async fn permit(
    backend: &impl PermitBackend,
    semaphore: &LeaseKey,
    who: HolderId,
    ttl: Ttl,
    n: u32,
) -> Result<Grant, BackendError> {
    match backend
        .try_acquire_permit(&AcquireRequest::new(semaphore.clone(), who, ttl), limit(n))
        .await?
    {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        AcquireOutcome::Held(info) => panic!("a permit of {semaphore} should be free: {info:?}"),
    }
}

/// The permit keys of `jobs` that exist on the server, whatever their index.
async fn permit_keys(side: &mut redis::aio::MultiplexedConnection) -> redis::RedisResult<usize> {
    let keys: Vec<String> = side.keys("leasehold:{jobs}:permit:*").await?;
    Ok(keys.len())
}

/// 32 contenders on 8 connections take and give back the 3 permits of one
/// semaphore for a while. Whenever one holds a permit, the server has at
/// most 3 permit keys (counted by KEYS, so a grant past the limit shows),
/// its permit key holds its own holder id from grant to release (so a
/// grant over a held permit shows), and at most 3 contenders hold one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_permits_are_never_exceeded_under_32_contenders() -> TestResult {
    const LIMIT: u32 = 3;
    let server = RedisServer::start()?;
    let mut backends = Vec::new();
    for _ in 0..8 {
        backends.push(connect(&server).await);
    }
    let holding = Arc::new(AtomicU32::new(0));
    let (grants, refusals) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let backend = backends[i % backends.len()].clone();
        let mut side = side(&server.url()).await?;
        let (holding, grants, refusals) = (holding.clone(), grants.clone(), refusals.clone());
        tasks.push(tokio::spawn(async move {
            let semaphore = key("jobs");
            for _ in 0..15 {
                let me = holder();
                let request = AcquireRequest::new(semaphore.clone(), me, ttl("30s"));
                let grant = match backend.try_acquire_permit(&request, limit(LIMIT)).await? {
                    AcquireOutcome::Acquired(grant) => grant,
                    AcquireOutcome::Held(_) => {
                        refusals.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                        continue;
                    }
                };
                grants.fetch_add(1, Ordering::Relaxed);
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                assert!(now <= LIMIT, "{now} contenders hold a permit");
                let stored = |v: Option<String>| v.is_some_and(|v| v.starts_with(&me.to_hex()));
                let redis_key = format!("leasehold:{}", grant.key);
                let keys = permit_keys(&mut side).await?;
                assert!(keys <= LIMIT as usize, "{keys} permit keys on the server");
                assert!(stored(side.get(&redis_key).await?), "{redis_key} not ours");
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert!(stored(side.get(&redis_key).await?), "{redis_key} taken");
                holding.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(
                    backend.release(&grant.key, &me).await?.outcome(),
                    ReleaseOutcome::Released
                );
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(60), task)
            .await??
            .map_err(|e| e.to_string())?;
    }
    // The contention was real: permits were granted and refused.
    let (grants, refusals) = (
        grants.load(Ordering::Relaxed),
        refusals.load(Ordering::Relaxed),
    );
    assert!(
        grants >= 15 && refusals > 0,
        "{grants} grants, {refusals} refusals"
    );
    Ok(())
}

/// A holder that vanishes without releasing (its process died) leaves its
/// permit on the server for its ttl, no longer: the server expires it with
/// no other process running, and the permit is then granted again.
#[tokio::test]
async fn a_crashed_holders_permit_frees_at_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let jobs = key("jobs");
    let crashed = connect(&server).await;
    let sent = Instant::now();
    let lost = permit(&crashed, &jobs, holder(), ttl("1s"), 1).await?;
    drop(crashed);
    let redis_key = format!("leasehold:{}", lost.key);
    let pttl: i64 = side.pttl(&redis_key).await?;
    assert!(pttl > 0 && pttl <= 1000, "PTTL {pttl}");

    // Still held half-way: the only permit is taken.
    let other = connect(&server).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let exists: bool = side.exists(&redis_key).await?;
    assert!(exists, "the permit expired early");
    let request = AcquireRequest::new(jobs.clone(), holder(), ttl("30s"));
    assert!(matches!(
        other.try_acquire_permit(&request, limit(1)).await?,
        AcquireOutcome::Held(info) if info.ttl_left.is_some_and(|l| l <= Duration::from_millis(500))
    ));

    // Gone by the server's own expiry, and then granted again.
    timeout(Duration::from_secs(3), async {
        while side.exists::<_, bool>(&redis_key).await? {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok::<_, redis::RedisError>(())
    })
    .await??;
    assert!(
        sent.elapsed() >= Duration::from_millis(990),
        "{:?}",
        sent.elapsed()
    );
    let again = permit(&other, &jobs, holder(), ttl("30s"), 1).await?;
    assert_eq!(again.key, lost.key);
    Ok(())
}

/// A semaphore's keys keep the expiries asked for, by the server's clock
/// (`PEXPIRETIME` against `TIME` read around each call, see
/// `common::assert_expires`): a permit its holder takes again, for the new
/// ttl; the semaphore's counter, for the retention from a grant; its
/// limit, for the retention from each grant and each re-acquisition (a
/// limit that expired early would let a holder asking with another limit
/// in while permits are held).
#[tokio::test]
async fn a_semaphore_keeps_the_expiries_asked_for() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (jobs, who) = (key("jobs"), holder());
    let retention = i64::try_from(KeyLayout::DEFAULT_FENCE_RETENTION.as_millis())?;
    let (limit_key, fence) = ("leasehold:{jobs}:permits", "leasehold:{jobs}:fence");

    let before = server_ms(&server)?;
    let grant = permit(&backend, &jobs, who, ttl("1s"), 2).await?;
    let after = server_ms(&server)?;
    assert_expires(
        &server,
        fence,
        (before, after),
        retention,
        "the counter after a grant",
    )?;
    assert_expires(
        &server,
        limit_key,
        (before, after),
        retention,
        "the limit after a grant",
    )?;

    let before = server_ms(&server)?;
    let again = permit(&backend, &jobs, who, ttl("20s"), 2).await?;
    let after = server_ms(&server)?;
    assert_eq!(again.key, grant.key, "the holder keeps its permit");
    let permit_key = format!("leasehold:{}", grant.key);
    assert_expires(
        &server,
        &permit_key,
        (before, after),
        20_000,
        "a permit taken again",
    )?;
    assert_expires(
        &server,
        limit_key,
        (before, after),
        retention,
        "the limit after a re-acquisition",
    )?;
    Ok(())
}

/// Fencing tokens come from one counter per semaphore: with that counter
/// set far above the clock floor (as after a clock stepped back), every
/// permit's token continues from it, one more each time, whichever
/// permit is granted. A holder taking a permit again keeps its permit and
/// token.
#[tokio::test]
async fn fencing_tokens_strictly_increase_across_permits() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let backend = connect(&server).await;
    let jobs = key("jobs");
    // Above the clock floor (microseconds since 1970, about 2^50.6 today)
    // and below 2^53, where Lua numbers stop being exact.
    let high: u64 = 1 << 52;
    let () = side.set("leasehold:{jobs}:fence", high).await?;

    let (a, b, c) = (holder(), holder(), holder());
    let ga = permit(&backend, &jobs, a, ttl("30s"), 3).await?;
    let gb = permit(&backend, &jobs, b, ttl("30s"), 3).await?;
    let again = permit(&backend, &jobs, a, ttl("30s"), 3).await?;
    assert_eq!(
        (again.key, again.fencing_token),
        (ga.key.clone(), ga.fencing_token)
    );
    backend.release(&ga.key, &a).await?;
    let gc = permit(&backend, &jobs, c, ttl("30s"), 3).await?;
    let ga2 = permit(&backend, &jobs, a, ttl("30s"), 3).await?;
    let tokens: Vec<u64> = [&ga, &gb, &gc, &ga2]
        .iter()
        .map(|g| g.fencing_token.get())
        .collect();
    assert_eq!(tokens, [high + 1, high + 2, high + 3, high + 4]);
    // Three permit keys were used, one counter kept every token.
    let mut permits: Vec<String> = [&ga, &gb, &ga2].iter().map(|g| g.key.to_string()).collect();
    permits.sort();
    assert_eq!(
        permits,
        ["{jobs}:permit:0", "{jobs}:permit:1", "{jobs}:permit:2"]
    );
    let counters: Vec<String> = side.keys("leasehold:*fence").await?;
    assert_eq!(counters, ["leasehold:{jobs}:fence"]);
    let counter: u64 = side.get("leasehold:{jobs}:fence").await?;
    assert_eq!(counter, high + 4);
    let stored: String = side.get(format!("leasehold:{}", gc.key)).await?;
    assert_eq!(stored, format!("{}:{}:", c.to_hex(), high + 3));
    Ok(())
}

/// Holders of one semaphore must agree on its limit: a call with another
/// limit is refused with a typed error and takes nothing, also when the
/// only permit held is past the permits the call asks for; once every
/// permit is free the new limit is taken.
#[tokio::test]
async fn a_limit_mismatch_is_refused() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let backend = connect(&server).await;
    let jobs = key("jobs");
    let holders: Vec<HolderId> = (0..5).map(|_| holder()).collect();
    let mut grants = Vec::new();
    for h in &holders {
        grants.push(permit(&backend, &jobs, *h, ttl("30s"), 5).await?);
    }
    // Only permit 3 stays held: a limit of 2 sees none of its own two
    // permits held, and must look at the stored limit's.
    for (grant, h) in grants.iter().zip(&holders) {
        if grant.key.as_str() != "{jobs}:permit:3" {
            backend.release(&grant.key, h).await?;
        }
    }
    assert_eq!(permit_keys(&mut side).await?, 1);
    for asked in [2, 6] {
        let request = AcquireRequest::new(jobs.clone(), holder(), ttl("30s"));
        let refused = backend.try_acquire_permit(&request, limit(asked)).await;
        assert!(
            matches!(
                &refused,
                Err(BackendError::PermitLimitMismatch { asked: a, held: 5, .. }) if *a == asked
            ),
            "{refused:?}"
        );
        assert!(!refused.as_ref().is_err_and(BackendError::is_transient));
        assert_eq!(permit_keys(&mut side).await?, 1);
        let stored: String = side.get("leasehold:{jobs}:permits").await?;
        assert_eq!(stored, "5");
    }
    // All free: the new limit is taken.
    let last = grants
        .iter()
        .position(|g| g.key.as_str() == "{jobs}:permit:3")
        .expect("permit 3 was granted");
    backend.release(&grants[last].key, &holders[last]).await?;
    permit(&backend, &jobs, holder(), ttl("30s"), 2).await?;
    let stored: String = side.get("leasehold:{jobs}:permits").await?;
    assert_eq!(stored, "2");
    Ok(())
}

/// A stored limit above the largest this library accepts (written by
/// something else) is refused as a mismatch naming it, at once, rather
/// than checked: no call is sent for its permit keys.
#[tokio::test]
async fn a_stored_limit_above_the_largest_is_a_mismatch() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let jobs = key("jobs");
    let above = PermitLimit::MAX + 1;
    server.cli(&["SET", "leasehold:{jobs}:permits", &above.to_string()])?;
    let request = AcquireRequest::new(jobs, holder(), ttl("30s"));
    // Loaded first, so that the count below has no NOSCRIPT retry.
    let _ = backend.try_acquire_permit(&request, limit(2)).await;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let refused = backend.try_acquire_permit(&request, limit(2)).await;
    assert!(
        matches!(
            &refused,
            Err(BackendError::PermitLimitMismatch { asked: 2, held, .. }) if *held == above
        ),
        "{refused:?}"
    );
    assert_eq!(server.command_calls("evalsha")?, 1, "one call");
    Ok(())
}

/// Releasing a permit publishes on the semaphore's channel, where a waiter
/// for any permit listens: a plain subscriber sees the message, and a
/// watch on the semaphore through another backend wakes.
#[tokio::test]
async fn release_publishes_a_notice_on_the_semaphore_channel() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let waiter = connect(&server).await;
    let jobs = key("jobs");
    let mut pubsub = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub.subscribe("leasehold:{jobs}:released").await?;
    let mut watch = waiter.watch_releases(&jobs, WatchPolicy::Counted).await?;

    let me = holder();
    let _first = permit(&backend, &jobs, holder(), ttl("30s"), 2).await?;
    let grant = permit(&backend, &jobs, me, ttl("30s"), 2).await?;
    assert_eq!(grant.key.as_str(), "{jobs}:permit:1");
    assert_eq!(
        backend.release(&grant.key, &me).await?.outcome(),
        ReleaseOutcome::Released
    );
    let message = timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await?
        .expect("the subscription is open");
    assert_eq!(message.get_channel_name(), "leasehold:{jobs}:released");
    timeout(Duration::from_secs(5), watch.released()).await?;

    // A fair release of a permit is a plain one (fair mode queues
    // exclusive leases only): the permit is freed and its notice goes to
    // the semaphore's channel too.
    let again = permit(&backend, &jobs, me, ttl("30s"), 2).await?;
    assert_eq!(
        FairBackend::release_fair(&backend, &again.key, &me).await?,
        ReleaseOutcome::Released
    );
    assert_eq!(
        server.cli(&["EXISTS", &format!("leasehold:{}", again.key)])?,
        "0"
    );
    let message = timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await?
        .expect("the subscription is open");
    assert_eq!(message.get_channel_name(), "leasehold:{jobs}:released");
    timeout(Duration::from_secs(5), watch.released()).await?;
    Ok(())
}

/// On a cluster, the limit, the counter and every permit key of a
/// semaphore hash to one slot, so one script takes a permit; they live on
/// the master of that slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_keys_share_one_cluster_slot() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    let mut grants = Vec::new();
    for semaphore in ["jobs", "order:{42}"] {
        let sem = key(semaphore);
        for _ in 0..3 {
            grants.push(permit(&backend, &sem, holder(), ttl("30s"), 3).await?);
        }
        let slot = cluster.keyslot(&backend.layout().lease(&sem))?;
        let master = &cluster.nodes()[cluster.master_of_slot(slot)?];
        let mut keys = vec![
            backend.layout().permit_limit(&sem),
            backend.layout().fence(&sem),
        ];
        keys.extend((0..3).map(|i| backend.layout().lease(&sem.permit(i).expect("short"))));
        for redis_key in keys {
            assert_eq!(cluster.keyslot(&redis_key)?, slot, "{redis_key}");
            assert_eq!(master.cli(&["EXISTS", &redis_key])?, "1", "{redis_key}");
        }
        let refused = backend
            .try_acquire_permit(
                &AcquireRequest::new(sem.clone(), holder(), ttl("30s")),
                limit(3),
            )
            .await?;
        assert!(matches!(refused, AcquireOutcome::Held(_)), "{refused:?}");
    }
    let tokens: Vec<FencingToken> = grants[..3].iter().map(|g| g.fencing_token).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    Ok(())
}

/// Redlock refuses permits with a typed error, before asking any master.
#[tokio::test]
async fn redlock_refuses_permits() -> TestResult {
    let masters = leasehold_testkit::independent_masters(3)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    let request = AcquireRequest::new(key("jobs"), holder(), ttl("30s"));
    let refused = backend.try_acquire_permit(&request, limit(2)).await;
    assert!(
        matches!(
            &refused,
            Err(BackendError::Unsupported {
                op: "acquire_permit",
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

/// Behind Sentinel, permits are taken on the master the sentinels name:
/// it holds exactly the permits granted, and refuses one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_behind_sentinel_live_on_the_master() -> TestResult {
    let set = tokio::task::block_in_place(leasehold_testkit::SentinelSet::start)?;
    let backend = RedisBackend::connect(set.url()).await?;
    let jobs = key("jobs");
    for _ in 0..2 {
        permit(&backend, &jobs, holder(), ttl("30s"), 2).await?;
    }
    let request = AcquireRequest::new(jobs.clone(), holder(), ttl("30s"));
    let refused = backend.try_acquire_permit(&request, limit(2)).await?;
    assert!(matches!(refused, AcquireOutcome::Held(_)), "{refused:?}");
    let mut master = side(&set.master().url()).await?;
    assert_eq!(permit_keys(&mut master).await?, 2);
    Ok(())
}

/// A permit is tracked from the script that grants it, as any lease: a SET
/// behind its holder's back is reported for the permit key at once. The
/// semaphore's limit and counter name no lease, so writing them reports
/// none.
#[tokio::test]
async fn a_permit_changed_behind_its_holder_is_reported() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let backend = connect(&server).await;
    assert!(backend.tracks_lease_changes());
    let mut watch = backend.watch_changes().await?;
    let jobs = key("jobs");
    let mine = permit(&backend, &jobs, holder(), ttl("30s"), 2).await?;
    let () = side.set("leasehold:{jobs}:permits", "2").await?;
    let () = side.set("leasehold:{jobs}:fence", "1").await?;
    let () = side
        .set(format!("leasehold:{}", mine.key), "someone-else")
        .await?;
    let first = timeout(Duration::from_secs(5), watch.next())
        .await?
        .expect("the watch is open");
    assert_eq!(first, LeaseChange::Changed(mine.key.clone()));
    Ok(())
}
