//! The leases this backend asked for with a minimum hold, so that the
//! release of any other lease need not look for a hold's mark.
//!
//! A lease acquired with a minimum hold is marked on the server
//! (`P:held-until`, `acquire.lua` step 4), and a release before the
//! minimum's end keeps the key (`release.lua` step 3). Reading the mark
//! costs every release a command inside its script (about a twentieth of
//! the server's work for a cycle of acquire and release, measured with
//! callgrind: docs/performance.md), though only leases taken with a
//! minimum have one. The backend knows which those are, since it sent
//! their acquisitions: it notes each here before sending it, and its
//! release then goes alone, by `release.lua` told to read the mark; every
//! other release is told not to, and may go in a batch
//! (`release_many.lua` reads no mark).
//!
//! A note is kept until the minimum has surely ended, whatever replies
//! came: a release sent again after a failure, the release of an
//! acquisition whose reply was lost (the server may have granted and
//! marked it), and a second release of a lease the first one kept under
//! its minimum (still its holder's) all read the mark; and a note is
//! never dropped for a reply, which could drop the note of another call
//! of the same holder and key (an acquisition refused, or a handover to
//! a holder that already had the lease). Once the minimum has surely
//! ended, the mark's end, by the server's clock, is behind, and a release
//! reading it would free the key anyway. So the table holds at most the
//! minimum-hold leases asked for within their minimum, the op timeout and
//! [`STALE_AFTER`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::{HolderId, LeaseKey};
use tokio::time::Instant;

/// How long after its minimum (and the op timeout of its acquisition) a
/// note is kept for a release that may still come: generous, since a
/// request may reach a paused or overloaded server long after the client
/// gave up on it, and the server's clock may run slower than this one.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);

/// How often the stale notes are looked for (see [`Notes::next_sweep`]).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// The minimum-hold leases of one backend.
#[derive(Default)]
pub(crate) struct Holds {
    /// How many notes there are: 0 spares the usual release the lock.
    count: AtomicUsize,
    notes: Mutex<Notes>,
}

#[derive(Default)]
struct Notes {
    /// Each lease (key and holder) with a minimum hold, and when its note
    /// may be dropped.
    stale_at: HashMap<(LeaseKey, HolderId), Instant>,
    /// When the stale notes are next looked for: at most once a second,
    /// so that many holds asked for at once do not each scan the table.
    next_sweep: Option<Instant>,
}

impl Holds {
    /// Notes that `holder` asks for `key` with a minimum hold of
    /// `minimum`, before the request is sent; drops the notes whose
    /// minimum has surely ended.
    pub(crate) fn asked(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        minimum: Duration,
        op_timeout: Duration,
    ) {
        let now = Instant::now();
        let mut notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        if notes.next_sweep.is_none_or(|at| at <= now) {
            notes.stale_at.retain(|_, stale_at| *stale_at > now);
            notes.next_sweep = Some(now + SWEEP_EVERY);
        }
        notes.stale_at.insert(
            (key.clone(), *holder),
            now + minimum + op_timeout + STALE_AFTER,
        );
        self.count.store(notes.stale_at.len(), Ordering::Release);
    }

    /// Whether `holder`'s lease of `key` may carry a minimum hold's mark,
    /// which its release must read.
    pub(crate) fn may_hold(&self, key: &LeaseKey, holder: &HolderId) -> bool {
        if self.count.load(Ordering::Acquire) == 0 {
            return false;
        }
        let notes = self.notes.lock().unwrap_or_else(PoisonError::into_inner);
        notes.stale_at.contains_key(&(key.clone(), *holder))
    }

    /// How many notes are kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> LeaseKey {
        LeaseKey::new(k).expect("valid key")
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_noted_by_key_and_holder() {
        let holds = Holds::default();
        let (a, b) = (
            HolderId::generate().expect("id"),
            HolderId::generate().expect("id"),
        );
        assert!(!holds.may_hold(&key("k"), &a));
        holds.asked(
            &key("k"),
            &a,
            Duration::from_secs(5),
            Duration::from_secs(1),
        );
        assert!(holds.may_hold(&key("k"), &a));
        assert!(!holds.may_hold(&key("k"), &b), "another holder");
        assert!(!holds.may_hold(&key("other"), &a), "another key");
        assert_eq!(holds.len(), 1);
    }

    /// An empty table and two holders to note.
    fn two_holders() -> (Holds, HolderId, HolderId) {
        let id = || HolderId::generate().expect("id");
        (Holds::default(), id(), id())
    }

    /// A note is kept through its minimum, its op timeout and
    /// [`STALE_AFTER`], and dropped by the next note asked for after that
    /// (once the sweep, at most once a second, is due).
    #[tokio::test(start_paused = true)]
    async fn a_note_is_dropped_only_once_its_minimum_has_surely_ended() {
        let (holds, a, b) = two_holders();
        let (minimum, op) = (Duration::from_secs(5), Duration::from_secs(1));
        holds.asked(&key("k"), &a, minimum, op);
        tokio::time::advance(minimum + op + STALE_AFTER - Duration::from_millis(1)).await;
        holds.asked(&key("l"), &b, minimum, op);
        assert!(holds.may_hold(&key("k"), &a), "dropped before its end");
        tokio::time::advance(Duration::from_millis(1)).await;
        holds.asked(&key("m"), &b, minimum, op);
        assert!(holds.may_hold(&key("k"), &a), "swept twice within a second");
        tokio::time::advance(SWEEP_EVERY).await;
        holds.asked(&key("m"), &b, minimum, op);
        assert!(!holds.may_hold(&key("k"), &a), "kept after its end");
        assert_eq!(holds.len(), 2);
    }

    /// At the instant its minimum has surely ended, a note is stale: a
    /// sweep then drops it.
    #[tokio::test(start_paused = true)]
    async fn a_note_is_stale_at_exactly_its_end() {
        let (holds, a, b) = two_holders();
        let (minimum, op) = (Duration::from_secs(5), Duration::from_secs(1));
        holds.asked(&key("k"), &a, minimum, op);
        tokio::time::advance(minimum + op + STALE_AFTER).await;
        holds.asked(&key("l"), &b, minimum, op);
        assert!(!holds.may_hold(&key("k"), &a), "kept at its end");
        assert_eq!(holds.len(), 1);
    }
}
