//! The watchdog: one task for every lease of a manager, with no timer and
//! no task per lease.
//!
//! Each lease waits in exactly one place: a *bucket* (every lease due at one
//! instant shares a bucket, and the buckets share one timer) while it waits
//! for its next renewal, or a *batch in flight* while its renewal is on its
//! way. Renewal times are moved back onto a grid ([`RENEW_WINDOW_DIVISOR`]
//! steps per renew interval, counted from the watchdog's start), so leases
//! acquired close together fall due in the same bucket and share their round
//! trips from the first renewal on; renewed together, they stay together.
//! Renewals are only ever sent early, never late. A bucket place is never
//! searched for: each lease carries a generation number, bumped whenever it
//! moves, and a place whose generation no longer matches is skipped.
//!
//! Due renewals go to the backend as `renew_many` batches of at most
//! [`MAX_BATCH`], at most [`MAX_IN_FLIGHT`] calls at once. Each batch in
//! flight has one deadline timer, at the earliest deadline of the leases
//! still waiting on it; when it fires, the leases whose deadline came are
//! ended and the timer moves to the next deadline. Backend calls run as
//! futures inside this task, so a slow batch never delays a deadline: the
//! timer branch of the loop fires on time whatever the backend does.
//!
//! A new lease, and a lease its handle released, reach the watchdog through
//! a [`Registry`] rather than its command channel: a note the watchdog reads
//! whenever it wakes, before anything else. The watchdog publishes, each
//! time it goes to sleep, when it will wake at the latest; a registration
//! wakes it only if the bucket the new lease's first renewal falls in (or
//! its deadline) is due before that, worked out on the watchdog's own grid,
//! or once [`NOTES_PER_WAKE`] notes wait, which bounds what released
//! leases the notes keep alive. Most leases are renewed at the same
//! interval as those before them, so a steady flow of acquisitions and
//! releases wakes the watchdog once per that many notes, not twice per
//! lease; and a lease registered and forgotten between two reads costs the
//! watchdog nothing but the two notes. A release that has to
//! reach the server (a dropped handle, an ended lease) still goes by the
//! channel, and the watchdog reads the notes before every command, so it
//! always knows the lease a command names.
//!
//! A lease with a maximum hold or a progress window (bounds.rs) is also in
//! a side table, looked at only while it is not empty: at each of its
//! renewal times, a lease whose holder reported no progress within the
//! window ends as stalled, and a lease that a renewal would keep valid past
//! its maximum is renewed no more (every renewal's validity is cut at the
//! maximum too) and ends at its deadline. The watchdog releases a lease it
//! ended for either reason itself, a safety margin later, unless the handle
//! did: the holder has that long to stop, and a holder stuck for good must
//! not keep the lease from the node that takes over.

use std::collections::{BTreeMap, BTreeSet, HashMap, btree_map};
use std::hash::{BuildHasherDefault, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use leasehold_core::{
    BackendError, HolderId, LeaseBackend, LeaseKey, ReleaseOutcome, RenewOutcome, RenewRequest,
    Ttl, valid_until,
};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, debug_span, warn};

use crate::LeaseError;
use crate::bounds::Bounds;
use crate::changes::Changes;
use crate::loss::LossReason;
use crate::metrics::{self, NO_ROW, RENEW_ERROR, RENEW_LOST, RENEWED, Rows, Since};
use crate::queue::Queues;
use crate::shared::Shared;

/// The most renewals sent to the backend in one call.
pub(crate) const MAX_BATCH: usize = 1000;

/// The most renewal calls in flight at once; later calls wait for one to
/// finish and count their validity from their own send. Without a bound, a
/// burst of due renewals (a million leases acquired in one go) would queue
/// every call on the connection at once, and the last ones could outlast
/// the op timeout while they only waited their turn.
pub(crate) const MAX_IN_FLIGHT: usize = 16;

/// Renewal times are rounded down to a multiple of
/// `renew_interval / RENEW_WINDOW_DIVISOR` after the watchdog's start.
/// Renewing up to that much early costs a lease nothing it relies on (its
/// deadline counts from each renewal's send); in exchange, leases acquired
/// within one step of each other fall due in the same bucket.
pub(crate) const RENEW_WINDOW_DIVISOR: u32 = 16;

/// A reply channel for a release.
pub(crate) type ReleaseReply = oneshot::Sender<Result<ReleaseOutcome, LeaseError>>;

/// What handles and the manager tell the watchdog, and wake it for.
pub(crate) enum Command {
    /// Stop keeping a lease and release it on the server.
    Release {
        id: u64,
        reply: Option<ReleaseReply>,
    },
    /// Release a lease that may exist on the server with no handle, after an
    /// acquisition whose outcome is unknown was abandoned.
    ReleaseOrphan { key: LeaseKey, holder: HolderId },
    /// A graceful shutdown begins: end every lease, and every lease taken
    /// from now on, with [`LossReason::Shutdown`] (their tokens fire) and
    /// renew none of them any more, but leave each on the server until its
    /// handle lets go, so that the work stops before the lease is released.
    /// `reply` is sent once every handle has let go (the releases they
    /// asked for are then on their way).
    Drain { reply: oneshot::Sender<()> },
}

/// What the manager and handles leave for the watchdog to read when it
/// next wakes.
enum Note {
    /// Start keeping a freshly acquired lease; `sent_at` is when its
    /// acquisition was sent.
    Register {
        id: u64,
        shared: Arc<Shared>,
        key: LeaseKey,
        holder: HolderId,
        sent_at: Instant,
    },
    /// Stop keeping a lease: its handle released it.
    Forget { id: u64 },
}

/// How many notes may wait before a registration wakes the watchdog
/// anyway: the notes of a steady flow of short leases are read in batches
/// of about this many (a wake costs the task a turn), while the released
/// leases they keep alive stay few.
pub(crate) const NOTES_PER_WAKE: usize = 128;

/// The notes waiting for the watchdog, and when it reads them at the latest.
struct Notes {
    notes: Vec<Note>,
    /// A registration woke the watchdog for the number of notes, and it
    /// has not read them yet: no other wake is needed for that.
    woken_for_notes: bool,
    /// When the watchdog wakes at the latest (its timer); `None` when only
    /// a command or a wake brings it. Set under this lock as the watchdog
    /// goes to sleep with no note left, so a note left after that sees it.
    reads_by: Option<Instant>,
    /// Shut down: no lease is registered any more.
    closed: bool,
    /// Draining (a graceful shutdown): a handle's release wakes the
    /// watchdog, which waits for the last one.
    draining: bool,
}

/// New and released leases on their way to the watchdog (see the module
/// comment). Shared by the manager, the handles and the watchdog.
pub(crate) struct Registry {
    notes: Mutex<Notes>,
    wake: Notify,
    /// Where the watchdog's renewal grid starts, so that a registration
    /// knows the bucket its lease goes to.
    epoch: Instant,
}

impl Registry {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            notes: Mutex::new(Notes {
                woken_for_notes: false,
                notes: Vec::new(),
                reads_by: None,
                closed: false,
                draining: false,
            }),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Notes> {
        // Nothing panics while holding it; a poisoned lock still holds
        // whole notes.
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a freshly acquired lease to the watchdog, waking it only if
    /// the lease needs it before it wakes anyway.
    ///
    /// # Errors
    ///
    /// [`LeaseError::ManagerStopped`] after shutdown.
    pub(crate) fn register(
        &self,
        id: u64,
        shared: Arc<Shared>,
        key: LeaseKey,
        holder: HolderId,
        sent_at: Instant,
    ) -> Result<(), LeaseError> {
        let needed_at = first_due(&shared, sent_at, self.epoch);
        let wake = {
            let mut notes = self.lock();
            if notes.closed {
                return Err(LeaseError::ManagerStopped);
            }
            notes.notes.push(Note::Register {
                id,
                shared,
                key,
                holder,
                sent_at,
            });
            let wake = notes.reads_by.is_none_or(|at| needed_at < at);
            if wake {
                // Woken now: the leases registered before it reads the
                // notes need no other wake.
                notes.reads_by = Some(Instant::now());
            }
            let many = notes.notes.len() >= NOTES_PER_WAKE && !notes.woken_for_notes;
            if many {
                notes.woken_for_notes = true;
            }
            wake || many
        };
        if wake {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Tells the watchdog, without waking it, that a lease's handle released
    /// it: the watchdog drops the lease before it next renews anything.
    pub(crate) fn forget(&self, id: u64) {
        let mut notes = self.lock();
        if !notes.closed {
            notes.notes.push(Note::Forget { id });
            if notes.draining {
                drop(notes);
                self.wake.notify_one();
            }
        }
    }
}

/// The earliest the watchdog may have to act on a lease acquired at
/// `sent_at`, with its renewal grid starting at `epoch`: the bucket its
/// first renewal goes to, or its deadline if that comes first (or if no
/// renewal is allowed), as `Watchdog::schedule` will place it.
fn first_due(shared: &Shared, sent_at: Instant, epoch: Instant) -> Instant {
    let timing = shared.timing;
    let deadline = shared.valid_until() - timing.safety_margin();
    if timing.renewals_cap() == 0 {
        return deadline;
    }
    on_grid(
        epoch,
        first_renewal(shared, sent_at),
        timing.renew_interval_ns(),
    )
    .min(deadline)
}

/// `at`, rounded down to the renewal grid (starting at `epoch`) of a lease
/// renewed every `interval_ns`: never later than `at`, at most
/// `interval / 16` earlier.
fn on_grid(epoch: Instant, at: Instant, interval_ns: u64) -> Instant {
    let step = interval_ns / u64::from(RENEW_WINDOW_DIVISOR);
    if step == 0 || at <= epoch {
        return at;
    }
    let since = u64::try_from((at - epoch).as_nanos()).unwrap_or(u64::MAX);
    at - Duration::from_nanos(since % step)
}

/// When a lease acquired at `sent_at` is first renewed: a renew interval
/// later. A grant valid for less than its ttl would make it (a lease a
/// release handed over from a fair queue, which the server keeps only for
/// a while after the waiter's last call: `Grant::handed_over`) is renewed
/// no later than halfway from `sent_at` to its deadline, at once if that
/// has passed, which leaves the other half for retries before its token
/// would fire; the renewal extends it to the full ttl.
fn first_renewal(shared: &Shared, sent_at: Instant) -> Instant {
    let interval = sent_at + shared.timing.renew_interval();
    if shared.valid_until() < valid_until(sent_at, shared.ttl()) {
        let deadline = shared.valid_until() - shared.timing.safety_margin();
        let halfway = sent_at + deadline.saturating_duration_since(sent_at) / 2;
        interval.min(halfway)
    } else {
        interval
    }
}

/// Where a lease waits: its slot, and the slot's generation when it was
/// put there. Stale once the lease moved, ended or was released.
#[derive(Debug, Clone, Copy)]
struct Place {
    slot: u32,
    generation: u32,
}

/// The watchdog's own state per lease: what deciding on a renewal reads,
/// and the key and holder a renewal request names. Kept small, since a
/// manager may hold a million: the ttl, which a request and its reply also
/// need, is read from `shared`, which both read anyway (the lock-delay, the
/// new validity).
struct Entry {
    shared: Arc<Shared>,
    key: LeaseKey,
    holder: HolderId,
    /// When the token fires unless a renewal succeeds first.
    deadline: Instant,
    /// Whether the hold time was recorded (the lease ended or was released).
    ended: bool,
    /// Renewals still allowed by the cap; `u32::MAX` when there is none.
    /// Kept here rather than read from `Shared`, so that deciding whether
    /// to renew touches nothing but the entry.
    renewals_left: u32,
    /// Failed renewals in a row, for the retry delay.
    failures: u8,
    /// A renewal of this lease is in flight.
    in_flight: bool,
    /// The backend reported a change while the renewal was in flight:
    /// renew again as soon as it returns.
    again: bool,
}

impl Entry {
    fn ttl(&self) -> Ttl {
        self.shared.ttl()
    }

    /// Records the hold time and leaves the held gauge, once per lease.
    fn finish(&mut self, how: &'static str) {
        if !self.ended {
            self.ended = true;
            metrics::ended(&self.shared.series, how, self.shared.acquired_at.elapsed());
        }
    }

    fn capped(&self) -> bool {
        self.renewals_left == 0
    }

    /// Counts a successful renewal against the cap.
    fn count_renewal(&mut self) {
        if self.renewals_left != u32::MAX {
            self.renewals_left -= 1;
        }
    }
}

/// A lease with a maximum hold or a progress window, in the watchdog's side
/// table (see the module comment).
struct Bounded {
    /// The lease id, to forget the lease once the watchdog released it.
    id: u64,
    bounds: Arc<Bounds>,
    /// Renewals stopped at the maximum hold: the cap the entry reached is
    /// that one, not `max_renewals`.
    at_max: bool,
}

/// The entry table, in chunks of [`SLOTS_PER_CHUNK`] slots: it grows by a
/// chunk at a time (the first one as a vector does), so a table of n slots
/// keeps at most one chunk's room unused, where one vector doubling as it
/// grows keeps up to n (a 10,000-lease table, 16,384 slots), and is never
/// copied, where a vector's growth holds the old and the new table at once.
#[derive(Default)]
struct Slots {
    chunks: Vec<Vec<Slot>>,
    len: usize,
}

/// Slots per chunk of [`Slots`]: 72 KiB of them.
const SLOTS_PER_CHUNK: usize = 1024;

impl Slots {
    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, slot: Slot) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < SLOTS_PER_CHUNK => chunk.push(slot),
            _ => {
                // Every chunk but the first is allocated whole.
                let mut chunk = if self.chunks.is_empty() {
                    Vec::new()
                } else {
                    Vec::with_capacity(SLOTS_PER_CHUNK)
                };
                chunk.push(slot);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    fn get(&self, slot: usize) -> Option<&Slot> {
        self.chunks
            .get(slot / SLOTS_PER_CHUNK)?
            .get(slot % SLOTS_PER_CHUNK)
    }

    fn get_mut(&mut self, slot: usize) -> Option<&mut Slot> {
        self.chunks
            .get_mut(slot / SLOTS_PER_CHUNK)?
            .get_mut(slot % SLOTS_PER_CHUNK)
    }

    /// Every slot, in order, taken out of the table.
    fn drain(&mut self) -> std::iter::Flatten<std::vec::IntoIter<Vec<Slot>>> {
        self.len = 0;
        std::mem::take(&mut self.chunks).into_iter().flatten()
    }
}

impl std::ops::Index<usize> for Slots {
    type Output = Slot;

    fn index(&self, slot: usize) -> &Slot {
        &self.chunks[slot / SLOTS_PER_CHUNK][slot % SLOTS_PER_CHUNK]
    }
}

impl std::ops::IndexMut<usize> for Slots {
    fn index_mut(&mut self, slot: usize) -> &mut Slot {
        &mut self.chunks[slot / SLOTS_PER_CHUNK][slot % SLOTS_PER_CHUNK]
    }
}

/// A slot of the entry table. The generation survives the entry, so a
/// place of a released lease never matches the lease that reuses the slot.
struct Slot {
    generation: u32,
    /// The lease's row in [`Rows`] (its name and kind), in room the
    /// generation leaves; [`NO_ROW`] while the slot is empty.
    row: u32,
    entry: Option<Entry>,
}

/// Lease ids come from a counter: one multiplication spreads them well
/// enough, where SipHash would cost more than the lookup.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// When a lease's next renewal is wanted.
#[derive(Debug, Clone, Copy)]
enum When {
    /// A regular renewal: moved back onto the grid, to share its batch.
    OnGrid(Instant),
    /// A retry after a failure: its delay is kept whole.
    Exactly(Instant),
}

/// A renewal call in flight: its leases, in request order.
struct Batch {
    members: Vec<Place>,
    /// Where its deadline timer is set: the earliest deadline among the
    /// members still waiting on it.
    deadline: Instant,
}

enum Done {
    Renewals {
        batch: u64,
        sent_at: Instant,
        outcomes: Vec<Result<RenewOutcome, BackendError>>,
    },
    Released,
}

type Work = Pin<Box<dyn Future<Output = Done> + Send>>;

pub(crate) struct Watchdog<B> {
    backend: B,
    /// For releases to hand a lease to a local waiter (see `handoff.rs`).
    queues: Arc<Queues>,
    slots: Slots,
    /// Slots without an entry, for reuse.
    free: Vec<u32>,
    /// The slot of each lease id.
    ids: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
    /// Leases waiting for their next renewal (or their deadline), by when.
    buckets: BTreeMap<Instant, Vec<Place>>,
    /// Renewal calls in flight, and their deadline timers.
    batches: HashMap<u64, Batch, BuildHasherDefault<IdHasher>>,
    batch_deadlines: BTreeSet<(Instant, u64)>,
    next_batch: u64,
    in_flight: Arc<Semaphore>,
    /// The one timer: set for the earliest bucket or batch deadline.
    timer: Pin<Box<Sleep>>,
    timer_at: Option<Instant>,
    work: FuturesUnordered<Work>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// New and released leases, read before every event.
    registry: Arc<Registry>,
    shutdown: CancellationToken,
    /// Where the renewal grid starts.
    epoch: Instant,
    /// Changes the backend reports, and the leases each one names.
    changes: Changes,
    /// An empty vector to swap for the registry's notes at the next read.
    spare_notes: Vec<Note>,
    /// The leases with bounds, by slot: none for most managers.
    bounded: HashMap<u32, Bounded, BuildHasherDefault<IdHasher>>,
    /// Renewal counts and the age of the oldest lease, by name and kind.
    rows: Rows,
    /// Draining for a graceful shutdown (see [`Command::Drain`]), and the
    /// reply owed once every handle has let go.
    draining: bool,
    drained: Option<oneshot::Sender<()>>,
}

/// A watchdog that ends for any reason (shutdown, the last handle gone, its
/// runtime shut down) takes no more registrations: a lease nobody would
/// renew, or whose token nobody would fire, is refused with
/// `ManagerStopped` rather than handed out.
impl<B> Drop for Watchdog<B> {
    fn drop(&mut self) {
        self.registry.lock().closed = true;
    }
}

/// Renewals gathered for one call.
#[derive(Default)]
struct Outgoing {
    members: Vec<Place>,
    requests: Vec<RenewRequest>,
    deadline: Option<Instant>,
}

impl<B: LeaseBackend> Watchdog<B> {
    pub(crate) fn new(
        backend: B,
        queues: Arc<Queues>,
        commands: mpsc::UnboundedReceiver<Command>,
        registry: Arc<Registry>,
        shutdown: CancellationToken,
    ) -> Self {
        let epoch = registry.epoch;
        Self {
            backend,
            queues,
            slots: Slots::default(),
            free: Vec::new(),
            ids: HashMap::default(),
            buckets: BTreeMap::new(),
            batches: HashMap::default(),
            batch_deadlines: BTreeSet::new(),
            next_batch: 0,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            timer: Box::pin(tokio::time::sleep_until(epoch)),
            timer_at: None,
            work: FuturesUnordered::new(),
            commands,
            registry,
            shutdown,
            epoch,
            changes: Changes::none(),
            spare_notes: Vec::new(),
            bounded: HashMap::default(),
            rows: Rows::default(),
            draining: false,
            drained: None,
        }
    }

    /// `at`, rounded down to this watchdog's renewal grid (see [`on_grid`]).
    fn on_grid(&self, at: Instant, interval_ns: u64) -> Instant {
        on_grid(self.epoch, at, interval_ns)
    }

    /// Runs until shut down, or until no handle or manager is left.
    ///
    /// Outside tokio's cooperative budget: with the budget (128 resource
    /// polls per turn), a turn that drains many finished calls or commands
    /// would be cut short and the rest left for later turns. The loop still
    /// returns to the runtime whenever nothing is ready.
    pub(crate) async fn run(self) {
        tokio::task::coop::unconstrained(self.run_loop()).await;
    }

    async fn run_loop(mut self) {
        match crate::capability::watch_changes(&self.backend).await {
            Ok(watch) => self.changes = Changes::new(watch),
            Err(error) => {
                warn!(%error, "the backend's changes cannot be watched; leases learn of a loss at their next renewal");
            }
        }
        let mut stopping = false;
        let mut commands_open = true;
        loop {
            if !stopping {
                self.read_notes_and_sleep();
            }
            self.arm_timer();
            tokio::select! {
                biased;
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    // Take what was sent before the shutdown (a lease acquired
                    // just before it must be released too); later sends fail.
                    self.registry.lock().closed = true;
                    self.read_notes();
                    self.commands.close();
                    while let Ok(command) = self.commands.try_recv() {
                        self.on_command(command);
                    }
                    self.stop_all();
                }
                command = self.commands.recv(), if commands_open && !stopping => match command {
                    Some(command) => {
                        // The lease a command names may still be in a note.
                        self.read_notes();
                        self.on_command(command);
                    }
                    None => commands_open = false,
                },
                () = self.registry.wake.notified(), if commands_open && !stopping => {
                    self.read_notes();
                }
                () = &mut self.timer, if self.timer_at.is_some() => {
                    self.timer_at = None;
                    // A lease released meanwhile is dropped before it is renewed.
                    self.read_notes();
                    self.on_timer(Instant::now());
                }
                Some(done) = self.work.next(), if !self.work.is_empty() => self.on_done(done),
                change = self.changes.next(), if self.changes.is_open() && !stopping => {
                    if let Some(change) = change {
                        self.read_notes();
                        let ids = self.changes.affected(change);
                        self.renew_now(&ids);
                    }
                }
                else => break,
            }
            self.catch_up();
            if self.ids.is_empty()
                && let Some(reply) = self.drained.take()
            {
                let _ = reply.send(());
            }
            if stopping && self.work.is_empty() {
                break;
            }
        }
    }

    /// Reads the registry's notes until none is left, then tells it when
    /// this task wakes at the latest: under the same lock, so that a note
    /// left after this read sees the new time and wakes the task if it
    /// cannot wait until then.
    fn read_notes_and_sleep(&mut self) {
        loop {
            let mut notes = std::mem::take(&mut self.spare_notes);
            {
                let mut registry = self.registry.lock();
                if registry.notes.is_empty() {
                    registry.reads_by = self.next_due();
                    drop(registry);
                    self.spare_notes = notes;
                    return;
                }
                std::mem::swap(&mut registry.notes, &mut notes);
                registry.woken_for_notes = false;
            }
            self.on_notes(notes);
        }
    }

    /// Reads the registry's notes.
    fn read_notes(&mut self) {
        let mut notes = std::mem::take(&mut self.spare_notes);
        {
            let mut registry = self.registry.lock();
            std::mem::swap(&mut registry.notes, &mut notes);
            registry.woken_for_notes = false;
        }
        self.on_notes(notes);
    }

    /// Takes in `notes`, and keeps the emptied vector for the next read
    /// (the registry and the watchdog swap two vectors, rather than one
    /// growing a new one for every batch).
    fn on_notes(&mut self, mut notes: Vec<Note>) {
        // A lease registered and forgotten within one batch was released
        // by its handle before the watchdog saw it: nothing to keep, renew
        // or watch, so neither note is acted on.
        let mut forgotten: Vec<u64> = notes
            .iter()
            .filter_map(|note| match note {
                Note::Forget { id } => Some(*id),
                Note::Register { .. } => None,
            })
            .collect();
        forgotten.sort_unstable();
        for note in notes.drain(..) {
            match note {
                Note::Register { id, .. } if forgotten.binary_search(&id).is_ok() => {}
                Note::Register {
                    id,
                    shared,
                    key,
                    holder,
                    sent_at,
                } => self.on_register(id, shared, key, holder, sent_at),
                Note::Forget { id } => {
                    // The handle recorded the hold time when it took the
                    // release. A lease skipped above is not found.
                    if let Some(entry) = self.take(id) {
                        self.changes.remove(&entry.key, id);
                    }
                }
            }
        }
        self.spare_notes = notes;
    }

    /// The earliest instant something is due: a bucket or a batch deadline.
    fn next_due(&self) -> Option<Instant> {
        let bucket = self.buckets.first_key_value().map(|(at, _)| *at);
        let batch = self.batch_deadlines.first().map(|(at, _)| *at);
        match (bucket, batch) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Points the one timer at the next due instant, if it moved.
    fn arm_timer(&mut self) {
        let next = self.next_due();
        if next != self.timer_at {
            if let Some(at) = next {
                self.timer.as_mut().reset(at);
            }
            self.timer_at = next;
        }
    }

    /// Gives due timers and finished backend calls a turn after every
    /// event, without waiting. With many leases a command arrives or a call
    /// finishes all the time, so the biased `select!` alone could always
    /// find an earlier branch ready: a flood of acquisitions would hold back
    /// deadlines, and a steady stream of due renewals would keep the
    /// renewals' own replies from ever being read. (A noop waker is enough
    /// here: before the task sleeps, the `select!` polls every branch with
    /// the real one.)
    fn catch_up(&mut self) {
        if let Some(due) = self.next_due() {
            let now = Instant::now();
            if due <= now {
                self.read_notes();
                self.on_timer(now);
            }
        }
        while let Some(Some(done)) = self.work.next().now_or_never() {
            self.on_done(done);
        }
    }

    /// Starts keeping a freshly acquired lease.
    fn on_register(
        &mut self,
        id: u64,
        shared: Arc<Shared>,
        key: LeaseKey,
        holder: HolderId,
        sent_at: Instant,
    ) {
        let timing = shared.timing;
        // The grant's validity, as recorded (no renewal has run yet).
        let deadline = shared.valid_until() - timing.safety_margin();
        let renew_at = first_renewal(&shared, sent_at);
        let entry = Entry {
            shared,
            key,
            holder,
            deadline,
            ended: false,
            renewals_left: timing.renewals_cap(),
            failures: 0,
            in_flight: false,
            again: false,
        };
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let Ok(slot) = u32::try_from(self.slots.len()) else {
                    // Four billion leases in one manager: refuse
                    // to keep it rather than renew the wrong one.
                    let mut entry = entry;
                    if entry.shared.end(LossReason::Deadline) {
                        entry.finish(LossReason::Deadline.as_str());
                        metrics::lost(&entry.shared.series, LossReason::Deadline.as_str());
                    }
                    self.release(&entry.key, Some(&entry.shared), entry.holder, None);
                    return;
                };
                self.slots.push(Slot {
                    generation: 0,
                    row: NO_ROW,
                    entry: None,
                });
                slot
            }
        };
        self.changes.insert(&entry.key, id);
        let row = self.rows.row_of(&entry.shared.series);
        self.rows.join(row, Since::of(&entry.shared));
        self.slots[slot as usize].row = row;
        if let Some(bounds) = entry.shared.bounds.clone() {
            self.bounded.insert(
                slot,
                Bounded {
                    id,
                    bounds,
                    at_max: false,
                },
            );
        }
        self.slots[slot as usize].entry = Some(entry);
        self.ids.insert(id, slot);
        if self.draining {
            // Granted while draining (a waiter already asking): ended at
            // once, and released when its handle lets go.
            self.shut(slot);
            return;
        }
        if let Some((when, place)) = self.schedule(slot, renew_at, Instant::now()) {
            self.buckets.entry(when).or_default().push(place);
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Release { id, reply } => match self.take(id) {
                Some(mut entry) => {
                    self.changes.remove(&entry.key, id);
                    entry.finish(if reply.is_some() {
                        "released"
                    } else {
                        "dropped"
                    });
                    self.release(&entry.key, Some(&entry.shared), entry.holder, reply);
                }
                None => {
                    // Released at shutdown already.
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(ReleaseOutcome::NotHeld));
                    }
                }
            },
            Command::ReleaseOrphan { key, holder } => self.release(&key, None, holder, None),
            Command::Drain { reply } => {
                self.draining = true;
                self.registry.lock().draining = true;
                for slot in 0..self.slots.len() {
                    // Slots number fewer than u32::MAX (see `on_register`).
                    self.shut(u32::try_from(slot).unwrap_or(u32::MAX));
                }
                self.drained = Some(reply);
            }
        }
    }

    /// Ends the lease in `slot` for a shutdown, as [`stop_all`](Self::stop_all)
    /// does but without releasing it: its token fires, it is renewed no more
    /// (it loses every place), and its handle's release, when it comes, is
    /// sent to the server. No warning: a shutdown is no loss to report.
    fn shut(&mut self, slot: u32) {
        let Some(cell) = self.slots.get_mut(slot as usize) else {
            return;
        };
        cell.generation = cell.generation.wrapping_add(1);
        let row = cell.row;
        let Some(entry) = cell.entry.as_mut() else {
            return;
        };
        if !entry.ended && entry.shared.end(LossReason::Shutdown) {
            entry.finish(LossReason::Shutdown.as_str());
            metrics::lost(&entry.shared.series, LossReason::Shutdown.as_str());
            self.rows.leave(row, Since::of(&entry.shared));
        }
    }

    /// Removes a lease's entry; every place it had becomes stale.
    fn take(&mut self, id: u64) -> Option<Entry> {
        let slot = self.ids.remove(&id)?;
        if !self.bounded.is_empty() {
            self.bounded.remove(&slot);
        }
        let cell = self.slots.get_mut(slot as usize)?;
        cell.generation = cell.generation.wrapping_add(1);
        let row = std::mem::replace(&mut cell.row, NO_ROW);
        let entry = cell.entry.take();
        self.free.push(slot);
        // Not ended by the watchdog: held until now.
        if let Some(entry) = entry.as_ref().filter(|e| !e.ended) {
            self.rows.leave(row, Since::of(&entry.shared));
        }
        entry
    }

    /// The entry in `slot`, whatever its places.
    fn entry_mut(&mut self, slot: u32) -> Option<&mut Entry> {
        self.slots.get_mut(slot as usize)?.entry.as_mut()
    }

    /// The entry at a place, unless the place is stale.
    fn at(&mut self, place: Place) -> Option<&mut Entry> {
        let cell = self.slots.get_mut(place.slot as usize)?;
        if cell.generation != place.generation {
            return None;
        }
        cell.entry.as_mut()
    }

    /// Gives the lease in `slot` a new place (voiding the old one) and
    /// returns it.
    fn new_place(&mut self, slot: u32) -> Place {
        let cell = &mut self.slots[slot as usize];
        cell.generation = cell.generation.wrapping_add(1);
        Place {
            slot,
            generation: cell.generation,
        }
    }

    /// The bucket for the lease in `slot` and its new place there: its
    /// next renewal at `renew_at` (or its deadline, when that comes first
    /// or the cap is reached). Ends the lease at once, and returns `None`,
    /// if the deadline passed. The caller puts the place in the bucket.
    fn schedule(&mut self, slot: u32, renew_at: Instant, now: Instant) -> Option<(Instant, Place)> {
        self.schedule_at(slot, When::OnGrid(renew_at), now)
    }

    /// As [`schedule`](Self::schedule), for a retry at `retry_at` exactly.
    /// Rounded down onto the grid, a retry delay shorter than the grid's
    /// step (every delay, with the default options) would shrink to nothing,
    /// and a backend that fails at once would be asked again and again
    /// without a pause.
    fn schedule_retry(
        &mut self,
        slot: u32,
        retry_at: Instant,
        now: Instant,
    ) -> Option<(Instant, Place)> {
        self.schedule_at(slot, When::Exactly(retry_at), now)
    }

    fn schedule_at(&mut self, slot: u32, at: When, now: Instant) -> Option<(Instant, Place)> {
        let entry = self.slots.get(slot as usize)?.entry.as_ref()?;
        let deadline = entry.deadline;
        if now >= deadline {
            self.end(slot, LossReason::Deadline);
            return None;
        }
        let when = if entry.capped() {
            deadline
        } else {
            match at {
                When::OnGrid(renew_at) => {
                    let interval = entry.shared.timing.renew_interval_ns();
                    self.on_grid(renew_at, interval).min(deadline)
                }
                When::Exactly(retry_at) => retry_at.min(deadline),
            }
        };
        Some((when, self.new_place(slot)))
    }

    /// Adds places to the bucket at `at`; a new bucket takes the vector as is.
    fn add_to_bucket(&mut self, at: Instant, places: Vec<Place>) {
        match self.buckets.entry(at) {
            btree_map::Entry::Vacant(bucket) => {
                bucket.insert(places);
            }
            btree_map::Entry::Occupied(bucket) => bucket.into_mut().extend(places),
        }
    }

    /// Handles every bucket and batch deadline due by `now`, then sends the
    /// due renewals in batches.
    fn on_timer(&mut self, now: Instant) {
        let mut out = Outgoing::default();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > now {
                break;
            }
            for place in entry.remove() {
                let Some(entry) = self.at(place) else {
                    continue; // moved, ended or released since
                };
                if entry.ended {
                    // An ended lease has a place only when the watchdog
                    // is to release it itself.
                    self.release_ended(place.slot);
                    continue;
                }
                // Checked before renewing: a watchdog that was not
                // scheduled for a while must not renew a lease whose holder
                // should already have been told.
                if entry.capped() {
                    self.end_at_cap(place.slot, now);
                } else if now >= entry.deadline {
                    self.end(place.slot, LossReason::Deadline);
                } else if !self.bounded.is_empty() && self.on_bounds(place.slot, now) {
                    // Stalled, or at its maximum hold: not renewed.
                } else {
                    self.stage(place.slot, &mut out);
                }
            }
        }
        if !out.members.is_empty() {
            self.send_renewals(out);
        }
        while let Some(&(at, batch)) = self.batch_deadlines.first() {
            if at > now {
                break;
            }
            self.batch_deadlines.pop_first();
            self.on_batch_deadline(batch, now);
        }
    }

    /// A batch's earliest deadline came while its call is still in flight:
    /// ends the leases whose deadline came, and sets the timer for the next.
    fn on_batch_deadline(&mut self, id: u64, now: Instant) {
        let Some(batch) = self.batches.remove(&id) else {
            return;
        };
        let mut next: Option<Instant> = None;
        for &place in &batch.members {
            let Some(entry) = self.at(place) else {
                continue;
            };
            if entry.ended {
                continue;
            }
            if now >= entry.deadline {
                self.end(place.slot, LossReason::Deadline);
            } else {
                let deadline = entry.deadline;
                next = Some(next.map_or(deadline, |d| d.min(deadline)));
            }
        }
        if let Some(deadline) = next {
            self.batch_deadlines.insert((deadline, id));
            self.batches.insert(
                id,
                Batch {
                    members: batch.members,
                    deadline,
                },
            );
        } else {
            // Nothing left to wait for; the reply, when it comes, is dropped.
            self.batches.insert(
                id,
                Batch {
                    members: Vec::new(),
                    deadline: now,
                },
            );
        }
    }

    /// Renews the leases `ids` now rather than at their next renewal, for
    /// a change the backend reported. A lease whose renewal is in flight is
    /// renewed once more right after it returns (the change may have come
    /// after the server ran it); a lease past its cap, ended or released is
    /// left alone. Taking a lease out of its bucket is giving it a new place:
    /// the old one goes stale.
    fn renew_now(&mut self, ids: &[u64]) {
        let now = Instant::now();
        let mut out = Outgoing::default();
        for id in ids {
            let Some(&slot) = self.ids.get(id) else {
                continue;
            };
            let Some(entry) = self.entry_mut(slot) else {
                continue;
            };
            if entry.ended || entry.capped() || now >= entry.deadline {
                continue;
            }
            if entry.in_flight {
                entry.again = true;
                continue;
            }
            self.stage(slot, &mut out);
        }
        if !out.members.is_empty() {
            self.send_renewals(out);
        }
    }

    /// Puts the lease in `slot` into the outgoing batch (sending the batch
    /// once it is full): marked in flight, with a new place in the batch
    /// and the batch's deadline brought forward to the lease's.
    fn stage(&mut self, slot: u32, out: &mut Outgoing) {
        let Some(entry) = self.entry_mut(slot) else {
            return;
        };
        let deadline = entry.deadline;
        entry.in_flight = true;
        out.requests.push(
            RenewRequest::new(entry.key.clone(), entry.holder, entry.ttl())
                // Read from the shared state rather than kept in the entry,
                // which has no room left within its size bound.
                .with_lock_delay(entry.shared.timing.lock_delay),
        );
        let place = self.new_place(slot);
        out.members.push(place);
        out.deadline = Some(out.deadline.map_or(deadline, |d| d.min(deadline)));
        if out.members.len() == MAX_BATCH {
            self.send_renewals(std::mem::take(out));
        }
    }

    fn send_renewals(&mut self, out: Outgoing) {
        let Outgoing {
            members,
            requests,
            deadline,
        } = out;
        let Some(deadline) = deadline else {
            return;
        };
        let id = self.next_batch;
        self.next_batch = self.next_batch.wrapping_add(1);
        self.batches.insert(id, Batch { members, deadline });
        self.batch_deadlines.insert((deadline, id));
        let backend = self.backend.clone();
        let in_flight = Arc::clone(&self.in_flight);
        let span = debug_span!("renew_batch", size = requests.len());
        self.work.push(Box::pin(
            async move {
                // The semaphore is never closed; were it, the call would
                // simply go out unbounded.
                let _permit = in_flight.acquire().await;
                // After the wait for a permit: the validity counts from here.
                let sent_at = Instant::now();
                let outcomes = backend.renew_many(&requests).await;
                Done::Renewals {
                    batch: id,
                    sent_at,
                    outcomes,
                }
            }
            .instrument(span),
        ));
    }

    fn on_done(&mut self, done: Done) {
        let Done::Renewals {
            batch: id,
            sent_at,
            outcomes,
        } = done
        else {
            return;
        };
        let Some(batch) = self.batches.remove(&id) else {
            return;
        };
        self.batch_deadlines.remove(&(batch.deadline, id));
        let now = Instant::now();
        metrics::renew_batch(now.saturating_duration_since(sent_at));
        // Leases renewed together go back into one bucket: gathered here
        // and added to it at once, not looked up in the map one by one.
        let mut staged: Option<(Instant, Vec<Place>)> = None;
        let mut outcomes = outcomes.into_iter();
        for place in batch.members {
            let outcome = outcomes.next();
            let hold_until = if self.bounded.is_empty() {
                None
            } else {
                self.bounded
                    .get(&place.slot)
                    .and_then(|b| b.bounds.hold_until)
            };
            // Beside the generation that `at` reads: the same cache line.
            let row = self
                .slots
                .get(place.slot as usize)
                .map_or(NO_ROW, |c| c.row);
            let Some(entry) = self.at(place) else {
                continue; // released or ended while the renewal was in flight
            };
            let since = Since::of(&entry.shared);
            // A backend that returned too few outcomes left the rest unknown.
            let outcome = outcome.unwrap_or_else(|| {
                Err(BackendError::UnexpectedReply {
                    op: "renew",
                    key: entry.key.to_string(),
                    detail: "the backend returned no outcome for this renewal".to_owned(),
                })
            });
            entry.in_flight = false;
            if entry.ended {
                continue; // its deadline came first: a late success changes nothing
            }
            let again = std::mem::take(&mut entry.again);
            if now >= entry.deadline {
                // The reply came after the deadline, before its timer fired:
                // the holder must be told, whatever the reply says.
                self.end(place.slot, LossReason::Deadline);
                continue;
            }
            match outcome {
                Ok(RenewOutcome::Renewed) => {
                    // Never valid past the maximum hold, whenever the
                    // renewal was sent.
                    let mut valid = valid_until(sent_at, entry.ttl());
                    if let Some(until) = hold_until {
                        valid = valid.min(until);
                    }
                    entry.deadline = valid - entry.shared.timing.safety_margin();
                    entry.shared.renewed(valid);
                    entry.count_renewal();
                    entry.failures = 0;
                    // A change reported while this renewal was in flight
                    // may have come after the server ran it: check again now.
                    let renew_at = if again {
                        now
                    } else {
                        sent_at + entry.shared.timing.renew_interval()
                    };
                    debug!(key = %entry.key, name = %entry.shared.name(), "lease renewed");
                    self.rows.count(row, RENEWED, since);
                    if let Some((when, place)) = self.schedule(place.slot, renew_at, now) {
                        match &mut staged {
                            Some((at, places)) if *at == when => places.push(place),
                            _ => {
                                if let Some((at, places)) = staged.take() {
                                    self.add_to_bucket(at, places);
                                }
                                let mut places = Vec::with_capacity(MAX_BATCH);
                                places.push(place);
                                staged = Some((when, places));
                            }
                        }
                    }
                }
                Ok(RenewOutcome::Lost) => {
                    self.rows.count(row, RENEW_LOST, since);
                    self.end(place.slot, LossReason::Lost);
                }
                Err(error) => {
                    debug!(key = %entry.key, name = %entry.shared.name(), %error, "renewal failed; retrying");
                    let retry_at = now + entry.shared.timing.retry_delay(entry.failures);
                    entry.failures = entry.failures.saturating_add(1);
                    self.rows.count(row, RENEW_ERROR, since);
                    if let Some((when, place)) = self.schedule_retry(place.slot, retry_at, now) {
                        self.buckets.entry(when).or_default().push(place);
                    }
                }
            }
        }
        if let Some((at, places)) = staged {
            self.add_to_bucket(at, places);
        }
        self.rows.flush(now);
    }

    /// Cancels the holder's token; the entry stays until its handle releases
    /// it, but loses every place it had.
    fn end(&mut self, slot: u32, reason: LossReason) {
        let Some(cell) = self.slots.get_mut(slot as usize) else {
            return;
        };
        cell.generation = cell.generation.wrapping_add(1);
        let row = cell.row;
        let Some(entry) = cell.entry.as_mut() else {
            return;
        };
        // A lease whose handle is releasing it (or that ended before) has
        // no loss to report, and its hold time is recorded elsewhere.
        if entry.shared.end(reason) {
            let held = !entry.ended;
            entry.finish(reason.as_str());
            metrics::lost(&entry.shared.series, reason.as_str());
            if held {
                self.rows.leave(row, Since::of(&entry.shared));
            }
            let left = entry
                .shared
                .valid_until()
                .saturating_duration_since(Instant::now());
            // Inside the lease's span (when a subscriber keeps one), where
            // its work's own events are.
            warn!(
                parent: &entry.shared.span(),
                key = %entry.key,
                name = %entry.shared.name(),
                reason = reason.as_str(),
                validity_left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                "lease ended: {reason}",
            );
        }
    }

    /// A lease's renewal time came with its renewals used up: by the cap
    /// on renewals, or by its maximum hold.
    fn end_at_cap(&mut self, slot: u32, now: Instant) {
        if self.bounded.get(&slot).is_some_and(|b| b.at_max) {
            self.end_bounded(slot, LossReason::MaxHold, now);
        } else {
            self.end(slot, LossReason::RenewalLimit);
        }
    }

    /// At a renewal time of a lease in the side table, applies its bounds:
    /// a holder that reported no progress within its window loses the
    /// lease now; a lease that a renewal now would keep valid past its
    /// maximum hold is renewed no more and waits for its deadline. `true`
    /// when the lease is not to be renewed.
    fn on_bounds(&mut self, slot: u32, now: Instant) -> bool {
        let Some(bounded) = self.bounded.get_mut(&slot) else {
            return false;
        };
        if bounded.bounds.stalled(now) {
            self.end_bounded(slot, LossReason::Stalled, now);
            return true;
        }
        let Some(hold_until) = bounded.bounds.hold_until else {
            return false;
        };
        let Some(entry) = self
            .slots
            .get_mut(slot as usize)
            .and_then(|c| c.entry.as_mut())
        else {
            return false;
        };
        // Stopping here, rather than renewing for what is left, keeps every
        // renewal a full ttl (no request below `Ttl::MIN` near the end):
        // the lease ends within one renew interval before its maximum.
        if valid_until(now, entry.ttl()) <= hold_until {
            return false;
        }
        bounded.at_max = true;
        entry.renewals_left = 0;
        if let Some((when, place)) = self.schedule(slot, now, now) {
            self.buckets.entry(when).or_default().push(place);
        }
        true
    }

    /// Ends a lease in the side table with `reason`, and gives it a place
    /// a safety margin later, where the watchdog releases it unless its
    /// handle did first (see [`release_ended`](Self::release_ended)).
    fn end_bounded(&mut self, slot: u32, reason: LossReason, now: Instant) {
        self.end(slot, reason);
        let Some(entry) = self.entry_mut(slot) else {
            return;
        };
        // Not ended by this call: its handle took the release.
        if !entry.ended {
            return;
        }
        let at = now + entry.shared.timing.safety_margin();
        let place = self.new_place(slot);
        self.buckets.entry(at).or_default().push(place);
    }

    /// Releases a lease the watchdog ended as stalled or at its maximum,
    /// its holder having had the safety margin to stop: a handle that is
    /// never let go (a job stuck for good) must not keep the lease from
    /// the node that takes over. The handle's own release then finds
    /// nothing left to do.
    fn release_ended(&mut self, slot: u32) {
        let Some(id) = self.bounded.get(&slot).map(|b| b.id) else {
            return;
        };
        if let Some(entry) = self.take(id) {
            self.changes.remove(&entry.key, id);
            self.release(&entry.key, Some(&entry.shared), entry.holder, None);
        }
    }

    fn stop_all(&mut self) {
        self.bounded.clear();
        self.buckets.clear();
        self.batch_deadlines.clear();
        self.batches.clear();
        self.ids.clear();
        self.free.clear();
        for cell in self.slots.drain() {
            let Some(mut entry) = cell.entry else {
                continue;
            };
            if entry.shared.end(LossReason::Shutdown) {
                entry.finish(LossReason::Shutdown.as_str());
                metrics::lost(&entry.shared.series, LossReason::Shutdown.as_str());
            }
            self.release(&entry.key, Some(&entry.shared), entry.holder, None);
        }
        self.rows.clear();
    }

    /// Releases `key` for `holder` in the background: the lease `shared`
    /// (none for an orphan, released as an exclusive lease).
    fn release(
        &mut self,
        key: &LeaseKey,
        shared: Option<&Shared>,
        holder: HolderId,
        reply: Option<ReleaseReply>,
    ) {
        let backend = self.backend.clone();
        let queues = Arc::clone(&self.queues);
        let name = shared.map(|s| &**s.name());
        let fair = shared.is_some_and(Shared::fair);
        let span = debug_span!("release", key = %key, name);
        let key = key.clone();
        self.work.push(Box::pin(
            async move {
                let outcome = crate::handoff::release(&backend, &queues, &key, &holder, fair).await;
                if let Err(error) = &outcome {
                    debug!(%key, %error, "release failed; the lease expires by itself");
                }
                if let Some(reply) = reply {
                    let _ = reply.send(outcome.map_err(LeaseError::from));
                }
                Done::Released
            }
            .instrument(span),
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// The per-lease structures docs/performance.md accounts for: the
    /// watchdog's slot, the state shared with the handle, and the handle.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn per_lease_structures_stay_small() {
        let slot = std::mem::size_of::<Slot>();
        let shared = std::mem::size_of::<Shared>();
        let lease = std::mem::size_of::<crate::Lease>();
        assert!(slot <= 72, "Slot is {slot} bytes");
        assert!(shared <= 128, "Shared is {shared} bytes");
        assert!(lease <= 40, "Lease is {lease} bytes");
        // A lease's place in a bucket or a batch.
        assert_eq!(std::mem::size_of::<Place>(), 8);
    }

    /// A registration whose lease falls due after the watchdog's next
    /// wake does not wake it, until [`NOTES_PER_WAKE`] notes wait: then one
    /// wake (and only one) is rung for them; the watchdog's read of the
    /// notes lets the count start over.
    #[tokio::test(start_paused = true)]
    async fn notes_wake_the_watchdog_once_per_batch() -> Result<(), Box<dyn std::error::Error>> {
        use leasehold_core::{AcquireOutcome, AcquireRequest, MemoryBackend, Ttl};

        let backend = MemoryBackend::new();
        let ttl = Ttl::parse("30s")?;
        let registry = Registry::new();
        // Asleep until a second from now, long before any of these
        // leases (renewed every 10 s) is due.
        registry.lock().reads_by = Some(Instant::now() + Duration::from_secs(1));
        let series = Arc::new(crate::metrics::Series::new(
            "batch".into(),
            crate::metrics::Kind::Exclusive,
        ));
        let timing = crate::timing::Timing::new(ttl.get() / 3, ttl.get() / 10, None);
        let rung = || registry.wake.notified().now_or_never().is_some();
        let register = |id: u64| -> Result<(), Box<dyn std::error::Error>> {
            let key = LeaseKey::new(format!("k{id}"))?;
            let request = AcquireRequest::new(key.clone(), HolderId::generate()?, ttl);
            let AcquireOutcome::Acquired(grant) = backend
                .try_acquire(&request)
                .now_or_never()
                .ok_or("pending")??
            else {
                return Err("not acquired".into());
            };
            let shared = Arc::new(Shared::new(&grant, Arc::clone(&series), timing));
            registry.register(id, shared, key, grant.holder, grant.sent_at)?;
            Ok(())
        };
        let batch = u64::try_from(NOTES_PER_WAKE)?;
        // Two notes each: a forgotten lease's note counts too.
        for id in 0..batch / 2 - 1 {
            register(id)?;
            registry.forget(id);
        }
        register(batch)?;
        assert!(!rung(), "rung before the bound");
        register(batch + 1)?;
        assert!(rung(), "not rung at the bound");
        register(batch + 2)?;
        assert!(!rung(), "rung twice for one batch");
        // The watchdog read them: a new batch starts.
        let mut notes = registry.lock();
        notes.notes.clear();
        notes.woken_for_notes = false;
        drop(notes);
        register(batch + 3)?;
        assert!(!rung(), "rung for one note");
        Ok(())
    }

    /// The first renewal of a lease a fair queue handed over (valid for
    /// less than its ttl) comes halfway from its sending to its deadline,
    /// at once if that has passed; any other lease's a renew interval
    /// after its sending. The watchdog must act first on the earlier of
    /// that renewal's grid bucket and the deadline, on the deadline alone
    /// when no renewal is allowed.
    #[test]
    fn first_renewal_and_first_due_follow_the_grant() -> Result<(), Box<dyn std::error::Error>> {
        use leasehold_core::{FencingToken, Grant, Ttl};

        let ttl = Ttl::parse("30s")?;
        let (interval, margin) = (Duration::from_secs(10), Duration::from_secs(3));
        let drift = leasehold_core::clock_drift(ttl.get()); // 302 ms
        let series = Arc::new(crate::metrics::Series::new(
            "first".into(),
            crate::metrics::Kind::Exclusive,
        ));
        let t0 = Instant::now();
        let shared = |grant: &Grant, cap: Option<u32>| {
            let timing = crate::timing::Timing::new(interval, margin, cap);
            Shared::new(grant, Arc::clone(&series), timing)
        };
        let key = LeaseKey::new("first")?;
        let plain = Grant::new(key.clone(), HolderId::generate()?, FencingToken(1), ttl, t0);
        let handed = |hold: Duration| {
            Grant::handed_over(key.clone(), plain.holder, FencingToken(2), ttl, t0, hold)
        };

        let regular = shared(&plain, None);
        assert_eq!(first_renewal(&regular, t0), t0 + interval);
        // On the grid from t0 (steps of interval / 16): the renewal itself.
        assert_eq!(first_due(&regular, t0, t0), t0 + interval);
        // No renewal allowed: the deadline.
        let capped = shared(&plain, Some(0));
        assert_eq!(first_due(&capped, t0, t0), t0 + ttl.get() - drift - margin);

        // Held 6 s from t0: its deadline is 6 s less the drift and the
        // margin after t0, and its first renewal halfway there.
        let short = shared(&handed(Duration::from_secs(6)), None);
        let deadline = Duration::from_secs(6) - drift - margin;
        assert_eq!(first_renewal(&short, t0), t0 + deadline / 2);
        assert_eq!(
            first_due(&short, t0, t0),
            on_grid(t0, t0 + deadline / 2, interval.as_nanos().try_into()?)
        );
        // Its deadline already passed: at once.
        let late = shared(&handed(Duration::from_secs(1)), None);
        assert_eq!(first_renewal(&late, t0), t0);
        Ok(())
    }

    /// Lease ids count up from 0: the hasher must still spread them over
    /// a table's buckets (the low bits) and its control bytes (the high
    /// bits), or the id map degrades into a linear search. Byte strings
    /// (which no map here uses, but `Hasher` allows) hash apart too.
    #[test]
    fn id_hasher_spreads_counted_ids() {
        let hash_id = |id: u64| {
            let mut h = IdHasher::default();
            h.write_u64(id);
            h.finish()
        };
        let low: HashSet<u64> = (0..1024).map(|id| hash_id(id) & 1023).collect();
        assert_eq!(low.len(), 1024, "low bits collide");
        let high: HashSet<u64> = (0..128).map(|id| hash_id(id) >> 57).collect();
        assert!(high.len() >= 64, "only {} control bytes", high.len());

        let hash_bytes = |bytes: &[u8]| {
            let mut h = IdHasher::default();
            h.write(bytes);
            h.finish()
        };
        let pairs: HashSet<u64> = (0..=u16::MAX)
            .map(|n| hash_bytes(&n.to_be_bytes()))
            .collect();
        assert_eq!(pairs.len(), 1 << 16, "two-byte strings collide");
    }
}
