//! One contract, every Redis topology: the same checks against a standalone
//! server, a cluster, a Sentinel-monitored master and Redlock.

use std::time::Duration;

use leasehold::redis::{RedisBackend, RedlockBackend};
use leasehold::{
    AcquireOutcome, AcquireRequest, HandoverOutcome, HolderId, LeaseBackend, LeaseKey,
    ReleaseOutcome, RenewOutcome, RenewRequest, Ttl, clock_drift,
};
use leasehold_testkit::{RedisCluster, RedisServer, SentinelSet, independent_masters};

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
        backend.release(&key, &stranger).await?,
        ReleaseOutcome::NotHeld
    );
    assert_eq!(backend.release(&key, &me).await?, ReleaseOutcome::Released);
    assert_eq!(backend.release(&key, &me).await?, ReleaseOutcome::NotHeld);
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
        backend.release(&other, &me).await?,
        ReleaseOutcome::Released
    );
    Ok(())
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
    let mut watch = backend.watch_releases(&key).await?;
    assert_eq!(watch.is_supported(), notices);
    let next = HolderId::generate()?;
    let outcome = backend
        .release_to(&key, &me, &AcquireRequest::new(key.clone(), next, ttl))
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
            backend.release(&key, &next).await?,
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
        backend
            .release_to(&key, &me, &AcquireRequest::new(key.clone(), next, ttl))
            .await?,
        HandoverOutcome::NotHeld
    );
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
