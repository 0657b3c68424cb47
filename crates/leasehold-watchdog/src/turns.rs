//! Turn-taking between processes, in the default mode: what a manager
//! remembers so that its waiters take turns with the waiters of other
//! processes, and every tunable of it, named beside its reason.
//!
//! Redis keeps no queue in the default mode: each release notice reaches
//! every listening process, and the first attempt to arrive wins. Left at
//! that, the process that just released (its next acquisition runs on the
//! same task, with no wake-up) and the process that Redis tells first would
//! win nearly every time. Three mechanisms keep processes taking turns;
//! each was switched off in turn and measured (docs/performance.md, "What
//! each turn-taking mechanism buys"), and each pays for itself:
//!
//! - **Yield** ([`TurnTaking::yield_until`]): a manager whose release was
//!   heard by a waiter elsewhere holds its own next acquisition of the key
//!   back, until that waiter's holder has released in turn (its notice) or
//!   [`YIELD`] (or the window, below) has passed.
//! - **Defer** ([`TurnTaking::rank`]): after a release notice, a waiter
//!   ranks its process by how recently it held the key, counted in
//!   acquisitions (fencing tokens) against the number of listening
//!   processes, and lets the ones that held it longer ago go first: one
//!   notice per process ahead of it, each a turn taken. A permit's or a
//!   share's release may make room for several, so their waiters hold back
//!   one [`TurnTaking::moment`] per rank, then try.
//! - **Window** ([`TurnTaking::window`]): a deferring or yielding waiter
//!   waits for the next notice at most two turns, a turn being the longest
//!   interval between two notices heard here lately; then it tries anyway
//!   (the one ahead may not want the lease any more).
//!
//! The waiting path (`waiting.rs`) asks these questions; the local queue
//! (`queue.rs`) and the local handover (`handoff.rs`) keep the order inside
//! one manager, which needs none of this. Three more mechanisms are about
//! how a process subscribes, so they live with the Redis backend's release
//! notices (`leasehold-redis/src/notices.rs`): a channel lingers between
//! waits (no `SUBSCRIBE` per wait), a process drops the notice of its own
//! release while its channel lingers, and a permit's or a share's waiter
//! subscribes afresh (`WatchPolicy::Afresh`), so that Redis's delivery
//! order keeps no process ahead. They were measured the same way.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_core::{FencingToken, LeaseKey};
use tokio::time::Instant;

/// How long a new acquisition in this manager lets a waiter elsewhere go
/// first, after a release here that it heard, when no turns are measured.
/// The waiter's attempt and ours would both start with the release's reply
/// (the notice travels as fast), so this only has to cover the waiter's
/// wake-up, not a round trip.
pub(crate) const YIELD: Duration = Duration::from_millis(2);

/// Intervals between notices longer than this are not a holder's turn
/// (the key sat free, or the waiters came and went): a window built from
/// one could keep a process from a free key that long.
const MAX_TURN: Duration = Duration::from_millis(100);

/// The window is this many turns: one for the holder ahead to hold, one
/// for the jitter of a loaded machine (a holder starved of CPU).
const TURNS_PER_WINDOW: u32 = 2;

/// Past this many keys, noting a heard release first drops the stale ones.
const HEARD_KEYS: usize = 1024;

/// Past this many keys, noting a grant or a notice first forgets the other
/// keys': a forgotten key only means this manager's next waiter for it does
/// not hold back once.
const REMEMBERED_KEYS: usize = 1024;

/// What one manager remembers of the turns taken on each key.
pub(crate) struct TurnTaking {
    /// Keys this manager released a moment ago while a waiter elsewhere
    /// listened, and when (see [`TurnTaking::yield_until`]).
    heard: Mutex<HashMap<LeaseKey, Instant>>,
    /// The fencing token of this manager's latest grant of each key (see
    /// [`TurnTaking::last_won`]).
    won: Mutex<HashMap<LeaseKey, FencingToken>>,
    /// The latest acquisition attempt's round trip, in nanoseconds (0: none
    /// yet): one rank's hold-back.
    round_trip: AtomicU64,
    /// When a waiter here last heard a release notice of each key, and the
    /// longest interval between two of them lately (see [`Pace`]).
    paces: Mutex<HashMap<LeaseKey, Pace>>,
}

/// Release notices of one key lately: when the last came, and the longest
/// interval between two of them lately (none when the last was longer than
/// [`MAX_TURN`]).
#[derive(Clone, Copy)]
struct Pace {
    at: Instant,
    turn: Option<Duration>,
}

impl Pace {
    /// How long one holder keeps the key lately: the longest interval
    /// between two release notices heard here, forgotten by half its
    /// excess over each shorter one that follows; `None` when it was
    /// not measured, or when the last notice came more than a window
    /// before `at` (the processes that took turns may have stopped).
    /// The longest rather than the last: holders starved of CPU, or
    /// processes that hold for different times, take turns of very
    /// different lengths, and a window built from a short one runs out
    /// while the next holder still holds.
    fn turn(&self, at: Instant) -> Option<Duration> {
        let turn = self.turn?;
        (at.saturating_duration_since(self.at) < turn.saturating_mul(TURNS_PER_WINDOW))
            .then_some(turn)
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

impl TurnTaking {
    pub(crate) fn new() -> Self {
        Self {
            heard: Mutex::new(HashMap::new()),
            won: Mutex::new(HashMap::new()),
            round_trip: AtomicU64::new(0),
            paces: Mutex::new(HashMap::new()),
        }
    }

    /// Notes that a waiter here heard a release notice of `key` now.
    pub(crate) fn note_notice(&self, key: &LeaseKey) {
        let now = Instant::now();
        let mut paces = self.paces.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = paces.get_mut(key) {
            last.noted(now);
            return;
        }
        if paces.len() >= REMEMBERED_KEYS {
            paces.clear();
        }
        paces.insert(
            key.clone(),
            Pace {
                at: now,
                turn: None,
            },
        );
    }

    /// How long a waiter here that heard a release of `key` at `at`
    /// waits for the next holder's notice before it tries anyway:
    /// [`TURNS_PER_WINDOW`] turns (see [`Pace::turn`]); zero when the turns
    /// are not known.
    pub(crate) fn window(&self, key: &LeaseKey, at: Instant) -> Duration {
        if leasehold_core::ablation::off("window") {
            return Duration::ZERO;
        }
        let paces = self.paces.lock().unwrap_or_else(PoisonError::into_inner);
        paces
            .get(key)
            .and_then(|last| last.turn(at))
            .map_or(Duration::ZERO, |turn| turn.saturating_mul(TURNS_PER_WINDOW))
    }

    /// Notes that this manager was granted `key` with `token`.
    pub(crate) fn note_won(&self, key: &LeaseKey, token: FencingToken) {
        let mut won = self.won.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(last) = won.get_mut(key) {
            *last = token;
            return;
        }
        if won.len() >= REMEMBERED_KEYS {
            won.clear();
        }
        won.insert(key.clone(), token);
    }

    /// The fencing token of this manager's latest grant of `key`, if it
    /// remembers one: how recently this process held the key, counted in
    /// acquisitions, is the current holder's token minus this one, where
    /// that token was counted from this one (see [`TurnTaking::rank`]).
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

    /// One rank's hold-back: the latest acquisition attempt's round trip
    /// (the time the one ahead needs to ask), or [`YIELD`] before any.
    pub(crate) fn moment(&self) -> Duration {
        match self.round_trip.load(Ordering::Relaxed) {
            0 => YIELD,
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// How many listening processes held `key` longer ago than this one: 0
    /// for the one that held it longest ago, the count of the others for
    /// the one that just released it. `listeners` is the number of
    /// processes listening on the key's release channel (the watch's
    /// count), `holder` the fencing token of the holder whose release the
    /// next notice announces. `None` when this process goes at once: it
    /// waits alone, never held the key, or cannot tell.
    pub(crate) fn rank(
        &self,
        key: &LeaseKey,
        listeners: Option<usize>,
        holder: Option<FencingToken>,
    ) -> Option<u32> {
        if leasehold_core::ablation::off("defer") {
            return None;
        }
        let listeners = listeners?;
        let last_won = self.last_won(key)?;
        // Acquisitions since this process's last: 0 when it just released.
        let since = holder?.0.saturating_sub(last_won.0);
        let others = u64::try_from(listeners.saturating_sub(1)).unwrap_or(u64::MAX);
        let rank = others.saturating_sub(since);
        (rank > 0).then(|| u32::try_from(rank).unwrap_or(u32::MAX))
    }

    /// Notes that this manager released `key` and a waiter elsewhere heard.
    /// Kept under the key whose release channel announced it
    /// ([`LeaseKey::counted_as`]): a permit's or a share's release is news
    /// of its semaphore or read-write lease, which is what the next
    /// acquisition waits for, and `K` and `{K}` are one lease.
    pub(crate) fn note_heard(&self, key: &LeaseKey) {
        if leasehold_core::ablation::off("yield") {
            return;
        }
        let now = Instant::now();
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if heard.len() >= HEARD_KEYS {
            heard.retain(|_, at| now.duration_since(*at) < YIELD);
        }
        heard.insert(key.counted_as(), now);
    }

    /// Whether a yield after a heard release of `key` may be due (see
    /// [`TurnTaking::yield_until`]). The map is not hashed into while it
    /// is empty, as it is without contention.
    pub(crate) fn heard_lately(&self, key: &LeaseKey) -> bool {
        let heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        !heard.is_empty() && heard.contains_key(&key.counted_as())
    }

    /// Until when a new acquisition of `key` should hold back its first
    /// attempt, if that is still ahead: after this manager's last release
    /// of it that a waiter elsewhere heard, [`YIELD`], or the window (see
    /// [`TurnTaking::window`]) while processes take turns: long enough for
    /// the next holder's release notice to come first. Otherwise the
    /// release and the next acquisition run back to back on one task, and
    /// the releasing process takes the lease again before the waiter that
    /// heard it can even ask: a worker that releases and re-acquires in a
    /// loop would starve every other process. Taken once.
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("q").expect("valid key")
    }

    /// A heard release holds back this manager's next acquisition of the
    /// key for exactly [`YIELD`], and only once.
    #[tokio::test(start_paused = true)]
    async fn a_heard_release_yields_for_exactly_the_yield_time() {
        let turns = TurnTaking::new();
        assert_eq!(turns.yield_until(&key()), None, "nothing heard");
        let heard_at = Instant::now();
        turns.note_heard(&key());
        tokio::time::advance(YIELD - Duration::from_millis(1)).await;
        assert_eq!(turns.yield_until(&key()), Some(heard_at + YIELD));
        // Taken: a second acquisition does not yield again.
        assert_eq!(turns.yield_until(&key()), None);

        turns.note_heard(&key());
        tokio::time::advance(YIELD).await;
        // At the very end of the yield there is nothing left to wait for.
        assert_eq!(turns.yield_until(&key()), None);
    }

    /// Past [`HEARD_KEYS`] keys, noting a release drops the ones whose
    /// yield is over (and only those), so the map stays bounded.
    #[tokio::test(start_paused = true)]
    async fn heard_releases_past_the_bound_drop_the_stale_ones() {
        let turns = TurnTaking::new();
        let heard = |turns: &TurnTaking| turns.heard.lock().expect("not poisoned").len();
        let name = |i: usize| LeaseKey::new(format!("k{i}")).expect("valid key");
        for i in 0..HEARD_KEYS - 1 {
            turns.note_heard(&name(i));
        }
        tokio::time::advance(Duration::from_millis(1)).await;
        let fresh_at = Instant::now();
        turns.note_heard(&key());
        assert_eq!(heard(&turns), HEARD_KEYS);
        // The first keys' yield ends now; `q`'s has a millisecond left.
        tokio::time::advance(YIELD - Duration::from_millis(1)).await;
        turns.note_heard(&name(HEARD_KEYS));
        assert_eq!(heard(&turns), 2);
        assert_eq!(turns.yield_until(&key()), Some(fresh_at + YIELD));
    }

    /// A turn is the interval between the last two notices of a key (the
    /// longest lately, below), used only while the last notice is less than
    /// two turns old, and never longer than [`MAX_TURN`]; the window is two
    /// of them.
    #[tokio::test(start_paused = true)]
    async fn the_window_is_two_turns_between_notices_while_fresh() {
        let turns = TurnTaking::new();
        let ms = Duration::from_millis;
        let zero = Duration::ZERO;
        turns.note_notice(&key());
        assert_eq!(turns.window(&key(), Instant::now()), zero, "one notice");
        tokio::time::advance(ms(3)).await;
        turns.note_notice(&key());
        let last = Instant::now();
        assert_eq!(turns.window(&key(), last), ms(6));
        assert_eq!(turns.window(&key(), last + ms(5)), ms(6));
        assert_eq!(turns.window(&key(), last + ms(6)), zero, "stale");
        let other = LeaseKey::new("other").expect("valid key");
        assert_eq!(turns.window(&other, last), zero, "per key");
        tokio::time::advance(MAX_TURN + ms(1)).await;
        turns.note_notice(&key());
        assert_eq!(turns.window(&key(), Instant::now()), zero, "too long a gap");
    }

    /// A turn is the longest interval lately: a shorter one that follows
    /// takes half the difference off it; a longer one replaces it.
    #[tokio::test(start_paused = true)]
    async fn a_turn_is_the_longest_interval_lately() {
        let turns = TurnTaking::new();
        let ms = Duration::from_millis;
        let window = || turns.window(&key(), Instant::now());
        turns.note_notice(&key());
        tokio::time::advance(ms(20)).await;
        turns.note_notice(&key());
        assert_eq!(window(), ms(40));
        tokio::time::advance(ms(4)).await;
        turns.note_notice(&key());
        assert_eq!(window(), ms(24), "20 - (20 - 4) / 2 = 12 ms");
        tokio::time::advance(ms(4)).await;
        turns.note_notice(&key());
        assert_eq!(window(), ms(16), "12 - (12 - 4) / 2 = 8 ms");
        tokio::time::advance(ms(30)).await;
        turns.note_notice(&key());
        assert_eq!(window(), ms(60), "a longer one replaces it");
    }

    /// While processes take turns, a heard release holds the next
    /// acquisition back two turns (the next holder's notice comes first);
    /// otherwise [`YIELD`].
    #[tokio::test(start_paused = true)]
    async fn a_heard_release_yields_two_turns_while_processes_take_turns() {
        let turns = TurnTaking::new();
        let ms = Duration::from_millis;
        turns.note_notice(&key());
        tokio::time::advance(ms(4)).await;
        turns.note_notice(&key());
        tokio::time::advance(ms(4)).await;
        let heard_at = Instant::now();
        turns.note_heard(&key());
        assert_eq!(turns.yield_until(&key()), Some(heard_at + ms(8)));
        // Past two turns after the last notice, the turns are over.
        tokio::time::advance(ms(5)).await;
        let heard_at = Instant::now();
        turns.note_heard(&key());
        assert_eq!(turns.yield_until(&key()), Some(heard_at + YIELD));
    }

    /// The last win of each key is remembered (the latest one), and past
    /// [`REMEMBERED_KEYS`] keys the map starts over instead of growing.
    #[test]
    fn the_last_win_per_key_is_remembered_within_a_bound() {
        let turns = TurnTaking::new();
        let name = |i: usize| LeaseKey::new(format!("k{i}")).expect("valid key");
        assert_eq!(turns.last_won(&key()), None);
        turns.note_won(&key(), FencingToken(7));
        turns.note_won(&key(), FencingToken(9));
        assert_eq!(turns.last_won(&key()), Some(FencingToken(9)));
        for i in 0..REMEMBERED_KEYS - 1 {
            turns.note_won(&name(i), FencingToken(1));
        }
        // Full: updating a key it has does not start over.
        turns.note_won(&key(), FencingToken(10));
        assert_eq!(turns.last_won(&name(0)), Some(FencingToken(1)));
        turns.note_won(&name(REMEMBERED_KEYS), FencingToken(2));
        assert_eq!(turns.won.lock().expect("not poisoned").len(), 1);
        assert_eq!(turns.last_won(&key()), None);
        assert_eq!(
            turns.last_won(&name(REMEMBERED_KEYS)),
            Some(FencingToken(2))
        );
    }

    /// The pace of each key is kept while other keys are noted, and past
    /// [`REMEMBERED_KEYS`] keys the map starts over instead of growing.
    #[tokio::test(start_paused = true)]
    async fn paces_are_remembered_per_key_within_a_bound() {
        let turns = TurnTaking::new();
        let ms = Duration::from_millis;
        let name = |i: usize| LeaseKey::new(format!("k{i}")).expect("valid key");
        turns.note_notice(&key());
        tokio::time::advance(ms(3)).await;
        turns.note_notice(&key());
        for i in 0..REMEMBERED_KEYS - 1 {
            turns.note_notice(&name(i));
        }
        assert_eq!(turns.window(&key(), Instant::now()), ms(6), "kept");
        // Full: a new key starts the map over.
        turns.note_notice(&name(REMEMBERED_KEYS));
        assert_eq!(turns.paces.lock().expect("not poisoned").len(), 1);
        assert_eq!(turns.window(&key(), Instant::now()), Duration::ZERO);
    }
}
