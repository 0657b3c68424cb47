//! What leases leave behind on a real `redis-server`, judged by the server's
//! own keyspace (SCAN and PTTL on a side connection): every key a lease of
//! any kind writes has an expiry, and once the fencing counters' retention
//! has passed after the last grant, nothing of the namespace is left.
//!
//! The retention is shortened to one second here (the rule is the same at
//! its default of an hour).

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold::redis::RedisBackend;
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::{Fair, Lease, LeaseManager, LeaseOptions, PermitLimit, Ttl};
use leasehold_testkit::RedisServer;

use holders::{Error, side, within};

type TestResult = Result<(), Error>;

const NAMESPACE: &str = "fp";
const RETENTION: Duration = Duration::from_secs(1);

async fn manager_at(url: String) -> Result<LeaseManager<RedisBackend>, Error> {
    let backend = RedisBackend::builder(url)
        .namespace(NAMESPACE)
        .fence_retention(RETENTION)
        .connect()
        .await?;
    Ok(LeaseManager::new(backend)?)
}

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .build()
        .expect("valid options")
}

fn fair(ttl: &str, wait: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .fair(Fair::default().with_place_ttl(Duration::from_millis(500)))
        .wait(wait)
        .build()
        .expect("valid options")
}

/// The server's clock, in milliseconds.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, Error> {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// Every key of the namespace with its PTTL, from a full SCAN.
async fn namespace_keys(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<Vec<(String, i64)>, Error> {
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{NAMESPACE}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        for key in batch {
            let pttl: i64 = conn.pttl(&key).await?;
            // -2: the key expired between the SCAN and its PTTL (a crashed
            // holder's lease of a short ttl): it is gone, as it should be.
            if pttl != -2 {
                keys.push((key, pttl));
            }
        }
        if next == 0 {
            return Ok(keys);
        }
        cursor = next;
    }
}

/// Leases of every kind whose keys the retention bounds, ended each way a
/// lease ends: exclusive leases released one at a time and in batches
/// (acquired together), left to expire by a holder that crashed, permits
/// released and crashed, fair leases released and a fair waiter that died
/// in its place, writers released, readers released and crashed. Right after, every key left has an
/// expiry no later than the retention; after the retention, a SCAN of the
/// namespace finds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_is_gone_once_the_retention_passed() -> TestResult {
    const KEYS: usize = 20;
    let server = RedisServer::start()?;
    let mut conn = side(&server).await?;
    let manager = manager_at(server.url()).await?;

    // Released one at a time, and acquired together (one batch per slot
    // group) then released together.
    for i in 0..KEYS {
        manager
            .acquire(format!("one:{i}"), &options("5s"))
            .await?
            .release()
            .await?;
    }
    let default = LeaseOptions::default();
    let together =
        try_join_all((0..64).map(|i| manager.acquire(format!("batch:{i}"), &default))).await?;
    try_join_all(together.into_iter().map(Lease::release)).await?;
    // Permits, fair leases and writers, released.
    let limit = PermitLimit::new(3)?;
    for i in 0..KEYS {
        manager
            .acquire_permit(format!("sem:{i}"), limit, &options("5s"))
            .await?
            .release()
            .await?;
        manager
            .acquire(format!("fair:{i}"), &fair("5s", Duration::ZERO))
            .await?
            .release()
            .await?;
        manager
            .acquire_write(format!("doc:{i}"), &options("5s"))
            .await?
            .release()
            .await?;
        manager
            .acquire_read(format!("doc:{i}"), &options("5s"))
            .await?
            .release()
            .await?;
    }

    // A process that crashes holding leases of each kind, and with a fair
    // waiter in its place behind one of them.
    let url = server.url();
    let crashed = std::thread::spawn(move || -> Result<(), Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let manager = manager_at(url.clone()).await?;
            let mut held = Vec::new();
            for i in 0..KEYS {
                held.push(
                    manager
                        .acquire(format!("crash:{i}"), &options("300ms"))
                        .await?,
                );
                held.push(
                    manager
                        .acquire_permit(
                            format!("crashsem:{i}"),
                            PermitLimit::new(2)?,
                            &options("300ms"),
                        )
                        .await?,
                );
                held.push(
                    manager
                        .acquire_read(format!("crashdoc:{i}"), &options("300ms"))
                        .await?,
                );
            }
            held.push(
                manager
                    .acquire("crashfair", &fair("300ms", Duration::ZERO))
                    .await?,
            );
            // The waiter takes its place in the queue and dies there.
            let waiter_manager = manager_at(url.clone()).await?;
            let waiter = tokio::spawn(async move {
                waiter_manager
                    .acquire("crashfair", &fair("300ms", Duration::from_secs(30)))
                    .await
            });
            let mut side = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            within(Duration::from_secs(5), "the fair waiter's place", async {
                loop {
                    let places: u64 = side
                        .zcard(format!("{NAMESPACE}:{{crashfair}}:fair"))
                        .await?;
                    if places >= 1 {
                        return Ok::<_, Error>(());
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await?;
            waiter.abort();
            // No release, no drop: the process dies holding them.
            std::mem::forget(held);
            Ok::<_, Error>(())
        })?;
        drop(runtime);
        Ok(())
    });
    leasehold_testkit::join_within(crashed, Duration::from_secs(60))??;
    let last_grant = server_ms(&mut conn).await?;

    // Right after: every key has an expiry, none later than the retention
    // (the crashed leases' ttls and the places' ttl are shorter), and the
    // counters are there.
    let left = namespace_keys(&mut conn).await?;
    let retention = i64::try_from(RETENTION.as_millis())?;
    // A reader index lives as long as its longest reader (5 s here).
    let unbounded: Vec<_> = left
        .iter()
        .filter(|(k, pttl)| {
            let most = if k.ends_with(":readers") {
                5_000
            } else {
                retention
            };
            !(0..=most).contains(pttl)
        })
        .collect();
    assert!(
        unbounded.is_empty(),
        "keys without a bounded expiry: {unbounded:?}"
    );
    let counters = left.iter().filter(|(k, _)| k.ends_with(":fence")).count();
    assert!(
        counters >= 7 * KEYS,
        "the counters of every lease granted are kept for the retention: {counters} of {}",
        7 * KEYS
    );

    // Once the server's clock has passed the last grant by the retention,
    // nothing is left (SCAN skips a key whose expiry has passed).
    within(Duration::from_secs(10), "the retention to pass", async {
        loop {
            let now = server_ms(&mut conn).await?;
            // The released readers' indexes outlive them by their 5 s ttl.
            let due = last_grant + 5_000 + 1;
            if now >= due {
                return Ok::<_, Error>(());
            }
            tokio::time::sleep(Duration::from_millis(due - now)).await;
        }
    })
    .await?;
    let left = namespace_keys(&mut conn).await?;
    assert!(left.is_empty(), "left after the retention: {left:?}");
    Ok(())
}

/// Tokens keep rising across a counter that expired: the next grant's
/// token comes from the server clock's floor, above every earlier token.
#[tokio::test]
async fn tokens_rise_after_the_counter_expired() -> TestResult {
    let server = RedisServer::start()?;
    let mut conn = side(&server).await?;
    let manager = manager_at(server.url()).await?;
    let counter = format!("{NAMESPACE}:{{nightly}}:fence");

    let before = server_ms(&mut conn).await?;
    let first = manager.acquire("nightly", &options("5s")).await?;
    let after = server_ms(&mut conn).await?;
    // Kept for the retention from its grant, by the server's clock: its
    // PEXPIRETIME between TIME before the acquisition and TIME after it,
    // plus the retention (and 1 ms: the server keeps whole milliseconds).
    let ends: u64 = redis::cmd("PEXPIRETIME")
        .arg(&counter)
        .query_async(&mut conn)
        .await?;
    let retention = u64::try_from(RETENTION.as_millis())?;
    assert!(
        (before + retention..=after + retention + 1).contains(&ends),
        "the counter is kept until {} ms after its grant began by the server's clock, not for the retention ({retention} ms)",
        i128::from(ends) - i128::from(before)
    );
    let token = first.fencing_token();
    first.release().await?;
    within(RETENTION * 3, "the counter to expire", async {
        loop {
            let exists: bool = conn.exists(&counter).await?;
            if !exists {
                return Ok::<_, Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    let next = manager.acquire("nightly", &options("5s")).await?;
    assert!(
        next.fencing_token() > token,
        "a token after the counter expired ({}) is above the one before ({token})",
        next.fencing_token()
    );
    let stored: u64 = conn.get(&counter).await?;
    assert_eq!(
        stored,
        next.fencing_token().0,
        "the counter starts again at the new token"
    );
    next.release().await?;
    Ok(())
}

/// A reader's index outlives a reader held far longer than its ttl: each
/// renewal keeps the index as long as the reader, so a writer is refused
/// for as long as the reader holds, and the index goes away with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readers_index_lives_as_long_as_its_reader() -> TestResult {
    let server = RedisServer::start()?;
    let mut conn = side(&server).await?;
    let readers = manager_at(server.url()).await?;
    let writers = manager_at(server.url()).await?;
    let index = format!("{NAMESPACE}:{{report}}:readers");

    let reader = readers.acquire_read("report", &options("300ms")).await?;
    // Held for ten ttls, renewed by the watchdog every 100 ms; a writer
    // asks now and then and must be refused every time.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        match writers.acquire_write("report", &options("300ms")).await {
            Err(leasehold::LeaseError::NotAcquired { .. }) => {}
            other => panic!("a writer got past a live reader: {other:?}"),
        }
        let pttl: i64 = conn.pttl(&index).await?;
        assert!(
            (1..=300).contains(&pttl),
            "the index lives as long as the reader (at most its ttl), PTTL {pttl}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(reader.loss_reason().is_none(), "the reader still holds");
    reader.release().await?;
    within(Duration::from_secs(2), "the index to expire", async {
        loop {
            let exists: bool = conn.exists(&index).await?;
            if !exists {
                return Ok::<_, Error>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await?;
    Ok(())
}
