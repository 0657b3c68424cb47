//! One contract, every Redis topology: the testkit's conformance suite
//! (`leasehold_testkit::conformance`, the one a third-party backend runs)
//! against a standalone server, a cluster, a Sentinel-monitored master and
//! Redlock, with every area each has; and permits
//! and read-write leases through the manager on each, judged by the
//! server's keys on a side connection to the node that holds them.
//!
//! Seen red on the server, each script broken once and restored (the
//! suite's own checks are seen red on `MemoryBackend`, see
//! tests/conformance_memory.rs): renew.lua without its holder check,
//! "renew-owner-checked: a stranger's renewal was answered Renewed, not
//! Lost"; release.lua without it, "release-owner-checked: a stranger's
//! release of a held lease was answered Released, not NotHeld";
//! release_fair.lua never handing over, "fair-handover: no handover
//! announced within 5s".

// Each test binary uses part of the shared helpers.
#[allow(dead_code)]
#[path = "common/holders.rs"]
mod holders;

use std::time::Duration;

use leasehold::backend::{BackendError, ChangeBackend};
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::redis::{RedisBackend, RedlockBackend};
use leasehold::{Backoff, LeaseError, LeaseManager, LeaseOptions, PermitLimit, Ttl};
use leasehold_testkit::conformance::{Area, Rule, Suite};
use leasehold_testkit::{RedisCluster, RedisServer, SentinelSet, independent_masters};
use tokio::time::Instant;

use holders::{crash_holding_at, manager_at, stored, within};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Every area the Redis backend has, standalone, behind Sentinel and on a
/// cluster: notices, handover, the minimum hold, permits, read-write leases,
/// the fair queue and its handover.
const REDIS_AREAS: [Area; 7] = [
    Area::ReleaseNotices,
    Area::Handover,
    Area::MinimumHold,
    Area::Permits,
    Area::ReadWrite,
    Area::FairQueue,
    Area::FairHandover,
];

const OP_TIMEOUT: Duration = Duration::from_millis(500);

async fn connect(url: String) -> Result<RedisBackend, leasehold::redis::ConnectError> {
    RedisBackend::builder(url)
        .op_timeout(OP_TIMEOUT)
        .connect()
        .await
}

#[tokio::test]
async fn standalone_keeps_the_contract() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let checked = Suite::new(backend.clone(), "standalone")
        .run(&REDIS_AREAS)
        .await?;
    assert_eq!(checked.len(), Rule::CORE.len() + 6);
    // Client tracking reports to this backend what a second connection did.
    Suite::new(backend, "standalone")
        .change_feed(&connect(server.url()).await?)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_the_contract() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = connect(cluster.url()).await?;
    Suite::new(backend.clone(), "cluster")
        .run(&REDIS_AREAS)
        .await?;
    // Keys with one hash tag: one slot, one script call per batch.
    Suite::new(backend.clone(), "cluster:{tagged}")
        .run(&REDIS_AREAS)
        .await?;
    // No client tracking on a cluster's node connections: no change feed.
    assert!(!backend.watch_changes().await?.is_supported());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_keeps_the_contract() -> TestResult {
    let set = SentinelSet::start()?;
    let backend = connect(set.url()).await?;
    Suite::new(backend.clone(), "sentinel")
        .run(&REDIS_AREAS)
        .await?;
    Suite::new(backend, "sentinel")
        .change_feed(&connect(set.url()).await?)
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_the_contract() -> TestResult {
    let masters = independent_masters(5)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    assert_eq!(backend.quorum(), 3);
    // Notices from every master; a release never hands over. Permits,
    // read-write leases and the fair queue are refused (below).
    Suite::new(backend, "redlock")
        .expect_handover(Some(false))
        .run(&[Area::ReleaseNotices])
        .await?;
    Ok(())
}

/// The hash tag of every key the manager-level checks use: one slot, so
/// one node of a cluster holds them all and a side connection to it sees
/// them with `KEYS`.
const TAG: &str = "{conf}";

fn options(ttl: &str, wait: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .wait(wait)
        .backoff(Backoff::fixed(Duration::from_millis(100)))
        .build()
        .expect("valid options")
}

/// A plain connection to the node at `url` (the one holding [`TAG`]'s slot).
async fn witness(url: String) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// The keys on the witness that match `pattern`, sorted.
async fn keys_on(
    witness: &mut redis::aio::MultiplexedConnection,
    pattern: &str,
) -> redis::RedisResult<Vec<String>> {
    let mut keys: Vec<String> = witness.keys(pattern).await?;
    keys.sort();
    Ok(keys)
}

fn not_acquired<T>(result: &Result<T, LeaseError>) -> bool {
    matches!(result, Err(LeaseError::NotAcquired { .. }))
}

/// Permits through managers on the deployment at `url`: two permits go to
/// two holders, a third is refused and the server never has more than two
/// permit keys; a holder that crashes keeps its permit until the ttl the
/// server gave it runs out, no longer.
async fn permits_through_the_manager(
    url: &str,
    witness: &mut redis::aio::MultiplexedConnection,
) -> Result<(), holders::Error> {
    let (a, b) = (
        manager_at(url.to_owned()).await?,
        manager_at(url.to_owned()).await?,
    );
    let (jobs, limit) = (format!("jobs:{TAG}"), PermitLimit::new(2)?);
    let permit_keys = format!("leasehold:{jobs}:permit:*");
    let first = a
        .acquire_permit(&jobs, limit, &options("5s", Duration::ZERO))
        .await?;
    let second = b
        .acquire_permit(&jobs, limit, &options("5s", Duration::ZERO))
        .await?;
    let mut held = vec![stored(&first.server_key()), stored(&second.server_key())];
    held.sort();
    assert_eq!(keys_on(witness, &permit_keys).await?, held);
    let third = b
        .acquire_permit(&jobs, limit, &options("5s", Duration::from_millis(300)))
        .await;
    // The server's keys first: whatever the client made of the reply.
    assert_eq!(keys_on(witness, &permit_keys).await?, held);
    assert!(not_acquired(&third), "a third permit: {third:?}");
    first.release().await?;
    second.release().await?;
    assert_eq!(keys_on(witness, &permit_keys).await?, Vec::<String>::new());

    let crash = format!("crash:{TAG}");
    let taken = crash.clone();
    let crashed = crash_holding_at(url.to_owned(), async move |manager| {
        Ok(manager
            .acquire_permit(&taken, PermitLimit::new(1)?, &options("1s", Duration::ZERO))
            .await?)
    })?;
    let crashed_at = Instant::now();
    let pttl: i64 = witness.pttl(&crashed).await?;
    assert!(
        pttl > 0 && pttl <= 1000,
        "PTTL right after the crash: {pttl}"
    );
    let got = within(
        Duration::from_secs(10),
        "the crashed holder's permit",
        a.acquire_permit(
            &crash,
            PermitLimit::new(1)?,
            &options("5s", Duration::from_secs(8)),
        ),
    )
    .await?;
    let waited = crashed_at.elapsed();
    assert_eq!(stored(&got.server_key()), crashed);
    assert!(
        waited >= Duration::from_millis(u64::try_from(pttl)?.saturating_sub(50)),
        "freed after {waited:?}, before its PTTL of {pttl} ms"
    );
    assert!(
        waited < Duration::from_millis(1000 + 700),
        "freed after {waited:?}"
    );
    got.release().await?;
    Ok(())
}

/// Read-write leases through managers on the deployment at `url`: two
/// readers share; a writer waits for them with its intent on the server
/// and keeps a new reader out meanwhile (writer preference); once both
/// release, it holds alone and keeps readers out.
async fn rw_through_the_manager(
    url: &str,
    witness: &mut redis::aio::MultiplexedConnection,
) -> Result<(), holders::Error> {
    let (a, b, w) = (
        manager_at(url.to_owned()).await?,
        manager_at(url.to_owned()).await?,
        manager_at(url.to_owned()).await?,
    );
    let doc = format!("doc:{TAG}");
    let (readers, writer, intent) = (
        format!("leasehold:{doc}:read:*"),
        format!("leasehold:{doc}:write"),
        format!("leasehold:{doc}:write-wanted"),
    );
    let r1 = a.acquire_read(&doc, &options("5s", Duration::ZERO)).await?;
    let r2 = b.acquire_read(&doc, &options("5s", Duration::ZERO)).await?;
    let mut both = vec![stored(&r1.server_key()), stored(&r2.server_key())];
    both.sort();
    assert_eq!(keys_on(witness, &readers).await?, both, "readers share");
    assert!(!witness.exists::<_, bool>(&writer).await?);

    let waiting = tokio::spawn({
        let doc = doc.clone();
        async move {
            w.acquire_write(&doc, &options("5s", Duration::from_secs(10)))
                .await
        }
    });
    within(Duration::from_secs(5), "the writer's intent", async {
        while !witness.exists::<_, bool>(&intent).await.unwrap_or(false) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        !witness.exists::<_, bool>(&writer).await?,
        "a writer beside readers"
    );
    let late = a.acquire_read(&doc, &options("5s", Duration::ZERO)).await;
    assert_eq!(keys_on(witness, &readers).await?, both);
    assert!(
        not_acquired(&late),
        "a reader past the waiting writer: {late:?}"
    );

    r1.release().await?;
    r2.release().await?;
    let held = within(Duration::from_secs(10), "the writer", waiting).await??;
    assert_eq!(stored(&held.server_key()), writer);
    assert!(witness.exists::<_, bool>(&writer).await?);
    assert_eq!(keys_on(witness, &readers).await?, Vec::<String>::new());
    assert!(
        !witness.exists::<_, bool>(&intent).await?,
        "the granted writer's intent"
    );
    let refused = b.acquire_read(&doc, &options("5s", Duration::ZERO)).await;
    assert_eq!(keys_on(witness, &readers).await?, Vec::<String>::new());
    assert!(
        not_acquired(&refused),
        "a reader beside the writer: {refused:?}"
    );
    held.release().await?;
    assert!(!witness.exists::<_, bool>(&writer).await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_keeps_permits_and_rw_through_the_manager() -> Result<(), holders::Error> {
    let server = RedisServer::start()?;
    let mut witness = witness(server.url()).await?;
    permits_through_the_manager(&server.url(), &mut witness).await?;
    rw_through_the_manager(&server.url(), &mut witness).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_permits_and_rw_through_the_manager() -> Result<(), holders::Error> {
    let cluster = RedisCluster::start(3, 0)?;
    let node = cluster.master_of_slot(cluster.keyslot(TAG)?)?;
    let mut witness = witness(cluster.nodes()[node].url()).await?;
    permits_through_the_manager(&cluster.url(), &mut witness).await?;
    rw_through_the_manager(&cluster.url(), &mut witness).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_keeps_permits_and_rw_through_the_manager() -> Result<(), holders::Error> {
    let set = SentinelSet::start()?;
    let mut witness = witness(set.master().url()).await?;
    permits_through_the_manager(&set.url(), &mut witness).await?;
    rw_through_the_manager(&set.url(), &mut witness).await
}

/// Redlock has neither permits nor read-write leases: the manager says so
/// at once for each, and nothing is written on any master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_permits_and_rw_through_the_manager() -> Result<(), holders::Error> {
    let masters = independent_masters(3)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    let manager = LeaseManager::new(backend)?;
    let doc = format!("doc:{TAG}");
    let wait = options("5s", Duration::from_secs(20));
    for (what, refused) in [
        (
            "a read",
            within(
                Duration::from_secs(5),
                "a read",
                manager.acquire_read(&doc, &wait),
            )
            .await,
        ),
        (
            "a write",
            within(
                Duration::from_secs(5),
                "a write",
                manager.acquire_write(&doc, &wait),
            )
            .await,
        ),
        (
            "a permit",
            within(
                Duration::from_secs(5),
                "a permit",
                manager.acquire_permit(&doc, PermitLimit::new(2)?, &wait),
            )
            .await,
        ),
    ] {
        assert!(
            matches!(
                refused,
                Err(LeaseError::Backend(BackendError::Unsupported { .. }))
            ),
            "{what}: {refused:?}"
        );
    }
    for master in &masters {
        assert_eq!(
            master.cli(&["DBSIZE"])?.trim(),
            "0",
            "something was written"
        );
    }
    Ok(())
}
