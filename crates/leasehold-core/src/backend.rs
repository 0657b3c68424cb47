//! The core of the backend contract: one async method per atomic
//! server-side operation every backend has (the optional capabilities are
//! in `capability.rs`).

use std::future::Future;
use std::time::Duration;

use crate::{
    BackendError, ChangeBackend, FairBackend, FencingToken, Grant, HandoverBackend, HolderId,
    InputError, LeaseKey, LockDelay, NoCapability, PermitBackend, ReadWriteBackend, ReleaseWatch,
    TickBackend, Ttl,
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
    /// Release such a lease through the backend that acquired it (or a
    /// clone of it): the Redis backend remembers which of its leases have
    /// a minimum, and only their releases look for it. Default: none.
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
    /// [`InputError::InvalidHoldAtLeast`] when the duration is above
    /// [`AcquireRequest::MAX_HOLD_AT_LEAST`] or not a whole number of
    /// milliseconds.
    pub fn with_hold_at_least(mut self, minimum: Duration) -> Result<Self, InputError> {
        self.hold_at_least = Self::check_hold_at_least(minimum)?;
        Ok(self)
    }

    /// Validates a minimum hold: `None` for zero.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidHoldAtLeast`] above [`AcquireRequest::MAX_HOLD_AT_LEAST`]
    /// or not in whole milliseconds.
    pub fn check_hold_at_least(minimum: Duration) -> Result<Option<Duration>, InputError> {
        let refuse = |reason: String| InputError::InvalidHoldAtLeast {
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
    /// [`InputError::InvalidLabel`] when the label is too long or has control characters.
    pub fn with_label(mut self, label: impl Into<String>) -> Result<Self, InputError> {
        let label = label.into();
        let refuse = |reason| InputError::InvalidLabel {
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

/// What a holder is told of its release (the manager's `Lease::release`
/// returns it); a backend's [`LeaseBackend::release`] reports it as a
/// [`ReleaseReport`].
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

/// The outcome of [`LeaseBackend::release`]: the [`ReleaseOutcome`], and
/// for a release whether it was heard.
///
/// A release is *heard* when its notice reached a listener other than this
/// backend's own watches, that is a waiter that may be in another process.
/// A manager then lets that waiter go first instead of taking the lease
/// straight back with its next acquisition. A backend that cannot tell
/// says `heard: false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReport {
    /// The lease was ours and is not any more (see
    /// [`ReleaseOutcome::Released`]).
    Released {
        /// Whether the release notice reached a listener other than this
        /// backend's own watches; `false` when the backend cannot tell, and
        /// for a lease kept under its minimum hold (no notice is sent).
        heard: bool,
    },
    /// The lease was not ours any more (see [`ReleaseOutcome::NotHeld`]).
    NotHeld,
}

impl ReleaseReport {
    /// What the holder is told: the report without whether it was heard.
    #[must_use]
    pub const fn outcome(self) -> ReleaseOutcome {
        match self {
            Self::Released { .. } => ReleaseOutcome::Released,
            Self::NotHeld => ReleaseOutcome::NotHeld,
        }
    }

    /// Whether a release was heard (see [`ReleaseReport`]); `false` for
    /// [`NotHeld`](Self::NotHeld).
    #[must_use]
    pub const fn heard(self) -> bool {
        matches!(self, Self::Released { heard: true })
    }
}

impl From<ReleaseReport> for ReleaseOutcome {
    fn from(report: ReleaseReport) -> Self {
        report.outcome()
    }
}

/// The outcome of [`HandoverBackend::release_to`](crate::HandoverBackend::release_to).
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

/// How [`LeaseBackend::watch_releases`] subscribes: what the waiter needs
/// of the subscription. The policy is the waiter's business; a backend
/// that has only one way to subscribe treats every policy alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WatchPolicy {
    /// A waiter that takes turns with the waiters of other processes: the
    /// watch knows how many processes listen ([`ReleaseWatch::listeners`]),
    /// where the backend can count them (Redis: one `PUBSUB NUMSUB` round
    /// trip).
    #[default]
    Counted,
    /// A waiter with no use for [`ReleaseWatch::listeners`] (a waiter in a
    /// fair queue, whose turn the server decides; an observer of a
    /// leader): a backend that counts listeners with a round trip of its
    /// own skips it.
    Uncounted,
    /// As [`Counted`](Self::Counted), for a waiter that races the waiters
    /// of other processes on each notice (a permit's, a share's: a release
    /// may make room for several, so they do not take turns). Redis tells a
    /// channel's subscribers in the order they subscribed, so a process
    /// still subscribed from an earlier wait would hear every release
    /// before the processes that subscribed after it, and win nearly every
    /// race: a backend with such an order subscribes this process anew, at
    /// the end of it.
    Afresh,
    /// As [`Uncounted`](Self::Uncounted), but only where it costs no round
    /// trip: the backend already listens on the key's channel (Redis: a
    /// channel still subscribed from an earlier wait of this process). A
    /// backend that would have to subscribe returns
    /// [`ReleaseWatch::unsupported`] instead. For a waiter that asks
    /// once before it subscribes, so that an acquisition no one contends
    /// subscribes to nothing, unless its process is listening already.
    AlreadyListening,
}

/// The core of the backend contract: one async method per atomic
/// server-side operation that every backend has.
///
/// A third-party backend starts here: it implements the four required
/// methods ([`try_acquire`](Self::try_acquire),
/// [`renew_many`](Self::renew_many), [`release`](Self::release),
/// [`inspect`](Self::inspect)) and may add
/// [`watch_releases`](Self::watch_releases), so that waiters need not poll.
/// What not every backend can do is a capability trait of its own, which a
/// backend implements when it can and announces through the accessor
/// here that returns it (`Some(self)`; the default, `None`, says the
/// backend lacks it, and the manager refuses that kind of lease with
/// [`BackendError::Unsupported`]):
///
/// | capability | trait | accessor |
/// | --- | --- | --- |
/// | counting leases | [`PermitBackend`] | [`permits`](Self::permits) |
/// | read-write leases | [`ReadWriteBackend`] | [`read_write`](Self::read_write) |
/// | fair mode | [`FairBackend`] | [`fair`](Self::fair) |
/// | handover to a local waiter | [`HandoverBackend`] | [`handover`](Self::handover) |
/// | change feed | [`ChangeBackend`] | [`changes`](Self::changes) |
/// | scheduled jobs' records | [`TickBackend`] | [`ticks`](Self::ticks) |
///
/// Backends are cheap to clone (a clone shares connections) and never spawn
/// tasks of their own. Outcomes the server decides are values; an `Err`
/// means the outcome is unknown.
///
/// # Cancel safety
///
/// Dropping a returned future before it completes leaves the operation's
/// effect unknown, as a timeout does: it may or may not have run. The same
/// holds for the capability traits.
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

    /// Frees the lease if `holder` still holds it (compare-and-delete), and
    /// reports whether the release was heard (see [`ReleaseReport`]).
    ///
    /// A lease granted with a minimum hold
    /// ([`AcquireRequest::hold_at_least`]) that has not run out is not
    /// freed: the backend keeps it, still `holder`'s, until the grant +
    /// the minimum by its own clock, and frees it by itself then, without
    /// a release notice. The outcome is [`ReleaseReport::Released`] either
    /// way: the lease is no longer the caller's to use.
    fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> impl Future<Output = Result<ReleaseReport, BackendError>> + Send;

    /// Reads who holds a lease, without changing it. `None` when it is free.
    fn inspect(
        &self,
        key: &LeaseKey,
    ) -> impl Future<Output = Result<Option<LeaseInfo>, BackendError>> + Send;

    /// Subscribes to the release notices of `key`, so a waiter can retry the
    /// moment the lease is freed instead of polling; `policy` says what the
    /// waiter needs of the subscription (see [`WatchPolicy`]).
    ///
    /// The default has no notices ([`ReleaseWatch::unsupported`]): waiters
    /// then poll. A backend that publishes notices on release overrides it;
    /// a backend that wraps another passes the policy on.
    fn watch_releases(
        &self,
        key: &LeaseKey,
        policy: WatchPolicy,
    ) -> impl Future<Output = Result<ReleaseWatch, BackendError>> + Send {
        let _ = (key, policy);
        std::future::ready(Ok(ReleaseWatch::unsupported()))
    }

    /// The backend's counting leases, if it has them: `Some(self)` from a
    /// backend that implements [`PermitBackend`]. The default has none.
    fn permits(&self) -> Option<&impl PermitBackend> {
        None::<&NoCapability>
    }

    /// The backend's read-write leases, if it has them: `Some(self)` from
    /// a backend that implements [`ReadWriteBackend`]. The default has none.
    fn read_write(&self) -> Option<&impl ReadWriteBackend> {
        None::<&NoCapability>
    }

    /// The backend's fair queue, if it has one: `Some(self)` from a
    /// backend that implements [`FairBackend`]. The default has none.
    fn fair(&self) -> Option<&impl FairBackend> {
        None::<&NoCapability>
    }

    /// The backend's handover to a local waiter, if it has one:
    /// `Some(self)` from a backend that implements [`HandoverBackend`].
    /// The default has none: a release is only a release.
    fn handover(&self) -> Option<&impl HandoverBackend> {
        None::<&NoCapability>
    }

    /// The backend's change feed, if it has one: `Some(self)` from a
    /// backend that implements [`ChangeBackend`]. The default has none:
    /// holders learn of a loss at their next renewal.
    fn changes(&self) -> Option<&impl ChangeBackend> {
        None::<&NoCapability>
    }

    /// The backend's job records for scheduled jobs, if it keeps them:
    /// `Some(self)` from a backend that implements [`TickBackend`]. The
    /// default has none.
    fn ticks(&self) -> Option<&impl TickBackend> {
        None::<&NoCapability>
    }
}
