//! Local handover: a release by this manager hands the lease straight to
//! the head of the key's local queue, in one backend operation.
//!
//! While it waits, the head leaves an [`Offer`] (its acquisition request and
//! a reply channel). A release of the key by this manager takes the offer
//! and calls [`HandoverBackend::release_to`], which frees the lease and grants
//! it to the offered request in the same atomic operation, unless a waiter
//! elsewhere listens for the key's release notices: that one must not be
//! overtaken, so the lease is only released and announced then, and the
//! head tries like everyone else.
//!
//! A head that gets the lease while others wait behind it leaves the next
//! head a [`Baton`]: the lease is known to be held by a holder of this
//! manager, whose release will look for an offer, so the next head offers
//! and waits without asking the backend first. The baton carries the
//! holder's release watch if it got the lease by handover; after an
//! acquisition of its own the next head subscribes anew while its offer
//! stands. The baton is only good until the next local release of the key
//! (counted in `releases`).
//!
//! [`HandoverBackend::release_to`]: leasehold_core::HandoverBackend::release_to

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use leasehold_core::{
    AcquireRequest, BackendError, Grant, HandoverOutcome, HolderId, LeaseBackend, LeaseKey,
    ReleaseOutcome, ReleaseWatch,
};
use tokio::sync::oneshot;
use tracing::debug;

/// Where a release looks for a waiting head's offer: the manager's local
/// queues (queue.rs), which keep each key's [`Handoff`] beside its queue.
/// A trait, so that the handover knows nothing of how waiters queue.
pub(crate) trait Waiters: Send + Sync {
    /// The handover state of `key`, if anyone waits for it here.
    fn handoff(&self, key: &LeaseKey) -> Option<Arc<Handoff>>;

    /// Notes that this manager released `key` and a waiter elsewhere heard.
    fn note_heard(&self, key: &LeaseKey);
}

impl<W: Waiters + ?Sized> Waiters for Arc<W> {
    fn handoff(&self, key: &LeaseKey) -> Option<Arc<Handoff>> {
        (**self).handoff(key)
    }

    fn note_heard(&self, key: &LeaseKey) {
        (**self).note_heard(key);
    }
}

/// A waiting head's request, left for a local release to grant.
pub(crate) struct Offer {
    request: AcquireRequest,
    reply: oneshot::Sender<Grant>,
}

/// What a head that got the lease leaves the next head.
pub(crate) struct Baton {
    /// The holder's release watch, if it got the lease by handover.
    pub(crate) watch: Option<ReleaseWatch>,
    /// The key's local release count when the holder got the lease.
    pub(crate) releases: u64,
}

/// One key's handover state, kept beside its local queue.
#[derive(Default)]
pub(crate) struct Handoff {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    offer: Option<Offer>,
    /// Local releases of the key so far.
    releases: u64,
    baton: Option<Baton>,
}

/// Where an offer stands once its head stops waiting on it.
pub(crate) enum Withdrawn {
    /// Still unclaimed: taken back.
    Unclaimed,
    /// A release took it: its answer is on the way.
    Claimed,
}

impl Handoff {
    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a field store or take.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leaves `request` for the next local release. With a baton, only if
    /// no local release happened since the baton was made (the lease may be
    /// free then, and no release would come to take the offer): `None`.
    pub(crate) fn offer(
        &self,
        request: &AcquireRequest,
        baton: Option<u64>,
    ) -> Option<oneshot::Receiver<Grant>> {
        let mut state = self.state();
        if baton.is_some_and(|releases| releases != state.releases) {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        state.offer = Some(Offer {
            request: request.clone(),
            reply,
        });
        Some(answer)
    }

    /// Takes the head's offer back, if no release has claimed it yet.
    pub(crate) fn withdraw(&self) -> Withdrawn {
        match self.state().offer.take() {
            Some(_) => Withdrawn::Unclaimed,
            None => Withdrawn::Claimed,
        }
    }

    /// Counts a local release and takes the offer, if a head left one.
    fn claim(&self) -> Option<Offer> {
        let mut state = self.state();
        state.releases = state.releases.wrapping_add(1);
        state.offer.take().filter(|o| !o.reply.is_closed())
    }

    /// Leaves a baton (with `watch`, if any) for the next head, good until
    /// the next local release (the holder that passes it holds the lease now).
    pub(crate) fn pass_baton(&self, watch: Option<ReleaseWatch>) {
        let mut state = self.state();
        let releases = state.releases;
        state.baton = Some(Baton { watch, releases });
    }

    /// The baton the previous head left, if any.
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        self.state().baton.take()
    }
}

/// Releases `key` for `holder`, handing it to the local head's offer if
/// there is one (see the module documentation).
///
/// If the head left while the handover was in flight, the lease it was
/// given is released here, so none is left behind.
pub(crate) async fn release<B: LeaseBackend, W: Waiters + ?Sized>(
    backend: &B,
    queues: &W,
    key: &LeaseKey,
    holder: &HolderId,
    fair: bool,
) -> Result<ReleaseOutcome, BackendError> {
    if fair {
        // Fair mode's turns are the server's queue: the release hands the
        // lease to its head there, never to a local waiter.
        // Boxed, as the handover below is: the plain release is the
        // common case, and a release's future is boxed by the handle
        // (home.rs), so the rarer branches' states would make every
        // release's allocation larger (past the allocator's small-size
        // caches).
        return Box::pin(crate::capability::release_fair(backend, key, holder)).await;
    }
    // A permit is never handed over: its key's waiters here (if any) wait
    // for an exclusive lease of that name, not for a permit.
    let handoff = queues.handoff(key).filter(|_| key.permit_of().is_none());
    let Some(offer) = handoff.and_then(|h| h.claim()) else {
        let report = backend.release(key, holder).await?;
        if report.heard() {
            queues.note_heard(key);
        }
        return Ok(report.outcome());
    };
    // Dropping the offer's reply unanswered tells the head to try itself.
    match Box::pin(crate::capability::release_to(
        backend,
        key,
        holder,
        &offer.request,
    ))
    .await?
    {
        HandoverOutcome::HandedOver(grant) => {
            if let Err(grant) = offer.reply.send(grant) {
                debug!(%key, "the waiter left during the handover; releasing its lease");
                let _ = backend.release(&grant.key, &grant.holder).await;
            }
            Ok(ReleaseOutcome::Released)
        }
        HandoverOutcome::Released => Ok(ReleaseOutcome::Released),
        HandoverOutcome::NotHeld => Ok(ReleaseOutcome::NotHeld),
    }
}
