//! What a waiter asks the backend for ([`Attempt`]): an exclusive lease, a
//! permit, or a read or write hold on a read-write lease, with the share
//! key an attempt may take and how often a waiting writer must ask again.

use std::time::Duration;

use leasehold_core::{HolderId, LeaseKey, PermitLimit, Ttl};

use crate::{LeaseError, LeaseOptions};

/// What a waiter asks the backend for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Attempt {
    /// The exclusive lease of the key.
    Lease,
    /// One of the key's permits, the key naming a semaphore of this limit.
    /// Permits never take part in the local handover (no offer, no baton):
    /// a baton says "the lease is held here", which says nothing of a
    /// semaphore's other permits, and an offer must never be answered by a
    /// release of the other kind.
    Permit(PermitLimit),
    /// A shared (read) hold on the read-write lease of the key (`rw.rs`).
    /// Shares never take part in the local handover either, for the
    /// permits' reasons.
    Read,
    /// The exclusive (write) hold on the read-write lease of the key.
    Write,
}

impl Attempt {
    /// Refuses the options that mean nothing to this kind of lease, before
    /// the backend is asked, rather than ignoring them. Every other option
    /// applies to every kind: the durations, the wait and the backoff, the
    /// renewal cap, the maximum hold and the progress window are the
    /// watchdog's and the waiter's, and the label, the lock-delay and the
    /// release notices reach every kind's key on the server. What a backend
    /// cannot do for a kind it can do for others (Redlock: permits, shares,
    /// fair mode, a minimum hold) is its own refusal,
    /// `BackendError::Unsupported`.
    pub(crate) fn refuse_inapplicable(
        self,
        key: &LeaseKey,
        options: &LeaseOptions,
    ) -> Result<(), LeaseError> {
        let kind = match self {
            Self::Lease => return Ok(()),
            Self::Permit(_) => "a permit",
            Self::Read => "a read share",
            Self::Write => "a write share",
        };
        let refuse = |option, reason| LeaseError::NotApplicable {
            key: key.as_str().to_owned(),
            option,
            kind,
            reason,
        };
        if options.fair().is_some() {
            return Err(refuse(
                "fair",
                "the server's fair queue orders the waiters for one exclusive lease; permits and shares have none",
            ));
        }
        if options.hold_at_least().is_some() {
            // A permit or a share kept after its release would block the
            // other holders it is meant to let in.
            return Err(refuse(
                "hold_at_least",
                "a minimum hold keeps one holder's key taken after its release, which would block the holders a permit or a share lets in",
            ));
        }
        Ok(())
    }

    /// The share key this attempt by `holder` on `key` may take, for
    /// releasing it when the attempt's outcome is unknown.
    pub(crate) fn share_key(self, key: &LeaseKey, holder: &HolderId) -> Option<LeaseKey> {
        match self {
            Self::Read => key.reader_key(holder).ok(),
            Self::Write => key.writer_key().ok(),
            Self::Lease | Self::Permit(_) => None,
        }
    }
}

/// The longest a waiting writer goes between attempts: a third of its ttl,
/// as the renewal interval, so that the intent each refusal leaves for one
/// ttl is refreshed with two thirds of it to spare for the round trip.
pub(crate) fn intent_refresh(ttl: Ttl) -> Duration {
    ttl.get() / 3
}
