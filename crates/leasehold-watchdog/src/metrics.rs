//! Metric names and the watchdog's recording hooks, through the `metrics`
//! facade.
//!
//! Nothing is recorded anywhere until the application installs a recorder
//! (such as `metrics-exporter-prometheus`). Every metric is labelled with
//! the lease *name* ([`LeaseOptions::name`](crate::LeaseOptions::name),
//! `"default"` unless set), plus a bounded outcome or reason; never with the
//! raw key or the holder id, so the number of series stays small whatever
//! the keys are. The metrics of one lease's life (acquisitions, acquire
//! wait, held, hold time, losses) also carry its [`LABEL_KIND`]: `exclusive`
//! for a lease from `acquire`, `permit` for one from `acquire_permit`,
//! `read` and `write` for the shares of a read-write lease; the kinds are a
//! fixed set that grows only with the library. docs/operations.md describes each
//! metric and suggests alerts.
//!
//! The histograms' buckets, for an exporter that needs them (Prometheus
//! exports a histogram without buckets as a summary, which the shipped
//! rules and dashboard cannot read), are [`BUCKETS`]; with the feature
//! `prometheus`, `install_prometheus_buckets` sets them all on a
//! `metrics_exporter_prometheus::PrometheusBuilder` in one call.
//!
//! ```
//! # // Hidden: the path differs between the facade (`leasehold::metrics`)
//! # // and this crate, and the facade shows this page as its own.
//! # use leasehold_watchdog::metrics;
//! // After installing a recorder, so that it receives the descriptions.
//! metrics::describe();
//! assert_eq!(metrics::HOLD_TIME, "leasehold_lease_hold_seconds");
//! ```

// Names are taken as `&Cow<'static, str>`: cloning a borrowed `'static`
// name makes a label without copying it.
#![allow(clippy::ptr_arg)]

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold_core::LeaseKey;
use tokio::time::Instant;

use ::metrics::{
    Key, Label, Level, Metadata, Unit, counter, describe_counter, describe_gauge,
    describe_histogram, gauge, histogram,
};

/// Counter: acquisitions, labelled `name`, `kind` and `outcome`
/// (`acquired`, `not_acquired` when the wait ran out, `busy` when the key's
/// local queue of waiters was full, `error` when the backend failed).
pub const ACQUISITIONS: &str = "leasehold_acquisitions_total";
/// Histogram, seconds: how long `acquire` (or `acquire_permit`) took,
/// waiting included, labelled `name`, `kind` and `outcome` (as for
/// [`ACQUISITIONS`]).
pub const ACQUIRE_WAIT: &str = "leasehold_acquire_wait_seconds";
/// Counter: renewal results, labelled `name` and `outcome` (`renewed`,
/// `lost` when the server no longer had the lease for us, `error` when the
/// backend failed and the renewal is retried). No `kind`: every kind is
/// renewed alike, in the same batches, and a lost renewal is counted by
/// kind in [`LOSSES`].
pub const RENEWALS: &str = "leasehold_renewals_total";
/// Histogram, seconds: the latency of one batch of renewals (one backend
/// round trip for up to 1,000 leases). Unlabelled: a batch mixes names.
pub const RENEWAL_LATENCY: &str = "leasehold_renew_batch_seconds";
/// Counter: leases whose holder's token was cancelled, labelled `name`,
/// `kind` and `reason` (`lost`, `renewal_limit`, `deadline`, `max_hold`,
/// `stalled`, `shutdown`): the `stalled` series of a name counts the stalls
/// of that job.
pub const LOSSES: &str = "leasehold_losses_total";
/// Gauge: leases currently held and kept by a watchdog, labelled `name`
/// and `kind`.
pub const HELD: &str = "leasehold_leases_held";
/// Histogram, seconds: how long a lease was held, recorded once when it
/// ends, labelled `name`, `kind` and `ended` (`released`, `dropped`,
/// `lost`, `renewal_limit`, `deadline`, `max_hold`, `stalled`, `shutdown`).
pub const HOLD_TIME: &str = "leasehold_lease_hold_seconds";
/// Gauge, seconds: the age of the oldest lease of a name and kind that this
/// process holds now (how long ago its acquisition was sent), labelled
/// `name` and `kind`: a two-hour job shows while it runs, not only in
/// [`HOLD_TIME`] once it ends.
///
/// Set by the watchdog after each batch of renewals, for the names and
/// kinds the batch renewed: at least once per renew interval while a lease
/// of the name is held, at no cost per lease beyond a comparison. It is the
/// process's: with several managers, the oldest of all their leases. When
/// the oldest lease ends, the gauge falls to the next oldest within one
/// renew interval (the leases still held are all renewed within it); when
/// the last one ends, to 0 when the watchdog learns of it: at once for a
/// loss, at its next wake (within a renew interval) for a release.
pub const OLDEST_AGE: &str = "leasehold_lease_oldest_age_seconds";
/// Gauge, seconds: the ttl of the leases of a name, labelled `name`; set by
/// every `acquire` (the last call's options win when several differ). Alert
/// rules compare durations with it.
pub const TTL: &str = "leasehold_lease_ttl_seconds";
/// Gauge, seconds: the safety margin of the leases of a name, labelled
/// `name`; set like [`TTL`]. Renewal latency near it leaves a holder told at
/// its deadline little time to stop.
pub const SAFETY_MARGIN: &str = "leasehold_lease_safety_margin_seconds";
/// Gauge: candidates of elections of a name alive in this process
/// ([`Election`](crate::Election) values not yet dropped), labelled `name`.
/// With [`HELD`], it tells whether an election has a leader: some process
/// has candidates and none holds a lease of that name.
pub const CANDIDATES: &str = "leasehold_election_candidates";
/// Gauge: waiters queued on the server for a lease in fair mode, as the
/// server last reported it to this process, by name.
pub const FAIR_QUEUED: &str = "leasehold_fair_queue_waiters";
/// Counter: runs of a scheduled job this process started
/// ([`LeaseManager::run_tick`](crate::LeaseManager::run_tick)), labelled
/// `name` (the job's name) and `reason`: `on-time`, `catch-up` or `rerun`.
/// Summed over the fleet, one per tick (two for a re-run tick).
pub const TICK_RUNS: &str = "leasehold_tick_runs_total";
/// Counter: ticks of a scheduled job this process asked for and did not
/// run, labelled `name` and `reason`: [`TICK_DECIDED`] (decided already,
/// most often by another node), [`TICK_MISSED`] (asked for late and
/// recorded as missed), [`TICK_OVERLAP`] (skipped: the previous run still
/// held), [`TICK_CLOCK_AHEAD`] (this node's clock is more than a period
/// ahead of the server's), [`TICK_CONFLICT`] (the record names another
/// schedule), [`TICK_ERROR`] (an error, returned to the caller too).
pub const TICK_SKIPS: &str = "leasehold_tick_skips_total";
/// Counter: runs of a scheduled job that this process found abandoned
/// (their lease ended without a completion), labelled `name`: its own runs
/// whose lease ended mid-run, and other nodes' runs it settled as a
/// watcher (recorded, or re-run).
pub const TICK_ABANDONED: &str = "leasehold_tick_abandoned_total";
/// Gauge: how late, on the server's clock, the last run of a job this
/// process started began after its tick, labelled `name`.
pub const TICK_LAG: &str = "leasehold_tick_lag_seconds";

/// Buckets, in seconds, for [`HOLD_TIME`]: from half a second to a day, so
/// that a quantile of short leases and of jobs of hours both resolve.
pub const HOLD_TIME_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 43200.0,
    86400.0,
];
/// Buckets, in seconds, for [`ACQUIRE_WAIT`]: from a millisecond (a free
/// key, one round trip) to five minutes of waiting.
pub const ACQUIRE_WAIT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Buckets, in seconds, for [`RENEWAL_LATENCY`]: from half a millisecond to
/// 5 s, fine around the safety margins (a tenth of the ttl by default,
/// 300 ms for a 3 s ttl) that `LeaseholdRenewalLatencyNearSafetyMargin`
/// compares the 99th percentile with.
pub const RENEWAL_LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0,
];
/// Every histogram and its buckets: what the shipped alert rules and
/// dashboard need to find `_bucket` series. Without the feature
/// `prometheus`, set them on the exporter yourself:
///
/// ```ignore
/// let mut builder = metrics_exporter_prometheus::PrometheusBuilder::new();
/// for (metric, buckets) in leasehold::metrics::BUCKETS {
///     builder = builder.set_buckets_for_metric(Matcher::Full(metric.to_owned()), buckets)?;
/// }
/// ```
pub const BUCKETS: [(&str, &[f64]); 3] = [
    (HOLD_TIME, HOLD_TIME_BUCKETS),
    (ACQUIRE_WAIT, ACQUIRE_WAIT_BUCKETS),
    (RENEWAL_LATENCY, RENEWAL_LATENCY_BUCKETS),
];

/// Sets [`BUCKETS`] on a Prometheus exporter's builder: every histogram
/// of leasehold is then exported with `_bucket` series, which the shipped
/// rules (deploy/prometheus/leasehold-rules.yml) and dashboard
/// (deploy/grafana/leasehold.json) read. Call it before `install`; a
/// bucket list of your own set afterwards for one of these metrics
/// replaces it.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use metrics_exporter_prometheus::PrometheusBuilder;
///
/// let builder = leasehold_watchdog::metrics::install_prometheus_buckets(PrometheusBuilder::new())?;
/// let recorder = builder.build_recorder(); // or `.install()`, with your listener
/// # drop(recorder);
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The builder's error for an empty bucket list, which these are not.
#[cfg(feature = "prometheus")]
pub fn install_prometheus_buckets(
    mut builder: metrics_exporter_prometheus::PrometheusBuilder,
) -> Result<metrics_exporter_prometheus::PrometheusBuilder, metrics_exporter_prometheus::BuildError>
{
    for (metric, buckets) in BUCKETS {
        builder = builder.set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(metric.to_owned()),
            buckets,
        )?;
    }
    Ok(builder)
}

/// Label: the lease name.
pub const LABEL_NAME: &str = "name";
/// Label: the outcome of an acquisition or renewal.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label: why a lease was lost, or why a tick was skipped.
pub const LABEL_REASON: &str = "reason";
/// Label: how a lease's hold ended.
pub const LABEL_ENDED: &str = "ended";
/// Label: the kind of lease, [`KIND_EXCLUSIVE`], [`KIND_PERMIT`],
/// [`KIND_READ`] or [`KIND_WRITE`].
pub const LABEL_KIND: &str = "kind";
/// The [`LABEL_KIND`] of a lease from `acquire`.
pub const KIND_EXCLUSIVE: &str = "exclusive";
/// The [`LABEL_KIND`] of a permit from `acquire_permit` (or of a lease
/// that `acquire` took on a permit key, `{K}:permit:i`, which is one).
pub const KIND_PERMIT: &str = "permit";
/// The [`LABEL_KIND`] of a reader's share from `acquire_read`.
pub const KIND_READ: &str = "read";
/// The [`LABEL_KIND`] of a writer's hold from `acquire_write`.
pub const KIND_WRITE: &str = "write";

/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: the tick (or a later
/// one) was decided already.
pub const TICK_DECIDED: &str = "decided";
/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: the tick was asked for
/// late and recorded as missed.
pub const TICK_MISSED: &str = "missed";
/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: the previous run still
/// held the job's lease.
pub const TICK_OVERLAP: &str = "overlap";
/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: this node's clock is
/// more than a period ahead of the server's.
pub const TICK_CLOCK_AHEAD: &str = "clock_ahead";
/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: the job's record names
/// another schedule.
pub const TICK_CONFLICT: &str = "conflict";
/// The [`LABEL_REASON`] of a [`TICK_SKIPS`] count: the ask or the run
/// ended in an error (the backend could not be asked, the run's lease was
/// lost, the completion could not be recorded).
pub const TICK_ERROR: &str = "error";

/// What kind of lease a metric is about: the value of [`LABEL_KIND`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A lease from `acquire`.
    Exclusive,
    /// A permit from `acquire_permit`.
    Permit,
    /// A reader's share from `acquire_read`.
    Read,
    /// The writer's hold from `acquire_write`.
    Write,
}

impl Kind {
    /// The kind of the lease on `key`: a permit key (`{K}:permit:i`) is a
    /// permit whichever call took it, as its fencing tokens and release
    /// notices are its semaphore's. Worked out once per acquisition: the
    /// lease keeps it in its [`Series`].
    pub(crate) fn of(key: &LeaseKey) -> Self {
        // Permit and share keys carry a hash tag, and a key without `{`
        // has none: most keys are told apart without parsing.
        if !key.as_str().contains('{') {
            return Self::Exclusive;
        }
        if key.permit_of().is_some() {
            Self::Permit
        } else {
            match key.rw_of() {
                Some((_, leasehold_core::RwRole::Writer)) => Self::Write,
                Some((_, leasehold_core::RwRole::Reader(_))) => Self::Read,
                _ => Self::Exclusive,
            }
        }
    }

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => KIND_EXCLUSIVE,
            Self::Permit => KIND_PERMIT,
            Self::Read => KIND_READ,
            Self::Write => KIND_WRITE,
        }
    }

    /// This kind's place in a [`SeriesCache`].
    const fn index(self) -> usize {
        match self {
            Self::Exclusive => 0,
            Self::Permit => 1,
            Self::Read => 2,
            Self::Write => 3,
        }
    }
}

/// What the `metrics` macros would say of a metric recorded here: this
/// module, at the `INFO` level. One value for every series, as the macros
/// make one per call site.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The labelled keys of the series that every acquisition and release of
/// the leases of one name and kind records into, built once per
/// [`LeaseOptions`](crate::LeaseOptions) value and kind (see
/// [`SeriesCache`]) and shared by each lease taken with them.
///
/// A key, not a handle (`Counter`, `Gauge`, `Histogram`): each recording
/// still asks the recorder in force at that moment (a local one, or the
/// global one installed after these options were first used) for the
/// handle of the key, and only the labelled key's building (a label list
/// and its hash) is saved. A handle kept here would bind the series to the
/// recorder of its first use for good. Rarer outcomes (a refusal, a loss,
/// any other end of a hold) build their keys when they happen.
pub(crate) struct Series {
    /// The lease name, as given to the options.
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: Kind,
    /// [`ACQUISITIONS`] and [`ACQUIRE_WAIT`] with `outcome="acquired"`.
    acquired: Key,
    acquired_wait: Key,
    ttl: Key,
    safety_margin: Key,
    held: Key,
    /// [`HOLD_TIME`] with `ended="released"`.
    released: Key,
}

impl Series {
    pub(crate) fn new(name: Cow<'static, str>, kind: Kind) -> Self {
        let kind_str = kind.as_str();
        let named = |metric: &'static str, extra: Option<(&'static str, &'static str)>| {
            // In the order the macros below put them: name, kind, then
            // the outcome or the end.
            let mut labels = vec![
                Label::new(LABEL_NAME, label(&name)),
                Label::from_static_parts(LABEL_KIND, kind_str),
            ];
            if let Some((key, value)) = extra {
                labels.push(Label::from_static_parts(key, value));
            }
            Key::from_parts(metric, labels)
        };
        let name_only = |metric: &'static str| {
            Key::from_parts(metric, vec![Label::new(LABEL_NAME, label(&name))])
        };
        Self {
            acquired: named(ACQUISITIONS, Some((LABEL_OUTCOME, ACQUIRED))),
            acquired_wait: named(ACQUIRE_WAIT, Some((LABEL_OUTCOME, ACQUIRED))),
            ttl: name_only(TTL),
            safety_margin: name_only(SAFETY_MARGIN),
            held: named(HELD, None),
            released: named(HOLD_TIME, Some((LABEL_ENDED, RELEASED))),
            name,
            kind,
        }
    }
}

/// The outcome of an acquisition that got its lease.
pub(crate) const ACQUIRED: &str = "acquired";
/// How the hold of a lease its handle released ended.
pub(crate) const RELEASED: &str = "released";

/// The [`Series`] of one [`LeaseOptions`](crate::LeaseOptions) value, per
/// kind, made on first use. Clones of the options share what was made
/// before the clone; the name cannot change after `build`, so no entry
/// goes stale.
#[derive(Clone, Default)]
pub(crate) struct SeriesCache([OnceLock<Arc<Series>>; 4]);

impl SeriesCache {
    /// The series of the leases of `kind` named `name` (the options' name).
    pub(crate) fn get(&self, name: &Cow<'static, str>, kind: Kind) -> &Arc<Series> {
        self.0[kind.index()].get_or_init(|| Arc::new(Series::new(name.clone(), kind)))
    }
}

/// Derived from the options' name alone: two options equal in every
/// setting are equal whatever either has cached.
impl PartialEq for SeriesCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SeriesCache {}

/// Describes every metric (unit and meaning) to the installed recorder.
///
/// Starting a [`LeaseManager`](crate::LeaseManager) calls it, so it is only
/// needed when the recorder is installed after the first manager was
/// created. Calling it again is harmless.
pub fn describe() {
    describe_counter!(
        ACQUISITIONS,
        Unit::Count,
        "Lease acquisitions by kind and outcome."
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "Time spent in acquire, waiting included, by kind and outcome."
    );
    describe_counter!(RENEWALS, Unit::Count, "Lease renewals by outcome.");
    describe_histogram!(
        RENEWAL_LATENCY,
        Unit::Seconds,
        "Latency of one batch of lease renewals."
    );
    describe_counter!(
        LOSSES,
        Unit::Count,
        "Leases whose holder was told to stop, by kind and reason."
    );
    describe_gauge!(HELD, Unit::Count, "Leases currently held, by kind.");
    describe_histogram!(
        HOLD_TIME,
        Unit::Seconds,
        "How long leases were held, recorded when each ends, by kind and how it ended."
    );
    describe_gauge!(
        OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest lease of a name and kind held by this process now."
    );
    describe_gauge!(TTL, Unit::Seconds, "The ttl of the leases of a name.");
    describe_gauge!(
        SAFETY_MARGIN,
        Unit::Seconds,
        "The safety margin of the leases of a name."
    );
    describe_gauge!(
        FAIR_QUEUED,
        Unit::Count,
        "Waiters queued on the server for a lease in fair mode, as last reported, by name."
    );
    describe_counter!(
        TICK_RUNS,
        Unit::Count,
        "Runs of a scheduled job this process started, by reason (on-time, catch-up, rerun)."
    );
    describe_counter!(
        TICK_SKIPS,
        Unit::Count,
        "Ticks of a scheduled job this process asked for and did not run, by reason."
    );
    describe_counter!(
        TICK_ABANDONED,
        Unit::Count,
        "Runs of a scheduled job found abandoned (lease ended without a completion) and settled here."
    );
    describe_gauge!(
        TICK_LAG,
        Unit::Seconds,
        "How late, on the server's clock, the last run of a job started here began after its tick."
    );
    describe_gauge!(
        CANDIDATES,
        Unit::Count,
        "Election candidates alive in this process."
    );
}

fn label(name: &Cow<'static, str>) -> ::metrics::SharedString {
    // Borrowed names (the usual `&'static str`) are not copied.
    ::metrics::SharedString::from(name.clone())
}

pub(crate) fn acquired(
    series: &Series,
    outcome: &'static str,
    waited: Duration,
    ttl: Duration,
    safety_margin: Duration,
) {
    ::metrics::with_recorder(|recorder| {
        if outcome == ACQUIRED {
            recorder
                .register_counter(&series.acquired, &METADATA)
                .increment(1);
            recorder
                .register_histogram(&series.acquired_wait, &METADATA)
                .record(waited);
        } else {
            let (name, kind) = (&series.name, series.kind.as_str());
            counter!(ACQUISITIONS, LABEL_NAME => label(name), LABEL_KIND => kind, LABEL_OUTCOME => outcome)
                .increment(1);
            histogram!(ACQUIRE_WAIT, LABEL_NAME => label(name), LABEL_KIND => kind, LABEL_OUTCOME => outcome)
                .record(waited);
        }
        recorder.register_gauge(&series.ttl, &METADATA).set(ttl);
        recorder
            .register_gauge(&series.safety_margin, &METADATA)
            .set(safety_margin);
    });
}

pub(crate) fn fair_queued(name: &Cow<'static, str>, queued: u32) {
    gauge!(FAIR_QUEUED, LABEL_NAME => label(name)).set(f64::from(queued));
}

pub(crate) fn candidates(name: &Cow<'static, str>, delta: f64) {
    gauge!(CANDIDATES, LABEL_NAME => label(name)).increment(delta);
}

pub(crate) fn held(series: &Series, delta: f64) {
    ::metrics::with_recorder(|recorder| {
        recorder
            .register_gauge(&series.held, &METADATA)
            .increment(delta);
    });
}

pub(crate) fn ended(series: &Series, ended: &'static str, held_for: Duration) {
    held(series, -1.0);
    if ended == RELEASED {
        ::metrics::with_recorder(|recorder| {
            recorder
                .register_histogram(&series.released, &METADATA)
                .record(held_for);
        });
    } else {
        let (name, kind) = (&series.name, series.kind.as_str());
        histogram!(HOLD_TIME, LABEL_NAME => label(name), LABEL_KIND => kind, LABEL_ENDED => ended)
            .record(held_for);
    }
}

pub(crate) fn lost(series: &Series, reason: &'static str) {
    let (name, kind) = (&series.name, series.kind.as_str());
    counter!(LOSSES, LABEL_NAME => label(name), LABEL_KIND => kind, LABEL_REASON => reason)
        .increment(1);
}

pub(crate) fn tick_ran(name: &str, reason: &'static str) {
    counter!(TICK_RUNS, LABEL_NAME => name.to_owned(), LABEL_REASON => reason).increment(1);
}

pub(crate) fn tick_not_run(name: &str, reason: &'static str) {
    counter!(TICK_SKIPS, LABEL_NAME => name.to_owned(), LABEL_REASON => reason).increment(1);
}

pub(crate) fn tick_abandoned(name: &str) {
    counter!(TICK_ABANDONED, LABEL_NAME => name.to_owned()).increment(1);
}

pub(crate) fn tick_lag(name: &str, lag_ms: u64) {
    #[allow(clippy::cast_precision_loss)] // a lag in ms is far below 2^52
    let seconds = lag_ms as f64 / 1000.0;
    gauge!(TICK_LAG, LABEL_NAME => name.to_owned()).set(seconds);
}

pub(crate) fn renew_batch(latency: Duration) {
    histogram!(RENEWAL_LATENCY).record(latency);
}

/// Indices into a row's renewal counts.
pub(crate) const RENEWED: usize = 0;
pub(crate) const RENEW_LOST: usize = 1;
pub(crate) const RENEW_ERROR: usize = 2;
const RENEW_OUTCOMES: [&str; 3] = ["renewed", "lost", "error"];

/// A lease as the age gauge knows it: when its acquisition was sent, and
/// which lease it is (the address of its shared state, unique while the
/// watchdog keeps the lease, which is as long as a row refers to it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Since {
    at: Instant,
    lease: usize,
}

impl Since {
    pub(crate) fn of(shared: &Arc<crate::shared::Shared>) -> Self {
        Self {
            at: shared.acquired_at,
            lease: Arc::as_ptr(shared).addr(),
        }
    }

    fn older(self, other: Option<Self>) -> Self {
        match other {
            Some(other) if other.at <= self.at => other,
            _ => self,
        }
    }
}

/// No row: a slot without a lease.
pub(crate) const NO_ROW: u32 = u32::MAX;

/// What the watchdog keeps per lease name and kind (a *row*), for
/// [`RENEWALS`] and [`OLDEST_AGE`]: how many of its leases are of the
/// row, the oldest of them, and the renewal results of the batch being
/// handled.
///
/// A lease's row is looked up once, when the watchdog takes the lease in
/// (the row of the previous lease first: leases come in runs of one
/// options value), and kept beside the lease: a renewal then counts by
/// index, without comparing names, and notes its acquisition time if it is
/// the batch's oldest (one comparison). Per batch, each row it touched
/// makes its counter updates and publishes its oldest lease once.
///
/// The oldest lease is known exactly while it is held: each lease taken in
/// replaces it if older, and each renewed one too. When it ends, the next
/// oldest is not known until every lease of the row has been renewed once
/// more, within a renew interval; meanwhile the oldest renewed since
/// stands in, and nothing is published.
///
/// The gauge is the process's: every watchdog (one per manager) publishes
/// its oldest lease of a name and kind to the same [`AgeCell`], and the
/// gauge shows the oldest of them.
pub(crate) struct Rows {
    rows: Vec<Row>,
    /// Each row by name, then kind ([`NO_ROW`] where none).
    by_name: HashMap<Cow<'static, str>, [u32; 4]>,
    /// The row last looked up.
    last: Option<u32>,
    /// The rows the current batch counted in.
    touched: Vec<u32>,
    /// This watchdog, in the age cells.
    id: u64,
}

struct Row {
    name: Cow<'static, str>,
    kind: Kind,
    /// The process's oldest lease of this name and kind, by watchdog.
    cell: Arc<AgeCell>,
    /// Leases of the row that the watchdog keeps and that have not ended.
    held: u64,
    /// The oldest of them, when known.
    oldest: Option<Since>,
    /// In the current batch: renewal outcomes, the oldest lease renewed
    /// or retried, and whether the row is in [`Rows::touched`].
    counts: [u64; 3],
    batch_oldest: Option<Since>,
    touched: bool,
    /// This watchdog has an entry in the cell: the row's last lease
    /// leaving withdraws it (a lease that leaves before its first renewal
    /// costs no update).
    published: bool,
}

/// The oldest lease of one name and kind in each watchdog of the process
/// that published one, and the gauge's key: shared by the watchdogs, so
/// that the gauge is the process's oldest whichever manager holds it.
struct AgeCell {
    /// [`OLDEST_AGE`] with the name and kind as labels.
    key: Key,
    /// (watchdog, acquisition time of its oldest lease); few entries, one
    /// per manager holding leases of the name.
    oldest: std::sync::Mutex<Vec<(u64, Instant)>>,
}

impl AgeCell {
    /// The cell of `name` and `kind`, made on first use.
    fn of(name: &Cow<'static, str>, kind: Kind) -> Arc<Self> {
        type Cells = std::sync::Mutex<HashMap<(Cow<'static, str>, Kind), Arc<AgeCell>>>;
        static CELLS: OnceLock<Cells> = OnceLock::new();
        let mut cells = CELLS
            .get_or_init(Cells::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(cells.entry((name.clone(), kind)).or_insert_with(|| {
            Arc::new(Self {
                key: Key::from_parts(
                    OLDEST_AGE,
                    vec![
                        Label::new(LABEL_NAME, label(name)),
                        Label::from_static_parts(LABEL_KIND, kind.as_str()),
                    ],
                ),
                oldest: std::sync::Mutex::default(),
            })
        }))
    }

    /// Sets `watchdog`'s oldest lease (`None`: it holds none), and the
    /// gauge to the age, as of `now`, of the oldest of all.
    fn publish(&self, watchdog: u64, oldest: Option<Instant>, now: Instant) {
        let mut all = self
            .oldest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = all.iter().position(|(w, _)| *w == watchdog);
        match (mine, oldest) {
            (Some(i), Some(at)) => all[i].1 = at,
            (None, Some(at)) => all.push((watchdog, at)),
            (Some(i), None) => {
                all.swap_remove(i);
            }
            (None, None) => {}
        }
        let age = all
            .iter()
            .map(|(_, at)| *at)
            .min()
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        // Under the lock, so that two watchdogs' settings land in the
        // order they were worked out.
        ::metrics::with_recorder(|recorder| {
            recorder.register_gauge(&self.key, &METADATA).set(age);
        });
    }
}

impl Default for Rows {
    fn default() -> Self {
        static WATCHDOGS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        Self {
            rows: Vec::new(),
            by_name: HashMap::new(),
            last: None,
            touched: Vec::new(),
            id: WATCHDOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Rows {
    /// The row of the leases of `series`.
    pub(crate) fn row_of(&mut self, series: &Series) -> u32 {
        let (name, kind) = (&series.name, series.kind);
        if let Some(last) = self.last {
            let row = &self.rows[last as usize];
            // The row keeps its own copy of the name, so a pointer equal to
            // it is the same text (a `'static` name, usually).
            let same = std::ptr::eq(row.name.as_ptr(), name.as_ptr())
                && row.name.len() == name.len()
                || row.name == *name;
            if row.kind == kind && same {
                return last;
            }
        }
        let kinds = self.by_name.entry(name.clone()).or_insert([NO_ROW; 4]);
        let index = match kinds[kind.index()] {
            NO_ROW => {
                let index = u32::try_from(self.rows.len()).unwrap_or(NO_ROW - 1);
                kinds[kind.index()] = index;
                self.rows.push(Row {
                    cell: AgeCell::of(name, kind),
                    name: name.clone(),
                    kind,
                    held: 0,
                    oldest: None,
                    counts: [0; 3],
                    batch_oldest: None,
                    touched: false,
                    published: false,
                });
                index
            }
            index => index,
        };
        self.last = Some(index);
        index
    }

    /// A lease of `row` acquired at `since` is kept from now on.
    pub(crate) fn join(&mut self, row: u32, since: Since) {
        let Some(row) = self.rows.get_mut(row as usize) else {
            return;
        };
        row.held += 1;
        row.oldest = Some(since.older(row.oldest));
    }

    /// The lease `since` of `row` is no longer held (it ended, or its handle
    /// released it): it stops counting. The last lease of a row withdraws
    /// the row's age from the gauge at once.
    pub(crate) fn leave(&mut self, row: u32, since: Since) {
        let Some(row) = self.rows.get_mut(row as usize) else {
            return;
        };
        row.held = row.held.saturating_sub(1);
        if row.oldest.is_some_and(|o| o.lease == since.lease) {
            row.oldest = None;
        }
        if row.batch_oldest.is_some_and(|o| o.lease == since.lease) {
            row.batch_oldest = None;
        }
        if row.held == 0 {
            row.oldest = None;
            if std::mem::take(&mut row.published) {
                row.cell.publish(self.id, None, Instant::now());
            }
        }
    }

    /// Counts a renewal `outcome` of the lease `since` of `row` in the
    /// current batch.
    pub(crate) fn count(&mut self, row: u32, outcome: usize, since: Since) {
        let Some(r) = self.rows.get_mut(row as usize) else {
            return;
        };
        r.counts[outcome] += 1;
        // A lease found lost is no longer held; one whose renewal failed
        // still is (it is retried until its deadline).
        if outcome != RENEW_LOST {
            r.batch_oldest = Some(since.older(r.batch_oldest));
        }
        if !r.touched {
            r.touched = true;
            self.touched.push(row);
        }
    }

    /// Records the current batch: the renewal counts of each row it
    /// touched, and its oldest lease as of `now`.
    pub(crate) fn flush(&mut self, now: Instant) {
        for index in self.touched.drain(..) {
            let Some(row) = self.rows.get_mut(index as usize) else {
                continue;
            };
            row.touched = false;
            for (outcome, n) in RENEW_OUTCOMES.iter().zip(std::mem::take(&mut row.counts)) {
                if n > 0 {
                    counter!(RENEWALS, LABEL_NAME => label(&row.name), LABEL_OUTCOME => *outcome)
                        .increment(n);
                }
            }
            if let Some(oldest) = row.batch_oldest.take() {
                row.oldest = Some(oldest.older(row.oldest));
            }
            if let Some(oldest) = row.oldest.filter(|_| row.held > 0) {
                row.published = true;
                row.cell.publish(self.id, Some(oldest.at), now);
            }
        }
    }

    /// Every lease is let go (the watchdog stops): its ages are withdrawn.
    pub(crate) fn clear(&mut self) {
        let now = Instant::now();
        for row in &mut self.rows {
            row.held = 0;
            row.oldest = None;
            row.batch_oldest = None;
            if std::mem::take(&mut row.published) {
                row.cell.publish(self.id, None, now);
            }
        }
    }
}

/// A watchdog that ends without stopping (its runtime shut down) leaves
/// no age behind.
impl Drop for Rows {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Duration;

    use ::metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };
    use leasehold_core::MemoryBackend;

    use super::{BUCKETS, KIND_EXCLUSIVE, KIND_PERMIT, OLDEST_AGE};
    use crate::{LeaseManager, LeaseOptions, LossReason};

    /// A recorder that keeps the last value of every gauge, by name and
    /// labels (`name{k=v,...}`); counters and histograms go nowhere.
    #[derive(Default)]
    struct Gauges(Mutex<HashMap<String, Arc<AtomicU64>>>);

    impl Gauges {
        fn get(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let id = format!("{metric}{{{}}}", labels.join(","));
            let gauges = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            gauges
                .get(&id)
                .map(|g| f64::from_bits(g.load(std::sync::atomic::Ordering::Relaxed)))
        }
    }

    impl Recorder for Gauges {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
            Counter::noop()
        }
        fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let id = format!("{}{{{}}}", key.name(), labels.join(","));
            let mut gauges = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            Gauge::from_arc(Arc::clone(gauges.entry(id).or_default()))
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    /// Whether `value` is within 70 ms of `expected` seconds: renewals come
    /// up to a sixteenth of the renew interval (62.5 ms here) early.
    fn near(value: Option<f64>, expected: f64) -> bool {
        value.is_some_and(|v| (v - expected).abs() <= 0.07)
    }

    /// The age gauge, by name and kind, on the paused clock (leases of 3 s,
    /// renewed every second): the oldest lease's age as of the last
    /// renewal while it is held, then the next oldest's within a renew
    /// interval of its end, then 0 once none is left; a permit of the same
    /// name has a series of its own; a lost lease stops counting at once.
    /// The watchdog runs on this thread, which the local recorder covers.
    #[tokio::test(start_paused = true)]
    async fn the_oldest_age_follows_what_is_held() -> Result<(), Box<dyn std::error::Error>> {
        let gauges = Gauges::default();
        let _recorder = ::metrics::set_default_local_recorder(&gauges);
        let backend = MemoryBackend::new();
        let manager = LeaseManager::new(backend.clone())?;
        let options = LeaseOptions::builder()
            .ttl(Duration::from_secs(3))
            .name("aged")
            .build()?;
        let age = |kind: &str| gauges.get(OLDEST_AGE, &[("name", "aged"), ("kind", kind)]);
        let step = |secs: f64| tokio::time::sleep(Duration::from_secs_f64(secs));

        let a = manager.acquire("aged:a", &options).await?; // t = 0
        step(1.5).await;
        // Renewed once, at about 1 s: a second old then.
        assert!(near(age(KIND_EXCLUSIVE), 1.0), "{:?}", age(KIND_EXCLUSIVE));
        let b = manager.acquire("aged:b", &options).await?; // t = 1.5
        let permit = manager
            .acquire_permit("aged:pool", crate::PermitLimit::new(2)?, &options)
            .await?;
        step(4.25).await; // t = 5.75
        // The oldest is a's, whichever lease's batch set the gauge last
        // (b's and the permit's, at 5.5 s).
        assert!(near(age(KIND_EXCLUSIVE), 5.5), "{:?}", age(KIND_EXCLUSIVE));
        assert!(near(age(KIND_PERMIT), 4.0), "{:?}", age(KIND_PERMIT));

        // a released: from b's next renewal (6.5 s) on, b is the oldest.
        a.release().await?;
        step(1.0).await; // t = 6.75
        assert!(near(age(KIND_EXCLUSIVE), 5.0), "{:?}", age(KIND_EXCLUSIVE));
        step(1.0).await; // t = 7.75
        assert!(near(age(KIND_EXCLUSIVE), 6.0), "{:?}", age(KIND_EXCLUSIVE));

        // The last exclusive lease, lost: 0 at once.
        assert!(backend.vanish(b.key()));
        step(1.0).await;
        assert_eq!(b.loss_reason(), Some(LossReason::Lost));
        assert_eq!(age(KIND_EXCLUSIVE), Some(0.0));
        drop(b);

        // The permit, released: 0 within a renew interval (the handle's
        // release reaches the watchdog when it next wakes).
        assert!(
            age(KIND_PERMIT).is_some_and(|v| v > 5.0),
            "{:?}",
            age(KIND_PERMIT)
        );
        permit.release().await?;
        step(1.1).await;
        assert_eq!(age(KIND_PERMIT), Some(0.0));
        manager.shutdown().await;
        Ok(())
    }

    /// The gauge is the process's: with two managers holding leases of one
    /// name, it shows the older lease whichever watchdog set it last, and
    /// the one left when the other manager's last lease goes.
    #[tokio::test(start_paused = true)]
    async fn the_oldest_age_is_the_process_s() -> Result<(), Box<dyn std::error::Error>> {
        let gauges = Gauges::default();
        let _recorder = ::metrics::set_default_local_recorder(&gauges);
        let backend = MemoryBackend::new();
        let (first, second) = (
            LeaseManager::new(backend.client())?,
            LeaseManager::new(backend.client())?,
        );
        let options = LeaseOptions::builder()
            .ttl(Duration::from_secs(3))
            .name("shared-age")
            .build()?;
        let age = || {
            gauges.get(
                OLDEST_AGE,
                &[("name", "shared-age"), ("kind", KIND_EXCLUSIVE)],
            )
        };
        let step = |secs: f64| tokio::time::sleep(Duration::from_secs_f64(secs));

        let old = first.acquire("shared-age:old", &options).await?; // t = 0
        step(2.5).await;
        let young = second.acquire("shared-age:young", &options).await?; // t = 2.5
        step(2.25).await; // t = 4.75: first set 4 at 4 s, second 4.5 at 4.5 s
        assert!(near(age(), 4.5), "{:?}", age());
        // The older manager's lease goes: the younger's from its next renewal.
        old.release().await?;
        step(1.0).await; // t = 5.75: second set 3 at 5.5 s (first withdrew at 5 s)
        assert!(near(age(), 3.0), "{:?}", age());
        young.release().await?;
        step(1.1).await;
        assert_eq!(age(), Some(0.0));
        first.shutdown().await;
        second.shutdown().await;
        Ok(())
    }

    /// The bucket lists are what an exporter accepts: not empty, rising.
    #[test]
    fn the_buckets_rise() {
        for (metric, buckets) in BUCKETS {
            assert!(!buckets.is_empty(), "{metric}");
            assert!(
                buckets.windows(2).all(|w| w[0] < w[1]),
                "{metric}: {buckets:?}"
            );
        }
    }
}
