//! The fleet test: replicas in processes of their own, each with its own
//! manager, its own connection to one real Redis, and its own wall clock
//! (under libfaketime), run the same job every 2 s. Ticks are decided on
//! the server's clock, so the replicas' clocks may be any distance apart.
//! Five runs, side by side, each on its own job and keys:
//!
//! - `skew`: three replicas 7 s behind, on time and 7 s ahead (more than
//!   three periods apart), through tokio-cron-scheduler
//!   (`fleet_job_with_outcomes`);
//! - `behind90`: two replicas on time and one 90 s behind, the same way;
//! - `lone90`: one replica 90 s behind, alone: after its first answer it
//!   fires on the server's clock;
//! - `rerun`: three replicas 1.5 s behind, on time and 1.5 s ahead, each a
//!   long-lived loop (`LeaseManager::run_schedule`) with
//!   `on_abandon(Rerun)`, a 3 s job and a run lease of 2 s; the replica
//!   running a tick is SIGKILLed midway, and another re-runs it;
//! - `skip`: the same with `on_abandon(Skip)`: the killed tick is recorded
//!   abandoned and never starts again.
//!
//! The witnesses are the server's: what the job itself writes from its own
//! side connection (not through leasehold), the job's record (a hash the
//! scripts keep, read with HGETALL), the server's `expired` event for the
//! killed run's lease and the server's TIME. The job writes
//! `<tick ms>:<fencing token>:<replica>:<server ms>` to `runs:<job>` when
//! it starts a tick (the server's TIME read first), `<tick ms>:<token>:
//! <replica>` to `done:<job>` when it finishes, and every outcome of every
//! replica goes to `fired:<job>` as `<tick ms>:<replica>:<outcome>`.
//! Checked in every run: each replica's clock is off the server's by its
//! offset; over a window of at least 20 ticks that every replica asked for
//! on the server's clock, every tick starts exactly once (or, with a job
//! longer than the period, is skipped for overlap), none is missed; no
//! tick older than the run ever starts; fencing tokens rise in tick order;
//! a replica behind by more than a period never runs its first, stale,
//! tick, and one ahead by more than a period is told its clock is ahead;
//! the record's missed count is the number of misses the replicas were
//! told of, all before the window. Each run's checks are in `check` and
//! `check_kill`.
//!
//! The binary is its own worker (`harness = false`): run with
//! `LEASEHOLD_FLEET_REPLICA` set, it is one replica. Under libfaketime the
//! monotonic clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`): tokio's
//! timers run on it, and only the wall clock, by which the scheduler
//! evaluates cron and a node names its first tick, is skewed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::env;
use std::error::Error;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use leasehold_core::{
    Completion, FencingToken, HolderId, JobName, LeaseBackend, OnAbandon, TickBackend, TickReason,
};
use leasehold_cron::{Schedule, fleet_job_with_outcomes};
use leasehold_redis::RedisBackend;
use leasehold_testkit::RedisServer;
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions, TickJob, TickOutcome, TickRun};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_cron_scheduler::JobScheduler;

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

/// Set in a replica: its name. The other settings of a replica follow.
const REPLICA: &str = "LEASEHOLD_FLEET_REPLICA";
const URL: &str = "LEASEHOLD_FLEET_URL";
const JOB: &str = "LEASEHOLD_FLEET_JOB";
const JOB_MS: &str = "LEASEHOLD_FLEET_JOB_MS";
const RUN_FOR_MS: &str = "LEASEHOLD_FLEET_RUN_FOR_MS";
/// `cron` (tokio-cron-scheduler and `fleet_job_with_outcomes`) or `loop`
/// (`LeaseManager::run_schedule`).
const DRIVER: &str = "LEASEHOLD_FLEET_DRIVER";
const ON_ABANDON: &str = "LEASEHOLD_FLEET_ON_ABANDON";

const SCHEDULE: &str = "*/2 * * * * *";
const PERIOD_MS: u64 = 2_000;
/// The namespace of the replicas' keys: the default.
const NAMESPACE: &str = "leasehold";
/// How far a replica's measured offset may be from its own: the replica
/// reads its clock after the server's reply, so the round trip counts.
const OFFSET_TOLERANCE_MS: i64 = 500;
/// How long each replica runs: 27 ticks. The window leaves out the ticks
/// before every replica asks on the server's clock (the replica 7 s ahead
/// is told so at its first firing and asks again only once the server is
/// past the tick it asked for, about five ticks later) and after the
/// first replica stops: 20 to 22 are left.
const RUN_FOR: Duration = Duration::from_secs(54);
const MIN_TICKS: usize = 20;
/// The job of the runs without a kill: short, so no tick overlaps.
const SHORT_JOB_MS: u64 = 100;
/// The job of the kill runs: longer than the period, so every other tick
/// is skipped for overlap, and a kill leaves a run to settle.
const LONG_JOB_MS: u64 = 3_000;
/// The run lease of the kill runs, renewed every 250 ms: after a kill it
/// ends between 1.75 s and 2 s after the kill.
const RUN_TTL: Duration = Duration::from_secs(2);
const RENEW_EVERY: Duration = Duration::from_millis(250);
/// When the winner is killed, after its tick on the server's clock: its
/// lease then expires 2.375 s to 2.625 s after the tick, half a period
/// from the next ticks, so that the watchers settle it before a tick is
/// decided (a tick decided first would record it abandoned and start
/// itself: not a re-run), and the 3 s re-run ends half a period from the
/// tick after.
const KILL_AT_MS: u64 = 625;
/// The bound on the re-run's start after the killed lease's expiry, both
/// on the server's clock. The key is deleted by the server's active
/// expiry (ten times a second) or by the watcher's own read at the
/// lease's remaining ttl; the deletion sends a tracking invalidation at
/// once; the watcher's claim is one script, and the job's first act a
/// TIME: tens of milliseconds on an idle machine. A second leaves room
/// for two cores shared by 13 replicas and other builds.
const RERUN_BOUND_MS: u64 = 1_000;

const SKEW: [(&str, i64); 3] = [("behind7", -7_000), ("on-time", 0), ("ahead7", 7_000)];
const BEHIND90: [(&str, i64); 3] = [("on-time-a", 0), ("on-time-b", 0), ("behind90", -90_000)];
const LONE90: [(&str, i64); 1] = [("behind90", -90_000)];
const NEAR: [(&str, i64); 3] = [("behind", -1_500), ("on-time", 0), ("ahead", 1_500)];

fn main() -> ExitCode {
    // Tests of this binary are one: a filter that does not name it skips it.
    let args: Vec<String> = env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        println!("fleet: test");
        return ExitCode::SUCCESS;
    }
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| "fleet".contains(f.as_str())) {
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match env::var(REPLICA) {
        Ok(replica) => runtime.block_on(replica_main(replica)),
        Err(_) => runtime.block_on(fleet()),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet: {e}");
            ExitCode::FAILURE
        }
    }
}

fn var(name: &str) -> Result<String> {
    env::var(name).map_err(|_| format!("{name} is not set").into())
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .unwrap_or_default()
}

/// The server's clock, in UNIX ms.
async fn server_ms(conn: &mut MultiplexedConnection) -> redis::RedisResult<u64> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1_000 + micros / 1_000)
}

fn record_key(job: &str) -> String {
    format!("{NAMESPACE}:job:{{{job}}}:record")
}

fn run_key(job: &str) -> String {
    format!("{NAMESPACE}:job:{{{job}}}:run")
}

/// The tick of the grid at or before `ms`.
fn tick_at(ms: u64) -> u64 {
    ms - ms % PERIOD_MS
}

/// One replica: runs the job, records what it does, and exits after
/// `RUN_FOR_MS`.
async fn replica_main(replica: String) -> Result<()> {
    let url = var(URL)?;
    let job_name = var(JOB)?;
    let job_time = Duration::from_millis(var(JOB_MS)?.parse()?);
    let run_for = Duration::from_millis(var(RUN_FOR_MS)?.parse()?);
    let driver = var(DRIVER)?;
    let on_abandon: OnAbandon = var(ON_ABANDON)?.parse()?;
    let manager = LeaseManager::new(RedisBackend::connect(url.as_str()).await?)?;
    let mut side = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    // A loaded machine may take longer than the default 500 ms; a record
    // lost to a timeout would fail the test for nothing.
    side.set_response_timeout(Duration::from_secs(5));
    // The replica's wall clock against the server's, which runs without
    // libfaketime: the test checks that the skew is in effect.
    let server = server_ms(&mut side).await?;
    let offset_ms = i128::from(unix_ms(SystemTime::now())) - i128::from(server);
    side.hset::<_, _, _, i64>(format!("clock:{job_name}"), &replica, offset_ms.to_string())
        .await?;

    let schedule = Schedule::parse(SCHEDULE)?;
    let lease = if driver == "loop" {
        LeaseOptions::builder()
            .ttl(RUN_TTL)
            .renew_interval(RENEW_EVERY)
    } else {
        LeaseOptions::builder().ttl(Duration::from_secs(10))
    };
    let job = TickJob::builder(&job_name, schedule.clone())
        .on_abandon(on_abandon)
        .lease(lease.label(replica.clone()))
        .build()?;

    let work = {
        let (side, job_name, replica) = (side.clone(), job_name.clone(), replica.clone());
        move |run: TickRun| {
            let (mut side, job_name, replica) = (side.clone(), job_name.clone(), replica.clone());
            async move {
                let tick = unix_ms(run.tick());
                let token = run.fencing_token().get();
                // The start on the server's clock, read first.
                let at = match server_ms(&mut side).await {
                    Ok(at) => at,
                    Err(e) => {
                        eprintln!("{replica}: reading the server's clock at {tick} failed: {e}");
                        0
                    }
                };
                let started = format!("{tick}:{token}:{replica}:{at}");
                // The same entry on a list the test waits on (BLPOP), to
                // kill the replica mid-tick and to see the re-run start.
                let record = redis::pipe()
                    .rpush(format!("runs:{job_name}"), &started)
                    .rpush(format!("started:{job_name}"), &started)
                    .query_async::<()>(&mut side)
                    .await;
                if let Err(e) = record {
                    eprintln!("{replica}: recording the run of {tick} failed: {e}");
                }
                tokio::time::sleep(job_time).await;
                let done = format!("{tick}:{token}:{replica}");
                if let Err(e) = side
                    .rpush::<_, _, i64>(format!("done:{job_name}"), done)
                    .await
                {
                    eprintln!("{replica}: recording the end of {tick} failed: {e}");
                }
            }
        }
    };
    let recorder = Recorder {
        side,
        job: job_name,
        replica,
    };

    if driver == "loop" {
        let outcomes = recorder.clone();
        tokio::select! {
            ended = manager.run_schedule(&job, work, move |outcome| outcomes.record(&outcome)) => {
                return Err(format!("the schedule's loop ended early: {ended:?}").into());
            }
            () = tokio::time::sleep(run_for) => {}
        }
    } else {
        let scheduler = JobScheduler::new().await?;
        scheduler
            .add(fleet_job_with_outcomes(
                manager,
                job,
                &schedule,
                work,
                move |_: &TickJob, outcome| recorder.record(&outcome),
            )?)
            .await?;
        scheduler.start().await?;
        tokio::time::sleep(run_for).await;
    }
    Ok(())
}

/// Writes each outcome of a replica to `fired:<job>` as `<tick ms>:
/// <replica>:<outcome>`; a re-run's completion also to `reran:<job>`,
/// where the test waits for it to read the record.
#[derive(Clone)]
struct Recorder {
    side: MultiplexedConnection,
    job: String,
    replica: String,
}

impl Recorder {
    fn record(&self, outcome: &Result<TickOutcome<()>, LeaseError>) {
        let replica = &self.replica;
        let mut rerun = None;
        let entry = match outcome {
            Ok(TickOutcome::Ran {
                tick,
                fencing_token,
                reason,
                ..
            }) => {
                if *reason == TickReason::Rerun {
                    rerun = Some(format!("{}:{fencing_token}", unix_ms(*tick)));
                }
                format!(
                    "{}:{replica}:ran:{}:{fencing_token}",
                    unix_ms(*tick),
                    reason.as_str()
                )
            }
            Ok(TickOutcome::Decided { tick, decision }) => format!(
                "{}:{replica}:decided:{}:{}",
                unix_ms(*tick),
                decision.state.as_str(),
                decision.tick
            ),
            Ok(TickOutcome::Missed { tick }) => format!("{}:{replica}:missed", unix_ms(*tick)),
            Ok(TickOutcome::Overlap { tick, running }) => format!(
                "{}:{replica}:overlap:{}:{}",
                unix_ms(*tick),
                running.tick,
                running.fencing_token
            ),
            Ok(TickOutcome::ClockAhead { tick, ahead }) => {
                format!("{}:{replica}:ahead:{}", unix_ms(*tick), ahead.as_millis())
            }
            Ok(TickOutcome::Conflict { tick, fingerprint }) => {
                format!("{}:{replica}:conflict:{fingerprint}", unix_ms(*tick))
            }
            Ok(_) => format!("0:{replica}:unknown"),
            Err(e) => format!("0:{replica}:error:{e}"),
        };
        let (mut side, job) = (self.side.clone(), self.job.clone());
        tokio::spawn(async move {
            let mut pipe = redis::pipe();
            pipe.rpush(format!("fired:{job}"), entry);
            if let Some(rerun) = rerun {
                pipe.rpush(format!("reran:{job}"), rerun);
            }
            let _ = pipe.query_async::<()>(&mut side).await;
        });
    }
}

/// A replica process, in a process group of its own, killed with its group
/// when dropped.
struct ReplicaProcess {
    name: &'static str,
    child: Child,
    /// The process group, the same number as the replica's pid.
    group: Pid,
}

impl ReplicaProcess {
    fn kill(&mut self) -> Result<()> {
        killpg(self.group, Signal::SIGKILL)?;
        Ok(())
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.kill();
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    Cron,
    Loop,
}

struct Scenario {
    job: &'static str,
    replicas: &'static [(&'static str, i64)],
    driver: Driver,
    job_ms: u64,
    /// Whether the replica running a tick is killed midway, and what
    /// becomes of its run.
    kill: Option<OnAbandon>,
}

async fn fleet() -> Result<()> {
    if leasehold_testkit::skip_on_second_pass("fleet") {
        return Ok(());
    }
    // libfaketime itself, not the `faketime` wrapper: the wrapper's
    // semaphore outlives the replica this test SIGKILLs, and a later
    // wrapper given the same pid refuses to start (the library goes on).
    let libfaketime = leasehold_testkit::libfaketime()?;
    let server = RedisServer::start()?;
    // The `expired` events the kill runs wait for.
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("Ex")
        .query_async::<()>(&mut conn)
        .await?;
    let scenarios = [
        Scenario {
            job: "skew",
            replicas: &SKEW,
            driver: Driver::Cron,
            job_ms: SHORT_JOB_MS,
            kill: None,
        },
        Scenario {
            job: "behind90",
            replicas: &BEHIND90,
            driver: Driver::Cron,
            job_ms: SHORT_JOB_MS,
            kill: None,
        },
        Scenario {
            job: "lone90",
            replicas: &LONE90,
            driver: Driver::Cron,
            job_ms: SHORT_JOB_MS,
            kill: None,
        },
        Scenario {
            job: "rerun",
            replicas: &NEAR,
            driver: Driver::Loop,
            job_ms: LONG_JOB_MS,
            kill: Some(OnAbandon::Rerun),
        },
        Scenario {
            job: "skip",
            replicas: &NEAR,
            driver: Driver::Loop,
            job_ms: LONG_JOB_MS,
            kill: Some(OnAbandon::Skip),
        },
    ];
    // The runs side by side, each on its own keys and job: the replicas idle
    // between ticks, so thirteen of them share two cores.
    let started = Instant::now();
    let [skew, behind90, lone90, rerun, skip] = &scenarios;
    let outcomes = tokio::join!(
        run_scenario(&server, &libfaketime, skew),
        run_scenario(&server, &libfaketime, behind90),
        run_scenario(&server, &libfaketime, lone90),
        run_scenario(&server, &libfaketime, rerun),
        run_scenario(&server, &libfaketime, skip),
    );
    let mut failed = Vec::new();
    let outcomes = [outcomes.0, outcomes.1, outcomes.2, outcomes.3, outcomes.4];
    for (scenario, outcome) in scenarios.iter().zip(outcomes) {
        match outcome {
            Ok(report) => println!(
                "fleet {}: ok in {:.1} s: {report}",
                scenario.job,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!("fleet {}: FAILED: {e}", scenario.job);
                failed.push(scenario.job);
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("runs failed: {failed:?}").into())
    }
}

async fn run_scenario(
    server: &RedisServer,
    libfaketime: &Path,
    scenario: &Scenario,
) -> Result<String> {
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    // No tick before this one may ever start.
    let launched = server_ms(&mut conn).await?;
    let exe = env::current_exe()?;
    let mut replicas = Vec::new();
    for &(name, offset) in scenario.replicas {
        let mut command = Command::new(&exe);
        command
            .env("LD_PRELOAD", libfaketime)
            .env("FAKETIME", leasehold_testkit::faketime_offset(offset))
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env(REPLICA, name)
            .env(URL, server.url())
            .env(JOB, scenario.job)
            .env(JOB_MS, scenario.job_ms.to_string())
            .env(RUN_FOR_MS, RUN_FOR.as_millis().to_string())
            .env(
                DRIVER,
                match scenario.driver {
                    Driver::Cron => "cron",
                    Driver::Loop => "loop",
                },
            )
            .env(
                ON_ABANDON,
                scenario.kill.unwrap_or(OnAbandon::Skip).as_str(),
            )
            .stdout(Stdio::null())
            .process_group(0);
        let child = command.spawn()?;
        let group = Pid::from_raw(i32::try_from(child.id().ok_or("no pid")?)?);
        replicas.push(ReplicaProcess { name, child, group });
    }
    let began = Instant::now();
    let killed = match scenario.kill {
        Some(policy) => Some(kill_winner(server, scenario, policy, &mut replicas).await?),
        None => None,
    };
    // Every replica ends by itself after RUN_FOR; bounded all the same.
    let deadline = began + RUN_FOR + Duration::from_secs(15);
    for replica in &mut replicas {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, replica.child.wait()).await {
            Err(_) => return Err(format!("replica {} did not end", replica.name).into()),
            Ok(status) => {
                let status = status?;
                let was_killed = killed
                    .as_ref()
                    .is_some_and(|k| k.start.replica == replica.name);
                if !status.success() && !was_killed {
                    return Err(format!("replica {} failed: {status}", replica.name).into());
                }
            }
        }
    }
    check(server, scenario, launched, killed).await
}

/// A start of a tick, as the job recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Start {
    tick: u64,
    token: u64,
    replica: String,
    /// The server's clock at the start (UNIX ms).
    at: u64,
}

impl Start {
    fn parse(entry: &str) -> Result<Self> {
        let parts: Vec<&str> = entry.splitn(4, ':').collect();
        let [tick, token, replica, at] = parts[..] else {
            return Err(format!("bad run record {entry:?}").into());
        };
        Ok(Self {
            tick: tick.parse()?,
            token: token.parse()?,
            replica: replica.to_owned(),
            at: at.parse()?,
        })
    }
}

/// What the kill run saw while it ran.
struct Killed {
    /// The killed run.
    start: Start,
    /// When its lease expired, on the server's clock (its PTTL after the
    /// kill), and when the test saw the server's `expired` event.
    expiry: u64,
    seen: u64,
    /// The server's answer to the killed run's completion, sent late by
    /// the test.
    late_completion: Completion,
    /// The first start after the kill: the re-run, or under skip the next
    /// tick's run.
    next: Start,
    /// Under re-run, the first re-run completion a replica reported
    /// (`<tick>:<token>`) and the record read just after it; `None` when
    /// none came within 10 s.
    after_rerun: Option<(String, HashMap<String, String>)>,
}

/// Kills the replica running a tick midway, and watches what follows on
/// the server.
async fn kill_winner(
    server: &RedisServer,
    scenario: &Scenario,
    policy: OnAbandon,
    replicas: &mut [ReplicaProcess],
) -> Result<Killed> {
    let job = scenario.job;
    let client = redis::Client::open(server.url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    // Above the BLPOPs' own timeouts (the default is 500 ms).
    conn.set_response_timeout(Duration::from_secs(20));
    // Midway, the next tick that any replica starts (its entry, waited for
    // with BLPOP).
    tokio::time::sleep(RUN_FOR / 2).await;
    let list = format!("started:{job}");
    let _: i64 = conn.del(&list).await?;
    let popped: Option<(String, String)> = conn.blpop(&list, 10.0).await?;
    let start = Start::parse(&popped.ok_or("no replica started a tick within 10 s")?.1)?;
    // The server's `expired` event for the run's lease, subscribed to
    // before the kill.
    let key = run_key(job);
    let expired = watch_expiry(&client, key.clone()).await?;
    // The kill, KILL_AT_MS after the tick on the server's clock.
    let now = server_ms(&mut conn).await?;
    let kill_at = start.tick + KILL_AT_MS;
    if kill_at > now {
        tokio::time::sleep(Duration::from_millis(kill_at - now)).await;
    }
    let winner = replicas
        .iter_mut()
        .find(|r| r.name == start.replica)
        .ok_or_else(|| format!("no replica {}", start.replica))?;
    winner.kill()?;
    timeout(Duration::from_secs(5), winner.child.wait()).await??;
    // The dead run's lease: its holder and token, and when it expires.
    let (value, pttl, (secs, micros)): (Option<String>, i64, (u64, u64)) = redis::pipe()
        .atomic()
        .get(&key)
        .pttl(&key)
        .cmd("TIME")
        .query_async(&mut conn)
        .await?;
    let value = value.ok_or("the killed run's lease was gone at once after the kill")?;
    let holder = value.get(..32).ok_or("a lease value without a holder")?;
    let token = value
        .get(33..)
        .and_then(|rest| rest.split(':').next())
        .ok_or("a lease value without a token")?;
    if token.parse::<u64>()? != start.token {
        return Err(format!(
            "the lease {value:?} is not the killed run's (token {})",
            start.token
        )
        .into());
    }
    let pttl =
        u64::try_from(pttl).map_err(|_| format!("the killed run's lease has PTTL {pttl}"))?;
    let expiry = secs * 1_000 + micros / 1_000 + pttl;
    let seen = timeout(
        Duration::from_millis(pttl) + Duration::from_secs(5),
        expired,
    )
    .await
    .map_err(|_| "no `expired` event for the killed run's lease")???;

    // The killed run's completion, sent late with its own holder id and
    // token, through leasehold's own backend.
    let backend = RedisBackend::connect(server.url().as_str()).await?;
    let ticks = backend
        .ticks()
        .ok_or("a Redis backend without job records")?;
    let (job_name, holder) = (JobName::new(job)?, HolderId::from_hex(holder)?);
    let complete_late = || ticks.complete_tick(&job_name, &holder, FencingToken(start.token));
    let (late_completion, next, after_rerun) = if policy == OnAbandon::Rerun {
        // The re-run: the first start after the kill.
        let popped: Option<(String, String)> = conn.blpop(&list, 10.0).await?;
        let next = Start::parse(&popped.ok_or("no start within 10 s of the expiry")?.1)?;
        let late_completion = complete_late().await?;
        // The record just after the re-run's completion (checked in
        // `check_kill`, with the replicas' outcomes).
        let reran = format!("reran:{job}");
        let done = conn
            .blpop::<_, Option<(String, String)>>(&reran, 10.0)
            .await?;
        let after_rerun = match done {
            Some((_, done)) => Some((done, conn.hgetall(record_key(job)).await?)),
            None => None,
        };
        (late_completion, next, after_rerun)
    } else {
        let late_completion = complete_late().await?;
        // The next tick's run: the first start after the kill.
        let popped: Option<(String, String)> = conn.blpop(&list, 10.0).await?;
        let next = Start::parse(&popped.ok_or("no start within 10 s of the expiry")?.1)?;
        (late_completion, next, None)
    };
    Ok(Killed {
        start,
        expiry,
        seen,
        late_completion,
        next,
        after_rerun,
    })
}

/// Subscribes to the server's `expired` events and sends the server's
/// clock when the first of `key` arrives.
async fn watch_expiry(
    client: &redis::Client,
    key: String,
) -> Result<oneshot::Receiver<Result<u64, String>>> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("__keyevent@0__:expired").await?;
    let mut clock = client.get_multiplexed_async_connection().await?;
    let (send, receive) = oneshot::channel();
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if message.get_payload::<String>().is_ok_and(|k| k == key) {
                let seen = server_ms(&mut clock).await.map_err(|e| e.to_string());
                let _ = send.send(seen);
                return;
            }
        }
    });
    Ok(receive)
}

/// One outcome of one replica's firing.
struct Fired<'a> {
    tick: u64,
    replica: &'a str,
    /// `ran:<reason>:<token>`, `decided:<state>:<tick>`, `missed`,
    /// `overlap:<tick>:<token>`, `ahead:<ms>`, `conflict:…`, `error:…`.
    outcome: &'a str,
}

impl Fired<'_> {
    fn kind(&self) -> &str {
        self.outcome.split(':').next().unwrap_or_default()
    }

    /// Whether the server answered for the tick (not an error, a clock
    /// ahead or another schedule).
    fn answered(&self) -> bool {
        self.tick > 0 && matches!(self.kind(), "ran" | "decided" | "missed" | "overlap")
    }

    /// Whether it says the tick itself was skipped for overlap.
    fn skipped(&self) -> bool {
        self.kind() == "overlap" || self.outcome == format!("decided:skipped:{}", self.tick)
    }
}

fn count(record: &HashMap<String, String>, field: &str) -> u64 {
    record
        .get(field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_default()
}

/// Reads the server's record of one run and checks it.
async fn check(
    server: &RedisServer,
    scenario: &Scenario,
    launched: u64,
    killed: Option<Killed>,
) -> Result<String> {
    let job = scenario.job;
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let list = |key: String| {
        let mut conn = conn.clone();
        async move { conn.lrange::<_, Vec<String>>(key, 0, -1).await }
    };
    let runs = list(format!("runs:{job}")).await?;
    let done = list(format!("done:{job}")).await?;
    let fired_entries = list(format!("fired:{job}")).await?;
    let clocks: BTreeMap<String, i64> = conn.hgetall(format!("clock:{job}")).await?;
    let record: HashMap<String, String> = conn.hgetall(record_key(job)).await?;

    let starts = runs
        .iter()
        .map(|e| Start::parse(e))
        .collect::<Result<Vec<_>>>()?;
    let mut fired = Vec::new();
    for entry in &fired_entries {
        let mut parts = entry.splitn(3, ':');
        let (Some(tick), Some(replica), Some(outcome)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("bad outcome record {entry:?}").into());
        };
        fired.push(Fired {
            tick: tick.parse()?,
            replica,
            outcome,
        });
    }

    // The window: from the first tick that every replica asked for on the
    // server's clock (its first ask is on its own, and left out) to the
    // last that every survivor asked for. Every tick of the schedule in
    // the window counts, asked for by all or not.
    let killed_name = killed.as_ref().map(|k| k.start.replica.as_str());
    let mut first = 0;
    let mut last = u64::MAX;
    let mut ranges = Vec::new();
    for &(name, _) in scenario.replicas {
        let asked: BTreeSet<u64> = fired
            .iter()
            .filter(|f| f.replica == name)
            .skip(1)
            .filter(|f| f.answered())
            .map(|f| f.tick)
            .collect();
        let (Some(&min), Some(&max)) = (asked.first(), asked.last()) else {
            return Err(format!(
                "{name} asked for no tick on the server's clock; outcomes: {fired_entries:?}"
            )
            .into());
        };
        ranges.push(format!("{name}: {min}..={max}"));
        first = first.max(min);
        if killed_name != Some(name) {
            last = last.min(max);
        }
    }
    let window: BTreeSet<u64> = (first..=last)
        .step_by(usize::try_from(PERIOD_MS)?)
        .collect();
    if window.len() < MIN_TICKS {
        return Err(format!(
            "only {} ticks asked for by every replica ({first}..={last}; each replica's asks on the server's clock: {}); outcomes: {fired_entries:?}",
            window.len(),
            ranges.join(", ")
        )
        .into());
    }

    let mut problems = Vec::new();
    // The skew is in effect.
    for &(name, offset) in scenario.replicas {
        match clocks.get(name) {
            Some(measured) if (measured - offset).abs() <= OFFSET_TOLERANCE_MS => {}
            measured => problems.push(format!(
                "{name}'s clock should be {offset} ms off the server's; measured: {measured:?}"
            )),
        }
    }
    // The re-run, the one start that may share its tick with another.
    let rerun = killed
        .as_ref()
        .filter(|_| scenario.kill == Some(OnAbandon::Rerun))
        .map(|k| &k.next);
    let mut started: BTreeMap<u64, Vec<&Start>> = BTreeMap::new();
    for start in &starts {
        started.entry(start.tick).or_default().push(start);
    }
    for (tick, runs) in &started {
        let plain = runs.iter().filter(|s| Some(**s) != rerun).count();
        if plain > 1 {
            problems.push(format!("tick {tick} started {plain} times: {runs:?}"));
        }
        if *tick + PERIOD_MS <= launched {
            problems.push(format!(
                "tick {tick}, before the run began ({launched}), started: {runs:?}"
            ));
        }
    }
    // Every window tick started, or (a job longer than the period) was
    // skipped for overlap; none was missed.
    let overlaps = scenario.job_ms >= PERIOD_MS;
    let mut skipped = BTreeSet::new();
    for tick in &window {
        let skip = fired.iter().any(|f| f.tick == *tick && f.skipped());
        match started.get(tick) {
            Some(_) => {}
            None if overlaps && skip => {
                skipped.insert(*tick);
            }
            None => problems.push(format!("tick {tick} never started")),
        }
    }
    let missed: Vec<u64> = fired
        .iter()
        .filter(|f| f.kind() == "missed")
        .map(|f| f.tick)
        .collect();
    for tick in missed.iter().filter(|t| window.contains(t)) {
        problems.push(format!("tick {tick} of the window was missed"));
    }
    for f in fired
        .iter()
        .filter(|f| matches!(f.kind(), "error" | "conflict" | "unknown"))
    {
        problems.push(format!("{}: {}", f.replica, f.outcome));
    }
    // Tokens rise in tick order, over every start: the record's decided
    // mark only rises and a start is for a tick above it, so grants come
    // in tick order (a re-run is of the newest decided tick).
    let mut ordered: Vec<&Start> = starts.iter().collect();
    ordered.sort_by_key(|s| (s.tick, s.token));
    for pair in ordered.windows(2) {
        if pair[1].token <= pair[0].token {
            problems.push(format!(
                "token of tick {} ({}) is not above that of tick {} ({})",
                pair[1].tick, pair[1].token, pair[0].tick, pair[0].token
            ));
        }
    }
    // A replica's first ask is on its own clock: behind by more than a
    // period it is stale (missed, or decided by another), never run; ahead
    // by more than a period the server says the clock is ahead.
    let mut firsts = Vec::new();
    for &(name, offset) in scenario.replicas {
        let Some(first) = fired.iter().find(|f| f.replica == name) else {
            continue;
        };
        firsts.push(format!("{name}: {}@{}", first.outcome, first.tick));
        let offset_ms = offset.unsigned_abs();
        if offset < 0 && offset_ms > PERIOD_MS {
            // Asked at the launch, give or take a slow start.
            let stale = first.tick + offset_ms <= launched + 5_000;
            if !stale || !matches!(first.kind(), "missed" | "decided") {
                problems.push(format!(
                    "{name}'s first ask, {offset_ms} ms behind, should be a stale tick answered missed or decided: {}@{}",
                    first.outcome, first.tick
                ));
            }
            if started.contains_key(&first.tick) {
                problems.push(format!("{name}'s stale first tick {} started", first.tick));
            }
        }
        if offset > 0 && offset_ms > PERIOD_MS && first.kind() != "ahead" {
            problems.push(format!(
                "{name}'s first ask, {offset_ms} ms ahead, should be told its clock is ahead: {}@{}",
                first.outcome, first.tick
            ));
        }
    }
    // The record's missed count: one per miss a replica was told of (the
    // server keeps only the count), all of them before the window.
    let missed_count = count(&record, "missed");
    if missed_count != u64::try_from(missed.len())? {
        problems.push(format!(
            "the record counts {missed_count} missed ticks; the replicas were told of {missed:?}"
        ));
    }

    let mut by_replica: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
    for f in &fired {
        *by_replica
            .entry(f.replica)
            .or_default()
            .entry(f.kind())
            .or_insert(0) += 1;
    }
    let mut runs_by: BTreeMap<&str, usize> = BTreeMap::new();
    for start in starts.iter().filter(|s| window.contains(&s.tick)) {
        *runs_by.entry(start.replica.as_str()).or_insert(0) += 1;
    }
    let mut report = format!(
        "{} ticks in the window ({first}..={last}), {} started once{}; window runs by replica {runs_by:?}; outcomes by replica {by_replica:?}; first asks [{}]; record: missed {missed_count} (ticks {missed:?}, before the window at {first}), started {}, completed {}, skipped {}, abandoned {}, reruns {}",
        window.len(),
        window.len() - skipped.len(),
        if skipped.is_empty() {
            String::new()
        } else {
            format!(", {} skipped for overlap", skipped.len())
        },
        firsts.join(", "),
        count(&record, "started"),
        count(&record, "completed"),
        count(&record, "skipped"),
        count(&record, "abandoned"),
        count(&record, "reruns"),
    );
    if let Some(killed) = &killed {
        check_kill(
            scenario,
            killed,
            &window,
            &starts,
            &done,
            &fired,
            &record,
            &mut problems,
            &mut report,
        );
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(format!(
            "{}\nruns: {runs:?}\noutcomes: {fired_entries:?}\nrecord: {record:?}",
            problems.join("\n")
        )
        .into())
    }
}

/// The kill runs: what became of the killed run, on the server.
#[allow(clippy::too_many_arguments)]
fn check_kill(
    scenario: &Scenario,
    killed: &Killed,
    window: &BTreeSet<u64>,
    starts: &[Start],
    done: &[String],
    fired: &[Fired<'_>],
    record: &HashMap<String, String>,
    problems: &mut Vec<String>,
    report: &mut String,
) {
    let Killed {
        start,
        expiry,
        seen,
        late_completion,
        next,
        after_rerun,
    } = killed;
    let (tick, token) = (start.tick, start.token);
    // The newest tick decided while the dead run held its lease.
    let newest = tick_at(*expiry).max(tick);
    if !window.contains(&tick) {
        problems.push(format!("the killed tick {tick} is not in the window"));
    }
    if done
        .iter()
        .any(|d| d.starts_with(&format!("{tick}:{token}:")))
    {
        problems.push(format!("the killed run of {tick} finished: {done:?}"));
    }
    // The dead run's late completion is refused.
    match late_completion {
        Completion::Refused { .. } => {}
        other => problems.push(format!(
            "the killed run's late completion (token {token}) was not refused: {other:?}"
        )),
    }
    report.push_str(&format!(
        "; killed {} in tick {tick} (token {token}) {} ms after it; its lease expired {} ms after the tick (phase {} ms of {PERIOD_MS}), `expired` seen {} ms later; late completion with its token: {late_completion:?}",
        start.replica,
        KILL_AT_MS,
        expiry.saturating_sub(tick),
        expiry % PERIOD_MS,
        seen.saturating_sub(*expiry),
    ));
    let later = next.at.saturating_sub(*expiry);
    if scenario.kill == Some(OnAbandon::Rerun) {
        // Re-run: the newest tick decided while it held, by a survivor,
        // with a higher token, after the expiry and within the bound.
        if next.token <= token
            || next.replica == start.replica
            || !(tick..=newest).contains(&next.tick)
        {
            problems.push(format!(
                "the first start after the kill, {next:?}, is not a re-run of tick {tick}..={newest} above token {token}"
            ));
        }
        if next.at + 2 < *expiry {
            problems.push(format!(
                "the re-run started at {} before the killed lease expired at {expiry}",
                next.at
            ));
        }
        if later > RERUN_BOUND_MS {
            problems.push(format!(
                "the re-run started {later} ms after the killed lease expired (bound {RERUN_BOUND_MS} ms)"
            ));
        }
        if let Completion::Refused { current } = late_completion
            && current.as_ref().map(|c| c.fencing_token.get()) != Some(next.token)
        {
            problems.push(format!(
                "the refusal should name the re-run (token {}) as current: {current:?}",
                next.token
            ));
        }
        // Its completion, on the record just after: the re-run's tick and
        // token, completed, as a re-run.
        let (reran, after) = after_rerun.clone().unwrap_or_default();
        if reran != format!("{}:{}", next.tick, next.token) {
            problems.push(format!(
                "the first re-run completed ({reran:?}, empty for none within 10 s) should be the first start after the kill, {next:?}"
            ));
        }
        let field = |f: &str| after.get(f).map(String::as_str).unwrap_or_default();
        let (run_tick, run_token) = (next.tick.to_string(), next.token.to_string());
        if field("run_tick") != run_tick
            || field("run_token") != run_token
            || field("run_state") != "completed"
            || field("run_reason") != "rerun"
            || count(&after, "reruns") < 1
            || count(&after, "abandoned") < 1
        {
            problems.push(format!(
                "the record after the re-run's completion should show its run completed as a re-run: {after:?}"
            ));
        }
        // One completion for the re-run's tick (a Ran outcome is a recorded
        // completion), and none for the killed run.
        let ran: Vec<&str> = fired
            .iter()
            .filter(|f| f.kind() == "ran" && (f.tick == next.tick || f.tick == tick))
            .map(|f| f.outcome)
            .collect();
        if ran != [format!("ran:rerun:{}", next.token)] {
            problems.push(format!(
                "ticks {tick} and {} should have one completion, the re-run's: {ran:?}",
                next.tick
            ));
        }
        if count(record, "reruns") < 1 || count(record, "abandoned") < 1 {
            problems.push(format!(
                "the record should count a re-run and an abandonment: {record:?}"
            ));
        }
        report.push_str(&format!(
            "; re-run of tick {} (token {}) by {} started {later} ms after the expiry, {} ms after the event was seen (bound {RERUN_BOUND_MS} ms); record after it: run {}:{} {} ({}), reruns {}, abandoned {}, completed {}",
            next.tick,
            next.token,
            next.replica,
            i128::from(next.at) - i128::from(*seen),
            field("run_tick"),
            field("run_token"),
            field("run_state"),
            field("run_reason"),
            count(&after, "reruns"),
            count(&after, "abandoned"),
            count(&after, "completed"),
        ));
    } else {
        // Skip: recorded abandoned, never run again; nor is any tick
        // decided while it held; the next tick's run takes over.
        let again: Vec<&Start> = starts
            .iter()
            .filter(|s| (tick..=newest).contains(&s.tick) && s.token != token)
            .collect();
        if !again.is_empty() {
            problems.push(format!(
                "ticks {tick}..={newest} started again after the kill: {again:?}"
            ));
        }
        if next.tick <= newest || next.token <= token {
            problems.push(format!(
                "the first start after the kill, {next:?}, is not of a later tick"
            ));
        }
        if count(record, "abandoned") < 1 || count(record, "reruns") != 0 {
            problems.push(format!(
                "the record should count an abandonment and no re-run: {record:?}"
            ));
        }
        report.push_str(&format!(
            "; not run again; the next start, tick {} (token {}) by {}, {later} ms after the expiry",
            next.tick, next.token, next.replica
        ));
    }
}
