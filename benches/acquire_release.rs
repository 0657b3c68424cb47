//! Acquire/release throughput and latency: leasehold's `LeaseManager`, its
//! `RedisBackend` alone, and the same loop written directly with the `redis`
//! crate (`SET NX PX` + compare-and-delete `EVALSHA`) as the ceiling. A
//! fourth client runs leasehold's own Lua scripts by hand with the `redis`
//! crate: the ceiling for a client that hands out fencing tokens, which
//! separates the cost of the library from the cost of the server-side work.
//!
//! Run with `cargo bench --bench acquire_release` (pin it with
//! `taskset -c 0` for sequential figures: the redis-server it starts inherits
//! the pinning). Prints one JSON line per scenario. Settings:
//! `LEASEHOLD_BENCH_SECS` (seconds per run, default 3), `LEASEHOLD_BENCH_REPEATS`
//! (default 5), `LEASEHOLD_BENCH_QUICK=1` (a few cycles, to check it runs),
//! `LEASEHOLD_BENCH_CLIENTS` (a comma-separated subset of the client names),
//! `LEASEHOLD_BENCH_CALLS_IN_FLIGHT` (the backend's `calls_in_flight`,
//! default the backend's own).
//!
//! A broken cycle — a free key not granted, a lease lost while held, a
//! release that finds it gone, a fencing token that does not rise, a
//! released lease left on the server — fails the run (non-zero exit), in
//! the quick configuration too; the figures never do.

mod common;

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use common::{Json, env_number, median, percentile_us, quick};
use leasehold::backend::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend};
use leasehold::redis::{KeyLayout, RedisBackend};
use leasehold::{LeaseKey, ReleaseOutcome, Ttl};
use leasehold::{LeaseManager, LeaseOptions};
use leasehold_testkit::RedisServer;
use redis::aio::ConnectionManager;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const CONCURRENT_TASKS: usize = 64;

/// leasehold's acquire and release scripts, run by hand.
static LEASEHOLD_ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../crates/leasehold-redis/src/scripts/grant.lua"),
        include_str!("../crates/leasehold-redis/src/scripts/acquire.lua")
    ))
});
static LEASEHOLD_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(include_str!(
        "../crates/leasehold-redis/src/scripts/release.lua"
    ))
});

/// Compare-and-delete, as a hand-written client would do it.
static RAW_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    )
});

#[derive(Clone, Copy, Debug)]
enum Client {
    /// `LeaseManager::acquire` + `Lease::release`: the whole library, watchdog included.
    Manager,
    /// `RedisBackend::try_acquire` + `release`: the Redis backend alone.
    Backend,
    /// The `redis` crate by hand: the ceiling.
    Raw,
    /// The `redis` crate by hand, running leasehold's scripts.
    RawScripts,
    /// As `RawScripts`, on a connection with client tracking on (RESP3),
    /// the grant read back so that the server tracks it: the same server
    /// work as the leasehold rows, which track by default.
    RawScriptsTracked,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Self::Manager => "leasehold_manager",
            Self::Backend => "leasehold_backend",
            Self::Raw => "raw_redis",
            Self::RawScripts => "raw_redis_leasehold_scripts",
            Self::RawScriptsTracked => "raw_redis_leasehold_scripts_tracked",
        }
    }
}

#[derive(Clone)]
struct Clients {
    manager: LeaseManager<RedisBackend>,
    backend: RedisBackend,
    raw: ConnectionManager,
    /// A RESP3 connection with `CLIENT TRACKING ON`.
    tracked: ConnectionManager,
    options: LeaseOptions,
    ttl: Ttl,
}

/// One acquire and release: their latencies, and the fencing token the
/// acquisition handed out (none for the plain `SET NX` client).
struct Cycle {
    acquire: Duration,
    release: Duration,
    token: Option<u64>,
}

/// One acquire and one release of `key`. Every outcome is checked: an
/// acquisition of a free key that is not granted, a lease lost while held,
/// or a release that finds the lease gone is an error, which ends the run.
async fn cycle(clients: &Clients, client: Client, key: &str) -> BenchResult<Cycle> {
    match client {
        Client::Manager => {
            let t0 = Instant::now();
            let lease = clients.manager.acquire(key, &clients.options).await?;
            let t1 = Instant::now();
            check(
                lease.loss_reason().is_none(),
                key,
                "the lease was lost while held",
            )?;
            let token = lease.fencing_token().get();
            let outcome = lease.release().await?;
            let t2 = Instant::now();
            check(
                outcome == ReleaseOutcome::Released,
                key,
                "the release found the lease gone",
            )?;
            Ok(Cycle {
                acquire: t1 - t0,
                release: t2 - t1,
                token: Some(token),
            })
        }
        Client::Backend => {
            let request =
                AcquireRequest::new(LeaseKey::new(key)?, HolderId::generate()?, clients.ttl);
            let t0 = Instant::now();
            let outcome = clients.backend.try_acquire(&request).await?;
            let t1 = Instant::now();
            let AcquireOutcome::Acquired(grant) = outcome else {
                return Err(violation(key, "a free key was not granted"));
            };
            let released = clients
                .backend
                .release(&request.key, &request.holder)
                .await?;
            let t2 = Instant::now();
            check(
                released.outcome() == ReleaseOutcome::Released,
                key,
                "the release found the lease gone",
            )?;
            Ok(Cycle {
                acquire: t1 - t0,
                release: t2 - t1,
                token: Some(grant.fencing_token.get()),
            })
        }
        Client::RawScripts => raw_scripts_cycle(clients, key, false).await,
        Client::RawScriptsTracked => raw_scripts_cycle(clients, key, true).await,
        Client::Raw => {
            let mut conn = clients.raw.clone();
            let holder = format!("{:032x}", fastrand::u128(..));
            let t0 = Instant::now();
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&holder)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await?;
            let t1 = Instant::now();
            check(set.is_some(), key, "a free key was not granted")?;
            let deleted: i64 = RAW_RELEASE
                .key(key)
                .arg(&holder)
                .invoke_async(&mut conn)
                .await?;
            let t2 = Instant::now();
            check(deleted == 1, key, "the release found the lease gone")?;
            Ok(Cycle {
                acquire: t1 - t0,
                release: t2 - t1,
                token: None,
            })
        }
    }
}

/// One acquire and release by hand with leasehold's scripts and its key
/// layout; `tracked`, on the tracking connection, the grant read back.
async fn raw_scripts_cycle(clients: &Clients, key: &str, tracked: bool) -> BenchResult<Cycle> {
    let mut conn = if tracked {
        clients.tracked.clone()
    } else {
        clients.raw.clone()
    };
    let holder = format!("{:032x}", fastrand::u128(..));
    let lease = raw_key(key, tracked);
    let fence = format!("{lease}:fence");
    let t0 = Instant::now();
    let acquired: redis::Value = LEASEHOLD_ACQUIRE
        .key(&lease)
        .key(&fence)
        .arg(&holder)
        .arg(30_000)
        .arg("")
        // The plain connection does not track: no read after the grant;
        // the tracking one reads it, as the backend's does.
        .arg(if tracked { "1" } else { "0" })
        // No minimum hold; the counter kept for the default retention (1 h).
        .arg("0")
        .arg(3_600_000)
        .invoke_async(&mut conn)
        .await?;
    let t1 = Instant::now();
    // A grant is the bare token; a refusal is {0, value, pttl}.
    let token = match acquired {
        token @ redis::Value::BulkString(_) => redis::from_redis_value::<u64>(token).ok(),
        _ => None,
    };
    check(token.is_some(), key, "a free key was not granted")?;
    let deleted: i64 = LEASEHOLD_RELEASE
        .key(&lease)
        .arg(&holder)
        .arg(format!("{lease}:released"))
        .invoke_async(&mut conn)
        .await?;
    let t2 = Instant::now();
    check(deleted == 1, key, "the release found the lease gone")?;
    Ok(Cycle {
        acquire: t1 - t0,
        release: t2 - t1,
        token,
    })
}

/// The lease key of the hand-written script clients (one per client, so
/// that the clients never meet).
fn raw_key(key: &str, tracked: bool) -> String {
    format!("{key}:{}", if tracked { "rawt" } else { "raw" })
}

/// A broken guarantee, as the error that ends the bench: the server is the
/// bench's own, so nothing else can explain it.
fn violation(key: &str, what: &str) -> Box<dyn std::error::Error> {
    format!("correctness violation on {key}: {what}").into()
}

fn check(ok: bool, key: &str, what: &str) -> BenchResult {
    if ok {
        Ok(())
    } else {
        Err(violation(key, what))
    }
}

/// The stored lease keys of `client`'s task keys, as the server names them.
fn stored_keys(client: Client, keys: &[String]) -> BenchResult<Vec<String>> {
    let layout = KeyLayout::default();
    keys.iter()
        .map(|key| {
            Ok(match client {
                Client::Manager | Client::Backend => layout.lease(&LeaseKey::new(key.as_str())?),
                Client::RawScripts => raw_key(key, false),
                Client::RawScriptsTracked => raw_key(key, true),
                Client::Raw => key.clone(),
            })
        })
        .collect()
}

struct Run {
    cycles_per_sec: f64,
    /// Client CPU (this process) per cycle, in microseconds.
    client_cpu_us: f64,
    /// Server CPU per cycle, in microseconds.
    server_cpu_us: f64,
    acquire: Vec<Duration>,
    release: Vec<Duration>,
}

/// `tasks` tasks, each cycling on its own key until `length` has passed
/// (or for `quick_cycles` cycles in quick mode).
async fn run(
    server: &RedisServer,
    clients: &Clients,
    client: Client,
    tasks: usize,
    length: Duration,
    quick_cycles: Option<usize>,
) -> BenchResult<Run> {
    let server_cpu = common::server_cpu_seconds(server);
    let client_cpu = common::process_cpu_seconds();
    let started = Instant::now();
    let end = started + length;
    let mut handles = Vec::with_capacity(tasks);
    let keys: Vec<String> = (0..tasks)
        .map(|task| format!("bench:{}:{task}", client.name()))
        .collect();
    for key in &keys {
        let (clients, key) = (clients.clone(), key.clone());
        handles.push(tokio::spawn(async move {
            let (mut acquire, mut release) = (Vec::new(), Vec::new());
            let mut last_token = None;
            let mut n = 0;
            loop {
                let done = match quick_cycles {
                    Some(max) => n >= max,
                    None => Instant::now() >= end,
                };
                if done {
                    break;
                }
                let done = cycle(&clients, client, &key)
                    .await
                    .map_err(|e| format!("{}: {e}", client.name()))?;
                // Each acquisition of a key must hand out a higher token.
                if let Some(token) = done.token {
                    if last_token.is_some_and(|last| token <= last) {
                        return Err(format!(
                            "{}: correctness violation on {key}: fencing token {token} after {last_token:?}",
                            client.name()
                        ));
                    }
                    last_token = Some(token);
                }
                acquire.push(done.acquire);
                release.push(done.release);
                n += 1;
            }
            Ok::<_, String>((acquire, release))
        }));
    }
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    for handle in handles {
        let (a, r) = handle.await??;
        acquire.extend(a);
        release.extend(r);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Every lease was released: the server holds none of them.
    let left: u64 = redis::cmd("EXISTS")
        .arg(stored_keys(client, &keys)?)
        .query_async(&mut clients.raw.clone())
        .await?;
    if left > 0 {
        return Err(format!(
            "{}: correctness violation: {left} released lease(s) still on the server",
            client.name()
        )
        .into());
    }
    let cycles = acquire.len().max(1) as f64;
    let per_cycle = |before: Option<f64>, after: Option<f64>| match (before, after) {
        (Some(b), Some(a)) => (a - b) * 1e6 / cycles,
        _ => f64::NAN,
    };
    let server_cpu_us = per_cycle(server_cpu, common::server_cpu_seconds(server));
    let client_cpu_us = per_cycle(client_cpu, common::process_cpu_seconds());
    acquire.sort_unstable();
    release.sort_unstable();
    Ok(Run {
        client_cpu_us,
        server_cpu_us,
        cycles_per_sec: acquire.len() as f64 / elapsed,
        acquire,
        release,
    })
}

fn main() -> BenchResult {
    let quick = quick();
    let length = Duration::from_secs(env_number("LEASEHOLD_BENCH_SECS", 3));
    let repeats = if quick {
        1
    } else {
        env_number("LEASEHOLD_BENCH_REPEATS", 5).max(1)
    };
    let quick_cycles = quick.then_some(20);
    let server = RedisServer::start()?;
    let version = common::server_version(&server);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let ttl = Ttl::parse("30s")?;
        let calls = env_number(
            "LEASEHOLD_BENCH_CALLS_IN_FLIGHT",
            leasehold::redis::RedisBackendBuilder::DEFAULT_CALLS_IN_FLIGHT as u64,
        );
        let backend = RedisBackend::builder(server.url())
            .calls_in_flight(usize::try_from(calls)?)
            .connect()
            .await?;
        let client = redis::Client::open(server.url())?;
        let mut tracked = ConnectionManager::new(redis::Client::open(format!(
            "{}?protocol=resp3",
            server.url()
        ))?)
        .await?;
        let () = redis::cmd("CLIENT")
            .arg("TRACKING")
            .arg("ON")
            .query_async(&mut tracked)
            .await?;
        let clients = Clients {
            manager: LeaseManager::new(backend.clone())?,
            backend,
            raw: ConnectionManager::new(client).await?,
            tracked,
            options: LeaseOptions::with_ttl(ttl),
            ttl,
        };
        let only = std::env::var("LEASEHOLD_BENCH_CLIENTS").unwrap_or_default();
        let all: Vec<Client> = [
            Client::Manager,
            Client::Backend,
            Client::RawScripts,
            Client::RawScriptsTracked,
            Client::Raw,
        ]
        .into_iter()
        .filter(|c| only.is_empty() || only.split(',').any(|o| o.trim() == c.name()))
        .collect();
        // Warm up: scripts loaded, connections established, allocator primed.
        for client in all.iter().copied() {
            run(
                &server,
                &clients,
                client,
                CONCURRENT_TASKS,
                Duration::ZERO,
                Some(5),
            )
            .await?;
        }
        for (mode, tasks) in [("sequential", 1), ("concurrent", CONCURRENT_TASKS)] {
            // Repeats interleave the clients, so that drift hits all alike.
            let mut runs: Vec<Vec<Run>> = all.iter().map(|_| Vec::new()).collect();
            for _ in 0..repeats {
                for (i, client) in all.iter().enumerate() {
                    runs[i]
                        .push(run(&server, &clients, *client, tasks, length, quick_cycles).await?);
                }
            }
            for (client, runs) in all.iter().zip(&runs) {
                let stat =
                    |f: &dyn Fn(&Run) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
                let line = Json::new()
                    .str("bench", "acquire_release")
                    .str("client", client.name())
                    .str("mode", mode)
                    .int("tasks", tasks as u64)
                    .int("repeats", repeats)
                    .num("run_secs", if quick { 0.0 } else { length.as_secs_f64() })
                    .int("cycles", runs.iter().map(|r| r.acquire.len() as u64).sum())
                    .num("cycles_per_sec", stat(&|r| r.cycles_per_sec))
                    .num("acquire_p50_us", stat(&|r| percentile_us(&r.acquire, 50.0)))
                    .num("acquire_p99_us", stat(&|r| percentile_us(&r.acquire, 99.0)))
                    .num("release_p50_us", stat(&|r| percentile_us(&r.release, 50.0)))
                    .num("release_p99_us", stat(&|r| percentile_us(&r.release, 99.0)))
                    .num("client_cpu_us_per_cycle", stat(&|r| r.client_cpu_us))
                    .num("server_cpu_us_per_cycle", stat(&|r| r.server_cpu_us))
                    .str("cpus", &common::cpus_allowed())
                    .str("redis", &version)
                    .str("quick", if quick { "yes" } else { "no" })
                    .line();
                println!("{line}");
            }
        }
        clients.manager.shutdown().await;
        Ok(())
    })
}
