//! Counting leases (semaphores): `permit.lua`.

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, LeaseBackend, PermitBackend, PermitLimit,
};
use tokio::time::Instant;

use super::{RedisBackend, exclusive_only};
use crate::reply::{self, Permitted};
use crate::scripts;

impl PermitBackend for RedisBackend {
    /// One `permit.lua` call (two when the semaphore is stored with a
    /// larger limit than asked, whose permits must be checked too), over
    /// the connection and with the replica acknowledgement of
    /// [`try_acquire`](Self::try_acquire).
    async fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_permit";
        exclusive_only(OP, request)?;
        if let Some(notices) = &self.shared.notices
            && notices.needs_restore()
        {
            // As in try_acquire.
            Box::pin(notices.restore()).await;
        }
        let layout = &self.shared.layout;
        let mut check = 0;
        // A stored limit that grows between the calls is checked again;
        // one that keeps growing is given up on.
        for _ in 0..3 {
            let call = scripts::permit(layout, request, limit, check).map_err(|_| {
                BackendError::Unsupported {
                    op: OP,
                    key: request.key.as_str().to_owned(),
                    reason: "a semaphore key must leave room for its permits' keys (\"{key}:permit:99\" within 512 bytes); choose a shorter key",
                }
            })?;
            let route = self
                .lease_writes(true, || layout.permit_limit(&request.key))
                .await
                .map_err(|f| f.for_key(OP, &request.key))?;
            let sent_at = Instant::now();
            let reply = self
                .eval_write(&call, route, self.shared.wait)
                .await
                .map_err(|f| f.for_key(OP, &request.key))?;
            let sent = limit.get().max(check);
            match reply::permitted(request, sent, sent_at, &reply.value)
                .map_err(|f| f.for_key(OP, &request.key))?
            {
                Permitted::Outcome(AcquireOutcome::Acquired(grant)) => {
                    if let Some(failure) = self.missing_ack(&reply, "; the permit was given back") {
                        // As in try_acquire: give back a grant a failover could lose.
                        let _ = self.release(&grant.key, &request.holder).await;
                        return Err(failure.for_key(OP, &request.key));
                    }
                    return Ok(AcquireOutcome::Acquired(grant));
                }
                Permitted::Outcome(held) => return Ok(held),
                Permitted::Check(held) if held > check && held <= PermitLimit::MAX => {
                    check = held;
                }
                // A limit above what this library accepts: held under it
                // or not, it is not the limit asked for.
                Permitted::Mismatch(held) | Permitted::Check(held) => {
                    return Err(BackendError::PermitLimitMismatch {
                        key: request.key.as_str().to_owned(),
                        asked: limit.get(),
                        held,
                    });
                }
            }
        }
        Err(BackendError::UnexpectedReply {
            op: OP,
            key: request.key.as_str().to_owned(),
            detail: "the semaphore's stored permit limit kept changing; try again".to_owned(),
        })
    }
}
