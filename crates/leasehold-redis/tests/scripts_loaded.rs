//! Scripts are loaded on every server at connect, so that many calls sent
//! at once on a fresh connection meet no `NOSCRIPT` (each would load its
//! script again); a server that loses them later (`SCRIPT FLUSH`, a
//! restart) is sent each script that a call needs once per loss, however
//! many calls of it meet `NOSCRIPT` together, and no script that no call
//! needs. Judged by the servers' own `INFO errorstats` and `INFO
//! commandstats`.

mod common;

use std::time::Duration;

use common::{TestResult, holder, key, retry_transient, ttl};
use futures_util::StreamExt;
use futures_util::future::try_join_all;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, LeaseBackend, RenewOutcome, RenewRequest,
};
use leasehold_redis::RedisBackend;
use leasehold_testkit::{Proxy, ProxyMode, RedisCluster, RedisServer};

/// A counter of `INFO <section>`, 0 when the line is absent (a count never
/// incremented); a server that cannot be asked fails the test rather than
/// read as 0.
fn stat(
    server: &RedisServer,
    section: &str,
    line: &str,
    field: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(server.info_counter(section, line, field)?)
}

/// Acquires `count` free leases of `prefix` at once, each for `ttl`, and
/// returns their requests; every one must be granted.
async fn grant_all(
    backend: &RedisBackend,
    prefix: &str,
    count: usize,
    ttl_text: &str,
) -> Result<Vec<AcquireRequest>, Box<dyn std::error::Error>> {
    let requests: Vec<AcquireRequest> = (0..count)
        .map(|i| AcquireRequest::new(key(&format!("{prefix}:{i}")), holder(), ttl(ttl_text)))
        .collect();
    let outcomes = tokio::time::timeout(
        Duration::from_secs(30),
        try_join_all(requests.iter().map(|r| backend.try_acquire(r))),
    )
    .await??;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, AcquireOutcome::Acquired(_))),
        "every free lease granted"
    );
    Ok(requests)
}

async fn acquire_together(backend: &RedisBackend, prefix: &str, count: usize) -> TestResult {
    grant_all(backend, prefix, count, "30s").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_first_calls_on_a_cluster_meet_no_noscript() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    acquire_together(&backend, "job", 2000).await?;
    for node in cluster.nodes() {
        assert_eq!(
            stat(node, "errorstats", "errorstat_NOSCRIPT", "count")?,
            0,
            "no NOSCRIPT on node {}",
            node.port()
        );
        assert!(
            stat(node, "commandstats", "cmdstat_evalsha", "calls")? > 0,
            "node {} served acquisitions",
            node.port()
        );
    }
    Ok(())
}

#[tokio::test]
async fn first_calls_on_a_server_meet_no_noscript() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    acquire_together(&backend, "job", 500).await?;
    assert_eq!(
        stat(&server, "errorstats", "errorstat_NOSCRIPT", "count")?,
        0
    );
    assert!(stat(&server, "commandstats", "cmdstat_evalsha", "calls")? >= 1);
    // After a SCRIPT FLUSH (as after a restart), the scripts load again on
    // their first NOSCRIPT.
    server.cli(&["SCRIPT", "FLUSH"])?;
    acquire_together(&backend, "after-flush", 1).await?;
    assert!(stat(&server, "errorstats", "errorstat_NOSCRIPT", "count")? >= 1);
    Ok(())
}

/// The scripts the calls of these tests run after a loss: the acquisition
/// (alone, or a batch of them), the renewal and the read. Each is loaded
/// at most once per loss.
const SCRIPTS_RUN: u64 = 4;

/// `SCRIPT LOAD`s the server has run since its counters were reset.
fn loads(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    stat(server, "commandstats", "cmdstat_script|load", "calls")
}

/// `NOSCRIPT` replies the server has sent since its counters were reset.
fn noscripts(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    stat(server, "errorstats", "errorstat_NOSCRIPT", "count")
}

/// Empties the server's script cache, as a restart or a failover does, and
/// resets its counters so that what follows is counted alone.
fn flush_scripts(server: &RedisServer) -> TestResult {
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"])?, "OK");
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    Ok(())
}

/// Acquires `count` free leases at once, each for an hour, and returns
/// their requests (to renew them).
async fn hold(
    backend: &RedisBackend,
    prefix: &str,
    count: usize,
) -> Result<Vec<RenewRequest>, Box<dyn std::error::Error>> {
    Ok(grant_all(backend, prefix, count, "1h")
        .await?
        .into_iter()
        .map(|r| RenewRequest::new(r.key, r.holder, r.ttl))
        .collect())
}

/// Asserts that `server` noticed the loss of its scripts (a `NOSCRIPT` at
/// least) and was sent each script a call needed once at most (at least
/// one `SCRIPT LOAD`, at most [`SCRIPTS_RUN`]), since its counters were
/// reset; `when` names the loss in the messages.
fn loaded_once(server: &RedisServer, when: &str) -> TestResult {
    let (loaded, refused) = (loads(server)?, noscripts(server)?);
    eprintln!("{when}: {loaded} SCRIPT LOADs, {refused} NOSCRIPT replies");
    assert!(refused >= 1, "{when}: the loss was noticed");
    assert!(
        (1..=SCRIPTS_RUN).contains(&loaded),
        "{when}: {loaded} SCRIPT LOADs: one per script the calls run (at most {SCRIPTS_RUN}), not one per call that met NOSCRIPT ({refused} NOSCRIPT replies) nor one of every script"
    );
    Ok(())
}

/// Renews every lease of `renewals` at once; each must still be held.
async fn renew_together(backend: &RedisBackend, renewals: &[RenewRequest]) -> TestResult {
    let outcomes = tokio::time::timeout(
        Duration::from_secs(30),
        try_join_all(renewals.iter().map(|r| backend.renew(r))),
    )
    .await??;
    assert!(
        outcomes.iter().all(|o| *o == RenewOutcome::Renewed),
        "every held lease renewed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_server_is_sent_the_scripts_once_per_loss_however_many_calls_meet_it()
-> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let held = hold(&backend, "held", 1000).await?;

    // Acquisitions, renewals and reads at once: calls of several scripts
    // meet NOSCRIPT together, over both of the backend's connections.
    flush_scripts(&server)?;
    let inspected: Vec<_> = held.iter().take(200).map(|r| r.key.clone()).collect();
    let (acquired, renewed, read) = tokio::join!(
        acquire_together(&backend, "burst", 2000),
        renew_together(&backend, &held),
        tokio::time::timeout(
            Duration::from_secs(30),
            try_join_all(inspected.iter().map(|k| backend.inspect(k)))
        ),
    );
    acquired?;
    renewed?;
    assert!(read??.iter().all(Option::is_some), "every held lease read");
    loaded_once(&server, "first loss")?;

    // A later loss is noticed, and loaded for, again.
    flush_scripts(&server)?;
    let (acquired, renewed) = tokio::join!(
        acquire_together(&backend, "again", 2000),
        renew_together(&backend, &held),
    );
    acquired?;
    renewed?;
    loaded_once(&server, "second loss")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_renew_through_a_restart_with_one_load_of_the_scripts() -> TestResult {
    // Append-only with fsync always: the leases survive the restart, the
    // script cache does not.
    let mut server = RedisServer::builder().appendonly(true).start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let held = hold(&backend, "held", 1000).await?;
    server.restart()?;

    // Renewals, acquisitions and reads at once, so that calls of several
    // scripts meet NOSCRIPT together. The first calls after the restart
    // may meet the broken connection; each is retried (for at most 5 s)
    // until it reaches the new process.
    let fresh: Vec<AcquireRequest> = (0..1000)
        .map(|i| AcquireRequest::new(key(&format!("fresh:{i}")), holder(), ttl("1h")))
        .collect();
    let (renewed, acquired, read) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(
            try_join_all(held.iter().map(|r| retry_transient(|| backend.renew(r)))),
            try_join_all(
                fresh
                    .iter()
                    .map(|r| retry_transient(|| backend.try_acquire(r)))
            ),
            try_join_all(
                held.iter()
                    .take(200)
                    .map(|r| retry_transient(|| backend.inspect(&r.key)))
            ),
        )
    })
    .await?;
    assert!(
        renewed?.iter().all(|o| *o == RenewOutcome::Renewed),
        "every lease renewed through the restart"
    );
    assert!(
        acquired?
            .iter()
            .all(|o| matches!(o, AcquireOutcome::Acquired(_))),
        "every free lease granted after the restart"
    );
    assert!(read?.iter().all(Option::is_some), "every held lease read");
    // The restarted process counts from zero.
    loaded_once(&server, "after the restart")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_cluster_node_alone_is_sent_the_scripts_once() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    let held = hold(&backend, "held", 1000).await?;
    let flushed = &cluster.nodes()[0];
    assert_eq!(flushed.cli(&["SCRIPT", "FLUSH"])?, "OK");
    for node in cluster.nodes() {
        assert_eq!(node.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    }
    // Acquisitions and renewals at once, each slot's in its own calls.
    let (acquired, renewed) = tokio::join!(
        acquire_together(&backend, "job", 2000),
        renew_together(&backend, &held),
    );
    acquired?;
    renewed?;
    for node in cluster.nodes() {
        assert!(
            stat(node, "commandstats", "cmdstat_evalsha", "calls")? > 0,
            "node {} served acquisitions",
            node.port()
        );
        if node.port() == flushed.port() {
            loaded_once(node, "the flushed node")?;
        } else {
            assert_eq!(
                (loads(node)?, noscripts(node)?),
                (0, 0),
                "nothing loaded on node {}, which kept its scripts",
                node.port()
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_dropped_while_the_scripts_load_leave_no_load_stuck() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let op_timeout = Duration::from_millis(300);
    let backend = RedisBackend::builder(proxy.url())
        .op_timeout(op_timeout)
        .connect()
        .await?;
    let held = hold(&backend, "held", 50).await?;

    // 100 ms each way: NOSCRIPT comes back after 200 ms and the load would
    // take 200 ms more, so every call is dropped by its op timeout while
    // it waits for the load.
    flush_scripts(&server)?;
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(100)));
    let outcomes = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(held.iter().map(|r| backend.renew(r))),
    )
    .await?;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Err(BackendError::Timeout { .. }))),
        "every call timed out: {outcomes:?}"
    );
    // Let the abandoned load reach the server, so that it is not counted
    // below (and cannot stand in for the load the next loss needs).
    tokio::time::sleep(Duration::from_millis(500)).await;

    // With the scripts lost again, later calls are not held up by the
    // abandoned load: they get their replies.
    proxy.set_mode(ProxyMode::Pass);
    flush_scripts(&server)?;
    renew_together(&backend, &held).await?;
    acquire_together(&backend, "after", 200).await?;
    loaded_once(&server, "the loss after the abandoned load")?;
    Ok(())
}

/// `EVALSHA`s the server has run since its counters were reset.
fn evalshas(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    stat(server, "commandstats", "cmdstat_evalsha", "calls")
}

/// An error reply other than `NOSCRIPT` (a key of another type) is the
/// call's answer: no script is loaded for it and it is not sent again.
#[tokio::test]
async fn an_error_reply_other_than_noscript_is_not_sent_again() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let wrong = key("a-hash");
    let stored = backend.layout().lease(&wrong);
    server.cli(&["HSET", &stored, "field", "value"])?;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let refused = tokio::time::timeout(Duration::from_secs(10), backend.inspect(&wrong)).await?;
    assert!(
        matches!(refused, Err(BackendError::WrongType { .. })),
        "{refused:?}"
    );
    assert_eq!(evalshas(&server)?, 1, "sent once");
    assert_eq!(loads(&server)?, 0, "no script loaded for it");
    Ok(())
}

/// A server that loses the scripts faster than they can be loaded (here
/// two connections sending `SCRIPT FLUSH` without pause) does not keep a
/// call sending and loading until its op timeout: the call is sent three
/// times at most, with two loads between, and then fails with the server's
/// `NOSCRIPT`, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_meets_noscript_after_every_load_gives_up_after_three_sends() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .op_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let k = key("flushed");
    // Each flusher keeps four pipelines of 500 `SCRIPT FLUSH` in flight,
    // so that the server always has flushes to read.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let client = leasehold_redis::redis::Client::open(server.url())?;
    let mut flushes = leasehold_redis::redis::pipe();
    for _ in 0..500 {
        flushes.cmd("SCRIPT").arg("FLUSH").ignore();
    }
    let mut flushers = Vec::new();
    for _ in 0..2 {
        // No response timeout: under load a pipeline of flushes may take
        // longer than the client's default half second.
        let config =
            leasehold_redis::redis::AsyncConnectionConfig::new().set_response_timeout(None);
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let (stop, flushes) = (std::sync::Arc::clone(&stop), flushes.clone());
        flushers.push(tokio::spawn(async move {
            let mut in_flight = futures_util::stream::FuturesUnordered::new();
            loop {
                while in_flight.len() < 4 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (mut conn, flushes) = (conn.clone(), flushes.clone());
                    in_flight.push(async move { flushes.query_async::<()>(&mut conn).await });
                }
                match in_flight.next().await {
                    Some(sent) => sent?,
                    None => return Ok::<_, leasehold_redis::redis::RedisError>(()),
                }
            }
        }));
    }
    // The storm is on before the call is sent.
    tokio::time::timeout(Duration::from_secs(10), async {
        while stat(&server, "commandstats", "cmdstat_script|flush", "calls")? < 1000 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await??;
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let outcome = tokio::time::timeout(Duration::from_secs(10), backend.inspect(&k)).await?;
    let (sent, loaded) = (evalshas(&server)?, loads(&server)?);
    let flushed = stat(&server, "commandstats", "cmdstat_script|flush", "calls")?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for flusher in flushers {
        tokio::time::timeout(Duration::from_secs(10), flusher).await???;
    }
    eprintln!("{sent} EVALSHAs, {loaded} SCRIPT LOADs, {flushed} flushes: {outcome:?}");
    assert!(flushed > 0, "the storm went on through the call");
    assert!(
        (1..=3).contains(&sent) && loaded < sent,
        "{sent} sends and {loaded} loads: three sends at most, a load between two"
    );
    // Almost always the third send meets NOSCRIPT too; a load that came
    // between two flushes lets the call through, which is no failure.
    match outcome {
        Ok(info) => assert_eq!(info, None, "nothing was stored"),
        Err(err) => assert!(
            !matches!(err, BackendError::Timeout { .. }) && err.to_string().contains("NOSCRIPT"),
            "the server's NOSCRIPT, by name: {err}"
        ),
    }
    Ok(())
}
