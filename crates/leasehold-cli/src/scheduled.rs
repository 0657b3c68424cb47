//! `leasehold run --schedule CRON --job NAME`: the same crontab line on
//! every host runs the command once per tick, decided on the server's
//! clock (see `leasehold_watchdog::tick`).
//!
//! The host asks for the tick at or before its own clock's now; the job's
//! record on the server says whether this host runs it. A granted run is
//! supervised exactly as a plain `run` (see [`crate::run::supervise`]),
//! under the run's lease, and its end is recorded as the tick's
//! completion. A tick not run here is not a failure: leasehold exits with
//! 0 and says why, except for a record of another schedule (78) and a
//! clock more than a period ahead of the server's (75).

use std::cell::Cell;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{Decision, JobName, RunInfo, TickState};
use leasehold_cron::Schedule;
use leasehold_watchdog::{
    DEFAULT_START_DEADLINE, LeaseError, LeaseManager, LeaseOptionsBuilder, TickJob, TickOutcome,
};

use crate::args::RunArgs;
use crate::exit::{self, Failure, note};
use crate::run::{Held, Signals, lease_failure, supervise};
use crate::stopping::Fit;

/// Asks for the tick at or before now and runs the command if this host
/// is granted it; returns leasehold's exit code.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    url: &Option<String>,
    namespace: Option<&str>,
    args: &RunArgs,
    schedule: Schedule,
    name: JobName,
    options: LeaseOptionsBuilder,
    fit: &Fit,
    mut signals: Signals,
) -> Result<u8, Failure> {
    let zone = args.time_zone.as_deref().unwrap_or("UTC");
    let schedule = schedule
        .in_time_zone(zone)
        .map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
    let job = TickJob::builder(name.as_str(), schedule)
        .start_deadline(args.start_deadline.unwrap_or(DEFAULT_START_DEADLINE))
        .catch_up(args.catch_up.unwrap_or_default())
        .on_abandon(args.on_abandon.unwrap_or_default())
        .lease(options)
        .build()
        .map_err(|e| {
            let code = match e {
                LeaseError::InvalidTick { .. } => exit::USAGE,
                _ => exit::CONFIG,
            };
            Failure::new(code, exit::chain(&e))
        })?;
    // Installed before connecting, as for a plain run. `signals` is handed
    // to the run; `asking` ends leasehold while it only asks.
    let mut asking = Signals::install()?;
    let backend = exit::connect(url, namespace).await?;
    let manager = LeaseManager::new(backend).map_err(|e| Failure::internal(e.to_string()))?;
    // The tick this host's cron fired for: by its own clock, the server
    // says whether it is due, on time or late.
    let Some(tick) = job.tick_to_ask(SystemTime::now()) else {
        manager.shutdown().await;
        note!(
            "leasehold: job {:?} not run: its schedule has no tick at or before now",
            name.as_str()
        );
        return Ok(0);
    };
    let granted = Cell::new(false);
    let outcome = {
        let signals = &mut signals;
        let ticking = manager.run_tick(&job, tick, |run| {
            granted.set(true);
            let name = job.name();
            async move {
                let held = Held::Tick {
                    run: &run,
                    job: name,
                };
                supervise(args, fit, &held, signals).await
            }
        });
        tokio::pin!(ticking);
        loop {
            tokio::select! {
                outcome = &mut ticking => break outcome,
                signal = asking.next() => {
                    // Once granted, the run passes signals on to the job.
                    if !granted.get() {
                        manager.shutdown().await;
                        return Ok(128 + signal as u8);
                    }
                }
            }
        }
    };
    manager.shutdown().await;
    let job_text = format!("job {:?}", name.as_str());
    let tick_text = instant_text(tick);
    match outcome {
        Ok(TickOutcome::Ran { output, .. }) => output,
        Ok(TickOutcome::Decided { tick, decision }) => {
            note!(
                "leasehold: {job_text}: tick {tick_text} not run here: {}",
                decided_text(tick, &decision)
            );
            Ok(0)
        }
        Ok(TickOutcome::Missed { .. }) => {
            note!(
                "leasehold: {job_text}: tick {tick_text} not run: missed (asked for after its \
                 start deadline or the next tick, by the server's clock; --catch-up latest \
                 would still run the newest tick); recorded as missed"
            );
            Ok(0)
        }
        Ok(TickOutcome::Overlap { running, .. }) => {
            note!(
                "leasehold: {job_text}: tick {tick_text} not run: overlap, {} still holds the \
                 job's lease; recorded as skipped",
                run_text(&running)
            );
            Ok(0)
        }
        Ok(TickOutcome::Conflict { fingerprint, .. }) => Err(Failure::new(
            exit::CONFIG,
            format!(
                "{job_text} runs under another schedule: the server's record says {fingerprint:?}, \
                 this host {:?}; tick {tick_text} not run. Roll the same --schedule and \
                 --time-zone out to every host of the job (the record is replaced once it \
                 expires, the old schedule's longest gap plus its start deadline after its last \
                 tick)",
                job.grid().fingerprint()
            ),
        )),
        Ok(TickOutcome::ClockAhead { ahead, .. }) => Err(Failure::new(
            exit::NOT_ACQUIRED,
            format!(
                "{job_text}: tick {tick_text} not asked for: this host's clock is {} ahead of \
                 the server's, more than one period of the schedule; fix the clock (NTP)",
                humantime::format_duration(whole_ms(ahead))
            ),
        )),
        Ok(_) => Err(Failure::internal(format!(
            "{job_text}: tick {tick_text}: an outcome this version does not know"
        ))),
        Err(LeaseError::LeaseEnded { reason, .. }) => {
            note!(
                "leasehold: {job_text}: the run of tick {tick_text} ended without a completion \
                 ({reason}): the command was stopped; the next host to ask for a tick of the \
                 job records the run as abandoned"
            );
            Ok(exit::LOST)
        }
        Err(error) => Err(lease_failure(&error)),
    }
}

/// Why a decided tick is not run here, from its decision.
fn decided_text(asked: SystemTime, decision: &Decision) -> String {
    let which = if ms(asked) == decision.tick {
        "decided already".to_owned()
    } else {
        format!(
            "a later tick, {}, is decided already",
            instant_text(instant(decision.tick))
        )
    };
    let run = decision.run.as_ref().map(run_text);
    let what = match (decision.state, run) {
        (TickState::Started, Some(run)) => format!("started by {run}"),
        (TickState::Completed, Some(run)) => format!("completed by {run}"),
        (TickState::Abandoned, Some(run)) => format!("abandoned by {run}"),
        (TickState::Skipped, Some(run)) => format!("skipped, {run} held the job's lease"),
        (state, _) => state.as_str().to_owned(),
    };
    format!("{which}: {what} ({})", decision.reason.as_str())
}

/// A run: its holder's label, fencing token and tick.
fn run_text(run: &RunInfo) -> String {
    let who = run
        .label
        .as_deref()
        .map_or_else(|| "a holder with no label".to_owned(), |l| format!("{l:?}"));
    if run.tick == 0 {
        format!("{who} (fencing token {})", run.fencing_token)
    } else {
        format!(
            "{who} (fencing token {}, the run of tick {})",
            run.fencing_token,
            instant_text(instant(run.tick))
        )
    }
}

/// An instant in RFC 3339, UTC: to the second, or the millisecond when it
/// has one.
pub(crate) fn instant_text(at: SystemTime) -> String {
    if ms(at).is_multiple_of(1_000) {
        humantime::format_rfc3339_seconds(at).to_string()
    } else {
        humantime::format_rfc3339_millis(at).to_string()
    }
}

/// UNIX milliseconds of an instant (0 before 1970).
pub(crate) fn ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// The instant of UNIX milliseconds.
pub(crate) fn instant(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
