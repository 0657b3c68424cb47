//! A semaphore: 16 workers compete for 4 permits of one key and hold one
//! about 1 ms each, on a loopback `redis-server` started for the run.
//!
//! Run with `cargo bench --bench permits` (3 rounds of 5 s per scenario) or
//! `cargo test --bench permits` (one 300 ms smoke round). Set
//! `LEASEHOLD_BENCH_SECS` to change the duration, `LEASEHOLD_BENCH_REPEATS`
//! the number of rounds, and `LEASEHOLD_BENCH_SCENARIOS` (a comma-separated
//! subset of the names below) to run only some scenarios. Each round runs
//! every scenario once, in turn, so that other load on the machine falls on
//! all of them alike. Prints one JSON line per scenario and round, then one
//! per scenario with the median of each figure over the rounds (`"round":
//! "median"`):
//!
//! - `leasehold/1-manager`: `acquire_permit`, all workers in one manager
//!   (release notices on, the default);
//! - `leasehold/16-managers`: one manager (connection) per worker, as 16
//!   processes would have;
//! - `redis-crate/zset`: the same work written directly with the `redis`
//!   crate the way ZSET semaphores (redis-semaphore, Redisson's expirable
//!   semaphore) work: one script removes the expired holders
//!   (`ZREMRANGEBYSCORE`), and adds this one (`ZADD`, scored by its expiry)
//!   if `ZCARD` is under the limit; a refused worker sleeps 10 ms and tries
//!   again; release is `ZREM`. It has no fencing tokens (`"fencing":
//!   "none"` in its lines).
//!
//! The hold is a tokio sleep of 1 ms (which the timer rounds up to 1–2 ms):
//! up to 4 holders hold at once on a 2-thread runtime, so a blocking hold
//! would take the runtime's threads from the others.
//!
//! Every scenario checks what it measures: more than 4 workers believing at
//! once that they hold a permit, two believing at once that they hold the
//! same permit key, a fencing token that does not rise over the previous
//! holder's of that permit or over every token released before the wait
//! began, or that was handed out before, a permit lost while held, or a release that finds the permit gone
//! fails the run (non-zero exit), in the smoke round too; the figures
//! never do.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Json, cpus_allowed, median, percentile_us, quick, server_version};
use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, PermitLimit, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

const WORKERS: usize = 16;
const PERMITS: usize = 4;
const HOLD: Duration = Duration::from_millis(1);
/// The retry interval of the ZSET semaphore (redis-semaphore's default).
const POLL: Duration = Duration::from_millis(10);
/// The permits' and the ZSET entries' ttl: far longer than any hold, so
/// that no holder's permit can expire under it.
const TTL_MS: u64 = 5_000;
/// The scenario written directly with the `redis` crate.
const RAW: &str = "redis-crate/zset";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Takes a permit of a ZSET semaphore. KEYS[1]: the semaphore; ARGV[1]:
/// this holder's member, ARGV[2]: now (ms since the epoch), ARGV[3]: the
/// holder's expiry (ms since the epoch), ARGV[4]: the limit, ARGV[5]: the
/// ttl (ms). Returns 1 when taken, 0 when all permits are held.
const RAW_ACQUIRE: &str = r"
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return 1
end
return 0
";

/// What every worker records.
#[derive(Default)]
struct Record {
    waits: Vec<Duration>,
    per_worker: Vec<usize>,
    /// The workers that believe they hold a permit now.
    holding: usize,
    /// The most workers that believed at once that they held a permit.
    peak: usize,
    /// Per permit index: the worker that believes it holds that permit
    /// key now, and the fencing token of its latest acquisition.
    permit_holder: Vec<Option<usize>>,
    permit_token: Vec<Option<u64>>,
    /// The highest token whose holder has noted its release.
    released_max: Option<u64>,
    /// Every token handed out: a semaphore's tokens rise across all its
    /// permits, so none may come twice.
    tokens: HashSet<u64>,
    /// The first broken guarantee seen: once a worker stops on one, the
    /// others may trip over the state it left, so this is what is reported.
    violation: Option<String>,
}

impl Record {
    fn new() -> Mutex<Self> {
        Mutex::new(Self {
            per_worker: vec![0; WORKERS],
            permit_holder: vec![None; PERMITS],
            permit_token: vec![None; PERMITS],
            ..Self::default()
        })
    }
}

/// An acquisition as a worker saw it.
struct Acquired {
    worker: usize,
    asked: Instant,
    got: Instant,
    /// The permit's index and fencing token; `None` for the ZSET semaphore,
    /// which has neither.
    permit: Option<(usize, u64)>,
    /// The highest released token when the wait began.
    released_before: Option<u64>,
}

fn main() -> Result<(), BoxError> {
    let full = !quick();
    let secs: f64 = match std::env::var("LEASEHOLD_BENCH_SECS") {
        Ok(s) => s.parse()?,
        Err(_) if full => 5.0,
        Err(_) => 0.3,
    };
    let run_for = Duration::from_secs_f64(secs);
    let rounds: usize = match std::env::var("LEASEHOLD_BENCH_REPEATS") {
        Ok(s) => s.parse()?,
        Err(_) if full => 3,
        Err(_) => 1,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
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
        let context = Context {
            run_for,
            server: server_version(&server),
            cpus: cpus_allowed(),
        };
        let mut results: Vec<(String, Vec<Summary>)> = Vec::new();
        for round in 0..rounds {
            let mut summaries = Vec::new();
            for managers in [1, WORKERS] {
                let name = if managers == 1 {
                    "leasehold/1-manager".to_owned()
                } else {
                    format!("leasehold/{managers}-managers")
                };
                if chosen(&name) {
                    let record = leasehold_run(&server, managers, run_for).await?;
                    summaries.push((name, Summary::of(run_for, record)));
                }
            }
            if chosen(RAW) {
                let record = raw_run(&server, run_for).await?;
                summaries.push((RAW.to_owned(), Summary::of(run_for, record)));
            }
            if summaries.is_empty() {
                return Err(format!("LEASEHOLD_BENCH_SCENARIOS names no scenario: {only}").into());
            }
            for (i, (name, summary)) in summaries.into_iter().enumerate() {
                summary.print(&name, &context, &round.to_string());
                match results.get_mut(i) {
                    Some((_, all)) => all.push(summary),
                    None => results.push((name, vec![summary])),
                }
            }
        }
        for (name, all) in results {
            Summary::median(&all).print(&name, &context, "median");
        }
        Ok(())
    })
}

async fn leasehold_run(
    server: &RedisServer,
    managers: usize,
    run_for: Duration,
) -> Result<Record, BoxError> {
    let mut pool = Vec::new();
    for _ in 0..managers {
        pool.push(LeaseManager::new(
            RedisBackend::connect(server.url()).await?,
        )?);
    }
    let options = LeaseOptions::builder()
        .ttl(Ttl::new(Duration::from_millis(TTL_MS))?)
        .wait(Duration::from_secs(30))
        .build()?;
    let limit = PermitLimit::new(u32::try_from(PERMITS)?)?;
    let key = format!("permits-{managers}");
    let prefix = format!("{{{key}}}:permit:");
    let record = Arc::new(Record::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let manager = pool[worker % managers].clone();
        let (options, record, stop, key, prefix) = (
            options.clone(),
            Arc::clone(&record),
            Arc::clone(&stop),
            key.clone(),
            prefix.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let released_before = released_max(&record)?;
                let asked = Instant::now();
                let lease = manager.acquire_permit(&key, limit, &options).await?;
                let got = Instant::now();
                let index = lease
                    .server_key()
                    .as_str()
                    .strip_prefix(prefix.as_str())
                    .and_then(|i| i.parse::<usize>().ok())
                    .filter(|i| *i < PERMITS)
                    .ok_or_else(|| {
                        violation(
                            &record,
                            format!(
                                "worker {worker} got a permit of another key: {}",
                                lease.server_key()
                            ),
                        )
                    })?;
                let token = lease.fencing_token().get();
                note_acquired(
                    &record,
                    &Acquired {
                        worker,
                        asked,
                        got,
                        permit: Some((index, token)),
                        released_before,
                    },
                )?;
                tokio::time::sleep(HOLD).await;
                if lease.loss_reason().is_some() {
                    return Err(violation(
                        &record,
                        format!("worker {worker} lost its permit while holding it"),
                    ));
                }
                note_release(&record, worker, Some((index, token)))?;
                if lease.release().await? != ReleaseOutcome::Released {
                    return Err(violation(
                        &record,
                        format!("worker {worker}'s release found its permit gone"),
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
    into_record(record)
}

/// The same work with the `redis` crate alone: a ZSET semaphore, polled.
async fn raw_run(server: &RedisServer, run_for: Duration) -> Result<Record, BoxError> {
    let acquire = Arc::new(redis::Script::new(RAW_ACQUIRE));
    let record = Arc::new(Record::new());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let client = redis::Client::open(server.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let (record, stop, acquire) =
            (Arc::clone(&record), Arc::clone(&stop), Arc::clone(&acquire));
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // A member per acquisition, as the libraries draw a fresh id.
                n += 1;
                let member = format!("worker-{worker}-{n}");
                let asked = Instant::now();
                loop {
                    let now = epoch_ms()?;
                    let taken: i64 = acquire
                        .key("raw-semaphore")
                        .arg(&member)
                        .arg(now)
                        .arg(now + TTL_MS)
                        .arg(PERMITS)
                        .arg(TTL_MS)
                        .invoke_async(&mut conn)
                        .await?;
                    if taken == 1 {
                        break;
                    }
                    tokio::time::sleep(POLL).await;
                }
                let got = Instant::now();
                note_acquired(
                    &record,
                    &Acquired {
                        worker,
                        asked,
                        got,
                        permit: None,
                        released_before: None,
                    },
                )?;
                tokio::time::sleep(HOLD).await;
                note_release(&record, worker, None)?;
                let removed: i64 = redis::cmd("ZREM")
                    .arg("raw-semaphore")
                    .arg(&member)
                    .query_async(&mut conn)
                    .await?;
                if removed != 1 {
                    return Err(violation(
                        &record,
                        format!("worker {worker}'s release found its permit gone"),
                    ));
                }
            }
            Ok::<_, BoxError>(())
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    join_workers(tasks, &record).await?;
    into_record(record)
}

fn epoch_ms() -> Result<u64, BoxError> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(u64::try_from(since.as_millis())?)
}

fn released_max(record: &Mutex<Record>) -> Result<Option<u64>, BoxError> {
    Ok(record.lock().map_err(|_| "poisoned")?.released_max)
}

/// Records an acquisition, and fails when it makes more than [`PERMITS`]
/// holders at once, when another worker still believes it holds the same
/// permit key, or when the fencing token does not rise over the previous
/// token of that permit or over every token released before the wait began
/// (a grant that follows a release on the server must follow the released
/// grant too), or was handed out before. A holder is noted free before its release is sent, so with a
/// working semaphore no one can take its place in between.
fn note_acquired(record: &Mutex<Record>, a: &Acquired) -> Result<(), BoxError> {
    let mut r = record.lock().map_err(|_| "poisoned")?;
    let worker = a.worker;
    r.holding += 1;
    r.peak = r.peak.max(r.holding);
    if r.holding > PERMITS {
        let holding = r.holding;
        return Err(violated(
            &mut r,
            format!("{holding} holders at once of {PERMITS} permits (worker {worker} the last)"),
        ));
    }
    if let Some((index, token)) = a.permit {
        if let Some(other) = r.permit_holder[index] {
            return Err(violated(
                &mut r,
                format!(
                    "two holders of permit {index} at once: worker {worker} acquired while worker {other} held it"
                ),
            ));
        }
        r.permit_holder[index] = Some(worker);
        if let Some(last) = r.permit_token[index].filter(|last| token <= *last) {
            return Err(violated(
                &mut r,
                format!(
                    "worker {worker} got fencing token {token} for permit {index} after {last}"
                ),
            ));
        }
        if let Some(before) = a.released_before.filter(|before| token <= *before) {
            return Err(violated(
                &mut r,
                format!(
                    "worker {worker} got fencing token {token} after token {before} was released"
                ),
            ));
        }
        if !r.tokens.insert(token) {
            return Err(violated(
                &mut r,
                format!("worker {worker} got fencing token {token}, handed out before"),
            ));
        }
        r.permit_token[index] = Some(token);
    }
    r.waits.push(a.got - a.asked);
    r.per_worker[worker] += 1;
    Ok(())
}

/// Records that `worker` is about to release; it must be a holder, and the
/// holder of its permit key.
fn note_release(
    record: &Mutex<Record>,
    worker: usize,
    permit: Option<(usize, u64)>,
) -> Result<(), BoxError> {
    let mut r = record.lock().map_err(|_| "poisoned")?;
    if r.holding == 0 {
        return Err(violated(
            &mut r,
            format!("worker {worker} released while no one held a permit"),
        ));
    }
    r.holding -= 1;
    if let Some((index, token)) = permit {
        if r.permit_holder[index] != Some(worker) {
            let holder = r.permit_holder[index];
            return Err(violated(
                &mut r,
                format!(
                    "worker {worker} released permit {index} while the record names {holder:?} as its holder"
                ),
            ));
        }
        r.permit_holder[index] = None;
        r.released_max = r.released_max.max(Some(token));
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

fn into_record(record: Arc<Mutex<Record>>) -> Result<Record, BoxError> {
    Arc::try_unwrap(record)
        .map_err(|_| "workers still running")?
        .into_inner()
        .map_err(|_| "poisoned".into())
}

/// What every line names besides the figures.
struct Context {
    run_for: Duration,
    server: String,
    cpus: String,
}

/// One scenario's figures in one round.
#[derive(Clone, Copy)]
struct Summary {
    per_second: f64,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
    fewest: f64,
    most: f64,
    fairness: f64,
    peak_holders: f64,
}

impl Summary {
    fn of(run_for: Duration, mut record: Record) -> Self {
        record.waits.sort();
        let total: usize = record.per_worker.iter().sum();
        let fewest = record.per_worker.iter().min().copied().unwrap_or(0);
        let most = record.per_worker.iter().max().copied().unwrap_or(0);
        Self {
            per_second: total as f64 / run_for.as_secs_f64(),
            wait_p50_ms: percentile_us(&record.waits, 50.0) / 1e3,
            wait_p99_ms: percentile_us(&record.waits, 99.0) / 1e3,
            fewest: fewest as f64,
            most: most as f64,
            fairness: if most == 0 {
                0.0
            } else {
                fewest as f64 / most as f64
            },
            peak_holders: record.peak as f64,
        }
    }

    /// The median of each figure on its own.
    fn median(all: &[Self]) -> Self {
        let of = |field: fn(&Self) -> f64| {
            let mut values: Vec<f64> = all.iter().map(field).collect();
            median(&mut values)
        };
        Self {
            per_second: of(|s| s.per_second),
            wait_p50_ms: of(|s| s.wait_p50_ms),
            wait_p99_ms: of(|s| s.wait_p99_ms),
            fewest: of(|s| s.fewest),
            most: of(|s| s.most),
            fairness: of(|s| s.fairness),
            peak_holders: of(|s| s.peak_holders),
        }
    }

    fn print(&self, name: &str, context: &Context, round: &str) {
        let fencing = if name == RAW {
            "none"
        } else {
            "rising per semaphore"
        };
        let line = Json::new()
            .str("scenario", name)
            .str("round", round)
            .int("workers", WORKERS as u64)
            .int("permits", PERMITS as u64)
            .num("hold_ms", HOLD.as_secs_f64() * 1e3)
            .num("seconds", context.run_for.as_secs_f64())
            .str("fencing", fencing)
            .num("per_second", self.per_second.round())
            .num("wait_p50_ms", self.wait_p50_ms)
            .num("wait_p99_ms", self.wait_p99_ms)
            .num("fewest", self.fewest)
            .num("most", self.most)
            .num("fairness", self.fairness)
            .num("peak_holders", self.peak_holders)
            .str("redis", &context.server)
            .str("cpus", &context.cpus)
            .line();
        println!("{line}");
    }
}
