//! The lease manager: acquires leases and owns the watchdog that keeps them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    ReleaseWatch,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::lease::Shared;
use crate::queue::{QueueError, Queues};
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
    queues: Arc<Queues>,
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
    /// Starts a manager and its watchdog task on the current tokio runtime,
    /// with the default settings of [`LeaseManagerBuilder`].
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoRuntime`] when called outside a tokio runtime.
    pub fn new(backend: B) -> Result<Self, LeaseError> {
        Self::builder(backend).start()
    }

    /// Starts configuring a manager.
    pub fn builder(backend: B) -> LeaseManagerBuilder<B> {
        LeaseManagerBuilder {
            backend,
            max_waiters: DEFAULT_MAX_WAITERS,
        }
    }

    /// The backend the manager uses.
    #[must_use]
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// Acquires `key`, waiting up to `options.wait()` while another holder
    /// has it, and hands the lease to the watchdog.
    ///
    /// Waiters for one key in one manager queue in FIFO order and only the
    /// first talks to the backend. It subscribes to the key's release
    /// notices after its first refused attempt and retries the moment one
    /// arrives; between notices it polls on the jittered
    /// [`Backoff`](crate::Backoff), never sleeping past the holder's expiry,
    /// so a lost notice or a lease that expires unreleased still ends the
    /// wait. Transient backend errors are retried within the wait; every
    /// attempt uses the same holder id, so an attempt whose reply was lost
    /// is recognised as ours by the next.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] for a bad key or label,
    /// [`LeaseError::NotAcquired`] when the wait ran out,
    /// [`LeaseError::Busy`] at once when the key's local queue is full,
    /// [`LeaseError::Backend`] when the backend failed on the last attempt
    /// (or with an error that retrying cannot fix), and
    /// [`LeaseError::ManagerStopped`] after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue; if an attempt in flight may
    /// have succeeded on the server, the watchdog releases it in the
    /// background.
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
            Err(LeaseError::Busy { .. }) => "busy",
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
        let not_acquired = |holder| LeaseError::NotAcquired {
            key: key.to_string(),
            waited: started.elapsed(),
            holder,
        };
        let turn = match self.inner.queues.enter(&key, give_up_at).await {
            Ok(turn) => turn,
            Err(QueueError::Busy { waiters }) => {
                return Err(LeaseError::Busy {
                    key: key.to_string(),
                    waiters,
                });
            }
            Err(QueueError::Occupied) => return Err(not_acquired(LeaseInfo::default())),
        };
        // Releases in the background if this future is dropped, or gives up,
        // after an attempt whose outcome is unknown.
        let mut orphan = OrphanGuard {
            commands: &self.inner.commands,
            key: &key,
            holder: request.holder,
            armed: false,
        };
        let mut notices: Option<ReleaseWatch> = None;
        let mut attempt = 0u32;
        loop {
            orphan.armed = true;
            let result = self.inner.backend.try_acquire(&request).await;
            let mut retry_after = options.backoff().delay(attempt);
            let failure = match result {
                Ok(AcquireOutcome::Acquired(grant)) => {
                    orphan.armed = false;
                    if Instant::now() < grant.valid_until - options.safety_margin() {
                        // The next local waiter becomes the head now and waits
                        // for the release notice like waiters elsewhere do, so
                        // this process's waiters get no head start on others.
                        drop(turn);
                        return self.register(grant, options);
                    }
                    // The reply came too late to use the lease: give it back.
                    orphan.armed = true;
                    not_acquired(LeaseInfo::default())
                }
                Ok(AcquireOutcome::Held(holder)) => {
                    orphan.armed = false;
                    if let Some(left) = holder.ttl_left {
                        // No point sleeping past the holder's expiry.
                        retry_after = retry_after.min(left + Duration::from_millis(1));
                    }
                    not_acquired(holder)
                }
                Err(error) if error.is_transient() => LeaseError::Backend(error),
                Err(error) => return Err(error.into()),
            };
            let now = Instant::now();
            let Some(give_up_at) = give_up_at.filter(|at| now < *at) else {
                return Err(failure);
            };
            if notices.is_none() && options.release_notices() {
                // Subscribe, then retry at once: a release between the
                // refused attempt and the subscription sent no notice we saw.
                let watch = self.inner.backend.watch_releases(&key).await;
                notices = Some(watch.unwrap_or_else(|error| {
                    debug!(%error, "no release notices; polling");
                    ReleaseWatch::unsupported()
                }));
                continue;
            }
            debug!(attempt, ?retry_after, "lease not acquired yet; waiting");
            let poll = tokio::time::sleep_until((now + retry_after).min(give_up_at));
            match notices.as_mut() {
                Some(notices) => {
                    tokio::select! {
                        () = poll => {}
                        () = notices.released() => debug!("release notice"),
                    }
                }
                None => poll.await,
            }
            attempt = attempt.saturating_add(1);
        }
    }

    fn register(&self, grant: Grant, options: &LeaseOptions) -> Result<Lease, LeaseError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared::new(
            &grant,
            options.shared_name().clone(),
            Timing::new(
                options.renew_interval(),
                options.safety_margin(),
                options.max_renewals(),
            ),
        ));
        let lease = Lease::new(Arc::clone(&shared), id, self.inner.commands.clone());
        self.inner
            .commands
            .send(Command::Register {
                id,
                shared,
                key: grant.key,
                holder: grant.holder,
                sent_at: grant.sent_at,
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

/// The default bound on waiters per key in one manager.
pub const DEFAULT_MAX_WAITERS: usize = 1024;

/// Configures a [`LeaseManager`].
#[must_use]
pub struct LeaseManagerBuilder<B> {
    backend: B,
    max_waiters: usize,
}

impl<B: LeaseBackend> LeaseManagerBuilder<B> {
    /// The most tasks that may wait for one key in this manager at once; one
    /// more gets [`LeaseError::Busy`] at once, without talking to the
    /// backend. Default: [`DEFAULT_MAX_WAITERS`] (1024).
    pub fn max_waiters(mut self, max: usize) -> Self {
        self.max_waiters = max;
        self
    }

    /// Starts the manager and its watchdog task on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`LeaseError::NoRuntime`] when called outside a tokio runtime.
    pub fn start(self) -> Result<LeaseManager<B>, LeaseError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LeaseError::NoRuntime)?;
        let (commands, receiver) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        crate::metrics::describe();
        let watchdog = Watchdog::new(self.backend.clone(), receiver, shutdown.clone());
        let task = runtime.spawn(watchdog.run());
        Ok(LeaseManager {
            inner: Arc::new(Inner {
                backend: self.backend,
                queues: Arc::new(Queues::new(self.max_waiters)),
                commands,
                shutdown,
                task: Mutex::new(Some(task)),
                next_id: AtomicU64::new(0),
            }),
        })
    }
}
