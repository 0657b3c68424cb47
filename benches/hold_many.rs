//! Holding many leases at once: leasehold's one watchdog against the same
//! hold loop written directly with the `redis` crate (one pipelined
//! compare-and-pexpire `EVALSHA` per lease every ttl/3).
//!
//! Run with `cargo bench --bench hold_many`. Each scenario runs in a process
//! of its own (this binary, started again), against a redis-server of its
//! own, so that CPU time and peak memory belong to that scenario alone.
//! Prints one JSON line per scenario. Settings: `LEASEHOLD_BENCH_HOLD_SECS`
//! (default 120), `LEASEHOLD_BENCH_SCENARIOS` (a comma-separated subset of
//! `leasehold_10k,leasehold_10k_untracked,raw_10k,leasehold_1m,`
//! `leasehold_1m_untracked,raw_1m`, or `leasehold_250k,raw_250k` and
//! `raw_10k_fenced,raw_1m_fenced` which are not run by default; a name may
//! be repeated, to interleave rounds), `LEASEHOLD_BENCH_QUICK=1` (1,000 leases for 5 s, to
//! check it runs). `leasehold_*` holds with the backend's defaults, client
//! tracking on (a lease overwritten behind its holder is noticed at once);
//! `*_untracked` turns tracking off, which is the same work the hand-written
//! loop does.
//!
//! `tasks_leasehold_10k` and `tasks_raw_10k` (run by default;
//! `tasks_leasehold_10k_untracked` on demand; `*_1k` in the quick
//! configuration) hold each lease in a task of its own, which awaits the
//! lease's token: the memory per lease of the usual way to hold one per job,
//! against the same written by hand (`SET NX PX`, then `INCR` of a fencing
//! counter, a renewal loop that cancels a task's token when its lease is
//! lost). Every task starts its acquisition at once;
//! `LEASEHOLD_BENCH_ACQUIRE_GATE=N` lets only N run at a time, to tell what
//! a held lease costs from what its acquisition costs in flight. Each
//! prints `size_of_val` of the acquisition's future and of a task's whole
//! future, the peak RSS (VmHWM) per lease and the RSS per lease at the end.
//!
//! A lease lost during the hold — its token fired, or the server no longer
//! holds it when the hold ends (or holds it for someone else, in the
//! per-task scenarios) — fails the run (non-zero exit), in the quick
//! configuration too; the figures never do.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use common::counting::Counting;
use common::{Json, env_number, quick};
use futures_util::future::join_all;
use leasehold::backend::LeaseBackend;
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{Lease, LeaseKey, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::RedisServer;
use redis::aio::ConnectionManager;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Acquisitions in flight at once.
const IN_FLIGHT: usize = 256;
/// Renewals (or acquisitions) per round trip for the hand-written loop,
/// the same bound as leasehold's batches.
const RAW_PIPELINE: usize = 1000;

/// Pipelines the hand-written loop keeps in flight.
const PIPELINES_IN_FLIGHT: usize = 16;

/// The hand-written loop's compare-and-pexpire.
const RAW_RENEW_SOURCE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
static RAW_RENEW: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RAW_RENEW_SOURCE));

/// A scenario: who holds, how many, for how long each.
struct Scenario {
    name: &'static str,
    leasehold: bool,
    leases: usize,
    ttl: &'static str,
    /// Client tracking on the renewal connection (the backend's default).
    tracking: bool,
    /// For the hand-written loop: store what leasehold stores (its key
    /// names, a fencing counter beside each lease, the token in the value),
    /// so that the server holds the same data and only the renewals differ.
    fenced: bool,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "leasehold_10k",
        leasehold: true,
        leases: 10_000,
        ttl: "3s",
        tracking: true,
        fenced: false,
    },
    Scenario {
        name: "leasehold_10k_untracked",
        leasehold: true,
        leases: 10_000,
        ttl: "3s",
        tracking: false,
        fenced: false,
    },
    Scenario {
        name: "raw_10k",
        leasehold: false,
        leases: 10_000,
        ttl: "3s",
        tracking: false,
        fenced: false,
    },
    Scenario {
        name: "leasehold_1m",
        leasehold: true,
        leases: 1_000_000,
        ttl: "30s",
        tracking: true,
        fenced: false,
    },
    Scenario {
        name: "leasehold_1m_untracked",
        leasehold: true,
        leases: 1_000_000,
        ttl: "30s",
        tracking: false,
        fenced: false,
    },
    Scenario {
        name: "raw_1m",
        leasehold: false,
        leases: 1_000_000,
        ttl: "30s",
        tracking: false,
        fenced: false,
    },
];

/// Not run by default: a size between the two, where one watchdog task
/// still keeps up on this machine; and the hand-written loop over
/// leasehold's data layout.
const EXTRA_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "raw_10k_fenced",
        leasehold: false,
        leases: 10_000,
        ttl: "3s",
        tracking: false,
        fenced: true,
    },
    Scenario {
        name: "raw_1m_fenced",
        leasehold: false,
        leases: 1_000_000,
        ttl: "30s",
        tracking: false,
        fenced: true,
    },
    Scenario {
        name: "leasehold_250k",
        leasehold: true,
        leases: 250_000,
        ttl: "30s",
        tracking: true,
        fenced: false,
    },
    Scenario {
        name: "raw_250k",
        leasehold: false,
        leases: 250_000,
        ttl: "30s",
        tracking: false,
        fenced: false,
    },
];

const QUICK_SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "leasehold_1k",
        leasehold: true,
        leases: 1_000,
        ttl: "3s",
        tracking: true,
        fenced: false,
    },
    Scenario {
        name: "leasehold_1k_untracked",
        leasehold: true,
        leases: 1_000,
        ttl: "3s",
        tracking: false,
        fenced: false,
    },
    Scenario {
        name: "raw_1k",
        leasehold: false,
        leases: 1_000,
        ttl: "3s",
        tracking: false,
        fenced: false,
    },
];

/// The server's tracking table holds 1,000,000 keys by default, shared by
/// every client; past it the server evicts tracked keys (and reports each
/// as changed). A million tracked leases need room for all of them.
const TRACKING_TABLE_KEYS: &str = "2000000";

/// What a hold measured.
struct Held {
    acquire_secs: f64,
    lost: u64,
    renewals: u64,
    round_trips: u64,
    client_cpu: f64,
    server_cpu: f64,
    /// The server's user CPU alone (what its instruction count measures).
    server_user_cpu: f64,
    /// Peak RSS above the RSS before acquiring, in bytes.
    peak_rss_delta: f64,
    /// The RSS before acquiring (the process's fixed cost: runtime,
    /// connections, allocator), in bytes.
    rss_before: f64,
    hold_secs: f64,
    /// The slowest renewal round trip during the hold, in milliseconds.
    slowest_renewal_ms: f64,
    /// Leases the server no longer held at the end of the hold, by its own
    /// `EXISTS`.
    missing: u64,
}

fn main() -> BenchResult {
    let quick = quick();
    let scenarios = if quick { QUICK_SCENARIOS } else { SCENARIOS };
    let Some(name) = common::child_scenario() else {
        let only = std::env::var("LEASEHOLD_BENCH_SCENARIOS").unwrap_or_default();
        let chosen: Vec<&str> = if only.is_empty() {
            let tasks = if quick {
                ["tasks_leasehold_1k", "tasks_raw_1k"]
            } else {
                ["tasks_leasehold_10k", "tasks_raw_10k"]
            };
            scenarios.iter().map(|s| s.name).chain(tasks).collect()
        } else {
            only.split(',').map(str::trim).collect()
        };
        return common::run_children(&chosen);
    };
    let hold = Duration::from_secs(if quick {
        5
    } else {
        env_number("LEASEHOLD_BENCH_HOLD_SECS", 120)
    });
    if let Some(scenario) = TASK_SCENARIOS.iter().find(|s| s.name == name) {
        return run_task_scenario(scenario, hold, quick);
    }
    let scenario = scenarios
        .iter()
        .chain(EXTRA_SCENARIOS)
        .find(|s| s.name == name)
        .ok_or_else(|| format!("no scenario {name}"))?;
    let server = RedisServer::builder()
        .arg("--tracking-table-max-keys")
        .arg(TRACKING_TABLE_KEYS)
        .start()?;
    let version = common::server_version(&server);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ttl = Ttl::parse(scenario.ttl)?;
    let (held, leases) = runtime.block_on(async {
        if scenario.leasehold {
            hold_with_leasehold(&server, scenario, ttl, hold).await
        } else {
            hold_by_hand(&server, scenario.leases, scenario.fenced, ttl, hold)
                .await
                .map(|held| (held, Vec::new()))
        }
    })?;
    let n = scenario.leases as f64;
    let line = Json::new()
        .str("bench", "hold_many")
        .str("scenario", scenario.name)
        .int("leases", scenario.leases as u64)
        .str("ttl", scenario.ttl)
        .str("tracking", if scenario.tracking { "on" } else { "off" })
        .num("hold_secs", held.hold_secs)
        .num("acquire_secs", held.acquire_secs)
        .int("lost", held.lost)
        .int("renewals", held.renewals)
        .int("round_trips", held.round_trips)
        .num(
            "renewals_per_round_trip",
            held.renewals as f64 / held.round_trips.max(1) as f64,
        )
        .num(
            "round_trips_per_sec",
            held.round_trips as f64 / held.hold_secs,
        )
        .num("client_cpu_secs", held.client_cpu)
        .num("server_cpu_secs", held.server_cpu)
        .num(
            "client_cpu_us_per_renewal",
            held.client_cpu * 1e6 / held.renewals.max(1) as f64,
        )
        .num(
            "server_cpu_us_per_renewal",
            held.server_cpu * 1e6 / held.renewals.max(1) as f64,
        )
        .num(
            "server_user_cpu_us_per_renewal",
            held.server_user_cpu * 1e6 / held.renewals.max(1) as f64,
        )
        .num("client_peak_rss_bytes_per_lease", held.peak_rss_delta / n)
        .num("client_rss_before_bytes", held.rss_before)
        .num(
            "client_peak_rss_bytes",
            held.rss_before + held.peak_rss_delta,
        )
        .num("slowest_renewal_ms", held.slowest_renewal_ms)
        .str("cpus", &common::cpus_allowed())
        .str("redis", &version)
        .str("quick", if quick { "yes" } else { "no" })
        .line();
    println!("{line}");
    // Nothing left to measure: drop the runtime (and the watchdog) without
    // waiting for a million releases, then the leases, then the server.
    runtime.shutdown_background();
    drop(leases);
    drop(server);
    // Speed is a figure; a lease lost during the hold is a failure.
    if held.lost > 0 || held.missing > 0 {
        return Err(format!(
            "hold_many {}: correctness violation: {} of {} leases reported lost during the hold, \
             {} missing from the server at its end",
            scenario.name, held.lost, scenario.leases, held.missing
        )
        .into());
    }
    Ok(())
}

/// How many of `keys` the server does not hold, asked in pipelines of
/// `EXISTS` on a connection of its own.
async fn missing_on_server(server: &RedisServer, keys: &[String]) -> BenchResult<u64> {
    let mut conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let mut missing = 0;
    for chunk in keys.chunks(RAW_PIPELINE) {
        let held: u64 = redis::cmd("EXISTS")
            .arg(chunk)
            .query_async(&mut conn)
            .await?;
        missing += chunk.len() as u64 - held;
    }
    Ok(missing)
}

/// The client's CPU seconds, and the server's user and system CPU seconds.
fn cpu_now(server: &RedisServer) -> BenchResult<(f64, (f64, f64))> {
    let client = common::process_cpu_seconds().ok_or("no /proc/self/stat")?;
    let server = common::server_cpu_split(server).ok_or("no INFO cpu")?;
    Ok((client, server))
}

/// The peak RSS since `reset`, less `baseline`, in bytes.
fn peak_delta(baseline: u64) -> f64 {
    common::status_bytes("VmHWM").map_or(f64::NAN, |peak| peak.saturating_sub(baseline) as f64)
}

/// The RSS now, less `baseline`, in bytes.
fn rss_delta(baseline: u64) -> f64 {
    common::status_bytes("VmRSS").map_or(f64::NAN, |rss| rss.saturating_sub(baseline) as f64)
}

/// RSS now, after resetting the peak to it.
fn rss_baseline() -> BenchResult<u64> {
    if !common::reset_peak_rss() {
        eprintln!("hold_many: cannot reset VmHWM; the peak includes earlier use");
    }
    Ok(common::status_bytes("VmRSS").ok_or("no VmRSS")?)
}

async fn hold_with_leasehold(
    server: &RedisServer,
    scenario: &Scenario,
    ttl: Ttl,
    hold: Duration,
) -> BenchResult<(Held, Vec<Lease>)> {
    let count = scenario.leases;
    let backend = Counting::new(
        RedisBackend::builder(server.url())
            .track_lease_changes(scenario.tracking)
            .connect()
            .await?,
    );
    let manager = LeaseManager::new(backend.clone())?;
    // Keys are distinct, so nobody waits: the wait only lets an acquisition
    // that timed out on a busy machine be retried.
    let options = LeaseOptions::builder()
        .ttl(ttl)
        .wait(Duration::from_secs(60))
        .build()?;
    let baseline = rss_baseline()?;

    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::with_capacity(IN_FLIGHT);
    for _ in 0..IN_FLIGHT {
        let (manager, options, next) = (manager.clone(), options.clone(), Arc::clone(&next));
        workers.push(tokio::spawn(async move {
            let mut leases = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, String>(leases);
                }
                let lease = manager
                    .acquire(format!("hold:{i}"), &options)
                    .await
                    .map_err(|e| e.to_string())?;
                leases.push(lease);
            }
        }));
    }
    let mut leases = Vec::with_capacity(count);
    for worker in workers {
        leases.extend(worker.await??);
    }
    let acquire_secs = started.elapsed().as_secs_f64();

    let (client0, server0) = cpu_now(server)?;
    let (trips0, renewals0) = (
        backend.round_trips.load(Ordering::Relaxed),
        backend.renewals.load(Ordering::Relaxed),
    );
    backend.slowest_us.store(0, Ordering::Relaxed);
    let hold_started = Instant::now();
    if std::env::var("LEASEHOLD_BENCH_WATCH").is_ok() {
        // Diagnosis only: scanning every lease each second costs CPU.
        while hold_started.elapsed() < hold {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let lost = leases.iter().filter(|l| l.loss_reason().is_some()).count();
            eprintln!(
                "hold_many: {:.0} s: {lost} lost, {} renewals, {} round trips, slowest {} ms",
                hold_started.elapsed().as_secs_f64(),
                backend.renewals.load(Ordering::Relaxed),
                backend.round_trips.load(Ordering::Relaxed),
                backend.slowest_us.swap(0, Ordering::Relaxed) / 1000,
            );
        }
    } else {
        tokio::time::sleep(hold).await;
    }
    let hold_secs = hold_started.elapsed().as_secs_f64();
    let (client1, server1) = cpu_now(server)?;
    let lost = leases
        .iter()
        .filter(|l| l.loss_reason().is_some() || l.token().is_cancelled())
        .count() as u64;
    let mut reasons: Vec<String> = leases
        .iter()
        .filter_map(|l| l.loss_reason())
        .map(|r| r.as_str().to_owned())
        .collect();
    reasons.sort();
    reasons.dedup();
    if !reasons.is_empty() {
        eprintln!("hold_many: leases lost, by reason: {reasons:?}");
    }
    let held = Held {
        acquire_secs,
        lost,
        renewals: backend.renewals.load(Ordering::Relaxed) - renewals0,
        round_trips: backend.round_trips.load(Ordering::Relaxed) - trips0,
        client_cpu: client1 - client0,
        server_cpu: (server1.0 + server1.1) - (server0.0 + server0.1),
        server_user_cpu: server1.0 - server0.0,
        peak_rss_delta: peak_delta(baseline),
        rss_before: baseline as f64,
        hold_secs,
        slowest_renewal_ms: backend.slowest_us.load(Ordering::Relaxed) as f64 / 1000.0,
        missing: 0,
    };
    // After the figures: the hold outlasts the ttl, so a lease the server
    // still holds was renewed there.
    let layout = KeyLayout::default();
    let stored: Vec<String> = leases.iter().map(|l| layout.lease(l.key())).collect();
    let held = Held {
        missing: missing_on_server(server, &stored).await?,
        ..held
    };
    Ok((held, leases))
}

async fn hold_by_hand(
    server: &RedisServer,
    count: usize,
    fenced: bool,
    ttl: Ttl,
    hold: Duration,
) -> BenchResult<Held> {
    let client = redis::Client::open(server.url())?;
    // No response timeout: a pipeline of 1000 scripts may take a while on a
    // busy machine, and the loop has no deadline logic of its own.
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut conn = ConnectionManager::new_with_config(client, config).await?;
    // Loaded once, then called by EVALSHA in pipelines.
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RAW_RENEW_SOURCE)
        .query_async::<String>(&mut conn)
        .await?;
    let sha = RAW_RENEW.get_hash();
    let ttl_ms = u64::try_from(ttl.get().as_millis())?;
    let baseline = rss_baseline()?;

    let started = Instant::now();
    // The fenced layout's tokens are of the size of leasehold's
    // (microseconds since the epoch). Each lease's value is what its
    // renewal compares.
    let token = 1_700_000_000_000_000u64;
    let leases: Vec<(String, String)> = (0..count)
        .map(|i| {
            let holder = format!("{:032x}", fastrand::u128(..));
            if fenced {
                (
                    format!("leasehold:{{hold:{i}}}"),
                    format!("{holder}:{token}:"),
                )
            } else {
                (format!("hold:{i}"), holder)
            }
        })
        .collect();
    for group in leases.chunks(RAW_PIPELINE * PIPELINES_IN_FLIGHT) {
        let sends = group.chunks(RAW_PIPELINE).map(|chunk| {
            let mut pipe = redis::pipe();
            for (key, holder) in chunk {
                if fenced {
                    pipe.cmd("SET")
                        .arg(format!("{key}:fence"))
                        .arg(token)
                        .ignore();
                }
                pipe.cmd("SET")
                    .arg(key)
                    .arg(holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .ignore();
            }
            let mut conn = conn.clone();
            async move { pipe.query_async::<()>(&mut conn).await }
        });
        for sent in join_all(sends).await {
            sent?;
        }
    }
    let acquire_secs = started.elapsed().as_secs_f64();

    let (client0, server0) = cpu_now(server)?;
    let interval = ttl.get() / 3;
    let hold_started = Instant::now();
    let (mut renewals, mut round_trips, mut slowest) = (0u64, 0u64, Duration::ZERO);
    let mut lost = vec![false; count];
    let mut tick = hold_started;
    loop {
        // Renew every lease once per interval; the first renewal is one
        // interval after acquiring, as for leasehold.
        tick += interval;
        if tick > hold_started + hold {
            break;
        }
        tokio::time::sleep_until(tick.into()).await;
        // At most PIPELINES_IN_FLIGHT pipelines at once: a million
        // commands queued on one connection would only wait in line.
        let per_group = RAW_PIPELINE * PIPELINES_IN_FLIGHT;
        for (group_index, group) in leases.chunks(per_group).enumerate() {
            let sends = group.chunks(RAW_PIPELINE).map(|chunk| {
                let mut pipe = redis::pipe();
                for (key, holder) in chunk {
                    pipe.cmd("EVALSHA")
                        .arg(sha)
                        .arg(1)
                        .arg(key)
                        .arg(holder)
                        .arg(ttl_ms);
                }
                let mut conn = conn.clone();
                async move {
                    let started = Instant::now();
                    let renewed = pipe.query_async::<Vec<i64>>(&mut conn).await;
                    (renewed, started.elapsed())
                }
            });
            let first = group_index * per_group;
            for (chunk_index, (renewed, took)) in join_all(sends).await.into_iter().enumerate() {
                round_trips += 1;
                slowest = slowest.max(took);
                let renewed = renewed?;
                renewals += renewed.len() as u64;
                for (i, outcome) in renewed.iter().enumerate() {
                    if *outcome != 1 {
                        lost[first + chunk_index * RAW_PIPELINE + i] = true;
                    }
                }
            }
        }
    }
    let hold_secs = hold_started.elapsed().as_secs_f64();
    let (client1, server1) = cpu_now(server)?;
    let stored: Vec<String> = leases.iter().map(|(key, _)| key.clone()).collect();
    let missing = missing_on_server(server, &stored).await?;
    Ok(Held {
        missing,
        acquire_secs,
        lost: lost.iter().filter(|l| **l).count() as u64,
        renewals,
        round_trips,
        client_cpu: client1 - client0,
        server_cpu: (server1.0 + server1.1) - (server0.0 + server0.1),
        server_user_cpu: server1.0 - server0.0,
        peak_rss_delta: peak_delta(baseline),
        rss_before: baseline as f64,
        hold_secs,
        slowest_renewal_ms: slowest.as_secs_f64() * 1000.0,
    })
}

/// One lease per task: the usual way to hold a lease for a job. Every task
/// acquires its own key and awaits its lease's token for the whole hold;
/// the figure is the peak RSS per lease, tasks included, against the same
/// done by hand (`SET NX PX` then `INCR` of a fencing counter, in its own
/// task, awaiting a token that a renewal loop cancels on a failed renewal).
struct TaskScenario {
    name: &'static str,
    leasehold: bool,
    leases: usize,
    /// Client tracking on leasehold's renewal connection (its default).
    tracking: bool,
}

const TASK_SCENARIOS: &[TaskScenario] = &[
    TaskScenario {
        name: "tasks_leasehold_10k",
        leasehold: true,
        leases: 10_000,
        tracking: true,
    },
    TaskScenario {
        name: "tasks_leasehold_10k_untracked",
        leasehold: true,
        leases: 10_000,
        tracking: false,
    },
    TaskScenario {
        name: "tasks_raw_10k",
        leasehold: false,
        leases: 10_000,
        tracking: false,
    },
    TaskScenario {
        name: "tasks_leasehold_1k",
        leasehold: true,
        leases: 1_000,
        tracking: true,
    },
    TaskScenario {
        name: "tasks_raw_1k",
        leasehold: false,
        leases: 1_000,
        tracking: false,
    },
];

/// Acquisitions the per-task scenarios let run at once: all of them unless
/// `LEASEHOLD_BENCH_ACQUIRE_GATE` bounds them, which separates what a held
/// lease costs from what its acquisition costs while in flight.
fn acquire_gate() -> usize {
    usize::try_from(env_number("LEASEHOLD_BENCH_ACQUIRE_GATE", 0))
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(tokio::sync::Semaphore::MAX_PERMITS)
}

/// The per-task scenarios' ttl: the hold outlasts it, so a lease the server
/// still holds at the end was renewed.
const TASK_TTL: &str = "3s";

/// What the tasks of a per-task scenario report, shared with `main`.
#[derive(Default)]
struct TaskTally {
    acquired: AtomicUsize,
    lost: AtomicUsize,
    failed: Mutex<Vec<String>>,
}

/// What a per-task hold measured.
struct TaskHeld {
    acquire_secs: f64,
    peak_rss_delta: f64,
    /// RSS above the baseline at the end of the hold, in bytes.
    rss_delta: f64,
    /// `size_of_val` of the acquisition's future and of a task's whole future.
    acquire_future: usize,
    task_future: usize,
    lost: u64,
    missing: u64,
    /// Keys whose holder on the server is not the task that acquired them.
    foreign: u64,
}

fn run_task_scenario(scenario: &TaskScenario, hold: Duration, quick: bool) -> BenchResult {
    let server = RedisServer::builder().start()?;
    let version = common::server_version(&server);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ttl = Ttl::parse(TASK_TTL)?;
    let held = runtime.block_on(async {
        if scenario.leasehold {
            tasks_with_leasehold(&server, scenario, ttl, hold).await
        } else {
            tasks_by_hand(&server, scenario.leases, ttl, hold).await
        }
    })?;
    let line = Json::new()
        .str("bench", "hold_many")
        .str("scenario", scenario.name)
        .int("leases", scenario.leases as u64)
        .str("ttl", TASK_TTL)
        .str("tracking", if scenario.tracking { "on" } else { "off" })
        .num("hold_secs", hold.as_secs_f64())
        .num("acquire_secs", held.acquire_secs)
        .int("lost", held.lost)
        .int("missing", held.missing)
        .int("foreign", held.foreign)
        .int("acquire_future_bytes", held.acquire_future as u64)
        .int("task_future_bytes", held.task_future as u64)
        .num(
            "client_peak_rss_bytes_per_lease",
            held.peak_rss_delta / scenario.leases as f64,
        )
        .num(
            "client_end_rss_bytes_per_lease",
            held.rss_delta / scenario.leases as f64,
        )
        .str("cpus", &common::cpus_allowed())
        .str("redis", &version)
        .str("quick", if quick { "yes" } else { "no" })
        .line();
    println!("{line}");
    runtime.shutdown_background();
    drop(server);
    if held.lost > 0 || held.missing > 0 || held.foreign > 0 {
        return Err(format!(
            "hold_many {}: correctness violation: of {} leases, {} reported lost during the \
             hold, {} missing from the server at its end, {} held there by someone else",
            scenario.name, scenario.leases, held.lost, held.missing, held.foreign
        )
        .into());
    }
    Ok(())
}

/// Waits until every task acquired (or one failed), bounded by `limit`.
async fn all_acquired(tally: &TaskTally, count: usize, limit: Duration) -> BenchResult {
    let started = Instant::now();
    loop {
        if let Some(failure) = tally
            .failed
            .lock()
            .map_err(|_| "poisoned")?
            .first()
            .cloned()
        {
            return Err(format!("an acquisition failed: {failure}").into());
        }
        if tally.acquired.load(Ordering::Acquire) == count {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(format!(
                "only {} of {count} leases acquired in {limit:?}",
                tally.acquired.load(Ordering::Acquire)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn tasks_with_leasehold(
    server: &RedisServer,
    scenario: &TaskScenario,
    ttl: Ttl,
    hold: Duration,
) -> BenchResult<TaskHeld> {
    let count = scenario.leases;
    let backend = RedisBackend::builder(server.url())
        .track_lease_changes(scenario.tracking)
        .connect()
        .await?;
    let manager = LeaseManager::new(backend)?;
    let options = Arc::new(
        LeaseOptions::builder()
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .build()?,
    );
    let tally = Arc::new(TaskTally::default());
    // Each task's fencing token, written once acquired; allocated before the
    // baseline, as it is the bench's, not the leases'.
    let tokens: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let stop = tokio_util::sync::CancellationToken::new();
    let acquire_future = std::mem::size_of_val(&manager.acquire("size", &options));
    let gate = Arc::new(tokio::sync::Semaphore::new(acquire_gate()));
    let mut task_future = 0;
    let baseline = rss_baseline()?;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let (manager, options, tally, tokens, stop) = (
            manager.clone(),
            Arc::clone(&options),
            Arc::clone(&tally),
            Arc::clone(&tokens),
            stop.clone(),
        );
        let gate = Arc::clone(&gate);
        let task = async move {
            let permit = gate.acquire().await;
            let lease = match manager.acquire(format!("task:{i}"), &options).await {
                Ok(lease) => lease,
                Err(error) => {
                    if let Ok(mut failed) = tally.failed.lock() {
                        failed.push(error.to_string());
                    }
                    return;
                }
            };
            drop(permit);
            tokens[i].store(lease.fencing_token().get(), Ordering::Relaxed);
            tally.acquired.fetch_add(1, Ordering::Release);
            // The job: runs until the bench stops it, or the lease is lost.
            let token = lease.token();
            tokio::select! {
                biased;
                () = token.cancelled() => {
                    tally.lost.fetch_add(1, Ordering::Relaxed);
                }
                () = stop.cancelled() => {}
            }
            drop(lease);
        };
        task_future = std::mem::size_of_val(&task);
        tasks.push(tokio::spawn(task));
    }
    all_acquired(&tally, count, Duration::from_secs(120)).await?;
    let acquire_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(hold).await;
    let peak_rss_delta = peak_delta(baseline);
    let rss_delta = rss_delta(baseline);
    let lost = tally.lost.load(Ordering::Relaxed) as u64;
    // The server's own view, while every task still holds its lease: each
    // key held, by the holder of the fencing token its task was given.
    let backend = manager.backend();
    let (mut missing, mut foreign) = (0, 0);
    for (i, token) in tokens.iter().enumerate() {
        let key = LeaseKey::new(format!("task:{i}"))?;
        match backend.inspect(&key).await? {
            None => missing += 1,
            Some(info) => {
                if info.fencing_token.map(|t| t.get()) != Some(token.load(Ordering::Relaxed)) {
                    foreign += 1;
                }
            }
        }
    }
    stop.cancel();
    for task in tasks {
        task.await?;
    }
    Ok(TaskHeld {
        acquire_secs,
        peak_rss_delta,
        rss_delta,
        acquire_future,
        task_future,
        lost,
        missing,
        foreign,
    })
}

/// A hand-held lease as the renewal loop sees it.
struct RawHeld {
    key: String,
    holder: String,
    token: tokio_util::sync::CancellationToken,
}

async fn tasks_by_hand(
    server: &RedisServer,
    count: usize,
    ttl: Ttl,
    hold: Duration,
) -> BenchResult<TaskHeld> {
    let client = redis::Client::open(server.url())?;
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut conn = ConnectionManager::new_with_config(client, config).await?;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RAW_RENEW_SOURCE)
        .query_async::<String>(&mut conn)
        .await?;
    let ttl_ms = u64::try_from(ttl.get().as_millis())?;
    let tally = Arc::new(TaskTally::default());
    let held: Arc<Mutex<Vec<RawHeld>>> = Arc::new(Mutex::new(Vec::with_capacity(count)));
    let stop = tokio_util::sync::CancellationToken::new();
    let acquire = move |conn: ConnectionManager, key: String, holder: String| async move {
        raw_acquire(conn, &key, &holder, ttl_ms).await
    };
    let acquire_future =
        std::mem::size_of_val(&acquire(conn.clone(), String::new(), String::new()));
    let gate = Arc::new(tokio::sync::Semaphore::new(acquire_gate()));
    let mut task_future = 0;
    let baseline = rss_baseline()?;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        let (conn, tally, held, stop) = (
            conn.clone(),
            Arc::clone(&tally),
            Arc::clone(&held),
            stop.clone(),
        );
        let gate = Arc::clone(&gate);
        let task = async move {
            let permit = gate.acquire().await;
            let key = format!("task:{i}");
            let holder = format!("{:032x}", fastrand::u128(..));
            if let Err(error) = acquire(conn, key.clone(), holder.clone()).await {
                if let Ok(mut failed) = tally.failed.lock() {
                    failed.push(error);
                }
                return;
            }
            drop(permit);
            let token = tokio_util::sync::CancellationToken::new();
            if let Ok(mut held) = held.lock() {
                held.push(RawHeld {
                    key,
                    holder,
                    token: token.clone(),
                });
            }
            tally.acquired.fetch_add(1, Ordering::Release);
            tokio::select! {
                biased;
                () = token.cancelled() => {
                    tally.lost.fetch_add(1, Ordering::Relaxed);
                }
                () = stop.cancelled() => {}
            }
        };
        task_future = std::mem::size_of_val(&task);
        tasks.push(tokio::spawn(task));
    }
    // The renewal loop, from the first acquisition on: every ttl/3, every
    // lease held so far, in pipelines; a failed renewal fires the token.
    let renewer = tokio::spawn(raw_renew_loop(
        conn.clone(),
        Arc::clone(&held),
        ttl,
        stop.clone(),
    ));
    all_acquired(&tally, count, Duration::from_secs(120)).await?;
    let acquire_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(hold).await;
    let peak_rss_delta = peak_delta(baseline);
    let rss_delta = rss_delta(baseline);
    let lost = tally.lost.load(Ordering::Relaxed) as u64;
    let (mut missing, mut foreign) = (0, 0);
    let pairs: Vec<(String, String)> = held
        .lock()
        .map_err(|_| "poisoned")?
        .iter()
        .map(|h| (h.key.clone(), h.holder.clone()))
        .collect();
    for chunk in pairs.chunks(RAW_PIPELINE) {
        let keys: Vec<&String> = chunk.iter().map(|(key, _)| key).collect();
        let values: Vec<Option<String>> =
            redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        for ((_, holder), value) in chunk.iter().zip(values) {
            match value {
                None => missing += 1,
                Some(value) if value != *holder => foreign += 1,
                Some(_) => {}
            }
        }
    }
    stop.cancel();
    for task in tasks {
        task.await?;
    }
    renewer.await??;
    Ok(TaskHeld {
        acquire_secs,
        peak_rss_delta,
        rss_delta,
        acquire_future,
        task_future,
        lost,
        missing,
        foreign,
    })
}

/// `SET key holder NX PX ttl`, then the fencing counter's `INCR`.
async fn raw_acquire(
    mut conn: ConnectionManager,
    key: &str,
    holder: &str,
    ttl_ms: u64,
) -> Result<u64, String> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(holder)
        .arg("NX")
        .arg("PX")
        .arg(ttl_ms)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    if set.is_none() {
        return Err(format!("{key} is held by someone else"));
    }
    redis::cmd("INCR")
        .arg(format!("{key}:fence"))
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())
}

async fn raw_renew_loop(
    mut conn: ConnectionManager,
    held: Arc<Mutex<Vec<RawHeld>>>,
    ttl: Ttl,
    stop: tokio_util::sync::CancellationToken,
) -> Result<(), String> {
    let ttl_ms = u64::try_from(ttl.get().as_millis()).map_err(|e| e.to_string())?;
    let sha = RAW_RENEW.get_hash();
    let mut tick = tokio::time::interval(ttl.get() / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let (pipes, tokens) = {
            let held = held.lock().map_err(|_| "poisoned".to_owned())?;
            let mut pipes = Vec::new();
            for chunk in held.chunks(RAW_PIPELINE) {
                let mut pipe = redis::pipe();
                for lease in chunk {
                    pipe.cmd("EVALSHA")
                        .arg(sha)
                        .arg(1)
                        .arg(&lease.key)
                        .arg(&lease.holder)
                        .arg(ttl_ms);
                }
                pipes.push(pipe);
            }
            let tokens: Vec<_> = held.iter().map(|l| l.token.clone()).collect();
            (pipes, tokens)
        };
        let mut i = 0;
        for pipe in pipes {
            let renewed: Vec<i64> = pipe
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            for outcome in renewed {
                if outcome != 1 {
                    tokens[i].cancel();
                }
                i += 1;
            }
        }
    }
}
