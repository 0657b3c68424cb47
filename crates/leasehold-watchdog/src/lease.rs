//! The holder's handle on a lease.

use std::fmt;
use std::sync::Arc;

use leasehold_core::{FencingToken, HolderId, LeaseKey, ReleaseOutcome, Ttl};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span};

use crate::LeaseError;
use crate::bounds::Progress;
use crate::home::{Home, OrphanGuard};
use crate::loss::LossReason;
use crate::renewal::{Command, Registry};
use crate::shared::Shared;

/// A held lease.
///
/// The watchdog renews it in the background until it is released. Watch
/// [`token`](Self::token): it is cancelled, with a [`LossReason`], before the
/// lease can be taken by anyone else. Pass
/// [`fencing_token`](Self::fencing_token) to the stores you write to.
///
/// Dropping a `Lease` releases it in the background; prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "dropping a Lease releases it at once"]
pub struct Lease {
    shared: Arc<Shared>,
    id: u64,
    holder: HolderId,
    /// `None` once released: dropping it then does nothing.
    home: Option<Arc<Home>>,
}

impl Lease {
    /// The state the handle shares with the watchdog.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn new(shared: Arc<Shared>, id: u64, holder: HolderId, home: Arc<Home>) -> Self {
        Self {
            shared,
            id,
            holder,
            home: Some(home),
        }
    }

    /// The key given to the call that acquired the lease: the lease's key
    /// for [`acquire`](crate::LeaseManager::acquire), the semaphore's for
    /// [`acquire_permit`](crate::LeaseManager::acquire_permit), the
    /// read-write lease's for
    /// [`acquire_read`](crate::LeaseManager::acquire_read) and
    /// [`acquire_write`](crate::LeaseManager::acquire_write). The key the
    /// lease holds on the server is [`server_key`](Self::server_key).
    #[must_use]
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// The key the lease holds on the server: [`key`](Self::key) for an
    /// exclusive lease, the permit key (`{key}:permit:<i>`) for a permit,
    /// the reader's key (`{key}:read:<holder>`) or the writer's
    /// (`{key}:write`) for a share of a read-write lease (see
    /// [`LeaseKey::permit`], [`LeaseKey::reader_key`] and
    /// [`LeaseKey::writer_key`]). For inspecting the server; the lease
    /// itself is renewed and released through the handle.
    ///
    /// ```
    /// use leasehold_core::{MemoryBackend, PermitLimit};
    /// use leasehold_watchdog::LeaseManager;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let permit = manager.acquire_permit("exports", PermitLimit::new(4)?, &Default::default()).await?;
    /// assert_eq!(permit.key().as_str(), "exports");
    /// assert_eq!(permit.server_key().as_str(), "{exports}:permit:0");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn server_key(&self) -> LeaseKey {
        self.shared.server_key(&self.holder)
    }

    /// The lease's name in metrics and logs.
    #[must_use]
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The fencing token of this acquisition: strictly greater than that of
    /// every earlier acquisition of the key.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.fencing_token
    }

    /// The lease's ttl.
    #[must_use]
    pub fn ttl(&self) -> Ttl {
        self.shared.ttl()
    }

    /// A token cancelled when the lease ends for any reason other than
    /// [`release`](Self::release). Each call returns a new child of the
    /// lease's own token: cancelling it yourself affects neither the lease
    /// nor the tokens of other calls.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        // A child made on demand rather than one kept in the handle: a
        // manager may hold a million leases, and a token node is ~130 bytes.
        self.shared.token.child_token()
    }

    /// The handle through which the holder reports progress, for a lease
    /// bound to it by
    /// [`LeaseOptionsBuilder::progress_window`](crate::LeaseOptionsBuilder::progress_window)
    /// (see [`Progress`]). Clone it into every task of the job. Without a
    /// window, its reports are ignored.
    #[must_use]
    pub fn progress(&self) -> Progress {
        Progress::new(self.shared.bounds.clone())
    }

    /// Until when, on this process's monotonic clock, the lease is certainly
    /// held, as of the last successful renewal.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// How many times the watchdog has renewed the lease.
    #[must_use]
    pub fn renewals(&self) -> u32 {
        self.shared.renewals()
    }

    /// Why the lease ended, once its token has been cancelled.
    #[must_use]
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Waits until the lease ends and says why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits on the token.
    pub async fn lost(&self) -> LossReason {
        self.shared.token.cancelled().await;
        // `end` records the reason before cancelling the token.
        self.shared.loss().unwrap_or(LossReason::Lost)
    }

    /// Stops renewing and frees the lease on the server (compare-and-delete),
    /// so a waiter can take it at once. A lease acquired with a minimum hold
    /// ([`LeaseOptionsBuilder::hold_at_least`](crate::LeaseOptionsBuilder::hold_at_least))
    /// released before it has run out stays taken on the server until then;
    /// the release still returns at once, with
    /// [`ReleaseOutcome::Released`].
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] when the server could not be reached (the
    /// lease then expires by itself within its ttl), and
    /// [`LeaseError::ManagerStopped`] after the manager has shut down (which
    /// released every lease).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the release still happens in the background.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LeaseError> {
        let Some(home) = self.home.take() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if !self.shared.claim_release() {
            // The watchdog ended the lease (lost, capped, past its deadline,
            // or shut down) and keeps its entry until the handle lets go:
            // it releases what may be left.
            let (reply, answer) = oneshot::channel();
            home.commands
                .send(Command::Release {
                    id: self.id,
                    reply: Some(reply),
                })
                .map_err(|_| LeaseError::ManagerStopped)?;
            return answer.await.map_err(|_| LeaseError::ManagerStopped)?;
        }
        // Ours to release, here. The watchdog is told to forget the lease
        // once the release is over (or dropped), not before: waking its task
        // first would put it ahead of the release's own round trip. A
        // renewal meanwhile finds the lease gone (or handed over) and is
        // ignored, as the release is claimed. If the watchdog is gone, the
        // lease is still ours on the server and is released all the same.
        let _forget = Forget {
            registry: &home.registry,
            id: self.id,
        };
        crate::metrics::ended(
            &self.shared.series,
            crate::metrics::RELEASED,
            self.shared.acquired_at.elapsed(),
        );
        let key = &self.shared.server_key(&self.holder);
        // A release future dropped in flight hands the release to the
        // watchdog, as a dropped handle does.
        let mut abandoned = OrphanGuard {
            commands: &home.commands,
            key,
            holder: self.holder,
            armed: true,
            permits: None,
            share: None,
        };
        let span = debug_span!("release", key = %key, name = %self.shared.name());
        let outcome = home
            .release(key, &self.holder, self.shared.fair())
            .instrument(span)
            .await;
        abandoned.armed = false;
        if let Err(error) = &outcome {
            debug!(%key, %error, "release failed; the lease expires by itself");
        }
        outcome.map_err(LeaseError::from)
    }
}

impl Lease {
    /// Takes the lease's end on the caller, as [`release`](Self::release)
    /// does, for an end the caller sends itself: a tick's completion,
    /// which releases the lease in the same atomic operation. The watchdog
    /// stops renewing at once and forgets the lease when the returned
    /// [`Ending`] is dropped; an `Ending` dropped before
    /// [`Ending::done`] (the end failed or its future was dropped) hands a
    /// plain release to the watchdog. `None` when the watchdog had ended
    /// the lease already: the handle is then dropped, which lets the
    /// watchdog release what may be left.
    pub(crate) fn take_end(mut self) -> Option<Ending> {
        let home = self.home.take()?;
        if !self.shared.claim_release() {
            let _ = home.commands.send(Command::Release {
                id: self.id,
                reply: None,
            });
            return None;
        }
        crate::metrics::ended(
            &self.shared.series,
            crate::metrics::RELEASED,
            self.shared.acquired_at.elapsed(),
        );
        Some(Ending {
            key: self.shared.server_key(&self.holder),
            holder: self.holder,
            id: self.id,
            home,
            armed: true,
        })
    }
}

/// A lease whose end the caller took (see [`Lease::take_end`]).
pub(crate) struct Ending {
    home: Arc<Home>,
    id: u64,
    key: LeaseKey,
    holder: HolderId,
    armed: bool,
}

impl Ending {
    /// The caller's end reached the server: nothing is left to release.
    pub(crate) fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.home.commands.send(Command::ReleaseOrphan {
                key: self.key.clone(),
                holder: self.holder,
            });
        }
        self.home.registry.forget(self.id);
    }
}

/// Tells the watchdog to forget a lease whose release the handle ran,
/// when dropped: after the release, whether it finished or was abandoned.
struct Forget<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.registry.forget(self.id);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            // Never blocks: the watchdog does the release. If it is gone the
            // manager has shut down and released everything already.
            let _ = home.commands.send(Command::Release {
                id: self.id,
                reply: None,
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.shared.key)
            .field("name", self.shared.name())
            .field("fencing_token", &self.shared.fencing_token)
            .field("ttl", &self.shared.ttl())
            .field("renewals", &self.renewals())
            .field("loss", &self.loss_reason())
            .finish_non_exhaustive()
    }
}
