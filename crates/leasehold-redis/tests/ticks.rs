//! Scheduled jobs' records (`TickBackend`) against real servers, judged by
//! the server's own state read on a side connection: the record's fields
//! (`HGETALL`), its expiry (`PTTL`), the run lease (`GET`, `EXISTS`), the
//! release notices on its channel, and the cluster slot and master of each
//! key. Ticks are placed by the server's own clock (`TIME`), which is the
//! clock that decides.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{TestResult, holder};
use futures_util::StreamExt;
use leasehold_core::{
    AcquireRequest, BackendError, CatchUp, Completion, FencingToken, Grant, HolderId, JobName,
    LeaseBackend, LeaseKey, OnAbandon, RerunReply, RerunRequest, RunState, TickAnswer, TickBackend,
    TickReason, TickReply, TickRequest, TickState, Ttl,
};
use leasehold_redis::redis::{self, AsyncCommands};
use leasehold_redis::{KeyLayout, RedisBackend, RedlockBackend};
use leasehold_testkit::{RedisCluster, RedisServer};
use tokio::time::{Instant, timeout};

/// The longest any wait of these tests may take.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long the records of these tests live after a write.
const RECORD_TTL: Duration = Duration::from_secs(600);

/// One minute, in ms: the schedules' period.
const MINUTE: u64 = 60_000;

type Side = redis::aio::MultiplexedConnection;

fn job(name: &str) -> JobName {
    JobName::new(name).expect("a valid job name")
}

async fn side(url: &str) -> redis::RedisResult<Side> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

async fn connect(url: String) -> Result<RedisBackend, Box<dyn std::error::Error>> {
    Ok(timeout(PATIENCE, RedisBackend::connect(url)).await??)
}

/// The server's clock, in UNIX ms: the clock the scripts decide by.
async fn server_ms(side: &mut Side) -> redis::RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(side).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// The Redis keys of `job`: its record and its run lease.
fn keys(job: &JobName) -> (String, String) {
    let layout = KeyLayout::default();
    (layout.job_record(job), layout.lease(&job.run_key()))
}

/// The record of `job` as the server keeps it.
async fn record(side: &mut Side, job: &JobName) -> redis::RedisResult<HashMap<String, String>> {
    side.hgetall(keys(job).0).await
}

/// The run lease of `job` as the server keeps it.
async fn run_lease(side: &mut Side, job: &JobName) -> redis::RedisResult<Option<String>> {
    side.get(keys(job).1).await
}

fn field<'a>(record: &'a HashMap<String, String>, name: &str) -> &'a str {
    record.get(name).map_or("<absent>", String::as_str)
}

/// A request for `tick` (then `next`) of `job` under `fingerprint`, whose
/// run would be `who`'s for `ttl`; start deadline 10 s.
fn ask(
    job: &JobName,
    fingerprint: &str,
    tick: u64,
    next: u64,
    who: HolderId,
    ttl: &str,
) -> TickRequest {
    let run = AcquireRequest::new(job.run_key(), who, Ttl::parse(ttl).expect("a valid ttl"))
        .with_label("node-a")
        .expect("a valid label");
    TickRequest::new(job.clone(), fingerprint, tick, next, run)
        .with_start_deadline(Duration::from_secs(10))
        .with_record_ttl(RECORD_TTL)
}

/// A request to settle the abandoned run `token` of `job` by `policy`, a
/// re-run being `who`'s.
fn rerun(job: &JobName, token: FencingToken, policy: OnAbandon, who: HolderId) -> RerunRequest {
    let run = AcquireRequest::new(job.run_key(), who, Ttl::parse("30s").expect("a valid ttl"));
    RerunRequest::new(job.clone(), token, policy, RECORD_TTL, run)
}

async fn decide(
    backend: &impl TickBackend,
    request: &TickRequest,
) -> Result<TickAnswer, Box<dyn std::error::Error>> {
    Ok(timeout(PATIENCE, backend.decide_tick(request)).await??)
}

/// Decides a tick that must be granted.
async fn granted(
    backend: &impl TickBackend,
    request: &TickRequest,
) -> Result<(Grant, TickReason), Box<dyn std::error::Error>> {
    match decide(backend, request).await?.reply {
        TickReply::Granted { grant, reason } => Ok((grant, reason)),
        other => Err(format!("tick {} should be granted: {other:?}", request.tick).into()),
    }
}

/// Waits until the server's clock reads `at` (UNIX ms) or later.
async fn until_server(side: &mut Side, at: u64) -> TestResult {
    let deadline = Instant::now() + PATIENCE;
    while server_ms(side).await? < at {
        if Instant::now() > deadline {
            return Err(format!("the server's clock did not reach {at} in {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Waits until the run lease of `job` is gone from the server.
async fn until_gone(side: &mut Side, job: &JobName) -> TestResult {
    let run = keys(job).1;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let exists: bool = side.exists(&run).await?;
        if !exists {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{run} still exists after {PATIENCE:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that the server frees `key` `ms` after a write it made while
/// its clock read between `before` and `after` (`TIME` read just before
/// and just after the call): its `PEXPIRETIME` (Redis 7.0) lies in
/// [before + ms, after + ms + 1], the server keeping an expiry in whole
/// milliseconds. As wide as the call's round trip, with no allowance of
/// its own: an expiry cut by any part of `ms` shows.
async fn assert_kept(
    side: &mut Side,
    key: &str,
    (before, after): (u64, u64),
    ms: u64,
    what: &str,
) -> TestResult {
    let end: i64 = redis::cmd("PEXPIRETIME").arg(key).query_async(side).await?;
    let (low, high) = (before + ms, after + ms + 1);
    assert!(
        u64::try_from(end).is_ok_and(|end| (low..=high).contains(&end)),
        "{what}: the server frees {key} at {end}, not {ms} ms after the call ([{low}, {high}])"
    );
    Ok(())
}

/// A tick on time is granted once; the same tick asked by another node is
/// that decision. The record says so, the run lease is the grant's, and
/// the record expires within its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_on_time_is_granted_once_and_then_decided_for_every_node() -> TestResult {
    let server = RedisServer::start()?;
    let (first, second) = (connect(server.url()).await?, connect(server.url()).await?);
    let mut side = side(&server.url()).await?;
    let nightly = job("nightly");
    let now = server_ms(&mut side).await?;
    let tick = now - 50;
    let (a, b) = (holder(), holder());

    let answer = decide(
        &first,
        &ask(&nightly, "* * * * *", tick, tick + MINUTE, a, "30s"),
    )
    .await?;
    let after = server_ms(&mut side).await?;
    assert!(answer.server_time >= now, "{answer:?}");
    let TickReply::Granted { grant, reason } = answer.reply else {
        return Err(format!("not granted: {answer:?}").into());
    };
    assert_eq!(reason, TickReason::OnTime);
    assert_eq!(grant.key, nightly.run_key());

    let kept = record(&mut side, &nightly).await?;
    let token = grant.fencing_token.0.to_string();
    let tick_text = tick.to_string();
    for (name, value) in [
        ("fingerprint", "* * * * *"),
        ("decided", &tick_text),
        ("decided_state", "started"),
        ("decided_reason", "on-time"),
        ("decided_token", &token),
        ("run_tick", &tick_text),
        ("run_token", &token),
        ("run_state", "running"),
        ("run_reason", "on-time"),
        ("run_label", "node-a"),
        ("started", "1"),
    ] {
        assert_eq!(field(&kept, name), value, "{name} in {kept:?}");
    }
    assert_eq!(field(&kept, "run_holder"), a.to_hex());
    let lease = run_lease(&mut side, &nightly)
        .await?
        .ok_or("no run lease")?;
    assert_eq!(lease, format!("{}:{token}:node-a", a.to_hex()));
    let keep = u64::try_from(RECORD_TTL.as_millis())?;
    assert_kept(
        &mut side,
        &keys(&nightly).0,
        (now, after),
        keep,
        "the record after a grant",
    )
    .await?;

    // Another node, same tick: the decision, and nothing changes.
    let answer = decide(
        &second,
        &ask(&nightly, "* * * * *", tick, tick + MINUTE, b, "30s"),
    )
    .await?;
    let TickReply::Decided(decision) = answer.reply else {
        return Err(format!("not the decision: {answer:?}").into());
    };
    assert_eq!((decision.tick, decision.state), (tick, TickState::Started));
    assert_eq!(decision.reason, TickReason::OnTime);
    let run = decision.run.ok_or("no run in the decision")?;
    assert_eq!((run.tick, run.fencing_token), (tick, grant.fencing_token));
    assert_eq!(run.label.as_deref(), Some("node-a"));
    assert_eq!(record(&mut side, &nightly).await?, kept);
    assert_eq!(run_lease(&mut side, &nightly).await?, Some(lease));

    // The record as the backend reads it, and the lease renews as any.
    let read = first.job_record(&nightly).await?.ok_or("no record")?;
    assert_eq!(read.decided.tick, tick);
    let run = read.run.ok_or("no run")?;
    assert_eq!(run.state, RunState::Running);
    assert_eq!(run.info.fencing_token, grant.fencing_token);
    // Its time left: no more than the run's ttl, no less than the server
    // has left just after the read.
    let shown = run.ttl_left.ok_or("no ttl shown for the run")?;
    let left: u64 = side.pttl(keys(&nightly).1).await?;
    assert!(
        Duration::from_millis(left) <= shown && shown <= Duration::from_secs(30),
        "the run shown with {shown:?} left; the server had {left} ms left just after"
    );
    assert_eq!(read.counts.started, 1);
    let renewed = first
        .renew(&leasehold_core::RenewRequest::new(
            nightly.run_key(),
            a,
            Ttl::parse("30s")?,
        ))
        .await?;
    assert_eq!(renewed, leasehold_core::RenewOutcome::Renewed);
    Ok(())
}

/// A tick ahead of the server's clock is due in its distance, or, beyond
/// one period, a clock ahead; neither writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_ahead_is_due_or_a_clock_ahead_and_writes_nothing() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let hourly = job("hourly");
    let now = server_ms(&mut side).await?;

    let soon = now + 5_000;
    let answer = decide(
        &backend,
        &ask(&hourly, "h", soon, soon + MINUTE, holder(), "30s"),
    )
    .await?;
    match answer.reply {
        TickReply::Due { wait } => {
            assert!(
                wait <= Duration::from_secs(5) && wait > Duration::from_secs(4),
                "{wait:?}"
            );
        }
        other => return Err(format!("not due: {other:?}").into()),
    }
    let far = now + 2 * MINUTE;
    let answer = decide(
        &backend,
        &ask(&hourly, "h", far, far + MINUTE, holder(), "30s"),
    )
    .await?;
    match answer.reply {
        TickReply::ClockAhead { ahead } => {
            assert!(ahead > Duration::from_secs(110), "{ahead:?}");
        }
        other => return Err(format!("not a clock ahead: {other:?}").into()),
    }
    let (record_key, run_key) = keys(&hourly);
    let exists: (bool, bool) = (
        side.exists(&record_key).await?,
        side.exists(&run_key).await?,
    );
    assert_eq!(exists, (false, false), "nothing written");
    Ok(())
}

/// A late tick is missed, with no record as with one: recorded, counted,
/// never granted, whether late by its deadline or past the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_tick_is_missed_with_or_without_a_record() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let daily = job("daily");
    let now = server_ms(&mut side).await?;

    // Late by three quarters of its 10 s deadline: still on time.
    let hourly = job("hourly");
    let tick = now - 7_500;
    let request = ask(&hourly, "h", tick, tick + MINUTE, holder(), "30s");
    let (_, reason) = granted(&backend, &request).await?;
    assert_eq!(reason, TickReason::OnTime, "a tick within its deadline");

    // No record; past its 10 s deadline, before the next tick.
    let tick = now - 20_000;
    let answer = decide(
        &backend,
        &ask(&daily, "d", tick, tick + MINUTE, holder(), "30s"),
    )
    .await?;
    assert_eq!(answer.reply, TickReply::Missed);
    let kept = record(&mut side, &daily).await?;
    assert_eq!(field(&kept, "decided"), tick.to_string());
    assert_eq!(field(&kept, "decided_state"), "missed");
    assert_eq!(field(&kept, "decided_reason"), "late");
    assert_eq!(field(&kept, "missed"), "1");
    assert!(!kept.contains_key("run_token"), "{kept:?}");

    // With a record: a later tick, past its next tick whatever the deadline.
    let later = tick + 1_000;
    let request = ask(&daily, "d", later, now - 1, holder(), "30s")
        .with_start_deadline(Duration::from_secs(3600));
    assert_eq!(decide(&backend, &request).await?.reply, TickReply::Missed);
    let kept = record(&mut side, &daily).await?;
    assert_eq!(field(&kept, "decided"), later.to_string());
    assert_eq!(field(&kept, "missed"), "2");
    assert_eq!(field(&kept, "started"), "<absent>");
    assert_eq!(run_lease(&mut side, &daily).await?, None, "never granted");

    // The missed tick asked again: that decision.
    let answer = decide(&backend, &ask(&daily, "d", later, now - 1, holder(), "30s")).await?;
    match answer.reply {
        TickReply::Decided(decision) => {
            assert_eq!((decision.tick, decision.state), (later, TickState::Missed));
            assert_eq!(decision.run, None);
        }
        other => return Err(format!("not decided: {other:?}").into()),
    }
    Ok(())
}

/// Under catch-up "latest", a late tick that is still the newest is started
/// once (reason catch-up); an older late tick is missed all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_up_latest_starts_a_late_newest_tick_once() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let report = job("report");
    let now = server_ms(&mut side).await?;

    let tick = now - 20_000;
    let late =
        ask(&report, "r", tick, now + 40_000, holder(), "30s").with_catch_up(CatchUp::Latest);
    let (grant, reason) = granted(&backend, &late).await?;
    assert_eq!(reason, TickReason::CatchUp);
    let kept = record(&mut side, &report).await?;
    assert_eq!(field(&kept, "decided_reason"), "catch-up");
    assert_eq!(field(&kept, "run_reason"), "catch-up");
    assert_eq!(field(&kept, "run_token"), grant.fencing_token.0.to_string());
    assert_eq!(field(&kept, "started"), "1");

    // Asked again, by another node: the decision, not a second start.
    let again =
        ask(&report, "r", tick, now + 40_000, holder(), "30s").with_catch_up(CatchUp::Latest);
    assert!(matches!(
        decide(&backend, &again).await?.reply,
        TickReply::Decided(d) if d.tick == tick && d.state == TickState::Started
    ));
    assert_eq!(field(&record(&mut side, &report).await?, "started"), "1");

    // A late tick that is no longer the newest (its next tick has passed).
    let other = job("report-old");
    let old = ask(&other, "r", now - 2 * MINUTE, now - MINUTE, holder(), "30s")
        .with_catch_up(CatchUp::Latest);
    assert_eq!(decide(&backend, &old).await?.reply, TickReply::Missed);
    assert_eq!(run_lease(&mut side, &other).await?, None);
    Ok(())
}

/// A tick due while the previous run still holds the job's lease is skipped
/// for overlap, recorded with the run that holds, which keeps its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_due_while_the_run_holds_is_skipped_for_overlap() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let sync = job("sync");
    let now = server_ms(&mut side).await?;
    let (first, second) = (now - 100, now + 200);
    let a = holder();

    let (grant, _) = granted(&backend, &ask(&sync, "s", first, second, a, "30s")).await?;
    let lease = run_lease(&mut side, &sync).await?;
    until_server(&mut side, second).await?;
    let answer = decide(
        &backend,
        &ask(&sync, "s", second, second + MINUTE, holder(), "30s"),
    )
    .await?;
    let TickReply::Overlap { running } = answer.reply else {
        return Err(format!("not an overlap: {answer:?}").into());
    };
    assert_eq!(
        (running.tick, running.fencing_token),
        (first, grant.fencing_token)
    );
    let kept = record(&mut side, &sync).await?;
    for (name, value) in [
        ("decided", second.to_string()),
        ("decided_state", "skipped".to_owned()),
        ("decided_reason", "overlap".to_owned()),
        ("decided_run_tick", first.to_string()),
        ("decided_token", grant.fencing_token.0.to_string()),
        ("skipped", "1".to_owned()),
        ("started", "1".to_owned()),
        ("run_tick", first.to_string()),
        ("run_state", "running".to_owned()),
    ] {
        assert_eq!(field(&kept, name), value, "{name} in {kept:?}");
    }
    assert_eq!(
        run_lease(&mut side, &sync).await?,
        lease,
        "the run keeps its lease"
    );
    Ok(())
}

/// Another schedule's request for a job is a conflict, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_schedule_conflicts_and_writes_nothing() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let backup = job("backup");
    let now = server_ms(&mut side).await?;
    granted(
        &backend,
        &ask(
            &backup,
            "0 * * * * UTC",
            now - 100,
            now + MINUTE,
            holder(),
            "30s",
        ),
    )
    .await?;
    let before = (
        record(&mut side, &backup).await?,
        run_lease(&mut side, &backup).await?,
    );

    let answer = decide(
        &backend,
        &ask(
            &backup,
            "0 * * * * Europe/Paris",
            now - 50,
            now + MINUTE,
            holder(),
            "30s",
        ),
    )
    .await?;
    assert_eq!(
        answer.reply,
        TickReply::Conflict {
            fingerprint: "0 * * * * UTC".to_owned()
        }
    );
    let after = (
        record(&mut side, &backup).await?,
        run_lease(&mut side, &backup).await?,
    );
    assert_eq!(before, after, "nothing written");
    Ok(())
}

/// A completion by the run's token is recorded and releases the run lease
/// (announced on its channel); one by an older token is refused, and
/// leaves the current run's lease and record alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_is_fenced_by_the_runs_token() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let export = job("export");
    let now = server_ms(&mut side).await?;
    let (first, second) = (now - 100, now + 200);
    let (a, b) = (holder(), holder());
    let mut pubsub = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub
        .subscribe(format!("{}:released", keys(&export).1))
        .await?;

    let (grant, _) = granted(&backend, &ask(&export, "e", first, second, a, "30s")).await?;
    let before = server_ms(&mut side).await?;
    let done = timeout(
        PATIENCE,
        backend.complete_tick(&export, &a, grant.fencing_token),
    )
    .await??;
    let after = server_ms(&mut side).await?;
    let Completion::Completed { server_time } = done else {
        return Err(format!("not completed: {done:?}").into());
    };
    assert!(server_time >= now);
    assert_eq!(
        run_lease(&mut side, &export).await?,
        None,
        "the lease is released"
    );
    let notice = timeout(PATIENCE, pubsub.on_message().next()).await?;
    assert!(notice.is_some(), "the release is announced");
    let kept = record(&mut side, &export).await?;
    for (name, value) in [
        ("run_state", "completed"),
        ("decided_state", "completed"),
        ("decided_reason", "done"),
        ("completed", "1"),
    ] {
        assert_eq!(field(&kept, name), value, "{name} in {kept:?}");
    }
    assert!(kept.contains_key("run_ended"), "{kept:?}");
    let keep = u64::try_from(RECORD_TTL.as_millis())?;
    assert_kept(
        &mut side,
        &keys(&export).0,
        (before, after),
        keep,
        "the record after a completion",
    )
    .await?;
    // Completed twice: refused, counted once.
    let again = backend
        .complete_tick(&export, &a, grant.fencing_token)
        .await?;
    assert!(
        matches!(again, Completion::Refused { current: Some(run) } if run.fencing_token == grant.fencing_token)
    );
    assert_eq!(field(&record(&mut side, &export).await?, "completed"), "1");

    // The next tick's run; the first run's token is now an older one.
    until_server(&mut side, second).await?;
    let (newer, _) = granted(
        &backend,
        &ask(&export, "e", second, second + MINUTE, b, "30s"),
    )
    .await?;
    assert!(newer.fencing_token > grant.fencing_token);
    let lease = run_lease(&mut side, &export).await?;
    let refused = backend
        .complete_tick(&export, &a, grant.fencing_token)
        .await?;
    let Completion::Refused {
        current: Some(current),
    } = refused
    else {
        return Err(format!("not refused with the current run: {refused:?}").into());
    };
    assert_eq!(
        (current.tick, current.fencing_token),
        (second, newer.fencing_token)
    );
    assert_eq!(
        run_lease(&mut side, &export).await?,
        lease,
        "the newer run keeps its lease"
    );
    let kept = record(&mut side, &export).await?;
    assert_eq!(field(&kept, "run_state"), "running");
    assert_eq!(field(&kept, "completed"), "1");

    // The current holder with an older token: refused, and its lease
    // released all the same.
    let refused = backend
        .complete_tick(&export, &b, grant.fencing_token)
        .await?;
    assert!(matches!(refused, Completion::Refused { .. }), "{refused:?}");
    assert_eq!(run_lease(&mut side, &export).await?, None);
    assert_eq!(field(&record(&mut side, &export).await?, "completed"), "1");
    Ok(())
}

/// A run whose lease is still there is still held; once its lease has
/// expired, a re-run starts the newest decided tick (a tick skipped while
/// the dead run held) with a strictly higher token, counted once; the
/// claim then is settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_run_is_rerun_for_the_newest_decided_tick() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let invoice = job("invoice");
    let now = server_ms(&mut side).await?;
    let (first, second) = (now - 100, now + 200);

    let (dead, _) = granted(&backend, &ask(&invoice, "i", first, second, holder(), "2s")).await?;
    let claim = rerun(&invoice, dead.fencing_token, OnAbandon::Rerun, holder());
    match backend.claim_rerun(&claim).await? {
        RerunReply::StillHeld { ttl_left } => {
            assert!(
                ttl_left.is_some_and(|t| t <= Duration::from_secs(2)),
                "{ttl_left:?}"
            );
        }
        other => return Err(format!("not still held: {other:?}").into()),
    }
    // Skipped while the dead run still held.
    until_server(&mut side, second).await?;
    let answer = decide(
        &backend,
        &ask(&invoice, "i", second, second + MINUTE, holder(), "30s"),
    )
    .await?;
    assert!(
        matches!(answer.reply, TickReply::Overlap { .. }),
        "{answer:?}"
    );
    let kept = record(&mut side, &invoice).await?;
    assert_eq!(field(&kept, "run_state"), "running");
    assert_eq!(field(&kept, "abandoned"), "<absent>");

    until_gone(&mut side, &invoice).await?;
    let c = holder();
    let claim = rerun(&invoice, dead.fencing_token, OnAbandon::Rerun, c);
    let before = server_ms(&mut side).await?;
    let RerunReply::Granted { tick, grant } = backend.claim_rerun(&claim).await? else {
        return Err("the re-run was not granted".into());
    };
    let after = server_ms(&mut side).await?;
    let keep = u64::try_from(RECORD_TTL.as_millis())?;
    assert_kept(
        &mut side,
        &keys(&invoice).0,
        (before, after),
        keep,
        "the record after a re-run",
    )
    .await?;
    assert_eq!(tick, second, "the newest decided tick");
    assert!(grant.fencing_token > dead.fencing_token);
    let kept = record(&mut side, &invoice).await?;
    let token = grant.fencing_token.0.to_string();
    for (name, value) in [
        ("run_tick", second.to_string()),
        ("run_token", token.clone()),
        ("run_state", "running".to_owned()),
        ("run_reason", "rerun".to_owned()),
        ("decided", second.to_string()),
        ("decided_state", "started".to_owned()),
        ("decided_reason", "rerun".to_owned()),
        ("decided_token", token.clone()),
        ("abandoned", "1".to_owned()),
        ("reruns", "1".to_owned()),
    ] {
        assert_eq!(field(&kept, name), value, "{name} in {kept:?}");
    }
    let lease = run_lease(&mut side, &invoice)
        .await?
        .ok_or("no run lease")?;
    assert!(
        lease.starts_with(&format!("{}:{token}:", c.to_hex())),
        "{lease}"
    );

    // Claimed again: the abandoned token is no longer the current run.
    assert_eq!(backend.claim_rerun(&claim).await?, RerunReply::Settled);
    assert_eq!(field(&record(&mut side, &invoice).await?, "reruns"), "1");
    Ok(())
}

/// Under "skip", an abandoned run is recorded as abandoned once, with its
/// tick's decision, and nothing is granted; the next decision finds it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_run_skipped_is_recorded_once() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let cleanup = job("cleanup");
    let now = server_ms(&mut side).await?;
    let tick = now - 100;

    let (dead, _) = granted(
        &backend,
        &ask(&cleanup, "c", tick, tick + MINUTE, holder(), "300ms"),
    )
    .await?;
    until_gone(&mut side, &cleanup).await?;
    let claim = rerun(&cleanup, dead.fencing_token, OnAbandon::Skip, holder());
    let before = server_ms(&mut side).await?;
    assert_eq!(
        backend.claim_rerun(&claim).await?,
        RerunReply::Abandoned { tick }
    );
    let after = server_ms(&mut side).await?;
    let keep = u64::try_from(RECORD_TTL.as_millis())?;
    assert_kept(
        &mut side,
        &keys(&cleanup).0,
        (before, after),
        keep,
        "the record after an abandon",
    )
    .await?;
    // A second watcher's claim finds it settled: counted by one watcher.
    assert_eq!(backend.claim_rerun(&claim).await?, RerunReply::Settled);
    // And a re-run claimed after it does not run it again.
    let late = rerun(&cleanup, dead.fencing_token, OnAbandon::Rerun, holder());
    assert_eq!(backend.claim_rerun(&late).await?, RerunReply::Settled);
    let kept = record(&mut side, &cleanup).await?;
    for (name, value) in [
        ("run_state", "abandoned"),
        ("decided_state", "abandoned"),
        ("decided_reason", "lease-ended"),
        ("abandoned", "1"),
    ] {
        assert_eq!(field(&kept, name), value, "{name} in {kept:?}");
    }
    assert!(kept.contains_key("run_ended"), "{kept:?}");
    assert_eq!(
        run_lease(&mut side, &cleanup).await?,
        None,
        "nothing granted"
    );
    let answer = decide(
        &backend,
        &ask(&cleanup, "c", tick, tick + MINUTE, holder(), "30s"),
    )
    .await?;
    assert!(matches!(
        answer.reply,
        TickReply::Decided(d) if d.state == TickState::Abandoned && d.reason == TickReason::LeaseEnded
    ));
    let read = backend.job_record(&cleanup).await?.ok_or("no record")?;
    assert_eq!(read.run.map(|r| r.state), Some(RunState::Abandoned));
    assert_eq!(read.counts.abandoned, 1);
    Ok(())
}

/// A run whose lease ended without anyone claiming it is settled as
/// abandoned by the next decision, which then starts the next tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_decision_settles_a_run_whose_lease_ended() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let rollup = job("rollup");
    let now = server_ms(&mut side).await?;
    let tick = now - 100;

    let (dead, _) = granted(
        &backend,
        &ask(&rollup, "r", tick, tick + MINUTE, holder(), "2s"),
    )
    .await?;
    // Read while it runs: running, with the time left on its lease.
    let read = backend.job_record(&rollup).await?.ok_or("no record")?;
    let run = read.run.as_ref().ok_or("no run")?;
    assert_eq!(run.state, RunState::Running);
    assert!(
        run.ttl_left.is_some_and(|t| t <= Duration::from_secs(2)),
        "{run:?}"
    );
    until_gone(&mut side, &rollup).await?;
    // Read once its lease is gone: reported abandoned, not yet recorded so.
    let read = backend.job_record(&rollup).await?.ok_or("no record")?;
    assert_eq!(
        read.run.as_ref().map(|r| r.state),
        Some(RunState::Abandoned)
    );
    assert_eq!(
        field(&record(&mut side, &rollup).await?, "run_state"),
        "running"
    );

    let later = server_ms(&mut side).await?.max(tick + 1);
    let (next, _) = granted(
        &backend,
        &ask(&rollup, "r", later, later + MINUTE, holder(), "30s"),
    )
    .await?;
    assert!(next.fencing_token > dead.fencing_token);
    let kept = record(&mut side, &rollup).await?;
    assert_eq!(field(&kept, "abandoned"), "1");
    assert_eq!(field(&kept, "started"), "2");
    assert_eq!(field(&kept, "run_token"), next.fencing_token.0.to_string());
    // The dead run's claim is settled: a newer run is current.
    let claim = rerun(&rollup, dead.fencing_token, OnAbandon::Rerun, holder());
    assert_eq!(backend.claim_rerun(&claim).await?, RerunReply::Settled);
    Ok(())
}

/// Every job's record is listed, and a key of another type, or a run lease
/// that is not the job's, is a typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_is_listed_and_bad_requests_are_typed_errors() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let now = server_ms(&mut side).await?;
    for (name, fingerprint) in [("alpha", "a"), ("beta", "b")] {
        granted(
            &backend,
            &ask(
                &job(name),
                fingerprint,
                now - 100,
                now + MINUTE,
                holder(),
                "30s",
            ),
        )
        .await?;
    }
    // A lease key and another namespace's look-alike are not records.
    let _: () = side.set("leasehold:job:{gamma}:run", "x").await?;
    let _: () = side
        .hset("other:job:{delta}:record", "decided", "1")
        .await?;
    let records = timeout(PATIENCE, backend.job_records()).await??;
    let listed: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r.job.as_str(), r.fingerprint.as_str()))
        .collect();
    assert_eq!(listed, [("alpha", "a"), ("beta", "b")]);

    let clash = job("clash");
    let _: () = side.set(keys(&clash).0, "a string").await?;
    let refused = backend
        .decide_tick(&ask(&clash, "c", now - 100, now + MINUTE, holder(), "30s"))
        .await;
    assert!(
        matches!(refused, Err(BackendError::WrongType { .. })),
        "{refused:?}"
    );

    let mut wrong = ask(&job("wrong"), "w", now - 100, now + MINUTE, holder(), "30s");
    wrong.run.key = LeaseKey::new("not-the-run-key")?;
    let refused = backend.decide_tick(&wrong).await;
    assert!(
        matches!(refused, Err(BackendError::InvalidRequest { .. })),
        "{refused:?}"
    );
    let exists: bool = side.exists(keys(&job("wrong")).0).await?;
    assert!(!exists);
    Ok(())
}

/// Redlock keeps no job records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_has_no_ticks() -> TestResult {
    let masters = leasehold_testkit::independent_masters(3)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    assert!(backend.ticks().is_none());
    let server = RedisServer::start()?;
    assert!(connect(server.url()).await?.ticks().is_some());
    Ok(())
}

/// On a cluster: a job's record and run lease share its slot, on the master
/// that serves it; decide and complete work there, and the listing reaches
/// the records on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_jobs_keys_share_its_slot_and_every_master_is_listed() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = connect(cluster.url()).await?;
    let mut any = side(&cluster.nodes()[0].url()).await?;
    let now = server_ms(&mut any).await?;
    // Jobs on at least two masters.
    let mut jobs = Vec::new();
    let mut masters = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = job(&format!("job-{i}"));
        let slot = cluster.keyslot(&keys(&name).0)?;
        masters.insert(cluster.master_of_slot(slot)?);
        jobs.push(name);
    }
    assert!(masters.len() >= 2, "{masters:?}");

    let nightly = &jobs[0];
    let (record_key, run_key) = keys(nightly);
    let slot = cluster.keyslot(&record_key)?;
    assert_eq!(cluster.keyslot(&run_key)?, slot);
    assert_eq!(cluster.keyslot(&format!("{run_key}:fence"))?, slot);
    let master = &cluster.nodes()[cluster.master_of_slot(slot)?];

    let a = holder();
    for name in &jobs {
        let who = if name == nightly { a } else { holder() };
        granted(
            &backend,
            &ask(name, "n", now - 100, now + MINUTE, who, "30s"),
        )
        .await?;
    }
    let token = backend
        .job_record(nightly)
        .await?
        .and_then(|r| r.run)
        .ok_or("no run")?
        .info
        .fencing_token;
    assert_eq!(master.cli(&["HGET", &record_key, "run_state"])?, "running");
    assert_eq!(master.cli(&["EXISTS", &run_key])?, "1");
    let done = backend.complete_tick(nightly, &a, token).await?;
    assert!(matches!(done, Completion::Completed { .. }), "{done:?}");
    assert_eq!(
        master.cli(&["HGET", &record_key, "run_state"])?,
        "completed"
    );
    assert_eq!(master.cli(&["EXISTS", &run_key])?, "0");

    let listed: Vec<String> = timeout(PATIENCE, backend.job_records())
        .await??
        .into_iter()
        .map(|r| r.job.as_str().to_owned())
        .collect();
    let mut expected: Vec<String> = jobs.iter().map(|j| j.as_str().to_owned()).collect();
    expected.sort();
    assert_eq!(listed, expected);
    Ok(())
}
