//! The holder's handle on a lease.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{FencingToken, Grant, HolderId, LeaseKey, ReleaseOutcome, Ttl};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::LeaseError;
use crate::home::{Home, OrphanGuard};
use crate::loss::LossReason;
use crate::record::Record;
use crate::renewal::{Command, Registry, Timing};

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
    pub(crate) name: std::borrow::Cow<'static, str>,
    /// When the acquisition was sent: the start of the hold-time metric,
    /// and what `valid_for_ns` counts from.
    pub(crate) acquired_at: Instant,
    pub(crate) key: LeaseKey,
    pub(crate) fencing_token: FencingToken,
    pub(crate) ttl: Ttl,
    /// Cancelled by the watchdog; the holder sees a child of it.
    pub(crate) token: CancellationToken,
}

/// Nanoseconds from `from` to `to` (0 if `to` is earlier), saturating.
fn nanos_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
}

impl Shared {
    pub(crate) fn new(grant: &Grant, name: std::borrow::Cow<'static, str>, timing: Timing) -> Self {
        Self {
            timing,
            record: Record::new(nanos_between(grant.sent_at, grant.valid_until)),
            name,
            acquired_at: grant.sent_at,
            key: grant.key.clone(),
            fencing_token: grant.fencing_token,
            ttl: grant.ttl,
            token: CancellationToken::new(),
        }
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

    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.record.loss()
    }

    /// This state for a lease taken in fair mode (when `fair`).
    pub(crate) fn with_fair(mut self, fair: bool) -> Self {
        self.record = self.record.with_fair(fair);
        self
    }

    /// Whether the lease was taken in fair mode (and so is released by
    /// `LeaseBackend::release_fair`).
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

/// A held lease.
///
/// The watchdog renews it in the background until it is released. Watch
/// [`token`](Self::token): it is cancelled, with a [`LossReason`], before the
/// lease can be taken by anyone else. Pass
/// [`fencing_token`](Self::fencing_token) to the stores you write to.
///
/// Dropping a `Lease` releases it in the background; prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "dropping a Lease releases it at once"]
pub struct Lease {
    shared: Arc<Shared>,
    id: u64,
    holder: HolderId,
    /// `None` once released: dropping it then does nothing.
    home: Option<Arc<Home>>,
}

impl Lease {
    pub(crate) fn new(shared: Arc<Shared>, id: u64, holder: HolderId, home: Arc<Home>) -> Self {
        Self {
            shared,
            id,
            holder,
            home: Some(home),
        }
    }

    /// The lease key.
    #[must_use]
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// The lease's name in metrics and logs.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The fencing token of this acquisition: strictly greater than that of
    /// every earlier acquisition of the key.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.fencing_token
    }

    /// The lease's ttl.
    #[must_use]
    pub fn ttl(&self) -> Ttl {
        self.shared.ttl
    }

    /// A token cancelled when the lease ends for any reason other than
    /// [`release`](Self::release). Each call returns a new child of the
    /// lease's own token: cancelling it yourself affects neither the lease
    /// nor the tokens of other calls.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        // A child made on demand rather than one kept in the handle: a
        // manager may hold a million leases, and a token node is ~130 bytes.
        self.shared.token.child_token()
    }

    /// Until when, on this process's monotonic clock, the lease is certainly
    /// held, as of the last successful renewal.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// How many times the watchdog has renewed the lease.
    #[must_use]
    pub fn renewals(&self) -> u32 {
        self.shared.renewals()
    }

    /// Why the lease ended, once its token has been cancelled.
    #[must_use]
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Waits until the lease ends and says why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits on the token.
    pub async fn lost(&self) -> LossReason {
        self.shared.token.cancelled().await;
        // `end` records the reason before cancelling the token.
        self.shared.loss().unwrap_or(LossReason::Lost)
    }

    /// Stops renewing and frees the lease on the server (compare-and-delete),
    /// so a waiter can take it at once.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] when the server could not be reached (the
    /// lease then expires by itself within its ttl), and
    /// [`LeaseError::ManagerStopped`] after the manager has shut down (which
    /// released every lease).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the release still happens in the background.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LeaseError> {
        let Some(home) = self.home.take() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if !self.shared.claim_release() {
            // The watchdog ended the lease (lost, capped, past its deadline,
            // or shut down) and keeps its entry until the handle lets go:
            // it releases what may be left.
            let (reply, answer) = oneshot::channel();
            home.commands
                .send(Command::Release {
                    id: self.id,
                    reply: Some(reply),
                })
                .map_err(|_| LeaseError::ManagerStopped)?;
            return answer.await.map_err(|_| LeaseError::ManagerStopped)?;
        }
        // Ours to release, here. The watchdog is told to forget the lease
        // once the release is over (or dropped), not before: waking its task
        // first would put it ahead of the release's own round trip. A
        // renewal meanwhile finds the lease gone (or handed over) and is
        // ignored, as the release is claimed. If the watchdog is gone, the
        // lease is still ours on the server and is released all the same.
        let _forget = Forget {
            registry: &home.registry,
            id: self.id,
        };
        crate::metrics::ended(
            &self.shared.name,
            &self.shared.key,
            "released",
            self.shared.acquired_at.elapsed(),
        );
        let key = &self.shared.key;
        // A release future dropped in flight hands the release to the
        // watchdog, as a dropped handle does.
        let mut abandoned = OrphanGuard {
            commands: &home.commands,
            key,
            holder: self.holder,
            armed: true,
            permits: None,
            share: None,
        };
        let span = debug_span!("release", key = %key, name = %self.shared.name);
        let outcome = home
            .release(key, &self.holder, self.shared.fair())
            .instrument(span)
            .await;
        abandoned.armed = false;
        if let Err(error) = &outcome {
            debug!(%key, %error, "release failed; the lease expires by itself");
        }
        outcome.map_err(LeaseError::from)
    }
}

/// Tells the watchdog to forget a lease whose release the handle ran,
/// when dropped: after the release, whether it finished or was abandoned.
struct Forget<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.registry.forget(self.id);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // Never blocks: the watchdog does the release. If it is gone the
            // manager has shut down and released everything already.
            let _ = home.commands.send(Command::Release {
                id: self.id,
                reply: None,
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.shared.key)
            .field("name", &self.shared.name)
            .field("fencing_token", &self.shared.fencing_token)
            .field("ttl", &self.shared.ttl)
            .field("renewals", &self.renewals())
            .field("loss", &self.loss_reason())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::{AcquireRequest, MemoryBackend};

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
        let shared = Shared::new(&grant, "claimed".into(), timing);
        assert!(shared.claim_release());
        assert!(!shared.end(LossReason::Lost));
        assert!(!shared.token.is_cancelled());
        assert_eq!(shared.loss(), None);
        // Only one release is taken.
        assert!(!shared.claim_release());

        // A lease that ended first is not claimed: its handle asks the
        // watchdog, which kept the entry.
        let ended = Shared::new(&grant, "ended".into(), timing);
        assert!(ended.end(LossReason::Deadline));
        assert!(!ended.claim_release());
        assert_eq!(ended.loss(), Some(LossReason::Deadline));
        Ok(())
    }
}
