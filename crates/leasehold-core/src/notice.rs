//! Release notices: how a waiter learns that a lease was freed.

use std::fmt;

use tokio::sync::watch;

/// A subscription to the release notices of one lease key.
///
/// [`released`](Self::released) completes when a holder releases the lease
/// (or when the backend may have missed notices, for example after a
/// reconnect). Notices are a hint to retry at once, never a grant: a waiter
/// always tries to acquire after one, and keeps a fallback poll in case a
/// notice is lost or the lease expires without a release.
///
/// Dropping the watch ends the subscription.
pub struct ReleaseWatch {
    notices: Option<watch::Receiver<u64>>,
    _subscription: Option<Box<dyn Send + Sync>>,
}

impl ReleaseWatch {
    /// A watch fed by a counter that the backend bumps on every notice; the
    /// `subscription` is kept alive as long as the watch and dropped with it
    /// (a backend uses it to unsubscribe).
    pub fn new(notices: watch::Receiver<u64>, subscription: impl Send + Sync + 'static) -> Self {
        Self {
            notices: Some(notices),
            _subscription: Some(Box::new(subscription)),
        }
    }

    /// A watch that never fires, for backends without notices: waiters then
    /// rely on their fallback poll alone.
    #[must_use]
    pub fn unsupported() -> Self {
        Self {
            notices: None,
            _subscription: None,
        }
    }

    /// Whether notices can arrive at all.
    #[must_use]
    pub fn is_supported(&self) -> bool {
        self.notices.is_some()
    }

    /// Waits for the next notice. Never completes for an unsupported watch,
    /// or once the backend has dropped the subscription.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a notice that arrives while no one waits is kept and
    /// completes the next call.
    pub async fn released(&mut self) {
        if let Some(notices) = &mut self.notices
            && notices.changed().await.is_ok()
        {
            return;
        }
        std::future::pending().await
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("supported", &self.is_supported())
            .finish()
    }
}
