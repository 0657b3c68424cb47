//! What a caller may choose about one lease, with checked relations.

use std::borrow::Cow;
use std::time::Duration;

use leasehold_core::{AcquireRequest, LockDelay, PlaceTtl, Ttl, clock_drift};

use crate::{Backoff, LeaseError};

/// How a lease is acquired and kept.
///
/// Three durations must fit together: the **ttl** the server keeps the lease
/// for, the **renew interval** (a third of the ttl unless set), and the
/// **safety margin** before the end of the lease's certain validity at which
/// the holder's token fires when renewals have not come through. The
/// builder refuses a mix in which the first renewal could not happen before
/// that point.
///
/// A **lock-delay** (none by default) keeps the key taken on the server for
/// that long after the lease ends without a release; it changes nothing of
/// the three durations above, which all count from the ttl (see
/// [`LeaseOptionsBuilder::lock_delay`]). A **minimum hold** (none by
/// default) keeps the key taken on the server until the grant + that long
/// when the holder releases earlier (see
/// [`LeaseOptionsBuilder::hold_at_least`]).
///
/// Defaults follow Redisson's watchdog: a 30 s ttl renewed every 10 s.
///
/// ```
/// use std::time::Duration;
/// use leasehold_watchdog::LeaseOptions;
///
/// let options = LeaseOptions::builder()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(60))
///     .max_renewals(360)
///     .name("nightly-report")
///     .build()?;
/// assert_eq!(options.renew_interval(), Duration::from_secs(10) / 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    ttl: Ttl,
    renew_interval: Duration,
    safety_margin: Duration,
    wait: Option<Duration>,
    max_renewals: Option<u32>,
    backoff: Backoff,
    name: Cow<'static, str>,
    label: Option<String>,
    release_notices: bool,
    lock_delay: LockDelay,
    /// The minimum hold, validated in build(); never zero.
    hold_at_least: Option<Duration>,
    /// Fair mode's settings, when it is on; its place ttl checked in build().
    fair: Option<Fair>,
    hold_at_most: Option<Duration>,
    progress_window: Option<Duration>,
    /// The labelled metric keys of the leases taken with these options,
    /// built on first use rather than on every acquisition and release.
    series: crate::metrics::SeriesCache,
}

/// Every setting, and nothing of the metric keys cached beside them.
impl std::fmt::Debug for LeaseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseOptions")
            .field("ttl", &self.ttl)
            .field("renew_interval", &self.renew_interval)
            .field("safety_margin", &self.safety_margin)
            .field("wait", &self.wait)
            .field("max_renewals", &self.max_renewals)
            .field("backoff", &self.backoff)
            .field("name", &self.name)
            .field("label", &self.label)
            .field("release_notices", &self.release_notices)
            .field("lock_delay", &self.lock_delay)
            .field("hold_at_least", &self.hold_at_least)
            .field("fair", &self.fair)
            .field("hold_at_most", &self.hold_at_most)
            .field("progress_window", &self.progress_window)
            .finish()
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        // The default builder always passes its own checks.
        Self::from_parts(LeaseOptionsBuilder::default(), Ttl::DEFAULT)
    }
}

impl LeaseOptions {
    /// A builder starting from the defaults.
    pub fn builder() -> LeaseOptionsBuilder {
        LeaseOptionsBuilder::default()
    }

    /// Options with the given ttl and every other value at its default.
    ///
    /// A ttl always fits the default renew interval (a third of it) and
    /// safety margin (a tenth of it).
    #[must_use]
    pub fn with_ttl(ttl: Ttl) -> Self {
        Self::from_parts(LeaseOptionsBuilder::default(), ttl)
    }

    /// The options `b` describes, with its ttl checked as `ttl`.
    fn from_parts(b: LeaseOptionsBuilder, checked_ttl: Ttl) -> Self {
        let ttl = checked_ttl.get();
        Self {
            ttl: checked_ttl,
            renew_interval: b.renew_interval.unwrap_or(ttl / 3),
            safety_margin: b.safety_margin.unwrap_or(ttl / 10),
            wait: b.wait,
            max_renewals: b.max_renewals,
            backoff: b.backoff,
            name: b.name,
            label: b.label,
            release_notices: b.release_notices,
            // Checked in build(); the defaults have none.
            lock_delay: LockDelay::new(b.lock_delay).unwrap_or_default(),
            // Checked in build(); the defaults have none.
            hold_at_least: b
                .hold_at_least
                .and_then(|m| AcquireRequest::check_hold_at_least(m).ok().flatten()),
            // Checked in build(); the default is valid.
            fair: b.fair,
            hold_at_most: b.hold_at_most,
            progress_window: b.progress_window,
            series: crate::metrics::SeriesCache::default(),
        }
    }

    /// How long the server keeps the lease unless renewed.
    #[must_use]
    pub fn ttl(&self) -> Ttl {
        self.ttl
    }

    /// How often the watchdog renews the lease.
    #[must_use]
    pub fn renew_interval(&self) -> Duration {
        self.renew_interval
    }

    /// How long before the end of certain validity the token fires when
    /// renewals have not come through.
    #[must_use]
    pub fn safety_margin(&self) -> Duration {
        self.safety_margin
    }

    /// How long `acquire` waits for a held lease; `None` tries once.
    #[must_use]
    pub fn wait(&self) -> Option<Duration> {
        self.wait
    }

    /// The most renewals the watchdog makes; `None` for no limit.
    #[must_use]
    pub fn max_renewals(&self) -> Option<u32> {
        self.max_renewals
    }

    /// The retry backoff while waiting.
    #[must_use]
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The lease's name in metrics and logs (bounded; never the raw key).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as kept: a `'static` name is shared by every lease
    /// acquired with these options, not copied per lease.
    pub(crate) fn shared_name(&self) -> &Cow<'static, str> {
        &self.name
    }

    /// The metric keys of the leases of `kind` taken with these options.
    pub(crate) fn series(
        &self,
        kind: crate::metrics::Kind,
    ) -> &std::sync::Arc<crate::metrics::Series> {
        self.series.get(&self.name, kind)
    }

    /// The public label stored beside the lease.
    #[must_use]
    pub fn label(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// Whether a waiting `acquire` subscribes to release notices.
    #[must_use]
    pub fn release_notices(&self) -> bool {
        self.release_notices
    }

    /// How long the server keeps the key taken after the lease ends without
    /// a release (zero for none).
    #[must_use]
    pub fn lock_delay(&self) -> LockDelay {
        self.lock_delay
    }

    /// The minimum hold (ShedLock's `lockAtLeastFor`), if any: a release
    /// before the grant + this keeps the key taken on the server until then
    /// (see [`LeaseOptionsBuilder::hold_at_least`]).
    #[must_use]
    pub fn hold_at_least(&self) -> Option<Duration> {
        self.hold_at_least
    }

    /// Fair mode's settings when it is on (see
    /// [`LeaseOptionsBuilder::fair`]), else `None`.
    #[must_use]
    pub fn fair(&self) -> Option<Fair> {
        self.fair
    }

    /// Fair mode's place ttl, as checked by `build()` (the default when
    /// fair mode is off).
    pub(crate) fn place_ttl(&self) -> PlaceTtl {
        self.fair
            .and_then(|fair| PlaceTtl::new(fair.place_ttl).ok())
            .unwrap_or_default()
    }

    /// Whether a fair release may hand the lease to the queue's head.
    pub(crate) fn fair_handover(&self) -> bool {
        self.fair.is_some_and(|fair| fair.handover)
    }

    /// The longest the lease is held (see
    /// [`LeaseOptionsBuilder::hold_at_most`]); `None` for no maximum.
    #[must_use]
    pub fn hold_at_most(&self) -> Option<Duration> {
        self.hold_at_most
    }

    /// How recent the holder's last progress report must be for the lease
    /// to be renewed (see [`LeaseOptionsBuilder::progress_window`]); `None`
    /// when renewals do not depend on progress.
    #[must_use]
    pub fn progress_window(&self) -> Option<Duration> {
        self.progress_window
    }

    /// These options with another wait.
    pub(crate) fn with_wait(&self, wait: Option<Duration>) -> Self {
        Self {
            wait,
            ..self.clone()
        }
    }

    /// The time from sending a successful request to the moment the token
    /// fires if no later renewal succeeds: ttl − clock drift − safety margin.
    #[must_use]
    pub fn deadline_after(&self) -> Duration {
        // Checked in build(): the margin and drift are below the ttl.
        self.ttl
            .get()
            .saturating_sub(clock_drift(self.ttl.get()))
            .saturating_sub(self.safety_margin)
    }
}

/// Fair mode for an exclusive lease (see [`LeaseOptionsBuilder::fair`]):
/// how long a waiter's place in the server's queue lives, and whether a
/// release hands the lease to the head of the queue. One value, as the
/// two mean nothing without fair mode.
///
/// ```
/// use std::time::Duration;
/// use leasehold_watchdog::{Fair, LeaseOptions};
///
/// let options = LeaseOptions::builder()
///     .fair(Fair::default().with_place_ttl(Duration::from_secs(5)).with_handover(false))
///     .build()?;
/// assert_eq!(options.fair().map(|f| f.place_ttl()), Some(Duration::from_secs(5)));
/// # Ok::<(), leasehold_watchdog::LeaseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Fair {
    place_ttl: Duration,
    handover: bool,
}

impl Default for Fair {
    /// A place ttl of [`PlaceTtl::DEFAULT`] (2 s), with handover.
    fn default() -> Self {
        Self {
            place_ttl: PlaceTtl::DEFAULT.get(),
            handover: true,
        }
    }
}

impl Fair {
    /// How long a waiter's place on the server lives unless refreshed: a
    /// waiter refreshes it three times per place ttl, and one that died
    /// (its process killed) holds up the waiters behind it at most this
    /// long. From [`PlaceTtl::MIN`] to [`PlaceTtl::MAX`], in whole
    /// milliseconds, checked by [`LeaseOptionsBuilder::build`]. Default:
    /// [`PlaceTtl::DEFAULT`] (2 s).
    pub fn with_place_ttl(mut self, ttl: impl Into<Duration>) -> Self {
        self.place_ttl = ttl.into();
        self
    }

    /// Whether the release of a lease hands it to the head of the server's
    /// queue in the same step, so that the head holds it without asking
    /// (an owner switch then costs the release and its notice, not a third
    /// call). The price: the server keeps a handed-over lease for the
    /// head's *handover time* from its latest call (four thirds of the
    /// place ttl, plus the safety margin and the clock-drift allowance, at
    /// most the ttl), so a waiter that died while first holds the queue up
    /// that long instead of its place ttl. Off, the head asks for the
    /// lease itself after the release notice. A handover is announced by
    /// the release notice, so none happens for a waiter without notices
    /// ([`release_notices(false)`](LeaseOptionsBuilder::release_notices))
    /// or on a backend without them (Redis behind replica
    /// acknowledgements). Default: on.
    pub fn with_handover(mut self, on: bool) -> Self {
        self.handover = on;
        self
    }

    /// The place ttl (see [`with_place_ttl`](Self::with_place_ttl)).
    #[must_use]
    pub fn place_ttl(&self) -> Duration {
        self.place_ttl
    }

    /// Whether a release hands the lease to the head of the queue (see
    /// [`with_handover`](Self::with_handover)).
    #[must_use]
    pub fn handover(&self) -> bool {
        self.handover
    }
}

/// Builds [`LeaseOptions`]; every setter documents its default.
///
/// Every duration is given as anything that converts into a
/// [`Duration`] (a `Duration`, or a checked [`Ttl`], [`LockDelay`] or
/// [`PlaceTtl`]) and checked by [`build`](Self::build), which names what
/// is wrong.
#[derive(Debug, Clone)]
#[must_use]
pub struct LeaseOptionsBuilder {
    ttl: Duration,
    renew_interval: Option<Duration>,
    safety_margin: Option<Duration>,
    wait: Option<Duration>,
    max_renewals: Option<u32>,
    backoff: Backoff,
    name: Cow<'static, str>,
    label: Option<String>,
    release_notices: bool,
    lock_delay: Duration,
    hold_at_least: Option<Duration>,
    fair: Option<Fair>,
    hold_at_most: Option<Duration>,
    progress_window: Option<Duration>,
}

impl Default for LeaseOptionsBuilder {
    fn default() -> Self {
        Self {
            ttl: Ttl::DEFAULT.get(),
            renew_interval: None,
            safety_margin: None,
            wait: None,
            max_renewals: None,
            backoff: Backoff::default(),
            name: Cow::Borrowed("default"),
            label: None,
            release_notices: true,
            lock_delay: Duration::ZERO,
            hold_at_least: None,
            fair: None,
            hold_at_most: None,
            progress_window: None,
        }
    }
}

impl LeaseOptionsBuilder {
    /// The lease's ttl: a [`Ttl`] or a `Duration` within [`Ttl::MIN`] and
    /// [`Ttl::MAX`], in whole milliseconds (checked by
    /// [`build`](Self::build)). Default: 30 s.
    pub fn ttl(mut self, ttl: impl Into<Duration>) -> Self {
        self.ttl = ttl.into();
        self
    }

    /// How often to renew. Default: a third of the ttl.
    pub fn renew_interval(mut self, interval: impl Into<Duration>) -> Self {
        self.renew_interval = Some(interval.into());
        self
    }

    /// How long before the end of certain validity the token fires when
    /// renewals fail or hang. Default: a tenth of the ttl.
    pub fn safety_margin(mut self, margin: impl Into<Duration>) -> Self {
        self.safety_margin = Some(margin.into());
        self
    }

    /// How long `acquire` may wait for a held lease. Default: no waiting
    /// (one attempt).
    pub fn wait(mut self, wait: impl Into<Duration>) -> Self {
        self.wait = Some(wait.into());
        self
    }

    /// The most renewals to make; the token then fires before the last
    /// renewal's validity ends. Default: no limit.
    pub fn max_renewals(mut self, max: u32) -> Self {
        self.max_renewals = Some(max);
        self
    }

    /// The retry backoff while waiting. Default: 25 ms doubling to 500 ms,
    /// jittered.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The lease's name for metrics labels and logs: a bounded set such as
    /// `"nightly-report"`, never a raw key. Default: `"default"`.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = name.into();
        self
    }

    /// A public label stored beside the lease, such as a host or pod name.
    /// Default: none.
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Whether a waiting `acquire` subscribes to the backend's release
    /// notices and retries the moment the lease is freed; without them it
    /// polls on the backoff alone. Default: on.
    pub fn release_notices(mut self, on: bool) -> Self {
        self.release_notices = on;
        self
    }

    /// How long the key stays taken on the server after the lease ends
    /// without a release (its holder crashed, paused or was cut off), so
    /// that a stale holder whose downstream store cannot check fencing
    /// tokens has that long to notice and stop before anyone else gets the
    /// lease. A release frees the key at once.
    ///
    /// The server keeps the key for ttl + lock-delay from the grant and from
    /// every renewal, so others see it held that much longer; the holder's
    /// validity, deadline and safety margin still count from the ttl alone,
    /// so its token fires as early as without a delay. At most
    /// [`LockDelay::MAX`] (1 hour), in whole milliseconds; a [`LockDelay`]
    /// or a `Duration`. Default: zero (no delay).
    pub fn lock_delay(mut self, delay: impl Into<Duration>) -> Self {
        self.lock_delay = delay.into();
        self
    }

    /// The minimum hold (ShedLock's `lockAtLeastFor`), for scheduled jobs
    /// that every node of a fleet starts at "the same" time by clocks that
    /// differ: a release before the grant + `minimum` leaves the key taken
    /// on the server, still this holder's, until then, so that a node whose
    /// clock is late finds it taken and does not run the job again. The
    /// handle's release still returns at once and its token is cancelled
    /// as for any release; the server's clock, from the moment it granted
    /// the lease, decides when the key is free, and no release notice is
    /// sent when it frees itself (waiters ask again when the time left
    /// they were told runs out). A release after the minimum frees the key
    /// at once, as without one. Nor does a release under the minimum hand
    /// the lease to a waiter of this process.
    ///
    /// The minimum applies to a *release*: a holder that vanishes without
    /// one (crashed, cut off) leaves the key for its ttl (+ lock-delay)
    /// from its last renewal, as without a minimum; choose a ttl of at
    /// least the minimum if a crash must not end the minimum early.
    ///
    /// Exclusive leases only: [`build`](Self::build) refuses it with fair
    /// mode, and permits and read-write leases refuse options that carry
    /// it with [`LeaseError::NotApplicable`]. At most 24 hours ([`AcquireRequest::MAX_HOLD_AT_LEAST`]), in
    /// whole milliseconds; zero means none. Default: none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = MemoryBackend::new();
    /// let (this_host, late_host) = (LeaseManager::new(backend.clone())?, LeaseManager::new(backend)?);
    /// let nightly = LeaseOptions::builder()
    ///     .hold_at_least(Duration::from_secs(600))
    ///     .build()?;
    /// let lease = this_host.acquire("nightly", &nightly).await?;
    /// // The job is done in a minute...
    /// tokio::time::sleep(Duration::from_secs(60)).await;
    /// lease.release().await?;
    /// // ...and a host whose clock is five minutes late does not run it again.
    /// tokio::time::sleep(Duration::from_secs(240)).await;
    /// let again = late_host.acquire("nightly", &nightly).await;
    /// assert!(matches!(again, Err(LeaseError::NotAcquired { .. })));
    /// # Ok(()) }
    /// ```
    pub fn hold_at_least(mut self, minimum: impl Into<Duration>) -> Self {
        self.hold_at_least = Some(minimum.into());
        self
    }

    /// Fair mode: waiters of every process queue on the server in arrival
    /// order, and the lease goes to the first of them when it is free
    /// (the waiters of one manager still queue locally first, and only
    /// the first of them holds a place on the server). Without it, waiters
    /// of one manager are served in order, but across processes the
    /// release's first retry wins. A lease won this way is an ordinary
    /// lease. `fair` is [`Fair`] (its place ttl and handover) to turn it
    /// on, `None` to turn it off.
    ///
    /// Only exclusive leases (`acquire`, `with_lease`) queue fairly:
    /// permits and read-write leases refuse options in fair mode with
    /// [`LeaseError::NotApplicable`], and backends without a fair queue
    /// (Redlock) refuse it with
    /// [`leasehold_core::BackendError::Unsupported`]. Default: off.
    pub fn fair(mut self, fair: impl Into<Option<Fair>>) -> Self {
        self.fair = fair.into();
        self
    }

    /// The longest the lease may be held, counted from the moment its
    /// acquisition was sent (ShedLock's `lockAtMostFor`, kept by the
    /// watchdog). Renewals go on as usual until one would make the lease
    /// valid past that point; from then on the lease is not renewed, the
    /// token fires with [`LossReason::MaxHold`](crate::LossReason::MaxHold)
    /// when its last validity, less the safety margin, runs out — at most
    /// `max − safety margin` and more than `max − safety margin − renew
    /// interval` after the acquisition — and the watchdog releases it a
    /// safety margin later if the handle has not. At least the ttl.
    /// Default: none (renewed for as long as the handle lives).
    pub fn hold_at_most(mut self, max: impl Into<Duration>) -> Self {
        self.hold_at_most = Some(max.into());
        self
    }

    /// Binds the lease to the holder's progress: at each renewal the
    /// watchdog checks the last report made through the lease's
    /// [`Progress`](crate::Progress) handle (the acquisition counts as one),
    /// and renews only when it is at most `window` old. Otherwise the token
    /// fires with [`LossReason::Stalled`](crate::LossReason::Stalled) well
    /// before the server-side expiry, and the watchdog releases the lease a
    /// safety margin later if the handle has not, so another node can take
    /// over. A job that stops reporting loses its lease within `window` +
    /// one renew interval of its last report, never within `window`. At
    /// least the renew interval. Default: none (renewals do not depend on
    /// progress).
    pub fn progress_window(mut self, window: impl Into<Duration>) -> Self {
        self.progress_window = Some(window.into());
        self
    }

    /// Checks the durations against each other.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] with [`leasehold_core::InputError::InvalidTtl`]
    /// for a ttl out of its bounds or not in whole milliseconds.
    /// [`LeaseError::InvalidOptions`] when the renew interval is zero, or
    /// when the first renewal would not be due before the token's deadline
    /// (renew interval ≥ ttl − clock drift − safety margin), or when the
    /// margin is zero or leaves no validity. [`LeaseError::Invalid`] with
    /// [`leasehold_core::InputError::InvalidLockDelay`] for a lock-delay above
    /// [`LockDelay::MAX`] or not in whole milliseconds;
    /// [`leasehold_core::InputError::InvalidDuration`] for a fair mode's place
    /// ttl out of its bounds (see [`Fair::with_place_ttl`]);
    /// [`leasehold_core::InputError::InvalidHoldAtLeast`] for a minimum hold
    /// above 24 hours or not in whole milliseconds;
    /// [`LeaseError::InvalidOptions`] for a minimum hold in fair mode, a
    /// maximum hold shorter than the ttl, and a progress window shorter
    /// than the renew interval.
    pub fn build(self) -> Result<LeaseOptions, LeaseError> {
        let ttl = Ttl::new(self.ttl)?;
        LockDelay::new(self.lock_delay)?;
        if let Some(fair) = self.fair {
            PlaceTtl::new(fair.place_ttl)?;
        }
        if let Some(minimum) = self.hold_at_least
            && AcquireRequest::check_hold_at_least(minimum)?.is_some()
            && self.fair.is_some()
        {
            // A fair release hands the lease to the queue's head in the
            // same step: keeping it for a minimum would stall the queue.
            return Err(LeaseError::InvalidOptions {
                reason: "a minimum hold (hold_at_least) cannot be combined with fair mode: a fair release hands the lease on at once; turn one of them off".to_owned(),
            });
        }
        let options = LeaseOptions::from_parts(self, ttl);
        let ttl = options.ttl.get();
        let invalid = |reason: String| LeaseError::InvalidOptions { reason };
        if options.renew_interval.is_zero() {
            return Err(invalid(
                "the renew interval must be greater than zero".to_owned(),
            ));
        }
        if options.safety_margin.is_zero() {
            return Err(invalid(
                "the safety margin must be greater than zero: it is the holder's time to stop"
                    .to_owned(),
            ));
        }
        let usable = ttl.saturating_sub(clock_drift(ttl));
        if options.safety_margin >= usable {
            return Err(invalid(format!(
                "a safety margin of {} leaves nothing of a {} lease (after {} clock-drift allowance)",
                humantime::format_duration(options.safety_margin),
                options.ttl,
                humantime::format_duration(clock_drift(ttl)),
            )));
        }
        if options.renew_interval >= options.deadline_after() {
            return Err(invalid(format!(
                "renewing every {} is too late for a {} lease with a {} safety margin: renewals must be due before {} after each grant",
                humantime::format_duration(options.renew_interval),
                options.ttl,
                humantime::format_duration(options.safety_margin),
                humantime::format_duration(options.deadline_after()),
            )));
        }
        if let Some(max) = options.hold_at_most
            && max < ttl
        {
            // The first grant alone would outlast it.
            return Err(invalid(format!(
                "a maximum hold of {} is shorter than the {} ttl the lease is granted for: use a ttl of at most {} or a longer maximum",
                humantime::format_duration(max),
                options.ttl,
                humantime::format_duration(max),
            )));
        }
        if let Some(window) = options.progress_window
            && window < options.renew_interval
        {
            // Progress is checked once per renewal: a shorter window would
            // only pretend to be kept.
            return Err(invalid(format!(
                "a progress window of {} is shorter than the renew interval of {}, at which progress is checked: use a window of at least {}",
                humantime::format_duration(window),
                humantime::format_duration(options.renew_interval),
                humantime::format_duration(options.renew_interval),
            )));
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_fit_and_impossible_mixes_are_refused() -> Result<(), Box<dyn std::error::Error>> {
        let d = LeaseOptions::default();
        assert_eq!(d.ttl().get(), Duration::from_secs(30));
        assert_eq!(d.renew_interval(), Duration::from_secs(10));
        assert_eq!(d.safety_margin(), Duration::from_secs(3));
        assert_eq!(LeaseOptions::builder().build()?, d);
        let min = LeaseOptions::with_ttl(Ttl::new(Ttl::MIN)?);
        assert!(min.renew_interval() < min.deadline_after());

        let ttl = Ttl::parse("1s")?;
        for bad in [
            LeaseOptions::builder()
                .ttl(ttl)
                .renew_interval(Duration::ZERO),
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(Duration::ZERO),
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(Duration::from_secs(1)),
            LeaseOptions::builder()
                .ttl(ttl)
                .renew_interval(Duration::from_millis(900)),
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(Duration::from_millis(600))
                .renew_interval(Duration::from_millis(400)),
        ] {
            assert!(matches!(
                bad.build(),
                Err(LeaseError::InvalidOptions { .. })
            ));
        }
        Ok(())
    }

    /// A lock-delay is kept as given, leaves the durations the holder
    /// times itself by alone, and is refused beyond its ceiling.
    #[test]
    fn lock_delay_changes_nothing_the_holder_times_itself_by()
    -> Result<(), Box<dyn std::error::Error>> {
        let ttl = Ttl::parse("1s")?;
        let plain = LeaseOptions::builder().ttl(ttl).build()?;
        let delayed = LeaseOptions::builder()
            .ttl(ttl)
            .lock_delay(Duration::from_secs(2))
            .build()?;
        assert_eq!(plain.lock_delay(), LockDelay::ZERO);
        assert_eq!(delayed.lock_delay().get(), Duration::from_secs(2));
        assert_eq!(delayed.deadline_after(), plain.deadline_after());
        assert_eq!(delayed.renew_interval(), plain.renew_interval());
        assert_eq!(delayed.safety_margin(), plain.safety_margin());
        for bad in [
            Duration::from_secs(3601),
            Duration::from_micros(1500),
            Duration::MAX,
        ] {
            assert!(matches!(
                LeaseOptions::builder().ttl(ttl).lock_delay(bad).build(),
                Err(LeaseError::Invalid(
                    leasehold_core::InputError::InvalidLockDelay { .. }
                ))
            ));
        }
        Ok(())
    }

    /// A maximum hold below the ttl, and a progress window below the renew
    /// interval, are refused; both are kept as given otherwise.
    #[test]
    fn hold_at_most_and_progress_window_are_checked() -> Result<(), Box<dyn std::error::Error>> {
        let ttl = Ttl::parse("3s")?;
        let plain = LeaseOptions::builder().ttl(ttl).build()?;
        assert_eq!(
            (plain.hold_at_most(), plain.progress_window()),
            (None, None)
        );
        let bounded = LeaseOptions::builder()
            .ttl(ttl)
            .hold_at_most(Duration::from_secs(3))
            .progress_window(Duration::from_secs(1))
            .build()?;
        assert_eq!(bounded.hold_at_most(), Some(Duration::from_secs(3)));
        assert_eq!(bounded.progress_window(), Some(Duration::from_secs(1)));
        for bad in [
            LeaseOptions::builder()
                .ttl(ttl)
                .hold_at_most(Duration::from_millis(2999)),
            LeaseOptions::builder()
                .ttl(ttl)
                .progress_window(Duration::from_millis(999)),
        ] {
            assert!(matches!(
                bad.build(),
                Err(LeaseError::InvalidOptions { .. })
            ));
        }
        Ok(())
    }

    /// A minimum hold is kept as given (zero as none) and refused beyond its
    /// ceiling, below a millisecond, and in fair mode.
    #[test]
    fn hold_at_least_is_checked() -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(LeaseOptions::default().hold_at_least(), None);
        let ten = Duration::from_secs(600);
        let options = LeaseOptions::builder().hold_at_least(ten).build()?;
        assert_eq!(options.hold_at_least(), Some(ten));
        let zero = LeaseOptions::builder()
            .hold_at_least(Duration::ZERO)
            .build()?;
        assert_eq!(zero.hold_at_least(), None);
        for bad in [Duration::from_secs(86_401), Duration::from_micros(1_500)] {
            assert!(matches!(
                LeaseOptions::builder().hold_at_least(bad).build(),
                Err(LeaseError::Invalid(
                    leasehold_core::InputError::InvalidHoldAtLeast { .. }
                ))
            ));
        }
        assert!(matches!(
            LeaseOptions::builder()
                .hold_at_least(ten)
                .fair(Fair::default())
                .build(),
            Err(LeaseError::InvalidOptions { .. })
        ));
        Ok(())
    }

    /// Every duration is given the same way: a `Duration`, or the checked
    /// value that converts into one; the ttl is checked by `build()` as the
    /// other durations are, and out of bounds it is refused there.
    #[test]
    fn every_duration_input_takes_a_duration_or_its_checked_value()
    -> Result<(), Box<dyn std::error::Error>> {
        let from_values = LeaseOptions::builder()
            .ttl(Ttl::parse("6s")?)
            .lock_delay(LockDelay::parse("2s")?)
            .fair(Fair::default().with_place_ttl(PlaceTtl::new(Duration::from_secs(3))?))
            .build()?;
        let from_durations = LeaseOptions::builder()
            .ttl(Duration::from_secs(6))
            .lock_delay(Duration::from_secs(2))
            .fair(Fair::default().with_place_ttl(Duration::from_secs(3)))
            .build()?;
        assert_eq!(from_values, from_durations);
        assert_eq!(from_durations.ttl(), Ttl::parse("6s")?);
        assert_eq!(from_durations.renew_interval(), Duration::from_secs(2));
        assert_eq!(from_durations.place_ttl().get(), Duration::from_secs(3));
        for bad in [
            Duration::from_millis(99),
            Duration::from_secs(86_401),
            Duration::from_micros(1_500_500),
        ] {
            let built = LeaseOptions::builder().ttl(bad).build();
            assert!(
                matches!(
                    built,
                    Err(LeaseError::Invalid(
                        leasehold_core::InputError::InvalidTtl { .. }
                    ))
                ),
                "{bad:?}: {built:?}"
            );
        }
        Ok(())
    }

    /// Fair mode is one value: off by default, on with its defaults (2 s
    /// places, handover), each part set on the value, and off again with
    /// `None`.
    #[test]
    fn fair_mode_is_one_value() -> Result<(), Box<dyn std::error::Error>> {
        assert_eq!(LeaseOptions::default().fair(), None);
        let on = LeaseOptions::builder().fair(Fair::default()).build()?;
        let fair = on.fair().ok_or("fair mode is off")?;
        assert_eq!(
            (fair.place_ttl(), fair.handover()),
            (Duration::from_secs(2), true)
        );
        assert!(on.fair_handover());
        let set = Fair::default()
            .with_place_ttl(Duration::from_millis(500))
            .with_handover(false);
        assert!(!set.handover());
        let options = LeaseOptions::builder().fair(set).build()?;
        assert_eq!(options.fair(), Some(set));
        assert_eq!(options.place_ttl().get(), Duration::from_millis(500));
        assert!(!options.fair_handover());
        let off = LeaseOptions::builder().fair(set).fair(None).build()?;
        assert_eq!(off, LeaseOptions::default());
        Ok(())
    }

    /// Another wait changes the wait alone.
    #[test]
    fn with_wait_replaces_only_the_wait() -> Result<(), Box<dyn std::error::Error>> {
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("10s")?)
            .max_renewals(7)
            .name("report")
            .label("host-a")
            .build()?;
        let waiting = options.with_wait(Some(Duration::from_secs(10)));
        assert_eq!(waiting.wait(), Some(Duration::from_secs(10)));
        assert_eq!(waiting.with_wait(None), options);
        assert_eq!(waiting.label(), Some("host-a"));
        Ok(())
    }

    /// Debug shows every setting a user may need to see in a log, and
    /// nothing of the metric keys cached beside them.
    #[test]
    fn debug_shows_the_settings() -> Result<(), Box<dyn std::error::Error>> {
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("5s")?)
            .name("nightly-report")
            .build()?;
        let shown = format!("{options:?}");
        for part in [
            "LeaseOptions",
            "ttl",
            "renew_interval",
            "safety_margin",
            "nightly-report",
            "fair",
        ] {
            assert!(shown.contains(part), "{part} missing from {shown}");
        }
        assert!(!shown.contains("series"), "{shown}");
        Ok(())
    }
}
