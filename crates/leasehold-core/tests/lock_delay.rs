//! Lock-delay on the memory backend, on tokio's paused clock: a lease's key
//! is kept for ttl + lock-delay from its grant and from every renewal, so
//! that it stays taken for the lock-delay after its holder vanished; the
//! grant's validity counts from the ttl alone; a release frees the key at
//! once. The backend's own record (`inspect`, and whether another holder is
//! granted the key) is the witness.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Grant, HandoverBackend, HandoverOutcome, HolderId,
    LeaseBackend, LeaseInfo, LeaseKey, LockDelay, MemoryBackend, PermitBackend, PermitLimit,
    ReadWriteBackend, ReleaseOutcome, RenewOutcome, RenewRequest, Ttl,
};
use tokio::time::{Instant, advance};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn ttl() -> Ttl {
    Ttl::new(MS(1_000)).expect("valid ttl")
}

fn delay() -> LockDelay {
    LockDelay::new(MS(2_000)).expect("valid lock-delay")
}

fn key() -> LeaseKey {
    LeaseKey::new("ld").expect("valid key")
}

fn request(holder: HolderId) -> AcquireRequest {
    AcquireRequest::new(key(), holder, ttl()).with_lock_delay(delay())
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

/// A holder that vanishes after one renewal: its key is kept until
/// ttl + lock-delay after that renewal, and not a millisecond longer; its
/// validity ended a lock-delay (and the drift) before.
#[tokio::test(start_paused = true)]
async fn a_vanished_holder_keeps_the_key_for_ttl_plus_delay() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    let grant = acquired(&backend, &request(a)).await?;
    // The server keeps the key for ttl + delay...
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("no lease after the grant")?;
    assert_eq!(info.ttl_left, Some(MS(3_000)));
    // ...while the holder's validity counts from the ttl.
    assert!(grant.valid_until <= grant.sent_at + ttl().get());

    advance(MS(500)).await;
    let renew = RenewRequest::new(key(), a, ttl()).with_lock_delay(delay());
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
    let renewed_at = Instant::now();
    let info = backend
        .inspect(&key())
        .await?
        .ok_or("no lease after renewal")?;
    assert_eq!(info.ttl_left, Some(MS(3_000)));

    // The holder vanishes. Past its ttl, the key is still taken, and
    // another holder is told how long it still lives.
    advance(MS(1_500)).await;
    assert_eq!(held(&backend, &request(b)).await?.ttl_left, Some(MS(1_500)));
    tokio::time::sleep_until(renewed_at + MS(2_999)).await;
    assert_eq!(held(&backend, &request(b)).await?.ttl_left, Some(MS(1)));
    // At ttl + delay after the renewal it is free.
    advance(MS(1)).await;
    let next = acquired(&backend, &request(b)).await?;
    assert!(next.fencing_token > grant.fencing_token);
    Ok(())
}

/// A release frees the key at once, lock-delay or not.
#[tokio::test(start_paused = true)]
async fn a_release_frees_the_key_at_once() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    acquired(&backend, &request(a)).await?;
    assert_eq!(
        backend.release(&key(), &a).await?.outcome(),
        ReleaseOutcome::Released
    );
    assert_eq!(backend.inspect(&key()).await?, None);
    acquired(&backend, &request(b)).await?;
    Ok(())
}

/// Without a lock-delay the key lives for the ttl alone, as before.
#[tokio::test(start_paused = true)]
async fn zero_delay_keeps_the_key_for_the_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    let plain = AcquireRequest::new(key(), a, ttl());
    assert_eq!(plain.lock_delay, LockDelay::ZERO);
    acquired(&backend, &plain).await?;
    let info = backend.inspect(&key()).await?.ok_or("no lease")?;
    assert_eq!(info.ttl_left, Some(ttl().get()));
    advance(ttl().get()).await;
    acquired(&backend, &AcquireRequest::new(key(), b, ttl())).await?;
    Ok(())
}

/// A re-acquire, a permit and a handover keep their keys for ttl + delay
/// too; a renewal batch mixing delays keeps each lease's own.
#[tokio::test(start_paused = true)]
async fn every_grant_and_renewal_uses_the_leases_own_delay() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (HolderId::generate()?, HolderId::generate()?);
    acquired(&backend, &request(a)).await?;
    advance(MS(400)).await;
    acquired(&backend, &request(a)).await?;
    let ttl_left = |info: Option<LeaseInfo>| info.and_then(|i| i.ttl_left);
    assert_eq!(ttl_left(backend.inspect(&key()).await?), Some(MS(3_000)));

    // A handover to a waiter with a delay.
    match backend.release_to(&key(), &a, &request(b)).await? {
        HandoverOutcome::HandedOver(_) => {}
        other => return Err(format!("expected a handover, got {other:?}").into()),
    }
    assert_eq!(ttl_left(backend.inspect(&key()).await?), Some(MS(3_000)));

    // A permit with a delay.
    let semaphore = LeaseKey::new("sem")?;
    let permit_request = AcquireRequest::new(semaphore, a, ttl()).with_lock_delay(delay());
    let AcquireOutcome::Acquired(permit) = backend
        .try_acquire_permit(&permit_request, PermitLimit::new(1)?)
        .await?
    else {
        return Err("a free permit must be granted".into());
    };
    assert_eq!(
        ttl_left(backend.inspect(&permit.key).await?),
        Some(MS(3_000))
    );
    // Taken again by its holder: refreshed to ttl + delay.
    advance(MS(400)).await;
    backend
        .try_acquire_permit(&permit_request, PermitLimit::new(1)?)
        .await?;
    assert_eq!(
        ttl_left(backend.inspect(&permit.key).await?),
        Some(MS(3_000))
    );

    // One batch: the lease with its delay, the permit without one.
    advance(MS(100)).await;
    let outcomes = backend
        .renew_many(&[
            RenewRequest::new(key(), b, ttl()).with_lock_delay(delay()),
            RenewRequest::new(permit.key.clone(), a, ttl()),
        ])
        .await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(RenewOutcome::Renewed)))
    );
    assert_eq!(ttl_left(backend.inspect(&key()).await?), Some(MS(3_000)));
    assert_eq!(
        ttl_left(backend.inspect(&permit.key).await?),
        Some(MS(1_000))
    );
    Ok(())
}

/// A read-write share taken with a lock-delay is kept for ttl + delay, and
/// a re-take by its own holder keeps it as long: a writer is refused until
/// the reader's key has been gone that long.
#[tokio::test(start_paused = true)]
async fn a_share_is_kept_for_ttl_plus_delay() -> TestResult {
    let backend = MemoryBackend::new();
    let (r, w) = (HolderId::generate()?, HolderId::generate()?);
    let reader = match backend.try_acquire_read(&request(r)).await? {
        AcquireOutcome::Acquired(grant) => grant,
        other => return Err(format!("reader not granted: {other:?}").into()),
    };
    advance(MS(500)).await;
    // The holder's own re-take refreshes the share for ttl + delay.
    assert!(matches!(
        backend.try_acquire_read(&request(r)).await?,
        AcquireOutcome::Acquired(_)
    ));
    advance(MS(2_999)).await;
    assert!(
        matches!(
            backend.try_acquire_write(&request(w)).await?,
            AcquireOutcome::Held(_)
        ),
        "the reader's share must be kept for ttl + delay after its re-take"
    );
    assert_eq!(reader.key, key().reader_key(&r)?);
    advance(MS(1)).await;
    assert!(
        matches!(
            backend.try_acquire_write(&request(w)).await?,
            AcquireOutcome::Acquired(_)
        ),
        "the share must be gone at ttl + delay"
    );
    Ok(())
}
