//! Fair mode: `fair.lua`, `release_fair.lua` and `fair_leave.lua`, and
//! the handovers to a queue's head.

use std::time::Duration;

use leasehold_core::{
    AcquireRequest, BackendError, FairBackend, FairOutcome, HandoverWatch, HolderId, LeaseBackend,
    LeaseKey, PlaceTtl, ReleaseOutcome, ReleaseReport,
};
use tokio::time::Instant;

use super::{RedisBackend, WriteRoute, exclusive_only, not_a_share};
use crate::notices::Notices;
use crate::reply;
use crate::scripts;

impl FairBackend for RedisBackend {
    /// One `fair.lua` call (see `fair.rs`), over the connection and with
    /// the replica acknowledgement of [`try_acquire`](Self::try_acquire).
    /// A handover is asked for only once this backend listens for
    /// handovers (`watch_handover` drew its process name, which it does only
    /// with release notices and no replicas to wait for): a handover no one
    /// can hear would only hold the lease until the place call's handover
    /// time ran out.
    async fn try_acquire_fair(
        &self,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        handover: Option<Duration>,
    ) -> Result<FairOutcome, BackendError> {
        const OP: &str = "acquire_fair";
        not_a_share(OP, &request.key)?;
        exclusive_only(OP, request)?;
        if let Some(notices) = &self.shared.notices
            && notices.needs_restore()
        {
            // As in try_acquire.
            Box::pin(notices.restore()).await;
        }
        let route = self
            .lease_writes(true, || self.shared.layout.lease(&request.key))
            .await
            .map_err(|f| f.for_key(OP, &request.key))?;
        let tracked = matches!(route, WriteRoute::Tracked { .. });
        // Where the handover is announced: this backend's own channel.
        let process = self.shared.notices.as_ref().and_then(Notices::process);
        let handover = handover
            .zip(process)
            .map_or((0, &[][..]), |(hold, process)| {
                // The key is kept for the lock-delay beyond the validity, as
                // for any grant.
                let kept = hold.min(request.ttl.get()) + request.lock_delay.get();
                let kept = u64::try_from(kept.as_millis()).unwrap_or(u64::MAX).max(1);
                (kept, &process[..])
            });
        let call = scripts::fair(
            &self.shared.layout,
            request,
            tracked,
            place_ttl.as_millis(),
            handover,
        );
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, self.shared.wait)
            .await
            .map_err(|f| f.for_key(OP, &request.key))?;
        let outcome = crate::fair::outcome(request, sent_at, &reply.value)
            .map_err(|f| f.for_key(OP, &request.key))?;
        if matches!(outcome, FairOutcome::Acquired { .. })
            && let Some(failure) = self.missing_ack(&reply, "; the lease was given back")
        {
            // As in try_acquire: give back a grant a failover could lose.
            let _ = self.release(&request.key, &request.holder).await;
            return Err(failure.for_key(OP, &request.key));
        }
        Ok(outcome)
    }

    /// One `release_fair.lua` call, on the connection releases take: a
    /// notice names the new holder when the queue's head got the lease.
    async fn release_fair(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseOutcome, BackendError> {
        const OP: &str = "release";
        if key.permit_of().is_some() || key.rw_of().is_some() {
            // Fair mode queues exclusive leases only.
            return Ok(self.release(key, holder).await?.outcome());
        }
        // No `own_subscription` mark, as `release` sets: a release that
        // hands over announces nothing on `P:released`, so the mark would
        // wait there to drop the next process's notice instead.
        let notices = self.shared.notices.as_ref();
        let call = scripts::release_fair(
            &self.shared.layout,
            key,
            holder,
            notices.is_some(),
            notices.is_some_and(Notices::sharded),
        );
        let route = self
            .lease_writes(false, || self.shared.layout.lease(key))
            .await
            .map_err(|f| f.for_key(OP, key))?;
        let reply = self
            .eval_write(&call, route, None)
            .await
            .map_err(|f| f.for_key(OP, key))?;
        reply::release_report(&reply.value)
            .map(ReleaseReport::outcome)
            .map_err(|f| f.for_key(OP, key))
    }

    /// Listens on the backend's subscription connection (the waiter's
    /// release watch keeps the lease's channel subscribed); without release
    /// notices nothing is handed over, and the watch is unsupported.
    async fn watch_handover(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<HandoverWatch, BackendError> {
        match &self.shared.notices {
            Some(notices) if self.shared.wait.is_none() => notices
                .watch_handover(self.shared.layout.released(key), holder)
                .await
                .map_err(|f| f.for_key("watch_handover", key)),
            _ => Ok(HandoverWatch::unsupported()),
        }
    }

    async fn leave_fair_queue(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<(), BackendError> {
        let call = scripts::fair_leave(&self.shared.layout, key, holder);
        self.eval(&call)
            .await
            .map(drop)
            .map_err(|f| f.for_key("leave_fair_queue", key))
    }
}
