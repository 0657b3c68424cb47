//! Scheduled jobs when the server's clock is not one clock for ever
//! (docs/design.md, "Scheduled jobs: the server's clock decides"): a server
//! whose wall clock steps (a Valkey server under libfaketime, see
//! `leasehold_testkit::faketime_server`), and a Sentinel failover that
//! loses the job record's last write.
//!
//! Judged by witnesses the library does not control: the server's own
//! `TIME` and the job's record (`HGETALL` of `leasehold:job:{<job>}:record`
//! on a side connection), and a list the job's work appends its tick and
//! fencing token to, from a connection of its own.
//!
//! - Stepped back by three periods after tick T ran, the server refuses
//!   every tick at or below T as the stepped-back clock reaches it
//!   ([`TickOutcome::Decided`]), and says the ticks still ahead of it are
//!   ahead; nothing starts, the record still counts one start. Then the
//!   clock moves on, and T + 1 period starts once, with a higher token.
//! - Jumped forward by five periods, a node that fires by its own clock
//!   is late ([`TickOutcome::Missed`]); taught the server's clock by that
//!   answer, it asks for the server's newest tick, which starts once;
//!   every tick the jump skipped over, asked for by another node, is
//!   decided.
//! - Sentinel, the master killed after deciding and running tick T while
//!   its replica was cut off: the promoted replica has lost the decision,
//!   and T starts again on it. The documented limit: the second start's
//!   fencing token is above the first's (the token's floor is the server's
//!   clock). Measured and printed.
//! - The same failover with the promoted replica's clock 10 s behind the
//!   old master's: T starts again with a token *below* the first run's.
//!   The "higher token" holds only while the new master's clock is not
//!   behind by more than the time since the first start. Asserted as the
//!   real limit, and printed.
//!
//! `cargo test --test tick_clocks -- --nocapture` prints the figures; the
//! clock tests need `LEASEHOLD_FAKETIME_SERVER` (set by `scripts/test.sh`).

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::jobs::{TickReason, TickState};
use leasehold::redis::redis::aio::MultiplexedConnection;
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{Every, JobName, LeaseManager, TickJob, TickOutcome, TickRun};
use leasehold_testkit::{RedisServer, SentinelSet, ShiftedClock, faketime_server};
use tokio::time::Instant;

use holders::{Error, manager, manager_at, side, within};

type TestResult = Result<(), Error>;

/// What the work returns: whether its witness write went through.
type Outcome = TickOutcome<redis::RedisResult<()>>;

/// The clock tests' grid and start deadline: a tick every 10 s, which may
/// start until 10 s after it (that is, until the next tick).
const PERIOD_MS: u64 = 10_000;
const PERIOD: Duration = Duration::from_millis(PERIOD_MS);

/// The list the work appends `<tick ms>:<fencing token>` to.
const RUNS: &str = "tick-clocks:runs";

/// How long one `run_tick` may take: a "due" wait of at most a period,
/// the round trips, and room for a loaded two-core machine.
const ASK_LIMIT: Duration = Duration::from_secs(30);

/// How far past the instant it was set to the server's clock may read
/// when the test reads it back: the time a side connection's `TIME` takes
/// on a loaded machine.
const SET_SLACK_MS: i64 = 500;

/// How far before a tick the server's clock is put, so that the tick is
/// "due" when asked for and becomes current while the node waits.
const DUE_MS: u64 = 300;

/// The machine's wall clock (the nodes' own clock), in UNIX ms.
fn local_ms() -> u64 {
    ms(SystemTime::now())
}

fn ms(at: SystemTime) -> u64 {
    u64::try_from(
        at.duration_since(UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_millis(),
    )
    .expect("a clock before the year 500,000,000")
}

fn instant(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Signed ms as seconds, for printing.
#[allow(clippy::cast_precision_loss)]
fn secs(ms: i64) -> f64 {
    ms as f64 / 1e3
}

/// The server's clock, in UNIX ms (`TIME` on a side connection).
async fn server_ms(side: &mut MultiplexedConnection) -> Result<u64, Error> {
    let (s, us): (u64, u64) = within(
        Duration::from_secs(5),
        "TIME",
        redis::cmd("TIME").query_async(side),
    )
    .await?;
    Ok(s * 1000 + us / 1000)
}

/// The job's record as the server keeps it.
async fn record(
    side: &mut MultiplexedConnection,
    job: &str,
) -> Result<HashMap<String, String>, Error> {
    let key = KeyLayout::default().job_record(&JobName::new(job)?);
    Ok(within(Duration::from_secs(5), "HGETALL", side.hgetall(key)).await?)
}

fn field<'a>(record: &'a HashMap<String, String>, name: &str) -> &'a str {
    record.get(name).map_or("<absent>", String::as_str)
}

/// A count of the record (absent while 0).
fn count(record: &HashMap<String, String>, name: &str) -> u64 {
    record
        .get(name)
        .map_or(0, |v| v.parse().unwrap_or(u64::MAX))
}

/// The runs the work recorded, in order: `(tick ms, fencing token)`.
async fn runs(witness: &mut MultiplexedConnection) -> Result<Vec<(u64, u64)>, Error> {
    let entries: Vec<String> = within(
        Duration::from_secs(5),
        "LRANGE",
        witness.lrange(RUNS, 0, -1),
    )
    .await?;
    entries
        .iter()
        .map(|entry| {
            let (tick, token) = entry
                .split_once(':')
                .ok_or_else(|| format!("a run entry {entry:?}"))?;
            Ok((tick.parse()?, token.parse()?))
        })
        .collect()
}

/// The job's work: it appends its tick and fencing token to [`RUNS`] on a
/// connection of its own, the witness of every start.
async fn append(mut witness: MultiplexedConnection, run: TickRun) -> redis::RedisResult<()> {
    let entry = format!("{}:{}", ms(run.tick()), run.fencing_token().get());
    witness.rpush(RUNS, entry).await
}

/// `node` asks for `tick` of `job` with [`LeaseManager::run_tick`]; a
/// start runs [`append`].
async fn ask(
    node: &LeaseManager<RedisBackend>,
    job: &TickJob,
    tick: u64,
    witness: &MultiplexedConnection,
) -> Result<Outcome, Error> {
    let witness = witness.clone();
    let outcome = within(
        ASK_LIMIT,
        "a tick's answer",
        node.run_tick(job, instant(tick), move |run| append(witness, run)),
    )
    .await?;
    Ok(outcome)
}

/// The fencing token of a run that started and completed; fails on any
/// other outcome.
fn ran(outcome: &Outcome, what: &str) -> Result<u64, Error> {
    match outcome {
        TickOutcome::Ran {
            fencing_token,
            output,
            ..
        } => {
            if let Err(error) = output {
                return Err(format!("{what}: the work's witness write failed: {error}").into());
            }
            Ok(fencing_token.get())
        }
        other => Err(format!("{what}: expected a start, got {other:?}").into()),
    }
}

/// Asserts that `outcome` refused the tick with the decision of `decided`.
fn assert_decided(outcome: &Outcome, decided: u64, state: TickState, what: &str) {
    match outcome {
        TickOutcome::Decided { decision, .. } => {
            assert_eq!(decision.tick, decided, "{what}: the decision returned");
            assert_eq!(decision.state, state, "{what}: the decision's state");
        }
        other => panic!("{what}: expected the decision of {decided}, got {other:?}"),
    }
}

fn assert_clock_ahead(outcome: &Outcome, what: &str) {
    assert!(
        matches!(outcome, TickOutcome::ClockAhead { .. }),
        "{what}: expected clock-ahead, got {outcome:?}"
    );
}

/// A job on the clock tests' grid, with a start deadline of one period.
fn clock_job(name: &str) -> Result<TickJob, Error> {
    Ok(TickJob::builder(name, Every::new(PERIOD)?)
        .start_deadline(PERIOD)
        .build()?)
}

/// A server under libfaketime, a side connection to it and the offset of
/// its clock.
struct Shifted {
    server: RedisServer,
    clock: ShiftedClock,
    side: MultiplexedConnection,
    offset_ms: i64,
}

impl Shifted {
    async fn start() -> Result<Self, Error> {
        let (builder, clock) = faketime_server()?;
        let server = builder.start()?;
        let side = side(&server).await?;
        Ok(Self {
            server,
            clock,
            side,
            offset_ms: 0,
        })
    }

    /// Sets the server's clock to read `at` (UNIX ms) now, checked by its
    /// own `TIME`. Returns that reading.
    async fn set_at(&mut self, at: u64) -> Result<u64, Error> {
        let offset = i64::try_from(at)? - i64::try_from(local_ms())?;
        self.set_offset(offset).await?;
        let now = server_ms(&mut self.side).await?;
        let off = i64::try_from(now)? - i64::try_from(at)?;
        assert!(
            (-5..SET_SLACK_MS).contains(&off),
            "the server's clock reads {off} ms from the {at} it was set to"
        );
        Ok(now)
    }

    /// Moves the server's clock by `by_ms`, checked by its own `TIME` (it
    /// moved at least 90 % of the way: the rest is time passing).
    async fn jump(&mut self, by_ms: i64) -> Result<u64, Error> {
        let before = server_ms(&mut self.side).await?;
        self.set_offset(self.offset_ms + by_ms).await?;
        let after = server_ms(&mut self.side).await?;
        let moved = i64::try_from(after)? - i64::try_from(before)?;
        assert!(
            (moved - by_ms).abs() < by_ms.abs() / 10,
            "the server's clock moved by {moved} ms, not {by_ms} ms"
        );
        Ok(after)
    }

    async fn set_offset(&mut self, offset_ms: i64) -> Result<(), Error> {
        self.clock.set_offset_ms(offset_ms)?;
        self.offset_ms = offset_ms;
        Ok(())
    }
}

/// Tick T runs; the server's clock then steps back by three periods. The
/// decided mark forbids a second start of every tick at or below T: the
/// stepped-back clock's current tick (T − 30 s) is refused with T's
/// decision, the ticks still ahead of it are "clock ahead" (nothing
/// written), and as the stepped-back clock reaches T − 20 s, T − 10 s and
/// T itself (compressed: the clock is put 300 ms before each, so that the
/// tick is due when asked for and current when the node asks again) each
/// is refused with T's decision. The record still counts one start, and
/// the work ran once. Then the clock moves on: back to normal, where T is
/// still decided, and on to T + 10 s, which starts once, with a token
/// above T's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_stepped_back_starts_no_decided_tick_again() -> TestResult {
    if leasehold_testkit::skip_on_second_pass(
        "a_server_clock_stepped_back_starts_no_decided_tick_again",
    ) {
        return Ok(());
    }
    let _serial = leasehold_testkit::serial().await;
    let job_name = "stepped-back";
    let mut shifted = Shifted::start().await?;
    let node = manager(&shifted.server).await?;
    let other = manager(&shifted.server).await?;
    let job = clock_job(job_name)?;
    let other_job = clock_job(job_name)?;
    let mut witness = side(&shifted.server).await?;

    // T: the next tick on the grid; the server's clock is put 1 s past it.
    let local = local_ms();
    let t = local - local % PERIOD_MS + PERIOD_MS;
    shifted.set_at(t + 1_000).await?;
    let normal = shifted.offset_ms;
    let first = ask(&node, &job, t, &witness).await?;
    let first_token = ran(&first, "T, on time")?;
    assert!(matches!(
        first,
        TickOutcome::Ran {
            reason: TickReason::OnTime,
            ..
        }
    ));
    let kept = record(&mut shifted.side, job_name).await?;
    assert_eq!(field(&kept, "decided"), t.to_string());
    assert_eq!(field(&kept, "decided_state"), "completed");
    assert_eq!(count(&kept, "started"), 1);
    assert_eq!(count(&kept, "completed"), 1);
    let again = ask(&other, &other_job, t, &witness).await?;
    assert_decided(&again, t, TickState::Completed, "T again, another node");

    // The step back: three periods.
    let stepped = shifted.jump(-30_000).await?;
    let current = stepped - stepped % PERIOD_MS;
    assert_eq!(
        current,
        t - 3 * PERIOD_MS,
        "the stepped-back clock's current tick"
    );
    let outcome = ask(&node, &job, current, &witness).await?;
    assert_decided(
        &outcome,
        t,
        TickState::Completed,
        "T - 30 s, current on the stepped-back clock",
    );
    // Ahead of the stepped-back clock by more than a period: nothing written.
    for tick in [t - PERIOD_MS, t] {
        let outcome = ask(&other, &other_job, tick, &witness).await?;
        assert_clock_ahead(&outcome, &format!("T - {} s", (t - tick) / 1000));
    }
    assert_eq!(
        record(&mut shifted.side, job_name).await?,
        kept,
        "the refused asks wrote nothing"
    );

    // The stepped-back clock reaches T - 20 s, T - 10 s and T.
    for tick in [t - 2 * PERIOD_MS, t - PERIOD_MS, t] {
        let what = format!(
            "T - {} s, as the stepped-back clock reaches it",
            (t - tick) / 1000
        );
        shifted.set_at(tick - DUE_MS).await?;
        let asked = Instant::now();
        let outcome = ask(&node, &job, tick, &witness).await?;
        let waited = asked.elapsed();
        let now = server_ms(&mut shifted.side).await?;
        assert!(
            (tick..tick + PERIOD_MS).contains(&now),
            "{what}: the server's clock reads {now}: the tick is not current"
        );
        assert_decided(&outcome, t, TickState::Completed, &what);
        assert!(
            waited >= Duration::from_millis(DUE_MS / 2),
            "{what}: answered after {waited:?}, without waiting for the tick to be due"
        );
        println!("stepped back: {what}: waited {waited:?} for it to be due, then {outcome:?}");
        assert_eq!(
            record(&mut shifted.side, job_name).await?,
            kept,
            "{what}: the record changed"
        );
    }
    assert_eq!(runs(&mut witness).await?, [(t, first_token)]);

    // The clock moves on: back to normal, where T is still decided...
    shifted.set_offset(normal).await?;
    let now = server_ms(&mut shifted.side).await?;
    assert!(
        (t..t + PERIOD_MS).contains(&now),
        "back to normal, the server reads {now}"
    );
    let outcome = ask(&other, &other_job, t, &witness).await?;
    assert_decided(
        &outcome,
        t,
        TickState::Completed,
        "T, the clock back to normal",
    );
    // ...and on to T + 10 s, which starts once.
    let next = t + PERIOD_MS;
    shifted.set_at(next - DUE_MS).await?;
    let outcome = ask(&node, &job, next, &witness).await?;
    let next_token = ran(&outcome, "T + 10 s")?;
    assert!(
        next_token > first_token,
        "T + 10 s's token ({next_token}) is above T's ({first_token})"
    );
    let outcome = ask(&other, &other_job, next, &witness).await?;
    assert_decided(&outcome, next, TickState::Completed, "T + 10 s again");

    let last = record(&mut shifted.side, job_name).await?;
    assert_eq!(field(&last, "decided"), next.to_string());
    assert_eq!(count(&last, "started"), 2);
    assert_eq!(count(&last, "completed"), 2);
    assert_eq!(count(&last, "missed"), 0);
    assert_eq!(
        runs(&mut witness).await?,
        [(t, first_token), (next, next_token)]
    );
    println!(
        "stepped back 30 s after T ran (token {first_token}): T - 30 s..T refused with T's decision, 2 ticks clock-ahead, no start; T + 10 s started once with token {next_token} (+{:.3} s)",
        secs(i64::try_from(next_token - first_token)? / 1000)
    );
    Ok(())
}

/// The server's clock jumps forward by five periods. A node that fires by
/// its own clock asks for its current tick: late on the server's clock, so
/// missed (no record: an old tick is never granted). The answer teaches
/// the node the server's clock: it then asks for the server's newest tick
/// ([`TickJob::tick_to_ask`]), which starts once. Another node, on its own
/// clock too, asks for every tick from its own to the server's: each is
/// decided, none starts. The record counts one start and one miss, and the
/// work ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_clock_jumped_forward_starts_its_newest_tick_once() -> TestResult {
    if leasehold_testkit::skip_on_second_pass(
        "a_server_clock_jumped_forward_starts_its_newest_tick_once",
    ) {
        return Ok(());
    }
    let _serial = leasehold_testkit::serial().await;
    let job_name = "jumped-forward";
    let mut shifted = Shifted::start().await?;
    let (node_a, node_b) = (
        manager(&shifted.server).await?,
        manager(&shifted.server).await?,
    );
    let (job_a, job_b) = (clock_job(job_name)?, clock_job(job_name)?);
    let mut witness = side(&shifted.server).await?;

    // Start early in a period, so that the server's newest tick after the
    // jump (same place in its period) is still on time when asked for.
    let into = local_ms() % PERIOD_MS;
    if into > PERIOD_MS - 3_000 {
        tokio::time::sleep(Duration::from_millis(PERIOD_MS - into + 100)).await;
    }
    let own = ms(job_a
        .tick_to_ask(SystemTime::now())
        .ok_or("no tick on the grid")?);
    let jumped = shifted.jump(5 * i64::try_from(PERIOD_MS)?).await?;
    let newest = jumped - jumped % PERIOD_MS;
    assert_eq!(newest, own + 5 * PERIOD_MS, "the server's newest tick");

    // Node A, by its own clock: late.
    let outcome = ask(&node_a, &job_a, own, &witness).await?;
    assert!(
        matches!(outcome, TickOutcome::Missed { .. }),
        "the node's own tick, 50 s behind the server: expected missed, got {outcome:?}"
    );
    let missed = record(&mut shifted.side, job_name).await?;
    assert_eq!(field(&missed, "decided"), own.to_string());
    assert_eq!(field(&missed, "decided_state"), "missed");
    assert_eq!(count(&missed, "started"), 0);

    // Taught the server's clock, it asks for the server's newest tick.
    let learned = ms(job_a
        .server_now()
        .ok_or("the job learned no server clock")?);
    let now = server_ms(&mut shifted.side).await?;
    let taught = ms(job_a
        .tick_to_ask(SystemTime::now())
        .ok_or("no tick on the grid")?);
    assert_eq!(taught, newest, "the tick to ask, by the server's clock");
    let outcome = ask(&node_a, &job_a, taught, &witness).await?;
    let token = ran(&outcome, "the server's newest tick")?;

    // Node B, on its own clock, from its own tick to the server's newest.
    let mut asked = Vec::new();
    let mut tick = own;
    while tick <= newest {
        let outcome = ask(&node_b, &job_b, tick, &witness).await?;
        assert!(!outcome.ran(), "tick {tick} started again: {outcome:?}");
        // The highest decision: the newest tick's, started above.
        assert_decided(
            &outcome,
            newest,
            TickState::Completed,
            &format!("tick {tick}"),
        );
        asked.push(tick);
        tick += PERIOD_MS;
    }
    let taught_b = ms(job_b
        .tick_to_ask(SystemTime::now())
        .ok_or("no tick on the grid")?);
    assert_eq!(taught_b, newest, "node B's tick to ask, once taught");

    let last = record(&mut shifted.side, job_name).await?;
    assert_eq!(field(&last, "decided"), newest.to_string());
    assert_eq!(field(&last, "decided_state"), "completed");
    assert_eq!(count(&last, "started"), 1);
    assert_eq!(count(&last, "completed"), 1);
    assert_eq!(count(&last, "missed"), 1);
    let started = runs(&mut witness).await?;
    assert_eq!(started, [(newest, token)]);
    assert_eq!(
        u64::try_from(started.len())?,
        count(&last, "started"),
        "the record's start count and the work's runs"
    );
    println!(
        "jumped forward 50 s: the node's own tick {own} missed; the node learned the server's clock {:+.3} s off its own (server's TIME {now}, estimate {learned}); the server's newest tick {newest} started once (token {token}); {} ticks asked for again by another node, all decided",
        secs(i64::try_from(learned)? - i64::try_from(local_ms())?),
        asked.len()
    );
    Ok(())
}

/// The Sentinel job's grid: a tick a minute, which may start within the
/// minute, so that a failover (2–3 s) fits inside one tick's start window.
const FAILOVER_PERIOD_MS: u64 = 60_000;

/// How much of the tick's start window must remain when it first runs:
/// the cut, the kill, the failover and the second ask, on a loaded
/// machine.
const FAILOVER_ROOM_MS: u64 = 25_000;

/// What [`lose_a_decision`] saw.
struct Lost {
    /// The first run's fencing token, on the old master.
    first_token: u64,
    /// Node B's answer for the same tick on the new master.
    again: Outcome,
    /// The kill to the promotion, as the set saw it.
    failover: Duration,
    /// The new master's clock when node B was answered, in UNIX ms.
    new_master_ms: u64,
    /// The new master's record before node B asked.
    on_new: HashMap<String, String>,
}

/// The lossy failover of the Sentinel tests, for tick `t` of `job_name`
/// (on a [`FAILOVER_PERIOD_MS`] grid; `t` must be current on the master's
/// clock, with room left in its start window): node A asks for T − 60 s
/// (missed: a record both data nodes have, acknowledged by `WAIT`); the
/// replica is frozen (SIGSTOP) and its link cut, and a mark key written
/// on the master; node A decides and runs T there; the master is killed
/// (SIGKILL), the replica thawed and promoted. Checked: the promoted
/// replica lacks the mark and T's decision (its record still says
/// T − 60 s, missed). Then node B asks for T on the new master, and node A
/// asks again: A never starts it (a third time). The work's runs are
/// checked by [`assert_runs`].
async fn lose_a_decision(
    set: &mut SentinelSet,
    job_name: &str,
    t: u64,
    witness: &mut MultiplexedConnection,
) -> Result<Lost, Error> {
    let node_a = manager_at(set.url()).await?;
    let period = Duration::from_millis(FAILOVER_PERIOD_MS);
    let job = TickJob::builder(job_name, Every::new(period)?)
        .start_deadline(period)
        .build()?;
    let mut old_master = side(set.master()).await?;

    // A record both data nodes have: T - 60 s, missed.
    let outcome = ask(&node_a, &job, t - FAILOVER_PERIOD_MS, witness).await?;
    assert!(
        matches!(outcome, TickOutcome::Missed { .. }),
        "T - 60 s: {outcome:?}"
    );
    let acked = set.master().cli(&["WAIT", "1", "5000"])?;
    assert_eq!(acked.trim(), "1", "the replica acknowledged the record");

    // Cut the replica off: T's decision and run never reach it.
    let mark = format!("tick-clocks:lost:{:016x}", fastrand::u64(..));
    tokio::task::block_in_place(|| {
        set.replica_mut().pause()?;
        set.master().cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
        set.master().cli(&["SET", &mark, "1"])
    })?;
    let first = ask(&node_a, &job, t, witness).await?;
    let first_token = ran(&first, "T on the old master")?;
    let on_old = record(&mut old_master, job_name).await?;
    assert_eq!(field(&on_old, "decided"), t.to_string());
    assert_eq!(count(&on_old, "started"), 1);
    assert_eq!(count(&on_old, "completed"), 1);

    let failover = tokio::task::block_in_place(|| {
        set.kill_master()?;
        set.replica_mut().resume()?;
        set.wait_for_failover()
    })?;
    let mut new_master = side(set.master()).await?;
    let kept: bool = new_master.exists(&mark).await?;
    assert!(!kept, "the promoted replica has the mark: nothing was lost");
    let on_new = record(&mut new_master, job_name).await?;
    assert_eq!(
        field(&on_new, "decided"),
        (t - FAILOVER_PERIOD_MS).to_string(),
        "the new master's record: the replicated decision, without T's"
    );
    assert_eq!(field(&on_new, "decided_state"), "missed");

    // Node B asks for T on the new master.
    let node_b = manager_at(set.url()).await?;
    let again = ask(&node_b, &job, t, witness).await?;
    let new_master_ms = server_ms(&mut new_master).await?;
    match &again {
        TickOutcome::Ran { .. } => {
            ran(&again, "T on the new master")?;
            let last = record(&mut new_master, job_name).await?;
            assert_eq!(field(&last, "decided"), t.to_string());
            assert_eq!(count(&last, "started"), 1, "starts the new master knows of");
        }
        TickOutcome::Decided { decision, .. } => {
            assert_eq!(decision.tick, t, "the new master's decision");
        }
        other => return Err(format!("T on the new master: {other:?}").into()),
    }

    // Node A again, through the sentinels to the new master: refused. Its
    // client may first need a reconnection (its master was killed).
    let until = Instant::now() + Duration::from_secs(10);
    let repeat = loop {
        match ask(&node_a, &job, t, witness).await {
            Ok(outcome) => break outcome,
            Err(error) if Instant::now() < until => {
                println!("sentinel: node A's ask after the failover failed ({error}); again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error),
        }
    };
    assert_decided(
        &repeat,
        t,
        TickState::Completed,
        "node A's ask after node B's",
    );
    assert_runs(witness, t, first_token, &again).await?;
    Ok(Lost {
        first_token,
        again,
        failover,
        new_master_ms,
        on_new,
    })
}

/// The work ran for `t` only: once on the old master with `first_token`,
/// and once more if `again` started it on the new master.
async fn assert_runs(
    witness: &mut MultiplexedConnection,
    t: u64,
    first_token: u64,
    again: &Outcome,
) -> Result<(), Error> {
    let mut expected = vec![(t, first_token)];
    if let TickOutcome::Ran { fencing_token, .. } = again {
        expected.push((t, fencing_token.get()));
    }
    assert_eq!(runs(witness).await?, expected, "the work's runs");
    Ok(())
}

fn describe(lost: &Lost) -> String {
    format!(
        "failover {:?}; the new master's record before the ask: decided {} ({}); T's first run had token {}",
        lost.failover,
        field(&lost.on_new, "decided"),
        field(&lost.on_new, "decided_state"),
        lost.first_token
    )
}

/// Sentinel (1 master, 1 replica, 3 sentinels, one machine clock): a
/// failover that lost T's decision (see [`lose_a_decision`]). T can start
/// again on the new master: the documented limit. When it does, its
/// fencing token is above the first run's: the counter went with the lost
/// writes, and the token's floor is the new master's `TIME` (µs), which is
/// the same machine's clock, later than the first grant. Printed: what
/// happened, the tokens, the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_failover_that_loses_the_decision_can_start_a_tick_again_with_a_higher_token()
-> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let mut set = SentinelSet::start()?;
    let witness_server = RedisServer::start()?;
    let mut witness = side(&witness_server).await?;

    // A tick with room left in its start window, on the master's clock.
    let mut master = side(set.master()).await?;
    let mut now = server_ms(&mut master).await?;
    if now % FAILOVER_PERIOD_MS > FAILOVER_PERIOD_MS - FAILOVER_ROOM_MS {
        let wait = FAILOVER_PERIOD_MS - now % FAILOVER_PERIOD_MS + 100;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        now = server_ms(&mut master).await?;
    }
    let t = now - now % FAILOVER_PERIOD_MS;

    let lost = lose_a_decision(&mut set, "failed-over", t, &mut witness).await?;
    let first = lost.first_token;
    match &lost.again {
        TickOutcome::Ran { fencing_token, .. } => {
            let token = fencing_token.get();
            assert!(
                token > first,
                "T started again with token {token}, not above the first run's {first}"
            );
            println!(
                "sentinel, one clock: T started AGAIN after the failover lost its decision (the documented limit), with token {token}, {:+.3} s above the first; {}",
                secs(i64::try_from(token)? / 1000 - i64::try_from(first)? / 1000),
                describe(&lost)
            );
        }
        other => println!(
            "sentinel, one clock: T did not start again: {other:?}; {}",
            describe(&lost)
        ),
    }
    Ok(())
}

/// How far behind the old master's clock the promoted replica's runs in
/// [`sentinel_a_promoted_replica_whose_clock_is_behind_can_start_a_tick_again_with_a_lower_token`]:
/// more than a failover takes.
const REPLICA_BEHIND_MS: u64 = 10_000;

/// How far into tick T the old master's clock is when T first runs.
const T_INTO_MS: u64 = 15_000;

/// "After a failover the new master's clock may differ": the same lossy
/// failover as above on a Sentinel set whose data nodes and sentinels run
/// under libfaketime, the replica's clock [`REPLICA_BEHIND_MS`] behind the
/// master's. T first runs when the master's clock is [`T_INTO_MS`] into
/// it; the new master's is then behind the first grant by more than the
/// failover took, and T, on time there too, starts again with a token from
/// that clock: *below* the first run's. Measured: the design's "a tick may
/// start again, with a higher fencing token" holds only while the new
/// master's clock is not behind by more than the time since the first
/// start (when no counter above the first token was replicated: here none
/// was). Asserted as the real limit, as
/// `clock_jumps::a_step_back_beyond_the_retention_after_the_counter_expired_can_lower_tokens`
/// does for one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_a_promoted_replica_whose_clock_is_behind_can_start_a_tick_again_with_a_lower_token()
-> TestResult {
    if leasehold_testkit::skip_on_second_pass(
        "sentinel_a_promoted_replica_whose_clock_is_behind_can_start_a_tick_again_with_a_lower_token",
    ) {
        return Ok(());
    }
    let _serial = leasehold_testkit::serial().await;
    let (master, master_clock) = faketime_server()?;
    let (replica, replica_clock) = faketime_server()?;
    let mut sentinel_clocks = Vec::new();
    let mut failed = None;
    let mut set =
        SentinelSet::start_with_builders(Duration::from_millis(1000), master, replica, || {
            match faketime_server() {
                Ok((builder, clock)) => {
                    sentinel_clocks.push(clock);
                    builder
                }
                Err(error) => {
                    failed = Some(error);
                    RedisServer::builder()
                }
            }
        })?;
    if let Some(error) = failed {
        return Err(error.into());
    }
    let witness_server = RedisServer::start()?;
    let mut witness = side(&witness_server).await?;

    // The master's clock T_INTO_MS into the local clock's current tick T,
    // the replica's REPLICA_BEHIND_MS behind it.
    let local = local_ms();
    let t = local - local % FAILOVER_PERIOD_MS;
    let offset = i64::try_from(t + T_INTO_MS)? - i64::try_from(local)?;
    master_clock.set_offset_ms(offset)?;
    replica_clock.set_offset_ms(offset - i64::try_from(REPLICA_BEHIND_MS)?)?;
    let mut master = side(set.master()).await?;
    let mut replica = side(set.replica()).await?;
    let (master_now, replica_now) = (
        server_ms(&mut master).await?,
        server_ms(&mut replica).await?,
    );
    let skew = i64::try_from(master_now)? - i64::try_from(replica_now)?;
    assert!(
        (master_now - t).abs_diff(T_INTO_MS) < 1_000,
        "the master's clock reads {master_now}, not {T_INTO_MS} ms into {t}"
    );
    assert!(
        skew.abs_diff(i64::try_from(REPLICA_BEHIND_MS)?) < 500,
        "the replica's clock is {skew} ms behind the master's"
    );

    let lost = lose_a_decision(&mut set, "failed-over-behind", t, &mut witness).await?;
    let first = lost.first_token;
    let TickOutcome::Ran { fencing_token, .. } = &lost.again else {
        return Err(format!(
            "T did not start again on the new master: {:?}; {}",
            lost.again,
            describe(&lost)
        )
        .into());
    };
    let token = fencing_token.get();
    println!(
        "sentinel, promoted replica {REPLICA_BEHIND_MS} ms behind: T started AGAIN with token {token}, {:+.3} s from the first run's {first}; the new master's clock read {} ms into T when it answered; {}",
        secs(i64::try_from(token)? / 1000 - i64::try_from(first)? / 1000),
        lost.new_master_ms.saturating_sub(t),
        describe(&lost)
    );
    assert!(
        token < first,
        "with the new master's clock {REPLICA_BEHIND_MS} ms behind, the re-run's token ({token}) comes from that clock, below the first run's ({first})"
    );
    Ok(())
}
