//! [`RedisBackend`]: leases on a standalone Redis server.
//!
//! This file holds the backend and the core of the contract
//! ([`LeaseBackend`]); each optional capability is a file of its own,
//! beside its scripts: `permits.rs`, `rw.rs`, `fair.rs`, `handover.rs`,
//! `changes.rs` and `ticks.rs` (scheduled jobs' records).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use futures_util::future::join_all;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, FairBackend, HandoverBackend,
    HolderId, LeaseBackend, LeaseInfo, LeaseKey, PermitBackend, ReadWriteBackend, ReleaseReport,
    ReleaseWatch, RenewOutcome, RenewRequest, RwInfo, WatchPolicy,
};
use redis::RedisResult;
use redis::Value;
use redis::cluster_routing::Slot;
use tokio::time::Instant;

use crate::capabilities::ServerInfo;
use crate::coalesce::{Coalescer, Lane};
use crate::connection::{Conn, Reply, Wait};
use crate::holds::Holds;
use crate::layout::KeyLayout;
use crate::loads::ScriptLoads;
use crate::notices::Notices;
use crate::reply::{self, Failure};
use crate::scripts::{self, Call};
use crate::tracking::{Prelude, Tracking};
use crate::url::Topology;

mod changes;
mod fair;
mod handover;
mod permits;
mod prelude;
mod rw;
mod ticks;

/// A [`LeaseBackend`] on one standalone Redis server (or a primary with
/// replicas that it does not fail over to).
///
/// Every operation is one Lua script run atomically by the server, sent over
/// one multiplexed connection that reconnects by itself. Cloning is cheap and
/// clones share that connection; the backend spawns no tasks of its own
/// (the connection's I/O task belongs to the redis crate).
///
/// Each operation is bounded by the op timeout (see
/// [`RedisBackendBuilder::op_timeout`](crate::RedisBackendBuilder::op_timeout)):
/// when it runs out, the operation returns [`BackendError::Timeout`] and
/// its outcome is unknown. A reply that arrives later is matched to the
/// request that asked for it and dropped, never handed to a later request.
///
/// Acquisitions and releases that are in flight together share one script
/// call: one that finds no other of its kind in flight on its connection
/// (on a cluster: in its slot) is sent at once, alone; those that come
/// while it is out wait for its reply and then go out together, at most
/// 256 to a call, each with its own outcome. A waiting request gives up
/// unsent after twice the op timeout; once sent, its call is bounded by the
/// op timeout, and a call that fails gives its error to every request in
/// it. Acquisitions that wait for replicas (see
/// [`RedisBackendBuilder::wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas))
/// are sent one by one.
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
    /// force_release; inspections, acquisitions, handovers and releases
    /// too while client tracking is off.
    conn: Conn,
    /// Renewals, so that no flood of other operations (or the application's
    /// own traffic) queues ahead of them; and, while client tracking is on,
    /// the lease writes (see [`lease_writes`](RedisBackend::lease_writes)).
    /// The same connection on Sentinel.
    renew_conn: Conn,
    /// Release notices: plain channels on a standalone server and on the
    /// master the sentinels name, sharded ones on a cluster.
    notices: Option<Notices>,
    layout: KeyLayout,
    op_timeout: Duration,
    /// The server, as it may be shown: a URL without its password, or an address.
    server: String,
    wait: Option<Wait>,
    /// Client tracking on the renewal connection; standalone and Sentinel.
    tracking: Option<Arc<Tracking>>,
    /// [`WRITES_IN_FLIGHT`] places for lease writes on the renewal connection.
    write_places: tokio::sync::Semaphore,
    /// The server's name and version, as read at connect.
    server_info: Option<ServerInfo>,
    /// Acquisitions in flight together on a lane, sent as one call.
    acquires: Coalescer<AcquireRequest, Result<AcquireOutcome, BackendError>>,
    /// Releases in flight together on a lane, sent as one call.
    releases: Coalescer<scripts::Release, Result<ReleaseReport, BackendError>>,
    /// Batches (of acquisitions, renewals, releases) never cross cluster
    /// slots: on a cluster, and on a server that refuses a script whose
    /// keys hash to different slots (a cluster behind one address, as a
    /// managed service or a proxy presents it), learnt at connect from
    /// `cluster_enabled:1`, or from its first `CROSSSLOT` refusal.
    by_slot: std::sync::atomic::AtomicBool,
    /// Loads of the scripts on a server that answered `NOSCRIPT`, one at
    /// a time per server, shared by both connections (`loads.rs`).
    loads: ScriptLoads,
    /// The leases acquired with a minimum hold, whose releases alone read
    /// the hold's mark (`holds.rs`).
    holds: Holds,
}

impl RedisBackend {
    pub(crate) fn from_parts(
        conn: Conn,
        renew_conn: Conn,
        notices: Option<Notices>,
        layout: KeyLayout,
        op_timeout: Duration,
        server: String,
        wait: Option<Wait>,
    ) -> Self {
        let by_slot = std::sync::atomic::AtomicBool::new(conn.is_cluster());
        Self {
            shared: Arc::new(Shared {
                conn,
                renew_conn,
                notices,
                layout,
                op_timeout,
                server,
                wait,
                tracking: None,
                write_places: tokio::sync::Semaphore::new(WRITES_IN_FLIGHT),
                server_info: None,
                acquires: Coalescer::new(scripts::WRITE_BATCH).calls_in_flight(CALLS_IN_FLIGHT),
                releases: Coalescer::new(scripts::WRITE_BATCH).calls_in_flight(CALLS_IN_FLIGHT),
                by_slot,
                loads: ScriptLoads::new(op_timeout),
                holds: Holds::default(),
            }),
        }
    }

    /// The same backend, with up to `calls` acquisition calls, and as many
    /// release calls, in flight at once per lane (`coalesce.rs`).
    pub(crate) fn with_calls_in_flight(mut self, calls: usize) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.acquires = Coalescer::new(scripts::WRITE_BATCH).calls_in_flight(calls);
            shared.releases = Coalescer::new(scripts::WRITE_BATCH).calls_in_flight(calls);
        }
        self
    }

    /// The same backend, batching by slot from the start when `by_slot`
    /// (a server that said at connect that it is a cluster node).
    pub(crate) fn with_batches_by_slot(self, by_slot: bool) -> Self {
        if by_slot {
            self.shared
                .by_slot
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self
    }

    /// Whether batches are grouped by cluster slot (see `Shared::by_slot`).
    fn by_slot(&self) -> bool {
        self.shared
            .by_slot
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The same backend, with client tracking on its renewal connection.
    pub(crate) fn with_tracking(mut self, tracking: Option<Arc<Tracking>>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.tracking = tracking;
        }
        self
    }

    /// The same backend, with the server's name and version read at connect.
    pub(crate) fn with_server_info(mut self, info: Option<ServerInfo>) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.server_info = info;
        }
        self
    }

    /// The server's name and version as it reported them at connect
    /// (`HELLO`): on a cluster, the first node's; behind Sentinel, the
    /// master's at the time. `None` when the server did not tell (an ACL
    /// that refuses `HELLO`), or for a Redlock master not reached yet.
    #[must_use]
    pub fn server_info(&self) -> Option<&ServerInfo> {
        self.shared.server_info.as_ref()
    }

    /// Turns client tracking on right after connecting, so that the first
    /// renewal (perhaps behind a flood of acquisitions) needs no extra
    /// round trip; after a reconnection the first renewal does it.
    pub(crate) async fn start_tracking(self) -> Self {
        if let Some(tracking) = &self.shared.tracking {
            // A failure leaves it to the first renewal.
            let _ = self.track_renewals(tracking).await;
        }
        self
    }

    /// Whether the server reports changes to the leases this backend
    /// renews (see
    /// [`RedisBackendBuilder::track_lease_changes`](crate::RedisBackendBuilder::track_lease_changes)).
    /// False when it was turned off, refused by the server, not available
    /// for this topology, or turned off because the server's tracking table
    /// overflowed.
    #[must_use]
    pub fn tracks_lease_changes(&self) -> bool {
        self.shared.tracking.as_ref().is_some_and(|t| t.is_on())
    }

    /// The kind of deployment this backend talks to.
    #[must_use]
    pub fn topology(&self) -> Topology {
        match self.shared.conn {
            Conn::Standalone(_) => Topology::Standalone,
            Conn::Cluster(_) => Topology::Cluster,
            Conn::Sentinel(_) => Topology::Sentinel,
        }
    }

    /// The replica acknowledgement asked for after every acquisition and
    /// renewal, as (replicas, timeout); see
    /// [`RedisBackendBuilder::wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas).
    #[must_use]
    pub fn replica_ack(&self) -> Option<(u32, Duration)> {
        self.shared.wait.map(|w| (w.replicas, w.timeout))
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
    /// **Dangerous.** The holder is not asked: a holder whose backend tracks
    /// lease changes (see
    /// [`tracks_lease_changes`](Self::tracks_lease_changes)) learns of it
    /// within a round trip; any other works on unguarded until its next
    /// renewal comes back [`RenewOutcome::Lost`], which may be up to a third
    /// of its ttl later. Meanwhile a new holder may acquire the lease. Only stores that check fencing tokens are safe
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
        let lease = self.shared.layout.lease(key);
        let mut del = redis::cmd("DEL");
        del.arg(&lease);
        let reply = self
            .bounded(self.shared.conn.command(&del, &lease))
            .await
            .map_err(|f| f.for_key(OP, key))?;
        reply::deleted(&reply).map_err(|f| f.for_key(OP, key))
    }

    /// Reads the read-write lease `key` (as taken with
    /// [`ReadWriteBackend::try_acquire_read`] and
    /// [`ReadWriteBackend::try_acquire_write`]) at one instant: its writer, its
    /// live readers and a waiting writer's intent, each with the time the
    /// server has left for it.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when the server did not answer in time, could
    /// not be reached, or holds a key of the lease with another type.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    pub async fn inspect_rw(&self, key: &LeaseKey) -> Result<RwInfo, BackendError> {
        const OP: &str = "inspect_rw";
        let call = scripts::inspect_rw(&self.shared.layout, key);
        let reply = self.eval(&call).await.map_err(|f| f.for_key(OP, key))?;
        reply::inspected_rw(&reply).map_err(|f| f.for_key(OP, key))
    }

    /// Runs a request under the op timeout.
    async fn bounded<T>(
        &self,
        request: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, Failure> {
        let limit = self.shared.op_timeout;
        match tokio::time::timeout(limit, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => {
                // A server behind one address that refuses a batch across
                // slots: batch by slot from now on. The refused call is
                // reported as transient, and its callers' retry goes by
                // slot (a renewal's within milliseconds).
                if err.code() == Some("CROSSSLOT") && !self.by_slot() {
                    self.shared
                        .by_slot
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(
                        server = %self.shared.server,
                        "the server refused a batch across cluster slots (CROSSSLOT): batching by slot from now on"
                    );
                }
                Err(Failure::from_redis(err, limit))
            }
            Err(_elapsed) => Err(Failure::Timeout(limit)),
        }
    }

    /// Runs a script (`EVALSHA`, loading the scripts on `NOSCRIPT`) under the op timeout.
    pub(crate) async fn eval(&self, call: &Call) -> Result<Value, Failure> {
        self.bounded(self.shared.conn.eval(call, None, &self.shared.loads))
            .await
            .map(|reply| reply.value)
    }

    /// Runs a script that writes the user's data (a fenced write,
    /// `fence.rs`) over the operations connection and, under
    /// [`wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas),
    /// `WAIT`s as a grant does: a write too few replicas acknowledged
    /// fails, its outcome unknown (a failover could lose its fence).
    pub(crate) async fn eval_acked(&self, call: &Call) -> Result<Value, Failure> {
        let reply = self
            .eval_write(call, WriteRoute::Untracked, self.shared.wait)
            .await?;
        match self.missing_ack(&reply, "; the write may be lost in a failover") {
            Some(failure) => Err(failure),
            None => Ok(reply.value),
        }
    }

    /// Runs a lease write (and, with `wait`, `WAIT`s for its replicas) over
    /// the connection [`lease_writes`](Self::lease_writes) picked; its place
    /// is given back with the reply.
    async fn eval_write(
        &self,
        call: &Call,
        route: WriteRoute<'_>,
        wait: Option<Wait>,
    ) -> Result<Reply, Failure> {
        let conn = match route {
            WriteRoute::Tracked { .. } => &self.shared.renew_conn,
            WriteRoute::Untracked => &self.shared.conn,
        };
        self.bounded(conn.eval(call, wait, &self.shared.loads))
            .await
    }

    /// Where a script that writes `lease` (an acquisition, a handover, a
    /// release) goes.
    ///
    /// While client tracking is on: over the tracked renewal connection. A
    /// grant there leaves the lease tracked from the script that grants it
    /// on (over the other connection it would be unwatched until its first
    /// renewal, a third of its ttl later), and NOLOOP keeps the backend's
    /// own writes from being reported back to it (a release over the other
    /// connection would cost the server a push to the renewal connection).
    /// No round trip is added: tracking is already on for that connection
    /// except on the first call after a reconnection, which turns it on as
    /// a renewal would. At most [`WRITES_IN_FLIGHT`] writes are on that
    /// connection at a time, so that a flood of acquisitions or releases
    /// puts no more than that many scripts ahead of a renewal; the others
    /// wait here, within the op timeout.
    ///
    /// Otherwise over the other connection; the write is noted for the
    /// overflow guard, in case it is reported back.
    ///
    /// # Errors
    ///
    /// [`Failure::Timeout`] when no place came free within the op timeout.
    async fn lease_writes(
        &self,
        grants: bool,
        lease: impl FnOnce() -> String,
    ) -> Result<WriteRoute<'_>, Failure> {
        let Some(tracking) = &self.shared.tracking else {
            return Ok(WriteRoute::Untracked);
        };
        if tracking.is_on() {
            if tracking.needs_prelude() || self.shared.renew_conn.needs_resolving() {
                // Only after a reconnection. Boxed, so that every
                // acquisition future does not carry the prelude's.
                let prepared = Box::pin(self.prepare_tracked_writes(tracking)).await;
                if let Err(failure) = prepared
                    && grants
                    && tracking.is_on()
                {
                    // A grant over a connection without tracking would
                    // leave its lease unwatched: fail it, as the
                    // connection does, and let the caller try again.
                    return Err(failure);
                }
            }
            if tracking.is_on() {
                let limit = self.shared.op_timeout;
                return match tokio::time::timeout(limit, self.shared.write_places.acquire()).await {
                    Ok(Ok(place)) => Ok(WriteRoute::Tracked { _place: place }),
                    // The semaphore is never closed; a timeout sent nothing.
                    Ok(Err(_)) | Err(_) => Err(Failure::Timeout(limit)),
                };
            }
        }
        tracking.own_write(lease());
        Ok(WriteRoute::Untracked)
    }

    /// Where a read that should track its key goes: as a grant (see
    /// [`lease_writes`](Self::lease_writes)), over the tracked renewal
    /// connection while tracking is on, and failing when tracking cannot be
    /// turned on for it (a read over the other connection would leave an
    /// observer unwatched); otherwise over the operations connection.
    async fn tracked_reads(&self) -> Result<WriteRoute<'_>, Failure> {
        let Some(tracking) = &self.shared.tracking else {
            return Ok(WriteRoute::Untracked);
        };
        if !tracking.is_on() {
            return Ok(WriteRoute::Untracked);
        }
        if tracking.needs_prelude() || self.shared.renew_conn.needs_resolving() {
            let prepared = Box::pin(self.prepare_tracked_writes(tracking)).await;
            if let Err(failure) = prepared
                && tracking.is_on()
            {
                return Err(failure);
            }
        }
        if !tracking.is_on() {
            return Ok(WriteRoute::Untracked);
        }
        let limit = self.shared.op_timeout;
        match tokio::time::timeout(limit, self.shared.write_places.acquire()).await {
            Ok(Ok(place)) => Ok(WriteRoute::Tracked { _place: place }),
            // The semaphore is never closed; a timeout sent nothing.
            Ok(Err(_)) | Err(_) => Err(Failure::Timeout(limit)),
        }
    }

    /// Turns tracking on for the connection the next lease write goes over.
    /// Behind Sentinel the master is looked up first if the connection was
    /// forgotten (a call timed out, or the master moved): otherwise the
    /// prelude would turn tracking on for a new connection counted as the
    /// old generation, and a grant after it could go over yet another one,
    /// untracked. Tried twice: a prelude that failed leaves the connection
    /// forgotten again.
    ///
    /// # Errors
    ///
    /// When tracking is still not on for the connection: the last try's
    /// failure (the lookup's or the prelude's), or an unavailable
    /// connection when the last try went through and a reconnection came
    /// after it (see [`prelude::settle`]).
    async fn prepare_tracked_writes(&self, tracking: &Tracking) -> Result<(), Failure> {
        let limit = self.shared.op_timeout;
        let conn = &self.shared.renew_conn;
        prelude::settle(
            prelude::TRIES,
            || !tracking.needs_prelude() && !conn.needs_resolving(),
            || async move {
                match tokio::time::timeout(limit, conn.resolve()).await {
                    Ok(Ok(())) => self.track_renewals(tracking).await,
                    Ok(Err(error)) => Err(Failure::from_redis(error, limit)),
                    Err(_) => Err(Failure::Timeout(limit)),
                }
            },
        )
        .await
    }

    /// Runs a renewal over the renewal connection and, if configured,
    /// `WAIT`s for its replicas.
    async fn eval_renewal(&self, call: &Call) -> Result<Reply, Failure> {
        self.bounded(
            self.shared
                .renew_conn
                .eval(call, self.shared.wait, &self.shared.loads),
        )
        .await
    }

    /// The failure of a write that too few replicas acknowledged, if so.
    fn missing_ack(&self, reply: &Reply, extra: &str) -> Option<Failure> {
        let wait = self.shared.wait?;
        let acked = reply.acked?;
        (acked < i64::from(wait.replicas)).then(|| {
            Failure::NotAcknowledged(format!(
                "only {acked} of {} replica(s) acknowledged the write within {:?} (WAIT){extra}; check the replicas' links, or lower the count",
                wait.replicas, wait.timeout
            ))
        })
    }

    /// Turns client tracking on (or off) on the renewal connection when it
    /// is needed: before the first renewal on each new connection. A server
    /// that refuses it leaves tracking off; a connection that fails leaves
    /// it to the next call, and its failure is returned.
    async fn track_renewals(&self, tracking: &Tracking) -> Result<(), Failure> {
        let Some((_one_at_a_time, prelude)) = tracking.prelude().await else {
            return Ok(());
        };
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("TRACKING");
        match prelude {
            Prelude::On(_) => cmd.arg("ON").arg("NOLOOP"),
            Prelude::Off => cmd.arg("OFF"),
        };
        let limit = self.shared.op_timeout;
        match tokio::time::timeout(limit, self.shared.renew_conn.command(&cmd, "")).await {
            Ok(Ok(_)) => tracking.done(prelude),
            Ok(Err(error)) if matches!(error.kind(), redis::ErrorKind::Server(_)) => {
                tracking.refused(&error);
            }
            // Not sent, or no answer: the next call tries again.
            Ok(Err(error)) => return Err(Failure::from_redis(error, limit)),
            Err(_) => return Err(Failure::Timeout(limit)),
        }
        Ok(())
    }

    /// One `renew.lua` call for at most [`scripts::RENEW_BATCH`] requests,
    /// all in one cluster slot.
    async fn renew_batch(&self, batch: &[RenewRequest]) -> Vec<Result<RenewOutcome, BackendError>> {
        let mut tracked = false;
        if let Some(tracking) = &self.shared.tracking {
            // A failure is the renewal's too: it reports its own.
            let _ = self.track_renewals(tracking).await;
            tracking.renewing(batch);
            tracked = tracking.is_on();
        }
        let call = scripts::renew(&self.shared.layout, batch, tracked);
        let outcomes = self.eval_renewal(&call).await.and_then(|reply| {
            // An unacknowledged renewal is unknown: a failover could lose it.
            match self.missing_ack(&reply, "") {
                Some(failure) => Err(failure),
                None => Ok(reply.value),
            }
        });
        match outcomes.and_then(|reply| reply::renewed(batch.len(), &reply)) {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(failure) => batch
                .iter()
                .map(|r| Err(failure.for_key("renew", &r.key)))
                .collect(),
        }
    }
}

impl RedisBackend {
    /// The lane of `key`'s acquisitions and releases: its slot on a
    /// cluster (one script call may only touch one slot), else the one
    /// connection's.
    fn lane(&self, key: &LeaseKey) -> Lane {
        self.by_slot()
            .then(|| Slot::for_key(self.shared.layout.lease(key)))
    }

    /// One script call for a batch of requests, all in one slot
    /// (`acquire.lua` for one, `acquire_many.lua` for more):
    /// each request's outcome, in order. A call that fails gives its error
    /// to every request in it; its effect is then unknown for each.
    async fn acquire_batch(
        &self,
        batch: &[AcquireRequest],
    ) -> Vec<Result<AcquireOutcome, BackendError>> {
        const OP: &str = "acquire";
        let fail = |failure: &Failure| {
            batch
                .iter()
                .map(|r| Err(failure.for_key(OP, &r.key)))
                .collect()
        };
        let Some(first) = batch.first() else {
            return Vec::new();
        };
        let route = match self
            .lease_writes(true, || self.shared.layout.lease(&first.key))
            .await
        {
            Ok(route) => route,
            Err(failure) => return fail(&failure),
        };
        let tracked = matches!(route, WriteRoute::Tracked { .. });
        if !tracked && let Some(tracking) = &self.shared.tracking {
            for request in &batch[1..] {
                tracking.own_write(self.shared.layout.lease(&request.key));
            }
        }
        let call = scripts::acquire_many(&self.shared.layout, batch, tracked);
        let sent_at = Instant::now();
        let reply = match self.eval_write(&call, route, None).await {
            Ok(reply) => reply.value,
            Err(failure) => return fail(&failure),
        };
        if let [request] = batch {
            return vec![
                reply::acquired(request, sent_at, &reply).map_err(|f| f.for_key(OP, &request.key)),
            ];
        }
        match reply::batch(batch.len(), reply, self.shared.op_timeout) {
            Ok(items) => batch
                .iter()
                .zip(items)
                .map(|(request, item)| {
                    item.and_then(|value| reply::acquired(request, sent_at, &value))
                        .map_err(|f| f.for_key(OP, &request.key))
                })
                .collect(),
            Err(failure) => fail(&failure),
        }
    }

    /// One acquisition alone, not batched: acknowledged by the replicas
    /// when the backend waits for them (see
    /// [`RedisBackendBuilder::wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas)),
    /// and given back when too few acknowledge it; or one with a minimum
    /// hold, which only `acquire.lua` marks.
    async fn acquire_acked(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire";
        let route = self
            .lease_writes(true, || self.shared.layout.lease(&request.key))
            .await
            .map_err(|f| f.for_key(OP, &request.key))?;
        let tracked = matches!(route, WriteRoute::Tracked { .. });
        let call = scripts::acquire(&self.shared.layout, request, tracked);
        let sent_at = Instant::now();
        let reply = self
            .eval_write(&call, route, self.shared.wait)
            .await
            .map_err(|f| f.for_key(OP, &request.key))?;
        let outcome = reply::acquired(request, sent_at, &reply.value)
            .map_err(|f| f.for_key(OP, &request.key))?;
        if matches!(outcome, AcquireOutcome::Acquired(_))
            && let Some(failure) = self.missing_ack(&reply, "; the lease was given back")
        {
            // A failover now could hand the lease to a second holder: give
            // it back rather than hold it on a write that may be lost. If
            // the release fails too, the lease runs out after its ttl. A
            // minimum hold's mark goes first: the release would otherwise
            // keep the key for a minimum no holder used.
            if request.hold_at_least.is_some() {
                let unmark = scripts::unmark(&self.shared.layout, &request.key, &request.holder);
                let _ = self.eval(&unmark).await;
            }
            let _ = self.release(&request.key, &request.holder).await;
            return Err(failure.for_key(OP, &request.key));
        }
        Ok(outcome)
    }

    /// One script call for a batch of releases, all in one slot
    /// (`release.lua` for one, `release_many.lua` for more):
    /// each release's outcome, and whether a waiter elsewhere heard its
    /// notice, in order. A call that fails gives its error to every
    /// release in it.
    async fn release_batch(
        &self,
        batch: &[scripts::Release],
    ) -> Vec<Result<ReleaseReport, BackendError>> {
        const OP: &str = "release";
        let fail = |failure: &Failure| {
            batch
                .iter()
                .map(|r| Err(failure.for_key(OP, &r.key)))
                .collect()
        };
        let Some(first) = batch.first() else {
            return Vec::new();
        };
        let route = match self
            .lease_writes(false, || self.shared.layout.lease(&first.key))
            .await
        {
            Ok(route) => route,
            Err(failure) => return fail(&failure),
        };
        let notices = self.shared.notices.as_ref();
        let call = scripts::release_many(
            &self.shared.layout,
            batch,
            notices.is_some(),
            notices.is_some_and(Notices::sharded),
            matches!(route, WriteRoute::Tracked { .. }),
        );
        if matches!(route, WriteRoute::Untracked)
            && let Some(tracking) = &self.shared.tracking
        {
            for release in &batch[1..] {
                tracking.own_write(self.shared.layout.lease(&release.key));
            }
        }
        let reply = match self.eval_write(&call, route, None).await {
            Ok(reply) => reply.value,
            Err(failure) => return fail(&failure),
        };
        if let [release] = batch {
            return vec![reply::release_report(&reply).map_err(|f| f.for_key(OP, &release.key))];
        }
        match reply::batch(batch.len(), reply, self.shared.op_timeout) {
            Ok(items) => batch
                .iter()
                .zip(items)
                .map(|(release, item)| {
                    item.and_then(|value| reply::release_report(&value))
                        .map_err(|f| f.for_key(OP, &release.key))
                })
                .collect(),
            Err(failure) => fail(&failure),
        }
    }
}

/// The refusal of a read-write acquisition on a share key, or of an
/// exclusive acquisition of one (it would not see the other shares).
fn not_a_share(op: &'static str, key: &LeaseKey) -> Result<(), BackendError> {
    if key.rw_of().is_none() {
        return Ok(());
    }
    Err(BackendError::Unsupported {
        op,
        key: key.as_str().to_owned(),
        reason: "this is a reader's or writer's key of a read-write lease: acquire the lease itself with try_acquire_read or try_acquire_write",
    })
}

/// The refusal of a minimum hold by an acquisition that is not of an
/// exclusive lease: a permit, a share or a fair-queue grant (see
/// [`AcquireRequest::hold_at_least`]), rather than a grant that ignores it.
fn exclusive_only(op: &'static str, request: &AcquireRequest) -> Result<(), BackendError> {
    if request.hold_at_least_millis().is_none() {
        return Ok(());
    }
    Err(BackendError::Unsupported {
        op,
        key: request.key.as_str().to_owned(),
        reason: "a minimum hold applies to exclusive leases only; acquire without hold_at_least",
    })
}

/// The refusal of a read-write lease key too long for its reader keys.
fn too_long(op: &'static str, key: &LeaseKey) -> BackendError {
    BackendError::Unsupported {
        op,
        key: key.as_str().to_owned(),
        reason: "a read-write lease key must leave room for its readers' keys (\"{key}:read:\" and 32 hex digits within 512 bytes); choose a shorter key",
    }
}

impl LeaseBackend for RedisBackend {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire";
        not_a_share(OP, &request.key)?;
        if let Some(notices) = &self.shared.notices
            && notices.needs_restore()
        {
            // Behind Sentinel, after the subscription connection broke:
            // subscribe again on the current master. Boxed, so that every
            // acquisition future does not carry the reconnection's.
            Box::pin(notices.restore()).await;
        }
        if self.shared.wait.is_some() || request.hold_at_least.is_some() {
            // Each grant waits for its own acknowledgement (and is given
            // back without one): not batched. Nor is a grant with a
            // minimum hold, which only acquire.lua marks (the batch script
            // stays as it is for the usual lease). Boxed, so that every
            // acquisition future does not carry this path's.
            let Some(minimum) = request.hold_at_least else {
                return Box::pin(self.acquire_acked(request)).await;
            };
            // Noted before it is sent: if the reply is lost, the server may
            // still have marked it, and its release must read the mark.
            // Kept whatever the outcome (holds.rs).
            self.shared.holds.asked(
                &request.key,
                &request.holder,
                minimum,
                self.shared.op_timeout,
            );
            return Box::pin(self.acquire_acked(request)).await;
        }
        let limit = self.shared.op_timeout;
        self.shared
            .acquires
            .run(
                self.lane(&request.key),
                request.clone(),
                patience(limit),
                async |batch: Vec<AcquireRequest>| self.acquire_batch(&batch).await,
            )
            .await
            .unwrap_or_else(|_| Err(Failure::Timeout(limit).for_key(OP, &request.key)))
    }

    /// Renews in one script call per 1000 leases (in a cluster: per slot,
    /// and per 1000 leases in a slot, since one script may only touch keys
    /// of one slot); the calls go out together. A call that fails gives its
    /// error to every request in it.
    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        if !self.by_slot() {
            if requests.len() <= scripts::RENEW_BATCH {
                // The watchdog's batches: one call, its outcomes as they are.
                return self.renew_batch(requests).await;
            }
            let batches = requests
                .chunks(scripts::RENEW_BATCH)
                .map(|batch| self.renew_batch(batch));
            return join_all(batches).await.into_iter().flatten().collect();
        }
        let groups = slot_groups(&self.shared.layout, requests);
        let calls = groups.iter().flat_map(|indices| {
            indices
                .chunks(scripts::RENEW_BATCH)
                .map(|chunk| async move {
                    let batch: Vec<RenewRequest> =
                        chunk.iter().map(|&i| requests[i].clone()).collect();
                    (chunk, self.renew_batch(&batch).await)
                })
        });
        let mut outcomes: Vec<Option<Result<RenewOutcome, BackendError>>> =
            vec![None; requests.len()];
        for (chunk, results) in join_all(calls).await {
            for (&i, result) in chunk.iter().zip(results) {
                outcomes[i] = Some(result);
            }
        }
        outcomes
            .into_iter()
            .zip(requests)
            .map(|(outcome, request)| {
                // Every index is in exactly one group, so this is never None.
                outcome.unwrap_or_else(|| {
                    Err(BackendError::UnexpectedReply {
                        op: "renew",
                        key: request.key.as_str().to_owned(),
                        detail: "no outcome for this renewal".to_owned(),
                    })
                })
            })
            .collect()
    }

    /// Heard when the `PUBLISH` reached a subscriber besides this
    /// backend's own connection for notices.
    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        const OP: &str = "release";
        let own = self.shared.notices.as_ref().map_or(0, |n| {
            n.own_subscription(|| self.shared.layout.released(key))
        });
        let hold = self.shared.holds.may_hold(key, holder);
        let release = scripts::Release {
            key: key.clone(),
            holder: *holder,
            own,
            hold,
        };
        if hold {
            // Alone, by release.lua, which reads the hold's mark. The note
            // stays (holds.rs): a lease kept under its minimum is still
            // its holder's, and a release of it again must keep it too.
            // Boxed, as the acquisition's path of a minimum hold.
            return Box::pin(self.release_batch(std::slice::from_ref(&release)))
                .await
                .pop()
                .unwrap_or_else(|| {
                    Err(BackendError::UnexpectedReply {
                        op: OP,
                        key: key.as_str().to_owned(),
                        detail: "no outcome for this release".to_owned(),
                    })
                });
        }
        let limit = self.shared.op_timeout;
        self.shared
            .releases
            .run(
                self.lane(key),
                release,
                patience(limit),
                async |batch: Vec<scripts::Release>| self.release_batch(&batch).await,
            )
            .await
            .unwrap_or_else(|_| Err(Failure::Timeout(limit).for_key(OP, key)))
    }

    /// Reads the lease. While client tracking is on, over the tracked
    /// renewal connection, as a lease write goes: the script's `GET` tracks
    /// the key for this backend, so that the next grant, renewal, release,
    /// deletion or expiry of it by anyone else is reported through
    /// [`watch_changes`](Self::watch_changes) (once; the next read tracks
    /// it again). That is what lets an observer of a lease it does not hold
    /// follow it without polling. Such reads take a place among the
    /// lease writes in flight there, so that a flood of them cannot queue
    /// ahead of a renewal unbounded.
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        const OP: &str = "inspect";
        let call = scripts::inspect(&self.shared.layout, key);
        let route = self.tracked_reads().await.map_err(|f| f.for_key(OP, key))?;
        let reply = self
            .eval_write(&call, route, None)
            .await
            .map(|reply| reply.value)
            .map_err(|f| f.for_key(OP, key))?;
        reply::inspected(&reply).map_err(|f| f.for_key(OP, key))
    }

    /// Subscribes to `P:released` on the backend's subscription connection,
    /// opened on first use and shared by every waiter of every clone: a
    /// plain channel on a standalone server, a sharded one (`SSUBSCRIBE`,
    /// in the lease's slot) on a cluster. Behind Sentinel the connection
    /// goes to the current master, and the first acquisition attempt after
    /// it broke subscribes again on the master the sentinels name then.
    ///
    /// With [`WatchPolicy::Counted`] the watch knows how many processes
    /// listen (one `PUBSUB NUMSUB` round trip); [`WatchPolicy::Uncounted`]
    /// skips that round trip. With [`WatchPolicy::Afresh`], counted, a
    /// channel still subscribed from an earlier wait, and watched by no one
    /// here, is unsubscribed and subscribed again (two commands on the
    /// notices connection), which puts this process at the end of the order
    /// in which Redis tells the channel's subscribers. With
    /// [`WatchPolicy::AlreadyListening`], a watch only of a channel the
    /// connection is subscribed to already (no command sent), else an
    /// unsupported one.
    async fn watch_releases(
        &self,
        key: &LeaseKey,
        policy: WatchPolicy,
    ) -> Result<ReleaseWatch, BackendError> {
        let (count, afresh) = match policy {
            WatchPolicy::AlreadyListening => {
                return Ok(self
                    .shared
                    .notices
                    .as_ref()
                    .and_then(|n| n.watch_subscribed(self.shared.layout.released(key)))
                    .unwrap_or_else(ReleaseWatch::unsupported));
            }
            WatchPolicy::Uncounted => (false, false),
            WatchPolicy::Afresh => (true, !leasehold_core::ablation::off("afresh")),
            // Counted, and a policy added later: the full watch.
            _ => (true, false),
        };
        self.release_watch(key, count, afresh).await
    }

    fn permits(&self) -> Option<&impl PermitBackend> {
        Some(self)
    }

    fn read_write(&self) -> Option<&impl ReadWriteBackend> {
        Some(self)
    }

    fn fair(&self) -> Option<&impl FairBackend> {
        Some(self)
    }

    fn handover(&self) -> Option<&impl HandoverBackend> {
        Some(self)
    }

    fn changes(&self) -> Option<&impl ChangeBackend> {
        Some(self)
    }

    fn ticks(&self) -> Option<&impl leasehold_core::TickBackend> {
        Some(self)
    }
}

impl RedisBackend {
    /// A watch of `P:released` (see `watch_releases`); with `count`, it
    /// knows how many processes listen; `afresh`, see
    /// [`WatchPolicy::Afresh`].
    async fn release_watch(
        &self,
        key: &LeaseKey,
        count: bool,
        afresh: bool,
    ) -> Result<ReleaseWatch, BackendError> {
        let Some(notices) = &self.shared.notices else {
            return Ok(ReleaseWatch::unsupported());
        };
        notices
            .watch(self.shared.layout.released(key), count, afresh)
            .await
            .map_err(|f| f.for_key("watch_releases", key))
    }
}

/// The most lease writes (acquisitions, handovers, releases) in flight at
/// once on the tracked renewal connection: a renewal sent behind a flood of
/// them waits for at most this many scripts (about 15 µs of server time
/// each), and as many in flight keep one connection's pipeline full.
pub(crate) const WRITES_IN_FLIGHT: usize = 64;

/// The most acquisition calls, and release calls, in flight at once on one
/// lane (`coalesce.rs`). With one, a request that arrives just after a call
/// went out waits for that call's whole round trip before its own starts,
/// and the server idles while the client reads a reply and builds the next
/// call: 64 tasks on 64 keys made 59–72k cycles/s, against 94–100k with 16
/// (client and server on their own cores; docs/performance.md). Beyond 16
/// calls out, requests still wait and go out together, which is what a
/// saturated server gains from: with server and client pinned to one core,
/// one call in flight made 91k cycles/s against 72k with 16.
pub(crate) const CALLS_IN_FLIGHT: usize = 16;

/// How long an acquisition or release waits for its turn behind the call
/// of its kind in flight on its lane (bounded by the op timeout) before it
/// gives up unsent: twice the op timeout, so that a call that times out
/// still lets the requests queued behind it go out.
fn patience(op_timeout: Duration) -> Duration {
    op_timeout.saturating_mul(2)
}

/// The connection a lease write goes over.
enum WriteRoute<'a> {
    /// The renewal connection, with client tracking on, and the place taken
    /// among the [`WRITES_IN_FLIGHT`] until the reply is in.
    Tracked {
        _place: tokio::sync::SemaphorePermit<'a>,
    },
    /// The operations connection.
    Untracked,
}

/// The indices of `requests` grouped by the cluster slot of their lease,
/// each group in request order, groups in order of first appearance.
pub(crate) fn slot_groups(layout: &KeyLayout, requests: &[RenewRequest]) -> Vec<Vec<usize>> {
    let mut by_slot: HashMap<Slot, usize> = HashMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let slot = Slot::for_key(layout.lease(&request.key));
        let group = *by_slot.entry(slot).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(i);
    }
    groups
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("server", &self.shared.server)
            .field("topology", &self.topology())
            .field("namespace", &self.namespace())
            .field("op_timeout", &self.shared.op_timeout)
            .finish_non_exhaustive()
    }
}
