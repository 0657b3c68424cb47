//! What a successful acquisition or renewal hands back.

use tokio::time::Instant;

use crate::{FencingToken, HolderId, LeaseKey, Ttl, clock_drift};

/// A lease granted by a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The lease key.
    pub key: LeaseKey,
    /// The holder the lease was granted to.
    pub holder: HolderId,
    /// The fencing token of this acquisition.
    pub fencing_token: FencingToken,
    /// The ttl the server was asked for.
    pub ttl: Ttl,
    /// When the request that granted the lease was sent, on this process's
    /// monotonic clock.
    pub sent_at: Instant,
    /// Until when, on this process's monotonic clock, the lease is certainly
    /// still held: the moment the request was *sent*, plus the ttl, minus the
    /// [`clock_drift`] allowance. Never derived from a wall clock.
    pub valid_until: Instant,
}

impl Grant {
    /// Builds a grant for a request sent at `sent_at`.
    #[must_use]
    pub fn new(
        key: LeaseKey,
        holder: HolderId,
        fencing_token: FencingToken,
        ttl: Ttl,
        sent_at: Instant,
    ) -> Self {
        Self {
            valid_until: valid_until(sent_at, ttl),
            sent_at,
            key,
            holder,
            fencing_token,
            ttl,
        }
    }
}

impl Grant {
    /// Builds the grant of a lease that a release handed to a waiter in a
    /// fair queue (see [`FairBackend::release_fair`]). The server kept it
    /// for `hold` from when it last saw the waiter's place call, which this
    /// process sent at `placed_at`; so the lease is certainly held until
    /// `placed_at + hold`, less the [`clock_drift`] allowance of the ttl,
    /// however late the handover came. Its renewals then extend it to the
    /// full `ttl`.
    ///
    /// [`FairBackend::release_fair`]: crate::FairBackend::release_fair
    #[must_use]
    pub fn handed_over(
        key: LeaseKey,
        holder: HolderId,
        fencing_token: FencingToken,
        ttl: Ttl,
        placed_at: Instant,
        hold: std::time::Duration,
    ) -> Self {
        Self {
            valid_until: placed_at + hold.saturating_sub(clock_drift(ttl.get())),
            sent_at: placed_at,
            key,
            holder,
            fencing_token,
            ttl,
        }
    }
}

/// The end of a lease's certain validity for a request sent at `sent_at`.
#[must_use]
pub fn valid_until(sent_at: Instant, ttl: Ttl) -> Instant {
    // Ttl::MIN (100 ms) exceeds the drift (3 ms at that ttl), so this never underflows.
    sent_at + (ttl.get() - clock_drift(ttl.get()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key() -> LeaseKey {
        LeaseKey::new("grant-test").expect("a valid key")
    }

    /// Certain validity ends the ttl less the drift allowance after the
    /// request was sent: later than the send, earlier than the ttl.
    #[test]
    fn valid_until_is_the_ttl_less_the_drift_after_the_send() {
        let sent = Instant::now();
        for ms in [100, 1_000, 30_000] {
            let ttl = Ttl::new(Duration::from_millis(ms)).expect("a valid ttl");
            let until = valid_until(sent, ttl);
            assert_eq!(until, sent + ttl.get() - clock_drift(ttl.get()), "{ms} ms");
            assert!(until > sent && until < sent + ttl.get(), "{ms} ms");
        }
    }

    /// A handed-over grant is valid for the hold less the drift of its
    /// ttl, counted from when the place was taken, which it reports as
    /// its send.
    #[test]
    fn a_handed_over_grant_is_valid_for_its_hold_less_the_drift() {
        let placed = Instant::now();
        let ttl = Ttl::new(Duration::from_secs(10)).expect("a valid ttl");
        let hold = Duration::from_secs(4);
        let holder = HolderId::generate().expect("a holder id");
        let grant = Grant::handed_over(key(), holder, FencingToken(7), ttl, placed, hold);
        assert_eq!(grant.sent_at, placed);
        assert_eq!(grant.valid_until, placed + hold - clock_drift(ttl.get()));
        assert_eq!(grant.fencing_token, FencingToken(7));
        // A hold shorter than the drift leaves no validity, not an underflow.
        let none = Grant::handed_over(key(), holder, FencingToken(8), ttl, placed, Duration::ZERO);
        assert_eq!(none.valid_until, placed);
    }
}
