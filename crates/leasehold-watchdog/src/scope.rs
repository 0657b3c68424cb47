//! Running a future under a lease.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use leasehold_core::LeaseBackend;
use tracing::{Instrument, warn};

use crate::{LeaseError, LeaseManager, LeaseOptions, WorkContext};

impl<B: LeaseBackend> LeaseManager<B> {
    /// Acquires `key`, runs `work` with the lease's [`WorkContext`] (its
    /// token, fencing token and progress reporter), and releases the lease
    /// on every path: success, error, panic, and the returned future being
    /// dropped.
    ///
    /// The work is stopped cooperatively: it should return soon after the
    /// context's token is cancelled. Its output is returned only
    /// if the lease was held throughout; if the lease ended first, the result
    /// is [`LeaseError::LeaseEnded`] with the reason, whatever the work
    /// returned, since some of it may have run unguarded.
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let rows = manager
    ///     .with_lease("billing:close-month", &LeaseOptions::default(), |work| async move {
    ///         let mut rows = 0;
    ///         while rows < 1000 && !work.is_cancelled() {
    ///             rows += 1; // one unit of work between checks
    ///         }
    ///         rows
    ///     })
    ///     .await?;
    /// assert_eq!(rows, 1000);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Every error of [`acquire`](Self::acquire), and
    /// [`LeaseError::LeaseEnded`] when the lease ended before the work did.
    /// A failure to release after successful work is logged, not returned:
    /// the lease then expires by itself within its ttl.
    ///
    /// # Panics
    ///
    /// A panic in `work` is resumed after the lease is released.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the work and releases the lease in the
    /// background.
    pub async fn with_lease<F, Fut, T>(
        &self,
        key: impl AsRef<str>,
        options: &LeaseOptions,
        work: F,
    ) -> Result<T, LeaseError>
    where
        F: FnOnce(WorkContext) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(key, options).await?;
        // Inside the lease's span (`Lease::span`).
        let outcome = AssertUnwindSafe(work(WorkContext::of(&lease)).instrument(lease.span()))
            .catch_unwind()
            .await;
        let ended = lease.loss_reason();
        let key = lease.key().to_string();
        if let Err(error) = lease.release().await {
            warn!(%key, %error, "release after the work failed; the lease expires by itself");
        }
        match (outcome, ended) {
            (Err(panic), _) => std::panic::resume_unwind(panic),
            (Ok(_), Some(reason)) => Err(LeaseError::LeaseEnded { key, reason }),
            (Ok(value), None) => Ok(value),
        }
    }
}
