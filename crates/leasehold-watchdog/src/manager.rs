//! The lease manager: acquires leases and owns the watchdog that keeps them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use leasehold_core::{AcquireRequest, Grant, HolderId, LeaseBackend, LeaseKey, ReleaseWatch};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span};

use crate::attempt::Attempt;
use crate::bounds::Bounds;
use crate::home::{BoxFuture, Home};
use crate::intent::IntentGuard;
use crate::leader::{Leader, Leaders};
use crate::queue::{Queues, Turn};
use crate::renewal::{Registry, Watchdog};
use crate::shared::{Shape, Shared};
use crate::timing::Timing;
use crate::waiting::{self, Won};
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
    /// The watchdog's command channel and the handles' release.
    home: Arc<Home>,
    shutdown: CancellationToken,
    /// Cancelled when a shutdown begins, graceful or not: acquisitions are
    /// refused from then on. [`shutdown`](LeaseManager::shutdown) cancels
    /// it with `shutdown`; a graceful one first.
    draining: CancellationToken,
    /// Cancelled when the watchdog task has ended (or was dropped).
    stopped: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
    next_id: AtomicU64,
    /// The drivers of [`watch_leader`](LeaseManager::watch_leader), by key.
    leaders: Arc<Leaders>,
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

    /// Acquires `key` with the default [`LeaseOptions`]: one attempt (no
    /// waiting), a 30 s ttl renewed every 10 s, for as long as the handle
    /// lives. Redisson's `tryLock()`, `Mutex::try_lock` for a lease: when
    /// someone else holds it, the answer is at once
    /// [`LeaseError::NotAcquired`]. To wait, or for any other option, use
    /// [`acquire`](Self::acquire).
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseError, LeaseManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let lease = manager.try_acquire("reports:nightly").await?;
    /// // Held: a second try is refused at once.
    /// let again = manager.try_acquire("reports:nightly").await;
    /// assert!(matches!(again, Err(LeaseError::NotAcquired { .. })));
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, key: impl AsRef<str>) -> Result<Lease, LeaseError> {
        // One value for every call, so that the future holds a reference to
        // it rather than a copy.
        static DEFAULTS: OnceLock<LeaseOptions> = OnceLock::new();
        self.acquire(key, DEFAULTS.get_or_init(LeaseOptions::default))
            .await
    }

    /// Acquires `key`, waiting up to `options.wait()` while another holder
    /// has it, and hands the lease to the watchdog.
    ///
    /// An acquisition of a key that no one in this manager waits for asks
    /// the backend at once, before queueing; otherwise, and after that
    /// first refusal, waiters for one key in one manager queue in FIFO
    /// order and only the first talks to the backend (a newcomer never
    /// asks ahead of a waiter already queued). It subscribes to the key's release
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
        let kind = crate::metrics::Kind::of(&key);
        let span = info_span!("acquire", key = %key, name = %options.name());
        self.acquire_measured(key, options, Attempt::Lease, kind, span)
            .await
    }

    /// Acquires as [`acquire_key`](Self::acquire_key) does, inside `span`,
    /// and records the acquisition's outcome and wait under `kind`: one
    /// place for every kind of lease (`acquire`, `acquire_permit`,
    /// `acquire_read`, `acquire_write`).
    ///
    /// Returned boxed: the caller's future holds only the box while it
    /// waits, and nothing of it once the lease is granted. An acquisition's
    /// state machine is several hundred bytes, and a caller that holds its
    /// lease in a task of its own (the usual way, one task per job) would
    /// otherwise keep that much in the task for the lease's whole life.
    pub(crate) fn acquire_measured<'a>(
        &'a self,
        key: LeaseKey,
        options: &'a LeaseOptions,
        attempt: Attempt,
        kind: crate::metrics::Kind,
        span: tracing::Span,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let started = Instant::now();
            let result = self
                .acquire_key(key, options, attempt, kind, started)
                .instrument(span)
                .await;
            if let Ok(lease) = &result {
                // Outside the acquisition's span: the lease's is a child of
                // the caller's.
                lease.open_span();
            }
            let outcome = match &result {
                Ok(_) => crate::metrics::ACQUIRED,
                Err(LeaseError::NotAcquired { .. }) => "not_acquired",
                Err(LeaseError::Busy { .. }) => "busy",
                Err(_) => "error",
            };
            crate::metrics::acquired(
                options.series(kind),
                outcome,
                started.elapsed(),
                options.ttl().get(),
                options.safety_margin(),
            );
            result
        })
    }

    /// Acquires `key`'s lease, or one of its permits (`permits.rs`), of
    /// `kind` in metrics, for an acquisition that began at `started`.
    async fn acquire_key(
        &self,
        key: LeaseKey,
        options: &LeaseOptions,
        attempt: Attempt,
        kind: crate::metrics::Kind,
        started: Instant,
    ) -> Result<Lease, LeaseError> {
        if self.inner.draining.is_cancelled() {
            return Err(LeaseError::ManagerStopped);
        }
        let mut request = AcquireRequest::new(key.clone(), HolderId::generate()?, options.ttl())
            .with_lock_delay(options.lock_delay());
        if let Some(label) = options.label() {
            request = request.with_label(label)?;
        }
        attempt.refuse_inapplicable(&key, options)?;
        if let Some(minimum) = options.hold_at_least() {
            request = request.with_hold_at_least(minimum)?;
        }
        let manager = waiting::Manager {
            backend: &self.inner.backend,
            queues: &self.inner.queues,
            commands: &self.inner.home.commands,
        };
        // The waiting machine runs inline, inside the box `acquire_measured`
        // makes (a `dyn` future: the caller's future never names its type,
        // and no proof that it is `Send` goes through the backend's).
        // A writer that gives up withdraws the intent its refusals left.
        let intent = IntentGuard::new(&self.inner.backend, &key, request.holder, attempt);
        let won = match waiting::acquire(manager, &key, request, options, attempt, started).await {
            Ok(won) => won,
            Err(error) => {
                // Boxed: the backend call would otherwise sit in every
                // acquisition's state, used or not.
                Box::pin(intent.withdraw()).await;
                return Err(error);
            }
        };
        // Granted: the grant cleared the intent (write.lua, 3).
        intent.disarm();
        let (lease, watch, others) = self.took(key, won, options, attempt, kind);
        if others {
            tokio::task::yield_now().await;
        }
        drop(watch);
        lease
    }

    /// Hands the turn on and keeps the lease. With others waiting, the next
    /// head gets a baton: the lease is held here now, so it offers at once.
    /// The baton carries the holder's watch if the holder got the lease by
    /// handover. After an acquisition of its own the holder passes no watch
    /// (and keeps its own until the lease is registered): the next head
    /// makes its own watch (its offer standing meanwhile). Then this task
    /// yields once, so that the next head, woken from this task and so
    /// sitting in this worker's slot that other workers never steal, gets
    /// to leave its offer before this holder's work blocks the thread
    /// (the caller yields when this says others wait, and drops the watch
    /// it is given after that).
    /// A permit passes no baton: that the holder has its permit says
    /// nothing of the semaphore's others, so the next head tries at once.
    ///
    /// Not `async`, so that the `Won` it takes is not kept in the
    /// acquisition's state across the yield.
    fn took(
        &self,
        key: LeaseKey,
        won: Won,
        options: &LeaseOptions,
        attempt: Attempt,
        kind: crate::metrics::Kind,
    ) -> (Result<Lease, LeaseError>, Option<ReleaseWatch>, bool) {
        let Won {
            grant,
            turn,
            mut watch,
            handed_over,
        } = won;
        let baton = if handed_over { watch.take() } else { None };
        // Without a turn the first attempt, made before queueing, got the
        // lease: no one queued then, and anyone queued since tries on its
        // own, without a baton.
        let others = turn.as_ref().is_some_and(Turn::others_waiting);
        if let Some(turn) = turn.as_ref().filter(|_| others)
            && options.release_notices()
            && matches!(attempt, Attempt::Lease)
            && !leasehold_core::ablation::off("baton")
        {
            turn.handoff()
                .pass_baton(baton.filter(ReleaseWatch::is_supported));
        }
        drop(turn);
        (
            self.register(key, grant, options, attempt, kind),
            watch,
            others,
        )
    }

    /// The token cancelled when the manager shuts down.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    /// Hands the lease `grant` on the user's `key` to the watchdog, of
    /// `kind` in metrics.
    pub(crate) fn register(
        &self,
        key: LeaseKey,
        grant: Grant,
        options: &LeaseOptions,
        attempt: Attempt,
        kind: crate::metrics::Kind,
    ) -> Result<Lease, LeaseError> {
        let shape = match attempt {
            Attempt::Lease => Shape::Exclusive,
            // A permit key's index is below the limit, at most 100.
            Attempt::Permit(_) => grant
                .key
                .permit_of()
                .and_then(|(_, index)| u8::try_from(index).ok())
                .map_or(Shape::Exclusive, Shape::Permit),
            Attempt::Read => Shape::Read,
            Attempt::Write => Shape::Write,
        };
        // The handle derives the server's key from the user's on release:
        // a grant that names another (a backend that chose its own permit
        // key) is kept under the server's key, so that it is still released.
        let (key, shape) = match shape.server_key(&key, &grant.holder) {
            Ok(derived) if derived == grant.key => (key, shape),
            _ => (grant.key.clone(), Shape::Exclusive),
        };
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(
            Shared::new(
                &grant,
                Arc::clone(options.series(kind)),
                Timing::new(
                    options.renew_interval(),
                    options.safety_margin(),
                    options.max_renewals(),
                )
                .with_lock_delay(options.lock_delay()),
            )
            .with_user_key(key, shape)
            .with_fair(options.fair().is_some())
            .with_bounds(Bounds::of(options, grant.sent_at)),
        );
        let holder = grant.holder;
        // The server does not report this manager's own grant back to it.
        self.inner.leaders.granted(&grant.key);
        self.inner.home.registry.register(
            id,
            Arc::clone(&shared),
            grant.key,
            holder,
            grant.sent_at,
        )?;
        // Counted here, as the handle's release uncounts it on its own task.
        crate::metrics::held(&shared.series, 1.0);
        Ok(Lease::new(shared, id, holder, Arc::clone(&self.inner.home)))
    }

    /// Watches who holds `key`: a receiver whose value is the current
    /// [`Leader`], or `None` while the key is free, updated as the lease
    /// changes hands. Use it to follow an [`Election`](crate::Election)
    /// without campaigning, or for a health endpoint
    /// (`receiver.borrow().is_some()` costs no round trip).
    ///
    /// The value starts as read from the backend before this returns, and
    /// changes when the leader does: a new grant, a release, a lease that
    /// expired or was deleted on the server. It is pushed by the backend's
    /// signals (change reports, release notices, grants through this
    /// manager), with a timer at the lease's remaining ttl as a fallback,
    /// never by a polling loop (except on a backend that reports no
    /// changes, such as a Redis Cluster, which reads a free key every
    /// [`UNREPORTED_RECHECK`](crate::UNREPORTED_RECHECK)). On Redis with
    /// client tracking, a change reaches the receiver within a round trip
    /// or two.
    ///
    /// One background task per manager and key serves every receiver; it
    /// ends when the last receiver is dropped or the manager shuts down,
    /// after which receivers see the sender closed. While reads fail it
    /// retries, and the value keeps the last leader read.
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let observer = LeaseManager::new(backend.client())?;
    /// let mut leader = observer.watch_leader("scheduler").await?;
    /// assert!(leader.borrow().is_none());
    ///
    /// let candidate = LeaseManager::new(backend.client())?;
    /// let options = LeaseOptions::builder().label("node-1").build()?;
    /// let lease = candidate.acquire("scheduler", &options).await?;
    /// leader.changed().await?;
    /// assert_eq!(leader.borrow().as_ref().and_then(|l| l.label.as_deref()), Some("node-1"));
    /// lease.release().await?;
    /// leader.changed().await?;
    /// assert!(leader.borrow().is_none());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] for a bad key, [`LeaseError::ManagerStopped`]
    /// after a shutdown, and [`LeaseError::Backend`] when the first read
    /// (or the subscriptions before it) failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves no task behind.
    pub async fn watch_leader(
        &self,
        key: impl AsRef<str>,
    ) -> Result<tokio::sync::watch::Receiver<Option<Leader>>, LeaseError> {
        let key = LeaseKey::new(key)?;
        self.inner
            .leaders
            .watch(&self.inner.backend, key, &self.inner.shutdown)
            .await
    }

    /// Cancels every lease's token with
    /// [`LossReason::Shutdown`](crate::LossReason::Shutdown), releases them
    /// all, and waits for the watchdog to finish (every release sent). Later
    /// acquisitions fail with [`LeaseError::ManagerStopped`]. Called again,
    /// or while another call runs, it waits for the same end.
    ///
    /// A lease is released here at the moment its token fires, while its
    /// work may still be stopping; [`shutdown_gracefully`](Self::shutdown_gracefully)
    /// lets the work stop first.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the shutdown still completes in the background.
    pub async fn shutdown(&self) {
        self.inner.draining.cancel();
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
        self.inner.stopped.cancelled().await;
    }

    /// Shuts down letting the work stop before its lease is released:
    /// acquisitions are refused from now on, every lease's token is
    /// cancelled with [`LossReason::Shutdown`](crate::LossReason::Shutdown)
    /// and no lease is renewed any more, but each stays taken on the server
    /// until its handle lets go (the work under
    /// [`with_lease`](Self::with_lease), an
    /// [election](crate::Election::run)'s term or a tick's run returns, or
    /// the holder releases or drops its [`Lease`]); its release is then
    /// sent at once, with its release notice, so that a replica waiting
    /// for the key takes it within a round trip. Once every handle has let
    /// go, or after `grace`, it ends as [`shutdown`](Self::shutdown) does:
    /// what is left is released, and it returns when every release was sent.
    ///
    /// A lease whose handle is kept past its validity (work that ignores its
    /// token) expires on the server on its own, as its token said.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the leases stay ended and unrenewed; a
    /// later [`shutdown`](Self::shutdown) releases what is left.
    pub async fn shutdown_gracefully(&self, grace: std::time::Duration) {
        self.inner.draining.cancel();
        let (reply, drained) = tokio::sync::oneshot::channel();
        if !self.inner.shutdown.is_cancelled()
            && self
                .inner
                .home
                .commands
                .send(crate::renewal::Command::Drain { reply })
                .is_ok()
        {
            // An error: the watchdog has ended, with nothing left to wait for.
            let _ = tokio::time::timeout(grace, drained).await;
        }
        self.shutdown().await;
    }

    /// Handles SIGTERM and SIGINT (Ctrl-C on other systems) from now on
    /// with a graceful shutdown: on the first of them,
    /// [`shutdown_gracefully`](Self::shutdown_gracefully) within
    /// [`DEFAULT_SHUTDOWN_GRACE`] (a second signal cuts the grace short).
    /// Returns a token cancelled when the signal comes (or when the manager
    /// shuts down for another reason): the service's own
    /// loops stop on it (pass it as [`Election::run`](crate::Election::run)'s
    /// `stop`), then call [`shutdown`](Self::shutdown), which waits for the
    /// releases to be sent.
    ///
    /// The handlers are installed before this returns, so a signal that
    /// comes at any time after is handled. From then on these signals no
    /// longer end the process by themselves (as with any handler): the
    /// process ends when its `main` returns.
    ///
    /// ```no_run
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{Election, LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let stop = manager.shutdown_on_signal()?;
    /// let election = Election::new(manager.clone(), "scheduler", LeaseOptions::default())?;
    /// election
    ///     .run(stop, |work| async move {
    ///         work.cancelled().await; // lead until the lease ends or the signal comes
    ///     })
    ///     .await?;
    /// manager.shutdown().await; // the lease was released: a replica leads
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// An error when called outside a tokio runtime, and the operating
    /// system's when a handler cannot be installed, or the runtime was
    /// built without its I/O and signal driver (`enable_all`, or
    /// `enable_io`).
    pub fn shutdown_on_signal(&self) -> std::io::Result<CancellationToken> {
        // Signal handlers and the task that waits for them need a runtime.
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| std::io::Error::other(LeaseError::NoRuntime))?;
        let mut signals = crate::shutdown::Signals::install()?;
        let manager = Arc::downgrade(&self.inner);
        let stop = self.inner.draining.child_token();
        let shutdown = self.inner.shutdown.clone();
        runtime.spawn(async move {
            let signal = tokio::select! {
                signal = signals.next() => signal,
                // Shut down otherwise: nothing left to do on a signal.
                () = shutdown.cancelled() => return,
            };
            // Not holding the manager while waiting: a manager nobody
            // uses any more still stops when its last handle goes.
            let Some(inner) = manager.upgrade() else {
                return;
            };
            let manager = LeaseManager { inner };
            tracing::info!(
                signal,
                "shutting down: every lease's work is told to stop and its lease released"
            );
            tokio::select! {
                () = manager.shutdown_gracefully(DEFAULT_SHUTDOWN_GRACE) => {}
                signal = signals.next() => {
                    tracing::info!(signal, "a second signal: releasing every lease now");
                    manager.shutdown().await;
                }
            }
        });
        Ok(stop)
    }
}

/// How long a graceful shutdown on a signal
/// ([`LeaseManager::shutdown_on_signal`]) waits for the work under every
/// lease to stop before it releases the leases still held: 5 s, well
/// within the usual grace of a service manager (Kubernetes's is 30 s,
/// systemd's 90 s).
pub const DEFAULT_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// backend. An acquisition of a key no one here waits for makes its
    /// first attempt before it queues, and takes a place only once that
    /// attempt is refused. Default: [`DEFAULT_MAX_WAITERS`] (1024).
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
        let queues = Arc::new(Queues::new(self.max_waiters));
        let registry = Arc::new(Registry::new());
        let watchdog = Watchdog::new(
            self.backend.clone(),
            Arc::clone(&queues),
            receiver,
            Arc::clone(&registry),
            shutdown.clone(),
        );
        let stopped = CancellationToken::new();
        let done = stopped.clone();
        let task = runtime.spawn(async move {
            // Cancelled however the task ends, dropped by its runtime too.
            let _done = done.drop_guard();
            watchdog.run().await;
        });
        let home = Arc::new(Home::new(
            commands,
            registry,
            self.backend.clone(),
            Arc::clone(&queues),
        ));
        Ok(LeaseManager {
            inner: Arc::new(Inner {
                backend: self.backend,
                queues,
                home,
                draining: shutdown.child_token(),
                shutdown,
                stopped,
                task: Mutex::new(Some(task)),
                next_id: AtomicU64::new(0),
                leaders: Arc::default(),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::MemoryBackend;

    /// A task that holds its lease awaits `acquire` first, and keeps room
    /// for that future for as long as it runs: it must stay a box, not the
    /// acquisition's whole state machine (808 bytes when it was inline).
    #[tokio::test]
    #[cfg(target_pointer_width = "64")]
    async fn the_acquire_future_stays_small() -> Result<(), LeaseError> {
        let manager = LeaseManager::new(MemoryBackend::new())?;
        let options = LeaseOptions::default();
        let acquire = manager.acquire("k", &options);
        let size = std::mem::size_of_val(&acquire);
        drop(acquire);
        assert!(size <= 128, "the acquire future is {size} bytes");
        let short = manager.try_acquire("k");
        let size = std::mem::size_of_val(&short);
        drop(short);
        assert!(size <= 128, "the try_acquire future is {size} bytes");
        Ok(())
    }

    /// A graceful shutdown lets the work stop before its lease goes: every
    /// token fires with `Shutdown` at once and new acquisitions are
    /// refused, but a lease stays taken on the server, unrenewed, until its
    /// handle lets go (its work returned), and is then released at once, so
    /// that another manager waiting for it takes it; a handle kept past the
    /// grace has its lease released when the grace runs out; the shutdown
    /// ends then, not before.
    #[tokio::test(start_paused = true)]
    async fn a_graceful_shutdown_waits_for_the_work() -> Result<(), Box<dyn std::error::Error>> {
        use crate::LossReason;
        use leasehold_core::LeaseBackend;
        use std::time::Duration;

        let backend = MemoryBackend::new();
        let manager = LeaseManager::new(backend.client())?;
        let other = LeaseManager::new(backend.client())?;
        let options = LeaseOptions::builder()
            .ttl(Duration::from_secs(3))
            .label("leaving")
            .build()?;
        let patient = LeaseOptions::builder()
            .ttl(Duration::from_secs(3))
            .wait(Duration::from_secs(30))
            .build()?;

        // The work takes 200 ms to stop once told, and looks at the server
        // as it finishes: (when told, why, who held the key then).
        let stopped = Arc::new(Mutex::new(None));
        let work = manager.with_lease("graceful", &options, |work| {
            let (backend, stopped) = (backend.clone(), Arc::clone(&stopped));
            async move {
                work.cancelled().await;
                let told = Instant::now();
                tokio::time::sleep(Duration::from_millis(200)).await;
                let key = LeaseKey::new("graceful").expect("a valid key");
                let holder = backend.inspect(&key).await.ok().flatten();
                *stopped.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some((told, work.loss_reason(), holder.and_then(|h| h.label)));
            }
        });
        let mut work = Box::pin(work);
        // A handle kept for good: released when the grace runs out.
        let kept = manager.acquire("kept", &options).await?;
        tokio::select! {
            biased;
            _ = &mut work => panic!("the work ended on its own"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        let takeover = tokio::spawn({
            let other = other.clone();
            async move {
                let lease = other.acquire("graceful", &patient).await?;
                Ok::<_, LeaseError>((Instant::now(), lease))
            }
        });
        tokio::task::yield_now().await;

        let started = Instant::now();
        let grace = Duration::from_secs(1);
        let ((), worked) = tokio::join!(manager.shutdown_gracefully(grace), &mut work);
        let ended = Instant::now();
        let Err(LeaseError::LeaseEnded { reason, .. }) = worked else {
            panic!("the work's lease did not end: {:?}", worked.map(|_| ()));
        };
        assert_eq!(reason, LossReason::Shutdown);
        let (told, why, holder) = stopped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or("the work did not stop")?;
        // Told at once; the lease still this manager's while it stopped.
        assert!(
            told - started < Duration::from_millis(10),
            "told after {:?}",
            told - started
        );
        assert_eq!(why, Some(LossReason::Shutdown));
        assert_eq!(
            holder.as_deref(),
            Some("leaving"),
            "released before the work stopped"
        );
        // Released as the work ended, and taken at once by the waiter.
        let (taken, lease) = tokio::time::timeout(Duration::from_secs(5), takeover).await???;
        let stop_time = told + Duration::from_millis(200);
        assert!(
            taken >= stop_time,
            "taken {:?} before the work stopped",
            stop_time - taken
        );
        assert!(
            taken - stop_time < Duration::from_millis(50),
            "taken {:?} after",
            taken - stop_time
        );
        // The shutdown waited for the kept handle until the grace ran out,
        // then released its lease.
        assert_eq!(kept.loss_reason(), Some(LossReason::Shutdown));
        assert!(
            ended - started >= grace,
            "ended after {:?}",
            ended - started
        );
        assert!(ended - started < grace + Duration::from_millis(100));
        assert!(backend.inspect(&LeaseKey::new("kept")?).await?.is_none());
        assert!(matches!(
            manager.acquire("late", &options).await,
            Err(LeaseError::ManagerStopped)
        ));
        lease.release().await?;
        other.shutdown().await;
        Ok(())
    }
}
