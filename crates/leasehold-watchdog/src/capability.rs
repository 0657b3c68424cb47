//! The backend's optional capabilities, asked for through its accessors
//! ([`LeaseBackend::permits`] and the others). A kind of lease the backend
//! lacks is refused with [`BackendError::Unsupported`]; what only helps a
//! kind along (a handover, a change feed, leaving a queue) behaves as a
//! backend without it would: nothing is handed over, nothing reported.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, FairBackend,
    FairOutcome, HandoverBackend, HandoverOutcome, HandoverWatch, HolderId, LeaseBackend, LeaseKey,
    PermitBackend, PermitLimit, PlaceTtl, ReadWriteBackend, ReleaseOutcome, ReleaseReport,
};

/// [`PermitBackend::try_acquire_permit`], refused without permits.
pub(crate) async fn acquire_permit<B: LeaseBackend>(
    backend: &B,
    request: &AcquireRequest,
    limit: PermitLimit,
) -> Result<AcquireOutcome, BackendError> {
    match backend.permits() {
        Some(permits) => permits.try_acquire_permit(request, limit).await,
        None => Err(BackendError::no_permits(&request.key)),
    }
}

/// [`ReadWriteBackend::try_acquire_read`], refused without read-write
/// leases.
pub(crate) async fn acquire_read<B: LeaseBackend>(
    backend: &B,
    request: &AcquireRequest,
) -> Result<AcquireOutcome, BackendError> {
    match backend.read_write() {
        Some(rw) => rw.try_acquire_read(request).await,
        None => Err(BackendError::no_read_write("acquire_read", &request.key)),
    }
}

/// [`ReadWriteBackend::try_acquire_write`], refused without read-write
/// leases.
pub(crate) async fn acquire_write<B: LeaseBackend>(
    backend: &B,
    request: &AcquireRequest,
) -> Result<AcquireOutcome, BackendError> {
    match backend.read_write() {
        Some(rw) => rw.try_acquire_write(request).await,
        None => Err(BackendError::no_read_write("acquire_write", &request.key)),
    }
}

/// [`ReadWriteBackend::withdraw_write_intent`]; without read-write leases
/// there is no intent to withdraw (`false`).
pub(crate) async fn withdraw_write_intent<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    holder: &HolderId,
) -> Result<bool, BackendError> {
    match backend.read_write() {
        Some(rw) => rw.withdraw_write_intent(key, holder).await,
        None => Ok(false),
    }
}

/// [`FairBackend::try_acquire_fair`], refused without a fair queue.
pub(crate) async fn acquire_fair<B: LeaseBackend>(
    backend: &B,
    request: &AcquireRequest,
    place_ttl: PlaceTtl,
    handover: Option<Duration>,
) -> Result<FairOutcome, BackendError> {
    match backend.fair() {
        Some(fair) => fair.try_acquire_fair(request, place_ttl, handover).await,
        None => Err(BackendError::no_fair_queue(&request.key)),
    }
}

/// [`FairBackend::release_fair`]; without a fair queue, a plain release.
pub(crate) async fn release_fair<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    holder: &HolderId,
) -> Result<ReleaseOutcome, BackendError> {
    match backend.fair() {
        Some(fair) => fair.release_fair(key, holder).await,
        None => Ok(backend.release(key, holder).await?.outcome()),
    }
}

/// [`FairBackend::watch_handover`]; without a fair queue, nothing is
/// handed over.
pub(crate) async fn watch_handover<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    holder: &HolderId,
) -> Result<HandoverWatch, BackendError> {
    match backend.fair() {
        Some(fair) => fair.watch_handover(key, holder).await,
        None => Ok(HandoverWatch::unsupported()),
    }
}

/// [`FairBackend::leave_fair_queue`]; without a fair queue, no place to
/// leave.
pub(crate) async fn leave_fair_queue<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    holder: &HolderId,
) -> Result<(), BackendError> {
    match backend.fair() {
        Some(fair) => fair.leave_fair_queue(key, holder).await,
        None => Ok(()),
    }
}

/// [`HandoverBackend::release_to`]; without handover, a plain release.
pub(crate) async fn release_to<B: LeaseBackend>(
    backend: &B,
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

/// [`ChangeBackend::watch_changes`]; without a change feed, nothing is
/// reported and holders learn of a loss at their next renewal.
pub(crate) async fn watch_changes<B: LeaseBackend>(
    backend: &B,
) -> Result<ChangeWatch, BackendError> {
    match backend.changes() {
        Some(changes) => changes.watch_changes().await,
        None => Ok(ChangeWatch::unsupported()),
    }
}
