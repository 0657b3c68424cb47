//! A waiting writer's intent ([`IntentGuard`]): the mark a refused writer
//! leaves on a read-write lease so that new readers wait behind it (see
//! `rw.rs` and write.lua), withdrawn when the writer gives up rather than
//! left to expire.
//!
//! Its own module, not rw.rs's, as every acquisition holds a guard (unarmed
//! but for writers): the manager's acquisition path uses it, while rw.rs
//! only adds the read and write entry points to the manager.

use leasehold_core::{HolderId, LeaseBackend, LeaseKey};
use tracing::debug;

use crate::attempt::Attempt;

/// Withdraws the intent a writer's refusals left on the server unless the
/// writer got the lease ([`disarm`](Self::disarm)): at once when the wait
/// gives up ([`withdraw`](Self::withdraw)), and in the background when the
/// acquisition is dropped (`Drop` never waits). Does nothing for readers,
/// leases and permits.
pub(crate) struct IntentGuard<B: LeaseBackend> {
    /// The backend, the read-write lease and the writer, while armed.
    armed: Option<(B, LeaseKey, HolderId)>,
}

impl<B: LeaseBackend> IntentGuard<B> {
    pub(crate) fn new(backend: &B, key: &LeaseKey, holder: HolderId, attempt: Attempt) -> Self {
        Self {
            armed: matches!(attempt, Attempt::Write)
                .then(|| (backend.clone(), key.clone(), holder)),
        }
    }

    /// The writer got the lease: its grant cleared the intent.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }

    /// The wait gave up: withdraw the intent now, best effort.
    pub(crate) async fn withdraw(mut self) {
        if let Some((backend, key, holder)) = self.armed.take() {
            withdraw(backend, key, holder).await;
        }
    }
}

impl<B: LeaseBackend> Drop for IntentGuard<B> {
    fn drop(&mut self) {
        // Dropped while armed: the acquisition's future was dropped.
        if let Some((backend, key, holder)) = self.armed.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(withdraw(backend, key, holder));
        }
    }
}

/// One compare-and-delete of `holder`'s intent on `key`; a failure leaves
/// the intent to expire by itself.
async fn withdraw<B: LeaseBackend>(backend: B, key: LeaseKey, holder: HolderId) {
    if let Err(error) = crate::capability::withdraw_write_intent(&backend, &key, &holder).await {
        debug!(key = %key, %error, "could not withdraw a writer's intent; it expires by itself");
    }
}
