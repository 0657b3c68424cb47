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
    /// One receiver per subscription; none for an unsupported watch, several
    /// for [`any`](Self::any).
    notices: Vec<watch::Receiver<u64>>,
    _subscriptions: Vec<Box<dyn Send + Sync>>,
    /// How many processes listened for the key's notices when the watch
    /// subscribed, this one included, if the backend can tell.
    listeners: Option<usize>,
}

impl ReleaseWatch {
    /// A watch fed by a counter that the backend bumps on every notice; the
    /// `subscription` is kept alive as long as the watch and dropped with it
    /// (a backend uses it to unsubscribe).
    pub fn new(notices: watch::Receiver<u64>, subscription: impl Send + Sync + 'static) -> Self {
        Self {
            notices: vec![notices],
            _subscriptions: vec![Box::new(subscription)],
            listeners: None,
        }
    }

    /// The same watch, knowing that `listeners` processes (this one
    /// included) listened for the key's notices when it subscribed: the
    /// server's count of the channel's subscribers.
    #[must_use]
    pub fn with_listeners(mut self, listeners: usize) -> Self {
        self.listeners = Some(listeners);
        self
    }

    /// How many processes listened for the key's notices when the watch
    /// subscribed, this one included; `None` when the backend cannot tell.
    /// Waiters use it to let the process that waited longest go first.
    #[must_use]
    pub fn listeners(&self) -> Option<usize> {
        self.listeners
    }

    /// A watch that fires when any of `watches` does: the first notice
    /// wins. Unsupported watches among them add nothing; with no supported
    /// one, the result is [`unsupported`](Self::unsupported). (Redlock uses
    /// it to listen on every master that answered.)
    #[must_use]
    pub fn any(watches: impl IntoIterator<Item = ReleaseWatch>) -> Self {
        let mut any = Self::unsupported();
        for watch in watches {
            any.notices.extend(watch.notices);
            any._subscriptions.extend(watch._subscriptions);
            any.listeners = any.listeners.max(watch.listeners);
        }
        any
    }

    /// A watch that never fires, for backends without notices: waiters then
    /// rely on their fallback poll alone.
    #[must_use]
    pub fn unsupported() -> Self {
        Self {
            notices: Vec::new(),
            _subscriptions: Vec::new(),
            listeners: None,
        }
    }

    /// Whether notices can arrive at all.
    #[must_use]
    pub fn is_supported(&self) -> bool {
        !self.notices.is_empty()
    }

    /// Waits for the next notice. Never completes for an unsupported watch,
    /// or once the backend has dropped every subscription.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a notice that arrives while no one waits is kept and
    /// completes the next call.
    pub async fn released(&mut self) {
        if let [notices] = self.notices.as_mut_slice() {
            if notices.changed().await.is_ok() {
                return;
            }
            return std::future::pending().await;
        }
        // Each `changed` is cancel safe, so dropping the others is too. A
        // subscription whose backend went away is never polled again.
        let mut waits: Vec<_> = self
            .notices
            .iter_mut()
            .map(|n| Some(Box::pin(n.changed())))
            .collect();
        std::future::poll_fn(|cx| {
            for slot in &mut waits {
                if let Some(wait) = slot
                    && let std::task::Poll::Ready(result) = wait.as_mut().poll(cx)
                {
                    if result.is_ok() {
                        return std::task::Poll::Ready(());
                    }
                    *slot = None;
                }
            }
            std::task::Poll::Pending
        })
        .await;
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch")
            .field("supported", &self.is_supported())
            .field("listeners", &self.listeners)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn any_fires_on_the_first_notice_of_any_watch() {
        let (a, b) = (watch::Sender::new(0u64), watch::Sender::new(0u64));
        let mut any = ReleaseWatch::any([
            ReleaseWatch::new(a.subscribe(), ()),
            ReleaseWatch::unsupported(),
            ReleaseWatch::new(b.subscribe(), ()),
        ]);
        assert!(any.is_supported());
        let quiet = tokio::time::timeout(std::time::Duration::from_secs(1), any.released());
        assert!(quiet.await.is_err(), "fired without a notice");
        b.send_modify(|n| *n += 1);
        any.released().await;
        a.send_modify(|n| *n += 1);
        any.released().await;
        let none = ReleaseWatch::any([ReleaseWatch::unsupported()]);
        assert!(!none.is_supported());
    }
}
