//! Scheduled jobs on `MemoryBackend` and tokio's paused clock: managers
//! sharing one backend are the nodes of a fleet, and the backend's wall
//! clock is the server's. A node whose clock is off fires for its tick at
//! another moment of the server's clock. The witnesses are a record the
//! jobs append to, kept by the test, and the backend's job record.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{
    CatchUp, JobName, MemoryBackend, OnAbandon, TickBackend, TickReason, TickState,
};
use leasehold_watchdog::{
    Every, LeaseError, LeaseManager, LeaseOptions, TickGrid, TickJob, TickOutcome,
};
use tokio::time::{sleep, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// No test waits longer than this for anything.
const LIMIT: Duration = Duration::from_secs(3_600);
const PERIOD: Duration = Duration::from_secs(10);

/// A tick of the 10 s grid, far from 1970.
fn t0() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

fn job(name: &str, node: &str, grid: impl TickGrid + 'static) -> Result<TickJob, LeaseError> {
    TickJob::builder(name, grid)
        .lease(
            LeaseOptions::builder()
                .ttl(Duration::from_secs(3))
                .label(node),
        )
        .build()
}

/// Runs (kept by the test): `<tick s>:<node>:<token>` per start.
#[derive(Clone, Default)]
struct Record(Arc<Mutex<Vec<String>>>);

impl Record {
    fn push(&self, entry: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(entry);
    }
    fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    fn starts_of(&self, tick: SystemTime) -> usize {
        let secs = secs(tick);
        self.entries()
            .iter()
            .filter(|e| e.starts_with(&format!("{secs}:")))
            .count()
    }
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

/// Three nodes whose clocks are 7 s behind, right, and 7 s ahead (more
/// than two thirds of a period apart) fire for 20 ticks, each at its own
/// moment of the server's clock: each tick starts exactly once, the node
/// ahead waits for the server's "due", and nobody misses a tick.
#[tokio::test(start_paused = true)]
async fn clocks_far_apart_start_each_tick_once() -> TestResult {
    let server = MemoryBackend::new();
    server.set_wall_clock(t0() - Duration::from_secs(8));
    let record = Record::default();
    let nodes = [("behind", 7_i64), ("right", 0), ("ahead", -7)];
    // (seconds after the tick, on the server's clock, that each fires)
    let mut tasks = Vec::new();
    for (node, fires_after_ms) in nodes {
        let manager = LeaseManager::new(server.clone())?;
        let job = job("report", node, Every::new(PERIOD)?)?;
        let record = record.clone();
        let server = server.clone();
        tasks.push(tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for k in 0..20_u64 {
                let tick = t0() + PERIOD * u32::try_from(k).unwrap_or(0);
                // This node's scheduler fires when its own clock reads
                // `tick`: the server's `tick + fires_after`.
                let offset = Duration::from_secs(fires_after_ms.unsigned_abs());
                let fire_at = if fires_after_ms >= 0 {
                    tick + offset
                } else {
                    tick - offset
                };
                if let Ok(wait) = fire_at.duration_since(server.wall_clock()) {
                    sleep(wait).await;
                }
                let record = record.clone();
                let outcome = manager
                    .run_tick(&job, tick, |run| async move {
                        record.push(format!(
                            "{}:{node}:{}",
                            secs(run.tick()),
                            run.fencing_token()
                        ));
                    })
                    .await;
                outcomes.push(outcome.map(|o| match o {
                    TickOutcome::Ran { .. } => "ran",
                    TickOutcome::Decided { .. } => "decided",
                    TickOutcome::Missed { .. } => "missed",
                    _ => "other",
                }));
            }
            outcomes
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(timeout(LIMIT, task).await??);
    }
    for k in 0..20_u32 {
        let tick = t0() + PERIOD * k;
        assert_eq!(
            record.starts_of(tick),
            1,
            "tick {k}: {:?}",
            record.entries()
        );
    }
    for outcomes in &all {
        for outcome in outcomes {
            let outcome = outcome.as_ref().map_err(ToString::to_string)?;
            assert!(matches!(*outcome, "ran" | "decided"), "{outcome}: {all:?}");
        }
    }
    assert_eq!(record.entries().len(), 20, "{:?}", record.entries());
    Ok(())
}

/// A node whose clock is more than a period ahead is told so, and runs
/// nothing; another schedule under the same job name is a conflict.
#[tokio::test(start_paused = true)]
async fn a_clock_far_ahead_and_another_schedule_are_refused() -> TestResult {
    let server = MemoryBackend::new();
    server.set_wall_clock(t0());
    let manager = LeaseManager::new(server.clone())?;
    let every_10s = job("report", "a", Every::new(PERIOD)?)?;
    let ahead = manager
        .run_tick(&every_10s, t0() + PERIOD * 2, |_| async {})
        .await?;
    assert!(
        matches!(ahead, TickOutcome::ClockAhead { ahead, .. } if ahead == PERIOD * 2),
        "{ahead:?}"
    );
    let ran = manager.run_tick(&every_10s, t0(), |_| async {}).await?;
    assert!(ran.ran(), "{ran:?}");
    let every_20s = job("report", "b", Every::new(PERIOD * 2)?)?;
    sleep(PERIOD * 2).await;
    let conflict = manager
        .run_tick(&every_20s, t0() + PERIOD * 2, |_| async {})
        .await?;
    assert!(
        matches!(&conflict, TickOutcome::Conflict { fingerprint, .. } if fingerprint == "every 10s"),
        "{conflict:?}"
    );
    Ok(())
}

/// A run that dies (its future dropped mid-run, so its lease ends without
/// a completion) is re-run by a long-lived node under `Rerun`, with a
/// higher fencing token, for the same tick; under `Skip` it is recorded
/// as abandoned and not run again.
#[tokio::test(start_paused = true)]
async fn an_abandoned_run_is_re_run_or_recorded() -> TestResult {
    for policy in [OnAbandon::Rerun, OnAbandon::Skip] {
        let server = MemoryBackend::new();
        server.set_wall_clock(t0() + Duration::from_millis(100));
        // A long period, so that no next tick comes in the way.
        let grid = Every::new(Duration::from_secs(3_600))?;
        let dying = LeaseManager::new(server.clone())?;
        let dying_job = job("nightly", "dying", grid)?;
        let (started, was_started) = tokio::sync::oneshot::channel();
        let run = tokio::spawn(async move {
            dying
                .run_tick(&dying_job, t0(), |run| async move {
                    let _ = started.send(run.fencing_token());
                    std::future::pending::<()>().await;
                })
                .await
        });
        let dead_token = timeout(LIMIT, was_started).await??;
        // The watcher starts after the start, as a node that saw it.
        let watcher = LeaseManager::new(server.clone())?;
        let watcher_job = TickJob::builder("nightly", grid)
            .on_abandon(policy)
            .lease(
                LeaseOptions::builder()
                    .ttl(Duration::from_secs(3))
                    .label("watcher"),
            )
            .build()?;
        let (outcomes, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let watching = {
            let watcher = watcher.clone();
            tokio::spawn(async move {
                watcher
                    .run_schedule(
                        &watcher_job,
                        |run| async move { run.fencing_token() },
                        move |outcome| {
                            let _ = outcomes.send(outcome);
                        },
                    )
                    .await
            })
        };
        // The first outcome: the watcher's own ask finds the run started.
        let first = timeout(LIMIT, seen.recv()).await?.ok_or("no outcome")??;
        assert!(
            matches!(&first, TickOutcome::Decided { decision, .. } if decision.state == TickState::Started),
            "{first:?}"
        );
        // The run dies.
        run.abort();
        let _ = run.await;
        let job_name = JobName::new("nightly")?;
        match policy {
            OnAbandon::Rerun => {
                // Past the watcher's own asks (decided: the run started).
                let rerun = timeout(Duration::from_secs(30), async {
                    loop {
                        match seen.recv().await {
                            Some(Ok(TickOutcome::Decided { .. })) => {}
                            other => return other,
                        }
                    }
                })
                .await?
                .ok_or("no re-run")??;
                match rerun {
                    TickOutcome::Ran {
                        tick,
                        fencing_token,
                        reason,
                        ..
                    } => {
                        assert_eq!(tick, t0());
                        assert_eq!(reason, TickReason::Rerun);
                        assert!(
                            fencing_token > dead_token,
                            "{fencing_token} <= {dead_token}"
                        );
                    }
                    other => panic!("not a re-run: {other:?}"),
                }
                let record = server.job_record(&job_name).await?.ok_or("no record")?;
                assert_eq!(record.counts.reruns, 1, "{record:?}");
                assert_eq!(record.counts.completed, 1, "{record:?}");
                assert_eq!(record.decided.state, TickState::Completed, "{record:?}");
            }
            _ => {
                // Settled within the lease's ttl (the watcher's timer).
                timeout(Duration::from_secs(30), async {
                    loop {
                        let record = server.job_record(&job_name).await.ok().flatten();
                        if record.is_some_and(|r| r.counts.abandoned == 1) {
                            break;
                        }
                        sleep(Duration::from_millis(100)).await;
                    }
                })
                .await?;
                let record = server.job_record(&job_name).await?.ok_or("no record")?;
                assert_eq!(record.counts.reruns, 0, "{record:?}");
                assert_eq!(record.counts.completed, 0, "{record:?}");
                assert_eq!(record.decided.state, TickState::Abandoned, "{record:?}");
                while let Ok(outcome) = seen.try_recv() {
                    assert!(
                        matches!(outcome, Ok(TickOutcome::Decided { .. })),
                        "nothing runs again under skip: {outcome:?}"
                    );
                }
            }
        }
        watcher.shutdown().await;
        timeout(LIMIT, watching).await???;
    }
    Ok(())
}

/// A job longer than its period: the ticks due while it runs are skipped
/// and recorded so, and no tick starts twice.
#[tokio::test(start_paused = true)]
async fn ticks_due_while_a_run_holds_are_skipped_and_recorded() -> TestResult {
    let server = MemoryBackend::new();
    server.set_wall_clock(t0() + Duration::from_millis(1));
    let record = Record::default();
    let manager = LeaseManager::new(server.clone())?;
    let job = job("long", "a", Every::new(PERIOD)?)?;
    let (outcomes, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let node = {
        let (manager, record) = (manager.clone(), record.clone());
        tokio::spawn(async move {
            manager
                .run_schedule(
                    &job,
                    move |run| {
                        let record = record.clone();
                        async move {
                            record.push(format!("{}:a:{}", secs(run.tick()), run.fencing_token()));
                            // 25 s: two and a half periods.
                            sleep(Duration::from_secs(25)).await;
                        }
                    },
                    move |outcome| {
                        let _ = outcomes.send(outcome);
                    },
                )
                .await
        })
    };
    let mut overlaps = 0;
    let mut ran = 0;
    while ran < 3 {
        match timeout(LIMIT, seen.recv()).await?.ok_or("stopped")? {
            Ok(TickOutcome::Ran { .. }) => ran += 1,
            Ok(TickOutcome::Overlap { .. }) => overlaps += 1,
            other => {
                let _ = format!("{other:?}");
            }
        }
    }
    manager.shutdown().await;
    timeout(LIMIT, node).await???;
    let job_record = server
        .job_record(&JobName::new("long")?)
        .await?
        .ok_or("no record")?;
    assert!(overlaps >= 2, "{overlaps} overlaps");
    assert_eq!(job_record.counts.skipped, overlaps, "{job_record:?}");
    let entries = record.entries();
    let mut ticks: Vec<&str> = entries.iter().filter_map(|e| e.split(':').next()).collect();
    let all = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), all, "a tick started twice: {entries:?}");
    Ok(())
}

/// The whole fleet stopped for five periods, then one node starts 5 s
/// into a period with a start deadline of 1 s: under `None` the newest
/// tick is recorded missed and the next one runs; under `Latest` the
/// newest tick runs at once, as a catch-up. The older ticks never run.
#[tokio::test(start_paused = true)]
async fn after_an_outage_catch_up_none_and_latest_do_what_they_say() -> TestResult {
    for policy in [CatchUp::None, CatchUp::Latest] {
        let server = MemoryBackend::new();
        server.set_wall_clock(t0() + Duration::from_millis(1));
        let build = |node: &str| {
            TickJob::builder("outage", Every::new(PERIOD)?)
                .start_deadline(Duration::from_secs(1))
                .catch_up(policy)
                .lease(
                    LeaseOptions::builder()
                        .ttl(Duration::from_secs(3))
                        .label(node),
                )
                .build()
        };
        // Before the outage: tick t0 runs.
        let before = LeaseManager::new(server.clone())?;
        let ran = before
            .run_tick(&build("before")?, t0(), |_| async {})
            .await?;
        assert!(ran.ran(), "{ran:?}");
        before.shutdown().await;
        // Five periods and a half of nobody.
        sleep(PERIOD * 5 + Duration::from_secs(5)).await;
        let after = LeaseManager::new(server.clone())?;
        let job = build("after")?;
        let (outcomes, mut seen) = tokio::sync::mpsc::unbounded_channel();
        let node = {
            let after = after.clone();
            tokio::spawn(async move {
                after
                    .run_schedule(
                        &job,
                        |run| async move { run.tick() },
                        move |o| {
                            let _ = outcomes.send(o);
                        },
                    )
                    .await
            })
        };
        // This process's own wall clock is not the test's server's: its
        // first ask, before it learns the server's clock, names an old
        // tick, found decided; the outcomes that count come after it.
        let mut next = async || loop {
            match seen.recv().await {
                Some(Ok(TickOutcome::Decided { tick, .. })) if tick < t0() + PERIOD => {}
                other => return other,
            }
        };
        let first = timeout(LIMIT, next()).await?.ok_or("stopped")??;
        let second = timeout(LIMIT, next()).await?.ok_or("stopped")??;
        after.shutdown().await;
        timeout(LIMIT, node).await???;
        let newest = t0() + PERIOD * 5;
        match policy {
            CatchUp::Latest => {
                assert!(
                    matches!(first, TickOutcome::Ran { tick, reason: TickReason::CatchUp, .. } if tick == newest),
                    "{first:?}"
                );
            }
            _ => {
                assert!(
                    matches!(first, TickOutcome::Missed { tick } if tick == newest),
                    "{first:?}"
                );
            }
        }
        assert!(
            matches!(second, TickOutcome::Ran { tick, reason: TickReason::OnTime, .. } if tick == newest + PERIOD),
            "{second:?}"
        );
        let record = server
            .job_record(&JobName::new("outage")?)
            .await?
            .ok_or("no record")?;
        let expected_started = if policy == CatchUp::Latest { 3 } else { 2 };
        assert_eq!(record.counts.started, expected_started, "{record:?}");
    }
    Ok(())
}

/// A weekday schedule (02:00, Monday to Friday) under `CatchUp::Latest`:
/// its record lives over the weekend, so Friday's tick asked for again on
/// Monday before 02:00 (when it is still the newest tick) is found
/// decided, not granted a second time as a catch-up.
#[tokio::test(start_paused = true)]
async fn a_weekday_record_outlives_the_weekend() -> TestResult {
    #[derive(Clone, Copy)]
    struct Weekdays;
    const DAY: u64 = 24 * 60 * 60;
    // 1970-01-01 was a Thursday: day d is a weekday unless (d + 3) % 7 is
    // 5 or 6.
    fn weekday(day: u64) -> bool {
        (day + 3) % 7 < 5
    }
    impl TickGrid for Weekdays {
        fn tick_at(&self, at: SystemTime) -> Option<SystemTime> {
            let s = secs(at);
            let mut day = (s - 2 * 3_600) / DAY;
            while !weekday(day) {
                day -= 1;
            }
            Some(UNIX_EPOCH + Duration::from_secs(day * DAY + 2 * 3_600))
        }
        fn next_after(&self, tick: SystemTime) -> Option<SystemTime> {
            let mut day = (secs(tick) - 2 * 3_600) / DAY + 1;
            while !weekday(day) {
                day += 1;
            }
            Some(UNIX_EPOCH + Duration::from_secs(day * DAY + 2 * 3_600))
        }
        fn fingerprint(&self) -> String {
            "0 0 2 * * 1-5 UTC".to_owned()
        }
        fn longest_gap(&self) -> Duration {
            Duration::from_secs(3 * DAY)
        }
    }
    // A Friday: 2027-01-01.
    let friday_day = 20_819;
    assert!(weekday(friday_day) && !weekday(friday_day + 1));
    let friday = UNIX_EPOCH + Duration::from_secs(friday_day * DAY + 2 * 3_600);
    let server = MemoryBackend::new();
    server.set_wall_clock(friday + Duration::from_secs(1));
    let manager = LeaseManager::new(server.clone())?;
    let job = TickJob::builder("weekdays", Weekdays)
        .catch_up(CatchUp::Latest)
        .lease(LeaseOptions::builder().ttl(Duration::from_secs(3)))
        .build()?;
    assert!(job.record_ttl() >= Duration::from_secs(3 * DAY));
    let ran = manager.run_tick(&job, friday, |_| async {}).await?;
    assert!(ran.ran(), "{ran:?}");
    // Monday, 01:59: the record is still there.
    sleep(Duration::from_secs(3 * DAY - 61)).await;
    let again = manager.run_tick(&job, friday, |_| async {}).await?;
    assert!(
        matches!(&again, TickOutcome::Decided { decision, .. } if decision.state == TickState::Completed),
        "{again:?}"
    );
    Ok(())
}

fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// Which tick a node asks for: its own before any answer; once it knows
/// the server's clock, the server's tick, unless its own is ahead of the
/// server's clock by less than a period (the server then says when it is
/// due). Exactly one period ahead is a clock too far off: the server's.
#[tokio::test(start_paused = true)]
async fn the_tick_asked_for_is_the_servers_unless_this_node_is_ahead_by_less_than_a_period()
-> TestResult {
    let server = MemoryBackend::new();
    let manager = LeaseManager::new(server.clone())?;
    let asking = job("ask", "n", Every::new(PERIOD)?)?;
    assert_eq!(asking.server_now(), None);
    assert_eq!(
        asking.tick_to_ask(t0() + s(3)),
        Some(t0()),
        "before any answer"
    );

    // One answer, with the server's clock at t0 + 25 s, teaches it.
    server.set_wall_clock(t0() + s(25));
    let outcome = timeout(
        LIMIT,
        manager.run_tick(&asking, t0() + s(20), |_run| async {}),
    )
    .await??;
    assert!(outcome.ran(), "{outcome:?}");
    assert_eq!(asking.server_now(), Some(t0() + s(25)), "no time passed");
    let again = timeout(
        LIMIT,
        manager.run_tick(&asking, t0() + s(20), |_run| async {}),
    )
    .await??;
    assert!(!again.ran(), "decided already: {again:?}");
    // This node is behind: its tick (t0 + 10 s) is the server's past.
    assert_eq!(asking.tick_to_ask(t0() + s(18)), Some(t0() + s(20)));
    // Ahead by less than a period: its own tick, 5 s ahead.
    assert_eq!(asking.tick_to_ask(t0() + s(31)), Some(t0() + s(30)));
    // Ahead by 15 s, more than a period: the server's.
    assert_eq!(asking.tick_to_ask(t0() + s(41)), Some(t0() + s(20)));

    // Exactly a period ahead: the server's clock on its tick, t0 + 20 s.
    let exact = job("ask-exact", "n", Every::new(PERIOD)?)?;
    server.set_wall_clock(t0() + s(20));
    let outcome = timeout(
        LIMIT,
        manager.run_tick(&exact, t0() + s(20), |_run| async {}),
    )
    .await??;
    assert!(outcome.ran(), "{outcome:?}");
    assert_eq!(exact.server_now(), Some(t0() + s(20)));
    assert_eq!(exact.tick_to_ask(t0() + s(30)), Some(t0() + s(20)));
    assert_eq!(
        exact.tick_to_ask(t0() + s(30) - Duration::from_millis(1)),
        Some(t0() + s(20)),
        "its own tick is the server's"
    );
    Ok(())
}

/// A job's settings read back as they were built, and its `Debug` names
/// them; the builder refuses each thing a run cannot use, on its own.
#[test]
fn a_jobs_settings_read_back_and_each_refusal_stands_alone() -> TestResult {
    let built = TickJob::builder("settings", Every::new(PERIOD)?)
        .start_deadline(s(7))
        .catch_up(CatchUp::Latest)
        .on_abandon(OnAbandon::Rerun)
        .lease(LeaseOptions::builder().ttl(s(9)))
        .build()?;
    assert_eq!(built.start_deadline(), s(7));
    assert_eq!(built.catch_up(), CatchUp::Latest);
    assert_eq!(built.on_abandon(), OnAbandon::Rerun);
    assert_eq!(built.lease_options().ttl().get(), s(9));
    let shown = format!("{built:?}");
    for part in ["TickJob", "settings", "7s", "Latest"] {
        assert!(shown.contains(part), "{part} not in {shown}");
    }
    // A record outlives the longest gap between ticks plus the start
    // deadline, and at least a minute.
    let weekly = TickJob::builder("weekly", Every::new(s(7 * 86_400))?).build()?;
    assert_eq!(weekly.record_ttl(), s(7 * 86_400 + 60));
    let yearly = TickJob::builder("yearly", Every::new(s(365 * 86_400))?).build()?;
    assert_eq!(yearly.record_ttl(), s(365 * 86_400 + 60));
    let often = TickJob::builder("often", Every::new(s(1))?)
        .start_deadline(s(1))
        .build()?;
    assert_eq!(often.record_ttl(), s(60));
    let builder = TickJob::builder("shown", Every::new(PERIOD)?);
    assert!(format!("{builder:?}").contains("shown"));

    let refused = |b: leasehold_watchdog::TickJobBuilder| match b.build() {
        Err(e) => Ok(e.to_string()),
        Ok(job) => Err(format!("built {job:?}")),
    };
    let grid = || Every::new(PERIOD);
    assert!(
        refused(TickJob::builder("zero", grid()?).start_deadline(Duration::ZERO))?
            .contains("start deadline")
    );
    assert!(
        refused(TickJob::builder("micros", grid()?).start_deadline(Duration::from_micros(1_500)))?
            .contains("start deadline")
    );
    let minimum = LeaseOptions::builder().ttl(s(9)).hold_at_least(s(1));
    assert!(refused(TickJob::builder("hold", grid()?).lease(minimum))?.contains("minimum hold"));
    let fair = LeaseOptions::builder()
        .ttl(s(9))
        .fair(leasehold_watchdog::Fair::default());
    assert!(refused(TickJob::builder("fair", grid()?).lease(fair))?.contains("fair mode"));
    Ok(())
}

/// A run whose work panics passes the panic on to the caller, even when
/// the completion that follows fails too: the failure to record is
/// logged, not put in the panic's place.
#[tokio::test(start_paused = true)]
async fn a_panicking_run_panics_even_when_its_completion_fails() -> TestResult {
    let server = MemoryBackend::new();
    server.set_wall_clock(t0() + s(1));
    let manager = LeaseManager::new(server.clone())?;
    let job = job("boom", "n", Every::new(PERIOD)?)?;
    let backend = server.clone();
    let run = tokio::spawn(async move {
        manager
            .run_tick(&job, t0(), |_run| async move {
                // The next operation, the completion, fails.
                backend.fail_next(1);
                panic!("the work failed");
            })
            .await
    });
    let joined = timeout(LIMIT, run).await?;
    match joined {
        Err(e) if e.is_panic() => Ok(()),
        other => Err(format!("the panic was replaced: {other:?}").into()),
    }
}

/// A manager and a run say what they are when shown with `Debug`.
#[tokio::test(start_paused = true)]
async fn a_manager_and_a_run_show_what_they_are() -> TestResult {
    let server = MemoryBackend::new();
    server.set_wall_clock(t0() + s(1));
    let manager = LeaseManager::new(server.clone())?;
    assert!(format!("{manager:?}").contains("LeaseManager"));
    let job = job("shown", "n", Every::new(PERIOD)?)?;
    let outcome = timeout(
        LIMIT,
        manager.run_tick(&job, t0(), |run| async move { format!("{run:?}") }),
    )
    .await??;
    let TickOutcome::Ran { output, .. } = outcome else {
        return Err(format!("not run: {outcome:?}").into());
    };
    assert!(
        output.contains("TickRun") && output.contains("tick"),
        "{output}"
    );
    Ok(())
}
