//! `leasehold jobs`: the scheduled jobs' records, as the server keeps them.

use std::time::{Duration, SystemTime};

use leasehold_core::{
    JobCounts, JobName, JobRecord, LeaseBackend, RunInfo, RunRecord, TickBackend,
};
use leasehold_cron::Schedule;
use leasehold_watchdog::{Every, TickGrid};

use crate::admin::lined_up;
use crate::exit::{self, Failure, note};
use crate::scheduled::{instant, instant_text};

pub(crate) async fn jobs(
    url: &Option<String>,
    namespace: Option<&str>,
    job: Option<&JobName>,
    json: bool,
) -> Result<u8, Failure> {
    let backend = exit::connect(url, namespace).await?;
    let Some(ticks) = backend.ticks() else {
        return Err(Failure::new(
            exit::CONFIG,
            "this Redis deployment keeps no scheduled jobs' records",
        ));
    };
    let mut records = match job {
        Some(job) => match ticks.job_record(job).await {
            Ok(Some(record)) => vec![record],
            Ok(None) => {
                note!("leasehold: job {:?} has no record", job.as_str());
                return Ok(1);
            }
            Err(e) => return Err(exit::backend(&e)),
        },
        None => ticks.job_records().await.map_err(|e| exit::backend(&e))?,
    };
    records.sort_by(|a, b| a.job.cmp(&b.job));
    if json {
        for record in &records {
            println!("{}", to_json(record));
        }
    } else {
        print!("{}", table(&records));
    }
    Ok(0)
}

/// The next tick after the server's clock of the schedule the record
/// names, when it is one leasehold reads back to the same fingerprint: a
/// cron schedule (`leasehold run --schedule`, leasehold-cron) or an
/// `Every` grid.
fn next_tick(record: &JobRecord) -> Option<SystemTime> {
    let fingerprint = record.fingerprint.as_str();
    let grid: Box<dyn TickGrid> = if let Some(period) = fingerprint.strip_prefix("every ") {
        Box::new(Every::new(humantime::parse_duration(period).ok()?).ok()?)
    } else {
        let (text, zone) = fingerprint.rsplit_once(' ')?;
        Box::new(Schedule::parse(text).ok()?.in_time_zone(zone).ok()?)
    };
    if grid.fingerprint() != fingerprint {
        return None;
    }
    // From the tick the server's clock is at: `next_after` steps from a
    // tick of the grid (from any other instant, a cron schedule keeps its
    // fraction of a second).
    let now = record.server_time;
    match grid.tick_at(instant(now)) {
        Some(tick) => grid.next_after(tick),
        None => grid.next_after(instant(now - now % 1_000)),
    }
}

/// How long the run ran, and whether it still runs (measured then to the
/// server's clock when read).
fn duration(run: &RunRecord, server_time: u64) -> (Duration, bool) {
    match run.ended_at {
        Some(ended) => (
            Duration::from_millis(ended.saturating_sub(run.started_at)),
            false,
        ),
        None => (
            Duration::from_millis(server_time.saturating_sub(run.started_at)),
            true,
        ),
    }
}

/// The `jobs` table: a header and a row per job.
fn table(records: &[JobRecord]) -> String {
    const HEADER: [&str; 15] = [
        "JOB",
        "LAST TICK",
        "STATE",
        "REASON",
        "HOLDER",
        "FENCING TOKEN",
        "RUN",
        "DURATION",
        "NEXT TICK",
        "STARTED",
        "COMPLETED",
        "MISSED",
        "SKIPPED",
        "ABANDONED",
        "RERUNS",
    ];
    let mut cells: Vec<[String; 15]> = vec![HEADER.map(str::to_owned)];
    for record in records {
        let decided = &record.decided;
        let none = || "-".to_owned();
        let (holder, token, state, took) = match &record.run {
            None => (none(), none(), none(), none()),
            Some(run) => {
                let (took, so_far) = duration(run, record.server_time);
                let took = humantime::format_duration(took).to_string();
                (
                    run.info
                        .label
                        .as_deref()
                        .map_or_else(|| "(no label)".to_owned(), |l| l.escape_debug().to_string()),
                    run.info.fencing_token.to_string(),
                    run.state.as_str().to_owned(),
                    if so_far {
                        format!("{took} so far")
                    } else {
                        took
                    },
                )
            }
        };
        let JobCounts {
            started,
            completed,
            missed,
            skipped,
            abandoned,
            reruns,
            ..
        } = record.counts;
        cells.push([
            record.job.as_str().to_owned(),
            instant_text(instant(decided.tick)),
            decided.state.as_str().to_owned(),
            decided.reason.as_str().to_owned(),
            holder,
            token,
            state,
            took,
            next_tick(record).map_or_else(|| "unknown".to_owned(), instant_text),
            started.to_string(),
            completed.to_string(),
            missed.to_string(),
            skipped.to_string(),
            abandoned.to_string(),
            reruns.to_string(),
        ]);
    }
    lined_up(&cells)
}

/// A job as `jobs --json` prints it.
#[derive(serde::Serialize)]
struct JobJson<'a> {
    job: &'a str,
    fingerprint: &'a str,
    decided: DecisionJson<'a>,
    run: Option<RunJson<'a>>,
    next_tick: Option<String>,
    next_tick_ms: Option<u64>,
    counts: CountsJson,
    last_seen: String,
    last_seen_ms: u64,
    server_time: String,
    server_time_ms: u64,
}

#[derive(serde::Serialize)]
struct DecisionJson<'a> {
    tick: String,
    tick_ms: u64,
    state: &'static str,
    reason: &'static str,
    /// The run the decision concerns.
    run: Option<RunInfoJson<'a>>,
}

#[derive(serde::Serialize)]
struct RunInfoJson<'a> {
    tick: String,
    tick_ms: u64,
    label: Option<&'a str>,
    fencing_token: u64,
}

impl<'a> RunInfoJson<'a> {
    fn of(info: &'a RunInfo) -> Self {
        Self {
            tick: instant_text(instant(info.tick)),
            tick_ms: info.tick,
            label: info.label.as_deref(),
            fencing_token: info.fencing_token.0,
        }
    }
}

#[derive(serde::Serialize)]
struct RunJson<'a> {
    #[serde(flatten)]
    info: RunInfoJson<'a>,
    state: &'static str,
    reason: &'static str,
    started_at: String,
    started_at_ms: u64,
    ended_at: Option<String>,
    ended_at_ms: Option<u64>,
    /// Until its end, or until the server's clock when read.
    duration_ms: u64,
    ttl_left_ms: Option<u64>,
}

#[derive(serde::Serialize)]
struct CountsJson {
    started: u64,
    completed: u64,
    missed: u64,
    skipped: u64,
    abandoned: u64,
    reruns: u64,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn to_json(record: &JobRecord) -> String {
    let decided = &record.decided;
    let next = next_tick(record);
    let counts = record.counts;
    let value = JobJson {
        job: record.job.as_str(),
        fingerprint: &record.fingerprint,
        decided: DecisionJson {
            tick: instant_text(instant(decided.tick)),
            tick_ms: decided.tick,
            state: decided.state.as_str(),
            reason: decided.reason.as_str(),
            run: decided.run.as_ref().map(RunInfoJson::of),
        },
        run: record.run.as_ref().map(|run| RunJson {
            info: RunInfoJson::of(&run.info),
            state: run.state.as_str(),
            reason: run.reason.as_str(),
            started_at: instant_text(instant(run.started_at)),
            started_at_ms: run.started_at,
            ended_at: run.ended_at.map(|at| instant_text(instant(at))),
            ended_at_ms: run.ended_at,
            duration_ms: millis(duration(run, record.server_time).0),
            ttl_left_ms: run.ttl_left.map(millis),
        }),
        next_tick: next.map(instant_text),
        next_tick_ms: next.map(crate::scheduled::ms),
        counts: CountsJson {
            started: counts.started,
            completed: counts.completed,
            missed: counts.missed,
            skipped: counts.skipped,
            abandoned: counts.abandoned,
            reruns: counts.reruns,
        },
        last_seen: instant_text(instant(record.last_seen)),
        last_seen_ms: record.last_seen,
        server_time: instant_text(instant(record.server_time)),
        server_time_ms: record.server_time,
    };
    serde_json::to_string(&value).unwrap_or_else(|e| format!("{{\"error\":{:?}}}", e.to_string()))
}
