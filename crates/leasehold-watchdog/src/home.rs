//! What a [`Lease`](crate::Lease) handle keeps of its manager: the
//! watchdog's command channel, and a release it can run on its own task.
//!
//! `Lease::release` frees the lease from the caller's task instead of asking
//! the watchdog task to do it: the release (and a local handover to the next
//! waiter) then reaches the server without first waking another task, which
//! is most of a contended key's gap between one holder and the next. The
//! watchdog is only told to forget the lease.
//!
//! [`OrphanGuard`] hands the watchdog a release that no task will finish:
//! an abandoned acquisition of unknown outcome, or a dropped release.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use leasehold_core::{BackendError, HolderId, LeaseBackend, LeaseKey, PermitLimit, ReleaseOutcome};
use tokio::sync::mpsc;

use crate::queue::Queues;
use crate::renewal::{Command, Registry};

/// A boxed, sendable future: the release future's type cannot be named
/// through the type-erased backend.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A manager's side of its handles, shared by all of them (one pointer per
/// handle, whatever the backend's type).
pub(crate) struct Home {
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    /// New leases, and leases released here, for the watchdog.
    pub(crate) registry: Arc<Registry>,
    releaser: Box<dyn Releaser>,
}

impl Home {
    pub(crate) fn new<B: LeaseBackend>(
        commands: mpsc::UnboundedSender<Command>,
        registry: Arc<Registry>,
        backend: B,
        queues: Arc<Queues>,
    ) -> Self {
        Self {
            commands,
            registry,
            releaser: Box::new(Direct { backend, queues }),
        }
    }

    /// Frees `key` for `holder` on the server, handing it to this
    /// manager's next waiter where [`crate::handoff`] can, or, for a lease
    /// taken in fair mode (`fair`), to the head of the server's queue.
    pub(crate) fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        holder: &'a HolderId,
        fair: bool,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        self.releaser.release(key, holder, fair)
    }
}

/// The release, with the backend's type erased.
trait Releaser: Send + Sync {
    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        holder: &'a HolderId,
        fair: bool,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>>;
}

struct Direct<B> {
    backend: B,
    queues: Arc<Queues>,
}

impl<B: LeaseBackend> Releaser for Direct<B> {
    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        holder: &'a HolderId,
        fair: bool,
    ) -> BoxFuture<'a, Result<ReleaseOutcome, BackendError>> {
        Box::pin(crate::handoff::release(
            &self.backend,
            &self.queues,
            key,
            holder,
            fair,
        ))
    }
}

/// A lease that may exist on the server with no one to release it: an
/// acquisition of unknown outcome that was abandoned, or a release whose
/// future was dropped in flight. While armed, dropping the guard hands the
/// release to the watchdog.
pub(crate) struct OrphanGuard<'a> {
    pub(crate) commands: &'a mpsc::UnboundedSender<Command>,
    pub(crate) key: &'a LeaseKey,
    pub(crate) holder: HolderId,
    pub(crate) armed: bool,
    /// For an acquisition of one of the permits of the semaphore `key`,
    /// its limit: which permit the attempt took is unknown, so each is
    /// released (only the one this holder has, if any, is deleted).
    pub(crate) permits: Option<PermitLimit>,
    /// For an acquisition of a share of the read-write lease `key`, the
    /// share key the attempt may have taken (`rw.rs`): that one is released.
    pub(crate) share: Option<LeaseKey>,
}

impl Drop for OrphanGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let release = |key| {
            let _ = self.commands.send(Command::ReleaseOrphan {
                key,
                holder: self.holder,
            });
        };
        match self.permits {
            None => release(self.share.clone().unwrap_or_else(|| self.key.clone())),
            Some(limit) => (0..limit.get())
                .filter_map(|i| self.key.permit(i).ok())
                .for_each(release),
        }
    }
}
