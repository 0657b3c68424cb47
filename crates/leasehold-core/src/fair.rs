//! Fair mode: waiters of every process queue on the server, in arrival order.
//!
//! Without it, waiters are first-come first-served inside one manager, but
//! across processes the lease goes to whichever retry reaches the server
//! first after a release. In fair mode a waiter takes a *place* in a queue
//! the server keeps beside the lease, and the lease is granted only to the
//! waiter at the head of that queue, when the lease is free (see
//! [`FairBackend::try_acquire_fair`]). Once granted it is an ordinary
//! lease: renewed, released, fenced and delayed as any other.
//!
//! A place lives for a bounded time, the *place ttl*, and each call
//! refreshes it: a waiter that died (its process killed, its runtime
//! dropped) stops refreshing, and once its place expires the queue skips
//! it. A waiter that gives up leaves its place at once
//! ([`FairBackend::leave_fair_queue`]).
//!
//! [`FairBackend::try_acquire_fair`]: crate::FairBackend::try_acquire_fair
//! [`FairBackend::leave_fair_queue`]: crate::FairBackend::leave_fair_queue

use std::time::Duration;

use tokio::sync::oneshot;

use crate::{FencingToken, Grant, HolderId, InputError, LeaseInfo};

/// How long a waiter's place in a fair queue lives without being refreshed:
/// the bound on how long a waiter that died holds up the ones behind it.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::PlaceTtl;
/// assert_eq!(PlaceTtl::new(Duration::from_secs(2))?.get(), Duration::from_secs(2));
/// assert!(PlaceTtl::new(Duration::from_millis(10)).is_err());
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PlaceTtl(Duration);

impl PlaceTtl {
    /// The shortest place ttl: a waiter refreshes its place a few times
    /// per place ttl, each a round trip, so much shorter would spend the
    /// server on refreshes.
    pub const MIN: Duration = Duration::from_millis(100);
    /// The longest place ttl: a dead waiter holds up the queue this long.
    pub const MAX: Duration = Duration::from_secs(60);
    /// The default, 2 seconds.
    pub const DEFAULT: Self = Self(Duration::from_secs(2));

    /// Validates a place ttl.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidDuration`] when `ttl` is below [`PlaceTtl::MIN`],
    /// above [`PlaceTtl::MAX`], or not in whole milliseconds.
    pub fn new(ttl: Duration) -> Result<Self, InputError> {
        let refuse = |reason: &str| InputError::InvalidDuration {
            value: humantime::format_duration(ttl).to_string(),
            reason: reason.to_owned(),
        };
        if ttl < Self::MIN {
            return Err(refuse(
                "a fair queue place ttl must be at least 100ms: waiters refresh their place a few times per place ttl",
            ));
        }
        if ttl > Self::MAX {
            return Err(refuse(
                "a fair queue place ttl may be at most 60s: a waiter that died holds up the queue that long",
            ));
        }
        if !ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(refuse(
                "a fair queue place ttl must be whole milliseconds (the server counts places in them)",
            ));
        }
        Ok(Self(ttl))
    }

    /// The duration.
    #[must_use]
    pub fn get(self) -> Duration {
        self.0
    }

    /// In whole milliseconds, as the server counts it.
    #[must_use]
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl Default for PlaceTtl {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl From<PlaceTtl> for Duration {
    fn from(ttl: PlaceTtl) -> Duration {
        ttl.get()
    }
}

/// A waiter's place in a fair queue, as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FairPlace {
    /// How many live places are ahead of this one: 0 at the head.
    pub ahead: u32,
    /// How many live places the queue has, this one included.
    pub queued: u32,
    /// The lease's holder, when it is held; `None` when it is free and
    /// waits for the head to take it.
    pub holder: Option<LeaseInfo>,
}

/// The outcome of [`FairBackend::try_acquire_fair`](crate::FairBackend::try_acquire_fair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FairOutcome {
    /// The lease is ours; `queued` places are left behind us.
    Acquired {
        /// The lease, as [`try_acquire`](crate::LeaseBackend::try_acquire) grants it.
        grant: Grant,
        /// The places still queued.
        queued: u32,
    },
    /// Not our turn yet (or the lease is held): our place is kept.
    Waiting(FairPlace),
}

/// Where a waiter in a fair queue learns that a release handed it the
/// lease ([`FairBackend::release_fair`]): the fencing token of the grant.
///
/// A release that hands over grants the lease to the queue's head on the
/// server, in the same atomic operation, and tells the head's process; the
/// head then holds the lease without asking again. A backend that never
/// hands over returns [`HandoverWatch::unsupported`], whose
/// [`handed_over`](Self::handed_over) never completes.
///
/// [`FairBackend::release_fair`]: crate::FairBackend::release_fair
pub struct HandoverWatch {
    grant: Option<oneshot::Receiver<FencingToken>>,
    _registration: Option<Box<dyn Send + Sync>>,
}

impl HandoverWatch {
    /// A watch completed by `grant`; `registration` is kept as long as the
    /// watch and dropped with it (a backend uses it to stop listening).
    pub fn new(
        grant: oneshot::Receiver<FencingToken>,
        registration: impl Send + Sync + 'static,
    ) -> Self {
        Self {
            grant: Some(grant),
            _registration: Some(Box::new(registration)),
        }
    }

    /// A watch that never completes, for a backend that never hands over.
    #[must_use]
    pub fn unsupported() -> Self {
        Self {
            grant: None,
            _registration: None,
        }
    }

    /// Whether a handover can be announced to this watch at all.
    #[must_use]
    pub fn is_supported(&self) -> bool {
        self.grant.is_some()
    }

    /// Waits until a release hands the lease to this waiter, and returns
    /// the grant's fencing token. Never completes for an unsupported watch,
    /// once the backend dropped its side, or after it completed once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a handover announced while no one waits is kept and
    /// completes the next call.
    pub async fn handed_over(&mut self) -> FencingToken {
        if let Some(grant) = self.grant.as_mut()
            && let Ok(token) = grant.await
        {
            self.grant = None;
            return token;
        }
        self.grant = None;
        std::future::pending().await
    }
}

impl std::fmt::Debug for HandoverWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandoverWatch")
            .field("supported", &self.is_supported())
            .finish()
    }
}

/// One fair queue, as the in-memory backend keeps it: places in arrival
/// order, each with its expiry.
#[derive(Debug)]
pub(crate) struct FairQueue<T> {
    places: Vec<(HolderId, T)>,
}

impl<T> Default for FairQueue<T> {
    fn default() -> Self {
        Self { places: Vec::new() }
    }
}

impl<T: Copy + PartialOrd> FairQueue<T> {
    /// Drops the places expired at `now`, then refreshes `holder`'s place to
    /// expire at `expires_at`, taking one at the tail if it has none.
    /// Returns how many are ahead of it and how many are queued.
    pub(crate) fn enter(&mut self, holder: HolderId, now: T, expires_at: T) -> (u32, u32) {
        self.places.retain(|(_, at)| *at > now);
        let ahead = match self.places.iter().position(|(h, _)| *h == holder) {
            Some(at) => {
                self.places[at].1 = expires_at;
                at
            }
            None => {
                self.places.push((holder, expires_at));
                self.places.len() - 1
            }
        };
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        (count(ahead), count(self.places.len()))
    }

    /// Removes `holder`'s place, if it has one.
    pub(crate) fn leave(&mut self, holder: &HolderId) {
        self.places.retain(|(h, _)| h != holder);
    }

    /// How many places are queued.
    pub(crate) fn len(&self) -> u32 {
        u32::try_from(self.places.len()).unwrap_or(u32::MAX)
    }

    /// Whether no place is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.places.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_keep_arrival_order_and_expire() -> Result<(), InputError> {
        let (a, b, c) = (
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
        );
        let mut queue = FairQueue::default();
        assert_eq!(queue.enter(a, 0, 10), (0, 1));
        assert_eq!(queue.enter(b, 1, 11), (1, 2));
        assert_eq!(queue.enter(c, 2, 12), (2, 3));
        // A refresh keeps the place.
        assert_eq!(queue.enter(b, 3, 20), (1, 3));
        // `a` expired at 10: skipped.
        assert_eq!(queue.enter(c, 10, 20), (1, 2));
        queue.leave(&b);
        assert_eq!(queue.enter(c, 11, 21), (0, 1));
        assert_eq!(queue.len(), 1);
        Ok(())
    }

    #[test]
    fn place_ttls_are_bounded() {
        assert!(PlaceTtl::new(Duration::from_millis(99)).is_err());
        assert!(PlaceTtl::new(Duration::from_secs(61)).is_err());
        assert!(PlaceTtl::new(Duration::from_micros(100_500)).is_err());
        assert!(PlaceTtl::new(PlaceTtl::MIN).is_ok());
        assert!(PlaceTtl::new(PlaceTtl::MAX).is_ok());
    }
}
