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
//! campaign_failover -- --nocapture`, one fresh seed per topology (or
//! `LEASEHOLD_CAMPAIGN_SEED=<seed>`; with `LEASEHOLD_CAMPAIGN_SEEDS=a,b` the
//! first); a long run with `LEASEHOLD_CAMPAIGN_SECS=600 cargo test
//! --release --test campaign_failover -- --nocapture`.
//!
//! A token fired by deadline is judged by the server: a side connection
//! (a backend of its own, straight to the deployment) reads the lease at
//! once. There is no MONITOR witness here (the nodes change roles), so
//! the grant order comes from the holders' own records only.

mod common;

use std::fmt::Write as _;
use std::time::Duration;

use common::campaign_client::{
    Applied, Clients, Probe, Settings, Side, Tally, TestResult, assert_sound, seeds, wall_us,
};
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{LeaseKey, LeaseManager};
use leasehold_testkit::{
    Fault, FaultPlan, History, PlanShape, RedisCluster, RedisServer, Report, SentinelSet,
    fault_length,
};
use tokio::time::Instant;

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
    // One seed per topology: the two run in parallel for a minute each.
    let seed = seeds(&[])?.first().copied().ok_or("no seed")?;
    let settings = Settings::from_env(seed, TTL, 60, 3)?;
    let (clients, keys, run_for) = (settings.clients, settings.keys, settings.run_for);
    let renew_interval = settings.renew_interval();
    let plan = settings.plan(draw);
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
    let side = RedisBackend::builder(target.url())
        .op_timeout(OP_TIMEOUT)
        .connect_timeout(OP_TIMEOUT)
        .connect()
        .await?;
    let history = History::new();
    let running = Clients::start(
        &settings,
        &managers,
        &resource,
        &history,
        Side::Backend(side),
    )
    .await?;
    let started = running.started;

    let mut rng = fastrand::Rng::with_seed(seed);
    let mut applied = Vec::new();
    let mut skipped = Vec::new();
    for scheduled in &plan.faults {
        let due = (started + scheduled.at).max(Instant::now());
        if due + fault_length(&scheduled.fault) + TTL > started + run_for {
            // The failovers before took longer than planned.
            println!("  skipped (the run fell behind): {}", scheduled.fault);
            skipped.push(scheduled.fault);
            continue;
        }
        tokio::time::sleep_until(started + scheduled.at).await;
        let (began, began_us) = (Instant::now(), wall_us());
        let detail = match &mut target {
            Target::Cluster(cluster) => apply(&scheduled.fault, cluster, keys, &mut rng).await,
            Target::Sentinel(set) => fail_over(&scheduled.fault, set).await,
        }
        .map_err(|e| format!("seed {seed}: {e}"))?;
        let (healed, healed_us) = (Instant::now(), wall_us());
        println!(
            "  {:>6.2}s {} ({detail}; healed after {:.2}s)",
            (began - started).as_secs_f64(),
            scheduled.fault,
            (healed - began).as_secs_f64()
        );
        let a = Applied {
            fault: scheduled.fault,
            began,
            healed,
            began_us,
            healed_us,
        };
        a.declare_loss(&history, TTL, renew_interval + SCHEDULING_ALLOWANCE);
        applied.push(a);
    }
    tokio::time::sleep_until((started + run_for).max(Instant::now() + TTL)).await;
    let (report, tally) = running.finish(&managers, &resource, keys, None).await?;
    let (allowed, forbidden) = judge(&report, &applied, renew_interval);
    println!(
        "seed {seed}: {}",
        summary(
            &report,
            &applied,
            &skipped,
            &tally,
            &allowed,
            forbidden.len(),
            target.kinds()
        )
    );

    assert_sound(&report, seed);
    // A lease that was not lost with a failover's data must still be on
    // the server when its token fires: a side connection finds it there.
    // With no witness of the server's expiry here, a lease seen gone is
    // judged by the margin the holder keeps: the server must keep it at
    // least the safety margin after the token fired, so gone within it is a
    // lease lost too early. Gone only later proves nothing (it may have
    // expired by then), nor does a probe with no answer (a side connection
    // reconnecting after a failover, a loaded machine).
    let margin = settings.options.safety_margin();
    let (mut unproven, mut present, mut inconclusive) = (Vec::new(), 0, 0);
    for f in tally.deadlines().filter(|f| {
        !applied
            .iter()
            .any(|a| f.acquired_at < a.healed && f.at > a.began)
    }) {
        match f.probe {
            Probe::Present(_) => present += 1,
            Probe::Gone(after) if after < margin => {
                unproven.push((f.key.clone(), f.token, f.probe))
            }
            Probe::Gone(_) | Probe::Unanswered => inconclusive += 1,
        }
    }
    println!(
        "  tokens fired by deadline outside failovers: {present} leases present, {} gone within the safety margin of {margin:?}, {inconclusive} inconclusive (gone only after it, or unanswered)",
        unproven.len()
    );
    assert!(
        unproven.is_empty(),
        "seed {seed}: tokens fired by deadline outside any failover, yet a side connection found the lease gone within the safety margin ({margin:?}) after: {unproven:?}"
    );
    for a in &applied {
        if a.fault.loses_data() {
            // The lag's writes are lost with the master: some lease must
            // have been renewed in them, so some holder must learn of it.
            let ended = tally
                .fired
                .iter()
                .filter(|f| f.acquired_at < a.healed && f.at > a.began)
                .count();
            println!("  {}: {ended} leases ended by it", a.fault);
        }
    }
    assert!(
        forbidden.is_empty(),
        "holders overlapped outside a kill after a lag, or for longer than a renew interval after one (seed {seed}): {forbidden:#?}"
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
    // Frozen and its link cut, as for the Cluster kill. A mark written
    // meanwhile shows that the lag's writes were really lost.
    let mark = format!("campaign:lag:{}", fastrand::u64(..));
    tokio::task::block_in_place(|| {
        set.replica_mut().pause()?;
        set.master().cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        set.master().cli(&["SET", &mark, "1"])
    })?;
    tokio::time::sleep(*lag).await;
    let (promoted, kept, rejoined) = tokio::task::block_in_place(|| {
        set.kill_master()?;
        set.replica_mut().resume()?;
        let promoted = set.wait_for_failover()?;
        let kept = set.master().cli(&["EXISTS", &mark])?;
        set.restart_old_master()
            .map(|rejoined| (promoted, kept, rejoined))
    })?;
    if kept != "0" {
        return Err(format!(
            "{fault}: the promoted replica has the lag's write {mark}: nothing was lost"
        )
        .into());
    }
    Ok(format!(
        "promoted after {:.2}s without the lag's writes, old master linked {:.2}s later",
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
    // A mark in the key's slot, written on its master just before the
    // fault: the promoted replica must have it after a manual failover,
    // and must lack it after a kill after a lag.
    let mark = format!("{{{key}}}:lag:{}", rng.u64(..));
    match fault {
        Fault::ClusterFailover => {
            let kept = tokio::task::block_in_place(|| {
                cluster.nodes()[master].cli(&["SET", &mark, "1"])?;
                cluster.failover(replica)?;
                cluster.nodes()[replica].cli(&["EXISTS", &mark])
            })?;
            if kept != "1" {
                return Err(format!("{fault}: the promoted replica lacks {mark}").into());
            }
        }
        Fault::ClusterKill(lag) => {
            // Frozen, and its link cut (else the kernel would buffer the
            // lag's writes on the replica's socket and it would read them
            // on resume): the master's writes of the lag never reach it.
            tokio::task::block_in_place(|| {
                cluster.node_mut(replica).pause()?;
                cluster.nodes()[master].cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
                cluster.nodes()[master].cli(&["SET", &mark, "1"])
            })?;
            tokio::time::sleep(*lag).await;
            tokio::task::block_in_place(|| {
                cluster.node_mut(master).kill()?;
                cluster.node_mut(replica).resume()
            })?;
            // Promoted, and serving every slot again.
            tokio::task::block_in_place(|| cluster.wait_until_healthy(HEAL_TIMEOUT))?;
            let kept =
                tokio::task::block_in_place(|| cluster.nodes()[replica].cli(&["EXISTS", &mark]))?;
            if kept != "0" {
                return Err(format!(
                    "{fault}: the promoted replica has the lag's write {mark}: nothing was lost"
                )
                .into());
            }
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
        "{key} on master node {master}, replica node {replica}; the lag's mark {} the promotion",
        if fault.loses_data() {
            "lost in"
        } else {
            "kept through"
        }
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
    skipped: &[Fault],
    tally: &Tally,
    allowed: &[(usize, Duration)],
    forbidden: usize,
    kinds: &[&str],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "history: {report}");
    let _ = writeln!(out, "losses by reason: {:?}", tally.losses);
    let probes: Vec<Probe> = tally.deadlines().map(|f| f.probe).collect();
    let _ = writeln!(
        out,
        "deadline losses: {}; side connection right after: {} present (smallest lower bound on the margin {:?}), {} gone, {} unanswered",
        probes.len(),
        probes
            .iter()
            .filter(|p| matches!(p, Probe::Present(_)))
            .count(),
        probes
            .iter()
            .filter_map(|p| match p {
                Probe::Present(d) => Some(*d),
                _ => None,
            })
            .min(),
        probes
            .iter()
            .filter(|p| matches!(p, Probe::Gone(_)))
            .count(),
        probes
            .iter()
            .filter(|p| matches!(p, Probe::Unanswered))
            .count(),
    );
    let _ = writeln!(
        out,
        "| fault | injected | skipped | overlaps | worst overlap |\n|---|---|---|---|---|"
    );
    for &kind in kinds {
        let injected = applied.iter().filter(|a| a.fault.kind() == kind).count();
        let skip = skipped.iter().filter(|f| f.kind() == kind).count();
        let overlaps: Vec<Duration> = allowed
            .iter()
            .filter(|(i, _)| applied[*i].fault.kind() == kind)
            .map(|(_, d)| *d)
            .collect();
        let _ = writeln!(
            out,
            "| {kind} | {injected} | {skip} | {} | {:?} |",
            overlaps.len(),
            overlaps.iter().max().copied().unwrap_or_default()
        );
    }
    let _ = writeln!(out, "forbidden overlaps: {forbidden}");
    out
}
