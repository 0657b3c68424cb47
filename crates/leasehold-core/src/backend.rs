//! The backend contract: one async method per atomic server-side operation.

use std::future::Future;
use std::time::Duration;

use crate::{
    BackendError, ChangeWatch, Error, FairOutcome, FencingToken, Grant, HandoverWatch, HolderId,
    LeaseKey, LockDelay, PermitLimit, PlaceTtl, ReleaseWatch, Ttl,
};

/// A request to acquire a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest {
    /// The lease to acquire.
    pub key: LeaseKey,
    /// Who asks. Asking again with the same holder while holding the lease
    /// refreshes it and returns the same fencing token (idempotent re-acquire).
    pub holder: HolderId,
    /// How long the lease lives unless renewed.
    pub ttl: Ttl,
    /// A public label stored beside the lease (a host or pod name) that
    /// others see in [`LeaseInfo::label`]. Never the holder id.
    pub label: Option<String>,
    /// How long the key stays taken after the lease ends without a release:
    /// the server keeps it for ttl + lock-delay, the grant's validity counts
    /// from the ttl alone. Default: none.
    pub lock_delay: LockDelay,
    /// The minimum hold (ShedLock's `lockAtLeastFor`): a release before the
    /// grant + this leaves the key taken, still the holder's, until then,
    /// as timed by the backend's own clock (the server's, for Redis); a
    /// release after it frees the key at once. Counted from the grant that
    /// took the key, not from a refresh by the same holder. Only an
    /// exclusive lease has one: the permit, read-write and fair-queue
    /// acquisitions refuse a request that carries it. Set it with
    /// [`with_hold_at_least`](Self::with_hold_at_least), which validates it.
    /// Default: none.
    pub hold_at_least: Option<Duration>,
}

impl AcquireRequest {
    /// The longest minimum hold accepted: the longest ttl, 24 hours.
    pub const MAX_HOLD_AT_LEAST: Duration = Ttl::MAX;

    /// A request without a label.
    #[must_use]
    pub fn new(key: LeaseKey, holder: HolderId, ttl: Ttl) -> Self {
        Self {
            key,
            holder,
            ttl,
            label: None,
            lock_delay: LockDelay::ZERO,
            hold_at_least: None,
        }
    }

    /// Sets the minimum hold (see [`hold_at_least`](Self::hold_at_least));
    /// zero means none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidHoldAtLeast`] when the duration is above
    /// [`AcquireRequest::MAX_HOLD_AT_LEAST`] or not a whole number of
    /// milliseconds.
    pub fn with_hold_at_least(mut self, minimum: Duration) -> Result<Self, Error> {
        self.hold_at_least = Self::check_hold_at_least(minimum)?;
        Ok(self)
    }

    /// Validates a minimum hold: `None` for zero.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidHoldAtLeast`] above [`AcquireRequest::MAX_HOLD_AT_LEAST`]
    /// or not in whole milliseconds.
    pub fn check_hold_at_least(minimum: Duration) -> Result<Option<Duration>, Error> {
        let refuse = |reason: String| Error::InvalidHoldAtLeast {
            value: humantime::format_duration(minimum).to_string(),
            reason,
        };
        if minimum > Self::MAX_HOLD_AT_LEAST {
            return Err(refuse(format!(
                "a minimum hold may be at most {}, the longest ttl: no one can end it early",
                humantime::format_duration(Self::MAX_HOLD_AT_LEAST)
            )));
        }
        if !minimum.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(refuse(
                "a minimum hold must be a whole number of milliseconds, the unit Redis stores"
                    .to_owned(),
            ));
        }
        Ok(Some(minimum).filter(|m| !m.is_zero()))
    }

    /// The minimum hold in whole milliseconds, as a backend sends it to its
    /// server: `None` without one. A value set on the field directly is
    /// rounded up to a millisecond and capped at
    /// [`AcquireRequest::MAX_HOLD_AT_LEAST`], so a backend never sends one
    /// the server would refuse.
    #[must_use]
    pub fn hold_at_least_millis(&self) -> Option<u64> {
        let minimum = self.hold_at_least.filter(|m| !m.is_zero())?;
        let cap = u64::try_from(Self::MAX_HOLD_AT_LEAST.as_millis()).unwrap_or(u64::MAX);
        let millis = u64::try_from(minimum.as_millis()).unwrap_or(u64::MAX);
        let rounded = if minimum.subsec_nanos().is_multiple_of(1_000_000) {
            millis
        } else {
            millis.saturating_add(1)
        };
        Some(rounded.min(cap))
    }

    /// Sets the lock-delay (see [`LockDelay`]).
    #[must_use]
    pub fn with_lock_delay(mut self, lock_delay: LockDelay) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// How long the server keeps the key from this request on unless it is
    /// renewed or released: the ttl plus the lock-delay.
    #[must_use]
    pub fn expiry(&self) -> Duration {
        self.ttl.get() + self.lock_delay.get()
    }

    /// Adds a public label (at most 256 bytes, no control characters).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidLabel`] when the label is too long or has control characters.
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Self, Error> {
        let label = label.into();
        let refuse = |reason| Error::InvalidLabel {
            label: crate::error::excerpt(&label),
            reason,
        };
        if label.len() > 256 {
            return Err(refuse("a label may be at most 256 bytes long"));
        }
        if label.chars().any(char::is_control) {
            return Err(refuse("a label must not contain control characters"));
        }
        self.label = Some(label);
        Ok(self)
    }
}

/// A request to renew a held lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RenewRequest {
    /// The lease to renew.
    pub key: LeaseKey,
    /// The holder that acquired it.
    pub holder: HolderId,
    /// The new ttl, counted from when the server runs the renewal.
    pub ttl: Ttl,
    /// The lease's lock-delay, as acquired: the server keeps the key for
    /// ttl + lock-delay from the renewal. Default: none.
    pub lock_delay: LockDelay,
}

impl RenewRequest {
    /// A renewal request.
    #[must_use]
    pub fn new(key: LeaseKey, holder: HolderId, ttl: Ttl) -> Self {
        Self {
            key,
            holder,
            ttl,
            lock_delay: LockDelay::ZERO,
        }
    }

    /// Sets the lock-delay (see [`LockDelay`]); renew with the one the
    /// lease was acquired with.
    #[must_use]
    pub fn with_lock_delay(mut self, lock_delay: LockDelay) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// How long the server keeps the key from the renewal on: the ttl plus
    /// the lock-delay.
    #[must_use]
    pub fn expiry(&self) -> Duration {
        self.ttl.get() + self.lock_delay.get()
    }
}

/// What the server knows of a held lease, as anyone may see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder's public label, if it set one.
    pub label: Option<String>,
    /// The fencing token of the current holder; `None` when the key was
    /// written by something other than leasehold.
    pub fencing_token: Option<FencingToken>,
    /// How long the lease lives unless renewed; `None` when the key has no
    /// expiry (written by something other than leasehold).
    pub ttl_left: Option<Duration>,
}

/// The outcome of [`LeaseBackend::try_acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is ours.
    Acquired(Grant),
    /// Someone else holds it.
    Held(LeaseInfo),
}

/// The outcome of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// The lease is still ours and lives for another ttl from the renewal.
    Renewed,
    /// The lease is gone or held by someone else: stop work guarded by it.
    Lost,
}

/// The outcome of [`LeaseBackend::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The lease was ours and is not any more: it is free, or, when it was
    /// acquired with a minimum hold ([`AcquireRequest::hold_at_least`]) that
    /// has not run out, kept taken until the minimum runs out, when the
    /// backend frees it by itself (no release notice is sent then).
    Released,
    /// The lease was not ours any more (expired, lost or released before).
    NotHeld,
}

/// The outcome of [`LeaseBackend::release_to`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandoverOutcome {
    /// The lease was ours; it was freed and granted to the offered request
    /// in the same atomic operation, with a new fencing token.
    HandedOver(Grant),
    /// The lease was ours and is now free, announced to waiters; it was not
    /// handed over (someone else may be waiting, or the backend never hands
    /// over). Or, for a lease under its minimum hold
    /// ([`AcquireRequest::hold_at_least`]), kept taken until the minimum
    /// runs out and neither handed over nor announced: a waiter asks again
    /// when the holder's time left runs out.
    Released,
    /// The lease was not ours any more (expired, lost or released before);
    /// nothing was handed over.
    NotHeld,
}

/// One atomic server-side operation per method.
///
/// Backends are cheap to clone (a clone shares connections) and never spawn
/// tasks of their own. Outcomes the server decides are values; an `Err`
/// means the outcome is unknown.
///
/// # Cancel safety
///
/// Dropping a returned future before it completes leaves the operation's
/// effect unknown, as a timeout does: it may or may not have run.
pub trait LeaseBackend: Clone + Send + Sync + 'static {
    /// Acquires `request.key` for `request.holder` if it is free (or already
    /// theirs, which refreshes the ttl and keeps the fencing token).
    ///
    /// The returned grant's `valid_until` counts from the moment the request
    /// was sent, and from the ttl alone: the key itself is kept for
    /// [`AcquireRequest::expiry`] (ttl + lock-delay), so that it stays taken
    /// for the lock-delay after the holder's validity if the holder vanishes.
    fn try_acquire(
        &self,
        request: &AcquireRequest,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send;

    /// Takes one of the `limit` permits of the semaphore `request.key` for
    /// `request.holder`: the first free permit key (see
    /// [`LeaseKey::permit`]), granted exactly as
    /// [`try_acquire`](Self::try_acquire) grants a lease, in one atomic
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
    /// [`BackendError::Unsupported`] from a backend that has no permits
    /// (the default). Otherwise as [`try_acquire`](Self::try_acquire).
    fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send {
        let _ = limit;
        std::future::ready(Err(BackendError::Unsupported {
            op: "acquire_permit",
            key: request.key.as_str().to_owned(),
            reason: "this backend has no counting leases (permits)",
        }))
    }

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
    /// [`BackendError::Unsupported`] from a backend that has no read-write
    /// leases (the default), or when `request.key` is itself a reader's or
    /// writer's key. Otherwise as [`try_acquire`](Self::try_acquire).
    fn try_acquire_read(
        &self,
        request: &AcquireRequest,
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send {
        std::future::ready(Err(BackendError::Unsupported {
            op: "acquire_read",
            key: request.key.as_str().to_owned(),
            reason: "this backend has no read-write leases",
        }))
    }

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
    ) -> impl Future<Output = Result<AcquireOutcome, BackendError>> + Send {
        std::future::ready(Err(BackendError::Unsupported {
            op: "acquire_write",
            key: request.key.as_str().to_owned(),
            reason: "this backend has no read-write leases",
        }))
    }

    /// Withdraws the intent the waiting writer `holder` left on the
    /// read-write lease `key` (see
    /// [`try_acquire_write`](Self::try_acquire_write)), if it is still
    /// `holder`'s (compare-and-delete): a writer that gives up waiting
    /// stops holding new readers back at once, rather than when the intent
    /// expires. Another writer's intent is left alone. Returns whether
    /// `holder`'s intent was there.
    ///
    /// The default has no intents to withdraw (a backend without
    /// read-write leases) and answers `false`.
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
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        let _ = (key, holder);
        std::future::ready(Ok(false))
    }

    /// Fair mode (see [`PlaceTtl`]): in one atomic operation, drops
    /// the expired places of `request.key`'s fair queue, takes a place at
    /// its tail for `request.holder` (or refreshes the one it has) to live
    /// for `place_ttl`, and grants the lease as
    /// [`try_acquire`](Self::try_acquire) does only if it is free and this
    /// place is at the head; the place is then left. A holder that holds
    /// the lease already gets it refreshed, with the same fencing token.
    ///
    /// The grant is an ordinary lease of `request.key`: renew, release and
    /// inspect it as any other. Its release announces itself as every
    /// release does, which is what wakes the next head.
    ///
    /// # Errors
    ///
    /// [`BackendError::Unsupported`] from a backend that has no fair queue
    /// (the default). Otherwise as [`try_acquire`](Self::try_acquire).
    ///
    /// `handover`, when given, asks that a release of the lease by a fair
    /// holder ([`release_fair`](Self::release_fair)) hand it straight to
    /// this waiter when its place is first: the server then keeps the
    /// lease for `handover` from this call (or from the waiter's latest
    /// call) and announces it to [`watch_handover`](Self::watch_handover),
    /// so that the waiter need not ask again. A waiter that died while
    /// first holds the queue up for at most `handover` after its last call.
    /// A backend that does not hand over ignores it.
    fn try_acquire_fair(
        &self,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        handover: Option<Duration>,
    ) -> impl Future<Output = Result<FairOutcome, BackendError>> + Send {
        let _ = (place_ttl, handover);
        std::future::ready(Err(BackendError::Unsupported {
            op: "acquire_fair",
            key: request.key.as_str().to_owned(),
            reason: "this backend has no fair queue; acquire without fair mode",
        }))
    }

    /// Frees the lease as [`release`](Self::release) does and, in the same
    /// atomic operation, grants it to the first live place of the key's
    /// fair queue when that waiter asked for a handover (see
    /// [`try_acquire_fair`](Self::try_acquire_fair)), announcing the grant
    /// to the waiter's [`watch_handover`](Self::watch_handover). Otherwise
    /// the release is announced as any other, and the head asks for the
    /// lease itself. A lease taken in fair mode is released this way.
    ///
    /// The default never hands over: it calls [`release`](Self::release).
    fn release_fair(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ReleaseOutcome, BackendError>> + Send {
        self.release(key, holder)
    }

    /// Listens for a release that hands the lease `key` to `holder`, a
    /// waiter in its fair queue (see [`release_fair`](Self::release_fair)).
    /// Called before the waiter's first place call, so that no handover
    /// after that call goes unheard.
    ///
    /// The default never hands over ([`HandoverWatch::unsupported`]).
    fn watch_handover(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<HandoverWatch, BackendError>> + Send {
        let _ = (key, holder);
        std::future::ready(Ok(HandoverWatch::unsupported()))
    }

    /// Leaves `holder`'s place in the fair queue of `key`, if it has one,
    /// so that the waiters behind it need not wait for the place to expire.
    /// The default has no queue and does nothing.
    fn leave_fair_queue(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = (key, holder);
        std::future::ready(Ok(()))
    }

    /// Extends the lease to another `ttl` if `holder` still holds it
    /// (compare-and-pexpire); the key is kept for
    /// [`RenewRequest::expiry`] (ttl + lock-delay).
    ///
    /// The default renews a batch of one through
    /// [`renew_many`](Self::renew_many).
    fn renew(
        &self,
        request: &RenewRequest,
    ) -> impl Future<Output = Result<RenewOutcome, BackendError>> + Send {
        async move {
            let mut outcomes = self.renew_many(std::slice::from_ref(request)).await;
            match outcomes.pop() {
                Some(outcome) if outcomes.is_empty() => outcome,
                // A backend's renew_many returns one outcome per request.
                _ => Err(BackendError::UnexpectedReply {
                    op: "renew",
                    key: request.key.as_str().to_owned(),
                    detail: "not one outcome for one renewal".to_owned(),
                }),
            }
        }
    }

    /// Renews several leases in as few round trips as the backend allows,
    /// with one outcome per request, in order.
    fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> impl Future<Output = Vec<Result<RenewOutcome, BackendError>>> + Send;

    /// Frees the lease if `holder` still holds it (compare-and-delete).
    ///
    /// A lease granted with a minimum hold
    /// ([`AcquireRequest::hold_at_least`]) that has not run out is not
    /// freed: the backend keeps it, still `holder`'s, until the grant +
    /// the minimum by its own clock, and frees it by itself then, without
    /// a release notice. The outcome is [`ReleaseOutcome::Released`] either
    /// way: the lease is no longer the caller's to use.
    fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ReleaseOutcome, BackendError>> + Send;

    /// Frees the lease as [`release`](Self::release) does, and tells
    /// whether the release was heard: `true` when its notice reached a
    /// listener other than this backend's own watches, that is a waiter
    /// that may be in another process. A manager then lets that waiter go
    /// first instead of taking the lease straight back with its next
    /// acquisition. The default cannot tell: it releases and says `false`.
    fn release_heard(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<(ReleaseOutcome, bool), BackendError>> + Send {
        async move { Ok((self.release(key, holder).await?, false)) }
    }

    /// Frees the lease if `holder` still holds it and, in the same atomic
    /// operation, grants it to `next` (a waiter of the caller's own) unless
    /// someone else may be waiting for it: then it is only released, and
    /// announced, so that the waiter elsewhere is not overtaken.
    ///
    /// "Someone else" is any listener for the key's release notices other
    /// than a single watch of this backend (the one `next`'s waiter holds):
    /// a backend that cannot tell must not hand over. The grant's
    /// `valid_until` counts from the moment the request was sent. The
    /// default never hands over: it calls [`release`](Self::release).
    /// A lease under its minimum hold is handed to no one: it is kept as
    /// [`release`](Self::release) keeps it, and the outcome is
    /// [`HandoverOutcome::Released`]. A grant to a `next` that carries a
    /// minimum hold starts its own.
    fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> impl Future<Output = Result<HandoverOutcome, BackendError>> + Send {
        let _ = next;
        async move {
            Ok(match self.release(key, holder).await? {
                ReleaseOutcome::Released => HandoverOutcome::Released,
                ReleaseOutcome::NotHeld => HandoverOutcome::NotHeld,
            })
        }
    }

    /// Reads who holds a lease, without changing it. `None` when it is free.
    fn inspect(
        &self,
        key: &LeaseKey,
    ) -> impl Future<Output = Result<Option<LeaseInfo>, BackendError>> + Send;

    /// Subscribes to the release notices of `key`, so a waiter can retry the
    /// moment the lease is freed instead of polling.
    ///
    /// The default has no notices ([`ReleaseWatch::unsupported`]): waiters
    /// then poll. A backend that publishes notices on release overrides it.
    fn watch_releases(
        &self,
        key: &LeaseKey,
    ) -> impl Future<Output = Result<ReleaseWatch, BackendError>> + Send {
        let _ = key;
        std::future::ready(Ok(ReleaseWatch::unsupported()))
    }

    /// Subscribes to the release notices of `key` as
    /// [`watch_releases`](Self::watch_releases) does, for a waiter that has
    /// no use for [`ReleaseWatch::listeners`] (a waiter in a fair queue,
    /// whose turn the server decides): a backend that counts listeners with
    /// a round trip of its own may skip it. The default calls
    /// `watch_releases`.
    fn watch_releases_uncounted(
        &self,
        key: &LeaseKey,
    ) -> impl Future<Output = Result<ReleaseWatch, BackendError>> + Send {
        self.watch_releases(key)
    }

    /// Subscribes to the release notices of `key` as
    /// [`watch_releases`](Self::watch_releases) does, for a waiter that
    /// races the waiters of other processes on each notice (a permit's, a
    /// share's: a release may make room for several, so they do not take
    /// turns). Redis tells a channel's subscribers in the order they
    /// subscribed, so a process still subscribed from an earlier wait would
    /// hear every release before the processes that subscribed after it, and
    /// win nearly every race: a backend with such an order subscribes this
    /// process anew, at the end of it. The default calls `watch_releases`;
    /// a backend that wraps another should pass this call on.
    fn watch_releases_afresh(
        &self,
        key: &LeaseKey,
    ) -> impl Future<Output = Result<ReleaseWatch, BackendError>> + Send {
        self.watch_releases(key)
    }

    /// Subscribes to the changes of the leases this backend renews, so a
    /// holder can renew at once when its lease was changed behind its back
    /// (deleted, overwritten, taken over) instead of learning at its next
    /// renewal. A lease is watched from its first renewal through this
    /// backend (or a clone) on.
    ///
    /// The default reports nothing ([`ChangeWatch::unsupported`]): holders
    /// then learn of a loss at their next renewal. A backend whose server
    /// can tell it of changes overrides it.
    fn watch_changes(&self) -> impl Future<Output = Result<ChangeWatch, BackendError>> + Send {
        std::future::ready(Ok(ChangeWatch::unsupported()))
    }
}
