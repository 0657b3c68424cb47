//! A batch job holding a few leases, with its lease metrics served to
//! Prometheus on `http://127.0.0.1:9184/metrics`.
//!
//! Run with `cargo run --example prometheus`, then
//! `curl -s http://127.0.0.1:9184/metrics`.
//!
//! It uses the Redis at `LEASEHOLD_REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` if one is installed; otherwise it runs on the
//! in-process `MemoryBackend` and says so. `LEASEHOLD_METRICS_ADDR` changes
//! the listening address, and `LEASEHOLD_SERVE_SECS` how long the metrics
//! stay up after the jobs are done (default 60 s).
//!
//! The jobs, a few seconds in all, end their leases in four ways: three workers take turns on one report (released), a billing run
//! reaches its renewal cap, an operator deletes a cache warmer's lease
//! (lost), a scratch lease is dropped, and a scheduler's election has a
//! leader while the metrics are served.
//!
//! Its Cargo lines: `leasehold = { version = "0.1", features = ["prometheus"] }`
//! and `metrics-exporter-prometheus = "0.18"`.
//!
//! deploy/prometheus/leasehold-rules.yml (alert rules) and
//! deploy/grafana/leasehold.json (a dashboard) read these metrics; see
//! docs/operations.md, "Alerts and dashboard".

mod common;

use common::Store;
use std::net::SocketAddr;
use std::time::Duration;

use leasehold::backend::LeaseBackend;
use leasehold::metrics::install_prometheus_buckets;
use leasehold::redis::RedisBackend;
use leasehold::{Election, LeaseKey, LeaseManager, LeaseOptions, MemoryBackend, Ttl};
use metrics_exporter_prometheus::PrometheusBuilder;
use tracing::info;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing("info");

    let addr: SocketAddr = std::env::var("LEASEHOLD_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9184".to_owned())
        .parse()?;
    // Installed before the first manager, which describes the metrics to it,
    // with leasehold's histogram buckets (feature `prometheus`), which the
    // shipped rules and dashboard read.
    install_prometheus_buckets(PrometheusBuilder::new().with_http_listener(addr))?.install()?;
    info!("serving metrics on http://{addr}/metrics");

    let store = common::choose_store();
    match &store {
        Store::Redis { url, .. } => {
            let backend = RedisBackend::connect(url.as_str()).await?;
            let operator = backend.clone();
            jobs(backend, move |key| {
                let operator = operator.clone();
                async move { Ok(operator.force_release(&key).await?) }
            })
            .await?;
        }
        Store::Memory => {
            let backend = MemoryBackend::new();
            let operator = backend.clone();
            jobs(backend, move |key| {
                let deleted = operator.vanish(&key);
                async move { Ok(deleted) }
            })
            .await?;
        }
    }
    Ok(())
}

async fn jobs<B, F>(
    backend: B,
    delete: impl Fn(LeaseKey) -> F,
) -> Result<(), Box<dyn std::error::Error>>
where
    B: LeaseBackend,
    F: Future<Output = Result<bool, Box<dyn std::error::Error>>>,
{
    let manager = LeaseManager::new(backend)?;
    let ttl = Ttl::parse("600ms")?;
    // The scheduler's election, under a name of its own so that the
    // leaderless alert can watch it; this process is its only candidate.
    let scheduler = LeaseOptions::builder()
        .ttl(ttl)
        .name("scheduler")
        .label("example-0")
        .build()?;
    let election = Election::new(manager.clone(), "scheduler:leader", scheduler)?;
    let leader = election.campaign().await?;

    // Three workers take turns on one report: each waits for the lease,
    // works 1.2 s and releases it.
    let report = LeaseOptions::builder()
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .name("nightly-report")
        .build()?;
    let workers = (1..=3).map(|n| {
        let manager = manager.clone();
        let report = report.clone();
        async move {
            let lease = manager.acquire("reports:nightly", &report).await?;
            info!(worker = n, fencing_token = %lease.fencing_token(), "report lease acquired");
            tokio::time::sleep(Duration::from_millis(1200)).await;
            lease.release().await?;
            Ok::<_, leasehold::LeaseError>(())
        }
    });

    // A billing run capped at 3 renewals: its token fires before the last
    // renewal's validity ends.
    let billing = LeaseOptions::builder()
        .ttl(ttl)
        .max_renewals(3)
        .name("billing-close")
        .build()?;
    let capped = async {
        let lease = manager.acquire("billing:2026-11", &billing).await?;
        let reason = lease.lost().await;
        info!(%reason, "billing lease ended");
        lease.release().await?;
        Ok::<_, leasehold::LeaseError>(())
    };

    // A cache warmer whose lease an operator deletes after 1 s.
    let warmer = LeaseOptions::builder()
        .ttl(ttl)
        .name("cache-warmer")
        .build()?;
    let warmer = manager.acquire("cache:warm", &warmer).await?;
    let sabotage = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        delete(LeaseKey::new("cache:warm")?).await?;
        let reason = warmer.lost().await;
        info!(%reason, "cache warmer lease ended");
        Ok::<_, Box<dyn std::error::Error>>(())
    };

    // A scratch lease dropped without release: released in the background.
    let scratch = LeaseOptions::builder().ttl(ttl).name("scratch").build()?;
    drop(manager.acquire("scratch:tmp", &scratch).await?);

    let (workers, capped, sabotage) =
        tokio::join!(futures_util::future::join_all(workers), capped, sabotage);
    workers.into_iter().collect::<Result<Vec<()>, _>>()?;
    capped?;
    sabotage?;
    drop(warmer);

    let serve = std::env::var("LEASEHOLD_SERVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    info!(
        "jobs done; the leader lease is still held. Serving metrics for {serve} s more (Ctrl-C stops)"
    );
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(serve)) => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    leader.release().await?;
    drop(election);
    manager.shutdown().await;
    Ok(())
}
