//! What a waiter asks the backend for ([`Attempt`]): an exclusive lease, a
//! permit, or a read or write hold on a read-write lease, with the share
//! key an attempt may take and how often a waiting writer must ask again.

use std::time::Duration;

use leasehold_core::{HolderId, LeaseKey, PermitLimit, Ttl};

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
