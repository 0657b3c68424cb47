//! Change notices: how a holder learns, between renewals, that a held
//! lease may have changed on the server.

use std::fmt;

use tokio::sync::mpsc;

use crate::LeaseKey;

/// What a backend reports through a [`ChangeWatch`].
///
/// A change is a hint to renew at once, never a verdict: the renewal's
/// outcome says whether the lease is still held. A backend may report a
/// change that did not affect the holder (its own release, a key sharing
/// the lease's name), never the other way round while the watch works.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseChange {
    /// This lease may have been changed, deleted or taken over.
    Changed(LeaseKey),
    /// Any lease may have changed: the server was flushed, or the
    /// connection that watched for changes was lost (changes may have been
    /// missed meanwhile).
    All,
}

/// A subscription to the changes of the leases a backend renews.
///
/// [`next`](Self::next) completes with each change the backend reports.
/// Dropping the watch ends the subscription.
pub struct ChangeWatch {
    changes: Option<mpsc::UnboundedReceiver<LeaseChange>>,
}

impl ChangeWatch {
    /// A watch fed by a backend through `changes`; the backend drops its
    /// sender when it stops reporting.
    #[must_use]
    pub fn new(changes: mpsc::UnboundedReceiver<LeaseChange>) -> Self {
        Self {
            changes: Some(changes),
        }
    }

    /// A watch that never reports, for backends that cannot: holders then
    /// learn of a change at their next renewal.
    #[must_use]
    pub fn unsupported() -> Self {
        Self { changes: None }
    }

    /// Whether changes can be reported at all.
    #[must_use]
    pub fn is_supported(&self) -> bool {
        self.changes.is_some()
    }

    /// Waits for the next change. Returns `None` once the backend has
    /// stopped reporting (and at once for an unsupported watch), after
    /// which it keeps returning `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change reported while no one waits is kept for the
    /// next call.
    pub async fn next(&mut self) -> Option<LeaseChange> {
        let changes = self.changes.as_mut()?;
        let change = changes.recv().await;
        if change.is_none() {
            self.changes = None;
        }
        change
    }

    /// A change already reported, without waiting; `None` when there is none yet.
    pub fn try_next(&mut self) -> Option<LeaseChange> {
        self.changes.as_mut()?.try_recv().ok()
    }
}

impl fmt::Debug for ChangeWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeWatch")
            .field("supported", &self.is_supported())
            .finish()
    }
}

/// The senders of every open [`ChangeWatch`] of one backend: a backend
/// keeps one and reports each change to all of them.
#[derive(Debug, Default)]
pub struct ChangeFeed {
    watchers: Vec<mpsc::UnboundedSender<LeaseChange>>,
}

impl ChangeFeed {
    /// An empty feed.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A new watch that receives every change reported from now on.
    pub fn subscribe(&mut self) -> ChangeWatch {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.watchers.push(sender);
        ChangeWatch::new(receiver)
    }

    /// Reports `change` to every open watch and forgets the dropped ones.
    pub fn report(&mut self, change: &LeaseChange) {
        self.watchers
            .retain(|watcher| watcher.send(change.clone()).is_ok());
    }

    /// Whether any watch is open.
    #[must_use]
    pub fn is_watched(&mut self) -> bool {
        self.watchers.retain(|watcher| !watcher.is_closed());
        !self.watchers.is_empty()
    }
}
