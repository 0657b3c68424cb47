//! The local queue: waiters for one key inside one manager line up here in
//! FIFO order, and only the one at the head talks to the backend (a
//! waiter's whole life is in `waiting.rs`; this is its `Queued` state).
//!
//! The head leaves the queue as soon as it has the lease. The next head
//! then waits for the release notice like waiters in other processes do,
//! and leaves an offer that a release by this manager may answer with a
//! handover (see `handoff.rs`) while no waiter elsewhere listens.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use leasehold_core::LeaseKey;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

use crate::handoff::{Handoff, Waiters};
use crate::turns::TurnTaking;

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
    /// What this manager remembers of the turns taken with other processes
    /// (`turns.rs`).
    turns: TurnTaking,
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
            turns: TurnTaking::new(),
            trying: (0..TRYING_SLOTS).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// What this manager remembers of the turns taken with other
    /// processes.
    pub(crate) fn turns(&self) -> &TurnTaking {
        &self.turns
    }

    /// The claim of a new acquisition of `key` to ask the backend before
    /// it queues (`Trying`, waiting.rs), if the key is quiet: no task here
    /// waits for it or holds its turn (so no head's offer and no baton
    /// stands, and no queued waiter can be overtaken), no other newcomer
    /// is trying it (or a key of its fingerprint), and, for an acquisition
    /// that waits (`waits`), no yield is due after a release here that a
    /// waiter elsewhere heard (see [`TurnTaking::yield_until`], which the
    /// queued path takes).
    pub(crate) fn try_first(&self, key: &LeaseKey, waits: bool) -> Option<Trying<'_>> {
        if self.keys().contains_key(key) {
            return None;
        }
        if waits && self.turns.heard_lately(key) {
            return None;
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
        self.turns.note_heard(key);
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

        queues.turns().note_heard(&key());
        assert!(!quiet(&key(), true), "a yield is due");
        assert!(quiet(&key(), false), "no yield without a wait");
        assert!(quiet(&other, true), "per key");
        // The queued path takes the yield; then the key is quiet again.
        assert!(queues.turns().yield_until(&key()).is_some());
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
