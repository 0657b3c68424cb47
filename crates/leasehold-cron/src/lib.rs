//! Scheduled jobs for [tokio-cron-scheduler]: every replica schedules the
//! same cron job, and each tick is started once across the fleet, decided
//! on the server's clock.
//!
//! [`Schedule`] is a cron expression with its time zone; it is the grid
//! ([`TickGrid`]) of a [`TickJob`], and so serves
//! [`LeaseManager::run_tick`], [`LeaseManager::run_schedule`] and the
//! `leasehold run --schedule` command alike. [`fleet_job`] makes the
//! [`Job`] that each replica adds to its own
//! [`JobScheduler`](tokio_cron_scheduler::JobScheduler): when the scheduler
//! fires, the job asks for the tick the server's clock is at
//! ([`TickJob::tick_to_ask`]), and the job's record on the server decides
//! whether this replica starts it (see [how a tick is decided](leasehold_watchdog::tick): one
//! start per tick whatever the replicas' clocks, a run that dies handled
//! as the job's `on_abandon` says).
//!
//! ```no_run
//! use leasehold::redis::RedisBackend;
//! use leasehold::{LeaseManager, LeaseOptions, TickJob};
//! use leasehold_cron::{Schedule, fleet_job};
//! use tokio_cron_scheduler::JobScheduler;
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manager = LeaseManager::new(RedisBackend::connect("redis://127.0.0.1/").await?)?;
//! let schedule = Schedule::parse("0 */5 * * * *")?.in_time_zone("Europe/Berlin")?;
//! let report = TickJob::builder("report", schedule.clone())
//!     .lease(LeaseOptions::builder().label("replica-a"))
//!     .build()?;
//! let scheduler = JobScheduler::new().await?;
//! scheduler
//!     .add(fleet_job(manager, report, &schedule, |run| async move {
//!         println!("report for {:?}, fencing token {}", run.tick(), run.fencing_token());
//!     })?)
//!     .await?;
//! scheduler.start().await?;
//! # Ok(()) }
//! ```
//!
//! It is a crate of its own so that only users of cron schedules compile
//! tokio-cron-scheduler and its dependencies (chrono, chrono-tz, croner,
//! uuid); the rest of leasehold does not depend on it.
//!
//! Schedules are cron expressions of five fields (minute first, as in a
//! crontab) or six or seven (seconds first, then an optional year, as
//! tokio-cron-scheduler reads them), evaluated in UTC unless given a time
//! zone.
//!
//! [tokio-cron-scheduler]: https://docs.rs/tokio-cron-scheduler

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use leasehold_core::LeaseBackend;
use leasehold_watchdog::{LeaseError, LeaseManager, TickGrid, TickJob, TickOutcome, TickRun};
use tokio_cron_scheduler::Job;
use tracing::{debug, info, warn};

/// Why a schedule or a fleet job could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CronError {
    /// The cron expression does not parse.
    #[error(
        "cron schedule {schedule:?} does not parse ({reason}); write five fields as in a crontab (\"0 2 * * *\") or six with seconds first (\"0 */5 * * * *\")"
    )]
    Schedule {
        /// The expression given.
        schedule: String,
        /// What the parser said.
        reason: String,
    },
    /// The time zone is not an IANA name.
    #[error("unknown time zone {zone:?}; write an IANA name such as \"Europe/Berlin\" or \"UTC\"")]
    TimeZone {
        /// The name given.
        zone: String,
    },
    /// The job's grid is not the schedule given to [`fleet_job`].
    #[error(
        "job {job:?} was built on the schedule {job_schedule:?}, not on {schedule:?}: build the TickJob on the same Schedule"
    )]
    Mismatch {
        /// The job's name.
        job: String,
        /// The fingerprint of the job's grid.
        job_schedule: String,
        /// The fingerprint of the schedule given.
        schedule: String,
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

/// How far ahead [`Schedule::longest_gap`](TickGrid::longest_gap) looks,
/// and the gap it reports for a schedule with no second tick in that time.
const GAP_HORIZON: Duration = Duration::from_secs(400 * 24 * 60 * 60);
/// How many ticks it looks at, at most (a schedule every second reaches
/// this in under six hours, with a gap of a second).
const GAP_TICKS: usize = 20_000;
/// How far back a lookup starts near a daylight-saving change: more than
/// any change of a zone's offset.
const DST_WINDOW: i64 = 3 * 60 * 60;

/// A cron schedule in a time zone, read as tokio-cron-scheduler reads it
/// (day of month and day of week both required to match): the grid of a
/// [`TickJob`].
///
/// Its ticks are instants, named by one rule from both directions: the
/// forward search of the expression in its zone. A local time that a
/// daylight-saving change skips or repeats names the one instant that the
/// forward search finds, whether a node looks it up from before
/// ([`next_after`](TickGrid::next_after)) or after
/// ([`tick_at`](TickGrid::tick_at)).
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    text: String,
    zone: Tz,
    gap: Duration,
}

impl Schedule {
    /// Parses a cron expression, in UTC: five fields (`"0 2 * * *"`, at
    /// second 0), or six or seven with seconds first (`"*/2 * * * * *"`).
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use leasehold::TickGrid;
    /// use leasehold_cron::Schedule;
    ///
    /// let every_2s = Schedule::parse("*/2 * * * * *")?;
    /// let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
    /// assert_eq!(every_2s.tick_at(at(1_800_000_001_300)), Some(at(1_800_000_000_000)));
    /// assert_eq!(every_2s.next_after(at(1_800_000_000_000)), Some(at(1_800_000_002_000)));
    /// assert_eq!(Schedule::parse("0 2 * * *")?.as_str(), "0 0 2 * * *");
    /// # Ok::<(), leasehold_cron::CronError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CronError::Schedule`] when it does not parse.
    pub fn parse(text: &str) -> Result<Self, CronError> {
        let fields = text.split_whitespace().count();
        let normalized = if fields == 5 {
            format!(
                "0 {}",
                text.split_whitespace().collect::<Vec<_>>().join(" ")
            )
        } else {
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        };
        let refuse = |reason: String| CronError::Schedule {
            schedule: text.to_owned(),
            reason,
        };
        if !(5..=7).contains(&fields) {
            return Err(refuse(format!("{fields} fields")));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Required)
            .dom_and_dow(true)
            .build()
            .parse(&normalized)
            .map_err(|e| refuse(e.to_string()))?;
        let mut schedule = Self {
            cron,
            text: normalized,
            zone: Tz::UTC,
            gap: GAP_HORIZON,
        };
        schedule.gap = schedule.measure_gap();
        Ok(schedule)
    }

    /// The same expression in the IANA time zone `zone` (`"Europe/Berlin"`).
    ///
    /// # Errors
    ///
    /// [`CronError::TimeZone`] for a name that is not an IANA time zone.
    pub fn in_time_zone(mut self, zone: &str) -> Result<Self, CronError> {
        self.zone = zone.parse::<Tz>().map_err(|_| CronError::TimeZone {
            zone: zone.to_owned(),
        })?;
        self.gap = self.measure_gap();
        Ok(self)
    }

    /// The expression, with seconds first (a five-field expression gets
    /// `0 ` in front).
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The time zone.
    #[must_use]
    pub fn time_zone(&self) -> Tz {
        self.zone
    }

    /// The first tick strictly after `at` (the forward search). The grid
    /// is in whole seconds: `at` falls to its second first, so that a tick
    /// is never carried a fraction of a second off the grid.
    fn forward(&self, at: DateTime<Tz>) -> Option<DateTime<Tz>> {
        let second = self.zone.timestamp_opt(at.timestamp(), 0).single()?;
        self.cron.find_next_occurrence(&second, false).ok()
    }

    fn local(&self, at: SystemTime) -> DateTime<Tz> {
        let utc: DateTime<Utc> = at.into();
        utc.with_timezone(&self.zone)
    }

    /// Whether the zone's offset changes within the window before `at`.
    fn near_change(&self, at: DateTime<Tz>) -> bool {
        let before = at - chrono::Duration::seconds(DST_WINDOW);
        before.offset().fix() != at.offset().fix()
    }

    fn measure_gap(&self) -> Duration {
        let start = self.local(SystemTime::now());
        let horizon = start
            + chrono::Duration::seconds(i64::try_from(GAP_HORIZON.as_secs()).unwrap_or(i64::MAX));
        let Some(mut last) = self.forward(start) else {
            return GAP_HORIZON;
        };
        let mut gap = Duration::ZERO;
        for _ in 0..GAP_TICKS {
            match self.forward(last) {
                Some(next) if next <= horizon => {
                    gap = gap.max((next - last).to_std().unwrap_or_default());
                    last = next;
                }
                _ => break,
            }
        }
        if gap.is_zero() { GAP_HORIZON } else { gap }
    }
}

impl TickGrid for Schedule {
    fn tick_at(&self, at: SystemTime) -> Option<SystemTime> {
        let at = self.local(at);
        // The grid is in whole seconds: a reading falls to its second.
        let second = self.zone.timestamp_opt(at.timestamp(), 0).single()?;
        let back = self.cron.find_previous_occurrence(&second, true).ok()?;
        // Away from a change of offset the backward search finds what the
        // forward one would; checked all the same (it costs one search),
        // since a skipped local time can send it to another instant (the
        // second before the change) than the forward one (the change).
        if !self.near_change(second)
            && self.forward(back - chrono::Duration::seconds(1)) == Some(back)
        {
            return Some(back.with_timezone(&Utc).into());
        }
        // Walk forward from before it: the one rule.
        let mut from = back.min(second) - chrono::Duration::seconds(DST_WINDOW);
        let mut found = None;
        for _ in 0..GAP_TICKS * 2 {
            match self.forward(from) {
                Some(next) if next <= second => {
                    found = Some(next);
                    from = next;
                }
                _ => break,
            }
        }
        match found {
            Some(tick) => Some(tick.with_timezone(&Utc).into()),
            // None in the window: the backward search's tick stands.
            None => Some(back.with_timezone(&Utc).into()),
        }
    }

    fn next_after(&self, tick: SystemTime) -> Option<SystemTime> {
        let next = self.forward(self.local(tick))?;
        Some(next.with_timezone(&Utc).into())
    }

    fn fingerprint(&self) -> String {
        format!("{} {}", self.text, self.zone.name())
    }

    fn longest_gap(&self) -> Duration {
        self.gap
    }
}

/// A tokio-cron-scheduler [`Job`] that asks for each tick of `schedule`
/// as `job` (built on the same schedule): add it to every replica's
/// scheduler, each replica with its own manager, and each tick is started
/// once across the fleet (see [`LeaseManager::run_tick`]). Outcomes are
/// logged and counted in metrics (a run at `info`, a tick decided by
/// another replica at `debug`, a missed tick, a conflict, a clock ahead
/// or an error at `warn`); [`fleet_job_with_outcomes`] hands them to a
/// function of yours instead.
///
/// A re-run of an abandoned run needs a node that watches the job's lease
/// between ticks: [`LeaseManager::run_schedule`] does, a scheduler's
/// firing does not. Under `on_abandon(Rerun)`, run the job with
/// `run_schedule` instead.
///
/// # Errors
///
/// [`CronError::Mismatch`] when `job`'s grid is not `schedule`, and
/// [`CronError::Scheduler`] when tokio-cron-scheduler refuses it.
pub fn fleet_job<B, F, Fut, T>(
    manager: LeaseManager<B>,
    job: TickJob,
    schedule: &Schedule,
    work: F,
) -> Result<Job, CronError>
where
    B: LeaseBackend,
    F: Fn(TickRun) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    fleet_job_with_outcomes(manager, job, schedule, work, log_outcome)
}

/// As [`fleet_job`], and `on_outcome` is given the outcome of each firing
/// on this replica: a [`TickOutcome`] (with the work's output when this
/// replica ran the tick), or an error.
///
/// # Errors
///
/// As [`fleet_job`].
pub fn fleet_job_with_outcomes<B, F, Fut, T, O>(
    manager: LeaseManager<B>,
    job: TickJob,
    schedule: &Schedule,
    work: F,
    on_outcome: O,
) -> Result<Job, CronError>
where
    B: LeaseBackend,
    F: Fn(TickRun) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    O: Fn(&TickJob, Result<TickOutcome<T>, LeaseError>) + Send + Sync + 'static,
{
    let name = job.name().to_string();
    if job.grid().fingerprint() != schedule.fingerprint() {
        return Err(CronError::Mismatch {
            job: name,
            job_schedule: job.grid().fingerprint(),
            schedule: schedule.fingerprint(),
        });
    }
    let fleet = Arc::new(Fleet {
        manager,
        job,
        work,
        on_outcome,
        asked: Mutex::new(None),
    });
    Job::new_async_tz(schedule.as_str(), schedule.zone, move |_, _| {
        let fleet = Arc::clone(&fleet);
        Box::pin(async move { fleet.fire().await })
    })
    .map_err(|e| CronError::Scheduler {
        job: name,
        schedule: schedule.as_str().to_owned(),
        reason: e.to_string(),
    })
}

/// What every firing of one fleet job shares.
struct Fleet<B, F, O> {
    manager: LeaseManager<B>,
    job: TickJob,
    work: F,
    on_outcome: O,
    /// The last tick this replica asked for: a firing that names it (or
    /// an earlier one) again asks nothing.
    asked: Mutex<Option<SystemTime>>,
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
        let fired_at = SystemTime::now();
        let Some(tick) = self.job.tick_to_ask(fired_at) else {
            warn!(job = %self.job.name(), "fired with no tick of the schedule before now; skipped");
            return;
        };
        let before = {
            let mut asked = self
                .asked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if asked.is_some_and(|last| tick <= last) {
                debug!(job = %self.job.name(), ?tick, "this tick was asked for already");
                return;
            }
            asked.replace(tick)
        };
        let outcome = self
            .manager
            .run_tick(&self.job, tick, |run| (self.work)(run))
            .await;
        if matches!(outcome, Ok(TickOutcome::ClockAhead { .. }) | Err(_)) {
            // Nothing was decided for it: the next firing (on the server's
            // clock, now learned) may ask for it, or an earlier tick.
            let mut asked = self
                .asked
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if *asked == Some(tick) {
                *asked = before;
            }
        }
        (self.on_outcome)(&self.job, outcome);
    }
}

fn log_outcome<T>(job: &TickJob, outcome: Result<TickOutcome<T>, LeaseError>) {
    let job = job.name().as_str();
    match outcome {
        Ok(TickOutcome::Ran {
            tick,
            fencing_token,
            reason,
            ..
        }) => info!(job, ?tick, %fencing_token, reason = reason.as_str(), "ran the tick"),
        Ok(TickOutcome::Decided { tick, decision }) => debug!(
            job,
            ?tick,
            decided = decision.tick,
            state = decision.state.as_str(),
            "the tick was decided already"
        ),
        Ok(TickOutcome::Missed { tick }) => warn!(job, ?tick, "the tick was missed"),
        Ok(TickOutcome::Overlap { tick, running }) => {
            info!(
                job,
                ?tick,
                running = running.tick,
                "skipped: the previous run still holds"
            );
        }
        Ok(TickOutcome::ClockAhead { tick, ahead }) => {
            warn!(
                job,
                ?tick,
                ?ahead,
                "this replica's clock is ahead of the server's by more than a period"
            );
        }
        Ok(TickOutcome::Conflict { fingerprint, .. }) => {
            warn!(job, theirs = %fingerprint, "the job's record names another schedule; not run");
        }
        Ok(_) => {}
        Err(error) => warn!(job, %error, "the tick failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn utc(text: &str) -> SystemTime {
        DateTime::parse_from_rfc3339(text)
            .map(|t| SystemTime::from(t.with_timezone(&Utc)))
            .unwrap_or(UNIX_EPOCH)
    }

    /// Replicas firing anywhere within a period after a tick name that
    /// tick, on the whole second; five fields are a crontab line; a bad
    /// expression or zone is refused with a hint.
    #[test]
    fn the_tick_is_the_grid_instant_at_or_before_the_firing() -> Result<(), CronError> {
        let every_2s = Schedule::parse("*/2 * * * * *")?;
        let tick = 1_800_000_000_000;
        for late in [0, 1, 499, 1_000, 1_999] {
            assert_eq!(every_2s.tick_at(at(tick + late)), Some(at(tick)), "{late}");
        }
        assert_eq!(every_2s.tick_at(at(tick + 2_000)), Some(at(tick + 2_000)));
        assert_eq!(every_2s.next_after(at(tick)), Some(at(tick + 2_000)));
        // An instant off the grid: the next tick is on it, on the second.
        assert_eq!(every_2s.next_after(at(tick + 907)), Some(at(tick + 2_000)));
        assert_eq!(
            every_2s.next_after(at(tick + 2_907)),
            Some(at(tick + 4_000))
        );
        assert_eq!(every_2s.longest_gap(), Duration::from_secs(2));
        let hourly = Schedule::parse("0 * * * *")?;
        assert_eq!(hourly.as_str(), "0 0 * * * *");
        assert_eq!(
            hourly.tick_at(at(tick + 59 * 60_000)),
            Some(at(tick - tick % 3_600_000))
        );
        assert_eq!(hourly.fingerprint(), "0 0 * * * * UTC");
        let bad = Schedule::parse("*/2 * * *").map(|_| ());
        assert!(
            matches!(&bad, Err(CronError::Schedule { schedule, .. }) if schedule == "*/2 * * *"),
            "{bad:?}"
        );
        let zone = Schedule::parse("0 2 * * *")?
            .in_time_zone("Mars/Olympus")
            .map(|_| ());
        assert!(matches!(zone, Err(CronError::TimeZone { .. })), "{zone:?}");
        Ok(())
    }

    /// A weekday schedule's longest gap is its weekend: the record must
    /// outlive it.
    #[test]
    fn the_longest_gap_of_a_weekday_schedule_is_its_weekend() -> Result<(), CronError> {
        let weekdays = Schedule::parse("0 2 * * 1-5")?;
        assert_eq!(
            weekdays.longest_gap(),
            Duration::from_secs(3 * 24 * 60 * 60)
        );
        Ok(())
    }

    /// Checks, for every minute of the day around `day` (UTC), that the
    /// tick named backward (`tick_at`) is one the forward search reaches
    /// and the latest at or before that minute; returns the ticks named.
    fn one_rule(schedule: &Schedule, from: &str, hours: u64) -> Vec<SystemTime> {
        let start = utc(from);
        let mut named = Vec::new();
        for minute in 0..hours * 60 {
            let now = start + Duration::from_secs(minute * 60 + 17);
            let Some(tick) = schedule.tick_at(now) else {
                continue;
            };
            assert!(tick <= now, "{tick:?} is after {now:?}");
            // The forward search from just before the tick finds it...
            assert_eq!(
                schedule.next_after(tick - Duration::from_secs(1)),
                Some(tick),
                "the tick named at {now:?} is not one the forward search names"
            );
            // ...and the next one is after now: it is the latest.
            let next = schedule.next_after(tick);
            assert!(next.is_some_and(|n| n > now), "{next:?} <= {now:?}");
            if named.last() != Some(&tick) {
                named.push(tick);
            }
        }
        named
    }

    /// The 2026 EU spring change (29 March, 02:00 CET -> 03:00 CEST): a
    /// daily 02:30 in Berlin, a local time that does not exist that day,
    /// names at most one instant that day, the same from both directions.
    #[test]
    fn a_skipped_local_time_names_one_instant_from_both_directions() -> Result<(), CronError> {
        let schedule = Schedule::parse("0 30 2 * * *")?.in_time_zone("Europe/Berlin")?;
        let named = one_rule(&schedule, "2026-03-28T00:00:00Z", 72);
        let that_day: Vec<_> = named
            .iter()
            .filter(|t| **t >= utc("2026-03-28T23:00:00Z") && **t < utc("2026-03-29T22:00:00Z"))
            .collect();
        assert!(that_day.len() <= 1, "{that_day:?}");
        // The days around it are as usual: 01:30 UTC before, 00:30 after.
        assert!(named.contains(&utc("2026-03-28T01:30:00Z")), "{named:?}");
        assert!(named.contains(&utc("2026-03-30T00:30:00Z")), "{named:?}");
        Ok(())
    }

    /// The 2026 EU autumn change (25 October, 03:00 CEST -> 02:00 CET): a
    /// daily 02:30 in Berlin, a local time that happens twice that day,
    /// names one instant, the same from both directions.
    #[test]
    fn a_repeated_local_time_names_one_instant_from_both_directions() -> Result<(), CronError> {
        let schedule = Schedule::parse("0 30 2 * * *")?.in_time_zone("Europe/Berlin")?;
        let named = one_rule(&schedule, "2026-10-24T00:00:00Z", 72);
        let that_day: Vec<_> = named
            .iter()
            .filter(|t| **t >= utc("2026-10-24T22:00:00Z") && **t < utc("2026-10-25T23:00:00Z"))
            .collect();
        assert_eq!(that_day.len(), 1, "{that_day:?}");
        assert!(named.contains(&utc("2026-10-24T00:30:00Z")), "{named:?}");
        assert!(named.contains(&utc("2026-10-26T01:30:00Z")), "{named:?}");
        Ok(())
    }
}
