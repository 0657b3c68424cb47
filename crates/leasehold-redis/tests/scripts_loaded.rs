//! Scripts are loaded on every server at connect, so that many calls sent
//! at once on a fresh connection meet no `NOSCRIPT` (each would load its
//! script again): judged by the servers' own `INFO errorstats` and
//! `INFO commandstats`.

mod common;

use std::time::Duration;

use common::{TestResult, holder, key, ttl};
use futures_util::future::try_join_all;
use leasehold_core::{AcquireOutcome, AcquireRequest, LeaseBackend};
use leasehold_redis::RedisBackend;
use leasehold_testkit::{RedisCluster, RedisServer};

/// A counter of `INFO <section>`, 0 when the line is absent (a count never
/// incremented); a server that cannot be asked fails the test rather than
/// read as 0.
fn stat(
    server: &RedisServer,
    section: &str,
    line: &str,
    field: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let info = server.cli(&["INFO", section])?;
    let Some(rest) = info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{line}:")))
    else {
        return Ok(0);
    };
    rest.split(',')
        .find_map(|kv| kv.strip_prefix(&format!("{field}=")))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no {field} in {line}: {rest}").into())
}

async fn acquire_together(backend: &RedisBackend, prefix: &str, count: usize) -> TestResult {
    let requests: Vec<AcquireRequest> = (0..count)
        .map(|i| AcquireRequest::new(key(&format!("{prefix}:{i}")), holder(), ttl("30s")))
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
