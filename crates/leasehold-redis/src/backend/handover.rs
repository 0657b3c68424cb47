//! Handover to a local waiter: `handover.lua`.

use leasehold_core::{
    AcquireRequest, BackendError, HandoverBackend, HandoverOutcome, HolderId, LeaseBackend,
    LeaseKey, ReleaseReport,
};
use tokio::time::Instant;

use super::RedisBackend;
use crate::reply;
use crate::scripts;

impl HandoverBackend for RedisBackend {
    /// One `handover.lua` call: hands over only while the key's release
    /// channel has no subscriber but this backend's own single watch. A
    /// deployment without notices never hands over (a waiter elsewhere
    /// would poll unseen and could be overtaken for ever): it releases. Nor
    /// does one that waits for replicas, whose grants must be acknowledged.
    async fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> Result<HandoverOutcome, BackendError> {
        const OP: &str = "release";
        let Some(notices) = self
            .shared
            .notices
            .as_ref()
            // A share of a read-write lease is never handed over: its
            // grant is decided against the lease's other shares.
            .filter(|_| next.key == *key && self.shared.wait.is_none() && key.rw_of().is_none())
        else {
            return Ok(match self.release(key, holder).await? {
                ReleaseReport::Released { .. } => HandoverOutcome::Released,
                ReleaseReport::NotHeld => HandoverOutcome::NotHeld,
            });
        };
        // handover.lua marks a grant with a minimum hold for `next`: its
        // release must read the mark, as an acquisition's (holds.rs).
        if let Some(minimum) = next.hold_at_least {
            self.shared
                .holds
                .asked(&next.key, &next.holder, minimum, self.shared.op_timeout);
        }
        let own = notices.own_listeners(&self.shared.layout.released(key));
        let call = scripts::handover(
            &self.shared.layout,
            key,
            holder,
            own,
            notices.sharded(),
            next,
        );
        let route = self
            .lease_writes(true, || self.shared.layout.lease(key))
            .await
            .map_err(|f| f.for_key(OP, key))?;
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, None)
            .await
            .map(|reply| reply.value)
            .map_err(|f| f.for_key(OP, key))?;
        // A note of `next` made here that the handover did not use is
        // dropped with the stale ones (holds.rs): forgetting it could drop
        // the note of the same holder's own acquisition.
        reply::handed_over(next, sent_at, &reply).map_err(|f| f.for_key(OP, key))
    }
}
