//! An in-process backend with the semantics of the Redis scripts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fair::FairQueue;
use crate::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, FairBackend,
    FairOutcome, FairPlace, FencingToken, Grant, HandoverBackend, HandoverOutcome, HandoverWatch,
    HolderId, LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, PermitBackend, PermitLimit, PlaceTtl,
    ReadWriteBackend, ReleaseOutcome, ReleaseReport, ReleaseWatch, RenewOutcome, RenewRequest,
    TickBackend, Ttl, WatchPolicy,
};

mod ticks;

/// A [`LeaseBackend`] kept in this process, on the tokio clock.
///
/// It behaves like the Redis backend (idempotent re-acquire, strictly rising
/// fencing tokens, compare-and-pexpire, compare-and-delete, a key kept for
/// ttl + lock-delay, a release under a minimum hold that keeps the key
/// until the grant + the minimum) but only
/// excludes holders within one process: use it for single-process programs,
/// examples, and tests. Under `tokio::time::pause()` its leases expire on the
/// paused clock, so timing tests run instantly and deterministically.
///
/// # Faults, for testing loss handling
///
/// It can also inject the faults a real server shows, so that programs can
/// test how they handle a slow server and a lost lease, deterministically on
/// the paused tokio clock:
///
/// | method | acts like |
/// |---|---|
/// | [`set_latency`](Self::set_latency) | a slow server or network: every operation takes this long |
/// | [`hang`](Self::hang) / [`resume`](Self::resume) | a paused or cut-off server: operations wait (leases keep expiring) |
/// | [`fail_next`](Self::fail_next) | a broken connection: the next operations fail with [`BackendError::Unavailable`] |
/// | [`vanish`](Self::vanish) | an expiry, failover or `DEL`: the lease is gone |
/// | [`hand_over`](Self::hand_over) | a takeover: the lease now belongs to someone else, with a higher fencing token |
/// | [`cut_changes`](Self::cut_changes) / [`restore_changes`](Self::restore_changes) | a lost change-watching connection: changes go unreported, then every lease is reported as possibly changed ([`LeaseChange::All`]) |
/// | [`set_wall_clock`](Self::set_wall_clock) | a server whose clock stepped: scheduled jobs' ticks are decided by it ([`TickBackend`]) |
///
/// Faults apply to every clone of the backend.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{AcquireRequest, BackendError, HolderId, LeaseBackend, LeaseKey, MemoryBackend, RenewOutcome, RenewRequest, Ttl};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = MemoryBackend::new();
/// let (key, me, ttl) = (LeaseKey::new("job")?, HolderId::generate()?, Ttl::parse("3s")?);
/// backend.try_acquire(&AcquireRequest::new(key.clone(), me, ttl)).await?;
/// let renew = RenewRequest::new(key.clone(), me, ttl);
///
/// // A connection that breaks twice: retries then succeed.
/// backend.fail_next(2);
/// for _ in 0..2 {
///     let error = backend.renew(&renew).await.unwrap_err();
///     assert!(matches!(error, BackendError::Unavailable { .. }) && error.is_transient());
/// }
/// assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
///
/// // A server that takes longer than the lease lives: on the paused clock
/// // this returns at once, and the lease has expired meanwhile.
/// backend.set_latency(Duration::from_secs(4));
/// assert_eq!(backend.renew(&renew).await?, RenewOutcome::Lost);
/// backend.set_latency(Duration::ZERO);
///
/// // Someone else takes the lease: our renewals now say so.
/// let theirs = backend.hand_over(&key, ttl)?;
/// assert_eq!(backend.renew(&renew).await?, RenewOutcome::Lost);
/// assert!(backend.vanish(&key));
/// # let _ = theirs; Ok(()) }
/// ```
///
/// ```
/// use leasehold_core::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend, LeaseKey, MemoryBackend, Ttl};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = MemoryBackend::new();
/// let key = LeaseKey::new("job")?;
/// let ttl = Ttl::parse("10s")?;
/// let first = backend.try_acquire(&AcquireRequest::new(key.clone(), HolderId::generate()?, ttl)).await?;
/// let second = backend.try_acquire(&AcquireRequest::new(key, HolderId::generate()?, ttl)).await?;
/// assert!(matches!(first, AcquireOutcome::Acquired(_)));
/// assert!(matches!(second, AcquireOutcome::Held(_)));
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
    /// Which client this is (see [`client`](Self::client)): 0 for the
    /// backend [`new`](Self::new) made and its clones.
    client: u64,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    latency: Mutex<Duration>,
    hung: HangSwitch,
    /// How many of the next operations fail (see `fail_next`).
    failures: Mutex<u64>,
    /// The number of clients made by `client`, the first backend included.
    clients: AtomicU64,
    /// The wall clock scheduled jobs' ticks are decided by.
    wall: ticks::WallClock,
}

struct HangSwitch(watch::Sender<bool>);

impl Default for HangSwitch {
    fn default() -> Self {
        Self(watch::Sender::new(false))
    }
}

#[derive(Default)]
struct State {
    leases: HashMap<LeaseKey, Entry>,
    /// Fencing counters, per [`LeaseKey::counted_as`]: a semaphore's
    /// permits share one.
    fences: HashMap<LeaseKey, u64>,
    /// The permit limit of each semaphore, by its first permit's key; kept
    /// after the permits are gone, as the Redis backend keeps it.
    limits: HashMap<LeaseKey, u32>,
    /// Release notices per [`LeaseKey::counted_as`] (a permit's release
    /// wakes its semaphore's watchers), while someone watches it.
    notices: HashMap<LeaseKey, watch::Sender<u64>>,
    /// The reader keys of each read-write lease, by its writer's key, as
    /// the Redis backend's reader index: pruned of expired readers
    /// whenever read.
    readers: HashMap<LeaseKey, Vec<LeaseKey>>,
    /// The intent of a writer waiting for each read-write lease, by its
    /// writer's key.
    intents: HashMap<LeaseKey, Entry>,
    /// Every change watch, with the client that opened it.
    changes: Vec<(u64, mpsc::UnboundedSender<LeaseChange>)>,
    /// The client whose operation holds the state now (set by `state()`):
    /// its own grants and releases are not reported to its own watches.
    writer: u64,
    /// Whether changes go unreported (see `cut_changes`).
    changes_cut: bool,
    /// The fair queue of each key that has one, as the Redis backend keeps
    /// it: forgotten once empty.
    fair: HashMap<LeaseKey, FairQueue<Instant>>,
    /// Scheduled jobs' records (see `ticks`).
    jobs: ticks::Jobs,
}

#[derive(Clone)]
struct Entry {
    holder: HolderId,
    token: FencingToken,
    label: Option<String>,
    expires_at: Instant,
    /// The end of the minimum hold, from the grant that took the key: a
    /// release before it keeps the entry until then (`P:held-until` in
    /// the Redis backend).
    held_until: Option<Instant>,
}

impl Entry {
    fn info(&self, now: Instant) -> LeaseInfo {
        LeaseInfo {
            label: self.label.clone(),
            fencing_token: Some(self.token),
            ttl_left: Some(self.expires_at.saturating_duration_since(now)),
        }
    }
}

impl State {
    /// The live entry for `key`, dropping it first if it has expired.
    fn live(&mut self, key: &LeaseKey, now: Instant) -> Option<&mut Entry> {
        if self.leases.get(key).is_some_and(|e| e.expires_at <= now) {
            self.leases.remove(key);
        }
        self.leases.get_mut(key)
    }

    /// Gives the free lease `request.key` to `request.holder` with the next
    /// fencing token.
    fn grant(&mut self, request: &AcquireRequest, now: Instant, sent_at: Instant) -> Grant {
        let token = self.next_token(&request.key);
        self.report_write(&request.key);
        self.leases.insert(
            request.key.clone(),
            Entry {
                holder: request.holder,
                token,
                label: request.label.clone(),
                expires_at: now + request.expiry(),
                held_until: request
                    .hold_at_least_millis()
                    .map(|ms| now + Duration::from_millis(ms)),
            },
        );
        Grant::new(
            request.key.clone(),
            request.holder,
            token,
            request.ttl,
            sent_at,
        )
    }

    /// Wakes the key's watchers and says how many there are; forgets the
    /// key's notices once no one watches.
    fn announce(&mut self, key: &LeaseKey) -> usize {
        self.report_write(key);
        let key = key.counted_as();
        let Some(notices) = self.notices.get(&key) else {
            return 0;
        };
        notices.send_modify(|n| *n = n.wrapping_add(1));
        let listeners = notices.receiver_count();
        if listeners == 0 {
            self.notices.remove(&key);
        }
        listeners
    }

    /// Releases `holder`'s live lease on `key` if its minimum hold has not
    /// run out: the entry stays, still `holder`'s, until the hold's end,
    /// with no notice (nothing is free yet). Whether it was kept.
    fn keep(&mut self, key: &LeaseKey, holder: &HolderId, now: Instant) -> bool {
        match self.live(key, now) {
            Some(entry) if entry.holder == *holder => match entry.held_until {
                Some(until) if until > now => {
                    // Later or earlier than the current expiry: the
                    // release fixes the key's end at the hold's end, as
                    // release.lua's PEXPIRE does.
                    entry.expires_at = until;
                    true
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// How many watch the release notices of `key`.
    fn listeners(&self, key: &LeaseKey) -> usize {
        self.notices
            .get(&key.counted_as())
            .map_or(0, watch::Sender::receiver_count)
    }

    /// Reports `change` to every change watch, unless changes are cut.
    fn report(&mut self, change: &LeaseChange) {
        if !self.changes_cut {
            self.changes
                .retain(|(_, watch)| watch.send(change.clone()).is_ok());
        }
    }

    /// Reports a grant or release of `key` by the current writer to the
    /// watches of every other client, as a Redis server reports a write to
    /// every connection tracking the key but the writer's own (`NOLOOP`).
    fn report_write(&mut self, key: &LeaseKey) {
        if self.changes_cut {
            return;
        }
        let writer = self.writer;
        let change = LeaseChange::Changed(key.clone());
        self.changes
            .retain(|(client, watch)| *client == writer || watch.send(change.clone()).is_ok());
    }

    /// Refreshes `request.holder`'s own live lease on `key`, keeping its
    /// token; `None` when `key` is not theirs.
    fn refresh(
        &mut self,
        key: &LeaseKey,
        request: &AcquireRequest,
        now: Instant,
        sent_at: Instant,
    ) -> Option<Grant> {
        let entry = self.live(key, now).filter(|e| e.holder == request.holder)?;
        entry.expires_at = now + request.expiry();
        entry.label.clone_from(&request.label);
        Some(Grant::new(
            key.clone(),
            request.holder,
            entry.token,
            request.ttl,
            sent_at,
        ))
    }

    /// The live intent of a writer waiting for `lease`.
    fn intent(&mut self, lease: &LeaseKey, now: Instant) -> Option<&Entry> {
        if self.intents.get(lease).is_some_and(|e| e.expires_at <= now) {
            self.intents.remove(lease);
        }
        self.intents.get(lease)
    }

    /// Leaves `request.holder`'s intent to write `lease` for its ttl,
    /// unless another writer's is there.
    fn want(&mut self, lease: &LeaseKey, request: &AcquireRequest, now: Instant) {
        if self
            .intent(lease, now)
            .is_some_and(|e| e.holder != request.holder)
        {
            return;
        }
        self.intents.insert(
            lease.clone(),
            Entry {
                holder: request.holder,
                token: FencingToken(0),
                label: request.label.clone(),
                expires_at: now + request.expiry(),
                held_until: None,
            },
        );
    }

    /// The live readers of `lease` (pruning the index of the others), and
    /// the one that frees first.
    fn live_readers(&mut self, lease: &LeaseKey, now: Instant) -> (usize, Option<Entry>) {
        let keys = self.readers.remove(lease).unwrap_or_default();
        let mut live = Vec::with_capacity(keys.len());
        let mut soonest: Option<Entry> = None;
        for key in keys {
            if let Some(entry) = self.live(&key, now) {
                if soonest
                    .as_ref()
                    .is_none_or(|s| entry.expires_at < s.expires_at)
                {
                    soonest = Some(entry.clone());
                }
                live.push(key);
            }
        }
        let count = live.len();
        if count > 0 {
            self.readers.insert(lease.clone(), live);
        }
        (count, soonest)
    }

    fn next_token(&mut self, key: &LeaseKey) -> FencingToken {
        let counter = self.fences.entry(key.counted_as()).or_insert(0);
        *counter += 1;
        FencingToken(*counter)
    }
}

impl MemoryBackend {
    /// An empty backend.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave State half-updated
        // (every update is a single insert or remove), so poisoning is ignored.
        let mut state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.writer = self.client;
        state
    }

    /// Another client of the same leases, as a second process connected to
    /// the same Redis server: it shares every lease, notice and fault with
    /// this backend, and its change watches hear of the grants and releases
    /// made through this backend (and this backend's of its own), as a
    /// server with client tracking tells every connection that read a key
    /// but the one that wrote it. Clones of a backend are one client and
    /// hear none of their own; give each lease manager that stands for a
    /// process of its own (an election's candidates, its observers) a
    /// client of its own.
    ///
    /// ```
    /// use leasehold_core::{AcquireRequest, ChangeBackend, HolderId, LeaseBackend, LeaseChange, LeaseKey, MemoryBackend, Ttl};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let one = MemoryBackend::new();
    /// let other = one.client();
    /// let (mut theirs, mut ours) = (other.watch_changes().await?, one.watch_changes().await?);
    /// let key = LeaseKey::new("job")?;
    /// one.try_acquire(&AcquireRequest::new(key.clone(), HolderId::generate()?, Ttl::parse("3s")?)).await?;
    /// assert_eq!(theirs.try_next(), Some(LeaseChange::Changed(key)));
    /// assert_eq!(ours.try_next(), None);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn client(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            client: self.inner.clients.fetch_add(1, Ordering::Relaxed) + 1,
        }
    }

    /// Every operation first waits for the injected latency and while hung,
    /// then fails if [`fail_next`](Self::fail_next) says so.
    async fn gate(&self, op: &'static str, key: &LeaseKey) -> Result<(), BackendError> {
        self.wait_gate()
            .await
            .map_err(|source| BackendError::Unavailable {
                op,
                key: key.as_str().to_owned(),
                source,
            })
    }

    async fn wait_gate(&self) -> Result<(), crate::Cause> {
        let latency = *self
            .inner
            .latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut hung = self.inner.hung.0.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we hold it.
        let _ = hung.wait_for(|h| !*h).await;
        let mut failures = self
            .inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *failures == 0 {
            return Ok(());
        }
        *failures -= 1;
        Err(Arc::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected by MemoryBackend::fail_next",
        )))
    }

    /// Makes the next `n` operations fail with [`BackendError::Unavailable`]
    /// (a transient error, as a broken connection gives), after any latency
    /// or hang. A [`renew_many`](LeaseBackend::renew_many) call counts as one
    /// operation and gives the error to every request in it. `fail_next(0)`
    /// cancels failures not used up yet.
    pub fn fail_next(&self, n: u64) {
        *self
            .inner
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = n;
    }

    /// Delays every following operation by `latency` (zero turns it off).
    pub fn set_latency(&self, latency: Duration) {
        *self
            .inner
            .latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = latency;
    }

    /// Makes every operation, including those already waiting, hang until
    /// [`resume`](Self::resume) is called, as a paused or cut-off server
    /// would. Leases keep expiring meanwhile.
    pub fn hang(&self) {
        self.inner.hung.0.send_replace(true);
    }

    /// Ends a [`hang`](Self::hang): waiting operations proceed.
    pub fn resume(&self) {
        self.inner.hung.0.send_replace(false);
    }

    /// Deletes a lease behind its holder's back, as an expiry, a failover or
    /// an operator's `DEL` would. Returns whether there was one.
    ///
    /// The change is reported to every [`ChangeWatch`] (as a server with
    /// client tracking reports a `DEL`), unless changes are
    /// [cut](Self::cut_changes), so a watchdog renews the lease at once and
    /// its holder learns of the loss without waiting for its next renewal.
    pub fn vanish(&self, key: &LeaseKey) -> bool {
        let mut state = self.state();
        let there = state.leases.remove(key).is_some();
        if there {
            state.report(&LeaseChange::Changed(key.clone()));
        }
        there
    }

    /// Gives the lease to a new holder with a new fencing token, whether or
    /// not someone holds it, as a second client that saw it expire would.
    /// The change is reported to every [`ChangeWatch`] unless changes are
    /// [cut](Self::cut_changes), as for [`vanish`](Self::vanish).
    ///
    /// # Errors
    ///
    /// [`crate::InputError::Entropy`] if no holder id can be drawn.
    pub fn hand_over(&self, key: &LeaseKey, ttl: Ttl) -> Result<Grant, crate::InputError> {
        let holder = HolderId::generate()?;
        let now = Instant::now();
        let mut state = self.state();
        let token = state.next_token(key);
        state.leases.insert(
            key.clone(),
            Entry {
                holder,
                token,
                label: None,
                expires_at: now + ttl.get(),
                held_until: None,
            },
        );
        state.report(&LeaseChange::Changed(key.clone()));
        Ok(Grant::new(key.clone(), holder, token, ttl, now))
    }

    /// Stops reporting changes, as a backend whose change-watching
    /// connection is lost: from now on [`vanish`](Self::vanish) and
    /// [`hand_over`](Self::hand_over) change leases without telling any
    /// [`ChangeWatch`], so their holders learn of it only at their next
    /// renewal, or when [`restore_changes`](Self::restore_changes) is called.
    /// Every other operation works as before.
    pub fn cut_changes(&self) {
        self.state().changes_cut = true;
    }

    /// Reports [`LeaseChange::All`] to every [`ChangeWatch`] and reports
    /// changes again, as a backend does when its change-watching connection
    /// is back (or the server was flushed): changes may have been missed, so
    /// every lease may have changed. A watchdog then renews all its leases
    /// at once, and the holders of leases changed meanwhile learn of it
    /// without waiting for their next renewal. Works whether or not changes
    /// were [cut](Self::cut_changes).
    ///
    /// ```
    /// use leasehold_core::{AcquireRequest, ChangeBackend, HolderId, LeaseBackend, LeaseChange, LeaseKey, MemoryBackend, Ttl};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let mut watch = backend.watch_changes().await?;
    /// let key = LeaseKey::new("job")?;
    /// backend.try_acquire(&AcquireRequest::new(key.clone(), HolderId::generate()?, Ttl::parse("3s")?)).await?;
    ///
    /// // The watching connection drops; a deletion meanwhile goes unreported.
    /// backend.cut_changes();
    /// assert!(backend.vanish(&key));
    /// assert_eq!(watch.try_next(), None);
    ///
    /// // It comes back: every lease may have changed.
    /// backend.restore_changes();
    /// assert_eq!(watch.next().await, Some(LeaseChange::All));
    /// # Ok(()) }
    /// ```
    pub fn restore_changes(&self) {
        let mut state = self.state();
        state.changes_cut = false;
        state.report(&LeaseChange::All);
    }

    fn renew_now(&self, request: &RenewRequest) -> RenewOutcome {
        let now = Instant::now();
        match self.state().live(&request.key, now) {
            Some(entry) if entry.holder == request.holder => {
                entry.expires_at = now + request.expiry();
                RenewOutcome::Renewed
            }
            _ => RenewOutcome::Lost,
        }
    }
}

/// The refusal of a read-write operation on a share key, or of an
/// exclusive acquisition of one (it would not see the other shares).
/// Refuses a minimum hold where it has no meaning: a permit, a share or a
/// fair-queue grant (see [`AcquireRequest::hold_at_least`]).
fn exclusive_only(op: &'static str, request: &AcquireRequest) -> Result<(), BackendError> {
    if request.hold_at_least_millis().is_some() {
        return Err(BackendError::Unsupported {
            op,
            key: request.key.as_str().to_owned(),
            reason: "a minimum hold applies to exclusive leases only; acquire without hold_at_least",
        });
    }
    Ok(())
}

fn not_a_share(op: &'static str, key: &LeaseKey) -> Result<(), BackendError> {
    if key.rw_of().is_none() {
        return Ok(());
    }
    Err(BackendError::Unsupported {
        op,
        key: key.as_str().to_owned(),
        reason: "this is a reader's or writer's key of a read-write lease: acquire the lease itself with try_acquire_read or try_acquire_write",
    })
}

/// The writer's key of the read-write lease `lease`, and `holder`'s
/// reader key.
fn share_keys(
    op: &'static str,
    lease: &LeaseKey,
    holder: &HolderId,
) -> Result<(LeaseKey, LeaseKey), BackendError> {
    not_a_share(op, lease)?;
    let refuse = |_| BackendError::Unsupported {
        op,
        key: lease.as_str().to_owned(),
        reason: "a read-write lease key must leave room for its readers' keys (\"{key}:read:\" and 32 hex digits within 512 bytes); choose a shorter key",
    };
    Ok((
        lease.writer_key().map_err(refuse)?,
        lease.reader_key(holder).map_err(refuse)?,
    ))
}

/// The keys of the `limit` permits of `semaphore`.
fn permit_keys(
    op: &'static str,
    semaphore: &LeaseKey,
    limit: PermitLimit,
) -> Result<Vec<LeaseKey>, BackendError> {
    (0..limit.get())
        .map(|i| semaphore.permit(i))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| BackendError::Unsupported {
            op,
            key: semaphore.as_str().to_owned(),
            reason: "a semaphore key must leave room for its permits' keys (\"{key}:permit:99\" within 512 bytes); choose a shorter key",
        })
}

impl std::fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("leases", &self.state().leases.len())
            .finish_non_exhaustive()
    }
}

impl LeaseBackend for MemoryBackend {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        let sent_at = Instant::now();
        not_a_share("acquire", &request.key)?;
        self.gate("acquire", &request.key).await?;
        let now = Instant::now();
        let mut state = self.state();
        if let Some(entry) = state.live(&request.key, now) {
            if entry.holder != request.holder {
                return Ok(AcquireOutcome::Held(entry.info(now)));
            }
            entry.expires_at = now + request.expiry();
            entry.label.clone_from(&request.label);
            let token = entry.token;
            return Ok(AcquireOutcome::Acquired(Grant::new(
                request.key.clone(),
                request.holder,
                token,
                request.ttl,
                sent_at,
            )));
        }
        Ok(AcquireOutcome::Acquired(state.grant(request, now, sent_at)))
    }

    async fn renew(&self, request: &RenewRequest) -> Result<RenewOutcome, BackendError> {
        self.gate("renew", &request.key).await?;
        Ok(self.renew_now(request))
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        if let Err(source) = self.wait_gate().await {
            return requests
                .iter()
                .map(|r| {
                    Err(BackendError::Unavailable {
                        op: "renew",
                        key: r.key.as_str().to_owned(),
                        source: Arc::clone(&source),
                    })
                })
                .collect();
        }
        requests.iter().map(|r| Ok(self.renew_now(r))).collect()
    }

    /// Heard when the key's notices have a watch: every watch on a memory
    /// backend counts, as managers sharing one stand for separate processes.
    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        self.gate("release", key).await?;
        let now = Instant::now();
        let mut state = self.state();
        if state.keep(key, holder, now) {
            return Ok(ReleaseReport::Released { heard: false });
        }
        match state.live(key, now) {
            Some(entry) if entry.holder == *holder => {
                state.leases.remove(key);
                let listeners = state.announce(key);
                Ok(ReleaseReport::Released {
                    heard: listeners > 0,
                })
            }
            _ => Ok(ReleaseReport::NotHeld),
        }
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.gate("inspect", key).await?;
        let now = Instant::now();
        Ok(self.state().live(key, now).map(|e| e.info(now)))
    }

    /// Every policy alike: one process has no order of subscribers to
    /// favour, and the count is free.
    async fn watch_releases(
        &self,
        key: &LeaseKey,
        _policy: WatchPolicy,
    ) -> Result<ReleaseWatch, BackendError> {
        self.gate("watch_releases", key).await?;
        let receiver = self
            .state()
            .notices
            .entry(key.counted_as())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        Ok(ReleaseWatch::new(receiver, ()))
    }

    fn permits(&self) -> Option<&impl PermitBackend> {
        Some(self)
    }

    fn read_write(&self) -> Option<&impl ReadWriteBackend> {
        Some(self)
    }

    fn fair(&self) -> Option<&impl FairBackend> {
        Some(self)
    }

    fn handover(&self) -> Option<&impl HandoverBackend> {
        Some(self)
    }

    fn changes(&self) -> Option<&impl ChangeBackend> {
        Some(self)
    }

    fn ticks(&self) -> Option<&impl TickBackend> {
        Some(self)
    }
}

impl PermitBackend for MemoryBackend {
    /// Permits are kept as the Redis backend keeps them: each a lease on
    /// its permit key, the limit beside them.
    async fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_permit";
        let sent_at = Instant::now();
        exclusive_only(OP, request)?;
        let permits = permit_keys(OP, &request.key, limit)?;
        self.gate(OP, &request.key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let first = permits[0].clone();
        if let Some(&held) = state.limits.get(&first)
            && held != limit.get()
        {
            // The limit may change only while no permit is held under it.
            let mut taken = false;
            for i in 0..held {
                let permit = request.key.permit(i);
                taken |= permit.is_ok_and(|p| state.live(&p, now).is_some());
            }
            if taken {
                return Err(BackendError::PermitLimitMismatch {
                    key: request.key.as_str().to_owned(),
                    asked: limit.get(),
                    held,
                });
            }
        }
        state.limits.insert(first, limit.get());
        // Ours already: refresh it, as a re-acquire of a lease does.
        for permit in &permits {
            if let Some(entry) = state.live(permit, now)
                && entry.holder == request.holder
            {
                entry.expires_at = now + request.expiry();
                entry.label.clone_from(&request.label);
                let token = entry.token;
                return Ok(AcquireOutcome::Acquired(Grant::new(
                    permit.clone(),
                    request.holder,
                    token,
                    request.ttl,
                    sent_at,
                )));
            }
        }
        let mut soonest: Option<Entry> = None;
        for permit in &permits {
            match state.live(permit, now) {
                None => {
                    let mut grant = request.clone();
                    grant.key = permit.clone();
                    return Ok(AcquireOutcome::Acquired(state.grant(&grant, now, sent_at)));
                }
                Some(entry) => {
                    if soonest
                        .as_ref()
                        .is_none_or(|s| entry.expires_at < s.expires_at)
                    {
                        soonest = Some(entry.clone());
                    }
                }
            }
        }
        Ok(AcquireOutcome::Held(
            soonest.map(|e| e.info(now)).unwrap_or_default(),
        ))
    }
}

impl ReadWriteBackend for MemoryBackend {
    /// Kept as the Redis backend keeps them: each reader on its own key,
    /// an index of them per lease, the waiting writer's intent beside.
    async fn try_acquire_read(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_read";
        let sent_at = Instant::now();
        exclusive_only(OP, request)?;
        let (writer, reader) = share_keys(OP, &request.key, &request.holder)?;
        // The index and the intent are kept by the writer's key: one per
        // lease (`K` and `{K}` are one), as `P:readers` is.
        let lease = writer.clone();
        self.gate(OP, &request.key).await?;
        let now = Instant::now();
        let mut state = self.state();
        if let Some(grant) = state.refresh(&reader, request, now, sent_at) {
            return Ok(AcquireOutcome::Acquired(grant));
        }
        if let Some(entry) = state.live(&writer, now) {
            return Ok(AcquireOutcome::Held(entry.info(now)));
        }
        if let Some(intent) = state.intent(&lease, now)
            && intent.holder != request.holder
        {
            let mut info = intent.info(now);
            info.fencing_token = None;
            return Ok(AcquireOutcome::Held(info));
        }
        let mut grant = request.clone();
        grant.key = reader.clone();
        let granted = state.grant(&grant, now, sent_at);
        // Pruned here too, so that a lease read for ever without a writer
        // keeps a bounded index.
        state.live_readers(&lease, now);
        let readers = state.readers.entry(lease).or_default();
        if !readers.contains(&reader) {
            readers.push(reader);
        }
        Ok(AcquireOutcome::Acquired(granted))
    }

    async fn try_acquire_write(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire_write";
        let sent_at = Instant::now();
        exclusive_only(OP, request)?;
        let (writer, _) = share_keys(OP, &request.key, &request.holder)?;
        let lease = writer.clone();
        self.gate(OP, &request.key).await?;
        let now = Instant::now();
        let mut state = self.state();
        if let Some(grant) = state.refresh(&writer, request, now, sent_at) {
            return Ok(AcquireOutcome::Acquired(grant));
        }
        if let Some(entry) = state.live(&writer, now) {
            let info = entry.info(now);
            state.want(&lease, request, now);
            return Ok(AcquireOutcome::Held(info));
        }
        if let (1.., soonest) = state.live_readers(&lease, now) {
            state.want(&lease, request, now);
            return Ok(AcquireOutcome::Held(
                soonest.map(|e| e.info(now)).unwrap_or_default(),
            ));
        }
        if state
            .intent(&lease, now)
            .is_some_and(|e| e.holder == request.holder)
        {
            state.intents.remove(&lease);
        }
        let mut grant = request.clone();
        grant.key = writer;
        Ok(AcquireOutcome::Acquired(state.grant(&grant, now, sent_at)))
    }

    async fn withdraw_write_intent(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<bool, BackendError> {
        const OP: &str = "withdraw_write_intent";
        let (lease, _) = share_keys(OP, key, holder)?;
        self.gate(OP, key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let mine = state
            .intent(&lease, now)
            .is_some_and(|e| e.holder == *holder);
        if mine {
            state.intents.remove(&lease);
        }
        Ok(mine)
    }
}

impl FairBackend for MemoryBackend {
    /// The queue is kept as the Redis backend keeps it (`fair.lua`): places
    /// in arrival order, each expiring unless refreshed.
    async fn try_acquire_fair(
        &self,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        // In one process a release notice reaches the head at once: no
        // handover is needed, and none is made.
        _handover: Option<Duration>,
    ) -> Result<FairOutcome, BackendError> {
        let sent_at = Instant::now();
        not_a_share("acquire_fair", &request.key)?;
        exclusive_only("acquire_fair", request)?;
        self.gate("acquire_fair", &request.key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let key = &request.key;
        let holder = match state.live(key, now) {
            Some(entry) if entry.holder == request.holder => {
                // Ours already (a lost reply): refresh it, as try_acquire
                // does, and leave our place if we still have one (fair.lua
                // does both), so that it is not counted ahead of anyone.
                entry.expires_at = now + request.expiry();
                entry.label.clone_from(&request.label);
                let token = entry.token;
                let queued = match state.fair.get_mut(key) {
                    Some(queue) => {
                        queue.leave(&request.holder);
                        let queued = queue.len();
                        if queue.is_empty() {
                            state.fair.remove(key);
                        }
                        queued
                    }
                    None => 0,
                };
                let grant = Grant::new(key.clone(), request.holder, token, request.ttl, sent_at);
                return Ok(FairOutcome::Acquired { grant, queued });
            }
            Some(entry) => Some(entry.info(now)),
            None => None,
        };
        let queue = state.fair.entry(key.clone()).or_default();
        let (ahead, queued) = queue.enter(request.holder, now, now + place_ttl.get());
        if holder.is_some() || ahead > 0 {
            return Ok(FairOutcome::Waiting(FairPlace {
                ahead,
                queued,
                holder,
            }));
        }
        queue.leave(&request.holder);
        let queued = queue.len();
        if queue.is_empty() {
            state.fair.remove(key);
        }
        let grant = state.grant(request, now, sent_at);
        Ok(FairOutcome::Acquired { grant, queued })
    }

    /// In one process a release notice reaches the head at once: nothing
    /// is handed over, the lease is released as any other.
    async fn release_fair(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseOutcome, BackendError> {
        Ok(self.release(key, holder).await?.outcome())
    }

    /// Nothing is handed over (see [`release_fair`](Self::release_fair)).
    async fn watch_handover(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<HandoverWatch, BackendError> {
        let _ = (key, holder);
        Ok(HandoverWatch::unsupported())
    }

    async fn leave_fair_queue(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<(), BackendError> {
        self.gate("leave_fair_queue", key).await?;
        let mut state = self.state();
        if let Some(queue) = state.fair.get_mut(key) {
            queue.leave(holder);
            if queue.is_empty() {
                state.fair.remove(key);
            }
        }
        Ok(())
    }
}

impl HandoverBackend for MemoryBackend {
    /// Hands over while the key's notices have at most one watch (the
    /// offering waiter's own); with more, someone else waits: release and
    /// announce instead.
    async fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> Result<HandoverOutcome, BackendError> {
        let sent_at = Instant::now();
        self.gate("release_to", key).await?;
        let now = Instant::now();
        let mut state = self.state();
        if !state.live(key, now).is_some_and(|e| e.holder == *holder) {
            return Ok(HandoverOutcome::NotHeld);
        }
        if state.keep(key, holder, now) {
            // Under its minimum hold the lease goes to no one, here or
            // elsewhere: the offering waiter asks again when it runs out.
            return Ok(HandoverOutcome::Released);
        }
        state.leases.remove(key);
        let listeners = state.listeners(key);
        // A share of a read-write lease is never handed over: its grant
        // is decided against the lease's other shares.
        if listeners > 1 || next.key != *key || key.rw_of().is_some() {
            state.announce(key);
            return Ok(HandoverOutcome::Released);
        }
        Ok(HandoverOutcome::HandedOver(state.grant(next, now, sent_at)))
    }
}

impl ChangeBackend for MemoryBackend {
    /// Reports the changes made by [`vanish`](MemoryBackend::vanish) and
    /// [`hand_over`](MemoryBackend::hand_over) (nothing else changes a
    /// lease behind its holder's back here), and the grants and releases
    /// made by other [clients](MemoryBackend::client). An expiry is not
    /// reported: it happens when the lease is next read.
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.state().changes.push((self.client, sender));
        Ok(ChangeWatch::new(receiver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn key() -> LeaseKey {
        LeaseKey::new("k").expect("valid key")
    }

    #[tokio::test(start_paused = true)]
    async fn exclusive_until_expiry_with_rising_tokens() -> TestResult {
        let backend = MemoryBackend::new();
        let ttl = Ttl::parse("1s")?;
        let (a, b) = (HolderId::generate()?, HolderId::generate()?);
        let AcquireOutcome::Acquired(first) = backend
            .try_acquire(&AcquireRequest::new(key(), a, ttl))
            .await?
        else {
            panic!("a free key must be acquired");
        };
        assert!(matches!(
            backend
                .try_acquire(&AcquireRequest::new(key(), b, ttl))
                .await?,
            AcquireOutcome::Held(_)
        ));
        // Re-acquire by the same holder keeps the token.
        let AcquireOutcome::Acquired(again) = backend
            .try_acquire(&AcquireRequest::new(key(), a, ttl))
            .await?
        else {
            panic!("re-acquire by the holder must succeed");
        };
        assert_eq!(again.fencing_token, first.fencing_token);
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(
            backend.renew(&RenewRequest::new(key(), a, ttl)).await?,
            RenewOutcome::Lost
        );
        let AcquireOutcome::Acquired(second) = backend
            .try_acquire(&AcquireRequest::new(key(), b, ttl))
            .await?
        else {
            panic!("an expired key must be acquired");
        };
        assert!(second.fencing_token > first.fencing_token);
        assert_eq!(
            backend.release(&key(), &a).await?.outcome(),
            ReleaseOutcome::NotHeld
        );
        assert_eq!(
            backend.release(&key(), &b).await?.outcome(),
            ReleaseOutcome::Released
        );
        assert_eq!(backend.inspect(&key()).await?, None);
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn hang_blocks_until_resume() -> TestResult {
        let backend = MemoryBackend::new();
        backend.hang();
        let pending = tokio::spawn({
            let backend = backend.clone();
            async move { backend.inspect(&key()).await }
        });
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!pending.is_finished());
        backend.resume();
        // Bounded: an operation that stays hung fails the test, not hangs it.
        let finished = tokio::time::timeout(Duration::from_secs(1), pending).await?;
        assert_eq!(finished??, None);
        Ok(())
    }
}
