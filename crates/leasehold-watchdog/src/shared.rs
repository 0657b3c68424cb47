//! The state a lease's handle and the watchdog share: [`Shared`], behind
//! an `Arc` in both.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{FencingToken, Grant, HolderId, LeaseKey, Ttl};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bounds::Bounds;
use crate::loss::LossReason;
use crate::metrics::Series;
use crate::record::Record;
use crate::timing::Timing;

/// State shared by the handle and the watchdog.
///
/// The watchdog keeps what it needs to send a renewal (key, holder, ttl,
/// deadline) in its own entry, so a renewal touches this only when its
/// reply comes back; the fields it reads or writes then come first, and the
/// per-renewal updates are plain atomic stores, not a lock.
#[repr(C)]
pub(crate) struct Shared {
    pub(crate) timing: Timing,
    /// Validity, renewals and ending; the validity counts from `acquired_at`.
    record: Record,
    /// The lease's name and kind in metrics, and the keys of its series
    /// (one value for every lease taken with the same options and kind).
    pub(crate) series: Arc<Series>,
    /// When the acquisition was sent: the start of the hold-time metric,
    /// and what `valid_for_ns` counts from.
    pub(crate) acquired_at: Instant,
    /// The key the user gave: the lease's own key, or the semaphore's or
    /// the read-write lease's for a permit or a share, whose key on the
    /// server [`server_key`](Self::server_key) derives from it.
    pub(crate) key: LeaseKey,
    pub(crate) fencing_token: FencingToken,
    /// Cancelled by the watchdog; the holder sees a child of it.
    pub(crate) token: CancellationToken,
    /// A maximum hold or progress window, for the few leases with one.
    pub(crate) bounds: Option<Arc<Bounds>>,
    /// The ttl in milliseconds (at most 86 400 000, see `Ttl::MAX`): four
    /// bytes rather than a 16-byte `Ttl`, which leaves room for `bounds`.
    ttl_ms: u32,
    /// Which key of `key` the lease holds on the server: two bytes in what
    /// would otherwise be the struct's padding, where a second key would
    /// cost 16.
    shape: Shape,
    /// The lease's span (`Lease::span`), while its handle lives: boxed, and
    /// only when a subscriber wants it, so that a lease costs 16 bytes here
    /// and no allocation without one. Taken out when the handle goes, so
    /// that the span closes then, whoever still holds this state.
    span: Mutex<Option<Box<tracing::Span>>>,
}

/// The kind of a lease and what it takes to name its key on the server
/// from the key the user gave (see [`Shared::server_key`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// An exclusive lease: the server key is the user's key.
    Exclusive,
    /// The permit of this index (below `PermitLimit::MAX`, 100) of the
    /// semaphore named by the user's key.
    Permit(u8),
    /// A reader's share of the read-write lease named by the user's key.
    Read,
    /// The writer's hold of the read-write lease named by the user's key.
    Write,
}

impl Shape {
    /// The key on the server of a lease of this shape on the user's `key`,
    /// held by `holder`.
    pub(crate) fn server_key(
        self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<LeaseKey, leasehold_core::InputError> {
        match self {
            Self::Exclusive => Ok(key.clone()),
            Self::Permit(index) => key.permit(u32::from(index)),
            Self::Read => key.reader_key(holder),
            Self::Write => key.writer_key(),
        }
    }
}

/// Nanoseconds from `from` to `to` (0 if `to` is earlier), saturating.
fn nanos_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
}

impl Shared {
    pub(crate) fn new(grant: &Grant, series: Arc<Series>, timing: Timing) -> Self {
        Self {
            timing,
            record: Record::new(nanos_between(grant.sent_at, grant.valid_until)),
            series,
            acquired_at: grant.sent_at,
            key: grant.key.clone(),
            fencing_token: grant.fencing_token,
            token: CancellationToken::new(),
            bounds: None,
            ttl_ms: u32::try_from(grant.ttl.as_millis()).unwrap_or(u32::MAX),
            shape: Shape::Exclusive,
            span: Mutex::new(None),
        }
    }

    /// Keeps `span` as the lease's span, unless no subscriber wants it.
    pub(crate) fn set_span(&self, span: tracing::Span) {
        if !span.is_disabled() {
            *self.span.lock().unwrap_or_else(PoisonError::into_inner) = Some(Box::new(span));
        }
    }

    /// The lease's span, or a disabled one (`Span::none()`) when it has none
    /// or its handle is gone.
    pub(crate) fn span(&self) -> tracing::Span {
        self.span
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_deref()
            .map_or_else(tracing::Span::none, Clone::clone)
    }

    /// Lets go of the lease's span: it closes once the work instrumented
    /// with it is done too.
    pub(crate) fn close_span(&self) {
        let span = self
            .span
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        drop(span);
    }

    /// This state for a lease of `shape` acquired as `key` (the key the
    /// user gave; the grant names the key on the server).
    pub(crate) fn with_user_key(mut self, key: LeaseKey, shape: Shape) -> Self {
        self.key = key;
        self.shape = shape;
        self
    }

    /// The lease's key on the server, as granted to `holder`: the user's
    /// key for an exclusive lease, else the permit or share key derived
    /// from it as the acquisition did.
    pub(crate) fn server_key(&self, holder: &HolderId) -> LeaseKey {
        // The acquisition checked that this derives the granted key (see
        // `LeaseManager::register`), so it cannot fail; the user's key
        // stands in (a release of it for this holder deletes nothing of
        // another's).
        self.shape
            .server_key(&self.key, holder)
            .unwrap_or_else(|_| self.key.clone())
    }

    /// The lease's name in metrics and logs.
    pub(crate) fn name(&self) -> &std::borrow::Cow<'static, str> {
        &self.series.name
    }

    /// This state for a lease with a maximum hold or a progress window.
    pub(crate) fn with_bounds(mut self, bounds: Option<Arc<Bounds>>) -> Self {
        self.bounds = bounds;
        self
    }

    /// The lease's ttl.
    pub(crate) fn ttl(&self) -> Ttl {
        // Taken from a valid `Ttl`, so always valid again.
        Ttl::new(Duration::from_millis(u64::from(self.ttl_ms))).unwrap_or(Ttl::DEFAULT)
    }

    /// Records a successful renewal (see [`Record::renewed`]).
    pub(crate) fn renewed(&self, valid_until: Instant) {
        self.record
            .renewed(nanos_between(self.acquired_at, valid_until));
    }

    /// Records the reason first, so that whoever wakes on the token sees it.
    /// The first reason wins.
    pub(crate) fn end(&self, reason: LossReason) -> bool {
        if !self.record.end(reason) {
            return false;
        }
        self.token.cancel();
        true
    }

    /// Takes the release on the handle, unless the lease ended already. From
    /// then on the watchdog's [`end`](Self::end) does nothing: the token is
    /// not cancelled and no loss is counted for a lease being released.
    pub(crate) fn claim_release(&self) -> bool {
        self.record.claim_release()
    }

    /// Whether the lease is held: not ended, not being released, and its
    /// token has not fired.
    pub(crate) fn is_held(&self) -> bool {
        self.record.is_running() && !self.token.is_cancelled()
    }

    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.record.loss()
    }

    /// This state for a lease taken in fair mode (when `fair`).
    pub(crate) fn with_fair(mut self, fair: bool) -> Self {
        self.record = self.record.with_fair(fair);
        self
    }

    /// Whether the lease was taken in fair mode (and so is released by
    /// `FairBackend::release_fair`).
    pub(crate) fn fair(&self) -> bool {
        self.record.fair()
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.acquired_at + Duration::from_nanos(self.record.valid_for_ns())
    }

    pub(crate) fn renewals(&self) -> u32 {
        self.record.renewals()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::{AcquireRequest, HolderId, MemoryBackend};

    /// A lease whose handle took the release on itself: a loss the watchdog
    /// sees afterwards (a renewal that crossed the release) is not one.
    #[tokio::test(start_paused = true)]
    async fn a_claimed_release_ignores_later_losses() -> Result<(), Box<dyn std::error::Error>> {
        let backend = MemoryBackend::new();
        let key = LeaseKey::new("claimed")?;
        let request = AcquireRequest::new(key, HolderId::generate()?, Ttl::parse("3s")?);
        let grant = match leasehold_core::LeaseBackend::try_acquire(&backend, &request).await? {
            leasehold_core::AcquireOutcome::Acquired(grant) => grant,
            other => return Err(format!("not acquired: {other:?}").into()),
        };
        let timing = Timing::new(Duration::from_secs(1), Duration::from_millis(300), None);
        let series = |name: &'static str| {
            Arc::new(Series::new(name.into(), crate::metrics::Kind::Exclusive))
        };
        let shared = Shared::new(&grant, series("claimed"), timing);
        assert!(shared.claim_release());
        assert!(!shared.end(LossReason::Lost));
        assert!(!shared.token.is_cancelled());
        assert_eq!(shared.loss(), None);
        // Only one release is taken.
        assert!(!shared.claim_release());

        // A lease that ended first is not claimed: its handle asks the
        // watchdog, which kept the entry.
        let ended = Shared::new(&grant, series("ended"), timing);
        assert!(ended.end(LossReason::Deadline));
        assert!(!ended.claim_release());
        assert_eq!(ended.loss(), Some(LossReason::Deadline));
        Ok(())
    }
}
