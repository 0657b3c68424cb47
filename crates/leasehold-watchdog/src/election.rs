//! Leader election for singletons: campaign, lead, step down, campaign again.

use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseInfo, LeaseKey};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, info_span};

use crate::backoff::upper_half;
use crate::shared::Shared;
use crate::{Leader, Lease, LeaseError, LeaseManager, LeaseOptions, WorkContext};

/// One candidate in an election: at most one candidate per key leads at a
/// time, for as long as it holds the election's lease.
///
/// Every replica of a singleton (a scheduler, a compactor) runs the same
/// election; the one that acquires the lease leads until its lease ends or
/// it steps down, then all campaign again. The lease's *label* (set with
/// [`LeaseOptionsBuilder::label`](crate::LeaseOptionsBuilder::label)) is the
/// candidate's public identity, such as a host or pod name; anyone can read
/// the current leader's with [`observe`](Self::observe), or follow every
/// change of leader with [`watch_leader`](Self::watch_leader). A health
/// endpoint answers from [`is_leader`](Self::is_leader) and
/// [`has_leader`](Self::has_leader) without a round trip. Followers that
/// never campaign watch with
/// [`LeaseManager::watch_leader`](crate::LeaseManager::watch_leader).
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::MemoryBackend;
/// use leasehold_watchdog::{CancellationToken, Election, LeaseManager, LeaseOptions};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = LeaseManager::new(MemoryBackend::new())?;
/// let options = LeaseOptions::builder().ttl(Duration::from_secs(10)).label("scheduler-0").build()?;
/// let election = Election::new(manager, "scheduler", options)?;
/// let stop = CancellationToken::new();
/// let stop_after_first_term = stop.clone();
/// election
///     .run(stop, |work| {
///         let stop = stop_after_first_term.clone();
///         async move {
///             println!("leading with fencing token {}", work.fencing_token());
///             stop.cancel(); // a real leader would work until its token fires
///             work.cancelled().await;
///         }
///     })
///     .await?;
/// # Ok(()) }
/// ```
pub struct Election<B> {
    manager: LeaseManager<B>,
    key: LeaseKey,
    options: LeaseOptions,
    pause: Duration,
    /// The lease of this candidate's last term, while its handle or the
    /// watchdog keeps it: a handle dropped without a release is released
    /// by the watchdog, which then lets it go.
    term: Mutex<Weak<Shared>>,
    /// Who leads, once [`watch_leader`](Self::watch_leader) was called.
    leader: OnceLock<watch::Receiver<Option<Leader>>>,
}

impl<B: LeaseBackend> Election<B> {
    /// A candidate for `key`, campaigning with `options` (their `wait` is
    /// ignored: a campaign waits until it wins).
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] for a bad key.
    pub fn new(
        manager: LeaseManager<B>,
        key: impl AsRef<str>,
        options: LeaseOptions,
    ) -> Result<Self, LeaseError> {
        let key = LeaseKey::new(key)?;
        // Uncounted by Drop: a candidate counts from here on, campaigning
        // or not, so that an election nobody wins still shows.
        crate::metrics::candidates(options.shared_name(), 1.0);
        Ok(Self {
            manager,
            key,
            pause: options.renew_interval(),
            options,
            term: Mutex::new(Weak::new()),
            leader: OnceLock::new(),
        })
    }

    /// How long to wait after stepping down before campaigning again, so
    /// another candidate gets its turn; jittered to the upper half. Default:
    /// the renew interval (a third of the ttl).
    #[must_use]
    pub fn pause(mut self, pause: impl Into<Duration>) -> Self {
        self.pause = pause.into();
        self
    }

    /// The manager the candidate campaigns with.
    #[must_use]
    pub fn manager(&self) -> &LeaseManager<B> {
        &self.manager
    }

    /// The election's key.
    #[must_use]
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// Waits until this candidate holds the lease.
    ///
    /// # Errors
    ///
    /// [`LeaseError::ManagerStopped`] after the manager's shutdown, and
    /// backend errors that retrying cannot fix. Transient ones are retried.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped campaign leaves no lease behind.
    pub async fn campaign(&self) -> Result<Lease, LeaseError> {
        // Wait in rounds of one ttl, so a stuck wait is renewed with fresh
        // holder information.
        let options = self.options.with_wait(Some(self.options.ttl().get()));
        let mut attempt = 0;
        loop {
            match self.manager.acquire(self.key.as_str(), &options).await {
                Ok(lease) => {
                    *self.term.lock().unwrap_or_else(PoisonError::into_inner) =
                        Arc::downgrade(lease.shared());
                    return Ok(lease);
                }
                Err(LeaseError::NotAcquired { .. }) => {}
                Err(LeaseError::Backend(error)) if error.is_transient() => {
                    tokio::time::sleep(self.options.backoff().delay(attempt)).await;
                    attempt = attempt.saturating_add(1);
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// The current leader: its label, fencing token and remaining ttl, or
    /// `None` when no one leads.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] when the backend cannot be read.
    pub async fn observe(&self) -> Result<Option<LeaseInfo>, LeaseError> {
        Ok(self.manager.backend().inspect(&self.key).await?)
    }

    /// Who leads this election, as a [`watch`] receiver: the current
    /// [`Leader`] (label, fencing token, and when this observer learned of
    /// it), or `None` while no one does; see
    /// [`LeaseManager::watch_leader`](crate::LeaseManager::watch_leader),
    /// which it calls once (later calls return a clone of the same
    /// receiver). It reports this candidate's own terms too. Calling it is
    /// what makes [`has_leader`](Self::has_leader) answer.
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{Election, LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let options = LeaseOptions::builder().label("scheduler-0").build()?;
    /// let election = Election::new(manager, "scheduler", options)?;
    /// let mut leader = election.watch_leader().await?;
    /// assert!(!election.has_leader());
    ///
    /// let lease = election.campaign().await?;
    /// leader.wait_for(|l| l.is_some()).await?;
    /// assert!(election.is_leader() && election.has_leader());
    /// let token = leader.borrow().as_ref().and_then(|l| l.fencing_token);
    /// assert_eq!(token, Some(lease.fencing_token()));
    ///
    /// lease.release().await?;
    /// assert!(!election.is_leader());
    /// leader.wait_for(|l| l.is_none()).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::watch_leader`](crate::LeaseManager::watch_leader).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn watch_leader(&self) -> Result<watch::Receiver<Option<Leader>>, LeaseError> {
        if let Some(leader) = self.leader.get() {
            return Ok(leader.clone());
        }
        let leader = self.manager.watch_leader(self.key.as_str()).await?;
        // A concurrent call may have set it first: either receiver serves.
        Ok(self.leader.get_or_init(|| leader).clone())
    }

    /// Whether this candidate leads now: it holds the election's lease
    /// (not released, not lost, not dropped) and the lease's token has not
    /// fired. No round trip: the watchdog cancels the token before the
    /// lease can expire on the server. A lease handle dropped without a
    /// release stops counting once the watchdog has released it.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.term
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .upgrade()
            .is_some_and(|term| term.is_held())
    }

    /// Whether anyone leads, as last seen by
    /// [`watch_leader`](Self::watch_leader)'s receiver; `false` before
    /// the first call to it. No round trip.
    #[must_use]
    pub fn has_leader(&self) -> bool {
        self.leader
            .get()
            .is_some_and(|leader| leader.borrow().is_some())
    }

    /// Campaigns, leads, steps down and campaigns again until `stop` is
    /// cancelled.
    ///
    /// Each term runs `lead(work)` with the term's [`WorkContext`] (its
    /// token, fencing token and progress reporter). The leader must return
    /// soon after the context's token is cancelled: when the lease ends (lost, cap,
    /// deadline, shutdown) or when `stop` is cancelled. When `lead`
    /// returns, the candidate steps down (releases the lease), pauses, and
    /// campaigns again.
    ///
    /// # Errors
    ///
    /// The errors of [`campaign`](Self::campaign); a term that ends in an
    /// error of the lease is not an error of the election.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the current leader's future and releases
    /// its lease in the background; prefer cancelling `stop`.
    pub async fn run<F, Fut>(&self, stop: CancellationToken, mut lead: F) -> Result<(), LeaseError>
    where
        F: FnMut(WorkContext) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let lease = tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                lease = self.campaign() => lease?,
            };
            // Inside the lease's span (`Lease::span`), when it has one.
            let span = lease
                .span()
                .in_scope(|| info_span!("lead", key = %self.key, name = %lease.name()));
            info!(parent: &span, fencing_token = %lease.fencing_token(), "elected");
            // The work's own token, so that `stop` reaches the work: a
            // second `lease.token()` would be a sibling it never sees.
            let work = WorkContext::of(&lease);
            let token = work.token().clone();
            let leading = lead(work).instrument(span.clone());
            let mut leading = pin!(leading);
            tokio::select! {
                biased;
                () = &mut leading => {}
                () = stop.cancelled() => {
                    token.cancel();
                    leading.await;
                }
            }
            let reason = lease.loss_reason();
            // The lease expires by itself if the release fails.
            let _ = lease.release().await;
            info!(parent: &span, ?reason, "stepped down");
            tokio::select! {
                biased;
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(upper_half(self.pause)) => {}
            }
        }
    }
}

impl<B> Drop for Election<B> {
    fn drop(&mut self) {
        crate::metrics::candidates(self.options.shared_name(), -1.0);
    }
}
