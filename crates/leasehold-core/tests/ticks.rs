//! Scheduled jobs' records on `MemoryBackend` (`TickBackend`), on tokio's
//! paused clock and the backend's settable wall clock: every branch of
//! `decide_tick` in its order (conflict, due, clock ahead, settling an
//! abandoned run, decided, missed, catch-up, overlap, grant), fenced
//! completions, claims of abandoned runs (still held, rerun, skip, counted
//! once), the record's expiry, and the wall clock moving decisions. The
//! only reads are the backend's own `inspect` and `job_record`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{
    AcquireRequest, CatchUp, Completion, Decision, FencingToken, Grant, HolderId, JobCounts,
    JobName, JobRecord, LeaseBackend, LeaseInfo, MemoryBackend, OnAbandon, ReleaseReport,
    RenewOutcome, RenewRequest, RerunReply, RerunRequest, RunState, TickAnswer, TickBackend,
    TickReason, TickReply, TickRequest, TickState, Ttl, WatchPolicy,
};
use tokio::time::{Instant, advance, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A minute, in UNIX ms: the schedule's period.
const MIN: u64 = 60_000;
/// A tick on a minute boundary (2026-01-01T00:00:00Z), in UNIX ms.
const T0: u64 = 1_767_225_600_000;
/// How long after its tick a tick may start.
const DEADLINE: Duration = Duration::from_secs(10);
/// How long a record lives after its last write.
const RECORD_TTL: Duration = Duration::from_secs(600);
const FP: &str = "0 * * * * * UTC";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn job() -> JobName {
    JobName::new("nightly-report").expect("a valid job name")
}

fn holder() -> HolderId {
    HolderId::generate().expect("the OS has entropy")
}

fn ttl(s: &str) -> Ttl {
    Ttl::parse(s).expect("a valid ttl")
}

/// A backend whose wall clock reads `wall` (UNIX ms) now.
fn backend_at(wall: u64) -> MemoryBackend {
    let backend = MemoryBackend::new();
    backend.set_wall_clock(UNIX_EPOCH + ms(wall));
    backend
}

fn run(who: HolderId, run_ttl: &str) -> AcquireRequest {
    AcquireRequest::new(job().run_key(), who, ttl(run_ttl))
}

/// Tick `tick` of the minutely schedule, asked by `who` with a run ttl.
fn ask(tick: u64, who: HolderId, run_ttl: &str) -> TickRequest {
    TickRequest::new(job(), FP, tick, tick + MIN, run(who, run_ttl))
        .with_start_deadline(DEADLINE)
        .with_record_ttl(RECORD_TTL)
}

fn claim(token: FencingToken, on_abandon: OnAbandon, who: HolderId) -> RerunRequest {
    RerunRequest::new(job(), token, on_abandon, RECORD_TTL, run(who, "30s"))
}

async fn decide(backend: &MemoryBackend, request: &TickRequest) -> TickReply {
    // As the scheduler asks: through the backend's ticks, if it has them.
    let ticks = backend.ticks().expect("a memory backend keeps job records");
    ticks
        .decide_tick(request)
        .await
        .expect("a memory backend answers")
        .reply
}

async fn granted(backend: &MemoryBackend, request: &TickRequest) -> (Grant, TickReason) {
    match decide(backend, request).await {
        TickReply::Granted { grant, reason } => (grant, reason),
        other => panic!("tick {} not granted: {other:?}", request.tick),
    }
}

async fn record(backend: &MemoryBackend) -> JobRecord {
    backend
        .job_record(&job())
        .await
        .expect("a memory backend answers")
        .expect("the job has a record")
}

async fn lease(backend: &MemoryBackend) -> Option<LeaseInfo> {
    backend
        .inspect(&job().run_key())
        .await
        .expect("a memory backend answers")
}

fn counts(
    started: u64,
    completed: u64,
    missed: u64,
    skipped: u64,
    abandoned: u64,
    reruns: u64,
) -> JobCounts {
    let mut c = JobCounts::default();
    c.started = started;
    c.completed = completed;
    c.missed = missed;
    c.skipped = skipped;
    c.abandoned = abandoned;
    c.reruns = reruns;
    c
}

/// Checks a decision field by field (it is non-exhaustive: no literal).
#[track_caller]
fn assert_decision(
    decision: &Decision,
    tick: u64,
    state: TickState,
    reason: TickReason,
    token: Option<FencingToken>,
) {
    assert_eq!(
        (
            decision.tick,
            decision.state,
            decision.reason,
            decision.run.as_ref().map(|r| r.fencing_token)
        ),
        (tick, state, reason, token),
        "{decision:?}"
    );
}

/// Checks the record's last run: its tick, token, state and reason.
#[track_caller]
fn assert_run(
    record: &JobRecord,
    tick: u64,
    token: FencingToken,
    state: RunState,
    reason: TickReason,
) {
    let run = record.run.as_ref().expect("the record has a run");
    assert_eq!(
        (run.info.tick, run.info.fencing_token, run.state, run.reason),
        (tick, token, state, reason),
        "{run:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn due_then_clock_ahead_write_nothing() -> TestResult {
    let backend = backend_at(T0);
    let me = holder();
    let answer: TickAnswer = backend.decide_tick(&ask(T0 + 5_000, me, "30s")).await?;
    assert_eq!(answer.server_time, T0);
    assert_eq!(answer.reply, TickReply::Due { wait: ms(5_000) });
    // Exactly one period ahead is still due; more is the node's clock.
    assert_eq!(
        decide(&backend, &ask(T0 + MIN, me, "30s")).await,
        TickReply::Due { wait: ms(MIN) }
    );
    assert_eq!(
        decide(&backend, &ask(T0 + 2 * MIN + 1, me, "30s")).await,
        TickReply::ClockAhead {
            ahead: ms(2 * MIN + 1)
        }
    );
    assert_eq!(backend.job_record(&job()).await?, None);
    assert_eq!(lease(&backend).await, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn grant_then_decided_for_the_same_tick_from_a_clone() -> TestResult {
    let backend = backend_at(T0 + 1_000);
    backend.set_latency(ms(250));
    let (me, other) = (holder(), holder());
    let began = Instant::now();
    let (grant, reason) = granted(&backend, &ask(T0, me, "30s")).await;
    backend.set_latency(Duration::ZERO);
    assert_eq!(reason, TickReason::OnTime);
    // An ordinary lease of the run key, sent when the call began.
    assert_eq!(grant.key, job().run_key());
    assert_eq!(grant.holder, me);
    assert_eq!(grant.sent_at, began);
    let held = lease(&backend).await.expect("the run's lease is held");
    assert_eq!(held.fencing_token, Some(grant.fencing_token));
    assert_eq!(
        backend
            .renew(&RenewRequest::new(job().run_key(), me, ttl("30s")))
            .await?,
        RenewOutcome::Renewed
    );

    let rec = record(&backend).await;
    assert_eq!(rec.job, job());
    assert_eq!(rec.fingerprint, FP);
    assert_decision(
        &rec.decided,
        T0,
        TickState::Started,
        TickReason::OnTime,
        Some(grant.fencing_token),
    );
    assert_run(
        &rec,
        T0,
        grant.fencing_token,
        RunState::Running,
        TickReason::OnTime,
    );
    let run = rec.run.as_ref().expect("a run");
    assert_eq!(run.started_at, T0 + 1_250);
    assert_eq!(run.ended_at, None);
    assert_eq!(run.ttl_left, Some(ms(30_000)));
    assert_eq!(rec.counts, counts(1, 0, 0, 0, 0, 0));
    assert_eq!(rec.last_seen, T0 + 1_250);

    // Another node asks for the same tick through a clone: decided.
    let clone = backend.clone();
    let TickReply::Decided(decided) = decide(&clone, &ask(T0, other, "30s")).await else {
        panic!("the same tick must be decided");
    };
    assert_decision(
        &decided,
        T0,
        TickState::Started,
        TickReason::OnTime,
        Some(grant.fencing_token),
    );
    // An older tick is decided too: by the later decision.
    let TickReply::Decided(later) = decide(&clone, &ask(T0 - MIN, other, "30s")).await else {
        panic!("an older tick must be decided");
    };
    assert_eq!(later.tick, T0);
    // Nothing changed: one start, the lease still ours.
    assert_eq!(record(&backend).await.counts, counts(1, 0, 0, 0, 0, 0));
    assert_eq!(
        lease(&backend).await.and_then(|l| l.fencing_token),
        Some(grant.fencing_token)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn late_ticks_are_missed_with_and_without_a_record() -> TestResult {
    // Past the start deadline, no record: recorded as missed.
    let backend = backend_at(T0 + DEADLINE.as_millis() as u64);
    assert_eq!(
        decide(&backend, &ask(T0, holder(), "30s")).await,
        TickReply::Missed
    );
    let rec = record(&backend).await;
    assert_decision(&rec.decided, T0, TickState::Missed, TickReason::Late, None);
    assert_eq!(rec.run, None);
    assert_eq!(rec.counts, counts(0, 0, 1, 0, 0, 0));
    assert_eq!(lease(&backend).await, None);
    // Asked again: decided as missed, not counted twice.
    let TickReply::Decided(again) = decide(&backend, &ask(T0, holder(), "30s")).await else {
        panic!("a missed tick is decided");
    };
    assert_eq!(again.state, TickState::Missed);

    // With a record: the next tick asked for 30 s late.
    backend.set_wall_clock(UNIX_EPOCH + ms(T0 + MIN + 30_000));
    assert_eq!(
        decide(&backend, &ask(T0 + MIN, holder(), "30s")).await,
        TickReply::Missed
    );
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0 + MIN,
        TickState::Missed,
        TickReason::Late,
        None,
    );
    assert_eq!(rec.counts, counts(0, 0, 2, 0, 0, 0));
    assert_eq!(lease(&backend).await, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn catch_up_latest_runs_the_newest_late_tick_once() -> TestResult {
    // After an outage: ticks T0 .. T0+3min were nobody's; it is now 30 s
    // past T0+3min, late for it but before the next.
    let backend = backend_at(T0 + 3 * MIN + 30_000);
    let latest = |tick| ask(tick, holder(), "30s").with_catch_up(CatchUp::Latest);
    // An older tick is not the newest any more: missed.
    assert_eq!(decide(&backend, &latest(T0 + MIN)).await, TickReply::Missed);
    let (grant, reason) = granted(&backend, &latest(T0 + 3 * MIN)).await;
    assert_eq!(reason, TickReason::CatchUp);
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0 + 3 * MIN,
        TickState::Started,
        TickReason::CatchUp,
        Some(grant.fencing_token),
    );
    assert_eq!(rec.counts, counts(1, 0, 1, 0, 0, 0));
    // Once: a second node gets the decision, and an older late tick too.
    for tick in [T0 + 3 * MIN, T0 + 2 * MIN] {
        let TickReply::Decided(d) = decide(&backend, &latest(tick)).await else {
            panic!("tick {tick} must be decided");
        };
        assert_eq!(d.tick, T0 + 3 * MIN);
    }
    assert_eq!(record(&backend).await.counts, counts(1, 0, 1, 0, 0, 0));

    // Without catch-up the same late tick is missed.
    let other = backend_at(T0 + 3 * MIN + 30_000);
    assert_eq!(
        decide(&other, &ask(T0 + 3 * MIN, holder(), "30s")).await,
        TickReply::Missed
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_tick_due_while_the_run_holds_is_skipped() -> TestResult {
    let backend = backend_at(T0);
    let (grant, _) = granted(&backend, &ask(T0, holder(), "90s")).await;
    advance(ms(MIN)).await;
    let reply = decide(&backend, &ask(T0 + MIN, holder(), "90s")).await;
    let TickReply::Overlap { running } = reply else {
        panic!("the next tick must overlap: {reply:?}");
    };
    assert_eq!(
        (running.tick, running.fencing_token),
        (T0, grant.fencing_token)
    );
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0 + MIN,
        TickState::Skipped,
        TickReason::Overlap,
        Some(grant.fencing_token),
    );
    // The run goes on, still the first one's.
    assert_run(
        &rec,
        T0,
        grant.fencing_token,
        RunState::Running,
        TickReason::OnTime,
    );
    assert_eq!(rec.counts, counts(1, 0, 0, 1, 0, 0));
    assert_eq!(
        lease(&backend).await.and_then(|l| l.fencing_token),
        Some(grant.fencing_token)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn another_schedule_conflicts_and_writes_nothing() -> TestResult {
    let backend = backend_at(T0);
    let (grant, _) = granted(&backend, &ask(T0, holder(), "5m")).await;
    let before = record(&backend).await;
    backend.set_wall_clock(UNIX_EPOCH + ms(T0 + MIN));
    let mut theirs = ask(T0 + MIN, holder(), "5m");
    theirs.fingerprint = "*/5 * * * * * UTC".to_owned();
    let fingerprint = FP.to_owned();
    assert_eq!(
        decide(&backend, &theirs).await,
        TickReply::Conflict {
            fingerprint: fingerprint.clone()
        }
    );
    // Before any other branch: a tick ahead conflicts too.
    theirs.tick = T0 + 2 * MIN;
    theirs.next = T0 + 3 * MIN;
    assert_eq!(
        decide(&backend, &theirs).await,
        TickReply::Conflict { fingerprint }
    );
    let mut after = record(&backend).await;
    assert_eq!(after.server_time, T0 + MIN);
    after.server_time = before.server_time;
    assert_eq!(after, before);
    assert_eq!(
        lease(&backend).await.and_then(|l| l.fencing_token),
        Some(grant.fencing_token)
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_completion_is_recorded_and_releases_the_lease() -> TestResult {
    let backend = backend_at(T0);
    let me = holder();
    let (grant, _) = granted(&backend, &ask(T0, me, "30s")).await;
    let mut released = backend
        .watch_releases(&job().run_key(), WatchPolicy::Counted)
        .await?;
    advance(ms(5_000)).await;
    assert_eq!(
        backend
            .complete_tick(&job(), &me, grant.fencing_token)
            .await?,
        Completion::Completed {
            server_time: T0 + 5_000
        }
    );
    timeout(ms(1), released.released()).await?;
    assert_eq!(lease(&backend).await, None);
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0,
        TickState::Completed,
        TickReason::Done,
        Some(grant.fencing_token),
    );
    assert_run(
        &rec,
        T0,
        grant.fencing_token,
        RunState::Completed,
        TickReason::OnTime,
    );
    let run = rec.run.as_ref().expect("a run");
    assert_eq!(run.ended_at, Some(T0 + 5_000));
    assert_eq!(run.ttl_left, None);
    assert_eq!(rec.counts, counts(1, 1, 0, 0, 0, 0));
    // Said twice: refused, nothing counted twice.
    let Completion::Refused { current } = backend
        .complete_tick(&job(), &me, grant.fencing_token)
        .await?
    else {
        panic!("a second completion must be refused");
    };
    assert_eq!(current.map(|c| c.fencing_token), Some(grant.fencing_token));
    assert_eq!(record(&backend).await.counts, counts(1, 1, 0, 0, 0, 0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_completion_with_an_older_token_is_refused_and_releases_the_lease() -> TestResult {
    let backend = backend_at(T0);
    let me = holder();
    let (first, _) = granted(&backend, &ask(T0, me, "30s")).await;
    assert!(matches!(
        backend
            .complete_tick(&job(), &me, first.fencing_token)
            .await?,
        Completion::Completed { .. }
    ));
    // The same holder runs the next tick; a stale completion of the
    // first run arrives (a retried call).
    backend.set_wall_clock(UNIX_EPOCH + ms(T0 + MIN));
    let (second, _) = granted(&backend, &ask(T0 + MIN, me, "30s")).await;
    assert!(second.fencing_token > first.fencing_token);
    let Completion::Refused { current } = backend
        .complete_tick(&job(), &me, first.fencing_token)
        .await?
    else {
        panic!("an older token must be refused");
    };
    let current = current.expect("the record has a run");
    assert_eq!(
        (current.tick, current.fencing_token),
        (T0 + MIN, second.fencing_token)
    );
    // Nothing recorded; the caller's lease is released all the same.
    assert_eq!(lease(&backend).await, None);
    let rec = record(&backend).await;
    assert_eq!(rec.counts, counts(2, 1, 0, 0, 0, 0));
    assert_decision(
        &rec.decided,
        T0 + MIN,
        TickState::Started,
        TickReason::OnTime,
        Some(second.fencing_token),
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_completion_by_a_holder_that_lost_the_lease_is_refused() -> TestResult {
    let backend = backend_at(T0);
    let (me, thief) = (holder(), holder());
    let (grant, _) = granted(&backend, &ask(T0, me, "30s")).await;
    // Someone else's holder id with the right token: refused, and the
    // run's lease, not the caller's, is left alone.
    assert!(matches!(
        backend
            .complete_tick(&job(), &thief, grant.fencing_token)
            .await?,
        Completion::Refused { .. }
    ));
    assert_eq!(
        lease(&backend).await.and_then(|l| l.fencing_token),
        Some(grant.fencing_token)
    );
    // The run's own lease expires: its completion is refused too.
    advance(ms(30_000)).await;
    assert!(matches!(
        backend
            .complete_tick(&job(), &me, grant.fencing_token)
            .await?,
        Completion::Refused { .. }
    ));
    assert_eq!(record(&backend).await.counts.completed, 0);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn rerun_runs_the_newest_decided_tick_with_a_higher_token() -> TestResult {
    let backend = backend_at(T0);
    let (me, rescuer) = (holder(), holder());
    let (dead, _) = granted(&backend, &ask(T0, me, "90s")).await;
    let claim_it = || claim(dead.fencing_token, OnAbandon::Rerun, rescuer);
    assert_eq!(
        backend.claim_rerun(&claim_it()).await?,
        RerunReply::StillHeld {
            ttl_left: Some(ms(90_000))
        }
    );
    // The next tick comes while the run holds: skipped.
    advance(ms(MIN)).await;
    assert!(matches!(
        decide(&backend, &ask(T0 + MIN, holder(), "90s")).await,
        TickReply::Overlap { .. }
    ));
    assert_eq!(
        backend.claim_rerun(&claim_it()).await?,
        RerunReply::StillHeld {
            ttl_left: Some(ms(30_000))
        }
    );
    // Its node died: the lease runs out.
    advance(ms(30_000)).await;
    assert_eq!(lease(&backend).await, None);
    let RerunReply::Granted { tick, grant } = backend.claim_rerun(&claim_it()).await? else {
        panic!("an abandoned run must be re-run");
    };
    // The newest decided tick, the skipped one, with a higher token.
    assert_eq!(tick, T0 + MIN);
    assert!(grant.fencing_token > dead.fencing_token);
    assert_eq!(
        (grant.key.clone(), grant.holder),
        (job().run_key(), rescuer)
    );
    assert_eq!(
        lease(&backend).await.and_then(|l| l.fencing_token),
        Some(grant.fencing_token)
    );
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0 + MIN,
        TickState::Started,
        TickReason::Rerun,
        Some(grant.fencing_token),
    );
    assert_run(
        &rec,
        T0 + MIN,
        grant.fencing_token,
        RunState::Running,
        TickReason::Rerun,
    );
    assert_eq!(rec.counts, counts(1, 0, 0, 1, 1, 1));
    // A second claim of the dead run: settled, nothing more.
    assert_eq!(backend.claim_rerun(&claim_it()).await?, RerunReply::Settled);
    assert_eq!(record(&backend).await.counts, counts(1, 0, 0, 1, 1, 1));
    // The re-run completes as any run.
    assert!(matches!(
        backend
            .complete_tick(&job(), &rescuer, grant.fencing_token)
            .await?,
        Completion::Completed { .. }
    ));
    assert_eq!(
        backend
            .claim_rerun(&claim(grant.fencing_token, OnAbandon::Rerun, me))
            .await?,
        RerunReply::Settled
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn skip_records_the_abandonment_once() -> TestResult {
    let backend = backend_at(T0);
    let me = holder();
    let (dead, _) = granted(&backend, &ask(T0, me, "30s")).await;
    advance(ms(30_000)).await;
    let skip = claim(dead.fencing_token, OnAbandon::Skip, holder());
    assert_eq!(
        backend.claim_rerun(&skip).await?,
        RerunReply::Abandoned { tick: T0 }
    );
    let rec = record(&backend).await;
    assert_decision(
        &rec.decided,
        T0,
        TickState::Abandoned,
        TickReason::LeaseEnded,
        Some(dead.fencing_token),
    );
    assert_run(
        &rec,
        T0,
        dead.fencing_token,
        RunState::Abandoned,
        TickReason::OnTime,
    );
    assert_eq!(rec.run.as_ref().and_then(|r| r.ended_at), Some(T0 + 30_000));
    assert_eq!(rec.counts, counts(1, 0, 0, 0, 1, 0));
    assert_eq!(backend.claim_rerun(&skip).await?, RerunReply::Settled);
    // Nor does a later decision count it again.
    let TickReply::Decided(d) = decide(&backend, &ask(T0, me, "30s")).await else {
        panic!("the tick is decided");
    };
    assert_eq!(d.state, TickState::Abandoned);
    assert_eq!(record(&backend).await.counts, counts(1, 0, 0, 0, 1, 0));
    assert_eq!(lease(&backend).await, None);
    // A completion of the dead run is refused.
    assert!(matches!(
        backend
            .complete_tick(&job(), &me, dead.fencing_token)
            .await?,
        Completion::Refused { .. }
    ));
    // A claim of a job without a record is settled.
    let none = backend_at(T0);
    assert_eq!(none.claim_rerun(&skip).await?, RerunReply::Settled);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_abandonment_noticed_by_a_decision_is_counted_once() -> TestResult {
    for on_abandon in [OnAbandon::Skip, OnAbandon::Rerun] {
        let backend = backend_at(T0);
        let (dead, _) = granted(&backend, &ask(T0, holder(), "30s")).await;
        // Read while gone but not yet noticed: reported abandoned, not
        // recorded so.
        advance(ms(30_000)).await;
        let read = record(&backend).await;
        assert_eq!(
            read.run.as_ref().map(|r| r.state),
            Some(RunState::Abandoned)
        );
        assert_eq!(read.counts.abandoned, 0);
        // A node asks for the tick again: the decision notices it.
        let TickReply::Decided(d) = decide(&backend, &ask(T0, holder(), "30s")).await else {
            panic!("the tick is decided");
        };
        assert_decision(
            &d,
            T0,
            TickState::Abandoned,
            TickReason::LeaseEnded,
            Some(dead.fencing_token),
        );
        assert_eq!(record(&backend).await.counts.abandoned, 1);
        // Then the claim: not counted again, and still acts.
        let reply = backend
            .claim_rerun(&claim(dead.fencing_token, on_abandon, holder()))
            .await?;
        match on_abandon {
            OnAbandon::Skip => assert_eq!(reply, RerunReply::Abandoned { tick: T0 }),
            _ => assert!(
                matches!(reply, RerunReply::Granted { tick: T0, ref grant } if grant.fencing_token > dead.fencing_token),
                "{reply:?}"
            ),
        }
        assert_eq!(record(&backend).await.counts.abandoned, 1);
        assert_eq!(
            backend
                .claim_rerun(&claim(dead.fencing_token, on_abandon, holder()))
                .await?,
            RerunReply::Settled
        );
        assert_eq!(record(&backend).await.counts.abandoned, 1);
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_decision_after_an_abandonment_starts_the_next_tick() -> TestResult {
    let backend = backend_at(T0);
    let (dead, _) = granted(&backend, &ask(T0, holder(), "30s")).await;
    advance(ms(MIN)).await;
    let (next, _) = granted(&backend, &ask(T0 + MIN, holder(), "30s")).await;
    assert!(next.fencing_token > dead.fencing_token);
    let rec = record(&backend).await;
    assert_eq!(rec.counts, counts(2, 0, 0, 0, 1, 0));
    // The dead run is no longer the current one.
    assert_eq!(
        backend
            .claim_rerun(&claim(dead.fencing_token, OnAbandon::Rerun, holder()))
            .await?,
        RerunReply::Settled
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn the_record_is_gone_after_its_ttl() -> TestResult {
    let backend = backend_at(T0);
    let me = holder();
    let (grant, _) = granted(&backend, &ask(T0, me, "30s")).await;
    let other = JobName::new("hourly")?;
    let mut hourly = ask(T0, holder(), "30s");
    hourly.job = other.clone();
    hourly.run.key = other.run_key();
    granted(&backend, &hourly).await;
    let listed: Vec<JobName> = backend
        .job_records()
        .await?
        .into_iter()
        .map(|r| r.job)
        .collect();
    assert_eq!(listed, vec![other.clone(), job()]);

    // A completion, which names no record ttl, renews the record by the
    // last one asked for; the other record is not renewed.
    advance(ms(10_000)).await;
    assert!(matches!(
        backend
            .complete_tick(&job(), &me, grant.fencing_token)
            .await?,
        Completion::Completed { .. }
    ));
    advance(RECORD_TTL - ms(10_000)).await;
    assert_eq!(backend.job_record(&other).await?, None);
    advance(ms(10_000 - 1)).await;
    assert!(backend.job_record(&job()).await?.is_some());
    advance(ms(1)).await;
    assert_eq!(backend.job_record(&job()).await?, None);
    assert_eq!(backend.job_records().await?, vec![]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn every_write_renews_the_record() -> TestResult {
    let backend = backend_at(T0);
    granted(&backend, &ask(T0, holder(), "90s")).await;
    advance(ms(MIN)).await;
    assert!(matches!(
        decide(&backend, &ask(T0 + MIN, holder(), "90s")).await,
        TickReply::Overlap { .. }
    ));
    assert_eq!(record(&backend).await.last_seen, T0 + MIN);
    advance(RECORD_TTL - ms(1)).await;
    assert!(backend.job_record(&job()).await?.is_some());
    advance(ms(1)).await;
    assert_eq!(backend.job_record(&job()).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn set_wall_clock_moves_decisions() -> TestResult {
    let backend = backend_at(T0);
    let request = ask(T0 + 30_000, holder(), "30s");
    assert_eq!(
        decide(&backend, &request).await,
        TickReply::Due { wait: ms(30_000) }
    );
    // A clone re-bases the clock of every clone; no tokio time passes.
    backend.clone().set_wall_clock(UNIX_EPOCH + ms(T0 + 30_000));
    assert_eq!(backend.wall_clock(), UNIX_EPOCH + ms(T0 + 30_000));
    let answer = backend.decide_tick(&request).await?;
    assert_eq!(answer.server_time, T0 + 30_000);
    assert!(matches!(
        answer.reply,
        TickReply::Granted {
            reason: TickReason::OnTime,
            ..
        }
    ));
    // The clock advances with tokio's.
    advance(ms(1_500)).await;
    assert_eq!(backend.wall_clock(), UNIX_EPOCH + ms(T0 + 31_500));
    // Stepped back, the next tick is due again, and one more than a
    // period ahead is a clock ahead.
    backend.set_wall_clock(UNIX_EPOCH + ms(T0));
    assert_eq!(
        decide(&backend, &ask(T0 + MIN, holder(), "30s")).await,
        TickReply::Due { wait: ms(MIN) }
    );
    assert_eq!(
        decide(&backend, &ask(T0 + MIN + 30_000, holder(), "30s")).await,
        TickReply::ClockAhead {
            ahead: ms(MIN + 30_000)
        }
    );
    // By default it is the system's clock.
    let fresh = MemoryBackend::new();
    let now = SystemTime::now();
    let read = fresh.wall_clock();
    assert!(read <= now + ms(1_000) && now <= read + ms(1_000));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn malformed_requests_are_refused() -> TestResult {
    let backend = backend_at(T0);
    let mut wrong_key = ask(T0, holder(), "30s");
    wrong_key.run.key = leasehold_core::LeaseKey::new("elsewhere")?;
    let refused = backend.decide_tick(&wrong_key).await;
    assert!(
        matches!(
            refused,
            Err(leasehold_core::BackendError::InvalidRequest { .. })
        ),
        "{refused:?}"
    );
    let mut backwards = ask(T0, holder(), "30s");
    backwards.next = T0;
    let refused = backend.decide_tick(&backwards).await;
    assert!(
        matches!(
            refused,
            Err(leasehold_core::BackendError::InvalidRequest { .. })
        ),
        "{refused:?}"
    );
    let mut long = ask(T0, holder(), "30s");
    long.fingerprint = "x".repeat(TickRequest::MAX_FINGERPRINT + 1);
    let refused = backend.decide_tick(&long).await;
    assert!(
        matches!(
            refused,
            Err(leasehold_core::BackendError::InvalidRequest { .. })
        ),
        "{refused:?}"
    );
    let mut held_at_least = ask(T0, holder(), "30s");
    held_at_least.run = held_at_least.run.with_hold_at_least(ms(5_000))?;
    let refused = backend.decide_tick(&held_at_least).await;
    assert!(
        matches!(
            refused,
            Err(leasehold_core::BackendError::InvalidRequest { .. })
        ),
        "{refused:?}"
    );
    assert_eq!(backend.job_record(&job()).await?, None);
    assert_eq!(lease(&backend).await, None);
    // The backend's faults apply to ticks too.
    backend.fail_next(1);
    let error = backend
        .decide_tick(&ask(T0, holder(), "30s"))
        .await
        .expect_err("an injected failure");
    assert!(error.is_transient());
    // A record ttl too long for the clock does not overflow it.
    let forever = ask(T0, holder(), "30s").with_record_ttl(Duration::MAX);
    granted(&backend, &forever).await;
    advance(Duration::from_secs(365 * 24 * 3600)).await;
    assert!(backend.job_record(&job()).await?.is_some());
    assert_eq!(
        backend.release(&job().run_key(), &holder()).await?,
        ReleaseReport::NotHeld
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_run_key_taken_outside_the_job_overlaps_and_holds_a_claim() -> TestResult {
    let backend = backend_at(T0);
    let (dead, _) = granted(&backend, &ask(T0, holder(), "30s")).await;
    advance(ms(30_000)).await;
    // Someone takes the run key itself (not through the job).
    let theirs = backend.hand_over(&job().run_key(), ttl("2m"))?;
    assert!(theirs.fencing_token > dead.fencing_token);
    backend.set_wall_clock(UNIX_EPOCH + ms(T0 + MIN));
    let reply = decide(&backend, &ask(T0 + MIN, holder(), "30s")).await;
    let TickReply::Overlap { running } = reply else {
        panic!("a held run key overlaps: {reply:?}");
    };
    // A holder the record does not know: tick 0.
    assert_eq!(
        (running.tick, running.fencing_token),
        (0, theirs.fencing_token)
    );
    let rec = record(&backend).await;
    assert_eq!(rec.counts, counts(1, 0, 0, 1, 1, 0));
    assert_run(
        &rec,
        T0,
        dead.fencing_token,
        RunState::Abandoned,
        TickReason::OnTime,
    );
    // Nothing can re-run while the key is held.
    assert!(matches!(
        backend
            .claim_rerun(&claim(dead.fencing_token, OnAbandon::Rerun, holder()))
            .await?,
        RerunReply::StillHeld { ttl_left: Some(_) }
    ));
    Ok(())
}
