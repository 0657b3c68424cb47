//! Scheduled jobs decided by the backend's clock: the vocabulary of a
//! job's record and the [`TickBackend`] capability that keeps it.
//!
//! A *job* runs once per *tick* of its schedule across a fleet. Each job
//! has one record on the backend (the server, for Redis): the highest tick
//! *decided*, the decision and its reason, the last run (its tick, fencing
//! token and state), the schedule's fingerprint, counts, and the backend
//! time it last saw. A node asks for tick `T` with the tick after it; one
//! atomic operation reads the backend's clock and decides (see
//! [`TickBackend::decide_tick`]), so the nodes' own clocks never decide
//! whether a tick starts.
//!
//! Instants are UNIX milliseconds on the backend's wall clock (`TIME` on
//! Redis); every answer carries the backend's time, so a node can fire on
//! it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::excerpt;
use crate::{AcquireRequest, BackendError, FencingToken, Grant, HolderId, InputError, LeaseKey};

/// The name of a scheduled job: 1 to [`JobName::MAX_LEN`] bytes of ASCII
/// letters, digits, `-`, `_` and `.`. It names the job's record and its
/// run's lease key ([`JobName::run_key`], `job:{<name>}:run`, whose hash
/// tag is the name, so the record and the run share one Redis Cluster
/// slot), and is the job's label in metrics.
///
/// ```
/// use leasehold_core::JobName;
/// let job = JobName::new("nightly-report")?;
/// assert_eq!(job.run_key().as_str(), "job:{nightly-report}:run");
/// assert!(JobName::new("no spaces").is_err());
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobName(Arc<str>);

impl JobName {
    /// The longest job name accepted, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates a job name.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidJob`] when it is empty, longer than
    /// [`JobName::MAX_LEN`] bytes, or holds anything but ASCII letters,
    /// digits, `-`, `_` and `.`.
    pub fn new(name: impl AsRef<str>) -> Result<Self, InputError> {
        let name = name.as_ref();
        let refuse = |reason| InputError::InvalidJob {
            job: excerpt(name),
            reason,
        };
        if name.is_empty() {
            return Err(refuse(
                "the job name is empty; name the job, such as \"nightly-report\"",
            ));
        }
        if name.len() > Self::MAX_LEN {
            return Err(refuse("a job name may be at most 64 bytes long"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(refuse(
                "a job name may hold only ASCII letters, digits, '-', '_' and '.': it names keys and is a metrics label",
            ));
        }
        Ok(Self(name.into()))
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The lease key of the job's runs: `job:{<name>}:run`. Every run of
    /// the job holds this one key, so a run that still holds it when the
    /// next tick is due makes that tick an overlap.
    #[must_use]
    pub fn run_key(&self) -> LeaseKey {
        // The name's characters are all valid in a key, and the key is
        // short: it cannot be refused.
        LeaseKey::new(format!("job:{{{}}}:run", self.0))
            .unwrap_or_else(|_| unreachable!("a valid job name makes a valid key"))
    }
}

impl fmt::Display for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::str::FromStr for JobName {
    type Err = InputError;
    fn from_str(s: &str) -> Result<Self, InputError> {
        Self::new(s)
    }
}

/// What becomes of a tick nobody started on time (see
/// [`TickBackend::decide_tick`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CatchUp {
    /// A late tick is recorded as missed and never run. The default.
    #[default]
    None,
    /// A late tick is run while it is still the newest tick of the
    /// schedule (the backend's clock is before the next one): after an
    /// outage, the newest missed tick runs once, and the older ones are
    /// missed.
    Latest,
}

impl CatchUp {
    /// The name used on the wire, in configuration and on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Latest => "latest",
        }
    }
}

impl std::str::FromStr for CatchUp {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Self::None),
            "latest" => Ok(Self::Latest),
            other => Err(format!(
                "unknown catch-up policy {other:?}: write \"none\" or \"latest\""
            )),
        }
    }
}

/// What becomes of a run whose lease ended without a completion (its node
/// died, stalled or lost the lease): the run is *abandoned*.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnAbandon {
    /// The abandonment is recorded and the tick is not run again: each
    /// tick starts at most once. The default.
    #[default]
    Skip,
    /// The newest tick decided while the dead run held is run again, with
    /// a higher fencing token (Quartz's `requestRecovery`): the job's body
    /// may then run twice for one tick, so hand it the tick as an
    /// idempotency key.
    Rerun,
}

impl OnAbandon {
    /// The name used in configuration and on the command line.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Rerun => "rerun",
        }
    }
}

impl std::str::FromStr for OnAbandon {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "skip" => Ok(Self::Skip),
            "rerun" => Ok(Self::Rerun),
            other => Err(format!(
                "unknown policy for abandoned runs {other:?}: write \"skip\" or \"rerun\""
            )),
        }
    }
}

/// A request to decide one tick of a job (see
/// [`TickBackend::decide_tick`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickRequest {
    /// The job.
    pub job: JobName,
    /// The schedule's fingerprint (its text and time zone): a node whose
    /// fingerprint differs from the record's is refused
    /// ([`TickReply::Conflict`]). At most [`TickRequest::MAX_FINGERPRINT`]
    /// bytes.
    pub fingerprint: String,
    /// The tick asked for, in UNIX milliseconds.
    pub tick: u64,
    /// The schedule's next tick after `tick`, in UNIX milliseconds (above
    /// `tick`): a tick is on time only before it, and `next - tick` is one
    /// period, the most a "due in" may be.
    pub next: u64,
    /// How long after `tick` it may still start (a start also needs to be
    /// before `next`).
    pub start_deadline: Duration,
    /// What becomes of a late tick.
    pub catch_up: CatchUp,
    /// How long the record lives after this decision: at least the
    /// schedule's longest gap plus the start deadline.
    pub record_ttl: Duration,
    /// The run's lease, granted on a start: its key is
    /// [`JobName::run_key`]; its holder, ttl and label are the run's.
    pub run: AcquireRequest,
}

impl TickRequest {
    /// The longest fingerprint accepted, in bytes.
    pub const MAX_FINGERPRINT: usize = 256;

    /// The default start deadline: one minute.
    pub const DEFAULT_START_DEADLINE: Duration = Duration::from_secs(60);

    /// The latest tick accepted, in UNIX milliseconds: 2^53, the largest
    /// integer a Lua number (a double) holds exactly (the year 287396).
    pub const MAX_TICK: u64 = 1 << 53;

    /// Checks that a backend can take the request: the run's lease is the
    /// job's run key, without a minimum hold (the record, not a kept key,
    /// decides each tick once); the next tick is after the tick and at
    /// most [`TickRequest::MAX_TICK`]; the fingerprint is at most
    /// [`TickRequest::MAX_FINGERPRINT`] bytes. Every backend calls it
    /// before anything is sent.
    ///
    /// # Errors
    ///
    /// [`BackendError::InvalidRequest`] naming what is wrong.
    pub fn check(&self, op: &'static str) -> Result<(), BackendError> {
        check_run(op, &self.job, &self.run)?;
        let refuse = |reason| Err(invalid(op, &self.job, reason));
        if self.next <= self.tick {
            return refuse("the next tick must be after the tick asked for");
        }
        if self.next > Self::MAX_TICK {
            return refuse("a tick must be at most 2^53 UNIX milliseconds");
        }
        if self.fingerprint.len() > Self::MAX_FINGERPRINT {
            return refuse("a schedule's fingerprint may be at most 256 bytes long");
        }
        Ok(())
    }

    /// A request for `tick` (followed by `next`) of `job` under the
    /// schedule `fingerprint`, whose run would hold `run`; with the
    /// default start deadline ([`TickRequest::DEFAULT_START_DEADLINE`]),
    /// no catch-up, and a record that lives one period plus the start
    /// deadline, at least a minute.
    #[must_use]
    pub fn new(
        job: JobName,
        fingerprint: impl Into<String>,
        tick: u64,
        next: u64,
        run: AcquireRequest,
    ) -> Self {
        let mut request = Self {
            job,
            fingerprint: fingerprint.into(),
            tick,
            next,
            start_deadline: Self::DEFAULT_START_DEADLINE,
            catch_up: CatchUp::None,
            record_ttl: Duration::ZERO,
            run,
        };
        request.record_ttl = (Duration::from_millis(next.saturating_sub(tick))
            + request.start_deadline)
            .max(Duration::from_secs(60));
        request
    }

    /// Sets the start deadline.
    #[must_use]
    pub fn with_start_deadline(mut self, deadline: Duration) -> Self {
        self.start_deadline = deadline;
        self
    }

    /// Sets the catch-up policy.
    #[must_use]
    pub fn with_catch_up(mut self, catch_up: CatchUp) -> Self {
        self.catch_up = catch_up;
        self
    }

    /// Sets how long the record lives after this decision.
    #[must_use]
    pub fn with_record_ttl(mut self, record_ttl: Duration) -> Self {
        self.record_ttl = record_ttl;
        self
    }
}

/// What a tick's decision was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TickState {
    /// A run was started for it, and is running or has ended without a
    /// completion being recorded yet.
    Started,
    /// Its run completed (a fenced completion was recorded).
    Completed,
    /// Nobody asked for it on time, and the catch-up policy did not run it.
    Missed,
    /// It was due while the previous run still held the job's lease.
    Skipped,
    /// Its run's lease ended without a completion.
    Abandoned,
}

impl TickState {
    /// The name used on the wire and in listings.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Completed => "completed",
            Self::Missed => "missed",
            Self::Skipped => "skipped",
            Self::Abandoned => "abandoned",
        }
    }

    /// Reads a name written by [`as_str`](Self::as_str).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "started" => Self::Started,
            "completed" => Self::Completed,
            "missed" => Self::Missed,
            "skipped" => Self::Skipped,
            "abandoned" => Self::Abandoned,
            _ => return None,
        })
    }
}

/// Why a tick was decided as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TickReason {
    /// Started: asked for before its start deadline and the next tick.
    OnTime,
    /// Started late, as the newest tick, under [`CatchUp::Latest`].
    CatchUp,
    /// Started again after its run was abandoned, under
    /// [`OnAbandon::Rerun`].
    Rerun,
    /// Missed: first asked for after its start deadline or the next tick.
    Late,
    /// Skipped: the previous run still held the job's lease.
    Overlap,
    /// Abandoned: the run's lease ended without a completion.
    LeaseEnded,
    /// Completed by its run.
    Done,
}

impl TickReason {
    /// The name used on the wire and in listings.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnTime => "on-time",
            Self::CatchUp => "catch-up",
            Self::Rerun => "rerun",
            Self::Late => "late",
            Self::Overlap => "overlap",
            Self::LeaseEnded => "lease-ended",
            Self::Done => "done",
        }
    }

    /// Reads a name written by [`as_str`](Self::as_str).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "on-time" => Self::OnTime,
            "catch-up" => Self::CatchUp,
            "rerun" => Self::Rerun,
            "late" => Self::Late,
            "overlap" => Self::Overlap,
            "lease-ended" => Self::LeaseEnded,
            "done" => Self::Done,
            _ => return None,
        })
    }
}

/// The decision recorded for a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// The tick, in UNIX milliseconds.
    pub tick: u64,
    /// What was decided.
    pub state: TickState,
    /// Why.
    pub reason: TickReason,
    /// The run it concerns, if any: the run started for it, or for a
    /// skipped tick the run that was still holding.
    pub run: Option<RunInfo>,
}

/// Who ran (or runs) a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunInfo {
    /// The tick the run is for, in UNIX milliseconds.
    pub tick: u64,
    /// The run's fencing token.
    pub fencing_token: FencingToken,
    /// The run's public label, if its lease has one.
    pub label: Option<String>,
}

/// The backend's answer to [`TickBackend::decide_tick`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickAnswer {
    /// The backend's wall clock when it decided, in UNIX milliseconds.
    pub server_time: u64,
    /// What it decided.
    pub reply: TickReply,
}

/// What the backend decided for a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickReply {
    /// The tick is still ahead of the backend's clock by `wait`, at most
    /// one period (`next - tick`): ask again then. Nothing was written.
    Due {
        /// How long until the tick, by the backend's clock.
        wait: Duration,
    },
    /// The tick is ahead of the backend's clock by more than one period:
    /// the node's clock is ahead. Nothing was written.
    ClockAhead {
        /// How far ahead the tick is, by the backend's clock.
        ahead: Duration,
    },
    /// The record's fingerprint differs: another schedule runs this job.
    /// Nothing was written.
    Conflict {
        /// The record's fingerprint.
        fingerprint: String,
    },
    /// The tick is at or below the highest tick decided: that decision
    /// (its `tick` says whether it is this tick's or a later one's).
    Decided(Decision),
    /// The tick was late and is now recorded as missed.
    Missed,
    /// The previous run still holds the job's lease: the tick is recorded
    /// as skipped.
    Overlap {
        /// The run that holds.
        running: RunInfo,
    },
    /// The tick is started here: the run's lease is granted (an ordinary
    /// lease of [`JobName::run_key`], to renew and end as any lease) and
    /// the start is recorded.
    Granted {
        /// The run's lease.
        grant: Grant,
        /// Why it was started: [`TickReason::OnTime`] or
        /// [`TickReason::CatchUp`].
        reason: TickReason,
    },
}

/// The backend's answer to [`TickBackend::complete_tick`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Completion {
    /// The completion is recorded and the run's lease is released.
    Completed {
        /// The backend's wall clock then, in UNIX milliseconds.
        server_time: u64,
    },
    /// The completion is refused: the token is not the current run's, or
    /// the run's lease is no longer the caller's. Nothing is recorded; the
    /// caller's lease, if it still had it, is released.
    Refused {
        /// The current run of the record, if any.
        current: Option<RunInfo>,
    },
}

/// A request to re-run (or record as abandoned) a run whose lease ended
/// without a completion (see [`TickBackend::claim_rerun`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RerunRequest {
    /// The job.
    pub job: JobName,
    /// The fencing token of the run seen abandoned.
    pub abandoned: FencingToken,
    /// Re-run it, or only record it as abandoned.
    pub on_abandon: OnAbandon,
    /// How long the record lives after this decision (as
    /// [`TickRequest::record_ttl`]).
    pub record_ttl: Duration,
    /// The new run's lease, granted under [`OnAbandon::Rerun`].
    pub run: AcquireRequest,
}

impl RerunRequest {
    /// A request to settle the run of `job` with the fencing token
    /// `abandoned` as `on_abandon` says, the record then living
    /// `record_ttl`, a re-run holding `run`.
    #[must_use]
    pub fn new(
        job: JobName,
        abandoned: FencingToken,
        on_abandon: OnAbandon,
        record_ttl: Duration,
        run: AcquireRequest,
    ) -> Self {
        Self {
            job,
            abandoned,
            on_abandon,
            record_ttl,
            run,
        }
    }
}

impl RerunRequest {
    /// Checks that a backend can take the request: the run's lease is the
    /// job's run key, without a minimum hold.
    ///
    /// # Errors
    ///
    /// [`BackendError::InvalidRequest`] naming what is wrong.
    pub fn check(&self, op: &'static str) -> Result<(), BackendError> {
        check_run(op, &self.job, &self.run)
    }
}

fn invalid(op: &'static str, job: &JobName, reason: &'static str) -> BackendError {
    BackendError::InvalidRequest {
        op,
        key: job.run_key().as_str().to_owned(),
        reason,
    }
}

/// A run's lease is the job's run key (what makes a run that still holds
/// an overlap), with no minimum hold.
fn check_run(op: &'static str, job: &JobName, run: &AcquireRequest) -> Result<(), BackendError> {
    if run.key != job.run_key() {
        return Err(invalid(
            op,
            job,
            "the run's lease must be the job's run key (JobName::run_key, \"job:{<name>}:run\")",
        ));
    }
    if run.hold_at_least_millis().is_some() {
        return Err(invalid(
            op,
            job,
            "a job's run lease takes no minimum hold: the job's record decides each tick once; acquire without hold_at_least",
        ));
    }
    Ok(())
}

/// The backend's answer to [`TickBackend::claim_rerun`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RerunReply {
    /// The run is recorded as abandoned ([`OnAbandon::Skip`]).
    Abandoned {
        /// The tick the abandoned run was for.
        tick: u64,
    },
    /// The newest decided tick is started again: the new run's lease.
    Granted {
        /// The tick re-run.
        tick: u64,
        /// The new run's lease (its fencing token is above the abandoned
        /// run's).
        grant: Grant,
    },
    /// Nothing to do: the abandoned token is no longer the current run
    /// (someone re-ran it, or a newer run started), or the run completed.
    Settled,
    /// The run's lease is still held: ask again when it may have ended.
    StillHeld {
        /// The time left on the lease.
        ttl_left: Option<Duration>,
    },
}

/// A run of a job as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The tick, token and label of the run.
    pub info: RunInfo,
    /// Whether it is running, completed, or abandoned (a run recorded as
    /// running whose lease is gone is reported abandoned).
    pub state: RunState,
    /// Why it was started.
    pub reason: TickReason,
    /// When it started, on the backend's clock (UNIX ms).
    pub started_at: u64,
    /// When it ended (completed or found abandoned), on the backend's
    /// clock (UNIX ms).
    pub ended_at: Option<u64>,
    /// The time left on its lease while it is held.
    pub ttl_left: Option<Duration>,
}

/// The state of a job's last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RunState {
    /// Its lease is held.
    Running,
    /// It recorded its completion.
    Completed,
    /// Its lease ended without a completion.
    Abandoned,
}

impl RunState {
    /// The name used on the wire and in listings.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Abandoned => "abandoned",
        }
    }

    /// Reads a name written by [`as_str`](Self::as_str).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => Self::Running,
            "completed" => Self::Completed,
            "abandoned" => Self::Abandoned,
            _ => return None,
        })
    }
}

/// How many ticks of a job went which way, over the record's life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobCounts {
    /// Runs started on time or by catch-up.
    pub started: u64,
    /// Runs that recorded their completion.
    pub completed: u64,
    /// Ticks missed.
    pub missed: u64,
    /// Ticks skipped for overlap.
    pub skipped: u64,
    /// Runs abandoned.
    pub abandoned: u64,
    /// Runs started again after an abandonment.
    pub reruns: u64,
}

/// A job's record, as [`TickBackend::job_record`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRecord {
    /// The job.
    pub job: JobName,
    /// The schedule's fingerprint.
    pub fingerprint: String,
    /// The highest tick decided, and its decision.
    pub decided: Decision,
    /// The last run, if one started in the record's life.
    pub run: Option<RunRecord>,
    /// The counts.
    pub counts: JobCounts,
    /// The backend's clock at the record's last write (UNIX ms).
    pub last_seen: u64,
    /// The backend's clock when read (UNIX ms).
    pub server_time: u64,
}

/// Scheduled jobs decided by the backend's clock: one record per job and
/// the atomic operations on it.
///
/// Implemented by a backend that has them, and returned by its
/// [`LeaseBackend::ticks`](crate::LeaseBackend::ticks).
pub trait TickBackend: Send + Sync {
    /// Decides `request.tick` of `request.job` in one atomic operation on
    /// the backend's clock (`now`, UNIX ms), in this order:
    ///
    /// 1. A record whose fingerprint differs: [`TickReply::Conflict`].
    /// 2. `tick > now`: [`TickReply::Due`] with `tick - now`, or
    ///    [`TickReply::ClockAhead`] when that is more than one period
    ///    (`next - tick`).
    /// 3. A run recorded as running whose lease is gone is recorded as
    ///    abandoned (and so is its tick's decision, if it is the highest).
    /// 4. `tick` at or below the highest decided tick: that decision,
    ///    [`TickReply::Decided`].
    /// 5. Late (`now` at or after the earlier of `next` and `tick` +
    ///    `start_deadline`): under [`CatchUp::Latest`] while `now < next`,
    ///    go on as on time (reason [`TickReason::CatchUp`]); otherwise
    ///    record the tick as missed, [`TickReply::Missed`].
    /// 6. The job's run lease held (by anyone): record the tick as skipped,
    ///    [`TickReply::Overlap`].
    /// 7. Grant the run's lease as [`LeaseBackend::try_acquire`] would
    ///    (fencing token from the run key's counter) and record the start:
    ///    [`TickReply::Granted`].
    ///
    /// Every write sets the record's fingerprint and last-seen time, and
    /// its expiry to `request.record_ttl`. With no record, a late tick is
    /// never granted except as the newest tick under
    /// [`CatchUp::Latest`]: a record lives past its highest tick's next
    /// tick plus the start deadline, so no tick at or below a forgotten
    /// decision is then the newest.
    ///
    /// [`LeaseBackend::try_acquire`]: crate::LeaseBackend::try_acquire
    fn decide_tick(
        &self,
        request: &TickRequest,
    ) -> impl Future<Output = Result<TickAnswer, BackendError>> + Send;

    /// Records the completion of the run of `job` with `fencing_token`
    /// and releases its lease, in one atomic operation: accepted only when
    /// that token is the record's current run, still running, and its
    /// lease is still `holder`'s ([`Completion::Completed`]); otherwise
    /// [`Completion::Refused`], and `holder`'s lease, if it still has it,
    /// is released all the same.
    fn complete_tick(
        &self,
        job: &JobName,
        holder: &HolderId,
        fencing_token: FencingToken,
    ) -> impl Future<Output = Result<Completion, BackendError>> + Send;

    /// Settles a run seen abandoned, in one atomic operation: when
    /// `request.abandoned` is still the record's current run, the run is
    /// not completed and its lease is gone, the run is recorded as
    /// abandoned (counted once) and, under [`OnAbandon::Rerun`], the
    /// newest decided tick is started again with `request.run`'s lease
    /// ([`RerunReply::Granted`], reason [`TickReason::Rerun`]).
    fn claim_rerun(
        &self,
        request: &RerunRequest,
    ) -> impl Future<Output = Result<RerunReply, BackendError>> + Send;

    /// Reads the record of `job`, without changing it: `None` when there
    /// is none.
    fn job_record(
        &self,
        job: &JobName,
    ) -> impl Future<Output = Result<Option<JobRecord>, BackendError>> + Send;

    /// Reads every job's record (on Redis, a scan of every master).
    fn job_records(&self) -> impl Future<Output = Result<Vec<JobRecord>, BackendError>> + Send;
}

// Constructors for backends outside this crate: the types are
// `#[non_exhaustive]`, so that fields can be added without a break.

impl RunInfo {
    /// A run of `tick` with `fencing_token` and `label`.
    #[must_use]
    pub fn new(tick: u64, fencing_token: FencingToken, label: Option<String>) -> Self {
        Self {
            tick,
            fencing_token,
            label,
        }
    }
}

impl Decision {
    /// The decision `state` for `tick`, for `reason`, about `run`.
    #[must_use]
    pub fn new(tick: u64, state: TickState, reason: TickReason, run: Option<RunInfo>) -> Self {
        Self {
            tick,
            state,
            reason,
            run,
        }
    }
}

impl TickAnswer {
    /// The answer `reply`, decided at `server_time` (UNIX ms).
    #[must_use]
    pub fn new(server_time: u64, reply: TickReply) -> Self {
        Self { server_time, reply }
    }
}

impl RunRecord {
    /// A run as its record keeps it.
    #[must_use]
    pub fn new(
        info: RunInfo,
        state: RunState,
        reason: TickReason,
        started_at: u64,
        ended_at: Option<u64>,
        ttl_left: Option<Duration>,
    ) -> Self {
        Self {
            info,
            state,
            reason,
            started_at,
            ended_at,
            ttl_left,
        }
    }
}

impl JobRecord {
    /// A job's record as read at `server_time` (UNIX ms).
    #[must_use]
    pub fn new(
        job: JobName,
        fingerprint: String,
        decided: Decision,
        run: Option<RunRecord>,
        counts: JobCounts,
        last_seen: u64,
        server_time: u64,
    ) -> Self {
        Self {
            job,
            fingerprint,
            decided,
            run,
            counts,
            last_seen,
            server_time,
        }
    }
}
