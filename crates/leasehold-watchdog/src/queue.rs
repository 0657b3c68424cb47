//! The local queue: waiters for one key inside one manager line up here in
//! FIFO order, and only the one at the head talks to the backend (a
//! waiter's whole life is in `waiting.rs`; this is its `Queued` state).
//!
//! The head leaves the queue as soon as it has the lease. The next head
//! then waits for the release notice like waiters in other processes do,
//! and leaves an offer that a release by this manager may answer with a
//! handover (see `handoff.rs`) while no waiter elsewhere listens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey};
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::handoff::{Handoff, Waiters};

/// Why a waiter did not reach the head of the queue.
#[derive(Debug)]
pub(crate) enum QueueError {
    /// The queue already had `waiters` waiters, the bound.
    Busy { waiters: usize },
    /// Another waiter or holder in this process kept the turn until the wait ran out.
    Occupied,
}

pub(crate) struct Queues {
    bound: usize,
    keys: Mutex<HashMap<LeaseKey, Arc<KeyQueue>>>,
    /// Keys this manager released a moment ago while a waiter elsewhere
    /// listened, and when (see [`Queues::yield_until`]).
    heard: Mutex<HashMap<LeaseKey, Instant>>,
    /// The fencing token of this manager's latest grant of each key (see
    /// [`Queues::last_won`]).
    won: Mutex<HashMap<LeaseKey, FencingToken>>,
    /// The latest acquisition attempt's round trip, in nanoseconds (0: none yet).
    round_trip: AtomicU64,
    /// When a waiter here last heard a release notice of each key, and
    /// the longest interval between two of them lately (see [`Turns`]).
    turns: Mutex<HashMap<LeaseKey, Turns>>,
    /// Keys with an acquisition in its attempt before queueing (`Trying`),
    /// by a fingerprint of the key (see [`Queues::try_first`]).
    trying: Box<[AtomicBool]>,
}

/// How many fingerprints [`Queues::trying`] tells apart: with 64
/// acquisitions of distinct keys in their first attempt at once, a new one
/// finds its fingerprint taken (and queues) about one time in sixteen.
const TRYING_SLOTS: usize = 1024;

/// A key's place in [`Queues::trying`]: from its length and its first and
/// last eight bytes, where keys that differ usually differ. Two keys with
/// one fingerprint only make the second queue as under contention, so the
/// spread needs to be good, not perfect, and an adversary's keys can only
/// take an acquisition off the shortcut.
fn fingerprint(key: &LeaseKey) -> usize {
    let bytes = key.as_str().as_bytes();
    let word = |part: &[u8]| {
        let mut buf = [0u8; 8];
        buf[..part.len()].copy_from_slice(part);
        u64::from_le_bytes(buf)
    };
    let head = word(&bytes[..bytes.len().min(8)]);
    let tail = word(&bytes[bytes.len().saturating_sub(8)..]);
    let mixed =
        (head ^ tail.rotate_left(29) ^ (bytes.len() as u64)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // The high bits are the best mixed.
    (mixed >> 54) as usize % TRYING_SLOTS
}

/// An acquisition's claim on its key's attempt before queueing: while it
/// stands, other newcomers for a key of the same fingerprint queue (a
/// burst of acquisitions of one key sends one first attempt, not one
/// each). Dropped when the attempt is over, or with the acquisition.
pub(crate) struct Trying<'a> {
    slot: &'a AtomicBool,
}

impl Drop for Trying<'_> {
    fn drop(&mut self) {
        self.slot.store(false, Ordering::Release);
    }
}

/// Release notices of one key lately: when the last came, and the longest
/// interval between two of them lately (none when the last was longer than
/// [`MAX_TURN`]).
#[derive(Clone, Copy)]
struct Turns {
    at: Instant,
    turn: Option<Duration>,
}

impl Turns {
    /// How long one holder keeps the key lately: the longest interval
    /// between two release notices heard here, forgotten by half its
    /// excess over each shorter one that follows; `None` when it was
    /// not measured, or when the last notice came more than two such turns
    /// before `at` (the processes that took turns may have stopped).
    /// The longest rather than the last: holders starved of CPU, or
    /// processes that hold for different times, take turns of very
    /// different lengths, and a window built from a short one runs out
    /// while the next holder still holds.
    fn turn(&self, at: Instant) -> Option<Duration> {
        let turn = self.turn?;
        (at.saturating_duration_since(self.at) < turn.saturating_mul(2)).then_some(turn)
    }

    /// Notes a notice at `now`.
    fn noted(&mut self, now: Instant) {
        let gap = now.saturating_duration_since(self.at);
        self.at = now;
        self.turn = (gap <= MAX_TURN).then(|| match self.turn {
            Some(longest) if longest > gap => longest - (longest - gap) / 2,
            _ => gap,
        });
    }
}

/// Intervals between notices longer than this are not a holder's turn
/// (the key sat free, or the waiters came and went): a window built from
/// one could keep a process from a free key that long.
const MAX_TURN: Duration = Duration::from_millis(100);

/// How long a new acquisition in this manager lets a waiter elsewhere go
/// first, after a release here that it heard. The waiter's attempt and
/// ours would both start with the release's reply (the notice travels as
/// fast), so this only has to cover the waiter's wake-up, not a round trip.
pub(crate) const YIELD: std::time::Duration = std::time::Duration::from_millis(2);

/// Past this many keys, noting a heard release first drops the stale ones.
const HEARD_KEYS: usize = 1024;

/// Past this many keys, noting a grant first forgets the others' wins:
/// a forgotten win only means this manager's next waiter for that key
/// does not hold back once (see [`Queues::last_won`]).
const WON_KEYS: usize = 1024;

struct KeyQueue {
    /// tokio's mutex queues its waiters in FIFO order.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Tasks waiting for the key: the head and those behind it.
    waiting: AtomicUsize,
    /// The head's offer and the baton for the next head.
    handoff: Arc<Handoff>,
}

/// The head of a key's queue. Dropping it lets the next waiter in.
pub(crate) struct Turn {
    _guard: OwnedMutexGuard<()>,
    ticket: Ticket,
}

impl Turn {
    /// The key's handover state.
    pub(crate) fn handoff(&self) -> &Handoff {
        &self.ticket.queue.handoff
    }

    /// The key's handover state, for a guard that outlives this borrow.
    pub(crate) fn shared_handoff(&self) -> Arc<Handoff> {
        Arc::clone(&self.ticket.queue.handoff)
    }

    /// Whether other tasks wait behind this head.
    pub(crate) fn others_waiting(&self) -> bool {
        self.ticket.queue.waiting.load(Ordering::Acquire) > 1
    }
}

/// One task's place in a key's queue, counted while it waits (also when its
/// future is dropped); the queue leaves the map with its last ticket.
struct Ticket {
    queues: Arc<Queues>,
    key: LeaseKey,
    queue: Arc<KeyQueue>,
}

impl Queues {
    pub(crate) fn new(bound: usize) -> Self {
        Self {
            bound,
            keys: Mutex::new(HashMap::new()),
            heard: Mutex::new(HashMap::new()),
            won: Mutex::new(HashMap::new()),
            round_trip: AtomicU64::new(0),
            turns: Mutex::new(HashMap::new()),
            trying: (0..TRYING_SLOTS).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Notes that a waiter here heard a release notice of `key` now.
    pub(crate) fn note_notice(&self, key: &LeaseKey) {
        let now = Instant::now();
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = turns.get_mut(key) {
            last.noted(now);
            return;
        }
        if turns.len() >= WON_KEYS {
            turns.clear();
        }
        turns.insert(
            key.clone(),
            Turns {
                at: now,
                turn: None,
            },
        );
    }

    /// How long a waiter here that heard a release of `key` at `at`
    /// waits for the next holder's notice before it tries anyway: two
    /// turns (see [`Turns::turn`]); zero when the turns are not known.
    pub(crate) fn window(&self, key: &LeaseKey, at: Instant) -> Duration {
        let turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns
            .get(key)
            .and_then(|last| last.turn(at))
            .map_or(Duration::ZERO, |turn| turn.saturating_mul(2))
    }

    /// Notes that this manager was granted `key` with `token`.
    pub(crate) fn note_won(&self, key: &LeaseKey, token: FencingToken) {
        let mut won = self.won.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = won.get_mut(key) {
            *last = token;
            return;
        }
        if won.len() >= WON_KEYS {
            won.clear();
        }
        won.insert(key.clone(), token);
    }

    /// The fencing token of this manager's latest grant of `key`, if it
    /// remembers one: how recently this process held the key, counted in
    /// acquisitions, is the current holder's token minus this one, where
    /// that token was counted from this one (see `waiting.rs`).
    pub(crate) fn last_won(&self, key: &LeaseKey) -> Option<FencingToken> {
        self.won
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
    }

    /// Notes how long an acquisition attempt took, from send to reply.
    pub(crate) fn note_round_trip(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.round_trip.store(nanos, Ordering::Relaxed);
    }

    /// The latest acquisition attempt's round trip, if one was made.
    pub(crate) fn round_trip(&self) -> Option<Duration> {
        match self.round_trip.load(Ordering::Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Notes that this manager released `key` and a waiter elsewhere heard.
    /// Kept under the key whose release channel announced it
    /// ([`LeaseKey::counted_as`]): a permit's or a share's release is news
    /// of its semaphore or read-write lease, which is what the next
    /// acquisition waits for, and `K` and `{K}` are one lease.
    pub(crate) fn note_heard(&self, key: &LeaseKey) {
        let now = Instant::now();
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if heard.len() >= HEARD_KEYS {
            heard.retain(|_, at| now.duration_since(*at) < YIELD);
        }
        heard.insert(key.counted_as(), now);
    }

    /// Until when a new acquisition of `key` should hold back its first
    /// attempt, if that is still ahead: after this manager's last release
    /// of it that a waiter elsewhere heard, [`YIELD`], or the window (see
    /// [`Queues::window`]) while processes take turns: long enough for the
    /// next holder's release notice to come first. Otherwise the release
    /// and the next acquisition run back to back on one task, and the
    /// releasing process takes the lease again before the waiter that heard
    /// it can even ask: a worker that releases and re-acquires in a loop
    /// would starve every other process.
    pub(crate) fn yield_until(&self, key: &LeaseKey) -> Option<Instant> {
        let at = {
            let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
            // Nothing heard lately, as a rule: no key to build.
            if heard.is_empty() {
                return None;
            }
            heard.remove(&key.counted_as())?
        };
        let until = at + YIELD.max(self.window(key, at));
        (Instant::now() < until).then_some(until)
    }

    /// The claim of a new acquisition of `key` to ask the backend before
    /// it queues (`Trying`, waiting.rs), if the key is quiet: no task here
    /// waits for it or holds its turn (so no head's offer and no baton
    /// stands, and no queued waiter can be overtaken), no other newcomer
    /// is trying it (or a key of its fingerprint), and, for an acquisition
    /// that waits (`waits`), no yield is due after a release here that a
    /// waiter elsewhere heard (see [`Queues::yield_until`], which the
    /// queued path takes). Neither map is hashed into while it is empty,
    /// as it is without contention.
    pub(crate) fn try_first(&self, key: &LeaseKey, waits: bool) -> Option<Trying<'_>> {
        if self.keys().contains_key(key) {
            return None;
        }
        if waits {
            let heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
            if !heard.is_empty() && heard.contains_key(&key.counted_as()) {
                return None;
            }
        }
        let slot = self.trying.get(fingerprint(key))?;
        slot.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        Some(Trying { slot })
    }

    fn keys(&self) -> MutexGuard<'_, HashMap<LeaseKey, Arc<KeyQueue>>> {
        // Every update is a single insert or remove.
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for the head of `key`'s queue until `give_up_at`; with no
    /// deadline, takes the head only if it is free now.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue without disturbing the order of
    /// the others.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &LeaseKey,
        give_up_at: Option<Instant>,
    ) -> Result<Turn, QueueError> {
        let (ticket, before) = self.ticket(key);
        let guard = match give_up_at {
            None => Arc::clone(&ticket.queue.turn)
                .try_lock_owned()
                .map_err(|_| QueueError::Occupied)?,
            Some(_) if before >= self.bound => return Err(QueueError::Busy { waiters: before }),
            Some(give_up_at) => {
                let lock = Arc::clone(&ticket.queue.turn).lock_owned();
                tokio::time::timeout_at(give_up_at, lock)
                    .await
                    .map_err(|_| QueueError::Occupied)?
            }
        };
        Ok(Turn {
            _guard: guard,
            ticket,
        })
    }

    /// The handover state of `key`, if anyone waits for it here.
    pub(crate) fn handoff(&self, key: &LeaseKey) -> Option<Arc<Handoff>> {
        self.keys().get(key).map(|q| Arc::clone(&q.handoff))
    }

    /// A ticket for `key`'s queue, and how many tickets it had before.
    fn ticket(self: &Arc<Self>, key: &LeaseKey) -> (Ticket, usize) {
        let mut keys = self.keys();
        let queue = Arc::clone(keys.entry(key.clone()).or_insert_with(|| {
            Arc::new(KeyQueue {
                turn: Arc::new(tokio::sync::Mutex::new(())),
                waiting: AtomicUsize::new(0),
                handoff: Arc::default(),
            })
        }));
        let before = queue.waiting.fetch_add(1, Ordering::AcqRel);
        drop(keys);
        let ticket = Ticket {
            queues: Arc::clone(self),
            key: key.clone(),
            queue,
        };
        (ticket, before)
    }

    /// How many keys have a queue (for tests: queues must not leak).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.keys().len()
    }
}

/// A release finds the key's handover state here, and notes a heard release.
impl Waiters for Queues {
    fn handoff(&self, key: &LeaseKey) -> Option<Arc<Handoff>> {
        Queues::handoff(self, key)
    }

    fn note_heard(&self, key: &LeaseKey) {
        Queues::note_heard(self, key);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut keys = self.queues.keys();
        // Tickets are only made under this lock, so the count cannot grow
        // meanwhile: two references left are the map's and ours.
        if Arc::strong_count(&self.queue) == 2 {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("q").expect("valid key")
    }

    #[tokio::test(start_paused = true)]
    async fn fifo_bounded_and_leaves_nothing_behind() {
        let queues = Arc::new(Queues::new(3));
        let later = Some(Instant::now() + Duration::from_secs(60));
        let head = queues.enter(&key(), None).await.expect("free head");
        assert!(matches!(
            queues.enter(&key(), None).await,
            Err(QueueError::Occupied)
        ));

        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..2 {
            let (queues, order) = (Arc::clone(&queues), Arc::clone(&order));
            waiters.push(tokio::spawn(async move {
                let turn = queues.enter(&key(), later).await.expect("queued");
                order.lock().expect("not poisoned").push(i);
                drop(turn);
            }));
            tokio::task::yield_now().await;
        }
        // The bound is three tasks, the head included: a fourth is refused at once.
        assert!(matches!(
            queues.enter(&key(), later).await,
            Err(QueueError::Busy { waiters: 3 })
        ));
        drop(head);
        for w in waiters {
            w.await.expect("waiter finished");
        }
        assert_eq!(*order.lock().expect("not poisoned"), vec![0, 1]);
        assert_eq!(queues.len(), 0);
    }

    /// A heard release holds back this manager's next acquisition of the
    /// key for exactly [`YIELD`], and only once.
    #[tokio::test(start_paused = true)]
    async fn a_heard_release_yields_for_exactly_the_yield_time() {
        let queues = Queues::new(3);
        assert_eq!(queues.yield_until(&key()), None, "nothing heard");
        let heard_at = Instant::now();
        queues.note_heard(&key());
        tokio::time::advance(YIELD - Duration::from_millis(1)).await;
        assert_eq!(queues.yield_until(&key()), Some(heard_at + YIELD));
        // Taken: a second acquisition does not yield again.
        assert_eq!(queues.yield_until(&key()), None);

        queues.note_heard(&key());
        tokio::time::advance(YIELD).await;
        // At the very end of the yield there is nothing left to wait for.
        assert_eq!(queues.yield_until(&key()), None);
    }

    /// Past [`HEARD_KEYS`] keys, noting a release drops the ones whose
    /// yield is over (and only those), so the map stays bounded.
    #[tokio::test(start_paused = true)]
    async fn heard_releases_past_the_bound_drop_the_stale_ones() {
        let queues = Queues::new(3);
        let heard = |queues: &Queues| queues.heard.lock().expect("not poisoned").len();
        let name = |i: usize| LeaseKey::new(format!("k{i}")).expect("valid key");
        for i in 0..HEARD_KEYS - 1 {
            queues.note_heard(&name(i));
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        let fresh_at = Instant::now();
        queues.note_heard(&key());
        assert_eq!(heard(&queues), HEARD_KEYS);
        // The first keys' yield ends now; `q`'s has a millisecond left.
        tokio::time::advance(YIELD - Duration::from_millis(1)).await;
        queues.note_heard(&name(HEARD_KEYS));
        assert_eq!(heard(&queues), 2);
        assert_eq!(queues.yield_until(&key()), Some(fresh_at + YIELD));
    }

    /// A turn is the interval between the last two notices of a key (the
    /// longest lately, below), used only while the last notice is less than
    /// two turns old, and never longer than [`MAX_TURN`]; the window is two
    /// of them.
    #[tokio::test(start_paused = true)]
    async fn the_window_is_two_turns_between_notices_while_fresh() {
        let queues = Queues::new(3);
        let ms = Duration::from_millis;
        let zero = Duration::ZERO;
        queues.note_notice(&key());
        assert_eq!(queues.window(&key(), Instant::now()), zero, "one notice");
        tokio::time::advance(ms(3)).await;
        queues.note_notice(&key());
        let last = Instant::now();
        assert_eq!(queues.window(&key(), last), ms(6));
        assert_eq!(queues.window(&key(), last + ms(5)), ms(6));
        assert_eq!(queues.window(&key(), last + ms(6)), zero, "stale");
        let other = LeaseKey::new("other").expect("valid key");
        assert_eq!(queues.window(&other, last), zero, "per key");
        tokio::time::advance(MAX_TURN + ms(1)).await;
        queues.note_notice(&key());
        assert_eq!(
            queues.window(&key(), Instant::now()),
            zero,
            "too long a gap"
        );
    }

    /// A turn is the longest interval lately: a shorter one that follows
    /// takes half the difference off it; a longer one replaces it.
    #[tokio::test(start_paused = true)]
    async fn a_turn_is_the_longest_interval_lately() {
        let queues = Queues::new(3);
        let ms = Duration::from_millis;
        let window = || queues.window(&key(), Instant::now());
        queues.note_notice(&key());
        tokio::time::advance(ms(20)).await;
        queues.note_notice(&key());
        assert_eq!(window(), ms(40));
        tokio::time::advance(ms(4)).await;
        queues.note_notice(&key());
        assert_eq!(window(), ms(24), "20 - (20 - 4) / 2 = 12 ms");
        tokio::time::advance(ms(4)).await;
        queues.note_notice(&key());
        assert_eq!(window(), ms(16), "12 - (12 - 4) / 2 = 8 ms");
        tokio::time::advance(ms(30)).await;
        queues.note_notice(&key());
        assert_eq!(window(), ms(60), "a longer one replaces it");
    }

    /// While processes take turns, a heard release holds the next
    /// acquisition back two turns (the next holder's notice comes first);
    /// otherwise [`YIELD`].
    #[tokio::test(start_paused = true)]
    async fn a_heard_release_yields_two_turns_while_processes_take_turns() {
        let queues = Queues::new(3);
        let ms = Duration::from_millis;
        queues.note_notice(&key());
        tokio::time::advance(ms(4)).await;
        queues.note_notice(&key());
        tokio::time::advance(ms(4)).await;
        let heard_at = Instant::now();
        queues.note_heard(&key());
        assert_eq!(queues.yield_until(&key()), Some(heard_at + ms(8)));
        // Past two turns after the last notice, the turns are over.
        tokio::time::advance(ms(5)).await;
        let heard_at = Instant::now();
        queues.note_heard(&key());
        assert_eq!(queues.yield_until(&key()), Some(heard_at + YIELD));
    }

    /// The last win of each key is remembered (the latest one), and past
    /// [`WON_KEYS`] keys the map starts over instead of growing.
    #[test]
    fn the_last_win_per_key_is_remembered_within_a_bound() {
        let queues = Queues::new(3);
        let name = |i: usize| LeaseKey::new(format!("k{i}")).expect("valid key");
        assert_eq!(queues.last_won(&key()), None);
        queues.note_won(&key(), FencingToken(7));
        queues.note_won(&key(), FencingToken(9));
        assert_eq!(queues.last_won(&key()), Some(FencingToken(9)));
        for i in 0..WON_KEYS - 1 {
            queues.note_won(&name(i), FencingToken(1));
        }
        // Full: updating a key it has does not start over.
        queues.note_won(&key(), FencingToken(10));
        assert_eq!(queues.last_won(&name(0)), Some(FencingToken(1)));
        queues.note_won(&name(WON_KEYS), FencingToken(2));
        assert_eq!(queues.won.lock().expect("not poisoned").len(), 1);
        assert_eq!(queues.last_won(&key()), None);
        assert_eq!(queues.last_won(&name(WON_KEYS)), Some(FencingToken(2)));
    }

    /// `others_waiting` counts the tasks behind the head, not the head; the
    /// head shares the key's handover state.
    #[tokio::test(start_paused = true)]
    async fn the_head_knows_whether_others_wait_behind_it() {
        let queues = Arc::new(Queues::new(3));
        let later = Some(Instant::now() + Duration::from_secs(60));
        let head = queues.enter(&key(), None).await.expect("free head");
        assert!(!head.others_waiting());
        // The head's handover state is the key's, where a release looks.
        let shared = queues.handoff(&key()).expect("a queue for the key");
        assert!(std::ptr::eq(head.handoff(), &*shared));
        let behind = tokio::spawn({
            let queues = Arc::clone(&queues);
            async move {
                queues
                    .enter(&key(), later)
                    .await
                    .map(|turn| turn.others_waiting())
            }
        });
        tokio::task::yield_now().await;
        assert!(head.others_waiting());
        drop(head);
        let next = tokio::time::timeout(Duration::from_secs(1), behind)
            .await
            .expect("the next head got its turn")
            .expect("not panicked");
        assert!(matches!(next, Ok(false)));
    }

    /// A key is quiet (an acquisition may ask before queueing) only while
    /// no task here holds a ticket for it, and, for one that waits, while
    /// no yield after a heard release is due for it.
    #[tokio::test(start_paused = true)]
    async fn a_key_is_quiet_only_without_tickets_a_first_attempt_or_a_due_yield() {
        let queues = Arc::new(Queues::new(3));
        let other = LeaseKey::new("other").expect("valid key");
        assert_ne!(fingerprint(&key()), fingerprint(&other));
        let quiet = |key: &LeaseKey, waits| queues.try_first(key, waits).is_some();
        assert!(quiet(&key(), true));
        let head = queues.enter(&key(), None).await.expect("free head");
        assert!(!quiet(&key(), true));
        assert!(!quiet(&key(), false));
        assert!(quiet(&other, true), "per key");
        drop(head);
        assert!(quiet(&key(), true));

        // One first attempt at a time: a second newcomer queues.
        let first = queues.try_first(&key(), true);
        assert!(first.is_some());
        assert!(!quiet(&key(), true), "another newcomer is trying");
        assert!(!quiet(&key(), false), "another newcomer is trying");
        assert!(quiet(&other, true), "per key");
        drop(first);
        assert!(quiet(&key(), true), "the attempt is over");

        queues.note_heard(&key());
        assert!(!quiet(&key(), true), "a yield is due");
        assert!(quiet(&key(), false), "no yield without a wait");
        assert!(quiet(&other, true), "per key");
        // The queued path takes the yield; then the key is quiet again.
        assert!(queues.yield_until(&key()).is_some());
        assert!(quiet(&key(), true));
    }

    /// Keys that differ in their last bytes, their first or their length
    /// (the usual `job:1`, `job:2`, ...) mostly get fingerprints of their own.
    #[test]
    fn fingerprints_spread_numbered_keys() {
        let name = |i: usize| LeaseKey::new(format!("jobs:nightly:{i}")).expect("valid key");
        let slots: std::collections::HashSet<usize> =
            (0..64).map(|i| fingerprint(&name(i))).collect();
        assert!(slots.len() >= 60, "64 keys in {} slots", slots.len());
        let long = |i: usize| LeaseKey::new(format!("{i}:{}", "x".repeat(40))).expect("valid key");
        let slots: std::collections::HashSet<usize> =
            (0..64).map(|i| fingerprint(&long(i))).collect();
        assert!(slots.len() >= 60, "64 keys in {} slots", slots.len());
    }

    /// A wait that runs out reports the head as occupied, and leaves no
    /// queue behind.
    #[tokio::test(start_paused = true)]
    async fn a_wait_for_the_head_gives_up_at_its_deadline() {
        let queues = Arc::new(Queues::new(3));
        let head = queues.enter(&key(), None).await.expect("free head");
        let start = Instant::now();
        let give_up_at = start + Duration::from_millis(500);
        assert!(matches!(
            queues.enter(&key(), Some(give_up_at)).await,
            Err(QueueError::Occupied)
        ));
        assert_eq!(Instant::now(), give_up_at);
        assert!(queues.handoff(&key()).is_some());
        drop(head);
        assert!(queues.handoff(&key()).is_none());
        assert_eq!(queues.len(), 0);
    }
}
