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
//! ```
//! use leasehold_watchdog::metrics;
//!
//! // After installing a recorder, so that it receives the descriptions.
//! metrics::describe();
//! assert_eq!(metrics::HOLD_TIME, "leasehold_lease_hold_seconds");
//! ```

// Names are taken as `&Cow<'static, str>`: cloning a borrowed `'static`
// name makes a label without copying it.
#![allow(clippy::ptr_arg)]

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold_core::LeaseKey;

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
/// (their lease ended without a completion) and settled, labelled `name`.
pub const TICK_ABANDONED: &str = "leasehold_tick_abandoned_total";
/// Gauge: how late, on the server's clock, the last run of a job this
/// process started began after its tick, labelled `name`.
pub const TICK_LAG: &str = "leasehold_tick_lag_seconds";

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

    const fn as_str(self) -> &'static str {
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

/// Renewal results of one batch, counted per lease name so that a batch of
/// a thousand leases costs one counter lookup per name and outcome, not one
/// per lease.
#[derive(Default)]
pub(crate) struct RenewalTally {
    // Few distinct names per batch: a linear scan beats hashing.
    counts: Vec<(Cow<'static, str>, [u64; 3])>,
}

/// Indices into a tally's counts.
pub(crate) const RENEWED: usize = 0;
pub(crate) const RENEW_LOST: usize = 1;
pub(crate) const RENEW_ERROR: usize = 2;
const RENEW_OUTCOMES: [&str; 3] = ["renewed", "lost", "error"];

impl RenewalTally {
    pub(crate) fn add(&mut self, name: &Cow<'static, str>, outcome: usize) {
        // Leases acquired with the same options share one name text, so the
        // pointers usually match and the texts need no comparing.
        let same = |n: &Cow<'static, str>| {
            std::ptr::eq(n.as_ptr(), name.as_ptr()) && n.len() == name.len() || n == name
        };
        match self.counts.iter_mut().find(|(n, _)| same(n)) {
            Some((_, counts)) => counts[outcome] += 1,
            None => {
                let mut counts = [0; 3];
                counts[outcome] = 1;
                self.counts.push((name.clone(), counts));
            }
        }
    }

    pub(crate) fn record(self) {
        for (name, counts) in self.counts {
            for (outcome, n) in RENEW_OUTCOMES.iter().zip(counts) {
                if n > 0 {
                    counter!(RENEWALS, LABEL_NAME => label(&name), LABEL_OUTCOME => *outcome)
                        .increment(n);
                }
            }
        }
    }
}
