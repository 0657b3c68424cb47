//! What a million distinct leases leave in Redis: the server's used memory
//! before the run, right after every lease was granted and released, and
//! once the fencing counters' retention has passed, for leasehold and for
//! the same work written by hand with the `redis` crate (`SET NX PX` for
//! the lease, `INCR` of a counter beside it for the fencing token, and a
//! compare-and-delete release: the counter a hand-written client keeps has
//! no expiry).
//!
//! Run with `cargo bench --bench footprint`. Prints one JSON line per
//! client. Settings: `LEASEHOLD_BENCH_KEYS` (distinct keys, default
//! 1,000,000), `LEASEHOLD_BENCH_RETENTION_SECS` (the counters' retention
//! for this run, default 10: the rule is the same at the default of an
//! hour, only the wait is shorter), `LEASEHOLD_BENCH_QUICK=1` (2,000 keys
//! and a 1 s retention, to check it runs).
//!
//! A broken run — a free key not granted, a release that finds its lease
//! gone, a key of leasehold's namespace left after the retention — fails
//! (non-zero exit), in the quick configuration too; the figures never do.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Json, env_number, quick, server_version};
use futures_util::future::try_join_all;
use leasehold::backend::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend};
use leasehold::redis::RedisBackend;
use leasehold::{LeaseKey, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;

type BenchResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

/// Tasks granting and releasing at once.
const TASKS: u64 = 64;

/// Compare-and-delete, as a hand-written client would do it.
const RAW_RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// `INFO memory`'s `used_memory`, in bytes.
fn used_memory(server: &RedisServer) -> BenchResult<u64> {
    let info = server.cli(&["INFO", "memory"])?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no used_memory in INFO memory".into())
}

fn dbsize(server: &RedisServer) -> BenchResult<u64> {
    Ok(server.cli(&["DBSIZE"])?.trim().parse()?)
}

/// Grants and releases `keys` distinct leases through leasehold's backend.
async fn leasehold(server: &RedisServer, keys: u64, retention: Duration) -> BenchResult {
    let backend = RedisBackend::builder(server.url())
        .namespace("fp")
        .fence_retention(retention)
        .connect()
        .await?;
    let ttl = Ttl::parse("30s")?;
    let next = Arc::new(AtomicU64::new(0));
    try_join_all((0..TASKS).map(|_| {
        let (backend, next) = (backend.clone(), Arc::clone(&next));
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return Ok::<_, Box<dyn std::error::Error>>(());
                }
                let key = LeaseKey::new(format!("order:{i}"))?;
                let holder = HolderId::generate()?;
                let request = AcquireRequest::new(key.clone(), holder, ttl);
                if !matches!(
                    backend.try_acquire(&request).await?,
                    AcquireOutcome::Acquired(_)
                ) {
                    return Err(format!("the free key {key} was not granted").into());
                }
                if backend.release(&key, &holder).await?.outcome() != ReleaseOutcome::Released {
                    return Err(format!("the release of {key} found it gone").into());
                }
            }
        }
    }))
    .await?;
    Ok(())
}

/// The same work by hand: `SET NX PX`, `INCR` of the counter, release.
async fn by_hand(server: &RedisServer, keys: u64) -> BenchResult {
    let client = redis::Client::open(server.url())?;
    let conn = client.get_multiplexed_async_connection().await?;
    let release = redis::Script::new(RAW_RELEASE);
    let next = Arc::new(AtomicU64::new(0));
    try_join_all((0..TASKS).map(|_| {
        let (mut conn, next, release) = (conn.clone(), Arc::clone(&next), release.clone());
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return Ok::<_, Box<dyn std::error::Error>>(());
                }
                let key = format!("hand:{{order:{i}}}");
                let holder = HolderId::generate()?.to_hex();
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&holder)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await?;
                if set.is_none() {
                    return Err(format!("the free key {key} was not granted").into());
                }
                let _token: u64 = redis::cmd("INCR")
                    .arg(format!("{key}:fence"))
                    .query_async(&mut conn)
                    .await?;
                let deleted: u64 = release
                    .key(&key)
                    .arg(&holder)
                    .invoke_async(&mut conn)
                    .await?;
                if deleted != 1 {
                    return Err(format!("the release of {key} found it gone").into());
                }
            }
        }
    }))
    .await?;
    Ok(())
}

fn main() -> BenchResult {
    let (keys, retention) = if quick() {
        (2_000, Duration::from_secs(1))
    } else {
        (
            env_number("LEASEHOLD_BENCH_KEYS", 1_000_000),
            Duration::from_secs(env_number("LEASEHOLD_BENCH_RETENTION_SECS", 10)),
        )
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for client in ["leasehold", "by_hand"] {
        // A server of its own per client, so that one's leftovers do not
        // count against the other.
        let server = RedisServer::start()?;
        let before = used_memory(&server)?;
        let started = Instant::now();
        runtime.block_on(async {
            match client {
                "leasehold" => leasehold(&server, keys, retention).await,
                _ => by_hand(&server, keys).await,
            }
        })?;
        let elapsed = started.elapsed();
        let after_run = used_memory(&server)?;
        let keys_after_run = dbsize(&server)?;
        // Wait out the retention, counted from the end of the run (every
        // counter was written before it), then let the server's active
        // expiry reclaim what is due (it samples keys 10 times a second).
        std::thread::sleep(retention + Duration::from_millis(100));
        let deadline = Instant::now() + Duration::from_secs(60);
        while dbsize(&server)? > 0 && client == "leasehold" && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let after_retention = used_memory(&server)?;
        let keys_left = dbsize(&server)?;
        if client == "leasehold" && keys_left > 0 {
            return Err(format!("{keys_left} keys of leasehold's left after the retention").into());
        }
        println!(
            "{}",
            Json::new()
                .str("bench", "footprint")
                .str("client", client)
                .str("server", &server_version(&server))
                .int("keys", keys)
                .num("retention_s", retention.as_secs_f64())
                .num("run_s", elapsed.as_secs_f64())
                .int("used_memory_before", before)
                .int("used_memory_after_run", after_run)
                .int("keys_after_run", keys_after_run)
                .int("used_memory_after_retention", after_retention)
                .int("keys_after_retention", keys_left)
                .line()
        );
    }
    Ok(())
}
