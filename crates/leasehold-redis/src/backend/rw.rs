//! Read-write leases: `read.lua`, `write.lua` and `withdraw.lua`.

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseKey,
    ReadWriteBackend,
};
use tokio::time::Instant;

use super::{RedisBackend, exclusive_only, not_a_share, too_long};
use crate::reply;
use crate::scripts;

impl ReadWriteBackend for RedisBackend {
    /// One `read.lua` call, over the connection and with the replica
    /// acknowledgement of [`try_acquire`](Self::try_acquire).
    async fn try_acquire_read(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_read";
        not_a_share(OP, &request.key)?;
        exclusive_only(OP, request)?;
        let reader = request
            .key
            .reader_key(&request.holder)
            .map_err(|_| too_long(OP, &request.key))?;
        let call = scripts::read(&self.shared.layout, request, &reader);
        self.acquire_share(OP, request, reader, call).await
    }

    /// One `write.lua` call, as [`try_acquire_read`](Self::try_acquire_read).
    async fn try_acquire_write(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_write";
        not_a_share(OP, &request.key)?;
        exclusive_only(OP, request)?;
        let writer = request
            .key
            .writer_key()
            .map_err(|_| too_long(OP, &request.key))?;
        let call = scripts::write(&self.shared.layout, request);
        self.acquire_share(OP, request, writer, call).await
    }

    /// One `withdraw.lua` call (compare-and-delete of `P:write-wanted`).
    async fn withdraw_write_intent(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<bool, BackendError> {
        const OP: &str = "withdraw_write_intent";
        not_a_share(OP, key)?;
        let call = scripts::withdraw(&self.shared.layout, key, holder);
        let reply = self.eval(&call).await.map_err(|f| f.for_key(OP, key))?;
        reply::deleted(&reply).map_err(|f| f.for_key(OP, key))
    }
}

impl RedisBackend {
    /// One `read.lua` or `write.lua` call for `request` (granted on the
    /// share key `share`), over the connection and with the replica
    /// acknowledgement of `try_acquire`.
    async fn acquire_share(
        &self,
        op: &'static str,
        request: &AcquireRequest,
        share: LeaseKey,
        call: scripts::Call,
    ) -> Result<AcquireOutcome, BackendError> {
        if let Some(notices) = &self.shared.notices
            && notices.needs_restore()
        {
            // As in try_acquire.
            Box::pin(notices.restore()).await;
        }
        let route = self
            .lease_writes(true, || self.shared.layout.lease(&share))
            .await
            .map_err(|f| f.for_key(op, &request.key))?;
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, self.shared.wait)
            .await
            .map_err(|f| f.for_key(op, &request.key))?;
        let mut granted = request.clone();
        granted.key = share;
        let outcome = reply::shared(&granted, sent_at, &reply.value)
            .map_err(|f| f.for_key(op, &request.key))?;
        if let AcquireOutcome::Acquired(grant) = &outcome
            && let Some(failure) = self.missing_ack(&reply, "; the hold was given back")
        {
            // As in try_acquire: give back a grant a failover could lose.
            let _ = self.release(&grant.key, &request.holder).await;
            return Err(failure.for_key(op, &request.key));
        }
        Ok(outcome)
    }
}
