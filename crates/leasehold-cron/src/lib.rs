//! Once per tick across a fleet, for [tokio-cron-scheduler]: every replica
//! schedules the same cron job, and for each tick one of them runs it.
//!
//! [`fleet_job`] makes the [`Job`] that each replica adds to its own
//! [`JobScheduler`](tokio_cron_scheduler::JobScheduler). When the scheduler
//! fires, the job takes the tick's instant from the schedule's grid (the
//! latest instant of the schedule at or before the replica's clock, so
//! replicas whose clocks differ name the same tick) and hands it to
//! [`LeaseManager::run_tick`]: the first replica to ask runs the work under
//! the tick's lease, the others skip it. Clocks may differ by up to the
//! job's [`max_skew`](leasehold_watchdog::TickJobBuilder::max_skew) (5 s by default) without a
//! tick running twice; the [`leasehold_watchdog`] documentation of
//! `run_tick` says what is promised, and what is not.
//!
//! ```no_run
//! use leasehold_cron::fleet_job;
//! use leasehold_redis::RedisBackend;
//! use leasehold_watchdog::{LeaseManager, LeaseOptions, TickJob};
//! use tokio_cron_scheduler::JobScheduler;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manager = LeaseManager::new(RedisBackend::connect("redis://127.0.0.1/").await?)?;
//! let report = TickJob::builder("report")
//!     .lease(LeaseOptions::builder().label("replica-a"))
//!     .build()?;
//! let scheduler = JobScheduler::new().await?;
//! scheduler
//!     .add(fleet_job(manager, report, "0 */5 * * * *", |run| async move {
//!         println!("report for {:?}, fencing token {}", run.tick(), run.fencing_token());
//!     })?)
//!     .await?;
//! scheduler.start().await?;
//! # Ok(()) }
//! ```
//!
//! It is a crate of its own so that only users of tokio-cron-scheduler
//! compile tokio-cron-scheduler and its dependencies (chrono, croner,
//! uuid); the rest of leasehold does not depend on it.
//!
//! Schedules are cron expressions with seconds (six fields, or seven with
//! a year), as tokio-cron-scheduler reads them, evaluated in UTC.
//!
//! [tokio-cron-scheduler]: https://docs.rs/tokio-cron-scheduler

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use leasehold_core::LeaseBackend;
use leasehold_watchdog::{LeaseError, LeaseManager, TickJob, TickOutcome, TickRun};
use tokio_cron_scheduler::Job;
use tracing::{debug, info, warn};

/// Why a fleet job could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cron expression does not parse.
    #[error(
        "cron schedule {schedule:?} does not parse ({reason}); write six fields with seconds first, such as \"0 */5 * * * *\""
    )]
    Schedule {
        /// The expression given.
        schedule: String,
        /// What the parser said.
        reason: String,
    },
    /// tokio-cron-scheduler refused the job.
    #[error("tokio-cron-scheduler refused the job {job:?} with schedule {schedule:?}: {reason}")]
    Scheduler {
        /// The job's name.
        job: String,
        /// The expression given.
        schedule: String,
        /// What the scheduler said.
        reason: String,
    },
}

/// A cron schedule, read as tokio-cron-scheduler reads it (seconds
/// required, day of month and day of week both required to match), in
/// UTC.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    text: String,
}

impl Schedule {
    /// Parses a cron expression with seconds, such as `"*/2 * * * * *"`.
    ///
    /// # Errors
    ///
    /// [`Error::Schedule`] when it does not parse.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let cron = CronParser::builder()
            .seconds(Seconds::Required)
            .dom_and_dow(true)
            .build()
            .parse(text)
            .map_err(|e| Error::Schedule {
                schedule: text.to_owned(),
                reason: e.to_string(),
            })?;
        Ok(Self {
            cron,
            text: text.to_owned(),
        })
    }

    /// The expression as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The tick a scheduler firing at `fired_at` fires for: the latest
    /// instant of the schedule at or before `fired_at`, in whole seconds.
    /// A scheduler fires at or after a tick, never before, so replicas
    /// whose clocks differ by less than a period name the same tick.
    /// `None` when the schedule has no instant before `fired_at`.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use leasehold_cron::Schedule;
    ///
    /// let every_2s = Schedule::parse("*/2 * * * * *")?;
    /// let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
    /// assert_eq!(every_2s.tick_at(at(1_800_000_001_300)), Some(at(1_800_000_000_000)));
    /// assert_eq!(every_2s.tick_at(at(1_800_000_000_000)), Some(at(1_800_000_000_000)));
    /// # Ok::<(), leasehold_cron::Error>(())
    /// ```
    #[must_use]
    pub fn tick_at(&self, fired_at: SystemTime) -> Option<SystemTime> {
        let at: DateTime<Utc> = fired_at.into();
        // The grid is in whole seconds: a sub-second reading falls to its
        // second first, so that the search is inclusive of it.
        let second = DateTime::<Utc>::from_timestamp(at.timestamp(), 0)?;
        let tick = self.cron.find_previous_occurrence(&second, true).ok()?;
        Some(tick.into())
    }
}

/// A tokio-cron-scheduler [`Job`] that runs `work` once per tick of
/// `schedule` across the fleet: add it to every replica's scheduler, each
/// replica with its own manager, and for each tick one replica runs it (see
/// [`LeaseManager::run_tick`]). Outcomes are logged: a run at `info`, a tick
/// taken by another replica at `debug`, a late one or an error at `warn`;
/// [`fleet_job_with_outcomes`] hands them to a function of yours instead.
///
/// # Errors
///
/// [`Error::Schedule`] when the schedule does not parse, and
/// [`Error::Scheduler`] when tokio-cron-scheduler refuses it.
pub fn fleet_job<B, F, Fut, T>(
    manager: LeaseManager<B>,
    job: TickJob,
    schedule: &str,
    work: F,
) -> Result<Job, Error>
where
    B: LeaseBackend,
    F: Fn(TickRun) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    fleet_job_with_outcomes(manager, job, schedule, work, log_outcome)
}

/// As [`fleet_job`], and `on_outcome` is given the outcome of each tick on
/// this replica: [`TickOutcome::Ran`] with the work's output,
/// [`TickOutcome::Taken`] with the label of the replica that has it,
/// [`TickOutcome::Late`], or an error.
///
/// # Errors
///
/// As [`fleet_job`].
pub fn fleet_job_with_outcomes<B, F, Fut, T, O>(
    manager: LeaseManager<B>,
    job: TickJob,
    schedule: &str,
    work: F,
    on_outcome: O,
) -> Result<Job, Error>
where
    B: LeaseBackend,
    F: Fn(TickRun) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    O: Fn(&TickJob, Result<TickOutcome<T>, LeaseError>) + Send + Sync + 'static,
{
    let grid = Schedule::parse(schedule)?;
    let name = job.name().to_owned();
    let fleet = Arc::new(Fleet {
        manager,
        job,
        grid,
        work,
        on_outcome,
    });
    Job::new_async(schedule, move |_, _| {
        let fleet = Arc::clone(&fleet);
        Box::pin(async move { fleet.fire().await })
    })
    .map_err(|e| Error::Scheduler {
        job: name,
        schedule: schedule.to_owned(),
        reason: e.to_string(),
    })
}

/// What every firing of one fleet job shares.
struct Fleet<B, F, O> {
    manager: LeaseManager<B>,
    job: TickJob,
    grid: Schedule,
    work: F,
    on_outcome: O,
}

impl<B, F, Fut, T, O> Fleet<B, F, O>
where
    B: LeaseBackend,
    F: Fn(TickRun) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    O: Fn(&TickJob, Result<TickOutcome<T>, LeaseError>) + Send + Sync + 'static,
{
    async fn fire(&self) {
        // Read first: the scheduler fired for the tick at or before now.
        let fired_at = SystemTime::now();
        let Some(tick) = self.grid.tick_at(fired_at) else {
            warn!(
                job = self.job.name(),
                schedule = self.grid.as_str(),
                "fired with no tick of the schedule before now; skipped"
            );
            return;
        };
        let outcome = self
            .manager
            .run_tick(&self.job, tick, fired_at, |run| (self.work)(run))
            .await;
        (self.on_outcome)(&self.job, outcome);
    }
}

fn log_outcome<T>(job: &TickJob, outcome: Result<TickOutcome<T>, LeaseError>) {
    let job = job.name();
    match outcome {
        Ok(TickOutcome::Ran {
            tick,
            fencing_token,
            ..
        }) => info!(job, ?tick, %fencing_token, "ran the tick"),
        Ok(TickOutcome::Taken { tick, holder }) => {
            debug!(
                job,
                ?tick,
                holder = holder.as_deref().unwrap_or("unlabelled"),
                "another replica has the tick"
            );
        }
        Ok(TickOutcome::Late { tick, lateness }) => {
            warn!(
                job,
                ?tick,
                ?lateness,
                "fired too late to run the tick safely; left it"
            );
        }
        Ok(_) => {}
        Err(error) => warn!(job, %error, "the tick failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    /// Replicas firing anywhere within a period after a tick name that
    /// tick, on the whole second; a bad expression is refused with a hint.
    #[test]
    fn the_tick_is_the_grid_instant_at_or_before_the_firing() -> Result<(), Error> {
        let every_2s = Schedule::parse("*/2 * * * * *")?;
        let tick = 1_800_000_000_000;
        for late in [0, 1, 499, 1_000, 1_999] {
            assert_eq!(every_2s.tick_at(at(tick + late)), Some(at(tick)), "{late}");
        }
        assert_eq!(every_2s.tick_at(at(tick + 2_000)), Some(at(tick + 2_000)));
        let hourly = Schedule::parse("0 0 * * * *")?;
        assert_eq!(
            hourly.tick_at(at(tick + 59 * 60_000)),
            Some(at(tick - tick % 3_600_000))
        );
        let bad = Schedule::parse("*/2 * * * *").map(|_| ());
        assert!(
            matches!(&bad, Err(Error::Schedule { schedule, .. }) if schedule == "*/2 * * * *"),
            "{bad:?}"
        );
        Ok(())
    }
}
