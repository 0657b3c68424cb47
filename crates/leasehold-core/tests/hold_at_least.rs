//! The minimum hold on the memory backend, on tokio's paused clock: a
//! release before the grant + the minimum keeps the key taken, still the
//! holder's, until then and not a millisecond longer; a release after it
//! frees the key at once and announces it; a handover never happens under
//! the minimum. The backend's own record (`inspect`, whether another holder
//! is granted the key, the release watch) is the witness.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FairBackend, Grant, HandoverBackend,
    HandoverOutcome, HolderId, LeaseBackend, LeaseInfo, LeaseKey, LockDelay, MemoryBackend,
    PermitBackend, PermitLimit, ReadWriteBackend, ReleaseOutcome, RenewOutcome, RenewRequest, Ttl,
    WatchPolicy,
};
use tokio::time::advance;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Shorter than the minimum, so that a kept key outlives its ttl: the
/// release must move the key's end, not only refrain from deleting it.
fn ttl() -> Ttl {
    Ttl::new(MS(1_000)).expect("valid ttl")
}

const MINIMUM: Duration = Duration::from_millis(5_000);

fn key() -> LeaseKey {
    LeaseKey::new("nightly").expect("valid key")
}

fn request(holder: HolderId) -> Result<AcquireRequest, leasehold_core::InputError> {
    AcquireRequest::new(key(), holder, ttl()).with_hold_at_least(MINIMUM)
}

async fn acquired(backend: &MemoryBackend, request: &AcquireRequest) -> Result<Grant, String> {
    match backend.try_acquire(request).await {
        Ok(AcquireOutcome::Acquired(grant)) => Ok(grant),
        other => Err(format!("expected the lease to be granted, got {other:?}")),
    }
}

async fn held(backend: &MemoryBackend, request: &AcquireRequest) -> Result<LeaseInfo, String> {
    match backend.try_acquire(request).await {
        Ok(AcquireOutcome::Held(info)) => Ok(info),
        other => Err(format!("expected the lease to be held, got {other:?}")),
    }
}

/// Released 1 s after the grant, renewed on the way: the key stays the
/// holder's until grant + 5 s exactly, others are told the time left, no
/// notice goes out, and the next holder gets it at grant + 5 s.
#[tokio::test(start_paused = true)]
async fn an_early_release_keeps_the_key_until_grant_plus_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    let grant = acquired(&backend, &request(a)?).await?;
    let mut watch = backend.watch_releases(&key(), WatchPolicy::Counted).await?;
    advance(MS(600)).await;
    assert_eq!(
        backend.renew(&RenewRequest::new(key(), a, ttl())).await?,
        RenewOutcome::Renewed
    );
    advance(MS(400)).await;
    assert_eq!(
        backend.release(&key(), &a).await?.outcome(),
        ReleaseOutcome::Released
    );

    let info = held(&backend, &request(b)?).await?;
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    assert_eq!(info.ttl_left, Some(MS(4_000)), "kept until grant + minimum");
    let no_notice = tokio::time::timeout(MS(1), watch.released()).await;
    assert!(no_notice.is_err(), "a kept key announced a release");

    // (The timeout moved the paused clock on by 1 ms.) Past the ttl since
    // the renewal (1.6 s), still kept, to the millisecond.
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("the kept key is gone")?;
    assert_eq!(info.ttl_left, Some(MS(3_999)));
    advance(MS(3_998)).await;
    held(&backend, &request(b)?).await?;
    advance(MS(1)).await;
    let next = acquired(&backend, &request(b)?).await?;
    assert!(next.fencing_token > grant.fencing_token);
    Ok(())
}

/// A release after the minimum frees the key at once, with a notice.
#[tokio::test(start_paused = true)]
async fn a_release_after_the_minimum_frees_the_key_at_once() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    let mut lease = request(a)?;
    lease.ttl = Ttl::new(MS(10_000))?;
    acquired(&backend, &lease).await?;
    let mut watch = backend.watch_releases(&key(), WatchPolicy::Counted).await?;
    advance(MINIMUM).await;
    assert_eq!(
        backend.release(&key(), &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    tokio::time::timeout(MS(1), watch.released()).await?;
    assert_eq!(backend.inspect(&key()).await?, None);
    acquired(&backend, &request(b)?).await?;
    Ok(())
}

/// Under the minimum, a release offered to a waiter hands nothing over
/// and announces nothing; the key stays the holder's until its end, and
/// another holder can neither renew nor release it.
#[tokio::test(start_paused = true)]
async fn no_handover_and_no_stranger_under_the_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    let mut lease = request(a)?;
    lease.ttl = Ttl::new(MS(10_000))?;
    let grant = acquired(&backend, &lease).await?;
    advance(MS(2_000)).await;
    let outcome = backend.release_to(&key(), &a, &request(b)?).await?;
    assert_eq!(outcome, HandoverOutcome::Released);
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("the kept key is gone")?;
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    assert_eq!(info.ttl_left, Some(MS(3_000)));
    // Another holder's renewal and release are refused, and change nothing.
    assert_eq!(
        backend.renew(&RenewRequest::new(key(), b, ttl())).await?,
        RenewOutcome::Lost
    );
    assert_eq!(
        backend.release(&key(), &b).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("the kept key is gone")?;
    assert_eq!(info.ttl_left, Some(MS(3_000)));
    // The holder's second release (a retry) keeps the same end.
    assert_eq!(
        backend.release(&key(), &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    advance(MS(3_000)).await;
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}

/// The minimum counts from the grant that took the key: a re-acquire by
/// the same holder (a retried attempt) does not move it; and a lock-delay
/// beside it is kept only without a release.
#[tokio::test(start_paused = true)]
async fn a_re_acquire_does_not_move_the_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let a = HolderId::generate()?;
    let first = request(a)?.with_lock_delay(LockDelay::new(MS(20_000))?);
    acquired(&backend, &first).await?;
    advance(MS(3_000)).await;
    acquired(&backend, &first).await?;
    backend.release(&key(), &a).await?;
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("the kept key is gone")?;
    assert_eq!(info.ttl_left, Some(MS(2_000)));
    Ok(())
}

/// Permits, read-write shares and fair-queue grants refuse a minimum hold
/// rather than ignore it.
#[tokio::test(start_paused = true)]
async fn other_kinds_refuse_a_minimum() -> TestResult {
    let backend = MemoryBackend::new();
    let r = request(HolderId::generate()?)?;
    let limit = PermitLimit::new(2)?;
    let place = leasehold_core::PlaceTtl::DEFAULT;
    for outcome in [
        backend.try_acquire_permit(&r, limit).await.err(),
        backend.try_acquire_read(&r).await.err(),
        backend.try_acquire_write(&r).await.err(),
        backend.try_acquire_fair(&r, place, None).await.err(),
    ] {
        assert!(
            matches!(outcome, Some(BackendError::Unsupported { .. })),
            "{outcome:?}"
        );
    }
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}

/// Refused: above a day, or finer than a millisecond; zero is none.
#[test]
fn the_minimum_is_validated() -> Result<(), leasehold_core::InputError> {
    let r = AcquireRequest::new(key(), HolderId::generate()?, ttl());
    for bad in [Duration::from_secs(86_401), Duration::from_micros(1_500)] {
        assert!(matches!(
            r.clone().with_hold_at_least(bad),
            Err(leasehold_core::InputError::InvalidHoldAtLeast { .. })
        ));
    }
    assert_eq!(
        r.clone().with_hold_at_least(Duration::ZERO)?.hold_at_least,
        None
    );
    assert_eq!(
        r.with_hold_at_least(MINIMUM)?.hold_at_least_millis(),
        Some(5_000)
    );
    Ok(())
}
