//! Why a lease ends: the [`LossReason`] a holder's token is cancelled
//! with, as the handle, the watchdog and the metrics name it.

use std::fmt;

/// Why a lease's token was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The server said the lease is gone or held by someone else.
    Lost,
    /// The configured cap on renewals was reached; the token fired before
    /// the last renewal's validity ran out.
    RenewalLimit,
    /// Renewals kept failing or hanging until the lease's certain validity,
    /// less the safety margin, ran out. Decided on the local clock alone.
    Deadline,
    /// The manager is shutting down and releases every lease.
    Shutdown,
    /// The lease reached its maximum hold
    /// ([`LeaseOptionsBuilder::hold_at_most`](crate::LeaseOptionsBuilder::hold_at_most)):
    /// it was not renewed past it, and the token fired before the last
    /// renewal's validity, less the safety margin, ran out.
    MaxHold,
    /// The holder reported no progress within its window
    /// ([`LeaseOptionsBuilder::progress_window`](crate::LeaseOptionsBuilder::progress_window)),
    /// so the lease was not renewed; the token fired at the renewal that
    /// found it stalled, long before the lease could expire.
    Stalled,
}

impl LossReason {
    /// A short lowercase name, as used in metrics labels.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lost => "lost",
            Self::RenewalLimit => "renewal_limit",
            Self::Deadline => "deadline",
            Self::Shutdown => "shutdown",
            Self::MaxHold => "max_hold",
            Self::Stalled => "stalled",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lost => {
                "the server no longer has it for this holder (expired, deleted or taken over)"
            }
            Self::RenewalLimit => "the cap on renewals was reached",
            Self::Deadline => "renewals did not succeed in time, so it may expire",
            Self::Shutdown => "the lease manager shut down",
            Self::MaxHold => "it reached its maximum hold",
            Self::Stalled => "the job reported no progress within its window",
        })
    }
}
