//! Scheduled jobs: each tick started once across a fleet, decided on the
//! server's clock.
//!
//! # How
//!
//! Every node of a fleet knows the same job ([`TickJob`]: its name, its
//! schedule's grid, its policies) and, when it fires for the tick `T`,
//! calls [`LeaseManager::run_tick`] (or lets
//! [`LeaseManager::run_schedule`] fire for it). The node asks the backend
//! with `T` and the tick after it; one atomic operation on the backend
//! (a Lua script on Redis) reads the *server's* clock and the job's record
//! and decides ([`TickBackend::decide_tick`]):
//!
//! - `T` still ahead of the server's clock: the node waits the "due in"
//!   and asks again (more than one period ahead is
//!   [`TickOutcome::ClockAhead`]: the node's clock is ahead);
//! - `T` at or below the highest tick decided: that decision
//!   ([`TickOutcome::Decided`]);
//! - `T` on time (the server's clock before the earlier of the next tick
//!   and `T` + the [start deadline](TickJobBuilder::start_deadline)): this
//!   node's run is granted the job's lease, an ordinary watchdog lease
//!   with a fencing token, and the start is recorded;
//! - `T` late: the [catch-up policy](TickJobBuilder::catch_up) decides
//!   ([`TickOutcome::Missed`], or a start as the newest tick);
//! - the previous run still holding the job's lease: the tick is skipped
//!   and recorded so ([`TickOutcome::Overlap`]).
//!
//! No node's clock decides whether a tick starts, so clocks may be any
//! distance apart: a node ahead waits, a node behind finds the tick
//! decided (or, alone, late: the policy decides). Every reply carries the
//! server's time, from which a node learns how far its clock is off and
//! fires on the server's clock from then on.
//!
//! The run ends with one atomic operation that records the completion and
//! releases the lease, checked against the run's fencing token
//! ([`TickBackend::complete_tick`]): a completion from an older run is
//! refused.
//!
//! # A run that dies
//!
//! A run whose lease ended without a completion (its node was killed,
//! stalled, or lost the lease) is *abandoned*. Under [`OnAbandon::Skip`]
//! (the default) the abandonment is recorded and the tick is not run
//! again: every tick starts at most once. Under [`OnAbandon::Rerun`] a
//! long-lived node ([`LeaseManager::run_schedule`]) that saw the run
//! start watches the job's lease and, when it is gone without a
//! completion, claims a re-run ([`TickBackend::claim_rerun`]): the claim
//! succeeds only while the abandoned run is still the record's, with a
//! higher fencing token. The job's body may then run twice for one tick:
//! use [`TickRun::tick`] as its idempotency key, and write through a store
//! that checks fencing tokens, so that the dead run's late writes are
//! refused once the re-run has written.
//!
//! # What is promised
//!
//! One start and at most one recorded completion per tick on a healthy
//! server, whatever the nodes' clocks; a server clock that steps back
//! starts no tick at or below the highest decided. The server is one clock
//! at a time, not for ever: a failover that lost the record's last writes
//! can start a tick again, with a higher fencing token when the new
//! master's clock is not behind the old one's by more than the time since
//! the first start, and a lower one when it is (the counter was lost with
//! the record). `wait_for_replicas` on the Redis backend narrows that
//! window (docs/reliability.md measures both).
//!
//! # How long a job's keys live
//!
//! The record lives the schedule's longest gap plus the start deadline
//! after each decision (at least a minute), refreshed by every tick; the
//! run's lease lives as any lease, renewed while the run runs.

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use leasehold_core::{
    AcquireRequest, BackendError, CatchUp, Completion, Decision, FencingToken, Grant, HolderId,
    JobName, LeaseBackend, OnAbandon, RunInfo, TickBackend, TickReason, TickReply, TickRequest,
};
use tracing::{Instrument, debug, info, warn};

use crate::attempt::Attempt;
use crate::metrics::Kind;
use crate::schedule::{ServerClock, TickGrid};
use crate::work::WorkContext;
use crate::{LeaseError, LeaseManager, LeaseOptions, LeaseOptionsBuilder};

/// The default start deadline: one minute. A tick may start until the
/// earlier of its next tick and this long after it, by the server's clock.
/// A minute covers a crontab host whose cron daemon fires at the start of
/// the minute and a command that starts slowly; a long-lived node asks
/// within milliseconds.
pub const DEFAULT_START_DEADLINE: Duration = Duration::from_secs(60);

/// The shortest lifetime of a job's record after a decision: one minute.
pub const MIN_RECORD_TTL: Duration = Duration::from_secs(60);

/// The longest lifetime of a job's record: 400 days, a yearly schedule's
/// gap with room to spare.
pub const MAX_RECORD_TTL: Duration = Duration::from_secs(400 * 24 * 60 * 60);

/// How many times a node asks again for a tick the server said is due
/// later: each wait is at most one period, and a node whose clock is off
/// is corrected after the first answer.
const DUE_ASKS: usize = 3;

/// A job run once per tick across a fleet: its name, its schedule's grid,
/// its policies, and the options of the lease a run holds.
///
/// ```
/// use std::time::Duration;
/// use leasehold_watchdog::{Every, LeaseOptions, TickJob};
///
/// let job = TickJob::builder("report", Every::new(Duration::from_secs(60))?)
///     .lease(LeaseOptions::builder().ttl(Duration::from_secs(10)).label("node-a"))
///     .build()?;
/// assert_eq!(job.name().as_str(), "report");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct TickJob {
    name: JobName,
    grid: Arc<dyn TickGrid>,
    start_deadline: Duration,
    catch_up: CatchUp,
    on_abandon: OnAbandon,
    lease: LeaseOptions,
    record_ttl: Duration,
    clock: Arc<ServerClock>,
}

impl fmt::Debug for TickJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickJob")
            .field("name", &self.name)
            .field("schedule", &self.grid.fingerprint())
            .field("start_deadline", &self.start_deadline)
            .field("catch_up", &self.catch_up)
            .field("on_abandon", &self.on_abandon)
            .finish_non_exhaustive()
    }
}

impl TickJob {
    /// A builder for the job called `name` on `grid`, with the default
    /// policies and lease options.
    pub fn builder(name: impl AsRef<str>, grid: impl TickGrid + 'static) -> TickJobBuilder {
        TickJobBuilder {
            name: name.as_ref().to_owned(),
            grid: Arc::new(grid),
            start_deadline: DEFAULT_START_DEADLINE,
            catch_up: CatchUp::None,
            on_abandon: OnAbandon::Skip,
            lease: LeaseOptions::builder(),
        }
    }

    /// The job's name.
    #[must_use]
    pub fn name(&self) -> &JobName {
        &self.name
    }

    /// The job's grid.
    #[must_use]
    pub fn grid(&self) -> &dyn TickGrid {
        &*self.grid
    }

    /// How long after a tick it may still start.
    #[must_use]
    pub fn start_deadline(&self) -> Duration {
        self.start_deadline
    }

    /// What becomes of a tick nobody started on time.
    #[must_use]
    pub fn catch_up(&self) -> CatchUp {
        self.catch_up
    }

    /// What becomes of a run abandoned by its node.
    #[must_use]
    pub fn on_abandon(&self) -> OnAbandon {
        self.on_abandon
    }

    /// How long the job's record lives after each decision: the grid's
    /// longest gap plus the start deadline, at least [`MIN_RECORD_TTL`].
    #[must_use]
    pub fn record_ttl(&self) -> Duration {
        self.record_ttl
    }

    /// The options of the lease a run holds.
    #[must_use]
    pub fn lease_options(&self) -> &LeaseOptions {
        &self.lease
    }

    /// This process's estimate of the server's clock: the server's time in
    /// the last answer, carried on by this process's monotonic clock;
    /// `None` before the first answer.
    #[must_use]
    pub fn server_now(&self) -> Option<SystemTime> {
        self.clock.now()
    }

    /// The tick this node should ask for when its scheduler fired at
    /// `fired_at` (its own wall clock). Before any answer from the server
    /// it is the grid's tick at or before `fired_at`: the server then says
    /// whether it is due, on time or late. Once the server's clock is
    /// known, it is the tick at or before the server's clock, or this
    /// node's own tick when that is ahead by less than a period (the
    /// server then says when it is due), so that a node whose clock is off
    /// asks for the tick the server is at. `None` when the grid has no
    /// tick before then.
    #[must_use]
    pub fn tick_to_ask(&self, fired_at: SystemTime) -> Option<SystemTime> {
        let own = self.grid.tick_at(fired_at);
        let Some(server_now) = self.clock.now() else {
            return own;
        };
        let server = self.grid.tick_at(server_now);
        match (own, server) {
            (Some(own), Some(server)) if own > server => {
                let ahead = own.duration_since(server_now).unwrap_or_default();
                let period = self
                    .grid
                    .next_after(server)
                    .and_then(|n| n.duration_since(server).ok())
                    .unwrap_or_default();
                Some(if ahead < period { own } else { server })
            }
            (own, None) => own,
            (_, server) => server,
        }
    }

    fn request(&self, tick: u64, next: u64, holder: HolderId) -> Result<TickRequest, LeaseError> {
        Ok(TickRequest::new(
            self.name.clone(),
            self.grid.fingerprint(),
            tick,
            next,
            self.run_request(holder)?,
        )
        .with_start_deadline(self.start_deadline)
        .with_catch_up(self.catch_up)
        .with_record_ttl(self.record_ttl))
    }

    pub(crate) fn run_request(&self, holder: HolderId) -> Result<AcquireRequest, LeaseError> {
        let mut request = AcquireRequest::new(self.name.run_key(), holder, self.lease.ttl());
        if let Some(label) = self.lease.label() {
            request = request.with_label(label)?;
        }
        Ok(request)
    }

    pub(crate) fn clock(&self) -> &ServerClock {
        &self.clock
    }
}

/// Builds a [`TickJob`]; every setter documents its default.
#[must_use]
pub struct TickJobBuilder {
    name: String,
    grid: Arc<dyn TickGrid>,
    start_deadline: Duration,
    catch_up: CatchUp,
    on_abandon: OnAbandon,
    lease: LeaseOptionsBuilder,
}

impl fmt::Debug for TickJobBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickJobBuilder")
            .field("name", &self.name)
            .field("schedule", &self.grid.fingerprint())
            .finish_non_exhaustive()
    }
}

impl TickJobBuilder {
    /// How long after a tick, by the server's clock, it may still start
    /// (a start must also come before the next tick). Default:
    /// [`DEFAULT_START_DEADLINE`] (1 minute).
    pub fn start_deadline(mut self, deadline: impl Into<Duration>) -> Self {
        self.start_deadline = deadline.into();
        self
    }

    /// What becomes of a tick nobody started on time. Default:
    /// [`CatchUp::None`].
    pub fn catch_up(mut self, policy: CatchUp) -> Self {
        self.catch_up = policy;
        self
    }

    /// What becomes of a run whose lease ended without a completion.
    /// Default: [`OnAbandon::Skip`].
    pub fn on_abandon(mut self, policy: OnAbandon) -> Self {
        self.on_abandon = policy;
        self
    }

    /// The options of the lease a run holds: its ttl (renewed while the
    /// run runs), its [`label`](LeaseOptionsBuilder::label) (which the
    /// record and the other nodes show), its progress window or renewal
    /// cap. The name is the job's; a run never waits. Default:
    /// [`LeaseOptions::default`].
    pub fn lease(mut self, lease: LeaseOptionsBuilder) -> Self {
        self.lease = lease;
        self
    }

    /// Checks the name, the deadline and the options.
    ///
    /// # Errors
    ///
    /// [`LeaseError::Invalid`] for a name that is empty, longer than 64
    /// bytes, or has characters other than ASCII letters, digits, `-`,
    /// `_` and `.`; [`LeaseError::InvalidTick`] for a zero start deadline
    /// or one not in whole milliseconds; every error of
    /// [`LeaseOptionsBuilder::build`], and [`LeaseError::InvalidOptions`]
    /// for options a run cannot use (a minimum hold, fair mode: the
    /// record decides who runs, not the lease's hold).
    pub fn build(self) -> Result<TickJob, LeaseError> {
        let name = JobName::new(&self.name)?;
        let invalid = |reason: String| LeaseError::InvalidTick {
            job: self.name.clone(),
            reason,
        };
        if self.start_deadline.is_zero()
            || !self.start_deadline.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(invalid(
                "the start deadline must be a positive whole number of milliseconds, such as 1m"
                    .to_owned(),
            ));
        }
        let lease = self.lease.name(self.name.clone()).build()?.with_wait(None);
        if lease.hold_at_least().is_some() || lease.fair().is_some() {
            return Err(LeaseError::InvalidOptions {
                reason: format!(
                    "job {:?}: a run's lease takes neither a minimum hold nor fair mode: the job's record decides who runs each tick",
                    self.name
                ),
            });
        }
        let record_ttl = self
            .grid
            .longest_gap()
            .saturating_add(self.start_deadline)
            .clamp(MIN_RECORD_TTL, MAX_RECORD_TTL);
        Ok(TickJob {
            name,
            grid: self.grid,
            start_deadline: self.start_deadline,
            catch_up: self.catch_up,
            on_abandon: self.on_abandon,
            lease,
            record_ttl,
            clock: Arc::new(ServerClock::default()),
        })
    }
}

/// What a run of a tick is given: the [`WorkContext`] every work under a
/// lease is given (its cancellation token, fencing token, progress
/// reporter, why and until when its lease holds; reached through `Deref`),
/// and the tick.
#[derive(Clone)]
pub struct TickRun {
    tick: SystemTime,
    work: WorkContext,
}

impl TickRun {
    /// The instant the tick was scheduled for: the same on every node, and
    /// on a re-run; use it as the run's idempotency key.
    #[must_use]
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    /// The context of the run's work, as `with_lease` and an election's
    /// term give it.
    #[must_use]
    pub fn work(&self) -> &WorkContext {
        &self.work
    }
}

impl std::ops::Deref for TickRun {
    type Target = WorkContext;

    fn deref(&self) -> &WorkContext {
        &self.work
    }
}

impl fmt::Debug for TickRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TickRun")
            .field("tick", &self.tick)
            .field("work", &self.work)
            .finish()
    }
}

/// What became of one node's attempt at a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickOutcome<T> {
    /// This node ran the tick and recorded its completion.
    Ran {
        /// The tick.
        tick: SystemTime,
        /// The fencing token of the run's lease.
        fencing_token: FencingToken,
        /// Why it ran: on time, as the newest late tick, or as a re-run.
        reason: TickReason,
        /// What the job returned.
        output: T,
    },
    /// The tick (or a later one) was decided already: by another node, or
    /// earlier by this one.
    Decided {
        /// The tick asked for.
        tick: SystemTime,
        /// The decision of the highest tick decided.
        decision: Decision,
    },
    /// The tick was asked for late and is recorded as missed.
    Missed {
        /// The tick.
        tick: SystemTime,
    },
    /// The previous run still held the job's lease: the tick is recorded
    /// as skipped.
    Overlap {
        /// The tick.
        tick: SystemTime,
        /// The run that held.
        running: RunInfo,
    },
    /// The tick is more than a period ahead of the server's clock: this
    /// node's clock is ahead. Nothing was recorded.
    ClockAhead {
        /// The tick.
        tick: SystemTime,
        /// How far ahead of the server's clock it was.
        ahead: Duration,
    },
    /// The job's record names another schedule: this node's schedule
    /// differs from the fleet's. Nothing was run or recorded.
    Conflict {
        /// The tick.
        tick: SystemTime,
        /// The record's fingerprint.
        fingerprint: String,
    },
}

impl<T> TickOutcome<T> {
    /// Whether this node ran the tick.
    #[must_use]
    pub fn ran(&self) -> bool {
        matches!(self, Self::Ran { .. })
    }
}

/// A tick's instant in UNIX milliseconds.
pub(crate) fn millis(tick: SystemTime, job: &JobName) -> Result<u64, LeaseError> {
    tick.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .ok_or_else(|| LeaseError::InvalidTick {
            job: job.to_string(),
            reason: "the tick is before 1970-01-01; pass the instant the schedule fired for"
                .to_owned(),
        })
}

/// The instant of UNIX milliseconds.
pub(crate) fn instant(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

pub(crate) fn ticks_of<'a, B: LeaseBackend>(
    backend: &'a B,
    op: &'static str,
    job: &JobName,
) -> Result<&'a impl TickBackend, LeaseError> {
    backend
        .ticks()
        .ok_or_else(|| LeaseError::Backend(BackendError::no_ticks(op, job)))
}

impl<B: LeaseBackend> LeaseManager<B> {
    /// Asks for the tick `tick` of `job` and, if the server's clock and
    /// the job's record grant it to this node, runs `work` under the run's
    /// lease and records its completion (see the [module](crate::tick)
    /// documentation for how, and what is promised).
    ///
    /// `tick` is the instant on the job's grid that this node fired for
    /// (the same on every node): [`TickJob::tick_to_ask`] names it. A tick
    /// still due on the server's clock is waited for (at most one period
    /// each time) and asked for again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{Every, LeaseManager, LeaseOptions, TickJob, TickOutcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = MemoryBackend::new();
    /// let (a, b) = (LeaseManager::new(fleet.clone())?, LeaseManager::new(fleet.clone())?);
    /// let job = |node: &str| {
    ///     TickJob::builder("report", Every::new(Duration::from_secs(60))?)
    ///         .lease(LeaseOptions::builder().label(node))
    ///         .build()
    /// };
    /// let (job_a, job_b) = (job("node-a")?, job("node-b")?);
    /// // The tick both nodes fired for: the latest on the grid.
    /// let tick = job_a.tick_to_ask(fleet.wall_clock()).expect("a tick");
    /// let ran = a.run_tick(&job_a, tick, |run| async move { run.fencing_token() }).await?;
    /// assert!(ran.ran());
    /// let skipped = b.run_tick(&job_b, tick, |_| async {}).await?;
    /// assert!(matches!(skipped, TickOutcome::Decided { .. }));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTick`] for a tick before 1970 or with no tick
    /// after it on the grid; [`LeaseError::Backend`] when the backend keeps
    /// no job records (Redlock) or could not be asked;
    /// [`LeaseError::LeaseEnded`] when the run's lease ended while the job
    /// ran (the job ran, perhaps in part; its completion is not recorded,
    /// and the run is abandoned).
    ///
    /// # Panics
    ///
    /// A panic in `work` is resumed after the run's lease is released
    /// (its completion is not recorded).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the job and releases the run's lease in
    /// the background, without a completion: the run is abandoned.
    pub async fn run_tick<F, Fut, T>(
        &self,
        job: &TickJob,
        tick: SystemTime,
        work: F,
    ) -> Result<TickOutcome<T>, LeaseError>
    where
        F: FnOnce(TickRun) -> Fut,
        Fut: Future<Output = T>,
    {
        let outcome = self.ask_tick(job, tick, work).await;
        if let Err(error) = &outcome {
            // Counted, so that a tick's error reaches a metric as well as
            // the caller, whatever the caller does with it.
            crate::metrics::tick_not_run(job.name.as_str(), crate::metrics::TICK_ERROR);
            debug!(job = %job.name, %error, "the tick failed");
        }
        outcome
    }

    async fn ask_tick<F, Fut, T>(
        &self,
        job: &TickJob,
        tick: SystemTime,
        work: F,
    ) -> Result<TickOutcome<T>, LeaseError>
    where
        F: FnOnce(TickRun) -> Fut,
        Fut: Future<Output = T>,
    {
        let ticks = ticks_of(self.backend(), "decide_tick", job.name())?;
        let at = millis(tick, job.name())?;
        let next = job
            .grid
            .next_after(tick)
            .ok_or_else(|| LeaseError::InvalidTick {
                job: job.name.to_string(),
                reason: "the schedule has no tick after this one".to_owned(),
            })?;
        let next = millis(next, job.name())?;
        let name = job.name.as_str();
        for _ in 0..DUE_ASKS {
            let request = job.request(at, next, HolderId::generate()?)?;
            let answer = job.clock.ask(|| ticks.decide_tick(&request)).await?;
            let decided = |why: &'static str| crate::metrics::tick_not_run(name, why);
            match answer.reply {
                TickReply::Due { wait } => {
                    debug!(
                        job = name,
                        tick = at,
                        ?wait,
                        "the tick is due later on the server's clock"
                    );
                    tokio::time::sleep(wait).await;
                }
                TickReply::ClockAhead { ahead } => {
                    decided(crate::metrics::TICK_CLOCK_AHEAD);
                    warn!(
                        job = name,
                        tick = at,
                        ?ahead,
                        "this node's clock is more than a period ahead of the server's; the tick was not asked for"
                    );
                    return Ok(TickOutcome::ClockAhead { tick, ahead });
                }
                TickReply::Conflict { fingerprint } => {
                    decided(crate::metrics::TICK_CONFLICT);
                    warn!(job = name, ours = %job.grid.fingerprint(), theirs = %fingerprint, "the job's record names another schedule; not run (roll the new schedule out to every node)");
                    return Ok(TickOutcome::Conflict { tick, fingerprint });
                }
                TickReply::Decided(decision) => {
                    decided(crate::metrics::TICK_DECIDED);
                    return Ok(TickOutcome::Decided { tick, decision });
                }
                TickReply::Missed => {
                    decided(crate::metrics::TICK_MISSED);
                    warn!(
                        job = name,
                        tick = at,
                        lag_ms = answer.server_time.saturating_sub(at),
                        "the tick was asked for late and is recorded as missed"
                    );
                    return Ok(TickOutcome::Missed { tick });
                }
                TickReply::Overlap { running } => {
                    decided(crate::metrics::TICK_OVERLAP);
                    info!(
                        job = name,
                        tick = at,
                        running = running.tick,
                        "the previous run still holds; the tick is skipped"
                    );
                    return Ok(TickOutcome::Overlap { tick, running });
                }
                TickReply::Granted { grant, reason } => {
                    crate::metrics::tick_lag(name, answer.server_time.saturating_sub(at));
                    return self.run_granted(job, tick, grant, reason, work).await;
                }
                _ => {
                    return Err(LeaseError::Backend(BackendError::UnexpectedReply {
                        op: "decide_tick",
                        key: job.name.run_key().as_str().to_owned(),
                        detail: "an answer this version does not know".to_owned(),
                    }));
                }
            }
        }
        // Still due after as many waits: the server's clock is not moving
        // as this node's is.
        Err(LeaseError::InvalidTick {
            job: job.name.to_string(),
            reason: format!(
                "the server still said the tick was due after {DUE_ASKS} waits; is its clock moving?"
            ),
        })
    }

    /// Runs `work` under the granted run's lease and ends it with a fenced
    /// completion.
    pub(crate) async fn run_granted<F, Fut, T>(
        &self,
        job: &TickJob,
        tick: SystemTime,
        grant: Grant,
        reason: TickReason,
        work: F,
    ) -> Result<TickOutcome<T>, LeaseError>
    where
        F: FnOnce(TickRun) -> Fut,
        Fut: Future<Output = T>,
    {
        let name = job.name.as_str();
        let key = grant.key.clone();
        let fencing_token = grant.fencing_token;
        let holder = grant.holder;
        let lease = self.register(
            key.clone(),
            grant,
            &job.lease,
            Attempt::Lease,
            Kind::Exclusive,
        )?;
        lease.open_span();
        crate::metrics::tick_ran(name, reason.as_str());
        info!(job = name, tick = ?tick, %fencing_token, reason = reason.as_str(), "running the tick");
        let run = TickRun {
            tick,
            work: WorkContext::of(&lease),
        };
        // Inside the lease's span (`Lease::span`).
        let outcome = AssertUnwindSafe(work(run).instrument(lease.span()))
            .catch_unwind()
            .await;
        let ended = lease.loss_reason();
        let completion = match lease.take_end() {
            None => None,
            Some(ending) => {
                let ticks = ticks_of(self.backend(), "complete_tick", &job.name)?;
                match ticks.complete_tick(&job.name, &holder, fencing_token).await {
                    Ok(completion) => {
                        ending.done();
                        Some(completion)
                    }
                    Err(error) => {
                        warn!(job = name, %error, "the completion could not be recorded; the lease is released in the background");
                        drop(ending);
                        if outcome.is_ok() && ended.is_none() {
                            return Err(error.into());
                        }
                        None
                    }
                }
            }
        };
        let output = match outcome {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(output) => output,
        };
        let reason = match (ended, completion) {
            (None, Some(Completion::Completed { .. })) => {
                return Ok(TickOutcome::Ran {
                    tick,
                    fencing_token,
                    reason,
                    output,
                });
            }
            (Some(reason), _) => reason,
            (None, _) => crate::LossReason::Lost,
        };
        // The run's lease ended without a completion: this node abandoned
        // it, and counts it as a watcher of a dead node's run would.
        crate::metrics::tick_abandoned(name);
        warn!(job = name, tick = ?tick, %fencing_token, ?reason, "the run's lease ended before its completion; the run is abandoned");
        Err(LeaseError::LeaseEnded {
            key: key.to_string(),
            reason,
        })
    }
}
