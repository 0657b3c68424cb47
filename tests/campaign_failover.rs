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
//! linked again). A lag lasts its drawn length and, if need be, until the
//! master has granted a lease in it (at most a ttl more), so that the kill
//! takes a lease away from a holder that believes in it.
//!
//! Each topology runs its fixed seeds and then a fresh one (or
//! `LEASEHOLD_CAMPAIGN_SEED=<seed>`, `LEASEHOLD_CAMPAIGN_SEEDS=a,b`), for
//! 30 s each (`LEASEHOLD_CAMPAIGN_SECS`); both topologies at once, about
//! 80 s: `cargo test --test campaign_failover -- --nocapture`.
//!
//! Every data node has a MONITOR witness, read on a connection of its own
//! and attached again when a killed node comes back (on a Sentinel set, by
//! itself the moment a sentinel's reconfiguration cuts it, with a check
//! that no client wrote a lease there meanwhile): the grants and
//! renewals each node made, with its own timestamps, ordered by the host
//! clock all the nodes read. From it come the verdicts on grant order and
//! stale writes, and the lag's grants: every lease a node granted after
//! its replica's link was cut and before it was killed is gone from the
//! promoted replica, and its holder must stop believing in it before the
//! deadline its last possible renewal allows (the kill plus the ttl, less
//! the safety margin and the drift allowance). Each topology's run must
//! see at least one such lease ended by its holder's token.
//!
//! A token fired by deadline outside a failover is also judged by a side
//! connection (a backend of its own, straight to the deployment) that reads
//! the lease at once.

mod common;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use common::campaign_client::{
    Applied, BoxError, Clients, Granted, Probe, Settings, Side, Tally, TestResult, Witness,
    assert_sound, seeds, wall_us,
};
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{LeaseKey, LeaseManager};
use leasehold_testkit::{
    Fault, FaultPlan, History, HoldEnd, PlanShape, RedisCluster, RedisServer, Report, SentinelSet,
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
/// Each seed's run, unless `LEASEHOLD_CAMPAIGN_SECS` says otherwise: a
/// kill and a manual failover on the cluster, two kills behind Sentinel.
const RUN_SECS: u64 = 30;
/// The fixed seeds; a fresh one runs after them. Each cluster seed's plan
/// begins with a kill.
const CLUSTER_SEEDS: [u64; 1] = [3];
const SENTINEL_SEEDS: [u64; 1] = [5];

/// The witnesses of a deployment's data nodes, by address.
type Witnesses = HashMap<SocketAddr, Witness>;

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

    /// Every data node (masters and replicas, not sentinels).
    fn nodes(&self) -> Vec<SocketAddr> {
        match self {
            Self::Cluster(cluster) => cluster.nodes().iter().map(RedisServer::addr).collect(),
            Self::Sentinel(set) => vec![set.master().addr(), set.replica().addr()],
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
    let applied = campaign(
        Target::Cluster(cluster),
        FaultPlan::draw_cluster,
        &CLUSTER_SEEDS,
    )
    .await?;
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
    let applied = campaign(
        Target::Sentinel(set),
        FaultPlan::draw_sentinel,
        &SENTINEL_SEEDS,
    )
    .await?;
    assert!(!applied.is_empty(), "no failover was applied");
    Ok(())
}

/// Runs the campaign on `target` with faults drawn by `draw`, once per
/// seed (`fixed`, then a fresh one); returns the faults applied, after
/// asserting the verdicts of each run and that some kill ended a lease.
async fn campaign(
    mut target: Target,
    draw: fn(u64, PlanShape) -> FaultPlan,
    fixed: &[u64],
) -> Result<Vec<Applied>, BoxError> {
    let mut applied = Vec::new();
    let mut ended_by_kills = 0;
    for seed in seeds(fixed)? {
        let (run, ended) = run(&mut target, draw, seed).await?;
        applied.extend(run);
        ended_by_kills += ended;
    }
    assert!(
        ended_by_kills > 0,
        "no kill ended a lease: the kills' lags granted no lease whose holder still believed in it at the kill, so the verdict on them was not exercised"
    );
    Ok(applied)
}

/// A kill that lost data, as the campaign judges it: the fault, when the
/// replica's link was cut and when the master died (host clock, µs), and
/// the grants the master's feed showed in between.
struct Kill {
    fault: Fault,
    cut_us: u64,
    killed_us: u64,
    killed: Instant,
    lag_grants: Vec<Granted>,
}

/// One seed's run; returns the faults applied and how many leases the
/// kills ended, after asserting the run's verdicts.
async fn run(
    target: &mut Target,
    draw: fn(u64, PlanShape) -> FaultPlan,
    seed: u64,
) -> Result<(Vec<Applied>, usize), BoxError> {
    let settings = Settings::from_env(seed, TTL, RUN_SECS, 3)?;
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
    history.several_feeds();
    let mut witnesses = Witnesses::new();
    // A sentinel that reconfigures a node ends its normal clients, MONITOR
    // feeds among them: there the feed is opened again the moment it is
    // cut, and each cut is checked below for commands it may have hidden.
    let reconnecting = matches!(target, Target::Sentinel(_));
    for addr in target.nodes() {
        let witness = tokio::task::block_in_place(|| {
            if reconnecting {
                Witness::start_reconnecting(addr, &history)
            } else {
                Witness::start(addr, &history)
            }
        })?;
        witnesses.insert(addr, witness);
    }
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
    let mut kills = Vec::new();
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
        let (detail, kill) = match target {
            Target::Cluster(cluster) => {
                apply(&scheduled.fault, cluster, &mut witnesses, keys, &mut rng).await
            }
            Target::Sentinel(set) => fail_over(&scheduled.fault, set, &mut witnesses).await,
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
        kills.extend(kill);
        applied.push(a);
    }
    tokio::time::sleep_until((started + run_for).max(Instant::now() + TTL)).await;
    // No client may have written a lease on a node while its feed was
    // cut: every client there whose last command writes leases connected
    // after the feed was open again (a higher client id), or the history
    // may lack a grant or a renewal.
    let cuts: Vec<_> = witnesses
        .iter()
        .flat_map(|(addr, w)| w.cuts_since(0).into_iter().map(move |c| (*addr, c)))
        .collect();
    let blind: Vec<_> = cuts.iter().filter(|(_, c)| !c.unseen.is_empty()).collect();
    assert!(
        blind.is_empty(),
        "seed {seed}: a witness's feed was cut while clients wrote leases on its node: {blind:?}"
    );
    if reconnecting {
        // A node killed by the fault is closed until it is restarted; a
        // node a sentinel reconfigured is open again at once.
        let mut gaps: Vec<String> = cuts
            .iter()
            .map(|(addr, c)| match c.back_us {
                Some(back) => format!("{}: {:.2} ms", addr.port(), (back - c.at_us) as f64 / 1e3),
                None => format!("{}: not back within 5 s", addr.port()),
            })
            .collect();
        gaps.sort();
        println!(
            "  witness feeds cut and reopened by themselves, none while a client wrote a lease there: {}",
            gaps.join(", ")
        );
    }
    let (report, tally) = running
        .finish(
            &managers,
            &resource,
            keys,
            witnesses.into_values().collect(),
        )
        .await?;
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
    // A lease seen gone is judged by the margin the holder keeps: the
    // server must keep it at least the safety margin after the token
    // fired, so gone within it is a lease lost too early. Gone only later
    // proves nothing (it may have expired by then), nor does a probe with
    // no answer (a side connection reconnecting after a failover, a loaded
    // machine).
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
    judge_margins(&history, &tally, &kills, &settings, seed);
    let ended = judge_kills(&kills, &history, &tally, margin, seed);
    assert!(
        forbidden.is_empty(),
        "holders overlapped outside a kill after a lag, or for longer than a renew interval after one (seed {seed}): {forbidden:#?}"
    );
    Ok((applied, ended))
}

/// What the measurement adds to a firing's server-judged margin: the
/// servers' millisecond, tokio's timer tick, and the scheduling of the
/// watchdog and the recording task on two cores running six cluster nodes
/// (or a Sentinel set) and the clients. The standalone campaign's
/// measured noise (at most 13 ms short of the promise over 36 seed runs)
/// with room to spare, as there (`tests/campaign.rs`).
const MARGIN_SLACK: Duration = Duration::from_millis(25);

/// Every fired token, whatever reason the library gave, judged by the
/// servers' own record, unless a kill lost a write of its lease: a lease
/// granted or renewed in a kill's lag (from the replica's cut to the
/// kill) may lack that write on the promoted node, which then expires it
/// earlier than its holder was told (the overlap verdict and
/// [`judge_kills`] judge those). Every other firing, during a kill (a
/// lease last renewed before the cut), a manual failover or none, must
/// come at least the safety margin plus the drift allowance, less
/// [`MARGIN_SLACK`], before the expiry the servers gave the lease (its
/// last grant or renewal any node's MONITOR feed showed, plus the ttl).
fn judge_margins(history: &History, tally: &Tally, kills: &[Kill], settings: &Settings, seed: u64) {
    let options = &settings.options;
    let promised = options.safety_margin() + leasehold::backend::clock_drift(options.ttl().get());
    let least =
        i64::try_from(promised.saturating_sub(MARGIN_SLACK).as_micros()).unwrap_or(i64::MAX);
    let judged: Vec<(String, Option<i64>)> = tally
        .fired
        .iter()
        .filter(|f| {
            !kills
                .iter()
                .any(|k| history.written_between(&f.key, f.token, k.cut_us, k.killed_us))
        })
        .map(|f| {
            let margin = history.server_expiry(&f.key, f.token).map(|e| f.until(e));
            (f.lease(), margin)
        })
        .collect();
    let worst = judged.iter().filter_map(|(_, m)| *m).min();
    println!(
        "  fired tokens whose lease lost no write: {} judged by the servers' feeds, worst margin {}",
        judged.len(),
        worst.map_or_else(|| "-".to_owned(), |m| format!("{:.1} ms", m as f64 / 1e3))
    );
    let late: Vec<_> = judged
        .iter()
        .filter(|(_, m)| m.is_none_or(|m| m < least))
        .collect();
    assert!(
        late.is_empty(),
        "seed {seed}: tokens fired (for any reason; no write of their lease lost) less than the safety margin plus the drift allowance, less {MARGIN_SLACK:?} ({least} µs), before the servers' expiry of their lease, in µs: {late:?}"
    );
}

/// Every lease a killed node granted in its lag is gone from the promoted
/// replica. Its holder's last renewal was sent before the kill, so its
/// token must fire by the kill plus the ttl, less the safety margin and
/// the drift allowance (plus [`SCHEDULING_ALLOWANCE`] for the task that
/// notes the firing): whether a renewal on the promoted node found the
/// lease gone, or renewals failed until the deadline. A holder that
/// released it before then never learned of the loss and is not judged.
/// Asserts that no holder believed longer; returns how many leases the
/// kills ended.
fn judge_kills(
    kills: &[Kill],
    history: &History,
    tally: &Tally,
    margin: Duration,
    seed: u64,
) -> usize {
    let drift = leasehold::backend::clock_drift(TTL);
    let believed = TTL - margin - drift + SCHEDULING_ALLOWANCE;
    let holds = history.holds();
    let (mut ended, mut released, mut unanswered, mut before) = (0, 0, 0, 0);
    let mut late = Vec::new();
    for kill in kills {
        let deadline_us = kill.killed_us + micros(believed);
        let mut ended_here = 0;
        for g in &kill.lag_grants {
            let Some(hold) = holds.iter().find(|h| h.key == g.key && h.token == g.token) else {
                // The node died before its holder read the grant.
                unanswered += 1;
                continue;
            };
            let fired = tally
                .fired
                .iter()
                .find(|f| f.key == g.key && f.token == g.token);
            match (fired, &hold.ended) {
                (Some(f), _) if f.at_us < kill.killed_us => before += 1,
                (Some(f), _) if f.at_us <= deadline_us => ended_here += 1,
                (Some(f), _) => late.push(format!(
                    "{} token {}: fired {} ms after the kill ({:?})",
                    g.key,
                    g.token,
                    f.at_us.saturating_sub(kill.killed_us) / 1_000,
                    f.reason
                )),
                (None, Some((at, HoldEnd::Released))) if *at <= kill.killed + believed => {
                    released += 1;
                }
                (None, end) => late.push(format!(
                    "{} token {}: believed without its token firing until {:?}",
                    g.key,
                    g.token,
                    end.as_ref()
                        .map(|(at, _)| at.saturating_duration_since(kill.killed))
                )),
            }
        }
        println!(
            "  {}: {} leases granted in its lag of {:.2}s, {ended_here} ended by the kill within {believed:?} of it",
            kill.fault,
            kill.lag_grants.len(),
            micros_to_secs(kill.killed_us - kill.cut_us)
        );
        ended += ended_here;
    }
    println!(
        "  kills: {ended} leases ended by them, {before} ended before them, {released} released before their holders could learn, {unanswered} granted but never answered"
    );
    assert!(
        late.is_empty(),
        "seed {seed}: holders of leases lost with a killed master believed in them past the kill plus the ttl, less the safety margin and the drift allowance ({believed:?} in all): {late:#?}"
    );
    ended
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A Sentinel failover after a lag, healed when the old master is a
/// linked replica of the new one. Returns what happened and the kill.
async fn fail_over(
    fault: &Fault,
    set: &mut SentinelSet,
    witnesses: &mut Witnesses,
) -> Result<(String, Option<Kill>), BoxError> {
    let Fault::SentinelFailover(lag) = fault else {
        return Err(format!("the Sentinel campaign cannot apply {fault}").into());
    };
    // Frozen and its link cut, as for the Cluster kill. A mark written
    // meanwhile shows that the lag's writes were really lost.
    let mark = format!("campaign:lag:{}", fastrand::u64(..));
    let master = set.master().addr();
    let cut_us = tokio::task::block_in_place(|| {
        set.replica_mut().pause()?;
        set.master().cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        let cut_us = wall_us();
        set.master().cli(&["SET", &mark, "1"]).map(|_| cut_us)
    })?;
    let granted = lag_with_a_grant(*lag, &witnesses[&master], cut_us).await;
    let (killed, killed_us) = tokio::task::block_in_place(|| {
        set.kill_master()?;
        Ok::<_, BoxError>((Instant::now(), wall_us()))
    })?;
    let lag_grants = witnesses[&master].grants_between(cut_us, killed_us);
    let (promoted, kept, rejoined) = tokio::task::block_in_place(|| {
        set.replica_mut().resume()?;
        let promoted = set.wait_for_failover()?;
        // A sentinel that reconfigures a node ends its normal clients
        // (`CLIENT KILL TYPE normal`, with the `REPLICAOF` in one
        // transaction), MONITOR feeds among them: the promoted node's
        // witness opens its feed again at once by itself, and this only
        // opens it if that failed.
        if let Some(witness) = witnesses.get_mut(&set.master().addr()) {
            witness.attach()?;
        }
        let kept = set.master().cli(&["EXISTS", &mark])?;
        let rejoined = set.restart_old_master()?;
        // The old master is a replica now: clients send it nothing, but
        // its feed is watched again before the next fault promotes it.
        if let Some(witness) = witnesses.get_mut(&master) {
            witness.attach()?;
        }
        Ok::<_, BoxError>((promoted, kept, rejoined))
    })?;
    if kept != "0" {
        return Err(format!(
            "{fault}: the promoted replica has the lag's write {mark}: nothing was lost"
        )
        .into());
    }
    let detail = format!(
        "lag {:.2}s{}, promoted after {:.2}s without the lag's writes, old master linked {:.2}s later",
        micros_to_secs(killed_us - cut_us),
        if granted { "" } else { " (no grant in it)" },
        promoted.as_secs_f64(),
        rejoined.as_secs_f64()
    );
    let kill = Kill {
        fault: *fault,
        cut_us,
        killed_us,
        killed,
        lag_grants,
    };
    Ok((detail, Some(kill)))
}

/// Waits out a drawn `lag` and then, at most a ttl more, until `witness`
/// has seen its node grant a lease since `cut_us`; says whether it did.
async fn lag_with_a_grant(lag: Duration, witness: &Witness, cut_us: u64) -> bool {
    tokio::time::sleep(lag).await;
    witness.granted_since(cut_us, TTL).await
}

fn micros_to_secs(us: u64) -> f64 {
    Duration::from_micros(us).as_secs_f64()
}

/// Applies one Cluster fault to the master serving one of the campaign's
/// `keys` (so that the fault meets leases) and waits until the cluster has
/// healed. Returns which nodes it touched, and the kill if it was one.
async fn apply(
    fault: &Fault,
    cluster: &mut RedisCluster,
    witnesses: &mut Witnesses,
    keys: usize,
    rng: &mut fastrand::Rng,
) -> Result<(String, Option<Kill>), BoxError> {
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
    let mut kill = None;
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
            let master_addr = cluster.nodes()[master].addr();
            let cut_us = tokio::task::block_in_place(|| {
                cluster.node_mut(replica).pause()?;
                cluster.nodes()[master].cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
                let cut_us = wall_us();
                cluster.nodes()[master]
                    .cli(&["SET", &mark, "1"])
                    .map(|_| cut_us)
            })?;
            let granted = lag_with_a_grant(*lag, &witnesses[&master_addr], cut_us).await;
            let (killed, killed_us) = tokio::task::block_in_place(|| {
                cluster.node_mut(master).kill()?;
                Ok::<_, BoxError>((Instant::now(), wall_us()))
            })?;
            let lag_grants = witnesses[&master_addr].grants_between(cut_us, killed_us);
            tokio::task::block_in_place(|| cluster.node_mut(replica).resume())?;
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
            // data is replaced by a full sync. Its feed is watched again
            // from its first command.
            tokio::task::block_in_place(|| {
                cluster.node_mut(master).restart()?;
                if let Some(witness) = witnesses.get_mut(&master_addr) {
                    witness.attach()?;
                }
                cluster.wait_until_healthy(HEAL_TIMEOUT)?;
                Ok::<_, BoxError>(())
            })?;
            if !granted {
                println!(
                    "  (no grant in the lag of {:.2}s)",
                    micros_to_secs(killed_us - cut_us)
                );
            }
            kill = Some(Kill {
                fault: *fault,
                cut_us,
                killed_us,
                killed,
                lag_grants,
            });
        }
        other => return Err(format!("the cluster campaign cannot apply {other}").into()),
    }
    let detail = format!(
        "{key} on master node {master}, replica node {replica}; the lag's mark {} the promotion",
        if fault.loses_data() {
            "lost in"
        } else {
            "kept through"
        }
    );
    Ok((detail, kill))
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
