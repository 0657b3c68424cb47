//! The lease manager: acquires leases and owns the watchdog that keeps them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::lease::Shared;
use crate::renewal::{Command, Timing, Watchdog};
use crate::{Lease, LeaseError, LeaseOptions};

/// Acquires leases and keeps them alive with a single watchdog task.
///
/// A manager is cheap to clone; clones share the watchdog. Leases outlive
/// the manager value: the watchdog runs until every lease is released or
/// [`shutdown`](Self::shutdown) is called.
///
/// ```
/// use leasehold_core::MemoryBackend;
/// use leasehold_watchdog::{LeaseManager, LeaseOptions};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = LeaseManager::new(MemoryBackend::new())?;
/// let lease = manager.acquire("reports:nightly", &LeaseOptions::default()).await?;
/// let token = lease.token();
/// tokio::select! {
///     () = token.cancelled() => println!("lease lost: {:?}", lease.loss_reason()),
///     () = async { /* the work */ } => println!("done with fencing token {}", lease.fencing_token()),
/// }
/// lease.release().await?;
/// manager.shutdown().await;
/// # Ok(()) }
/// ```
pub struct LeaseManager<B> {
    inner: Arc<Inner<B>>,
}

struct Inner<B> {
    backend: B,
    commands: mpsc::UnboundedSender<Command>,
    shutdown: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
}

impl<B> Clone for LeaseManager<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B> std::fmt::Debug for LeaseManager<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManager")
            .field("shut_down", &self.inner.shutdown.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaseManager<B> {
    /// Starts a manager and its watchdog task on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoRuntime`] when called outside a tokio runtime.
    pub fn new(backend: B) -> Result<Self, LeaseError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LeaseError::NoRuntime)?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        crate::metrics::describe();
        let watchdog = Watchdog::new(backend.clone(), receiver, shutdown.clone());
        let task = runtime.spawn(watchdog.run());
        Ok(Self {
            inner: Arc::new(Inner {
                backend,
                commands,
                shutdown,
                task: Mutex::new(Some(task)),
                next_id: AtomicU64::new(0),
            }),
        })
    }

    /// The backend the manager uses.
    #[must_use]
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Acquires `key`, waiting up to `options.wait()` while another holder
    /// has it, and hands the lease to the watchdog.
    ///
    /// Attempts are spaced by the jittered [`Backoff`](crate::Backoff) and
    /// never sleep past the current holder's expiry. Transient backend errors
    /// are retried within the wait; the same holder id is used for every
    /// attempt, so an attempt whose reply was lost is recognised as ours.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] for a bad key or label,
    /// [`LeaseError::NotAcquired`] when the wait ran out,
    /// [`LeaseError::Backend`] when the backend failed on the last attempt
    /// (or with an error that retrying cannot fix), and
    /// [`LeaseError::ManagerStopped`] after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the attempt; if it may have succeeded on
    /// the server, the watchdog releases it in the background.
    pub async fn acquire(
        &self,
        key: impl AsRef<str>,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        let key = LeaseKey::new(key)?;
        let span = info_span!("acquire", key = %key, name = %options.name());
        let started = Instant::now();
        let result = self.acquire_key(key, options).instrument(span).await;
        let outcome = match &result {
            Ok(_) => "acquired",
            Err(LeaseError::NotAcquired { .. }) => "not_acquired",
            Err(_) => "error",
        };
        crate::metrics::acquired(options.name(), outcome, started.elapsed());
        result
    }

    async fn acquire_key(
        &self,
        key: LeaseKey,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(LeaseError::ManagerStopped);
        }
        let mut request = AcquireRequest::new(key.clone(), HolderId::generate()?, options.ttl());
        if let Some(label) = options.label() {
            request = request.with_label(label)?;
        }
        let started = Instant::now();
        let give_up_at = options.wait().map(|wait| started + wait);
        // Releases in the background if this future is dropped, or gives up,
        // after an attempt whose outcome is unknown.
        let mut orphan = OrphanGuard {
            commands: &self.inner.commands,
            key: &key,
            holder: request.holder,
            armed: false,
        };
        let mut attempt = 0u32;
        loop {
            orphan.armed = true;
            let result = self.inner.backend.try_acquire(&request).await;
            let mut retry_after = options.backoff().delay(attempt);
            let failure = match result {
                Ok(AcquireOutcome::Acquired(grant)) => {
                    orphan.armed = false;
                    if Instant::now() < grant.valid_until - options.safety_margin() {
                        return self.register(grant, options);
                    }
                    // The reply came too late to use the lease: give it back.
                    orphan.armed = true;
                    LeaseError::NotAcquired {
                        key: key.to_string(),
                        waited: started.elapsed(),
                        holder: LeaseInfo::default(),
                    }
                }
                Ok(AcquireOutcome::Held(holder)) => {
                    orphan.armed = false;
                    if let Some(left) = holder.ttl_left {
                        // No point sleeping past the holder's expiry.
                        retry_after = retry_after.min(left + std::time::Duration::from_millis(1));
                    }
                    LeaseError::NotAcquired {
                        key: key.to_string(),
                        waited: started.elapsed(),
                        holder,
                    }
                }
                Err(error) if error.is_transient() => LeaseError::Backend(error),
                Err(error) => return Err(error.into()),
            };
            let now = Instant::now();
            let Some(give_up_at) = give_up_at.filter(|at| now < *at) else {
                return Err(failure);
            };
            debug!(attempt, "lease not acquired yet; retrying");
            tokio::time::sleep_until((now + retry_after).min(give_up_at)).await;
            attempt = attempt.saturating_add(1);
        }
    }

    fn register(&self, grant: Grant, options: &LeaseOptions) -> Result<Lease, LeaseError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let sent_at = grant.sent_at;
        let shared = Arc::new(Shared::new(
            grant.key,
            grant.holder,
            grant.fencing_token,
            grant.ttl,
            options.name().to_owned().into(),
            Timing {
                renew_interval: options.renew_interval(),
                safety_margin: options.safety_margin(),
                max_renewals: options.max_renewals(),
            },
            grant.valid_until,
        ));
        let lease = Lease::new(Arc::clone(&shared), id, self.inner.commands.clone());
        self.inner
            .commands
            .send(Command::Register {
                id,
                shared,
                sent_at,
            })
            .map_err(|_| LeaseError::ManagerStopped)?;
        Ok(lease)
    }

    /// Cancels every lease's token with
    /// [`LossReason::Shutdown`](crate::LossReason::Shutdown), releases them
    /// all, and waits for the watchdog to finish. Later acquisitions fail
    /// with [`LeaseError::ManagerStopped`].
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the shutdown still completes in the background.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        let task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            // The watchdog never panics on its own; a join error means the
            // runtime is shutting down, which ends it anyway.
            let _ = task.await;
        }
    }
}

struct OrphanGuard<'a> {
    commands: &'a mpsc::UnboundedSender<Command>,
    key: &'a LeaseKey,
    holder: HolderId,
    armed: bool,
}

impl Drop for OrphanGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.commands.send(Command::ReleaseOrphan {
                key: self.key.clone(),
                holder: self.holder,
            });
        }
    }
}
