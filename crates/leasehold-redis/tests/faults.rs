//! Faults against a real `redis-server`: a paused server, a restart that
//! loses everything, a flushed script cache, keys of the wrong type, and a
//! Sentinel master that drops its connections.

mod common;

use std::time::Duration;

use common::{TestResult, acquire, connect, holder, key, retry_transient, storage_key, ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, LeaseBackend, ReleaseOutcome, RenewOutcome,
    RenewRequest,
};
use leasehold_redis::RedisBackend;
use leasehold_testkit::{RedisServer, SentinelSet};
use tokio::time::Instant;

#[tokio::test]
async fn a_paused_server_times_out_and_later_answers_go_to_the_right_requests() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .op_timeout(Duration::from_millis(200))
        .connect()
        .await?;
    assert_eq!(backend.op_timeout(), Duration::from_millis(200));
    let (before, a) = (key("before-pause"), holder());
    acquire(&backend, &before, a, ttl("1h")).await?;
    // Load every script now: a call that times out never gets to reload a
    // script after NOSCRIPT, and this test wants the queued calls to run.
    backend.inspect(&before).await?;
    backend
        .renew(&RenewRequest::new(before.clone(), a, ttl("1h")))
        .await?;
    backend.release(&key("unheld"), &a).await?;

    server.pause()?;
    let started = Instant::now();
    let during = key("during-pause");
    let outcomes = (
        backend.inspect(&before).await,
        backend
            .try_acquire(&AcquireRequest::new(during.clone(), holder(), ttl("1h")))
            .await,
        backend
            .renew(&RenewRequest::new(before.clone(), a, ttl("1h")))
            .await,
        backend
            .renew_many(&[RenewRequest::new(before.clone(), a, ttl("1h"))])
            .await,
        backend.release(&before, &a).await,
    );
    let waited = started.elapsed();
    server.resume()?;

    let after = Duration::from_millis(200);
    assert!(
        matches!(outcomes.0, Err(BackendError::Timeout { op: "inspect", after: t, .. }) if t == after),
        "{:?}",
        outcomes.0
    );
    assert!(
        matches!(outcomes.1, Err(BackendError::Timeout { op: "acquire", .. })),
        "{:?}",
        outcomes.1
    );
    assert!(
        matches!(outcomes.2, Err(BackendError::Timeout { op: "renew", .. })),
        "{:?}",
        outcomes.2
    );
    assert!(
        matches!(
            outcomes.3.as_slice(),
            [Err(BackendError::Timeout { op: "renew", .. })]
        ),
        "{:?}",
        outcomes.3
    );
    assert!(
        matches!(outcomes.4, Err(BackendError::Timeout { op: "release", .. })),
        "{:?}",
        outcomes.4
    );
    assert!(outcomes.0.as_ref().is_err_and(BackendError::is_transient));
    assert!(
        waited < Duration::from_millis(5 * 200 + 500),
        "each call bounded by op_timeout: {waited:?}"
    );

    // The same backend works again, and each answer is for its own request:
    // the late replies to the timed-out calls are not handed to these.
    let fresh = key("after-resume");
    let grant = acquire(&backend, &fresh, holder(), ttl("1h")).await?;
    let info = backend.inspect(&fresh).await?.expect("just acquired");
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    // The calls that timed out were queued by the paused server and ran when
    // it woke up: "outcome unknown" means exactly this.
    assert_eq!(
        backend.inspect(&before).await?,
        None,
        "the queued release ran after resume"
    );
    assert!(
        backend
            .inspect(&during)
            .await?
            .is_some_and(|i| i.fencing_token.is_some())
    );
    Ok(())
}

#[tokio::test]
async fn tokens_keep_rising_after_a_restart_that_lost_everything() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, ttl) = (key("survivor"), ttl("1h"));
    let mut last_released = None;
    for _ in 0..20 {
        let h = holder();
        last_released = Some(acquire(&backend, &k, h, ttl).await?.fencing_token);
        backend.release(&k, &h).await?;
    }
    let held_by = holder();
    // The highest token the server handed out before the restart: the
    // held lease's, above every one before it.
    let last = acquire(&backend, &k, held_by, ttl).await?.fencing_token;
    assert!(last > last_released.expect("acquired at least once"));

    server.restart()?;
    assert_eq!(
        server.cli(&["DBSIZE"])?,
        "0",
        "the restart lost the lease and the counter"
    );

    // The first call after the restart may see the dropped connection; the
    // backend reconnects by itself.
    let renewal_request = RenewRequest::new(k.clone(), held_by, ttl);
    let renewal = retry_transient(|| backend.renew(&renewal_request)).await?;
    assert_eq!(
        renewal,
        RenewOutcome::Lost,
        "the lease was lost with the server's memory"
    );
    let grant = retry_transient(|| async {
        match backend
            .try_acquire(&AcquireRequest::new(k.clone(), holder(), ttl))
            .await?
        {
            AcquireOutcome::Acquired(grant) => Ok(grant),
            AcquireOutcome::Held(info) => {
                panic!("the restarted server holds nothing, got {info:?}")
            }
        }
    })
    .await?;
    assert!(
        grant.fencing_token > last,
        "{} after {last}",
        grant.fencing_token
    );
    Ok(())
}

#[tokio::test]
async fn a_killed_server_is_unavailable_not_a_hang() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = connect(&server).await;
    let k = key("gone");
    server.kill()?;
    let started = Instant::now();
    let err = backend.inspect(&k).await.expect_err("the server is gone");
    assert!(err.is_transient(), "{err:?}");
    assert!(
        matches!(
            err,
            BackendError::Unavailable { .. } | BackendError::Timeout { .. }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() <= backend.op_timeout() + Duration::from_millis(500));
    server.restart()?;
    assert_eq!(retry_transient(|| backend.inspect(&k)).await?, None);
    Ok(())
}

#[tokio::test]
async fn scripts_are_reloaded_after_script_flush() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("flushed"), holder());
    let grant = acquire(&backend, &k, a, ttl("30s")).await?;
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"])?, "OK");
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("30s")))
            .await?,
        RenewOutcome::Renewed
    );
    server.cli(&["SCRIPT", "FLUSH"])?;
    assert_eq!(
        backend.inspect(&k).await?.and_then(|i| i.fencing_token),
        Some(grant.fencing_token)
    );
    server.cli(&["SCRIPT", "FLUSH"])?;
    assert!(matches!(
        backend.try_acquire(&AcquireRequest::new(k.clone(), a, ttl("30s"))).await?,
        AcquireOutcome::Acquired(g) if g.fencing_token == grant.fencing_token
    ));
    server.cli(&["SCRIPT", "FLUSH"])?;
    assert_eq!(
        backend.release(&k, &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}

#[tokio::test]
async fn a_lease_key_of_another_type_is_wrong_type_or_lost() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("hashed"), holder());
    server.cli(&["HSET", &storage_key(&k), "field", "value"])?;

    let err = backend
        .try_acquire(&AcquireRequest::new(k.clone(), a, ttl("30s")))
        .await
        .expect_err("wrong type");
    assert!(
        matches!(&err, BackendError::WrongType { key } if key == "hashed"),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), a, ttl("30s")))
            .await?,
        RenewOutcome::Lost
    );
    assert!(matches!(
        backend.release(&k, &a).await,
        Err(BackendError::WrongType { .. })
    ));
    assert!(matches!(
        backend.inspect(&k).await,
        Err(BackendError::WrongType { .. })
    ));
    assert_eq!(
        server.cli(&["HGET", &storage_key(&k), "field"])?,
        "value",
        "left alone"
    );

    // A fencing counter of another type stops acquisition the same way.
    let f = key("fence-hashed");
    server.cli(&[
        "HSET",
        &format!("{}:fence", storage_key(&f)),
        "field",
        "value",
    ])?;
    let err = backend
        .try_acquire(&AcquireRequest::new(f.clone(), a, ttl("30s")))
        .await
        .expect_err("wrong type");
    assert!(matches!(&err, BackendError::WrongType { .. }), "{err:?}");
    assert_eq!(backend.inspect(&f).await?, None, "nothing was written");
    Ok(())
}

/// How many times the master was looked up through the sentinels: each
/// lookup asks the master it found for its `ROLE` before connecting (the
/// sentinels themselves send `PING` and `INFO`). The master's own count.
fn lookups(set: &SentinelSet) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(set.master().command_calls("role")?)
}

/// Behind Sentinel, an error reply leaves the connection to the master in
/// use; a connection the master dropped makes the next call ask the
/// sentinels again, and the call after it is answered. The master's count
/// of lookups is the witness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_only_a_failed_connection_asks_the_sentinels_again() -> TestResult {
    let set = tokio::task::block_in_place(SentinelSet::start)?;
    let backend = RedisBackend::connect(set.url()).await?;
    let k = key("held");
    acquire(&backend, &k, holder(), ttl("30s")).await?;
    assert!(backend.inspect(&k).await?.is_some());
    let wrong = key("a-hash");
    set.master()
        .cli(&["HSET", "leasehold:{a-hash}", "field", "value"])?;
    let before = lookups(&set)?;
    assert!(before > 0, "the connect looked the master up");
    for _ in 0..3 {
        let refused = backend.inspect(&wrong).await;
        assert!(
            matches!(refused, Err(BackendError::WrongType { .. })),
            "{refused:?}"
        );
    }
    assert_eq!(lookups(&set)?, before, "an error reply asks no sentinel");

    // The master drops every connection of its clients (the sentinels'
    // own come back by themselves).
    set.master().cli(&["CLIENT", "KILL", "TYPE", "normal"])?;
    let read = retry_transient(|| backend.inspect(&k)).await?;
    assert!(read.is_some(), "the lease is read on the master again");
    assert!(
        lookups(&set)? > before,
        "the dropped connection made the backend ask the sentinels again"
    );
    Ok(())
}

/// Behind Sentinel, a master that answers `LOADING` (reloading its data,
/// as after a restart) may not be the master the sentinels name once it
/// is up: each call it refuses so makes the backend ask the sentinels
/// again, by the master's own count of lookups. The reload is slowed to
/// 1 ms a key over 2,000 keys, with the server answering between keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_loading_master_makes_the_backend_ask_the_sentinels_again() -> TestResult
{
    let set = tokio::task::block_in_place(SentinelSet::start)?;
    let backend = RedisBackend::connect(set.url()).await?;
    let k = key("held");
    acquire(&backend, &k, holder(), ttl("60s")).await?;
    let master = set.master();
    master.cli(&["DEBUG", "POPULATE", "2000"])?;
    master.cli(&["CONFIG", "SET", "key-load-delay", "1000"])?;
    master.cli(&[
        "CONFIG",
        "SET",
        "loading-process-events-interval-bytes",
        "1024",
    ])?;
    let loading = || -> Result<bool, Box<dyn std::error::Error>> {
        Ok(master.cli(&["INFO", "persistence"])?.contains("loading:1"))
    };
    let url = master.url();
    // Bounded, so that the join below is too: about 2 s expected.
    let reload = std::thread::spawn(move || -> redis::RedisResult<String> {
        let mut conn =
            redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(5))?;
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        redis::cmd("DEBUG").arg("RELOAD").query(&mut conn)
    });
    let started = Instant::now();
    while !loading()? {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the master never started loading"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = lookups(&set)?;
    for _ in 0..3 {
        let refused = backend.inspect(&k).await;
        assert!(
            matches!(&refused, Err(BackendError::Server { detail, transient: true, .. }) if detail.starts_with("LOADING")),
            "read while loading: {refused:?}"
        );
    }
    let after = lookups(&set)?;
    assert!(loading()?, "the reload ended before the calls did");
    assert!(
        after > before,
        "a LOADING reply asked no sentinel ({before} lookups before, {after} after)"
    );
    let reloaded = tokio::task::spawn_blocking(move || reload.join())
        .await?
        .map_err(|_| "the reload panicked")?;
    assert_eq!(reloaded?, "OK");
    let read = retry_transient(|| backend.inspect(&k)).await?;
    assert!(read.is_some(), "the lease is read on the reloaded master");
    Ok(())
}
