//! Counting leases through the manager: [`LeaseManager::acquire_permit`]
//! takes one of a semaphore's permits and returns an ordinary [`Lease`].
//!
//! A permit is a lease on its own permit key (`{K}:permit:i`, see
//! [`LeaseKey::permit`]): the watchdog renews it in the same batches as any
//! lease, and its token, loss reasons, renewal cap, release, drop and
//! shutdown are those of any lease. Its fencing token comes from the
//! semaphore's counter, so tokens strictly increase across all permits of
//! a semaphore.
//!
//! Waiting is the exclusive wait with another attempt (`waiting.rs`):
//! waiters for a semaphore queue in this manager under the semaphore key,
//! the head listens on the semaphore's release notices (every permit's
//! release is announced there), and the wait, the jittered retries and the
//! bound on waiters are the same. Permits take no part in the local
//! handover, so a release never hands a permit to a waiter for an
//! exclusive lease or the other way round.

use leasehold_core::{LeaseBackend, LeaseKey, PermitLimit};
use tracing::info_span;

use crate::attempt::Attempt;
use crate::{Lease, LeaseError, LeaseManager, LeaseOptions};

impl<B: LeaseBackend> LeaseManager<B> {
    /// Takes one of the `limit` permits of the semaphore `key`, waiting up
    /// to `options.wait()` while all of them are held (with no wait, tries
    /// once), and hands the permit to the watchdog.
    ///
    /// The returned [`Lease`] is that permit: [`Lease::key`] is `key`, and
    /// [`Lease::server_key`] the permit key it holds (`{key}:permit:i`);
    /// everything else is as for
    /// [`acquire`](Self::acquire), including the local FIFO queue (under
    /// `key`), the release notices (of `key`, where every permit's release
    /// is announced) and the retries between them. Every holder of a
    /// semaphore must use the same `limit`; it may change once all permits
    /// are free.
    ///
    /// ```
    /// use leasehold_core::{MemoryBackend, PermitLimit};
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let limit = PermitLimit::new(4)?;
    /// let permit = manager.acquire_permit("exports", limit, &LeaseOptions::default()).await?;
    /// assert_eq!(permit.key().as_str(), "exports");
    /// assert_eq!(permit.server_key().as_str(), "{exports}:permit:0");
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), and at once, without retrying:
    /// [`LeaseError::Backend`] with
    /// [`BackendError::PermitLimitMismatch`](leasehold_core::BackendError::PermitLimitMismatch)
    /// when the semaphore's permits are held under another limit, or with
    /// [`BackendError::Unsupported`](leasehold_core::BackendError::Unsupported)
    /// from a backend without permits (Redlock). [`LeaseError::Invalid`]
    /// also when `key` leaves no room for its permit keys.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue; if an attempt in flight may
    /// have taken a permit on the server, the watchdog releases it in the
    /// background (which permit is unknown, so it asks for each of the
    /// `limit` permit keys to be released for this holder).
    pub async fn acquire_permit(
        &self,
        key: impl AsRef<str>,
        limit: PermitLimit,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        let key = LeaseKey::new(key)?;
        // A key too long for its permits is refused before anyone queues.
        key.permit(limit.get() - 1)?;
        let span =
            info_span!("acquire_permit", key = %key, limit = limit.get(), name = %options.name());
        self.acquire_measured(
            key,
            options,
            Attempt::Permit(limit),
            crate::metrics::Kind::Permit,
            span,
        )
        .await
    }
}
