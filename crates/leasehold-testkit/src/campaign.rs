//! Fault schedules for a lease campaign, drawn from a seed.
//!
//! A campaign runs many lease clients against one server for a bounded
//! time while a [`FaultPlan`] injects faults; the same seed always gives
//! the same plan, so a failing run can be replayed. The plan only says
//! *what* happens *when*; the runner (see `tests/campaign.rs` at the
//! workspace root) applies it with [`RedisServer`](crate::RedisServer) and
//! [`Proxy`](crate::Proxy) and judges the result with a
//! [`History`](crate::History).

use std::fmt;
use std::time::Duration;

/// One fault of a campaign.
///
/// The first six kinds are for one standalone server behind proxies
/// ([`FaultPlan::draw`]); the Cluster kinds for a
/// [`RedisCluster`](crate::RedisCluster) ([`FaultPlan::draw_cluster`]);
/// the Sentinel kind for a [`SentinelSet`](crate::SentinelSet)
/// ([`FaultPlan::draw_sentinel`]).
/// The enum is `#[non_exhaustive]` so adding kinds breaks no runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Freeze the server with SIGSTOP for this long, then SIGCONT. Keys keep
    /// expiring meanwhile; queued commands run on resume.
    Pause(Duration),
    /// SIGKILL the server, delete its data, and restart it empty after this
    /// long: every lease and fencing counter is lost.
    CrashEmpty(Duration),
    /// SIGKILL the server and restart it after this long from its
    /// append-only file (`appendfsync always`): nothing acknowledged is lost.
    CrashDurable(Duration),
    /// Blackhole one client's proxy (`Some(i)`) or every client's (`None`)
    /// for this long.
    Blackhole(Option<usize>, Duration),
    /// Delay every chunk through one client's proxy (or every client's) by
    /// the first duration, per direction, for the second.
    Delay(Option<usize>, Duration, Duration),
    /// Cut one client's connections (or every client's) with resets, and
    /// refuse new ones, for this long.
    Reset(Option<usize>, Duration),
    /// Cluster: freeze a master's replica (SIGSTOP) and cut its link (`CLIENT
    /// KILL TYPE replica`, else it would read the writes buffered on its
    /// socket on resume) for this long while the master takes writes,
    /// then SIGKILL the master and let the replica go: it is promoted
    /// without the writes of that lag, which are lost. The old master is
    /// then restarted empty and rejoins as a replica.
    ClusterKill(Duration),
    /// Cluster: a manual `CLUSTER FAILOVER` of a master's replica, which
    /// waits until the replica has every write: loses nothing.
    ClusterFailover,
    /// Sentinel: freeze the replica and cut its link for this long while
    /// the master takes writes, then SIGKILL the master and let the replica go: the
    /// sentinels promote it without the writes of that lag. The old master
    /// is then restarted empty and made a replica of the new one.
    SentinelFailover(Duration),
}

impl Fault {
    /// Whether the fault can lose acknowledged lease state on the server.
    #[must_use]
    pub fn loses_data(&self) -> bool {
        matches!(
            self,
            Self::CrashEmpty(_) | Self::ClusterKill(_) | Self::SentinelFailover(_)
        )
    }

    /// A short name for tables and logs.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Pause(_) => "pause",
            Self::CrashEmpty(_) => "crash-empty",
            Self::CrashDurable(_) => "crash-durable",
            Self::Blackhole(..) => "blackhole",
            Self::Delay(..) => "delay",
            Self::Reset(..) => "reset",
            Self::ClusterKill(_) => "cluster-kill",
            Self::ClusterFailover => "cluster-failover",
            Self::SentinelFailover(_) => "sentinel-failover",
        }
    }

    /// Every kind name, in table order.
    pub const KINDS: [&'static str; 6] = [
        "pause",
        "crash-empty",
        "crash-durable",
        "blackhole",
        "delay",
        "reset",
    ];

    /// The Cluster kinds, in table order.
    pub const CLUSTER_KINDS: [&'static str; 2] = ["cluster-kill", "cluster-failover"];

    /// The Sentinel kinds.
    pub const SENTINEL_KINDS: [&'static str; 1] = ["sentinel-failover"];
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = |c: &Option<usize>| {
            c.map_or_else(|| "all clients".to_owned(), |c| format!("client {c}"))
        };
        match self {
            Self::Pause(d) => write!(f, "SIGSTOP for {d:?}"),
            Self::CrashEmpty(d) => write!(f, "SIGKILL, restart empty after {d:?}"),
            Self::CrashDurable(d) => write!(f, "SIGKILL, restart from the AOF after {d:?}"),
            Self::Blackhole(c, d) => write!(f, "blackhole {} for {d:?}", who(c)),
            Self::Delay(c, by, d) => write!(f, "delay {} by {by:?} each way for {d:?}", who(c)),
            Self::Reset(c, d) => write!(f, "reset connections of {} for {d:?}", who(c)),
            Self::ClusterKill(d) => write!(
                f,
                "freeze a replica for {d:?}, SIGKILL its master, promote the replica"
            ),
            Self::ClusterFailover => write!(f, "manual CLUSTER FAILOVER"),
            Self::SentinelFailover(d) => write!(
                f,
                "freeze the replica for {d:?}, SIGKILL the master, Sentinel failover"
            ),
        }
    }
}

/// A fault and when it starts, counted from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledFault {
    /// When the fault starts.
    pub at: Duration,
    /// The fault.
    pub fault: Fault,
}

/// What a plan is drawn for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanShape {
    /// How long the run lasts; faults end at least one ttl before.
    pub run_for: Duration,
    /// How many clients (each with its own proxy).
    pub clients: usize,
    /// The ttl of the campaign's leases.
    pub ttl: Duration,
    /// Their renew interval.
    pub renew_interval: Duration,
}

/// A seeded schedule of faults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultPlan {
    /// The seed it was drawn from.
    pub seed: u64,
    /// The faults, in start order; one ends before the next starts.
    pub faults: Vec<ScheduledFault>,
}

impl FaultPlan {
    /// Draws a plan: faults one after another, each followed by a quiet
    /// gap of one to two ttls so its effects settle before the next, every
    /// kind once per round in a seeded order so that short runs still see
    /// each kind. Durations, relative to the ttl `T` and renew interval `R`:
    ///
    /// - pause: `R` to `2.5 T` (from a blip the renewals ride out to
    ///   longer than the lease);
    /// - crashes: down `0` to `T`;
    /// - blackhole: `R` to `2 T`, of one client or all;
    /// - delay: `R/2` to `R` each way, so a round trip takes `R` to `2 R`
    ///   longer (above the renew interval), for `T` to `3 T`;
    /// - reset: `0` to `T`, of one client or all.
    #[must_use]
    pub fn draw(seed: u64, shape: PlanShape) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (t, r) = (shape.ttl, shape.renew_interval);
        let between = |rng: &mut fastrand::Rng, lo: Duration, hi: Duration| {
            let (lo_ms, hi_ms) = (millis(lo), millis(hi).max(millis(lo)));
            Duration::from_millis(rng.u64(lo_ms..=hi_ms))
        };
        let mut faults = Vec::new();
        let mut at = t;
        let mut round: Vec<usize> = Vec::new();
        loop {
            if round.is_empty() {
                round = (0..Fault::KINDS.len()).collect();
                rng.shuffle(&mut round);
            }
            let client = |rng: &mut fastrand::Rng| {
                (shape.clients > 1 && rng.bool()).then(|| rng.usize(..shape.clients))
            };
            let fault = match round.pop() {
                Some(0) => Fault::Pause(between(&mut rng, r, t * 5 / 2)),
                Some(1) => Fault::CrashEmpty(between(&mut rng, Duration::ZERO, t)),
                Some(2) => Fault::CrashDurable(between(&mut rng, Duration::ZERO, t)),
                Some(3) => Fault::Blackhole(client(&mut rng), between(&mut rng, r, t * 2)),
                Some(5) => Fault::Reset(client(&mut rng), between(&mut rng, Duration::ZERO, t)),
                _ => Fault::Delay(
                    client(&mut rng),
                    between(&mut rng, r / 2 + Duration::from_millis(1), r),
                    between(&mut rng, t, t * 3),
                ),
            };
            let lasts = fault_length(&fault);
            if at + lasts + t > shape.run_for {
                break;
            }
            faults.push(ScheduledFault { at, fault });
            at += lasts + between(&mut rng, t, t * 2);
        }
        Self { seed, faults }
    }
}

impl FaultPlan {
    /// Draws a plan for a Redis Cluster: kills after a replication lag
    /// (`R` to `T`) and manual failovers, alternating in a seeded order,
    /// each followed by two to three ttls of quiet. A runner applies each
    /// after the previous one has healed (the cluster is healthy and every
    /// replica linked), so `at` is the earliest start.
    #[must_use]
    pub fn draw_cluster(seed: u64, shape: PlanShape) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (t, r) = (shape.ttl, shape.renew_interval);
        let mut faults = Vec::new();
        let mut at = t;
        let mut kill = rng.bool();
        loop {
            let fault = if kill {
                let lag = Duration::from_millis(rng.u64(millis(r)..=millis(t).max(millis(r))));
                Fault::ClusterKill(lag)
            } else {
                Fault::ClusterFailover
            };
            kill = !kill;
            let lasts = fault_length(&fault);
            if at + lasts + t > shape.run_for {
                break;
            }
            faults.push(ScheduledFault { at, fault });
            at += lasts + Duration::from_millis(rng.u64(millis(t * 2)..=millis(t * 3)));
        }
        Self { seed, faults }
    }
}

impl FaultPlan {
    /// Draws a plan for a Sentinel set: failovers after a replication lag
    /// of `R` to `T`, each followed by two to three ttls of quiet, applied
    /// (like [`draw_cluster`](Self::draw_cluster)'s) once the previous one
    /// has healed.
    #[must_use]
    pub fn draw_sentinel(seed: u64, shape: PlanShape) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let (t, r) = (shape.ttl, shape.renew_interval);
        let mut faults = Vec::new();
        let mut at = t;
        loop {
            let lag = Duration::from_millis(rng.u64(millis(r)..=millis(t).max(millis(r))));
            let fault = Fault::SentinelFailover(lag);
            if at + lag + t > shape.run_for {
                break;
            }
            faults.push(ScheduledFault { at, fault });
            at += lag + Duration::from_millis(rng.u64(millis(t * 2)..=millis(t * 3)));
        }
        Self { seed, faults }
    }
}

/// How long a fault lasts before it is healed (for failovers, the
/// part before the failover; the failover itself takes as long as it takes).
#[must_use]
pub fn fault_length(fault: &Fault) -> Duration {
    match *fault {
        Fault::Pause(d)
        | Fault::CrashEmpty(d)
        | Fault::CrashDurable(d)
        | Fault::Blackhole(_, d)
        | Fault::Reset(_, d)
        | Fault::Delay(_, _, d)
        | Fault::ClusterKill(d)
        | Fault::SentinelFailover(d) => d,
        Fault::ClusterFailover => Duration::ZERO,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(secs: u64) -> PlanShape {
        PlanShape {
            run_for: Duration::from_secs(secs),
            clients: 4,
            ttl: Duration::from_secs(1),
            renew_interval: Duration::from_millis(333),
        }
    }

    #[test]
    fn a_cluster_plan_has_both_kinds_and_is_seeded() {
        let plan = FaultPlan::draw_cluster(5, shape(60));
        assert_eq!(plan, FaultPlan::draw_cluster(5, shape(60)));
        let kinds: std::collections::BTreeSet<_> =
            plan.faults.iter().map(|f| f.fault.kind()).collect();
        assert_eq!(kinds.len(), Fault::CLUSTER_KINDS.len(), "{plan:?}");
        assert!(plan.faults.iter().all(|f| match f.fault {
            Fault::ClusterKill(lag) => lag >= Duration::from_millis(333),
            other => other == Fault::ClusterFailover,
        }));
    }

    #[test]
    fn a_seed_always_gives_the_same_plan() {
        assert_eq!(FaultPlan::draw(7, shape(60)), FaultPlan::draw(7, shape(60)));
        assert_ne!(FaultPlan::draw(7, shape(60)), FaultPlan::draw(8, shape(60)));
    }

    #[test]
    fn faults_follow_each_other_inside_the_run_and_cover_every_kind() {
        for seed in 0..200 {
            let plan = FaultPlan::draw(seed, shape(28));
            let mut free_from = Duration::ZERO;
            for f in &plan.faults {
                assert!(f.at >= free_from, "seed {seed}: {f:?} starts too early");
                free_from = f.at + fault_length(&f.fault) + Duration::from_secs(1);
                assert!(free_from <= Duration::from_secs(28), "seed {seed}: {f:?}");
                if let Fault::Delay(_, by, _) = f.fault {
                    assert!(2 * by > Duration::from_millis(333), "seed {seed}: {by:?}");
                }
            }
            let kinds: std::collections::BTreeSet<_> =
                plan.faults.iter().map(|f| f.fault.kind()).collect();
            assert_eq!(kinds.len(), Fault::KINDS.len(), "seed {seed}: {plan:?}");
        }
    }
}
