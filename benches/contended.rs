//! Contended handoff: 16 workers compete for one key and hold it about 1 ms
//! each, on a loopback `redis-server` started for the run.
//!
//! Run with `cargo bench --bench contended` (3 rounds of 5 s per scenario)
//! or `cargo test --bench contended` (one 300 ms smoke round). Set
//! `LEASEHOLD_BENCH_SECS` to change the duration and
//! `LEASEHOLD_BENCH_REPEATS` the number of rounds, and
//! `LEASEHOLD_BENCH_SCENARIOS` (a comma-separated subset of the names
//! below) to run only some scenarios. Each round runs every
//! scenario once, in turn, so that other load on the machine falls on all
//! of them alike. Prints one JSON line per scenario and round, then one per
//! scenario with the median of each figure over the rounds (`"round":
//! "median"`):
//!
//! - `leasehold/1-manager/notices`: the default, all workers in one manager;
//! - `leasehold/1-manager/polling`: the same code with release notices off
//!   and a fixed 10 ms retry interval, as polling lock libraries work;
//! - `leasehold/1-manager/fair`: all workers in one manager, in fair mode;
//! - `leasehold/16-managers/…`: one manager (connection) per worker, as 16
//!   processes would have;
//! - `redis-crate/polling`: the same work written directly with the `redis`
//!   crate: `SET NX PX`, a compare-and-delete script, and a 10 ms retry sleep;
//! - `leasehold/16-managers/fair`: 16 managers with fair mode on
//!   (`LeaseOptions::fair`): waiters queue on the server in arrival order,
//!   and a release hands the lease to the queue's head on the server;
//! - `leasehold/16-managers/fair-no-handover`: the same with
//!   `Fair::with_handover(false)`: the head asks for the lease after the notice;
//! - `processes/16/default` and `processes/16/fair`: 16 OS processes (this
//!   bench re-executed with `LEASEHOLD_BENCH_CHILD` set), each one manager
//!   with one worker on one key. Each child prints one line per hold
//!   (fencing token, and when it asked, got and released the lease, on the
//!   machine's wall clock that all processes share); the parent merges
//!   them in token order and fails the run if two holds overlap or a token
//!   repeats.
//!
//! Besides waits, gaps and fairness (fewest / most acquisitions per
//! worker), each line has `switches_per_second` (acquisitions by another
//! worker than the one before) and, read from the server's `INFO
//! commandstats` (reset before each scenario), `evalsha_per_acq` (script
//! calls, that is round trips that run a script) and `commands_per_acq`
//! (every command the server ran, those run by scripts included).
//!
//! Every scenario checks what it measures: a worker that acquires while
//! another still believes it holds the key, a fencing token that does not
//! rise over the previous holder's, a lease lost while held, or a release
//! that finds the lease gone fails the run (non-zero exit), in the smoke
//! round too; the figures never do.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{Backoff, Fair, LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;
use std::sync::Mutex;
use tokio::time::Instant;

const WORKERS: usize = 16;
const HOLD: Duration = Duration::from_millis(1);
const POLL: Duration = Duration::from_millis(10);
/// The scenario written directly with the `redis` crate.
const RAW: &str = "redis-crate/polling";
/// Set in a child process of the 16-process scenarios: what it runs.
const CHILD: &str = "LEASEHOLD_BENCH_CHILD";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What every worker records.
#[derive(Default)]
struct Record {
    waits: Vec<Duration>,
    gaps: Vec<Duration>,
    per_worker: Vec<usize>,
    /// When the last holder started to release, if the key is free now.
    released_at: Option<Instant>,
    /// The worker that believes it holds the key now.
    holder: Option<usize>,
    /// The fencing token of the latest acquisition.
    last_token: Option<u64>,
    /// The first broken guarantee seen: once a worker stops on one, the
    /// others may trip over the state it left, so this is what is reported.
    violation: Option<String>,
    /// The worker of the latest acquisition, and how many acquisitions
    /// went to another worker than the one before.
    last_worker: Option<usize>,
    switches: usize,
    /// The server's command counts over the scenario: script calls, all.
    evalsha: u64,
    commands: u64,
}

fn main() -> Result<(), BoxError> {
    if let Ok(child) = std::env::var(CHILD) {
        return processes::child(&child);
    }
    let full = std::env::args().any(|a| a == "--bench");
    let secs: f64 = match std::env::var("LEASEHOLD_BENCH_SECS") {
        Ok(s) => s.parse()?,
        Err(_) if full => 5.0,
        Err(_) => 0.3,
    };
    let run_for = Duration::from_secs_f64(secs);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rounds: usize = match std::env::var("LEASEHOLD_BENCH_REPEATS") {
        Ok(s) => s.parse()?,
        Err(_) if full => 3,
        Err(_) => 1,
    };
    runtime.block_on(async {
        let server = RedisServer::start()?;
        // Optionally pin the server to its own core, apart from the client.
        if let (Ok(cpu), Some(pid)) = (std::env::var("LEASEHOLD_BENCH_SERVER_CPU"), server.pid()) {
            std::process::Command::new("taskset")
                .args(["-cp", &cpu, &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .status()?;
        }
        let only = std::env::var("LEASEHOLD_BENCH_SCENARIOS").unwrap_or_default();
        let chosen = |name: &str| only.is_empty() || only.split(',').any(|o| o.trim() == name);
        // (managers, release notices, fair mode, fair handovers)
        let scenarios = [
            (1, true, false, false),
            (1, false, false, false),
            // Fair mode in one manager: its 16 workers queue locally and
            // only the head holds a place on the server.
            (1, true, true, true),
            (WORKERS, true, false, false),
            (WORKERS, false, false, false),
            (WORKERS, true, true, true),
            (WORKERS, true, true, false),
        ];
        let mut results: Vec<(String, Vec<Summary>)> = Vec::new();
        for round in 0..rounds {
            let mut summaries = Vec::new();
            for (managers, notices, fair, handover) in scenarios {
                let mode = match (notices, fair, handover) {
                    (_, true, true) => "fair",
                    (_, true, false) => "fair-no-handover",
                    (true, false, _) => "notices",
                    (false, false, _) => "polling",
                };
                let name = if managers == 1 {
                    format!("leasehold/1-manager/{mode}")
                } else {
                    format!("leasehold/{managers}-managers/{mode}")
                };
                if !chosen(&name) {
                    continue;
                }
                reset_stats(&server)?;
                let mut record =
                    leasehold_run(&server, managers, notices, (fair, handover), run_for).await?;
                read_stats(&server, &mut record)?;
                summaries.push((name, Summary::of(run_for, record)));
            }
            if chosen(RAW) {
                reset_stats(&server)?;
                let mut record = raw_run(&server, run_for).await?;
                read_stats(&server, &mut record)?;
                summaries.push((RAW.to_owned(), Summary::of(run_for, record)));
            }
            for fair in [false, true] {
                let name = format!(
                    "processes/{WORKERS}/{}",
                    if fair { "fair" } else { "default" }
                );
                if !chosen(&name) {
                    continue;
                }
                reset_stats(&server)?;
                let mut record = processes::run(&server, fair, run_for).await?;
                read_stats(&server, &mut record)?;
                summaries.push((name, Summary::of(run_for, record)));
            }
            if summaries.is_empty() {
                return Err(format!("LEASEHOLD_BENCH_SCENARIOS names no scenario: {only}").into());
            }
            for (i, (name, summary)) in summaries.into_iter().enumerate() {
                summary.print(&name, run_for, &round.to_string());
                match results.get_mut(i) {
                    Some((_, all)) => all.push(summary),
                    None => results.push((name, vec![summary])),
                }
            }
        }
        for (name, all) in results {
            Summary::median(&all).print(&name, run_for, "median");
        }
        Ok(())
    })
}

async fn leasehold_run(
    server: &RedisServer,
    managers: usize,
    notices: bool,
    (fair, handover): (bool, bool),
    run_for: Duration,
) -> Result<Record, BoxError> {
    let mut pool = Vec::new();
    for _ in 0..managers {
        pool.push(LeaseManager::new(
            RedisBackend::connect(server.url()).await?,
        )?);
    }
    let mut options = LeaseOptions::builder()
        .ttl(Ttl::parse("5s")?)
        .wait(Duration::from_secs(30))
        .release_notices(notices)
        .fair(fair.then(|| Fair::default().with_handover(handover)));
    if !notices {
        options = options.backoff(Backoff::fixed(POLL));
    }
    let options = options.build()?;
    let key = format!("contended-{managers}-{notices}-{fair}-{handover}");
    let record = Arc::new(Mutex::new(Record {
        per_worker: vec![0; WORKERS],
        ..Record::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let manager = pool[worker % managers].clone();
        let (options, record, stop, key) = (
            options.clone(),
            Arc::clone(&record),
            Arc::clone(&stop),
            key.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                let lease = manager.acquire(&key, &options).await?;
                let got = Instant::now();
                let token = lease.fencing_token().get();
                note_acquired(&record, worker, asked, got, Some(token))?;
                hold();
                if lease.loss_reason().is_some() {
                    return Err(violation(
                        &record,
                        format!("worker {worker} lost its lease while holding it"),
                    ));
                }
                note_release(&record, worker)?;
                if lease.release().await? != ReleaseOutcome::Released {
                    return Err(violation(
                        &record,
                        format!("worker {worker}'s release found its lease gone"),
                    ));
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    join_workers(tasks, &record).await?;
    for manager in pool {
        manager.shutdown().await;
    }
    Arc::try_unwrap(record)
        .map_err(|_| "workers still running")?
        .into_inner()
        .map_err(|_| "poisoned".into())
}

/// The same work with the `redis` crate alone: a polling lock.
async fn raw_run(server: &RedisServer, run_for: Duration) -> Result<Record, BoxError> {
    let release = redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    );
    let release = Arc::new(release);
    let record = Arc::new(Mutex::new(Record {
        per_worker: vec![0; WORKERS],
        ..Record::default()
    }));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let client = redis::Client::open(server.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (record, stop, release) =
            (Arc::clone(&record), Arc::clone(&stop), Arc::clone(&release));
        tasks.push(tokio::spawn(async move {
            let token = format!("worker-{worker}-{}", std::process::id());
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                loop {
                    let set: Option<String> = redis::cmd("SET")
                        .arg("raw-contended")
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
                let got = Instant::now();
                note_acquired(&record, worker, asked, got, None)?;
                hold();
                note_release(&record, worker)?;
                let released: i64 = release
                    .key("raw-contended")
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
                if released != 1 {
                    return Err(violation(
                        &record,
                        format!("worker {worker}'s release found its lock gone"),
                    ));
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    join_workers(tasks, &record).await?;
    Arc::try_unwrap(record)
        .map_err(|_| "workers still running")?
        .into_inner()
        .map_err(|_| "poisoned".into())
}

/// Holds the lease for 1 ms. By default a thread sleep, as work that waits
/// on something else would, leaving the core to the server (it oversleeps
/// by the kernel's timer slack, ~50 µs); with `LEASEHOLD_BENCH_HOLD=spin`, a
/// busy wait of exactly 1 ms. (A tokio timer would round up to its 1 ms
/// tick and hold for 1–2 ms.)
fn hold() {
    if SPIN.get_or_init(|| std::env::var("LEASEHOLD_BENCH_HOLD").is_ok_and(|v| v == "spin"))
        == &true
    {
        let until = std::time::Instant::now() + HOLD;
        while std::time::Instant::now() < until {
            std::hint::spin_loop();
        }
    } else {
        std::thread::sleep(HOLD);
    }
}

static SPIN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Records an acquisition by `worker`, and fails when another worker still
/// believes it holds the key (mutual exclusion) or when `token` does not
/// rise over the previous acquisition's. A holder is noted free before its
/// release is sent, so with a working lock no one can acquire in between.
fn note_acquired(
    record: &Mutex<Record>,
    worker: usize,
    asked: Instant,
    got: Instant,
    token: Option<u64>,
) -> Result<(), BoxError> {
    let mut r = record.lock().map_err(|_| "poisoned")?;
    if let Some(other) = r.holder {
        return Err(violated(
            &mut r,
            format!(
                "two holders at once: worker {worker} acquired while worker {other} held the key"
            ),
        ));
    }
    r.holder = Some(worker);
    if let Some(token) = token {
        if let Some(last) = r.last_token.filter(|last| token <= *last) {
            return Err(violated(
                &mut r,
                format!("worker {worker} got fencing token {token} after {last}"),
            ));
        }
        r.last_token = Some(token);
    }
    r.waits.push(got - asked);
    if let Some(released) = r.released_at.take() {
        r.gaps.push(got.saturating_duration_since(released));
    }
    r.per_worker[worker] += 1;
    if r.last_worker.is_some_and(|last| last != worker) {
        r.switches += 1;
    }
    r.last_worker = Some(worker);
    Ok(())
}

/// Zeroes the server's command counts before a scenario.
fn reset_stats(server: &RedisServer) -> Result<(), BoxError> {
    server.cli(&["CONFIG", "RESETSTAT"])?;
    Ok(())
}

/// Reads the server's command counts after a scenario: `EVALSHA` calls and
/// every command (including those scripts ran, and the `INFO` itself).
fn read_stats(server: &RedisServer, record: &mut Record) -> Result<(), BoxError> {
    let info = server.cli(&["INFO", "commandstats"])?;
    for line in info.lines() {
        let Some((name, stats)) = line.trim().split_once(':') else {
            continue;
        };
        let Some(calls) = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        record.commands += calls;
        if name == "cmdstat_evalsha" {
            record.evalsha += calls;
        }
    }
    Ok(())
}

/// Notes a broken guarantee in `record` (keeping the first one) and returns
/// it as the error that stops the worker.
fn violated(record: &mut Record, what: String) -> BoxError {
    let first = record.violation.get_or_insert(what);
    format!("correctness violation: {first}").into()
}

/// [`violated`], locking `record` first.
fn violation(record: &Mutex<Record>, what: String) -> BoxError {
    match record.lock() {
        Ok(mut r) => violated(&mut r, what),
        Err(_) => "poisoned".into(),
    }
}

/// Joins the workers; the first broken guarantee, if any, is the error,
/// whichever worker ran into it.
async fn join_workers(
    tasks: Vec<tokio::task::JoinHandle<Result<(), BoxError>>>,
    record: &Mutex<Record>,
) -> Result<(), BoxError> {
    let mut first_error = None;
    for task in tasks {
        if let Err(error) = task.await.map_err(BoxError::from).and_then(|r| r) {
            first_error.get_or_insert(error);
        }
    }
    if let Some(what) = &record.lock().map_err(|_| "poisoned")?.violation {
        return Err(format!("correctness violation: {what}").into());
    }
    first_error.map_or(Ok(()), Err)
}

/// Records that `worker` is about to release; it must be the holder.
fn note_release(record: &Mutex<Record>, worker: usize) -> Result<(), BoxError> {
    let mut r = record.lock().map_err(|_| "poisoned")?;
    if r.holder != Some(worker) {
        let holder = r.holder;
        return Err(violated(
            &mut r,
            format!("worker {worker} released while the record names {holder:?} as holder"),
        ));
    }
    r.holder = None;
    r.released_at = Some(Instant::now());
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// One scenario's figures in one round.
#[derive(Clone, Copy)]
struct Summary {
    per_second: f64,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
    gap_p50_ms: f64,
    gap_p99_ms: f64,
    fewest: f64,
    most: f64,
    fairness: f64,
    switches_per_second: f64,
    evalsha_per_acq: f64,
    commands_per_acq: f64,
}

impl Summary {
    fn of(run_for: Duration, mut record: Record) -> Self {
        record.waits.sort();
        record.gaps.sort();
        let total: usize = record.per_worker.iter().sum();
        let fewest = record.per_worker.iter().min().copied().unwrap_or(0);
        let most = record.per_worker.iter().max().copied().unwrap_or(0);
        Self {
            per_second: total as f64 / run_for.as_secs_f64(),
            wait_p50_ms: percentile(&record.waits, 0.5),
            wait_p99_ms: percentile(&record.waits, 0.99),
            gap_p50_ms: percentile(&record.gaps, 0.5),
            gap_p99_ms: percentile(&record.gaps, 0.99),
            fewest: fewest as f64,
            most: most as f64,
            fairness: if most == 0 {
                0.0
            } else {
                fewest as f64 / most as f64
            },
            switches_per_second: record.switches as f64 / run_for.as_secs_f64(),
            evalsha_per_acq: record.evalsha as f64 / total.max(1) as f64,
            commands_per_acq: record.commands as f64 / total.max(1) as f64,
        }
    }

    /// The median of each figure on its own.
    fn median(all: &[Self]) -> Self {
        let of = |field: fn(&Self) -> f64| {
            let mut values: Vec<f64> = all.iter().map(field).collect();
            values.sort_by(f64::total_cmp);
            values.get(values.len() / 2).copied().unwrap_or(0.0)
        };
        Self {
            per_second: of(|s| s.per_second),
            wait_p50_ms: of(|s| s.wait_p50_ms),
            wait_p99_ms: of(|s| s.wait_p99_ms),
            gap_p50_ms: of(|s| s.gap_p50_ms),
            gap_p99_ms: of(|s| s.gap_p99_ms),
            fewest: of(|s| s.fewest),
            most: of(|s| s.most),
            fairness: of(|s| s.fairness),
            switches_per_second: of(|s| s.switches_per_second),
            evalsha_per_acq: of(|s| s.evalsha_per_acq),
            commands_per_acq: of(|s| s.commands_per_acq),
        }
    }

    fn print(&self, name: &str, run_for: Duration, round: &str) {
        println!(
            "{{\"scenario\":\"{name}\",\"round\":\"{round}\",\"workers\":{WORKERS},\"hold_ms\":1,\"seconds\":{:.1},\"per_second\":{:.0},\"wait_p50_ms\":{:.2},\"wait_p99_ms\":{:.2},\"gap_p50_ms\":{:.3},\"gap_p99_ms\":{:.3},\"fewest\":{:.0},\"most\":{:.0},\"fairness\":{:.2},\"switches_per_second\":{:.0},\"evalsha_per_acq\":{:.2},\"commands_per_acq\":{:.2}}}",
            run_for.as_secs_f64(),
            self.per_second,
            self.wait_p50_ms,
            self.wait_p99_ms,
            self.gap_p50_ms,
            self.gap_p99_ms,
            self.fewest,
            self.most,
            self.fairness,
            self.switches_per_second,
            self.evalsha_per_acq,
            self.commands_per_acq,
        );
    }
}

/// The 16-process scenarios: the parent's side and the child's.
mod processes {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use leasehold::redis::RedisBackend;
    use leasehold::{Fair, LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
    use leasehold_testkit::RedisServer;

    use super::{BoxError, CHILD, Record, WORKERS, hold};

    /// Nanoseconds on the wall clock, which every process on the machine
    /// reads alike (unlike `Instant`, which cannot be compared across them).
    fn now_ns() -> u128 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    }

    /// Starts the children, lets them run `run_for` from a common start,
    /// and merges their holds in fencing-token order.
    pub(super) async fn run(
        server: &RedisServer,
        fair: bool,
        run_for: Duration,
    ) -> Result<Record, BoxError> {
        let exe = std::env::current_exe()?;
        // Children connect first; all start together a moment later.
        let start = now_ns() + 1_500_000_000;
        let end = start + run_for.as_nanos();
        let key = format!("processes-{fair}");
        let mut children = Vec::new();
        for _ in 0..WORKERS {
            children.push(
                Command::new(&exe)
                    .env(
                        CHILD,
                        format!("{} {key} {fair} {start} {end}", server.url()),
                    )
                    .stdout(Stdio::piped())
                    .spawn()?,
            );
        }
        let mut holds = Vec::new();
        let mut failures = Vec::new();
        for (worker, mut child) in children.into_iter().enumerate() {
            let stdout = child.stdout.take().ok_or("no stdout")?;
            let lines = tokio::task::spawn_blocking(move || {
                BufReader::new(stdout)
                    .lines()
                    .collect::<Result<Vec<_>, _>>()
            })
            .await??;
            let status = tokio::task::spawn_blocking(move || child.wait()).await??;
            if !status.success() {
                failures.push(format!("child {worker} exited with {status}"));
            }
            for line in lines {
                let f: Vec<u128> = line
                    .split_whitespace()
                    .skip(1)
                    .map(str::parse)
                    .collect::<Result<_, _>>()?;
                if let [token, asked, got, released] = f[..] {
                    holds.push((token, worker, asked, got, released));
                }
            }
        }
        holds.sort();
        let mut record = Record {
            per_worker: vec![0; WORKERS],
            ..Record::default()
        };
        let mut previous: Option<(u128, usize, u128)> = None;
        for (token, worker, asked, got, released) in holds {
            if let Some((last_token, last_worker, last_released)) = previous {
                if token == last_token {
                    record.violation.get_or_insert(format!(
                        "workers {last_worker} and {worker} both got fencing token {token}"
                    ));
                }
                if got < last_released {
                    record.violation.get_or_insert(format!(
                        "two holders at once: worker {worker} got the lease (token {token}) {} µs before worker {last_worker} (token {last_token}) released it",
                        (last_released - got) / 1000
                    ));
                }
                record.gaps.push(Duration::from_nanos(
                    u64::try_from(got.saturating_sub(last_released)).unwrap_or(u64::MAX),
                ));
                if last_worker != worker {
                    record.switches += 1;
                }
            }
            record.waits.push(Duration::from_nanos(
                u64::try_from(got - asked.min(got)).unwrap_or(u64::MAX),
            ));
            record.per_worker[worker] += 1;
            previous = Some((token, worker, released));
        }
        if let Some(what) = &record.violation {
            return Err(format!("correctness violation: {what}").into());
        }
        if let Some(failure) = failures.first() {
            return Err(failure.clone().into());
        }
        Ok(record)
    }

    /// A child: one manager, one worker, from `start` to `end` (wall-clock
    /// nanoseconds); prints `hold <token> <asked> <got> <released>` per
    /// hold once done, `released` noted before the release is sent.
    pub(super) fn child(spec: &str) -> Result<(), BoxError> {
        let parts: Vec<&str> = spec.split_whitespace().collect();
        let [url, key, fair, start, end] = parts[..] else {
            return Err(format!("{CHILD} is not \"url key fair start end\": {spec}").into());
        };
        let (fair, start, end): (bool, u128, u128) = (fair.parse()?, start.parse()?, end.parse()?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let holds = runtime.block_on(async {
            let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
            let options = LeaseOptions::builder()
                .ttl(Ttl::parse("5s")?)
                .wait(Duration::from_secs(30))
                .fair(fair.then(Fair::default))
                .build()?;
            let wait = start.saturating_sub(now_ns());
            tokio::time::sleep(Duration::from_nanos(u64::try_from(wait)?)).await;
            let mut holds = Vec::new();
            while now_ns() < end {
                let asked = now_ns();
                let lease = manager.acquire(key, &options).await?;
                let got = now_ns();
                hold();
                if lease.loss_reason().is_some() {
                    return Err::<_, BoxError>("a lease was lost while held".into());
                }
                let released = now_ns();
                let token = lease.fencing_token().get();
                if lease.release().await? != ReleaseOutcome::Released {
                    return Err("a release found its lease gone".into());
                }
                holds.push((token, asked, got, released));
            }
            manager.shutdown().await;
            Ok(holds)
        })?;
        let mut out = std::io::stdout().lock();
        for (token, asked, got, released) in holds {
            writeln!(out, "hold {token} {asked} {got} {released}")?;
        }
        Ok(())
    }
}
