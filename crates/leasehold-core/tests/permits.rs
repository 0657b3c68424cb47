//! Counting leases (permits) on `MemoryBackend`, on tokio's paused clock:
//! at most N holders, a permit that frees exactly at its ttl, fencing
//! tokens from one counter per semaphore, the agreed limit, release
//! notices on the semaphore, renewal with other leases in one batch, and
//! the default of backends without permits.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, Grant, HolderId, LeaseBackend, LeaseInfo,
    LeaseKey, MemoryBackend, PermitBackend, PermitLimit, ReleaseOutcome, ReleaseReport,
    RenewOutcome, RenewRequest, Ttl, WatchPolicy,
};
use tokio::time::{advance, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn limit(n: u32) -> PermitLimit {
    PermitLimit::new(n).expect("a valid limit")
}

fn holder() -> HolderId {
    HolderId::generate().expect("the OS has entropy")
}

fn jobs() -> LeaseKey {
    LeaseKey::new("jobs").expect("a valid key")
}

async fn take(
    backend: &impl LeaseBackend,
    who: HolderId,
    ttl: Ttl,
    n: u32,
) -> Result<AcquireOutcome, BackendError> {
    // As the manager asks: through the backend's permits, if it has them.
    backend
        .permits()
        .ok_or_else(|| BackendError::no_permits(&jobs()))?
        .try_acquire_permit(&AcquireRequest::new(jobs(), who, ttl), limit(n))
        .await
}

async fn granted(
    backend: &impl LeaseBackend,
    who: HolderId,
    ttl: Ttl,
    n: u32,
) -> Result<Grant, Box<dyn std::error::Error>> {
    match take(backend, who, ttl, n).await? {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        other => Err(format!("no permit: {other:?}").into()),
    }
}

async fn refused(
    backend: &impl LeaseBackend,
    ttl: Ttl,
    n: u32,
) -> Result<LeaseInfo, Box<dyn std::error::Error>> {
    match take(backend, holder(), ttl, n).await? {
        AcquireOutcome::Held(info) => Ok(info),
        other => Err(format!("a permit was granted: {other:?}").into()),
    }
}

/// Three permits go to three holders, the first free one each time, with
/// rising tokens; the fourth holder is refused and told when the first
/// permit frees; a holder asking again keeps its permit and token.
#[tokio::test(start_paused = true)]
async fn at_most_n_holders_each_on_the_first_free_permit() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("10s")?;
    let (a, b, c) = (holder(), holder(), holder());
    let ga = granted(&backend, a, ttl, 3).await?;
    advance(ms(1)).await;
    let gb = granted(&backend, b, ttl, 3).await?;
    let gc = granted(&backend, c, ttl, 3).await?;
    let keys: Vec<&str> = [&ga, &gb, &gc].iter().map(|g| g.key.as_str()).collect();
    assert_eq!(
        keys,
        ["{jobs}:permit:0", "{jobs}:permit:1", "{jobs}:permit:2"]
    );
    assert!(ga.fencing_token < gb.fencing_token && gb.fencing_token < gc.fencing_token);

    let info = refused(&backend, ttl, 3).await?;
    assert_eq!(info.fencing_token, Some(ga.fencing_token));
    assert_eq!(info.ttl_left, Some(ttl.get() - ms(1)));

    let again = granted(&backend, b, ttl, 3).await?;
    assert_eq!(
        (again.key, again.fencing_token),
        (gb.key.clone(), gb.fencing_token)
    );

    // A permit is a lease: released by its key, then the next holder gets it.
    assert_eq!(
        backend.release(&gb.key, &b).await?.outcome(),
        ReleaseOutcome::Released
    );
    let next = granted(&backend, holder(), ttl, 3).await?;
    assert_eq!(next.key, gb.key);
    assert!(next.fencing_token > gc.fencing_token);
    refused(&backend, ttl, 3).await?;
    Ok(())
}

/// A permit no one renews lives exactly its ttl: taken 1 ms before, free
/// at the instant itself, with no sweeper.
#[tokio::test(start_paused = true)]
async fn an_unrenewed_permit_frees_exactly_at_its_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("1s")?;
    let crashed = granted(&backend, holder(), ttl, 1).await?;
    advance(ms(999)).await;
    assert_eq!(refused(&backend, ttl, 1).await?.ttl_left, Some(ms(1)));
    advance(ms(1)).await;
    let next = granted(&backend, holder(), ttl, 1).await?;
    assert_eq!(next.key, crashed.key);
    assert!(next.fencing_token > crashed.fencing_token);
    Ok(())
}

/// Holders must agree on the limit while any permit is held, also one
/// past the permits the call asks for; once all are free (released or
/// expired) a new limit is taken.
#[tokio::test(start_paused = true)]
async fn a_limit_mismatch_is_refused_while_permits_are_held() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("1s")?;
    let holders: Vec<HolderId> = (0..5).map(|_| holder()).collect();
    let mut grants = Vec::new();
    for h in &holders {
        grants.push(granted(&backend, *h, ttl, 5).await?);
    }
    for (grant, h) in grants
        .iter()
        .zip(&holders)
        .filter(|(g, _)| g.key.as_str() != "{jobs}:permit:3")
    {
        backend.release(&grant.key, h).await?;
    }
    for asked in [2, 6] {
        let refusal = take(&backend, holder(), ttl, asked).await;
        assert!(
            matches!(&refusal, Err(BackendError::PermitLimitMismatch { asked: a, held: 5, .. }) if *a == asked),
            "{refusal:?}"
        );
        assert!(!refusal.is_err_and(|e| e.is_transient()));
    }
    advance(ttl.get()).await;
    let grant = granted(&backend, holder(), ttl, 2).await?;
    assert_eq!(grant.key.as_str(), "{jobs}:permit:0");
    assert!(matches!(
        take(&backend, holder(), ttl, 5).await,
        Err(BackendError::PermitLimitMismatch {
            asked: 5,
            held: 2,
            ..
        })
    ));
    Ok(())
}

/// A permit's release wakes whoever watches the semaphore, however the
/// semaphore is spelled (`jobs` and `{jobs}` are one semaphore).
#[tokio::test(start_paused = true)]
async fn a_permit_release_wakes_the_semaphores_watchers() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("10s")?;
    let mut plain = backend
        .watch_releases(&jobs(), WatchPolicy::Counted)
        .await?;
    let mut braced = backend
        .watch_releases(&LeaseKey::new("{jobs}")?, WatchPolicy::Counted)
        .await?;
    let me = holder();
    granted(&backend, holder(), ttl, 2).await?;
    let grant = granted(&backend, me, ttl, 2).await?;
    assert_eq!(
        backend.release(&grant.key, &me).await?,
        ReleaseReport::Released { heard: true }
    );
    timeout(ms(1), plain.released()).await?;
    timeout(ms(1), braced.released()).await?;
    Ok(())
}

/// Permits and exclusive leases renew in one `renew_many` batch, each
/// kept alive by it, as the watchdog renews them.
#[tokio::test(start_paused = true)]
async fn permits_renew_in_one_batch_with_other_leases() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("1s")?;
    let (a, b, x) = (holder(), holder(), holder());
    let pa = granted(&backend, a, ttl, 2).await?;
    let pb = granted(&backend, b, ttl, 2).await?;
    let lone = LeaseKey::new("lone")?;
    backend
        .try_acquire(&AcquireRequest::new(lone.clone(), x, ttl))
        .await?;
    advance(ms(900)).await;
    let batch = [
        RenewRequest::new(pa.key.clone(), a, ttl),
        RenewRequest::new(lone, x, ttl),
        RenewRequest::new(pb.key.clone(), b, ttl),
    ];
    let outcomes: Vec<RenewOutcome> = backend
        .renew_many(&batch)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    assert_eq!(outcomes, [RenewOutcome::Renewed; 3]);
    advance(ms(900)).await;
    // 1.8 s after the grant, both permits still held thanks to the renewal.
    refused(&backend, ttl, 2).await?;
    Ok(())
}

/// A backend that implements only the required methods has no permits:
/// its `permits` is `None`, and the manager's refusal is a typed error.
#[derive(Clone)]
struct NoPermits(MemoryBackend);

impl LeaseBackend for NoPermits {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.0.try_acquire(request).await
    }
    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.0.renew_many(requests).await
    }
    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        self.0.release(key, holder).await
    }
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.0.inspect(key).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_backend_without_permits_refuses_them() -> TestResult {
    let backend = NoPermits(MemoryBackend::new());
    let refusal = take(&backend, holder(), Ttl::parse("1s")?, 2).await;
    assert!(
        matches!(&refusal, Err(BackendError::Unsupported { op: "acquire_permit", key, .. }) if key == "jobs"),
        "{refusal:?}"
    );
    assert_eq!(backend.0.inspect(&jobs().permit(0)?).await?, None);
    Ok(())
}

/// A refused holder is told of the permit that frees first, wherever it
/// lies among the semaphore's permits.
#[tokio::test(start_paused = true)]
async fn a_refusal_names_the_permit_that_frees_first() -> TestResult {
    let backend = MemoryBackend::new();
    let mut grants = Vec::new();
    for t in ["10s", "3s", "6s"] {
        grants.push(granted(&backend, holder(), Ttl::parse(t)?, 3).await?);
    }
    let info = refused(&backend, Ttl::parse("10s")?, 3).await?;
    assert_eq!(info.fencing_token, Some(grants[1].fencing_token));
    assert_eq!(info.ttl_left, Some(ms(3_000)));
    Ok(())
}
