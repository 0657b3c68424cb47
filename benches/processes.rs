//! Contention across processes: N OS processes (16 by default) each run one
//! worker on one key and hold it about 1 ms per acquisition, on a loopback
//! `redis-server` started for the run. The binary re-executes itself once
//! per process (`LEASEHOLD_PROCESSES_CHILD` set in the children).
//!
//! Run with `cargo bench --bench processes` (3 rounds of 5 s per scenario)
//! or `cargo test --bench processes` (one 300 ms smoke round of 4
//! processes). Set `LEASEHOLD_BENCH_PROCESSES` for the number of
//! processes, `LEASEHOLD_BENCH_SECS` for the duration,
//! `LEASEHOLD_BENCH_REPEATS` for the number of rounds and
//! `LEASEHOLD_BENCH_SCENARIOS` (a comma-separated subset of the names below)
//! to run only some scenarios. Each round runs every scenario once, in turn.
//! Prints one JSON line per scenario and round, then one per scenario with
//! the median of each figure over the rounds (`"round": "median"`):
//!
//! - `leasehold/default`: one `LeaseManager` per process with the default
//!   options (only `wait` is set, as `acquire` does not wait without it);
//! - `leasehold/fair`: the same in fair mode (`LeaseOptions::fair`): the
//!   processes queue on the server, and a release hands the lease to the
//!   queue's head;
//! - `redis-crate/polling`: the same work written directly with the `redis`
//!   crate, as a new user would: `SET key token NX PX 5000`, and on a
//!   refusal a 10 ms sleep before trying again; release is a
//!   compare-and-delete script (`EVALSHA`).
//!
//! Figures: acquisitions per second over all processes, fairness (the
//! process with the fewest acquisitions over the one with the most), the
//! p50 and p99 wait of one acquisition, and Redis commands per acquisition
//! as the server counts them (`INFO commandstats`, reset with `CONFIG
//! RESETSTAT` as the processes start, read when they have all exited).
//! `commands_per_acquisition` counts the commands the clients send, which is
//! what a user's network sees and what the target is judged on:
//! `EVALSHA`/`EVAL`, the subscription commands (`SUBSCRIBE`, `UNSUBSCRIBE`,
//! `PUBSUB`), connection set-up (`HELLO`, `CLIENT`, `SCRIPT`, `PING`,
//! `SELECT`), and the hand-written loop's `SET`. Scripts cannot send any of
//! those but `PUBSUB` (only the local handover's script asks `PUBSUB
//! NUMSUB`, and with one worker per process there is no local handover), so
//! the split is exact. `all_commands_per_acquisition` adds the commands the
//! scripts run inside the server (`GET`, `PTTL`, `PUBLISH`, …); `commands`
//! lists every command's calls per acquisition.
//!
//! Every acquisition checks mutual exclusion with a witness on the server:
//! the holder `INCR`s a counter key on a side connection, which must answer
//! 1, and `DECR`s it before releasing. Those commands are the bench's own
//! and are left out of the counts. A second holder (`INCR` answering more
//! than 1), a lease lost while held, or a release that finds the lease gone
//! fails the run (non-zero exit), in the smoke round too; the figures never
//! do. The witness adds two round trips to every hold, in both scenarios.

mod common;

use std::collections::BTreeMap;
use std::io::Read as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Json, env_number, median, percentile_us, quick, server_version};
use leasehold::redis::RedisBackend;
use leasehold::{Fair, LeaseManager, LeaseOptions, ReleaseOutcome};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

const HOLD: Duration = Duration::from_millis(1);
/// The hand-written loop's retry interval.
const POLL: Duration = Duration::from_millis(10);
const LEASEHOLD: &str = "leasehold/default";
const FAIR: &str = "leasehold/fair";
const RAW: &str = "redis-crate/polling";
const WITNESS: &str = "processes-witness";
/// Commands only a client sends (scripts cannot), plus `PUBSUB` (see the
/// module documentation).
const CLIENT_SENT: &[&str] = &[
    "evalsha",
    "eval",
    "evalsha_ro",
    "eval_ro",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "pubsub|numsub",
    "hello",
    "ping",
    "select",
    "command",
];

/// Whether the server's name for a command is one only a client sends.
fn is_client_sent(name: &str) -> bool {
    // Connection set-up: `CLIENT SETNAME`, `CLIENT SETINFO` (Valkey),
    // `CLIENT TRACKING`, `SCRIPT LOAD`, `COMMAND INFO`, ...
    CLIENT_SENT.contains(&name)
        || ["client|", "script|", "command|"]
            .iter()
            .any(|family| name.starts_with(family))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> Result<(), BoxError> {
    if let Ok(index) = std::env::var("LEASEHOLD_PROCESSES_CHILD") {
        return child(&index);
    }
    let full = !quick();
    let processes = env_number("LEASEHOLD_BENCH_PROCESSES", if full { 16 } else { 4 });
    let secs: f64 = match std::env::var("LEASEHOLD_BENCH_SECS") {
        Ok(s) => s.parse()?,
        Err(_) if full => 5.0,
        Err(_) => 0.3,
    };
    let rounds = env_number("LEASEHOLD_BENCH_REPEATS", if full { 3 } else { 1 });
    let only = std::env::var("LEASEHOLD_BENCH_SCENARIOS").unwrap_or_default();
    let chosen = |name: &str| only.is_empty() || only.split(',').any(|o| o.trim() == name);
    let scenarios: Vec<&str> = [LEASEHOLD, FAIR, RAW]
        .into_iter()
        .filter(|s| chosen(s))
        .collect();
    if scenarios.is_empty() {
        return Err(format!("LEASEHOLD_BENCH_SCENARIOS names no scenario: {only}").into());
    }
    let server = RedisServer::start()?;
    let version = server_version(&server);
    let mut results: Vec<(&str, Vec<Summary>)> = scenarios.iter().map(|s| (*s, vec![])).collect();
    for round in 0..rounds {
        for (scenario, all) in &mut results {
            let summary = run(&server, scenario, processes, secs)?;
            summary.print(scenario, processes, secs, &round.to_string(), &version);
            all.push(summary);
        }
    }
    for (scenario, all) in &results {
        Summary::median(all).print(scenario, processes, secs, "median", &version);
    }
    Ok(())
}

fn epoch_ms() -> Result<u64, BoxError> {
    Ok(u64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// One round of one scenario: starts the processes, resets the server's
/// statistics as they start, and gathers their records.
fn run(
    server: &RedisServer,
    scenario: &str,
    processes: u64,
    secs: f64,
) -> Result<Summary, BoxError> {
    let mut conn = redis::Client::open(server.url())?.get_connection()?;
    redis::cmd("DEL").arg(WITNESS).query::<()>(&mut conn)?;
    // Time for every process to start and connect before the common start.
    let start_at = epoch_ms()? + 1_500;
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = Vec::new();
    for index in 0..processes {
        children.push(
            Command::new(&exe)
                .env("LEASEHOLD_PROCESSES_CHILD", index.to_string())
                .env("LEASEHOLD_PROCESSES_URL", server.url())
                .env("LEASEHOLD_PROCESSES_MODE", scenario)
                .env("LEASEHOLD_PROCESSES_START_AT", start_at.to_string())
                .env("LEASEHOLD_PROCESSES_SECS", secs.to_string())
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    let wait = start_at.saturating_sub(epoch_ms()?);
    std::thread::sleep(Duration::from_millis(wait));
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query::<()>(&mut conn)?;
    let mut records = Vec::new();
    let mut failed = None;
    for mut child in children {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            stdout.read_to_string(&mut out)?;
        }
        let status = child.wait()?;
        if !status.success() {
            failed.get_or_insert(format!("a {scenario} process failed: {status}"));
            continue;
        }
        records.push(ChildRecord::parse(&out)?);
    }
    if let Some(failed) = failed {
        return Err(failed.into());
    }
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut conn)?;
    Ok(Summary::of(scenario, secs, &records, &commandstats(&stats)))
}

/// `INFO commandstats` as command name → calls.
fn commandstats(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// What one process reports: its acquisitions and their waits.
struct ChildRecord {
    waits: Vec<Duration>,
}

impl ChildRecord {
    fn line(waits: &[Duration]) -> String {
        let list: Vec<String> = waits.iter().map(|w| w.as_micros().to_string()).collect();
        format!("waits_us {}", list.join(" "))
    }

    fn parse(out: &str) -> Result<Self, BoxError> {
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("waits_us"))
            .ok_or("a process printed no record")?;
        let waits = line
            .split_whitespace()
            .map(|w| w.parse().map(Duration::from_micros))
            .collect::<Result<_, _>>()?;
        Ok(Self { waits })
    }
}

/// A child process: one worker on one key until the common end.
fn child(index: &str) -> Result<(), BoxError> {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let url = var("LEASEHOLD_PROCESSES_URL")?;
    let mode = var("LEASEHOLD_PROCESSES_MODE")?;
    let start_at: u64 = var("LEASEHOLD_PROCESSES_START_AT")?.parse()?;
    let secs: f64 = var("LEASEHOLD_PROCESSES_SECS")?.parse()?;
    // What `#[tokio::main]` builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let waits = runtime.block_on(async {
        let witness = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let worker = Worker { witness };
        let start = Instant::now() + Duration::from_millis(start_at.saturating_sub(epoch_ms()?));
        let end = start + Duration::from_secs_f64(secs);
        match mode.as_str() {
            LEASEHOLD => worker.leasehold(&url, start, end, false).await,
            FAIR => worker.leasehold(&url, start, end, true).await,
            RAW => worker.raw(&url, index, start, end).await,
            other => Err(format!("unknown scenario {other}").into()),
        }
    });
    match waits {
        Ok(waits) => {
            println!("{}", ChildRecord::line(&waits));
            Ok(())
        }
        Err(error) => {
            eprintln!("process {index}: {error}");
            std::process::exit(3);
        }
    }
}

struct Worker {
    witness: redis::aio::MultiplexedConnection,
}

impl Worker {
    /// The hold: the witness must say this is the only holder.
    async fn hold(&mut self) -> Result<(), BoxError> {
        let holders: i64 = redis::cmd("INCR")
            .arg(WITNESS)
            .query_async(&mut self.witness)
            .await?;
        if holders != 1 {
            return Err(format!("correctness violation: {holders} holders at once").into());
        }
        // A thread sleep, as work that waits on something else would (a
        // tokio timer would round up to its 1 ms tick).
        std::thread::sleep(HOLD);
        let _: i64 = redis::cmd("DECR")
            .arg(WITNESS)
            .query_async(&mut self.witness)
            .await?;
        Ok(())
    }

    async fn leasehold(
        mut self,
        url: &str,
        start: Instant,
        end: Instant,
        fair: bool,
    ) -> Result<Vec<Duration>, BoxError> {
        let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
        let options = LeaseOptions::builder()
            .wait(Duration::from_secs(30))
            .fair(fair.then(Fair::default))
            .build()?;
        let mut waits = Vec::new();
        tokio::time::sleep_until(start).await;
        while Instant::now() < end {
            let asked = Instant::now();
            let lease = manager.acquire("processes", &options).await?;
            waits.push(asked.elapsed());
            self.hold().await?;
            if let Some(reason) = lease.loss_reason() {
                return Err(
                    format!("correctness violation: lease lost while held: {reason:?}").into(),
                );
            }
            if lease.release().await? != ReleaseOutcome::Released {
                return Err("correctness violation: the release found the lease gone".into());
            }
        }
        manager.shutdown().await;
        Ok(waits)
    }

    async fn raw(
        mut self,
        url: &str,
        index: &str,
        start: Instant,
        end: Instant,
    ) -> Result<Vec<Duration>, BoxError> {
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        let release = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        let token = format!("{}-{index}", std::process::id());
        let mut waits = Vec::new();
        tokio::time::sleep_until(start).await;
        while Instant::now() < end {
            let asked = Instant::now();
            loop {
                let set: Option<String> = redis::cmd("SET")
                    .arg("raw-processes")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(5000)
                    .query_async(&mut conn)
                    .await?;
                if set.is_some() {
                    break;
                }
                tokio::time::sleep(POLL).await;
            }
            waits.push(asked.elapsed());
            self.hold().await?;
            let released: i64 = release
                .key("raw-processes")
                .arg(&token)
                .invoke_async(&mut conn)
                .await?;
            if released != 1 {
                return Err("correctness violation: the release found the lock gone".into());
            }
        }
        Ok(waits)
    }
}

/// One scenario's figures in one round.
#[derive(Clone)]
struct Summary {
    per_second: f64,
    fewest: f64,
    most: f64,
    fairness: f64,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
    /// Client-sent commands per acquisition.
    commands: f64,
    /// Client-sent and script-internal commands per acquisition.
    all_commands: f64,
    /// Every command's calls per acquisition.
    breakdown: BTreeMap<String, f64>,
}

impl Summary {
    fn of(
        scenario: &str,
        secs: f64,
        records: &[ChildRecord],
        stats: &BTreeMap<String, u64>,
    ) -> Self {
        let counts: Vec<usize> = records.iter().map(|r| r.waits.len()).collect();
        let total: usize = counts.iter().sum();
        let fewest = counts.iter().min().copied().unwrap_or(0) as f64;
        let most = counts.iter().max().copied().unwrap_or(0) as f64;
        let mut waits: Vec<Duration> = records.iter().flat_map(|r| r.waits.clone()).collect();
        waits.sort();
        let acquisitions = (total.max(1)) as f64;
        let mut breakdown = BTreeMap::new();
        let (mut client_sent, mut all) = (0u64, 0u64);
        for (name, calls) in stats {
            // The witness (one INCR and one DECR per acquisition) and the
            // statistics themselves are the bench's own.
            let calls = match name.as_str() {
                "info" | "config|resetstat" | "decr" => continue,
                "incr" => calls.saturating_sub(total as u64),
                _ => *calls,
            };
            if calls == 0 {
                continue;
            }
            all += calls;
            if is_client_sent(name) || (scenario == RAW && name == "set") {
                client_sent += calls;
            }
            breakdown.insert(name.clone(), calls as f64 / acquisitions);
        }
        Self {
            per_second: total as f64 / secs,
            fewest,
            most,
            fairness: if most > 0.0 { fewest / most } else { 0.0 },
            wait_p50_ms: percentile_us(&waits, 50.0) / 1e3,
            wait_p99_ms: percentile_us(&waits, 99.0) / 1e3,
            commands: client_sent as f64 / acquisitions,
            all_commands: all as f64 / acquisitions,
            breakdown,
        }
    }

    /// The median of each figure on its own (the breakdown: the last round's).
    fn median(all: &[Self]) -> Self {
        let of = |field: fn(&Self) -> f64| median(&mut all.iter().map(field).collect::<Vec<_>>());
        Self {
            per_second: of(|s| s.per_second),
            fewest: of(|s| s.fewest),
            most: of(|s| s.most),
            fairness: of(|s| s.fairness),
            wait_p50_ms: of(|s| s.wait_p50_ms),
            wait_p99_ms: of(|s| s.wait_p99_ms),
            commands: of(|s| s.commands),
            all_commands: of(|s| s.all_commands),
            breakdown: all.last().map(|s| s.breakdown.clone()).unwrap_or_default(),
        }
    }

    fn print(&self, scenario: &str, processes: u64, secs: f64, round: &str, version: &str) {
        let breakdown: Vec<String> = self
            .breakdown
            .iter()
            .map(|(name, per)| format!("{name}={:.2}", per))
            .collect();
        let line = Json::new()
            .str("scenario", scenario)
            .str("round", round)
            .int("processes", processes)
            .num("hold_ms", HOLD.as_secs_f64() * 1e3)
            .num("seconds", secs)
            .str("server", version)
            .num("per_second", self.per_second.round())
            .num("fewest", self.fewest)
            .num("most", self.most)
            .num("fairness", self.fairness)
            .num("wait_p50_ms", self.wait_p50_ms)
            .num("wait_p99_ms", self.wait_p99_ms)
            .num("commands_per_acquisition", self.commands)
            .num("all_commands_per_acquisition", self.all_commands)
            .str("commands", &breakdown.join(" "))
            .line();
        println!("{line}");
    }
}
