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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use common::counting::Counting;
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
const RAW_RENEW_SOURCE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end";
static RAW_RENEW: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RAW_RENEW_SOURCE));

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
fn callgrind_control(flag: &[&str]) -> ProfileResult {
    if let Ok(pid) = std::env::var("LEASEHOLD_PROFILE_SERVER_PID") {
        let status = std::process::Command::new("callgrind_control")
            .args(flag)
            .arg(pid.trim())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?;
        if !status.success() {
            return Err(format!("callgrind_control {flag:?} failed").into());
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
    callgrind_control(&["-z"])?;
    measured_cycles(&runtime, &clients, client, cycles)?;
    callgrind_control(&["-d"])?;
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

/// Leases acquired at once by `renewals` and `held` (as `hold_many`).
const HOLD_IN_FLIGHT: usize = 256;
/// Renewals per pipeline of the hand-written holder (as `hold_many`).
const RAW_PIPELINE: usize = 1000;

/// Who holds the leases of `renewals` and `held`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    /// `LeaseManager`, client tracking on (the default) or off.
    Manager { tracked: bool },
    /// By hand, as `hold_many`'s `raw_*_fenced`: leasehold's keys, values and
    /// fencing counters, renewed by a pipelined compare-and-pexpire
    /// `EVALSHA` per lease every ttl/3.
    RawRenew,
    /// The same data renewed by a pipelined plain `PEXPIRE` per lease, with
    /// no owner check: what the renewal's write alone costs the server.
    RawPexpire,
}

impl Holder {
    fn from_env() -> ProfileResult<Self> {
        let name = std::env::var("LEASEHOLD_PROFILE_CLIENT")
            .unwrap_or_else(|_| "leasehold_manager".into());
        Ok(match name.as_str() {
            "leasehold_manager" => Self::Manager { tracked: true },
            "leasehold_manager_untracked" => Self::Manager { tracked: false },
            "raw_renew" => Self::RawRenew,
            "raw_pexpire" => Self::RawPexpire,
            other => return Err(format!("unknown holder {other}").into()),
        })
    }
}

/// Leases held by a manager, and the counts of its renewals.
struct ManagerHold {
    manager: LeaseManager<Counting>,
    backend: Counting,
    leases: Vec<Lease>,
}

/// Acquires `count` leases `hold:<i>` with a manager, `HOLD_IN_FLIGHT` at
/// once.
async fn hold_with_manager(
    url: &str,
    tracked: bool,
    count: usize,
    ttl: Ttl,
) -> ProfileResult<ManagerHold> {
    let backend = Counting::new(
        RedisBackend::builder(url)
            .track_lease_changes(tracked)
            .connect()
            .await?,
    );
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::builder()
        .ttl(ttl)
        .wait(std::time::Duration::from_secs(60))
        .build()?;
    let next = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..HOLD_IN_FLIGHT)
        .map(|_| {
            let (manager, options, next) = (manager.clone(), options.clone(), Arc::clone(&next));
            tokio::spawn(async move {
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
            })
        })
        .collect();
    let mut leases = Vec::with_capacity(count);
    for worker in workers {
        leases.extend(worker.await??);
    }
    Ok(ManagerHold {
        manager,
        backend,
        leases,
    })
}

impl ManagerHold {
    /// Waits until `renewals` renewals have come back and no call is out:
    /// the server is idle until the next round.
    async fn quiet_after(&self, renewals: u64) -> ProfileResult {
        loop {
            if self.backend.renewals.load(Ordering::SeqCst) >= renewals
                && self.backend.in_flight.load(Ordering::SeqCst) == 0
            {
                return Ok(());
            }
            if let Some(lost) = self.leases.iter().find_map(Lease::loss_reason) {
                return Err(format!("a lease was lost: {lost}").into());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// Leases held by hand, over leasehold's data: `(key, value)` each.
struct RawHold {
    conn: ConnectionManager,
    leases: Vec<(String, String)>,
    ttl_ms: u64,
    plain: bool,
}

/// Writes `count` leases as `hold_many`'s `raw_*_fenced` does: a fencing
/// counter, then `SET NX PX` of the lease with leasehold's value (holder,
/// token, no label), in pipelines.
async fn hold_by_hand(url: &str, count: usize, ttl: Ttl, plain: bool) -> ProfileResult<RawHold> {
    let client = redis::Client::open(url)?;
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut conn = ConnectionManager::new_with_config(client, config).await?;
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(RAW_RENEW_SOURCE)
        .query_async::<String>(&mut conn)
        .await?;
    let ttl_ms = u64::try_from(ttl.get().as_millis())?;
    let token = 1_700_000_000_000_000u64;
    let leases: Vec<(String, String)> = (0..count)
        .map(|i| {
            let holder = format!("{:032x}", fastrand::u128(..));
            (
                format!("leasehold:{{hold:{i}}}"),
                format!("{holder}:{token}:"),
            )
        })
        .collect();
    for chunk in leases.chunks(RAW_PIPELINE) {
        let mut pipe = redis::pipe();
        for (key, value) in chunk {
            pipe.cmd("SET")
                .arg(format!("{key}:fence"))
                .arg(token)
                .ignore();
            pipe.cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .ignore();
        }
        pipe.query_async::<()>(&mut conn).await?;
    }
    Ok(RawHold {
        conn,
        leases,
        ttl_ms,
        plain,
    })
}

impl RawHold {
    /// One round: every lease renewed once, in pipelines of `RAW_PIPELINE`,
    /// 16 at once (as `hold_many`). The compare-and-pexpire compares the
    /// whole value, as `hold_many`'s does.
    async fn round(&self) -> ProfileResult {
        let sha = RAW_RENEW.get_hash();
        for group in self.leases.chunks(RAW_PIPELINE * 16) {
            let sends = group.chunks(RAW_PIPELINE).map(|chunk| {
                let mut pipe = redis::pipe();
                for (key, value) in chunk {
                    if self.plain {
                        pipe.cmd("PEXPIRE").arg(key).arg(self.ttl_ms);
                    } else {
                        pipe.cmd("EVALSHA")
                            .arg(sha)
                            .arg(1)
                            .arg(key)
                            .arg(value)
                            .arg(self.ttl_ms);
                    }
                }
                let mut conn = self.conn.clone();
                async move { pipe.query_async::<Vec<i64>>(&mut conn).await }
            });
            for renewed in futures_util::future::join_all(sends).await {
                if renewed?.iter().any(|&r| r != 1) {
                    return Err(broken("a lease held by hand was lost"));
                }
            }
        }
        Ok(())
    }
}

/// A profile setting's ttl (default 30 s: under callgrind the server takes
/// seconds per round of 10,000 renewals, well within a 10 s interval).
fn profile_ttl() -> ProfileResult<Ttl> {
    let ttl = std::env::var("LEASEHOLD_PROFILE_TTL").unwrap_or_else(|_| "30s".into());
    Ok(Ttl::parse(&ttl)?)
}

/// The server's commands since `CONFIG RESETSTAT`: name and calls.
async fn commands(side: &mut ConnectionManager) -> ProfileResult<Vec<(String, u64)>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(side)
        .await?;
    let mut out = Vec::new();
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
        let calls = rest
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        out.push((name.to_owned(), calls));
    }
    Ok(out)
}

/// Server instructions per renewal: `LEASEHOLD_PROFILE_LEASES` leases
/// (default 10,000) held by `LEASEHOLD_PROFILE_CLIENT` (`leasehold_manager`,
/// `leasehold_manager_untracked`, `raw_renew`, `raw_pexpire`), ttl
/// `LEASEHOLD_PROFILE_TTL` (default 30 s). After the first round of
/// renewals, while the server is idle, the server's callgrind (started
/// with `--instr-atstart=no`, so that the acquisitions run at valgrind's
/// uninstrumented speed) is switched on and zeroed; it is dumped once
/// `LEASEHOLD_PROFILE_ROUNDS` more rounds (default 3) have come back. The
/// hand-written holder renews every ttl/3 as the watchdog does, so that
/// both windows span as much of the server's idle time.
#[test]
#[ignore = "a profiling run: see the module documentation"]
fn renewals() -> ProfileResult {
    let holder = Holder::from_env()?;
    let count = usize::try_from(env_number("LEASEHOLD_PROFILE_LEASES", 10_000))?;
    let rounds = env_number("LEASEHOLD_PROFILE_ROUNDS", 3);
    let ttl = profile_ttl()?;
    let (_server, url) = server()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut side = ConnectionManager::new(redis::Client::open(url.as_str())?).await?;
        let begin = async |side: &mut ConnectionManager| -> ProfileResult {
            redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async::<()>(side)
                .await?;
            callgrind_control(&["-i", "on"])?;
            callgrind_control(&["-z"])
        };
        let n = count as u64;
        let (renewals, calls, commands) = match holder {
            Holder::Manager { tracked } => {
                let hold = hold_with_manager(&url, tracked, count, ttl).await?;
                hold.quiet_after(n).await?;
                begin(&mut side).await?;
                let renewed = hold.backend.renewals.load(Ordering::SeqCst);
                let calls = hold.backend.calls.load(Ordering::SeqCst);
                hold.quiet_after(renewed + rounds * n).await?;
                callgrind_control(&["-d"])?;
                let renewals = hold.backend.renewals.load(Ordering::SeqCst) - renewed;
                let calls = hold.backend.calls.load(Ordering::SeqCst) - calls;
                let commands = commands(&mut side).await?;
                hold.manager.shutdown().await;
                (renewals, calls, commands)
            }
            Holder::RawRenew | Holder::RawPexpire => {
                let hold = hold_by_hand(&url, count, ttl, holder == Holder::RawPexpire).await?;
                let interval = ttl.get() / 3;
                let mut tick = tokio::time::Instant::now() + interval;
                tokio::time::sleep_until(tick).await;
                hold.round().await?;
                begin(&mut side).await?;
                for _ in 0..rounds {
                    tick += interval;
                    tokio::time::sleep_until(tick).await;
                    hold.round().await?;
                }
                callgrind_control(&["-d"])?;
                let commands = commands(&mut side).await?;
                (
                    rounds * n,
                    rounds * n.div_ceil(RAW_PIPELINE as u64),
                    commands,
                )
            }
        };
        // The renewals the server made (its PEXPIREATs, or PEXPIREs): a
        // call the client gave up on (its op timeout, on a server slowed
        // down by its profiler) may still have run there, or not yet.
        let made: u64 = commands
            .iter()
            .filter(|(name, _)| name == "pexpire" || name == "pexpireat")
            .map(|(_, calls)| calls)
            .sum();
        println!(
            "holder {holder:?}, {count} leases, ttl {ttl}: renewals {made}, on the server; \
             {renewals} sent by the client in {calls} calls ({:.1} renewals per call); \
             server commands per renewal:",
            renewals as f64 / calls.max(1) as f64
        );
        for (name, calls) in &commands {
            println!("  {name:<20} {:.4}", *calls as f64 / made.max(1) as f64);
        }
        if made != renewals {
            return Err(format!(
                "the server made {made} renewals, the client counted {renewals}: calls failed"
            )
            .into());
        }
        Ok(())
    })
}

/// Heap per held lease: `LEASEHOLD_PROFILE_LEASES` leases (default 10,000)
/// held by `LEASEHOLD_PROFILE_CLIENT` (as for `renewals`) through
/// `LEASEHOLD_PROFILE_ROUNDS` rounds of renewals (default 2), after which
/// the process ends at once, every lease still held. Run under `valgrind
/// --tool=dhat` twice with different counts: the difference of the heaps
/// at the end (or at the peak, the acquisitions in flight included) over
/// the difference of the counts is the heap per lease, by allocation site.
#[test]
#[ignore = "a profiling run: see the module documentation"]
fn held() -> ProfileResult {
    let holder = Holder::from_env()?;
    let count = usize::try_from(env_number("LEASEHOLD_PROFILE_LEASES", 10_000))?;
    let rounds = env_number("LEASEHOLD_PROFILE_ROUNDS", 2);
    let ttl = profile_ttl()?;
    let (_server, url) = server()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let n = count as u64;
    let kept = runtime.block_on(async {
        match holder {
            Holder::Manager { tracked } => {
                let hold = hold_with_manager(&url, tracked, count, ttl).await?;
                hold.quiet_after(rounds * n).await?;
                Ok::<_, Box<dyn std::error::Error>>((Some(hold), None))
            }
            Holder::RawRenew | Holder::RawPexpire => {
                let hold = hold_by_hand(&url, count, ttl, holder == Holder::RawPexpire).await?;
                for _ in 0..rounds {
                    tokio::time::sleep(ttl.get() / 3).await;
                    hold.round().await?;
                }
                Ok((None, Some(hold)))
            }
        }
    })?;
    println!("{count} leases held through {rounds} rounds ({holder:?})");
    // Ended here, every lease still held and nothing dropped: DHAT's heap
    // at the end is the hold's, and a release of every lease cannot make
    // the peak.
    std::mem::forget(kept);
    std::process::exit(0)
}
