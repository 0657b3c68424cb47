//! A fixed number of acquire + release cycles of one client, for profiles
//! whose figures do not depend on the machine's load: instruction counts
//! (callgrind) of the client or of the server, the server's commands per
//! cycle (`INFO commandstats`), one cycle as `MONITOR` shows it, and the
//! memory a lease held in its own task takes (future sizes; heap under
//! DHAT).
//!
//! The cycles are the same as `acquire_release`'s sequential ones. Not run
//! by `cargo test` or `cargo bench` (the tests are ignored); build with
//! `cargo bench --bench cycle_profile --no-run` and run the binary it names
//! with `--ignored --nocapture --exact cycles` (or `hold`), as
//! `scripts/profile_cycle.sh` does. Settings:
//!
//! - `LEASEHOLD_PROFILE_CLIENT`: `leasehold_manager`,
//!   `leasehold_manager_fair` (fair mode), `leasehold_backend`,
//!   `raw_redis` (default) or `raw_redis_leasehold_scripts`;
//! - `LEASEHOLD_PROFILE_CYCLES`: measured cycles (default 20000), after 100
//!   cycles of warm-up;
//! - `LEASEHOLD_PROFILE_URL`: the server to use (default: one of its own);
//! - `LEASEHOLD_PROFILE_SERVER_PID`: a redis-server run under callgrind,
//!   zeroed (`callgrind_control -z`) before the measured cycles and dumped
//!   (`-d`) after them;
//! - `LEASEHOLD_PROFILE_LEASES`: leases held at once by `hold` (default 1000);
//! - `LEASEHOLD_PROFILE_TASKS`: cycles run at once by `cycles`, each task on
//!   a key of its own (default 1: one cycle after the other), so that the
//!   cost per cycle of acquisitions and releases in flight together (which
//!   the backend sends as one call) is counted too;
//! - `LEASEHOLD_PROFILE_CALLS_IN_FLIGHT`: the backends' `calls_in_flight`
//!   (default: the library's); 1 sends everything that waits as one batch,
//!   for the cost per lease of large batches.
//!
//! The measured cycles run inside `measured_cycles`, so a client profile
//! counts them alone with `valgrind --tool=callgrind --collect-atstart=no
//! --toggle-collect='*measured_cycles*'`.

mod common;

use std::sync::Arc;
use std::sync::LazyLock;

use common::env_number;
use leasehold::backend::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend};
use leasehold::redis::RedisBackend;
use leasehold::{Fair, Lease, LeaseKey, LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;
use redis::aio::ConnectionManager;

type ProfileResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Compare-and-delete, as `acquire_release`'s hand-written client does it.
static RAW_RELEASE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
    )
});

/// Compare-and-pexpire, as `hold_many`'s hand-written holder renews.
static RAW_RENEW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end",
    )
});

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    Manager,
    /// The manager in fair mode (`LeaseOptionsBuilder::fair`): every
    /// acquisition takes its place in the key's queue (`fair.lua`) and
    /// every release may hand the lease to the queue's head
    /// (`release_fair.lua`), even when no one waits.
    ManagerFair,
    Backend,
    BackendUntracked,
    Raw,
    /// A fenced acquisition without Lua: `MULTI`, `SET NX PX`, `INCR` of
    /// the counter, `EXEC` (the token is the `INCR` reply, and is not in
    /// the lease's value), then the hand-written compare-and-delete.
    RawMulti,
    RawScripts,
}

impl Client {
    fn from_env() -> ProfileResult<Self> {
        let name = std::env::var("LEASEHOLD_PROFILE_CLIENT").unwrap_or_else(|_| "raw_redis".into());
        Ok(match name.as_str() {
            "leasehold_manager" => Self::Manager,
            "leasehold_manager_fair" => Self::ManagerFair,
            "leasehold_backend" => Self::Backend,
            "leasehold_backend_untracked" => Self::BackendUntracked,
            "raw_redis" => Self::Raw,
            "raw_redis_leasehold_scripts" => Self::RawScripts,
            "raw_redis_multi" => Self::RawMulti,
            other => return Err(format!("unknown client {other}").into()),
        })
    }
}

struct Clients {
    manager: LeaseManager<RedisBackend>,
    backend: RedisBackend,
    /// The backend with client tracking off.
    untracked: RedisBackend,
    /// The scripts `raw_redis_leasehold_scripts` runs: leasehold's, or
    /// the variants `LEASEHOLD_PROFILE_ACQUIRE_LUA` and
    /// `LEASEHOLD_PROFILE_RELEASE_LUA` name (files), to measure a change
    /// to a script before making it.
    acquire: redis::Script,
    release: redis::Script,
    raw: ConnectionManager,
    options: LeaseOptions,
    /// `options` in fair mode, for `leasehold_manager_fair`.
    fair_options: LeaseOptions,
    ttl: Ttl,
}

fn broken(what: &str) -> Box<dyn std::error::Error> {
    format!("broken cycle: {what}").into()
}

/// One acquire and release of `key`, checked as `acquire_release` checks it.
async fn cycle(clients: &Clients, client: Client, key: &str) -> ProfileResult {
    match client {
        Client::Manager | Client::ManagerFair => {
            let options = if client == Client::Manager {
                &clients.options
            } else {
                &clients.fair_options
            };
            let lease = clients.manager.acquire(key, options).await?;
            if lease.release().await? != ReleaseOutcome::Released {
                return Err(broken("the release found the lease gone"));
            }
        }
        Client::Backend | Client::BackendUntracked => {
            let backend = if client == Client::Backend {
                &clients.backend
            } else {
                &clients.untracked
            };
            let request =
                AcquireRequest::new(LeaseKey::new(key)?, HolderId::generate()?, clients.ttl);
            let AcquireOutcome::Acquired(_) = backend.try_acquire(&request).await? else {
                return Err(broken("a free key was not granted"));
            };
            let released = backend.release(&request.key, &request.holder).await?;
            if released.outcome() != ReleaseOutcome::Released {
                return Err(broken("the release found the lease gone"));
            }
        }
        Client::Raw => {
            let mut conn = clients.raw.clone();
            let holder = format!("{:032x}", fastrand::u128(..));
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(&holder)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await?;
            if set.is_none() {
                return Err(broken("a free key was not granted"));
            }
            let deleted: i64 = RAW_RELEASE
                .key(key)
                .arg(&holder)
                .invoke_async(&mut conn)
                .await?;
            if deleted != 1 {
                return Err(broken("the release found the lease gone"));
            }
        }
        Client::RawMulti => {
            let mut conn = clients.raw.clone();
            let holder = format!("{:032x}", fastrand::u128(..));
            let (set, _token): (Option<String>, u64) = redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(key)
                .arg(&holder)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .cmd("INCR")
                .arg(format!("{key}:fence"))
                .query_async(&mut conn)
                .await?;
            if set.is_none() {
                return Err(broken("a free key was not granted"));
            }
            let deleted: i64 = RAW_RELEASE
                .key(key)
                .arg(&holder)
                .invoke_async(&mut conn)
                .await?;
            if deleted != 1 {
                return Err(broken("the release found the lease gone"));
            }
        }
        Client::RawScripts => {
            let mut conn = clients.raw.clone();
            let holder = format!("{:032x}", fastrand::u128(..));
            let lease = format!("{key}:raw");
            let acquired: redis::Value = clients
                .acquire
                .key(&lease)
                .key(format!("{lease}:fence"))
                .arg(&holder)
                .arg(30_000)
                .arg("")
                // The raw connection does not track; no minimum hold; the
                // counter kept for the default retention (ignored by
                // scripts that take no such arguments).
                .arg("0")
                .arg("0")
                .arg(3_600_000)
                .invoke_async(&mut conn)
                .await?;
            // The token alone, or {1, token} from an older acquire.lua.
            let granted = match &acquired {
                redis::Value::BulkString(_) => true,
                redis::Value::Array(items) => matches!(items.first(), Some(redis::Value::Int(1))),
                _ => false,
            };
            if !granted {
                return Err(broken("a free key was not granted"));
            }
            let deleted: i64 = clients
                .release
                .key(&lease)
                .arg(&holder)
                .arg(format!("{lease}:released"))
                .invoke_async(&mut conn)
                .await?;
            if deleted != 1 {
                return Err(broken("the release found the lease gone"));
            }
        }
    }
    Ok(())
}

/// The measured cycles: the only frame a client profile collects in.
#[inline(never)]
fn measured_cycles(
    runtime: &tokio::runtime::Runtime,
    clients: &Clients,
    client: Client,
    cycles: u64,
) -> ProfileResult {
    let tasks = env_number("LEASEHOLD_PROFILE_TASKS", 1).max(1);
    runtime.block_on(async {
        if tasks == 1 {
            for _ in 0..cycles {
                cycle(clients, client, "profile").await?;
            }
            return Ok(());
        }
        // `tasks` loops on one thread, `cycles` in all.
        let keys: Vec<String> = (0..tasks).map(|i| format!("profile:{i}")).collect();
        let loops = keys.iter().enumerate().map(|(i, key)| async move {
            let share = cycles / tasks + u64::from((i as u64) < cycles % tasks);
            for _ in 0..share {
                cycle(clients, client, key).await?;
            }
            Ok::<_, Box<dyn std::error::Error>>(())
        });
        for result in futures_util::future::join_all(loops).await {
            result?;
        }
        Ok(())
    })
}

/// `callgrind_control` on the server's valgrind, if one was named.
fn callgrind_control(flag: &str) -> ProfileResult {
    if let Ok(pid) = std::env::var("LEASEHOLD_PROFILE_SERVER_PID") {
        let status = std::process::Command::new("callgrind_control")
            .arg(flag)
            .arg(pid.trim())
            .stdout(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            return Err(format!("callgrind_control {flag} failed").into());
        }
    }
    Ok(())
}

async fn connect(url: &str) -> ProfileResult<Clients> {
    let ttl = Ttl::parse("30s")?;
    let calls = usize::try_from(env_number(
        "LEASEHOLD_PROFILE_CALLS_IN_FLIGHT",
        leasehold::redis::RedisBackendBuilder::DEFAULT_CALLS_IN_FLIGHT as u64,
    ))?;
    let backend = RedisBackend::builder(url)
        .calls_in_flight(calls)
        .connect()
        .await?;
    let script = |var: &str, default: &redis::Script| -> ProfileResult<redis::Script> {
        Ok(match std::env::var(var) {
            Ok(path) => redis::Script::new(&std::fs::read_to_string(path)?),
            Err(_) => default.clone(),
        })
    };
    Ok(Clients {
        manager: LeaseManager::new(backend.clone())?,
        backend,
        untracked: RedisBackend::builder(url)
            .calls_in_flight(calls)
            .track_lease_changes(false)
            .connect()
            .await?,
        acquire: script("LEASEHOLD_PROFILE_ACQUIRE_LUA", &LEASEHOLD_ACQUIRE)?,
        release: script("LEASEHOLD_PROFILE_RELEASE_LUA", &LEASEHOLD_RELEASE)?,
        raw: ConnectionManager::new(redis::Client::open(url)?).await?,
        options: LeaseOptions::with_ttl(ttl),
        fair_options: LeaseOptions::builder()
            .ttl(ttl)
            .fair(Fair::default())
            .build()?,
        ttl,
    })
}

/// The server's own server, or the one `LEASEHOLD_PROFILE_URL` names.
fn server() -> ProfileResult<(Option<RedisServer>, String)> {
    Ok(match std::env::var("LEASEHOLD_PROFILE_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let server = RedisServer::start()?;
            let url = server.url();
            (Some(server), url)
        }
    })
}

#[test]
#[ignore = "a profiling run: see the module documentation"]
fn cycles() -> ProfileResult {
    let client = Client::from_env()?;
    let cycles = env_number("LEASEHOLD_PROFILE_CYCLES", 20_000);
    let (_server, url) = server()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let clients = runtime.block_on(connect(&url))?;
    let mut side = runtime.block_on(ConnectionManager::new(redis::Client::open(url.as_str())?))?;
    // Warm-up: scripts loaded, connections established, allocator primed.
    measured_cycles(&runtime, &clients, client, 100)?;
    let stats = runtime.block_on(async {
        let mut marker = clients.raw.clone();
        redis::cmd("ECHO")
            .arg(format!("begin {client:?}"))
            .query_async::<()>(&mut marker)
            .await?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut side)
            .await?;
        Ok::<_, redis::RedisError>(())
    });
    stats?;
    callgrind_control("-z")?;
    measured_cycles(&runtime, &clients, client, cycles)?;
    callgrind_control("-d")?;
    let info: String = runtime.block_on(async {
        let info = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut side)
            .await?;
        redis::cmd("ECHO")
            .arg(format!("end {client:?}"))
            .query_async::<()>(&mut clients.raw.clone())
            .await?;
        Ok::<_, redis::RedisError>(info)
    })?;
    println!("client {client:?}, {cycles} cycles; server commands per cycle:");
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name == "info" || name == "config|resetstat" {
            continue;
        }
        let calls: f64 = rest
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
            .unwrap_or(f64::NAN);
        println!("  {name:<20} {:.3}", calls / cycles as f64);
    }
    runtime.block_on(clients.manager.shutdown());
    Ok(())
}

/// Holds `LEASEHOLD_PROFILE_LEASES` leases, each in a task of its own,
/// until told to release them; prints the sizes of what such a task keeps.
/// Run under `valgrind --tool=dhat` twice with different counts: the
/// difference of the peak heaps over the difference of the counts is the
/// heap per lease. The leases are acquired one after another, so that no
/// flood of requests in flight makes the peak.
#[test]
#[ignore = "a profiling run: see the module documentation"]
fn hold() -> ProfileResult {
    let client = Client::from_env()?;
    let leases = env_number("LEASEHOLD_PROFILE_LEASES", 1000);
    let (_server, url) = server()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let clients = Arc::new(runtime.block_on(connect(&url))?);
    // No permits: each holder waits for one, given one at a time.
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let (held_tx, mut held_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    {
        let c = &clients;
        let acquire = c.manager.acquire("size", &c.options);
        println!(
            "size_of_val: LeaseManager::acquire future {} B, Lease {} B",
            std::mem::size_of_val(&acquire),
            std::mem::size_of::<Lease>()
        );
        drop(acquire);
        let request = AcquireRequest::new(LeaseKey::new("size")?, HolderId::generate()?, c.ttl);
        println!(
            "size_of_val: RedisBackend::try_acquire future {} B, release future {} B",
            std::mem::size_of_val(&c.backend.try_acquire(&request)),
            std::mem::size_of_val(&c.backend.release(&request.key, &request.holder)),
        );
        let task = manager_task(
            Arc::clone(c),
            "size".into(),
            false,
            Arc::clone(&release),
            held_tx.clone(),
        );
        let raw = raw_task(
            Arc::clone(c),
            "size".into(),
            Arc::clone(&release),
            held_tx.clone(),
        );
        println!(
            "size_of_val: task future, manager {} B, raw_redis {} B",
            std::mem::size_of_val(&task),
            std::mem::size_of_val(&raw)
        );
    }
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..leases {
            let key = format!("hold:{i}");
            let (c, r, h) = (Arc::clone(&clients), Arc::clone(&release), held_tx.clone());
            tasks.push(match client {
                Client::Manager => tokio::spawn(manager_task(c, key, false, r, h)),
                Client::ManagerFair => tokio::spawn(manager_task(c, key, true, r, h)),
                _ => tokio::spawn(raw_task(c, key, r, h)),
            });
            // One acquisition at a time: the peak heap is then that of the
            // leases held, not of a flood of requests in flight.
            held_rx.recv().await.ok_or("a holder ended early")?;
        }
        // Every lease is held: the heap peaks about here.
        println!("{leases} leases held ({client:?})");
        // One release at a time too: the peak stays that of the leases held.
        for task in tasks {
            release.add_permits(1);
            task.await??;
        }
        clients.manager.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

type TaskResult = Result<(), String>;

/// A lease held with leasehold: acquire, hold until told, release.
async fn manager_task(
    clients: Arc<Clients>,
    key: String,
    fair: bool,
    release: Arc<tokio::sync::Semaphore>,
    held: tokio::sync::mpsc::UnboundedSender<()>,
) -> TaskResult {
    let options = if fair {
        &clients.fair_options
    } else {
        &clients.options
    };
    let lease = clients
        .manager
        .acquire(&key, options)
        .await
        .map_err(|e| e.to_string())?;
    let _ = held.send(());
    release.acquire().await.map_err(|e| e.to_string())?.forget();
    lease.release().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// The same written by hand: `SET NX PX`, a compare-and-pexpire every
/// ttl/3 while held, compare-and-delete.
async fn raw_task(
    clients: Arc<Clients>,
    key: String,
    release: Arc<tokio::sync::Semaphore>,
    held: tokio::sync::mpsc::UnboundedSender<()>,
) -> TaskResult {
    let mut conn = clients.raw.clone();
    let notified = release.acquire();
    tokio::pin!(notified);
    let holder = format!("{:032x}", fastrand::u128(..));
    let set: Option<String> = redis::cmd("SET")
        .arg(&key)
        .arg(&holder)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    if set.is_none() {
        return Err(format!("{key} was not granted"));
    }
    let _ = held.send(());
    loop {
        tokio::select! {
            permit = &mut notified => {
                permit.map_err(|e| e.to_string())?.forget();
                break;
            }
            () = tokio::time::sleep(std::time::Duration::from_secs(10)) => {
                let renewed: i64 = RAW_RENEW
                    .key(&key)
                    .arg(&holder)
                    .arg(30_000)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if renewed != 1 {
                    return Err(format!("{key} was lost"));
                }
            }
        }
    }
    let deleted: i64 = RAW_RELEASE
        .key(&key)
        .arg(&holder)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    if deleted != 1 {
        return Err(format!("{key} was gone at its release"));
    }
    Ok(())
}
