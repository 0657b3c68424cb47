//! Limits on how long a lease is kept besides its handle: a maximum hold
//! ([`LeaseOptionsBuilder::hold_at_most`]) and a progress window
//! ([`LeaseOptionsBuilder::progress_window`]), with the [`Progress`] handle
//! through which the holder reports progress.
//!
//! Most leases have neither, so the limits live in a [`Bounds`] of their
//! own, allocated only for a lease that has one: the state shared with the
//! handle holds an `Option` of it (no bytes more than the pointer), and the
//! watchdog keeps the bounded leases in a side table, so that deciding
//! whether to renew an unbounded lease costs nothing more than seeing that
//! table empty or without it. A progress report is one atomic store.
//!
//! [`LeaseOptionsBuilder::hold_at_most`]: crate::LeaseOptionsBuilder::hold_at_most
//! [`LeaseOptionsBuilder::progress_window`]: crate::LeaseOptionsBuilder::progress_window

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::LeaseOptions;

/// The limits of one lease, fixed at acquisition, and its last progress
/// report.
pub(crate) struct Bounds {
    /// When the acquisition was sent: what the maximum and the reports
    /// count from.
    origin: Instant,
    /// The latest the lease may be valid until: acquisition sent + maximum.
    pub(crate) hold_until: Option<Instant>,
    pub(crate) window: Option<Duration>,
    /// The last report, in nanoseconds after `origin` (0, the acquisition,
    /// until the first).
    last_report_ns: AtomicU64,
}

impl Bounds {
    /// The bounds `options` set for a lease acquired at `origin`, `None`
    /// when they set none.
    pub(crate) fn of(options: &LeaseOptions, origin: Instant) -> Option<Arc<Self>> {
        let max = options.hold_at_most();
        let window = options.progress_window();
        if max.is_none() && window.is_none() {
            return None;
        }
        Some(Arc::new(Self {
            origin,
            hold_until: max.and_then(|max| origin.checked_add(max)),
            window,
            last_report_ns: AtomicU64::new(0),
        }))
    }

    /// Records progress now; a report never moves the last one back.
    fn report(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: the watchdog needs the time alone, nothing written
        // before it.
        self.last_report_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// When progress was last reported.
    pub(crate) fn last_report(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_report_ns.load(Ordering::Relaxed))
    }

    /// Whether, at `now`, the holder has reported no progress within its
    /// window.
    pub(crate) fn stalled(&self, now: Instant) -> bool {
        self.window
            .is_some_and(|window| now.saturating_duration_since(self.last_report()) > window)
    }
}

/// Reports the holder's progress, for a lease bound to it by
/// [`LeaseOptionsBuilder::progress_window`](crate::LeaseOptionsBuilder::progress_window).
///
/// Cheap to clone and to call: hand a clone to every task of the job and
/// call [`report`](Self::report) whenever one makes progress. The watchdog
/// renews the lease only while the last report is at most the window old.
/// For a lease without a window, reports are ignored.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::MemoryBackend;
/// use leasehold_watchdog::{LeaseManager, LeaseOptions};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let manager = LeaseManager::new(MemoryBackend::new())?;
/// let options = LeaseOptions::builder()
///     .ttl(Duration::from_secs(30))
///     .progress_window(Duration::from_secs(60))
///     .build()?;
/// let lease = manager.acquire("import:orders", &options).await?;
/// let progress = lease.progress();
/// for _batch in 0..3 {
///     // ... import one batch ...
///     progress.report();
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Progress {
    bounds: Option<Arc<Bounds>>,
}

impl Progress {
    pub(crate) fn new(bounds: Option<Arc<Bounds>>) -> Self {
        Self {
            bounds: bounds.filter(|b| b.window.is_some()),
        }
    }

    /// Reports progress now: the lease is renewed while the last report is
    /// within its window. One atomic operation; never blocks.
    pub fn report(&self) {
        if let Some(bounds) = &self.bounds {
            bounds.report();
        }
    }

    /// Whether reports count: the lease has a progress window.
    #[must_use]
    pub fn is_bound(&self) -> bool {
        self.bounds.is_some()
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Progress");
        if let Some(bounds) = &self.bounds {
            d.field("window", &bounds.window)
                .field("last_report", &bounds.last_report());
        }
        d.finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(window: Duration, origin: Instant) -> Arc<Bounds> {
        let options = LeaseOptions::builder()
            .progress_window(window)
            .build()
            .expect("valid options");
        Bounds::of(&options, origin).expect("a progress window makes bounds")
    }

    /// A holder is stalled only once more than its window has passed since
    /// its last report (or the acquisition): a report exactly the window
    /// ago is still within it.
    #[tokio::test(start_paused = true)]
    async fn stalled_only_past_the_window() {
        let window = Duration::from_secs(20);
        let origin = Instant::now();
        let b = bounds(window, origin);
        assert!(
            !b.stalled(origin + window),
            "exactly the window after the acquisition"
        );
        assert!(b.stalled(origin + window + Duration::from_nanos(1)));
        tokio::time::advance(Duration::from_secs(2)).await;
        Progress::new(Some(Arc::clone(&b))).report();
        let reported = origin + Duration::from_secs(2);
        assert_eq!(b.last_report(), reported);
        assert!(!b.stalled(reported + window));
        assert!(b.stalled(reported + window + Duration::from_nanos(1)));
    }

    /// The reporter shows its window and last report, and nothing for a
    /// lease without a window.
    #[tokio::test(start_paused = true)]
    async fn a_reporter_shows_its_window() {
        let shown = format!(
            "{:?}",
            Progress::new(Some(bounds(Duration::from_secs(20), Instant::now())))
        );
        assert!(
            shown.contains("window: Some(20s)") && shown.contains("last_report"),
            "{shown}"
        );
        let unbound = format!("{:?}", Progress::new(None));
        assert!(!unbound.contains("window"), "{unbound}");
    }
}
