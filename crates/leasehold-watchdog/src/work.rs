//! The one context that work under a lease is given, whichever way it
//! runs: [`with_lease`](crate::LeaseManager::with_lease), an
//! [election's](crate::Election::run) term, a scheduled job's run (a
//! [`TickRun`](crate::TickRun) is this context and its tick).

use std::fmt;
use std::sync::Arc;

use leasehold_core::FencingToken;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::bounds::Progress;
use crate::shared::Shared;
use crate::{Lease, LossReason};

/// What work under a lease is given: the lease's cancellation token (it
/// fires before the lease can be taken by another), its fencing token (for
/// the stores the work writes to), its progress reporter (for a lease
/// bound to progress), and why and until when the lease holds.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::MemoryBackend;
/// use leasehold_watchdog::{LeaseManager, LeaseOptions};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = LeaseManager::new(MemoryBackend::new())?;
/// let options = LeaseOptions::builder().progress_window(Duration::from_secs(60)).build()?;
/// let written = manager
///     .with_lease("reports:nightly", &options, |work| async move {
///         let mut written = Vec::new();
///         for chunk in 0..3 {
///             if work.is_cancelled() {
///                 break;
///             }
///             written.push((chunk, work.fencing_token())); // a fenced write
///             work.progress().report(); // the job is alive
///         }
///         written
///     })
///     .await?;
/// assert_eq!(written.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct WorkContext {
    token: CancellationToken,
    fencing_token: FencingToken,
    progress: Progress,
    lease: Arc<Shared>,
}

impl WorkContext {
    pub(crate) fn of(lease: &Lease) -> Self {
        Self {
            token: lease.token(),
            fencing_token: lease.fencing_token(),
            progress: lease.progress(),
            lease: Arc::clone(lease.shared()),
        }
    }

    /// Cancelled when the lease ends (lost, capped, past its deadline,
    /// stalled, shut down): the work should stop soon after.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether the lease has ended (its token fired).
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Waits until the lease ends.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits on the token.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// The lease's fencing token: pass it to the stores the work writes
    /// to, so that they can refuse a write from an older holder.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// The progress reporter of a lease bound to progress
    /// ([`progress_window`](crate::LeaseOptionsBuilder::progress_window));
    /// a report does nothing for a lease without one.
    #[must_use]
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// Why the lease ended, once its token fired.
    #[must_use]
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.lease.loss()
    }

    /// Until when, on this process's monotonic clock, the lease is
    /// certainly held, as of its last renewal.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.lease.valid_until()
    }
}

impl fmt::Debug for WorkContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkContext")
            .field("fencing_token", &self.fencing_token)
            .field("loss", &self.loss_reason())
            .finish_non_exhaustive()
    }
}
