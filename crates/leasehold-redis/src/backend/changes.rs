//! The change feed: client tracking's reports (`tracking.rs`).

use leasehold_core::{BackendError, ChangeBackend, ChangeWatch};

use super::RedisBackend;

impl ChangeBackend for RedisBackend {
    /// Reports the changes the server pushes for the leases renewed by this
    /// backend (and its clones), when client tracking is on (see
    /// [`RedisBackendBuilder::track_lease_changes`](crate::RedisBackendBuilder::track_lease_changes));
    /// a lost renewal connection is reported as [`LeaseChange::All`](leasehold_core::LeaseChange::All).
    /// The watch ends (`next` returns `None`) when tracking is turned off
    /// for good: the server refused it, or its tracking table overflowed.
    /// Behind Sentinel, a promotion a sentinel announces (`+switch-master`)
    /// and a new resolution of the master are reported as `All` too. Cluster deployments report nothing (the redis crate's
    /// cluster client turns no tracking on for its node connections):
    /// holders there learn of a change at their next renewal.
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        Ok(match &self.shared.tracking {
            Some(tracking) if tracking.is_on() => tracking.watch(),
            _ => ChangeWatch::unsupported(),
        })
    }
}
