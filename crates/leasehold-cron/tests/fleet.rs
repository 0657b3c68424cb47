//! The fleet test: three replicas in three processes, each with its own
//! manager, its own connection to one real Redis, and its own wall clock
//! (under libfaketime: 1.5 s behind, on time, 1.5 s ahead), schedule the
//! same tokio-cron-scheduler job every 2 s through `fleet_job`. Three runs,
//! side by side: a 1 ms job, a 2.5 s job (longer than the period), and a
//! 1.5 s job whose winning replica is SIGKILLed midway, just after it
//! started a tick.
//!
//! The witness is the server's record, written by the job from its own
//! connection (not through leasehold): `runs:<run>` gets
//! `<tick ms>:<fencing token>:<replica>` when a replica starts a tick,
//! `done:<run>` gets `<tick ms>:<replica>` when it finishes it, and
//! `fired:<run>` gets `<tick ms>:<replica>:<outcome>` for every firing of
//! every replica. Checked: each replica's clock is off the server's by its
//! offset (it writes both to `clock:<run>`), every tick that every live
//! replica fired for ran exactly once, and fencing tokens rise in tick
//! order. The killed replica's tick in progress ran once (started, never
//! finished) and was not run again; its later ticks went to the others.
//!
//! The binary is its own worker (`harness = false`): run with
//! `LEASEHOLD_FLEET_REPLICA` set, it is one replica. Under libfaketime the
//! monotonic clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`): tokio's
//! timers run on it, and only the wall clock, by which the scheduler
//! evaluates cron, is skewed.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::error::Error;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold_cron::fleet_job_with_outcomes;
use leasehold_redis::RedisBackend;
use leasehold_testkit::RedisServer;
use leasehold_watchdog::{LeaseManager, LeaseOptions, TickJob, TickOutcome, TickRun};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use redis::AsyncCommands;
use tokio::process::{Child, Command};
use tokio::time::timeout;
use tokio_cron_scheduler::JobScheduler;

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

/// Set in a replica: its name. The other settings of a replica follow.
const REPLICA: &str = "LEASEHOLD_FLEET_REPLICA";
const URL: &str = "LEASEHOLD_FLEET_URL";
const RUN: &str = "LEASEHOLD_FLEET_RUN";
const JOB_MS: &str = "LEASEHOLD_FLEET_JOB_MS";
const RUN_FOR_MS: &str = "LEASEHOLD_FLEET_RUN_FOR_MS";

const SCHEDULE: &str = "*/2 * * * * *";
const PERIOD_MS: u64 = 2_000;
/// The replicas and their clock offsets in milliseconds: 3 s apart at most.
const REPLICAS: [(&str, i64); 3] = [("behind", -1_500), ("on-time", 0), ("ahead", 1_500)];
/// How far a replica's measured offset may be from its own: the replica
/// reads its clock after the server's reply, so the round trip counts.
const OFFSET_TOLERANCE_MS: i64 = 500;
const MAX_SKEW: Duration = Duration::from_secs(4);
/// The scheduler polls every 500 ms; the rest is room for a loaded machine.
const MAX_LATENESS: Duration = Duration::from_millis(1_500);
/// How long each replica runs: 24 ticks, of which two or three at the ends
/// are not fired by every replica (their clocks are 3 s apart): the window
/// keeps 21 or 22.
const RUN_FOR: Duration = Duration::from_secs(48);
const MIN_TICKS: usize = 20;

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

fn unix_ms(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// One replica: schedules the job, records what it does, and exits after
/// `RUN_FOR_MS`.
async fn replica_main(replica: String) -> Result<()> {
    let url = var(URL)?;
    let run = var(RUN)?;
    let job_time = Duration::from_millis(var(JOB_MS)?.parse()?);
    let run_for = Duration::from_millis(var(RUN_FOR_MS)?.parse()?);
    let manager = LeaseManager::new(RedisBackend::connect(url.as_str()).await?)?;
    let mut side = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    // A loaded machine may take longer than the default 500 ms; a record
    // lost to a timeout would fail the test for nothing.
    side.set_response_timeout(Duration::from_secs(5));
    // The replica's wall clock against the server's, which runs without
    // libfaketime: the test checks that the skew is in effect.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut side).await?;
    let offset_ms =
        i128::try_from(unix_ms(SystemTime::now()))? - i128::from(secs * 1_000 + micros / 1_000);
    side.hset::<_, _, _, i64>(format!("clock:{run}"), &replica, offset_ms.to_string())
        .await?;
    let job = TickJob::builder(run.clone())
        .max_skew(MAX_SKEW)
        .max_lateness(MAX_LATENESS)
        .lease(
            LeaseOptions::builder()
                .ttl(Duration::from_secs(10))
                .label(replica.clone()),
        )
        .build()?;

    let work = {
        let (side, run, replica) = (side.clone(), run.clone(), replica.clone());
        move |tick: TickRun| {
            let (mut side, run, replica) = (side.clone(), run.clone(), replica.clone());
            async move {
                let ms = unix_ms(tick.tick());
                let started = format!("{ms}:{}:{replica}", tick.fencing_token());
                // The same entry on the replica's own list too: the test
                // waits on it (BLPOP) to kill the replica mid-tick.
                let record = redis::pipe()
                    .rpush(format!("runs:{run}"), &started)
                    .rpush(format!("started:{run}:{replica}"), &started)
                    .query_async::<()>(&mut side)
                    .await;
                if let Err(e) = record {
                    eprintln!("{replica}: recording the run of {ms} failed: {e}");
                }
                tokio::time::sleep(job_time).await;
                let done = format!("{ms}:{replica}");
                if let Err(e) = side.rpush::<_, _, i64>(format!("done:{run}"), done).await {
                    eprintln!("{replica}: recording the end of {ms} failed: {e}");
                }
            }
        }
    };
    let on_outcome = {
        let (side, run, replica) = (side.clone(), run.clone(), replica.clone());
        move |_: &TickJob, outcome: Result<TickOutcome<()>, _>| {
            let entry = match outcome {
                Ok(TickOutcome::Ran { tick, .. }) => format!("{}:{replica}:ran", unix_ms(tick)),
                Ok(TickOutcome::Taken { tick, holder }) => format!(
                    "{}:{replica}:taken-by-{}",
                    unix_ms(tick),
                    holder.unwrap_or_default()
                ),
                Ok(TickOutcome::Late { tick, lateness }) => {
                    format!(
                        "{}:{replica}:late-{}ms",
                        unix_ms(tick),
                        lateness.as_millis()
                    )
                }
                Ok(_) => format!("0:{replica}:unknown"),
                Err(e) => format!("0:{replica}:error {e}"),
            };
            let (mut side, key) = (side.clone(), format!("fired:{run}"));
            tokio::spawn(async move {
                let _ = side.rpush::<_, _, i64>(key, entry).await;
            });
        }
    };
    let scheduler = JobScheduler::new().await?;
    scheduler
        .add(fleet_job_with_outcomes(
            manager, job, SCHEDULE, work, on_outcome,
        )?)
        .await?;
    scheduler.start().await?;
    tokio::time::sleep(run_for).await;
    Ok(())
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

struct Scenario {
    run: &'static str,
    job_ms: u64,
    /// Whether the winning replica is killed midway.
    kill: bool,
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
    let scenarios = [
        Scenario {
            run: "short",
            job_ms: 1,
            kill: false,
        },
        Scenario {
            run: "long",
            job_ms: 2_500,
            kill: false,
        },
        Scenario {
            run: "kill",
            job_ms: 1_500,
            kill: true,
        },
    ];
    // The runs side by side, each on its own keys and job: the replicas idle
    // between ticks, so nine of them share two cores.
    let started = Instant::now();
    let [short, long, kill] = &scenarios;
    let outcomes = tokio::join!(
        run_scenario(&server, &libfaketime, short),
        run_scenario(&server, &libfaketime, long),
        run_scenario(&server, &libfaketime, kill),
    );
    let mut failed = Vec::new();
    for (scenario, outcome) in scenarios.iter().zip([outcomes.0, outcomes.1, outcomes.2]) {
        match outcome {
            Ok(report) => println!(
                "fleet {}: ok in {:.1} s: {report}",
                scenario.run,
                started.elapsed().as_secs_f64()
            ),
            Err(e) => {
                println!("fleet {}: FAILED: {e}", scenario.run);
                failed.push(scenario.run);
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
    let exe = env::current_exe()?;
    let mut replicas = Vec::new();
    for (name, offset) in REPLICAS {
        let mut command = Command::new(&exe);
        command
            .env("LD_PRELOAD", libfaketime)
            .env("FAKETIME", leasehold_testkit::faketime_offset(offset))
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env(REPLICA, name)
            .env(URL, server.url())
            .env(RUN, scenario.run)
            .env(JOB_MS, scenario.job_ms.to_string())
            .env(RUN_FOR_MS, RUN_FOR.as_millis().to_string())
            .stdout(Stdio::null())
            .process_group(0);
        let child = command.spawn()?;
        let group = Pid::from_raw(i32::try_from(child.id().ok_or("no pid")?)?);
        replicas.push(ReplicaProcess { name, child, group });
    }
    let began = Instant::now();
    let mut killed = None;
    if scenario.kill {
        // Midway, in the middle of a tick's job: the replica ahead fires
        // first and wins; once past the middle of the run, the next tick it
        // starts (its entry on its own list, waited for with BLPOP) is cut
        // short 1.5 s before its end.
        tokio::time::sleep(RUN_FOR / 2).await;
        let mut signal = redis::Client::open(server.url())?
            .get_multiplexed_async_connection()
            .await?;
        // Above the BLPOP's own timeout (the default is 500 ms).
        signal.set_response_timeout(Duration::from_secs(15));
        let list = format!("started:{}:ahead", scenario.run);
        let _: i64 = signal.del(&list).await?;
        let started: Option<(String, String)> = signal.blpop(&list, 10.0).await?;
        started.ok_or("the replica ahead started no tick within 10 s")?;
        let winner = replicas
            .iter_mut()
            .find(|r| r.name == "ahead")
            .ok_or("no replica ahead")?;
        winner.kill()?;
        killed = Some((winner.name, unix_ms(SystemTime::now())));
        timeout(Duration::from_secs(5), winner.child.wait()).await??;
    }
    // Every replica ends by itself after RUN_FOR; bounded all the same.
    let deadline = began + RUN_FOR + Duration::from_secs(15);
    for replica in &mut replicas {
        let left = deadline.saturating_duration_since(Instant::now());
        if timeout(left, replica.child.wait()).await.is_err() {
            return Err(format!("replica {} did not end", replica.name).into());
        }
    }
    check(server, scenario, killed).await
}

/// Reads the server's record of one run and checks it.
async fn check(
    server: &RedisServer,
    scenario: &Scenario,
    killed: Option<(&str, u128)>,
) -> Result<String> {
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let list = |key: String| {
        let mut conn = conn.clone();
        async move { conn.lrange::<_, Vec<String>>(key, 0, -1).await }
    };
    let runs = list(format!("runs:{}", scenario.run)).await?;
    let done = list(format!("done:{}", scenario.run)).await?;
    let fired = list(format!("fired:{}", scenario.run)).await?;
    let clocks: BTreeMap<String, i64> = conn.hgetall(format!("clock:{}", scenario.run)).await?;
    let _: i64 = conn
        .del(&[
            format!("clock:{}", scenario.run),
            format!("runs:{}", scenario.run),
            format!("done:{}", scenario.run),
            format!("fired:{}", scenario.run),
            format!("started:{}:ahead", scenario.run),
            format!("started:{}:on-time", scenario.run),
            format!("started:{}:behind", scenario.run),
        ])
        .await?;

    // The ticks each replica fired for, and who ran each tick.
    let mut fired_by: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for entry in &fired {
        let mut parts = entry.splitn(3, ':');
        let (tick, replica) = (parts.next(), parts.next());
        if let (Some(Ok(tick)), Some(replica)) = (tick.map(str::parse::<u64>), replica)
            && tick > 0
        {
            fired_by.entry(replica).or_default().insert(tick);
        }
    }
    let mut ran: BTreeMap<u64, Vec<(u64, &str)>> = BTreeMap::new();
    for entry in &runs {
        let parts: Vec<&str> = entry.splitn(3, ':').collect();
        let [tick, token, replica] = parts[..] else {
            return Err(format!("bad run record {entry:?}").into());
        };
        ran.entry(tick.parse()?)
            .or_default()
            .push((token.parse()?, replica));
    }

    // The window: from the first tick that every replica fired for to
    // the last that every survivor fired for. Ticks before and after it
    // are left out: a replica that started late or stopped early may have
    // been alone to see them. Every tick of the schedule in the window
    // counts, fired for by all or not.
    let survivors: Vec<&str> = REPLICAS
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| killed.is_none_or(|(k, _)| k != *name))
        .collect();
    let mut first = 0;
    let mut last = u64::MAX;
    for (name, _) in REPLICAS {
        let ticks = fired_by
            .get(name)
            .ok_or_else(|| format!("{name} never fired"))?;
        first = first.max(ticks.first().copied().unwrap_or(u64::MAX));
        if survivors.contains(&name) {
            last = last.min(ticks.last().copied().unwrap_or(0));
        }
    }
    let window: BTreeSet<u64> = (first..=last)
        .step_by(usize::try_from(PERIOD_MS)?)
        .collect();
    if window.len() < MIN_TICKS {
        return Err(format!(
            "only {} ticks fired by every replica ({first}..={last}); fired: {fired:?}",
            window.len()
        )
        .into());
    }

    let mut problems = Vec::new();
    // The skew is in effect: without it the replicas would not be 3 s apart.
    for (name, offset) in REPLICAS {
        match clocks.get(name) {
            Some(measured) if (measured - offset).abs() <= OFFSET_TOLERANCE_MS => {}
            measured => problems.push(format!(
                "{name}'s clock should be {offset} ms off the server's; measured: {measured:?}"
            )),
        }
    }
    for tick in &window {
        match ran.get(tick).map(Vec::as_slice) {
            Some([_]) => {}
            None => problems.push(format!("tick {tick} never ran")),
            Some(more) => problems.push(format!("tick {tick} ran {} times: {more:?}", more.len())),
        }
    }
    // Tokens rise in tick order over the window. A token is the server's
    // clock at the grant, so tokens follow the grants' order; before the
    // window a lone replica whose clock is behind can take tick T after
    // the replica ahead took T + 2 s, which is why only the window counts.
    let tokens: Vec<(u64, u64)> = ran
        .iter()
        .filter(|(tick, _)| window.contains(tick))
        .flat_map(|(tick, runs)| runs.iter().map(move |(token, _)| (*tick, *token)))
        .collect();
    for pair in tokens.windows(2) {
        if pair[1].1 <= pair[0].1 {
            problems.push(format!(
                "token of tick {} ({}) is not above that of tick {} ({})",
                pair[1].0, pair[1].1, pair[0].0, pair[0].1
            ));
        }
    }
    let mut report = format!(
        "{} ticks in the window, each run once; runs by replica: {:?}",
        window.len(),
        count_by_replica(&ran, &window)
    );
    if let Some((name, at)) = killed {
        // The tick the killed replica had started and not finished: run
        // once, by it, and not again.
        let finished: BTreeSet<&str> = done.iter().map(String::as_str).collect();
        let cut: Vec<u64> = ran
            .iter()
            .filter(|(tick, runs)| {
                runs.iter().any(|(_, r)| *r == name)
                    && !finished.contains(format!("{tick}:{name}").as_str())
            })
            .map(|(tick, _)| *tick)
            .collect();
        match cut.as_slice() {
            [tick] if window.contains(tick) => {
                report.push_str(&format!(
                    "; {name} killed at {at} in tick {tick}, which was not run again"
                ));
            }
            other => problems.push(format!(
                "the kill at {at} should have cut one tick of {name} short, in the window; cut: {other:?}"
            )),
        }
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(format!("{}\nruns: {runs:?}\nfired: {fired:?}", problems.join("\n")).into())
    }
}

fn count_by_replica<'a>(
    ran: &BTreeMap<u64, Vec<(u64, &'a str)>>,
    window: &BTreeSet<u64>,
) -> BTreeMap<&'a str, usize> {
    let mut counts = BTreeMap::new();
    for (_, replica) in window.iter().filter_map(|t| ran.get(t)).flatten() {
        *counts.entry(*replica).or_insert(0) += 1;
    }
    counts
}
