//! The optional capabilities of a backend, each a trait of its own.
//!
//! A backend implements the ones it can and announces each through its
//! accessor on [`LeaseBackend`] (`Some(self)`); [`NoCapability`] stands for
//! the ones it lacks. The manager asks the accessor before it uses a
//! capability and refuses a kind of lease the backend lacks with
//! [`BackendError::Unsupported`].

use std::future::Future;
use std::time::Duration;

#[cfg(doc)]
use crate::LeaseBackend;
use crate::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeWatch, Completion, FairOutcome,
    FencingToken, HandoverOutcome, HandoverWatch, HolderId, JobName, JobRecord, LeaseKey,
    PermitLimit, PlaceTtl, ReleaseOutcome, RerunReply, RerunRequest, TickAnswer, TickBackend,
    TickRequest,
};

/// Counting leases (semaphores): up to N holders of one name, each on a
/// permit that is a lease of its own.
///
/// Implemented by a backend that has them, and returned by its
/// [`LeaseBackend::permits`].
pub trait PermitBackend: Send + Sync {
    /// Takes one of the `limit` permits of the semaphore `request.key` for
    /// `request.holder`: the first free permit key (see
    /// [`LeaseKey::permit`]), granted exactly as
    /// [`LeaseBackend::try_acquire`] grants a lease, in one atomic
    /// operation. A holder that already has a permit of the semaphore gets
    /// it refreshed, with the same fencing token.
    ///
    /// The grant's key is the permit key: renew, release and inspect it as
    /// any lease. Its fencing token comes from the semaphore's counter, so
    /// tokens strictly increase across all permits of the semaphore; its
    /// release wakes the watchers of the semaphore key. A permit whose
    /// holder vanished frees itself when its ttl runs out. When every permit
    /// is taken, the outcome is [`AcquireOutcome::Held`] with the permit
    /// that frees first.
    ///
    /// # Errors
    ///
    /// [`BackendError::PermitLimitMismatch`] when permits of the semaphore
    /// are held under another limit (nothing is taken); the limit a
    /// semaphore is held under changes only once all its permits are free.
    /// Otherwise as [`LeaseBackend::try_acquire`].
    fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send;
}

/// Read-write leases: readers share a lease, a writer holds it alone, and
/// a waiting writer holds new readers back.
///
/// Implemented by a backend that has them, and returned by its
/// [`LeaseBackend::read_write`].
pub trait ReadWriteBackend: Send + Sync {
    /// Takes a shared (read) hold on the read-write lease `request.key` for
    /// `request.holder`, on its own reader key (see
    /// [`LeaseKey::reader_key`]), in one atomic operation: granted unless
    /// the lease has a writer, or a writer other than `request.holder` is
    /// waiting for it (writer preference: a writer refused because readers
    /// hold the lease leaves an *intent* that lives for its ttl, and new
    /// readers respect it, so the writer waits only for the readers that
    /// held before it). A reader that holds already gets its hold
    /// refreshed, with the same fencing token.
    ///
    /// The grant's key is the reader key: renew, release and inspect it as
    /// any lease. Its fencing token comes from the counter of
    /// `request.key`, shared by readers and writers, so tokens strictly
    /// increase across both; its release wakes the watchers of
    /// `request.key`. A reader whose holder vanished frees itself when its
    /// ttl runs out. When refused, the outcome is [`AcquireOutcome::Held`]
    /// with the writer's lease, or the waiting writer's label and the time
    /// left on its intent (no fencing token: it holds nothing yet).
    ///
    /// # Errors
    ///
    /// [`BackendError::Unsupported`] when `request.key` is itself a
    /// reader's or writer's key. Otherwise as
    /// [`LeaseBackend::try_acquire`].
    fn try_acquire_read(
        &self,
        request: &AcquireRequest,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send;

    /// Takes the exclusive (write) hold on the read-write lease
    /// `request.key` for `request.holder`, on its writer key (see
    /// [`LeaseKey::writer_key`]), in one atomic operation: granted when no
    /// one holds the lease, neither a writer nor a live reader. A writer
    /// that holds already gets its hold refreshed, with the same fencing
    /// token.
    ///
    /// When refused, the writer leaves its intent (unless another waiting
    /// writer's is there), which refuses new readers for `request.ttl`;
    /// asking again refreshes it, and being granted clears it. The outcome
    /// is then [`AcquireOutcome::Held`] with the writer's lease, or the
    /// live reader that frees first. Fencing tokens, release notices and
    /// expiry are as for [`try_acquire_read`](Self::try_acquire_read).
    ///
    /// # Errors
    ///
    /// As [`try_acquire_read`](Self::try_acquire_read).
    fn try_acquire_write(
        &self,
        request: &AcquireRequest,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send;

    /// Withdraws the intent the waiting writer `holder` left on the
    /// read-write lease `key` (see
    /// [`try_acquire_write`](Self::try_acquire_write)), if it is still
    /// `holder`'s (compare-and-delete): a writer that gives up waiting
    /// stops holding new readers back at once, rather than when the intent
    /// expires. Another writer's intent is left alone. Returns whether
    /// `holder`'s intent was there.
    ///
    /// # Errors
    ///
    /// A [`BackendError`] when the server could not be asked; the intent
    /// then expires by itself, at most the writer's ttl after its last
    /// attempt.
    fn withdraw_write_intent(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;
}

/// Fair mode (see [`PlaceTtl`]): the waiters of every process queue on the
/// server in arrival order, and the lease goes to the head of the queue.
///
/// Implemented by a backend that keeps such a queue, and returned by its
/// [`LeaseBackend::fair`].
pub trait FairBackend: Send + Sync {
    /// In one atomic operation, drops the expired places of `request.key`'s
    /// fair queue, takes a place at its tail for `request.holder` (or
    /// refreshes the one it has) to live for `place_ttl`, and grants the
    /// lease as [`LeaseBackend::try_acquire`] does only if it is free and
    /// this place is at the head; the place is then left. A holder that
    /// holds the lease already gets it refreshed, with the same fencing
    /// token.
    ///
    /// The grant is an ordinary lease of `request.key`: renew, release and
    /// inspect it as any other. Its release announces itself as every
    /// release does, which is what wakes the next head.
    ///
    /// `handover`, when given, asks that a release of the lease by a fair
    /// holder ([`release_fair`](Self::release_fair)) hand it straight to
    /// this waiter when its place is first: the server then keeps the
    /// lease for `handover` from this call (or from the waiter's latest
    /// call) and announces it to [`watch_handover`](Self::watch_handover),
    /// so that the waiter need not ask again. A waiter that died while
    /// first holds the queue up for at most `handover` after its last call.
    /// A backend that does not hand over ignores it.
    ///
    /// # Errors
    ///
    /// As [`LeaseBackend::try_acquire`].
    fn try_acquire_fair(
        &self,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        handover: Option<Duration>,
    ) -> impl Future<Output = Result<FairOutcome, BackendError>> + Send;

    /// Frees the lease as [`LeaseBackend::release`] does and, in the same
    /// atomic operation, grants it to the first live place of the key's
    /// fair queue when that waiter asked for a handover (see
    /// [`try_acquire_fair`](Self::try_acquire_fair)), announcing the grant
    /// to the waiter's [`watch_handover`](Self::watch_handover). Otherwise
    /// the release is announced as any other, and the head asks for the
    /// lease itself. A lease taken in fair mode is released this way; a
    /// backend that never hands over releases it as any other.
    fn release_fair(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ReleaseOutcome, BackendError>> + Send;

    /// Listens for a release that hands the lease `key` to `holder`, a
    /// waiter in its fair queue (see [`release_fair`](Self::release_fair)).
    /// Called before the waiter's first place call, so that no handover
    /// after that call goes unheard. A backend that never hands over
    /// answers [`HandoverWatch::unsupported`].
    fn watch_handover(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<HandoverWatch, BackendError>> + Send;

    /// Leaves `holder`'s place in the fair queue of `key`, if it has one,
    /// so that the waiters behind it need not wait for the place to expire.
    fn leave_fair_queue(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;
}

/// Handover to a local waiter: a release that grants the lease, in the
/// same atomic operation, to a waiter of the caller's own.
///
/// Implemented by a backend that can tell whether anyone else waits, and
/// returned by its [`LeaseBackend::handover`].
pub trait HandoverBackend: Send + Sync {
    /// Frees the lease if `holder` still holds it and, in the same atomic
    /// operation, grants it to `next` (a waiter of the caller's own) unless
    /// someone else may be waiting for it: then it is only released, and
    /// announced, so that the waiter elsewhere is not overtaken.
    ///
    /// "Someone else" is any listener for the key's release notices other
    /// than a single watch of this backend (the one `next`'s waiter holds):
    /// a backend that cannot tell must not hand over. The grant's
    /// `valid_until` counts from the moment the request was sent.
    /// A lease under its minimum hold is handed to no one: it is kept as
    /// [`LeaseBackend::release`] keeps it, and the outcome is
    /// [`HandoverOutcome::Released`]. A grant to a `next` that carries a
    /// minimum hold starts its own.
    fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> impl Future<Output = Result<HandoverOutcome, BackendError>> + Send;
}

/// A change feed: the server tells the backend when a lease it renews was
/// changed behind its back.
///
/// Implemented by a backend whose server can tell it, and returned by its
/// [`LeaseBackend::changes`].
pub trait ChangeBackend: Send + Sync {
    /// Subscribes to the changes of the leases this backend renews, so a
    /// holder can renew at once when its lease was changed behind its back
    /// (deleted, overwritten, taken over) instead of learning at its next
    /// renewal. A lease is watched from the call that granted it through
    /// this backend (or a clone): the Redis backend tracks it from its
    /// grant script. A backend that finds it cannot report
    /// changes after all answers [`ChangeWatch::unsupported`].
    fn watch_changes(&self) -> impl Future<Output = Result<ChangeWatch, BackendError>> + Send;
}

/// The capability a backend does not have: the type behind the `None` that
/// [`LeaseBackend`]'s capability accessors return by default.
///
/// It has no values, so none of its methods can ever be called; it
/// implements every capability trait only so that it can name the
/// accessors' return type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoCapability {}

impl PermitBackend for NoCapability {
    async fn try_acquire_permit(
        &self,
        _request: &AcquireRequest,
        _limit: PermitLimit,
    ) -> Result<AcquireOutcome, BackendError> {
        match *self {}
    }
}

impl ReadWriteBackend for NoCapability {
    async fn try_acquire_read(
        &self,
        _request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        match *self {}
    }

    async fn try_acquire_write(
        &self,
        _request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        match *self {}
    }

    async fn withdraw_write_intent(
        &self,
        _key: &LeaseKey,
        _holder: &HolderId,
    ) -> Result<bool, BackendError> {
        match *self {}
    }
}

impl FairBackend for NoCapability {
    async fn try_acquire_fair(
        &self,
        _request: &AcquireRequest,
        _place_ttl: PlaceTtl,
        _handover: Option<Duration>,
    ) -> Result<FairOutcome, BackendError> {
        match *self {}
    }

    async fn release_fair(
        &self,
        _key: &LeaseKey,
        _holder: &HolderId,
    ) -> Result<ReleaseOutcome, BackendError> {
        match *self {}
    }

    async fn watch_handover(
        &self,
        _key: &LeaseKey,
        _holder: &HolderId,
    ) -> Result<HandoverWatch, BackendError> {
        match *self {}
    }

    async fn leave_fair_queue(
        &self,
        _key: &LeaseKey,
        _holder: &HolderId,
    ) -> Result<(), BackendError> {
        match *self {}
    }
}

impl HandoverBackend for NoCapability {
    async fn release_to(
        &self,
        _key: &LeaseKey,
        _holder: &HolderId,
        _next: &AcquireRequest,
    ) -> Result<HandoverOutcome, BackendError> {
        match *self {}
    }
}

impl ChangeBackend for NoCapability {
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        match *self {}
    }
}

impl TickBackend for NoCapability {
    async fn decide_tick(&self, _request: &TickRequest) -> Result<TickAnswer, BackendError> {
        match *self {}
    }

    async fn complete_tick(
        &self,
        _job: &JobName,
        _holder: &HolderId,
        _fencing_token: FencingToken,
    ) -> Result<Completion, BackendError> {
        match *self {}
    }

    async fn claim_rerun(&self, _request: &RerunRequest) -> Result<RerunReply, BackendError> {
        match *self {}
    }

    async fn job_record(&self, _job: &JobName) -> Result<Option<JobRecord>, BackendError> {
        match *self {}
    }

    async fn job_records(&self) -> Result<Vec<JobRecord>, BackendError> {
        match *self {}
    }
}

/// The refusals of a backend that lacks a capability, as the manager gives
/// them when the capability's accessor on [`LeaseBackend`] returns `None`.
impl BackendError {
    /// A semaphore (`acquire_permit` on `key`) asked of a backend without
    /// [`PermitBackend`].
    #[must_use]
    pub fn no_permits(key: &LeaseKey) -> Self {
        Self::Unsupported {
            op: "acquire_permit",
            key: key.as_str().to_owned(),
            reason: "this backend has no counting leases (permits)",
        }
    }

    /// A read-write lease's `op` (`acquire_read`, `acquire_write`) on
    /// `key` asked of a backend without [`ReadWriteBackend`].
    #[must_use]
    pub fn no_read_write(op: &'static str, key: &LeaseKey) -> Self {
        Self::Unsupported {
            op,
            key: key.as_str().to_owned(),
            reason: "this backend has no read-write leases",
        }
    }

    /// Fair mode (`acquire_fair` on `key`) asked of a backend without
    /// [`FairBackend`].
    #[must_use]
    pub fn no_fair_queue(key: &LeaseKey) -> Self {
        Self::Unsupported {
            op: "acquire_fair",
            key: key.as_str().to_owned(),
            reason: "this backend has no fair queue; acquire without fair mode",
        }
    }

    /// A scheduled job's `op` (`decide_tick`, `complete_tick`, …) on
    /// `job`'s run key asked of a backend without [`TickBackend`] (Redlock:
    /// a job's record needs one server's clock and one atomic script).
    #[must_use]
    pub fn no_ticks(op: &'static str, job: &JobName) -> Self {
        Self::Unsupported {
            op,
            key: job.run_key().as_str().to_owned(),
            reason: "this backend keeps no job records (scheduled jobs need one server's clock: use a standalone, Sentinel or Cluster backend, not Redlock)",
        }
    }
}
