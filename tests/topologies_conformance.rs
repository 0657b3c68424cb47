//! One contract, every Redis topology: the same checks against a standalone
//! server, a cluster, a Sentinel-monitored master and Redlock; and permits
//! and read-write leases through the manager on each, judged by the
//! server's keys on a side connection to the node that holds them.

// Each test binary uses part of the shared helpers.
#[allow(dead_code)]
#[path = "common/holders.rs"]
mod holders;

use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, HandoverBackend, HandoverOutcome, HolderId,
    LeaseBackend, ReleaseReport, RenewOutcome, RenewRequest, WatchPolicy, clock_drift,
};
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::redis::{RedisBackend, RedlockBackend};
use leasehold::{
    Backoff, LeaseError, LeaseKey, LeaseManager, LeaseOptions, PermitLimit, ReleaseOutcome, Ttl,
};
use leasehold_testkit::{RedisCluster, RedisServer, SentinelSet, independent_masters};
use tokio::time::Instant;

use holders::{crash_holding_at, manager_at, stored, within};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// What every backend must do, on keys of its own (`prefix` keeps runs apart).
async fn contract(backend: &impl LeaseBackend, prefix: &str) -> TestResult {
    let ttl = Ttl::parse("10s")?;
    let key = LeaseKey::new(format!("{prefix}:lease"))?;
    let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
    let mine = AcquireRequest::new(key.clone(), me, ttl);

    let AcquireOutcome::Acquired(grant) = backend.try_acquire(&mine).await? else {
        return Err("a free lease was not acquired".into());
    };
    assert_eq!(
        grant.valid_until,
        grant.sent_at + ttl.get() - clock_drift(ttl.get())
    );
    let AcquireOutcome::Acquired(again) = backend.try_acquire(&mine).await? else {
        return Err("the holder could not acquire its own lease again".into());
    };
    assert_eq!(
        again.fencing_token, grant.fencing_token,
        "a re-acquire keeps the token"
    );
    let AcquireOutcome::Held(info) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), stranger, ttl))
        .await?
    else {
        return Err("a held lease was acquired by someone else".into());
    };
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    assert!(
        info.ttl_left.is_some_and(|left| left <= ttl.get()),
        "{info:?}"
    );

    let other = LeaseKey::new(format!("{prefix}:other"))?;
    let AcquireOutcome::Acquired(_) = backend
        .try_acquire(&AcquireRequest::new(other.clone(), me, ttl))
        .await?
    else {
        return Err("a second free lease was not acquired".into());
    };
    let outcomes = backend
        .renew_many(&[
            RenewRequest::new(key.clone(), me, ttl),
            RenewRequest::new(key.clone(), stranger, ttl),
            RenewRequest::new(other.clone(), me, ttl),
            RenewRequest::new(LeaseKey::new(format!("{prefix}:never"))?, me, ttl),
        ])
        .await;
    let outcomes: Vec<Option<RenewOutcome>> = outcomes.into_iter().map(Result::ok).collect();
    assert_eq!(
        outcomes,
        [
            Some(RenewOutcome::Renewed),
            Some(RenewOutcome::Lost),
            Some(RenewOutcome::Renewed),
            Some(RenewOutcome::Lost)
        ]
    );
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), me, ttl))
            .await?,
        RenewOutcome::Renewed
    );
    let shown = backend
        .inspect(&key)
        .await?
        .ok_or("a held lease inspects as free")?;
    assert_eq!(shown.fencing_token, Some(grant.fencing_token));

    assert_eq!(
        backend.release(&key, &stranger).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(
        backend.release(&key, &me).await?.outcome(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        backend.release(&key, &me).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert_eq!(backend.inspect(&key).await?, None);
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), me, ttl))
            .await?,
        RenewOutcome::Lost
    );
    let AcquireOutcome::Acquired(next) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), stranger, ttl))
        .await?
    else {
        return Err("a released lease was not acquired".into());
    };
    assert!(
        next.fencing_token > grant.fencing_token,
        "fencing tokens rise"
    );
    assert_eq!(
        backend.release(&other, &me).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}

/// `release_to` as a manager calls it: through the backend's handover,
/// and for a backend without one (Redlock) a release, which hands nothing
/// over.
async fn release_to(
    backend: &impl LeaseBackend,
    key: &LeaseKey,
    holder: &HolderId,
    next: &AcquireRequest,
) -> Result<HandoverOutcome, BackendError> {
    match backend.handover() {
        Some(handover) => handover.release_to(key, holder, next).await,
        None => Ok(match backend.release(key, holder).await? {
            ReleaseReport::Released { .. } => HandoverOutcome::Released,
            ReleaseReport::NotHeld => HandoverOutcome::NotHeld,
        }),
    }
}

/// Release notices and `release_to`. With `notices`, a release wakes a
/// watch; with `handover` too, a release with only our own single watch
/// listening hands the lease over. Otherwise `release_to` only releases
/// (and, without notices, the watch never fires).
async fn notices_and_handover(
    backend: &impl LeaseBackend,
    prefix: &str,
    notices: bool,
    handover: bool,
) -> TestResult {
    let ttl = Ttl::parse("10s")?;
    let key = LeaseKey::new(format!("{prefix}:notice"))?;
    let me = HolderId::generate()?;
    let AcquireOutcome::Acquired(grant) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), me, ttl))
        .await?
    else {
        return Err("a free lease was not acquired".into());
    };
    let mut watch = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    assert_eq!(watch.is_supported(), notices);
    let next = HolderId::generate()?;
    let outcome = release_to(
        backend,
        &key,
        &me,
        &AcquireRequest::new(key.clone(), next, ttl),
    )
    .await?;
    if handover {
        let HandoverOutcome::HandedOver(given) = outcome else {
            return Err(
                format!("not handed over with only our watch listening: {outcome:?}").into(),
            );
        };
        assert_eq!(given.holder, next);
        assert!(given.fencing_token > grant.fencing_token);
        let shown = backend
            .inspect(&key)
            .await?
            .ok_or("the handed-over lease is gone")?;
        assert_eq!(shown.fencing_token, Some(given.fencing_token));
        assert_eq!(
            backend
                .renew(&RenewRequest::new(key.clone(), next, ttl))
                .await?,
            RenewOutcome::Renewed
        );
        assert_eq!(
            backend.release(&key, &next).await?.outcome(),
            ReleaseOutcome::Released
        );
        tokio::time::timeout(Duration::from_secs(5), watch.released())
            .await
            .map_err(|_| "no release notice")?;
    } else if notices {
        assert_eq!(outcome, HandoverOutcome::Released);
        tokio::time::timeout(Duration::from_secs(5), watch.released())
            .await
            .map_err(|_| "no release notice")?;
    } else {
        assert_eq!(outcome, HandoverOutcome::Released);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), watch.released())
                .await
                .is_err(),
            "an unsupported watch fired"
        );
    }
    assert_eq!(backend.inspect(&key).await?, None);
    assert_eq!(
        release_to(
            backend,
            &key,
            &me,
            &AcquireRequest::new(key.clone(), next, ttl)
        )
        .await?,
        HandoverOutcome::NotHeld
    );
    Ok(())
}

/// The minimum hold on a topology that has it: released at once, the
/// lease stays taken, still the holder's (same fencing token), for about
/// the minimum, as the server reports it to a stranger; after the minimum,
/// it is free. A cluster runs it on keys of any slot (the scripts build
/// the mark's name from the lease's, in its slot).
async fn minimum_hold(backend: &impl LeaseBackend, prefix: &str) -> TestResult {
    let ttl = Ttl::parse("10s")?;
    let minimum = Duration::from_millis(1_000);
    let key = LeaseKey::new(format!("{prefix}:minimum"))?;
    let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
    let mine = AcquireRequest::new(key.clone(), me, ttl).with_hold_at_least(minimum)?;
    let theirs = AcquireRequest::new(key.clone(), stranger, ttl);
    let AcquireOutcome::Acquired(grant) = backend.try_acquire(&mine).await? else {
        return Err("a free lease was not acquired".into());
    };
    let released = Instant::now();
    assert_eq!(
        backend.release(&key, &me).await?.outcome(),
        ReleaseOutcome::Released
    );
    let AcquireOutcome::Held(info) = backend.try_acquire(&theirs).await? else {
        return Err("a lease released under its minimum was free at once".into());
    };
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    let left = info.ttl_left.ok_or("no ttl on a kept lease")?;
    assert!(
        left <= minimum && left > minimum / 2,
        "kept for {left:?} more, not about the {minimum:?} minimum"
    );
    tokio::time::sleep_until(released + left + Duration::from_millis(50)).await;
    let AcquireOutcome::Acquired(next) = backend.try_acquire(&theirs).await? else {
        return Err("the lease was still taken after its minimum".into());
    };
    assert!(next.fencing_token > grant.fencing_token);
    backend.release(&key, &stranger).await?;
    Ok(())
}

const OP_TIMEOUT: Duration = Duration::from_millis(500);

#[tokio::test]
async fn standalone_keeps_the_contract() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .op_timeout(OP_TIMEOUT)
        .connect()
        .await?;
    contract(&backend, "standalone").await?;
    minimum_hold(&backend, "standalone").await?;
    notices_and_handover(&backend, "standalone", true, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_the_contract() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = RedisBackend::builder(cluster.url())
        .op_timeout(OP_TIMEOUT)
        .connect()
        .await?;
    contract(&backend, "cluster").await?;
    // Keys with one hash tag: one slot, one script call per batch.
    contract(&backend, "cluster:{tagged}").await?;
    minimum_hold(&backend, "cluster").await?;
    minimum_hold(&backend, "cluster:{tagged}").await?;
    notices_and_handover(&backend, "cluster", true, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_keeps_the_contract() -> TestResult {
    let set = SentinelSet::start()?;
    let backend = RedisBackend::builder(set.url())
        .op_timeout(OP_TIMEOUT)
        .connect()
        .await?;
    contract(&backend, "sentinel").await?;
    minimum_hold(&backend, "sentinel").await?;
    notices_and_handover(&backend, "sentinel", true, true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_the_contract() -> TestResult {
    let masters = independent_masters(5)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    assert_eq!(backend.quorum(), 3);
    contract(&backend, "redlock").await?;
    // Notices from every master; a release never hands over.
    notices_and_handover(&backend, "redlock", true, false).await
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
