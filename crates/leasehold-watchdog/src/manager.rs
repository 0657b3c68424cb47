//! The lease manager: acquires leases and owns the watchdog that keeps them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, Grant, HolderId, LeaseBackend, LeaseInfo, LeaseKey,
    ReleaseWatch,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info_span};

use crate::handoff::Withdrawn;
use crate::home::{Home, OrphanGuard};
use crate::lease::Shared;
use crate::queue::{QueueError, Queues, Turn};
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
    /// The watchdog's command channel and the handles' release.
    home: Arc<Home>,
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
        crate::metrics::acquired(
            options.name(),
            outcome,
            started.elapsed(),
            options.ttl().get(),
            options.safety_margin(),
        );
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
            commands: &self.inner.home.commands,
            key: &key,
            holder: request.holder,
            armed: false,
        };
        // A baton from the previous head: the lease is held in this manager
        // and its release will look for our offer, so offer without asking.
        // Only with notices on: a head that polls leaves every grant to its
        // own attempts.
        let baton = turn
            .handoff()
            .take_baton()
            .filter(|_| options.release_notices());
        let mut baton_releases = baton.as_ref().map(|b| b.releases);
        let mut notices: Option<ReleaseWatch> = baton.and_then(|b| b.watch);
        // This manager released the key a moment ago and a waiter elsewhere
        // heard it: let that waiter take it first. Listen meanwhile, so that
        // this one is heard of when that one releases.
        if let (None, Some(give_up_at)) = (baton_releases, give_up_at)
            && let Some(until) = self.inner.queues.yield_until(&key)
        {
            if options.release_notices() {
                notices = Some(self.watch(&key).await);
            }
            tokio::time::sleep_until(until.min(give_up_at)).await;
        }
        let mut attempt = 0u32;
        loop {
            let mut retry_after = options.backoff().delay(attempt);
            let failure = if baton_releases.is_some() {
                not_acquired(LeaseInfo::default())
            } else {
                orphan.armed = true;
                let result = self.inner.backend.try_acquire(&request).await;
                match result {
                    Ok(AcquireOutcome::Acquired(grant)) => {
                        orphan.armed = false;
                        if Instant::now() < grant.valid_until - options.safety_margin() {
                            return self.took(turn, None, grant, options).await;
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
                }
            };
            let now = Instant::now();
            let Some(give_up_at) = give_up_at.filter(|at| now < *at) else {
                return Err(failure);
            };
            let mut offer = OfferGuard {
                turn: &turn,
                commands: &self.inner.home.commands,
                key: &key,
                answer: None,
            };
            // With a baton, offer first: the holder's release looks for it.
            if let Some(releases) = baton_releases.take() {
                offer.answer = turn.handoff().offer(&request, Some(releases));
                if offer.answer.is_none() {
                    // The baton went stale: the holder released meanwhile.
                    continue;
                }
            }
            if notices.is_none() && options.release_notices() {
                notices = Some(self.watch(&key).await);
                if offer.answer.is_none() {
                    // Subscribe, then retry at once: a release between the
                    // refused attempt and the subscription sent no notice we
                    // saw. (With an offer standing, the holder's release
                    // answers the offer whether it hands over or not.)
                    continue;
                }
            }
            // Offer only with a working watch: a release here hands over only
            // while no other watch listens, which ours must be part of. (A
            // baton's offer may stand before its watch does: until then the
            // release counts none of ours, and hands over only if no one
            // listens at all.)
            if offer.answer.is_none() && notices.as_ref().is_some_and(ReleaseWatch::is_supported) {
                offer.answer = turn.handoff().offer(&request, None);
            }
            baton_releases = None;
            debug!(attempt, ?retry_after, "lease not acquired yet; waiting");
            let poll = tokio::time::sleep_until((now + retry_after).min(give_up_at));
            let notice = async {
                match notices.as_mut() {
                    Some(notices) => notices.released().await,
                    None => std::future::pending().await,
                }
            };
            let answer = async {
                match offer.answer.as_mut() {
                    Some(answer) => answer.await.ok(),
                    None => std::future::pending().await,
                }
            };
            let answered = tokio::select! {
                () = poll => None,
                () = notice => {
                    debug!("release notice");
                    None
                }
                grant = answer => Some(grant),
            };
            let grant = match answered {
                // A release claimed the offer: the lease, or nothing when it
                // was only released (then try at once).
                Some(grant) => {
                    offer.answer = None;
                    grant
                }
                None => offer.settle().await,
            };
            if let Some(grant) = grant {
                // Ours now, whatever an earlier attempt of unknown outcome did.
                orphan.armed = false;
                if Instant::now() < grant.valid_until - options.safety_margin() {
                    drop(offer);
                    return self.took(turn, notices, grant, options).await;
                }
                // Too late to use; the next attempt (same holder) refreshes it.
                orphan.armed = true;
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Subscribes to `key`'s release notices; a backend without them gives
    /// a watch that never fires, and the head polls.
    async fn watch(&self, key: &LeaseKey) -> ReleaseWatch {
        // Boxed: a subscription's future is large and is made once per
        // wait, and inline it would size (and be copied with) every
        // acquisition's future.
        let watch = Box::pin(self.inner.backend.watch_releases(key)).await;
        watch.unwrap_or_else(|error| {
            debug!(%error, "no release notices; polling");
            ReleaseWatch::unsupported()
        })
    }

    /// Hands the turn on and keeps the lease. With others waiting, the next
    /// head gets a baton: the lease is held here now, so it offers at once.
    /// The baton carries the holder's watch (`baton`) if the holder got the
    /// lease by handover. After an acquisition of its own the holder passes
    /// no watch: the next head subscribes anew (its offer standing
    /// meanwhile), which moves this process to the end of the server's
    /// subscriber order, so that processes take turns hearing of releases
    /// first. Then this task yields once, so that the next head, woken from
    /// this task and so sitting in this worker's slot that other workers
    /// never steal, gets to leave its offer before this holder's work
    /// blocks the thread.
    async fn took(
        &self,
        turn: Turn,
        baton: Option<ReleaseWatch>,
        grant: Grant,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        let others = turn.others_waiting();
        if others && options.release_notices() {
            turn.handoff()
                .pass_baton(baton.filter(ReleaseWatch::is_supported));
        }
        drop(turn);
        let lease = self.register(grant, options);
        if others {
            tokio::task::yield_now().await;
        }
        lease
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
        let holder = grant.holder;
        self.inner
            .home
            .commands
            .send(Command::Register {
                id,
                shared: Arc::clone(&shared),
                key: grant.key,
                holder,
                sent_at: grant.sent_at,
            })
            .map_err(|_| LeaseError::ManagerStopped)?;
        // Counted here, as the handle's release uncounts it on its own task.
        crate::metrics::held(&shared.name, 1.0);
        Ok(Lease::new(shared, id, holder, Arc::clone(&self.inner.home)))
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

/// The head's offer while it waits. Dropped with an answer on its way, it
/// closes the channel: a grant already sent is released here, and one sent
/// later is released by the releasing side, so no lease is left behind.
struct OfferGuard<'a> {
    turn: &'a Turn,
    commands: &'a mpsc::UnboundedSender<Command>,
    key: &'a LeaseKey,
    answer: Option<oneshot::Receiver<Grant>>,
}

impl OfferGuard<'_> {
    /// Takes the offer back; if a release claimed it first, waits for its
    /// answer: the lease, or nothing when it was only released.
    async fn settle(&mut self) -> Option<Grant> {
        let answer = self.answer.as_mut()?;
        let grant = match self.turn.handoff().withdraw() {
            Withdrawn::Unclaimed => None,
            Withdrawn::Claimed => answer.await.ok(),
        };
        self.answer = None;
        grant
    }
}

impl Drop for OfferGuard<'_> {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        if let Withdrawn::Claimed = self.turn.handoff().withdraw() {
            answer.close();
            if let Ok(grant) = answer.try_recv() {
                let _ = self.commands.send(Command::ReleaseOrphan {
                    key: self.key.clone(),
                    holder: grant.holder,
                });
            }
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
        let queues = Arc::new(Queues::new(self.max_waiters));
        let watchdog = Watchdog::new(
            self.backend.clone(),
            Arc::clone(&queues),
            receiver,
            shutdown.clone(),
        );
        let task = runtime.spawn(watchdog.run());
        let home = Arc::new(Home::new(
            commands,
            self.backend.clone(),
            Arc::clone(&queues),
        ));
        Ok(LeaseManager {
            inner: Arc::new(Inner {
                backend: self.backend,
                queues,
                home,
                shutdown,
                task: Mutex::new(Some(task)),
                next_id: AtomicU64::new(0),
            }),
        })
    }
}
