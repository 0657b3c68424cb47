//! Once per tick across a fleet, on `MemoryBackend` and tokio's paused
//! clock: managers sharing one backend are the nodes of a fleet, and a
//! node's clock skew is the firing time it passes for the same tick (a node
//! whose clock is behind fires later, by the paused clock, for the same
//! tick). The witness is a record the jobs append to, kept by the test.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend};
use leasehold_watchdog::metrics::{LABEL_NAME, LABEL_REASON, TICK_RUNS, TICK_SKIPS};
use leasehold_watchdog::{
    LeaseError, LeaseManager, LeaseOptions, LossReason, TickJob, TickOutcome,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::oneshot;
use tokio::time::{sleep, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The clocks of the test's nodes: 3 s apart at most (−1.5 s, 0, +1.5 s).
const SKEW: Duration = Duration::from_secs(3);
const LATENESS: Duration = Duration::from_secs(1);
/// How late each node's scheduler fires, by the node's own clock.
const FIRING_DELAY: Duration = Duration::from_millis(200);
/// No test waits longer than this for anything.
const LIMIT: Duration = Duration::from_secs(120);

fn tick() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn job(node: &str) -> Result<TickJob, LeaseError> {
    TickJob::builder("report")
        .max_skew(SKEW)
        .max_lateness(LATENESS)
        .lease(
            LeaseOptions::builder()
                .ttl(Duration::from_secs(10))
                .label(node),
        )
        .build()
}

/// Runs (kept by the test): the node that ran each tick.
#[derive(Clone, Default)]
struct Record(Arc<Mutex<Vec<String>>>);

impl Record {
    fn push(&self, entry: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One node fires for `tick()` now, by its clock `FIRING_DELAY` after the
/// tick, and runs a 1 ms job that records it.
async fn fire(
    node: &LeaseManager<MemoryBackend>,
    name: &str,
    record: &Record,
) -> Result<TickOutcome<()>, LeaseError> {
    let job = job(name)?;
    let (record, name) = (record.clone(), name.to_owned());
    timeout(
        LIMIT,
        node.run_tick(&job, tick(), tick() + FIRING_DELAY, |run| async move {
            sleep(Duration::from_millis(1)).await;
            record.push(format!("{name}:{}", run.fencing_token()));
        }),
    )
    .await
    .map_err(|_| LeaseError::InvalidOptions {
        reason: "run_tick hung".to_owned(),
    })?
}

fn holder_of<T>(outcome: &TickOutcome<T>) -> Option<&str> {
    match outcome {
        TickOutcome::Taken { holder, .. } => holder.as_deref(),
        _ => None,
    }
}

/// Three nodes fire for one tick 1.5 s apart (their clocks −1.5 s, 0 and
/// +1.5 s off): the first runs its 1 ms job and releases at once, and the
/// two later ones find the tick taken, told by whom. Without the minimum
/// hold the key is free again 1 ms in, and each node runs the tick.
#[tokio::test(start_paused = true)]
async fn a_tick_runs_once_across_nodes_whose_clocks_differ_within_max_skew() -> TestResult {
    let fleet = MemoryBackend::new();
    let record = Record::default();
    let nodes: Vec<_> = (0..3)
        .map(|_| LeaseManager::new(fleet.clone()))
        .collect::<Result<_, _>>()?;

    let ahead = fire(&nodes[0], "ahead", &record).await?;
    assert!(ahead.ran(), "{ahead:?}");
    sleep(SKEW / 2).await;
    let on_time = fire(&nodes[1], "on-time", &record).await?;
    sleep(SKEW / 2).await;
    let behind = fire(&nodes[2], "behind", &record).await?;

    assert_eq!(record.entries().len(), 1, "runs: {:?}", record.entries());
    assert!(record.entries()[0].starts_with("ahead:"));
    assert_eq!(holder_of(&on_time), Some("ahead"), "{on_time:?}");
    assert_eq!(holder_of(&behind), Some("ahead"), "{behind:?}");
    // The key lives the minimum hold from its grant, and no longer.
    let key = LeaseKey::new(job("x")?.tick_key(tick())?)?;
    assert_eq!(
        fleet.inspect(&key).await?.and_then(|i| i.ttl_left),
        Some(job("x")?.min_hold() - SKEW - Duration::from_millis(1))
    );
    sleep(job("x")?.min_hold()).await;
    assert_eq!(fleet.inspect(&key).await?, None);
    Ok(())
}

/// A node firing later than `max_lateness` by its own clock leaves the
/// tick alone, though the key is free (its winner's minimum hold is over);
/// so does one whose grant comes back later than that. Without the checks
/// (before asking, and after the grant) each runs the tick a second time.
#[tokio::test(start_paused = true)]
async fn a_node_later_than_max_lateness_does_not_run_the_tick() -> TestResult {
    let fleet = MemoryBackend::new();
    let record = Record::default();
    let (first, late) = (
        LeaseManager::new(fleet.clone())?,
        LeaseManager::new(fleet.clone())?,
    );
    assert!(fire(&first, "first", &record).await?.ran());
    sleep(job("x")?.min_hold()).await;

    // Fired late: 1.2 s after the tick by its clock.
    let outcome = late
        .run_tick(
            &job("late")?,
            tick(),
            tick() + LATENESS + FIRING_DELAY,
            |_| async {
                record.push("late".to_owned());
            },
        )
        .await?;
    assert!(
        matches!(outcome, TickOutcome::Late { lateness, .. } if lateness == LATENESS + FIRING_DELAY),
        "{outcome:?}"
    );

    // Fired in time, but the grant took 2 s to come back.
    fleet.set_latency(Duration::from_secs(2));
    let outcome = late
        .run_tick(&job("slow")?, tick(), tick() + FIRING_DELAY, |_| async {
            record.push("slow".to_owned());
        })
        .await?;
    assert!(matches!(outcome, TickOutcome::Late { .. }), "{outcome:?}");
    assert_eq!(record.entries().len(), 1, "runs: {:?}", record.entries());
    Ok(())
}

/// The winner dies mid-tick (its task is dropped while the job runs): the
/// tick is missed, not run again. The nodes firing after it within the
/// skew find the tick taken, and a node firing after the key is gone is
/// late. Without the minimum hold the dropped lease's release frees the key
/// and the next node runs the tick again.
#[tokio::test(start_paused = true)]
async fn a_tick_whose_winner_dies_is_missed_not_run_again() -> TestResult {
    let fleet = MemoryBackend::new();
    let record = Record::default();
    let nodes: Vec<_> = (0..3)
        .map(|_| LeaseManager::new(fleet.clone()))
        .collect::<Result<_, _>>()?;
    let (started, running) = oneshot::channel();
    let winner = {
        let (node, record, job) = (nodes[0].clone(), record.clone(), job("dies")?);
        tokio::spawn(async move {
            node.run_tick(&job, tick(), tick() + FIRING_DELAY, |run| async move {
                record.push(format!("dies:{}", run.fencing_token()));
                let _ = started.send(());
                std::future::pending::<()>().await;
            })
            .await
        })
    };
    timeout(LIMIT, running).await??;
    winner.abort();
    assert!(winner.await.is_err_and(|e| e.is_cancelled()));

    sleep(SKEW / 2).await;
    let second = fire(&nodes[1], "second", &record).await?;
    sleep(SKEW / 2).await;
    let third = fire(&nodes[2], "third", &record).await?;
    assert_eq!(holder_of(&second), Some("dies"), "{second:?}");
    assert_eq!(holder_of(&third), Some("dies"), "{third:?}");
    assert_eq!(record.entries().len(), 1, "runs: {:?}", record.entries());
    Ok(())
}

/// The job is given the lease's token: when the server loses the tick's
/// lease the job is told, and the tick's result says the lease ended.
#[tokio::test(start_paused = true)]
async fn a_lost_tick_lease_cancels_the_job() -> TestResult {
    let fleet = MemoryBackend::new();
    let node = LeaseManager::new(fleet.clone())?;
    let job = job("node")?;
    let key = LeaseKey::new(job.tick_key(tick())?)?;
    let vanish = {
        let (fleet, key) = (fleet.clone(), key.clone());
        tokio::spawn(async move {
            sleep(Duration::from_secs(1)).await;
            fleet.vanish(&key)
        })
    };
    let record = Record::default();
    let told = record.clone();
    let outcome = node
        .run_tick(&job, tick(), tick() + FIRING_DELAY, |run| async move {
            if timeout(LIMIT, run.token().cancelled()).await.is_ok() {
                told.push("cancelled".to_owned());
            }
        })
        .await;
    assert!(vanish.await?, "the lease was not there to vanish");
    assert_eq!(record.entries(), ["cancelled"]);
    assert!(
        matches!(
            &outcome,
            Err(LeaseError::LeaseEnded {
                reason: LossReason::Lost,
                ..
            })
        ),
        "{outcome:?}"
    );
    Ok(())
}

/// Job names are a key part and a metrics label: bounded and plain. A tick
/// before 1970 and a ttl shorter than the minimum hold are refused too.
#[test]
fn bad_names_ticks_and_ttls_are_refused() -> TestResult {
    let job = job("node")?;
    assert_eq!(
        job.tick_key(UNIX_EPOCH + Duration::from_millis(1_800_000_000_500))?,
        "report:tick:1800000000500"
    );
    assert_eq!(job.lease_options().name(), "report");
    assert_eq!(job.lease_options().wait(), None);
    assert_eq!(job.lease_options().hold_at_least(), Some(SKEW + LATENESS));
    for bad in ["", "a b", "{report}", "r:tick", &"x".repeat(65)] {
        let refused = TickJob::builder(bad.to_owned()).build();
        assert!(
            matches!(&refused, Err(LeaseError::InvalidTick { job, .. }) if job == bad),
            "{bad:?}: {refused:?}"
        );
    }
    assert!(TickJob::builder("x".repeat(64)).build().is_ok());
    assert!(matches!(
        job.tick_key(UNIX_EPOCH - Duration::from_secs(1)),
        Err(LeaseError::InvalidTick { .. })
    ));
    let short_ttl = TickJob::builder("report")
        .lease(LeaseOptions::builder().ttl(Duration::from_secs(5)))
        .build();
    assert!(
        matches!(short_ttl, Err(LeaseError::InvalidOptions { .. })),
        "{short_ttl:?}"
    );
    Ok(())
}

/// Runs and skips are counted per job name, skips by reason.
#[tokio::test(start_paused = true)]
async fn runs_and_skips_are_counted_by_job_name() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The test's runtime has one thread, and run_tick counts on the caller's task.
    let _local = metrics::set_default_local_recorder(&recorder);
    let fleet = MemoryBackend::new();
    let record = Record::default();
    let (a, b) = (
        LeaseManager::new(fleet.clone())?,
        LeaseManager::new(fleet.clone())?,
    );
    fire(&a, "a", &record).await?;
    fire(&b, "b", &record).await?;
    b.run_tick(&job("b")?, tick(), tick() + LATENESS * 2, |_| async {})
        .await?;
    // One snapshot: taking one drains the counters.
    let snapshot = snapshotter.snapshot().into_vec();
    let counted = |name: &str, reason: Option<&str>| {
        snapshot
            .iter()
            .filter(|(key, ..)| {
                let labels: Vec<_> = key.key().labels().collect();
                key.key().name() == name
                    && labels
                        .iter()
                        .any(|l| l.key() == LABEL_NAME && l.value() == "report")
                    && reason.is_none_or(|r| {
                        labels
                            .iter()
                            .any(|l| l.key() == LABEL_REASON && l.value() == r)
                    })
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum::<u64>()
    };
    assert_eq!(counted(TICK_RUNS, None), 1);
    assert_eq!(counted(TICK_SKIPS, Some("taken")), 1);
    assert_eq!(counted(TICK_SKIPS, Some("late")), 1);
    Ok(())
}
