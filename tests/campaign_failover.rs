//! The fault campaign through failovers, on Redis Cluster and behind
//! Sentinel: many lease clients, a recorded history, and a checker that
//! judges it.
//!
//! Cluster faults come from `FaultPlan::draw_cluster`: kills of a master
//! after a replication lag (its replica frozen meanwhile, so the promoted
//! replica lacks the lag's writes: leases are really lost) and manual
//! `CLUSTER FAILOVER`s (which lose nothing). Sentinel faults from
//! `FaultPlan::draw_sentinel`: kills of the master after a lag, the same
//! way. Each is applied once the previous one has healed (every replica
//! linked again).
//!
//! CI size (both topologies at once, about 70 s): `cargo test --test
//! campaign_failover -- --nocapture`; a long run with
//! `LEASEHOLD_CAMPAIGN_SECS=600 cargo test --release --test
//! campaign_failover -- --nocapture`, replayed with
//! `LEASEHOLD_CAMPAIGN_SEED=<seed printed by it>`.

mod common;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::campaign_client::{Client, Tally, TestResult, client};
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{LeaseKey, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::{
    Fault, FaultPlan, History, PlanShape, RedisCluster, RedisServer, Report, SentinelSet,
    fault_length,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Lease ttl: long enough for a lease to outlive a failover (2–3 s after a
/// master is killed), so that a lease lost with its master is still
/// believed held when the promoted replica serves its slot.
const TTL: Duration = Duration::from_secs(4);
const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// Scheduling of the watchdog and the recording task, on a 2-core machine
/// running six cluster nodes and the clients.
const SCHEDULING_ALLOWANCE: Duration = Duration::from_millis(50);
/// The longest a failover and the rejoining of the old master may take.
const HEAL_TIMEOUT: Duration = Duration::from_secs(30);

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Applied {
    fault: Fault,
    began: Instant,
    healed: Instant,
}

/// The deployment a campaign runs on.
enum Target {
    Cluster(RedisCluster),
    Sentinel(SentinelSet),
}

impl Target {
    fn url(&self) -> String {
        match self {
            Self::Cluster(cluster) => cluster.url(),
            Self::Sentinel(set) => set.url(),
        }
    }

    fn kinds(&self) -> &'static [&'static str] {
        match self {
            Self::Cluster(_) => &Fault::CLUSTER_KINDS,
            Self::Sentinel(_) => &Fault::SENTINEL_KINDS,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failovers() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 1))?;
    let applied = campaign(Target::Cluster(cluster), FaultPlan::draw_cluster).await?;
    assert!(
        applied.iter().any(|a| a.fault == Fault::ClusterFailover),
        "no manual failover was applied"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failovers() -> TestResult {
    // 1500 ms: with 1000 the sentinels sometimes fail a just-promoted
    // master over again.
    let set = tokio::task::block_in_place(|| {
        SentinelSet::start_with_down_after(Duration::from_millis(1500))
    })?;
    let applied = campaign(Target::Sentinel(set), FaultPlan::draw_sentinel).await?;
    assert!(!applied.is_empty(), "no failover was applied");
    Ok(())
}

/// Runs a campaign on `target` with faults drawn by `draw`; returns the
/// faults applied, after asserting the verdicts.
async fn campaign(
    mut target: Target,
    draw: fn(u64, PlanShape) -> FaultPlan,
) -> Result<Vec<Applied>, Box<dyn std::error::Error + Send + Sync>> {
    let run_for = Duration::from_secs(env_u64("LEASEHOLD_CAMPAIGN_SECS", 60));
    let seed = env_u64(
        "LEASEHOLD_CAMPAIGN_SEED",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_secs()),
    );
    let clients = usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_CLIENTS", 4))?.max(1);
    let keys = usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_KEYS", 3))?.max(1);
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(TTL)?)
        .wait(TTL)
        .name("campaign")
        .build()?;
    let renew_interval = options.renew_interval();
    let plan = draw(
        seed,
        PlanShape {
            run_for,
            clients,
            ttl: TTL,
            renew_interval,
        },
    );
    println!(
        "campaign on {}: seed {seed}, {clients} clients x {keys} keys for {run_for:?}, {} faults planned",
        target.kinds()[0],
        plan.faults.len()
    );
    let resource = RedisServer::start()?;
    let mut managers = Vec::new();
    for _ in 0..clients {
        let backend = RedisBackend::builder(target.url())
            .op_timeout(OP_TIMEOUT)
            .connect_timeout(OP_TIMEOUT)
            .connect()
            .await?;
        managers.push(LeaseManager::new(backend)?);
    }
    let history = History::new();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, manager) in managers.iter().enumerate() {
        let conn = redis::Client::open(resource.url())?
            .get_multiplexed_async_connection()
            .await?;
        tasks.push(tokio::spawn(client(Client {
            name: format!("c{i}"),
            manager: manager.clone(),
            options: options.clone(),
            keys,
            history: history.clone(),
            tally: Arc::clone(&tally),
            resource: conn,
            stop: stop.clone(),
            rng: fastrand::Rng::with_seed(seed.wrapping_add(i as u64 + 1)),
        })));
    }

    let mut rng = fastrand::Rng::with_seed(seed);
    let mut applied = Vec::new();
    for scheduled in &plan.faults {
        if started + scheduled.at + fault_length(&scheduled.fault) + TTL > started + run_for {
            break; // the failovers before took longer than planned
        }
        tokio::time::sleep_until(started + scheduled.at).await;
        let began = Instant::now();
        let detail = match &mut target {
            Target::Cluster(cluster) => apply(&scheduled.fault, cluster, keys, &mut rng).await?,
            Target::Sentinel(set) => fail_over(&scheduled.fault, set).await?,
        };
        let healed = Instant::now();
        println!(
            "  {:>6.2}s {} ({detail}; healed after {:.2}s)",
            (began - started).as_secs_f64(),
            scheduled.fault,
            (healed - began).as_secs_f64()
        );
        applied.push(Applied {
            fault: scheduled.fault,
            began,
            healed,
        });
    }
    tokio::time::sleep_until((started + run_for).max(Instant::now() + TTL)).await;
    stop.cancel();
    for task in tasks {
        task.await??;
    }
    for manager in &managers {
        manager.shutdown().await;
    }

    let mut conn = redis::Client::open(resource.url())?
        .get_multiplexed_async_connection()
        .await?;
    for k in 0..keys {
        let log: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("res:{k}:log"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        for entry in log {
            let (token, holder) = entry.split_once(':').ok_or("malformed log entry")?;
            history.resource_accepted(format!("key{k}"), holder, token.parse()?);
        }
    }
    let report = history.check();
    let tally = std::mem::take(&mut *tally.lock().map_err(|_| "tally poisoned")?);
    let (allowed, forbidden) = judge(&report, &applied, renew_interval);
    println!(
        "{}",
        summary(
            &report,
            &applied,
            &tally,
            &allowed,
            forbidden.len(),
            target.kinds()
        )
    );

    assert!(
        report.holds >= 10,
        "too few leases to judge anything: {report}"
    );
    assert!(
        report.stale_writes.is_empty(),
        "the fenced resource accepted stale writes: {:?}",
        report.stale_writes
    );
    assert!(
        report.token_violations.is_empty(),
        "fencing tokens did not increase: {:?}",
        report.token_violations
    );
    assert!(
        forbidden.is_empty(),
        "holders overlapped outside a kill after a lag, or for longer than a renew interval after one (seed {seed}): {forbidden:#?}"
    );
    assert!(
        tally.deadline_margins.iter().all(|m| !m.is_zero()),
        "a token fired by deadline at or after the lease's earliest expiry"
    );
    Ok(applied)
}

/// A Sentinel failover after a lag, healed when the old master is a
/// linked replica of the new one.
async fn fail_over(
    fault: &Fault,
    set: &mut SentinelSet,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let Fault::SentinelFailover(lag) = fault else {
        return Err(format!("the Sentinel campaign cannot apply {fault}").into());
    };
    // Frozen and its link cut, as for the Cluster kill.
    tokio::task::block_in_place(|| {
        set.replica_mut().pause()?;
        set.master().cli(&["CLIENT", "KILL", "TYPE", "replica"])
    })?;
    tokio::time::sleep(*lag).await;
    let (promoted, rejoined) = tokio::task::block_in_place(|| {
        set.kill_master()?;
        set.replica_mut().resume()?;
        let promoted = set.wait_for_failover()?;
        set.restart_old_master()
            .map(|rejoined| (promoted, rejoined))
    })?;
    Ok(format!(
        "promoted after {:.2}s, old master linked {:.2}s later",
        promoted.as_secs_f64(),
        rejoined.as_secs_f64()
    ))
}

/// Applies one Cluster fault to the master serving one of the campaign's
/// `keys` (so that the fault meets leases) and waits until the cluster has
/// healed. Returns which nodes it touched.
async fn apply(
    fault: &Fault,
    cluster: &mut RedisCluster,
    keys: usize,
    rng: &mut fastrand::Rng,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let key = format!("key{}", rng.usize(..keys));
    let stored = KeyLayout::default().lease(&LeaseKey::new(&key)?);
    let (master, replica) = tokio::task::block_in_place(|| {
        let master = cluster.master_of_slot(cluster.keyslot(&stored)?)?;
        cluster.replica_of(master).map(|replica| (master, replica))
    })?;
    match fault {
        Fault::ClusterFailover => {
            tokio::task::block_in_place(|| cluster.failover(replica))?;
        }
        Fault::ClusterKill(lag) => {
            // Frozen, and its link cut (else the kernel would buffer the
            // lag's writes on the replica's socket and it would read them
            // on resume): the master's writes of the lag never reach it.
            tokio::task::block_in_place(|| {
                cluster.node_mut(replica).pause()?;
                cluster.nodes()[master].cli(&["CLIENT", "KILL", "TYPE", "replica"])
            })?;
            tokio::time::sleep(*lag).await;
            tokio::task::block_in_place(|| {
                cluster.node_mut(master).kill()?;
                cluster.node_mut(replica).resume()
            })?;
            // Promoted, and serving every slot again.
            tokio::task::block_in_place(|| cluster.wait_until_healthy(HEAL_TIMEOUT))?;
            // The old master rejoins as a replica of the promoted one; its
            // data is replaced by a full sync.
            tokio::task::block_in_place(|| {
                cluster.node_mut(master).restart()?;
                cluster.wait_until_healthy(HEAL_TIMEOUT)
            })?;
        }
        other => return Err(format!("the cluster campaign cannot apply {other}").into()),
    }
    Ok(format!(
        "{key} on master node {master}, replica node {replica}"
    ))
}

/// Overlaps are allowed only after a kill that lost data: the earlier hold
/// predates the heal, the later began after the kill and within a ttl of
/// the heal, and the earlier holder's token fired within one renew
/// interval (plus scheduling) of the later acquisition.
fn judge(
    report: &Report,
    applied: &[Applied],
    renew_interval: Duration,
) -> (Vec<(usize, Duration)>, Vec<leasehold_testkit::Overlap>) {
    let (mut allowed, mut forbidden) = (Vec::new(), Vec::new());
    for overlap in &report.overlaps {
        let cause = applied.iter().position(|a| {
            a.fault.loses_data()
                && overlap.earlier.acquired_at < a.healed
                && overlap.later.acquired_at >= a.began
                && overlap.later.acquired_at <= a.healed + TTL
        });
        match cause {
            Some(i) if overlap.duration <= renew_interval + SCHEDULING_ALLOWANCE => {
                allowed.push((i, overlap.duration));
            }
            _ => forbidden.push(overlap.clone()),
        }
    }
    (allowed, forbidden)
}

fn summary(
    report: &Report,
    applied: &[Applied],
    tally: &Tally,
    allowed: &[(usize, Duration)],
    forbidden: usize,
    kinds: &[&str],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "history: {report}");
    let _ = writeln!(out, "losses by reason: {:?}", tally.losses);
    let _ = writeln!(
        out,
        "deadline losses: {}, worst token-to-expiry margin {:?}",
        tally.deadline_margins.len(),
        tally.deadline_margins.iter().min()
    );
    let _ = writeln!(
        out,
        "| fault | injected | overlaps | worst overlap |\n|---|---|---|---|"
    );
    for &kind in kinds {
        let injected = applied.iter().filter(|a| a.fault.kind() == kind).count();
        let overlaps: Vec<Duration> = allowed
            .iter()
            .filter(|(i, _)| applied[*i].fault.kind() == kind)
            .map(|(_, d)| *d)
            .collect();
        let _ = writeln!(
            out,
            "| {kind} | {injected} | {} | {:?} |",
            overlaps.len(),
            overlaps.iter().max().copied().unwrap_or_default()
        );
    }
    let _ = writeln!(out, "forbidden overlaps: {forbidden}");
    out
}
