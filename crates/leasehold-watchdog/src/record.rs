//! What the handle and the watchdog both see of a lease: the validity its
//! last renewal earned, how many renewals it had, and how it ended.
//!
//! Only the watchdog writes the validity and the count; the ending is
//! decided by a compare-and-swap that the watchdog (a loss) and the handle
//! (a release) race for, so exactly one of them ends the lease. The atomics
//! come through a switch so that `--cfg loom` swaps in loom's, and the
//! model check in `loom_races.rs` runs this very code.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use crate::loss::LossReason;

/// The lease's shared record. `repr(C)` keeps the three fields in 16 bytes,
/// as they were when they sat in `Shared` directly.
#[repr(C)]
pub(crate) struct Record {
    /// The end of the validity known from the last successful renewal (or
    /// the acquisition), in nanoseconds after the acquisition was sent.
    valid_for_ns: AtomicU64,
    renewals: AtomicU32,
    /// Why the lease ended: 0 while it has not, [`RELEASED`] once the handle
    /// took the release, else a [`LossReason`] code.
    loss: AtomicU8,
    /// Taken in fair mode: released by `FairBackend::release_fair`, which
    /// may hand it to the head of the server's queue. Fixed at acquisition;
    /// kept here, in the room the atomics leave, so that per-lease state
    /// does not grow.
    fair: bool,
}

impl LossReason {
    /// The reason's code in [`Record::loss`]; never 0.
    fn code(self) -> u8 {
        match self {
            Self::Lost => 1,
            Self::RenewalLimit => 2,
            Self::Deadline => 3,
            Self::Shutdown => 4,
            Self::MaxHold => 5,
            Self::Stalled => 6,
        }
    }

    /// `None` for 0 (not ended) and for [`RELEASED`].
    fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Lost),
            2 => Some(Self::RenewalLimit),
            3 => Some(Self::Deadline),
            4 => Some(Self::Shutdown),
            5 => Some(Self::MaxHold),
            6 => Some(Self::Stalled),
            _ => None,
        }
    }
}

/// [`Record::loss`] once the handle has taken the release on itself: the
/// lease ended, but not by a loss, and the watchdog reports none after it.
const RELEASED: u8 = u8::MAX;

impl Record {
    /// A lease valid for `valid_for_ns` after its acquisition was sent,
    /// not renewed and not ended.
    pub(crate) fn new(valid_for_ns: u64) -> Self {
        Self {
            valid_for_ns: AtomicU64::new(valid_for_ns),
            renewals: AtomicU32::new(0),
            loss: AtomicU8::new(0),
            fair: false,
        }
    }

    /// This record for a lease taken in fair mode (when `fair`).
    pub(crate) fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Whether the lease was taken in fair mode.
    pub(crate) fn fair(&self) -> bool {
        self.fair
    }

    /// Records a successful renewal. Only the watchdog writes, so plain
    /// stores suffice; a reader may see the new validity a moment before
    /// the new count, never a validity that was not earned, and never a
    /// count without the validity that came with it.
    pub(crate) fn renewed(&self, valid_for_ns: u64) {
        self.valid_for_ns.store(valid_for_ns, Ordering::Release);
        // The only writer: a load and a store, not a locked read-modify-write.
        let renewals = self.renewals.load(Ordering::Relaxed);
        self.renewals
            .store(renewals.saturating_add(1), Ordering::Release);
    }

    /// Ends the lease with `reason` unless it ended (or was claimed for a
    /// release) before: the first ending wins. `true` means this caller
    /// ended it and must cancel the holder's token.
    pub(crate) fn end(&self, reason: LossReason) -> bool {
        self.loss
            .compare_exchange(0, reason.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Takes the release on the handle, unless the lease ended already.
    /// From then on [`end`](Self::end) does nothing.
    pub(crate) fn claim_release(&self) -> bool {
        self.loss
            .compare_exchange(0, RELEASED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether the lease runs: neither ended nor claimed for a release.
    pub(crate) fn is_running(&self) -> bool {
        self.loss.load(Ordering::Acquire) == 0
    }

    /// Why the lease ended; `None` while it runs and after a release.
    pub(crate) fn loss(&self) -> Option<LossReason> {
        LossReason::from_code(self.loss.load(Ordering::Acquire))
    }

    /// The validity of the last renewal, in nanoseconds after the
    /// acquisition was sent.
    pub(crate) fn valid_for_ns(&self) -> u64 {
        self.valid_for_ns.load(Ordering::Acquire)
    }

    /// How many renewals succeeded.
    pub(crate) fn renewals(&self) -> u32 {
        self.renewals.load(Ordering::Acquire)
    }
}
