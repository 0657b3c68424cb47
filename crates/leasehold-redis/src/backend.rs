//! [`RedisBackend`]: leases on a standalone Redis server.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    ReleaseOutcome, RenewOutcome, RenewRequest,
};
use redis::aio::ConnectionManager;
use redis::{RedisResult, ScriptInvocation, Value};
use tokio::time::Instant;

use crate::layout::KeyLayout;
use crate::reply::{self, Failure};
use crate::scripts;

/// A [`LeaseBackend`] on one standalone Redis server (or a primary with
/// replicas that it does not fail over to).
///
/// Every operation is one Lua script run atomically by the server, sent as
/// `EVALSHA` over a multiplexed connection that reconnects by itself:
/// acquire, release and inspect share one (`CLIENT SETNAME leasehold-ops`),
/// and renewals have one of their own (`leasehold-renew`), so that a flood
/// of acquisitions never queues ahead of a renewal. Cloning is cheap and
/// clones share both connections; the backend spawns no tasks of its own
/// (each connection's I/O task belongs to the redis crate).
///
/// Each operation is bounded by the op timeout (see
/// [`RedisBackendBuilder::op_timeout`](crate::RedisBackendBuilder::op_timeout)):
/// when it runs out, the operation returns [`BackendError::Timeout`] and
/// its outcome is unknown. A reply that arrives later is matched to the
/// request that asked for it and dropped, never handed to a later request.
///
/// # Cancel safety
///
/// Dropping an operation's future leaves its effect unknown, as a timeout
/// does: the request may already be on its way to the server.
#[derive(Clone)]
pub struct RedisBackend {
    shared: Arc<Shared>,
}

struct Shared {
    /// Acquire, release, inspect and force_release.
    conn: ConnectionManager,
    /// Renewals only.
    renew_conn: ConnectionManager,
    layout: KeyLayout,
    op_timeout: Duration,
    /// The server, as it may be shown: a URL without its password, or an address.
    server: String,
}

impl RedisBackend {
    pub(crate) fn from_parts(
        conn: ConnectionManager,
        renew_conn: ConnectionManager,
        layout: KeyLayout,
        op_timeout: Duration,
        server: String,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                conn,
                renew_conn,
                layout,
                op_timeout,
                server,
            }),
        }
    }

    /// The namespace every Redis key of this backend starts with.
    #[must_use]
    pub fn namespace(&self) -> &str {
        self.shared.layout.namespace()
    }

    /// Where this backend keeps each lease on the server.
    #[must_use]
    pub fn layout(&self) -> &KeyLayout {
        &self.shared.layout
    }

    /// The bound on each operation.
    #[must_use]
    pub fn op_timeout(&self) -> Duration {
        self.shared.op_timeout
    }

    /// Deletes a lease whoever holds it: an administrator's takeover.
    ///
    /// **Dangerous.** The holder is not told: its work goes on unguarded
    /// until its next renewal comes back [`RenewOutcome::Lost`], which may be
    /// up to a third of its ttl later, and meanwhile a new holder may
    /// acquire the lease. Only stores that check fencing tokens are safe
    /// from the old holder's writes; the fencing counter is kept, so the new
    /// holder's token is higher. Use it for a lease whose holder is known
    /// to be dead, or after stopping it.
    ///
    /// Returns whether there was a lease to delete.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when the server did not answer in time or could
    /// not be reached; the lease may or may not have been deleted.
    ///
    /// # Cancel safety
    ///
    /// As for every operation: dropping the future leaves the effect unknown.
    pub async fn force_release(&self, key: &LeaseKey) -> Result<bool, BackendError> {
        const OP: &str = "force_release";
        let mut del = redis::cmd("DEL");
        del.arg(self.shared.layout.lease(key));
        let mut conn = self.shared.conn.clone();
        let reply = self
            .bounded(del.query_async::<Value>(&mut conn))
            .await
            .map_err(|f| f.for_key(OP, key))?;
        reply::deleted(&reply).map_err(|f| f.for_key(OP, key))
    }

    /// Runs a request under the op timeout.
    async fn bounded(
        &self,
        request: impl Future<Output = RedisResult<Value>>,
    ) -> Result<Value, Failure> {
        let limit = self.shared.op_timeout;
        match tokio::time::timeout(limit, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(Failure::from_redis(err, limit)),
            Err(_elapsed) => Err(Failure::Timeout(limit)),
        }
    }

    /// Runs a script (`EVALSHA`, loading it on `NOSCRIPT`) under the op timeout.
    async fn eval(&self, call: &ScriptInvocation<'_>) -> Result<Value, Failure> {
        self.eval_on(&self.shared.conn, call).await
    }

    /// Runs a script on the given connection (see [`eval`](Self::eval)).
    async fn eval_on(
        &self,
        conn: &ConnectionManager,
        call: &ScriptInvocation<'_>,
    ) -> Result<Value, Failure> {
        let mut conn = conn.clone();
        self.bounded(call.invoke_async::<Value>(&mut conn)).await
    }

    /// One `renew.lua` call for at most [`scripts::RENEW_BATCH`] requests.
    async fn renew_batch(&self, batch: &[RenewRequest]) -> Vec<Result<RenewOutcome, BackendError>> {
        let call = scripts::renew(&self.shared.layout, batch);
        // Over the renewal connection: nothing else queues ahead of it.
        let outcomes = self.eval_on(&self.shared.renew_conn, &call).await;
        match outcomes.and_then(|reply| reply::renewed(batch.len(), &reply)) {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(failure) => batch
                .iter()
                .map(|r| Err(failure.for_key("renew", &r.key)))
                .collect(),
        }
    }
}

impl LeaseBackend for RedisBackend {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire";
        let call = scripts::acquire(&self.shared.layout, request);
        let sent_at = Instant::now();
        let reply = self
            .eval(&call)
            .await
            .map_err(|f| f.for_key(OP, &request.key))?;
        reply::acquired(request, sent_at, &reply).map_err(|f| f.for_key(OP, &request.key))
    }

    async fn renew(&self, request: &RenewRequest) -> Result<RenewOutcome, BackendError> {
        let mut outcomes = self.renew_batch(std::slice::from_ref(request)).await;
        match outcomes.pop() {
            Some(outcome) if outcomes.is_empty() => outcome,
            // renew_batch returns exactly one outcome per request.
            _ => Err(BackendError::UnexpectedReply {
                op: "renew",
                key: request.key.as_str().to_owned(),
                detail: "not one outcome for one renewal".to_owned(),
            }),
        }
    }

    /// Renews in one script call per 1000 leases;
    /// the calls go out together on the multiplexed connection. A call that
    /// fails gives its error to every request in it.
    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let batches = requests
            .chunks(scripts::RENEW_BATCH)
            .map(|batch| self.renew_batch(batch));
        join_all(batches).await.into_iter().flatten().collect()
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseOutcome, BackendError> {
        const OP: &str = "release";
        let call = scripts::release(&self.shared.layout, key, &holder.to_hex());
        let reply = self.eval(&call).await.map_err(|f| f.for_key(OP, key))?;
        reply::released(&reply).map_err(|f| f.for_key(OP, key))
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        const OP: &str = "inspect";
        let call = scripts::inspect(&self.shared.layout, key);
        let reply = self.eval(&call).await.map_err(|f| f.for_key(OP, key))?;
        reply::inspected(&reply).map_err(|f| f.for_key(OP, key))
    }
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.shared.server)
            .field("namespace", &self.namespace())
            .field("op_timeout", &self.shared.op_timeout)
            .finish_non_exhaustive()
    }
}
