//! `progress_window` with each of the three ways of running work under a
//! lease — [`LeaseManager::with_lease`], an [`Election`]'s term and a
//! scheduled tick's run ([`LeaseManager::run_tick`]) — against a real
//! redis-server, judged by the server: a side connection (`GET`, `PTTL`)
//! reads the lease's key, never the library's own view of it.
//!
//! Every lease has a 1 s ttl (renewed every 333 ms, 100 ms safety margin)
//! and a 600 ms progress window.
//!
//! - *Keeps*: the work reports every 100 ms for 3 s (three ttls, five
//!   windows). At every report the key holds the value it held when the
//!   work started (the same holder and fencing token), and still does at
//!   the end, with time left to live; the token never fired; the work
//!   completed and the shape's outcome is a success.
//! - *Stalls*: the work reports every 100 ms for 1 s (the key unchanged at
//!   every report), then stops reporting and ignores its token, as a
//!   stuck job would. Its token fires with [`LossReason::Stalled`] more
//!   than the window and at most the window + one renew interval + a
//!   measured slack after its last report (see
//!   `LeaseOptionsBuilder::progress_window`), while the key still lives on
//!   the server; the key is then gone from the server (released by the
//!   watchdog about a safety margin later, the work still running), well
//!   before it would have expired.
//!
//! The lease keys: `leasehold:{<key>}` for `with_lease` and an election,
//! `leasehold:job:{<job>}:run` for a tick's run.
//!
//! Each test prints its figures: `cargo test --test progress_bound --
//! --nocapture`.

use std::time::{Duration, SystemTime};

use leasehold::redis::RedisBackend;
use leasehold::{
    CancellationToken, Election, Every, LeaseError, LeaseManager, LeaseOptions,
    LeaseOptionsBuilder, LossReason, TickJob, TickOutcome, WorkContext,
};
use leasehold_testkit::RedisServer;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

/// The leases' ttl: renewed every 333 ms, with a 100 ms safety margin.
const TTL: Duration = Duration::from_secs(1);
/// The leases' progress window.
const WINDOW: Duration = Duration::from_millis(600);
/// How often a job that makes progress reports it.
const REPORT_EVERY: Duration = Duration::from_millis(100);
/// How long the job that keeps its lease reports: three ttls, five
/// windows.
const KEEP_FOR: Duration = Duration::from_secs(3);
/// How long the job that stalls reports before it stops: three renewals.
const STALL_AFTER: Duration = Duration::from_secs(1);
/// What the token's firing may take beyond the documented bound (the
/// window + one renew interval after the last report), and the watchdog's
/// release beyond its safety margin after the token fired: the watchdog's
/// wake, a renewal or release round trip, and this test's own wake, on
/// two cores shared with other builds. Measured here (the figures are
/// printed): the token fired 638–655 ms after the last report, at a
/// renewal time (666–668 ms of the key's PTTL left, one renew interval
/// after the last renewal, give or take 2 ms), and the key was gone
/// 101–105 ms after the token fired.
const SLACK: Duration = Duration::from_millis(100);
/// The longest any step may take before the test gives up: far above
/// every bound, so only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(15);
/// How often the side connection looks for the key once the token fired.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// The three ways of running work under a lease.
#[derive(Debug, Clone, Copy)]
enum Shape {
    WithLease,
    Election,
    Tick,
}

impl Shape {
    /// The Redis key of the lease that `name`'s work runs under.
    fn redis_key(self, name: &str) -> String {
        match self {
            Self::WithLease | Self::Election => format!("leasehold:{{{name}}}"),
            Self::Tick => format!("leasehold:job:{{{name}}}:run"),
        }
    }
}

/// How a shape's call ended.
#[derive(Debug)]
enum Ended<T> {
    /// It returned the work's output (an election: the term ended and the
    /// election returned).
    Output(T),
    /// It returned [`LeaseError::LeaseEnded`].
    LeaseEnded(LossReason),
}

/// The lease options every shape uses: the ttl and the window.
fn lease_options() -> LeaseOptionsBuilder {
    LeaseOptions::builder().ttl(TTL).progress_window(WINDOW)
}

async fn side(server: &RedisServer) -> Result<MultiplexedConnection, Error> {
    Ok(redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?)
}

/// Runs `body` under a lease `name` in `shape`, on a task of its own.
fn spawn_under<F, Fut, T>(
    shape: Shape,
    manager: LeaseManager<RedisBackend>,
    name: &str,
    body: F,
) -> Result<JoinHandle<Result<Ended<T>, Error>>, Error>
where
    F: FnOnce(WorkContext) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let ended = |outcome: Result<T, LeaseError>| match outcome {
        Ok(output) => Ok(Ended::Output(output)),
        Err(LeaseError::LeaseEnded { reason, .. }) => Ok(Ended::LeaseEnded(reason)),
        Err(error) => Err(Error::from(error)),
    };
    Ok(match shape {
        Shape::WithLease => {
            let options = lease_options().build()?;
            let name = name.to_owned();
            tokio::spawn(async move { ended(manager.with_lease(&name, &options, body).await) })
        }
        Shape::Election => {
            let election = Election::new(manager, name, lease_options().build()?)?;
            tokio::spawn(async move {
                let stop = CancellationToken::new();
                let (output_tx, output_rx) = oneshot::channel();
                let mut term = Some((body, output_tx));
                election
                    .run(stop.clone(), |work| {
                        let term = term.take();
                        let stop = stop.clone();
                        async move {
                            // One term: the election stops when it ends.
                            if let Some((body, output)) = term {
                                let _ = output.send(body(work).await);
                            }
                            stop.cancel();
                        }
                    })
                    .await?;
                let output = output_rx.await.map_err(|_| "the election ran no term")?;
                Ok(Ended::Output(output))
            })
        }
        Shape::Tick => {
            // Hourly, with an hour's start deadline: the current tick is
            // on time and granted to this, the only node.
            let job = TickJob::builder(name, Every::new(Duration::from_secs(3_600))?)
                .start_deadline(Duration::from_secs(3_600))
                .lease(lease_options())
                .build()?;
            let tick = job
                .tick_to_ask(SystemTime::now())
                .ok_or("no tick on the grid")?;
            tokio::spawn(async move {
                let outcome = manager
                    .run_tick(&job, tick, |run| body(run.work().clone()))
                    .await;
                match outcome {
                    Ok(TickOutcome::Ran { output, .. }) => Ok(Ended::Output(output)),
                    Ok(_) => Err("the tick was not run by this node".into()),
                    Err(error) => ended(Err(error)),
                }
            })
        }
    })
}

/// What the side connection saw while the work reported progress.
#[derive(Debug)]
struct Reporting {
    /// The key's value when the work started: `<holder>:<token>:<label>`.
    value: String,
    /// How many reports the work made.
    reports: u32,
    /// How many `GET`s, each just after a report, found that same value.
    same: u32,
    /// The first `GET` that found something else, and when (after the
    /// work started).
    changed: Option<(Duration, Option<String>)>,
    /// Just before the last report.
    last_report: Instant,
    /// Whether the token had fired by the last report.
    fired: bool,
}

/// Reports progress every [`REPORT_EVERY`] for `period`, reading the
/// lease's key on the side connection after each report.
async fn report_for(
    work: &WorkContext,
    side: &mut MultiplexedConnection,
    key: &str,
    period: Duration,
) -> Result<Reporting, Error> {
    let start = Instant::now();
    let value: Option<String> = side.get(key).await?;
    let value = value.ok_or_else(|| format!("no {key} on the server as the work starts"))?;
    let token = value.split(':').nth(1).and_then(|t| t.parse::<u64>().ok());
    if token != Some(work.fencing_token().get()) {
        return Err(format!(
            "{key} holds {value:?}, not the work's fencing token {}",
            work.fencing_token()
        )
        .into());
    }
    let mut seen = Reporting {
        value,
        reports: 0,
        same: 0,
        changed: None,
        last_report: start,
        fired: false,
    };
    // On whatever the token says: the server judges whether the lease
    // was kept.
    while start.elapsed() < period {
        // The pace of the job's progress, not a synchronisation.
        sleep(REPORT_EVERY).await;
        seen.last_report = Instant::now();
        work.progress().report();
        seen.reports += 1;
        let now: Option<String> = side.get(key).await?;
        if now.as_deref() == Some(seen.value.as_str()) {
            seen.same += 1;
        } else {
            seen.changed = Some((start.elapsed(), now));
            break;
        }
    }
    seen.fired = work.is_cancelled();
    Ok(seen)
}

/// What the job that kept reporting saw at its end.
#[derive(Debug)]
struct Kept {
    reporting: Reporting,
    /// How long it ran.
    ran_for: Duration,
    /// The key's value and `PTTL` on the server at the end, the lease
    /// still held.
    value_at_end: Option<String>,
    pttl_at_end: i64,
    /// Whether the token ever fired (read at the end), and why.
    fired: bool,
    loss: Option<LossReason>,
}

/// A job that reports progress for [`KEEP_FOR`] and completes.
async fn keep_reporting(
    work: WorkContext,
    mut side: MultiplexedConnection,
    key: String,
) -> Result<Kept, Error> {
    let start = Instant::now();
    let reporting = report_for(&work, &mut side, &key, KEEP_FOR).await?;
    let (value_at_end, pttl_at_end): (Option<String>, i64) = redis::pipe()
        .atomic()
        .get(&key)
        .pttl(&key)
        .query_async(&mut side)
        .await?;
    Ok(Kept {
        reporting,
        ran_for: start.elapsed(),
        value_at_end,
        pttl_at_end,
        fired: work.is_cancelled(),
        loss: work.loss_reason(),
    })
}

async fn keeps(shape: Shape, name: &str) -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(&server.url()).await?)?;
    let key = shape.redis_key(name);
    let (kept_tx, kept_rx) = oneshot::channel();
    let body = {
        let side = side(&server).await?;
        let key = key.clone();
        move |work: WorkContext| async move {
            let fencing_token = work.fencing_token();
            let _ = kept_tx.send(keep_reporting(work, side, key).await);
            fencing_token
        }
    };
    let running = spawn_under(shape, manager.clone(), name, body)?;
    let kept = timeout(KEEP_FOR + PATIENCE, kept_rx)
        .await
        .map_err(|_| "the work did not end")?
        .map_err(|_| "the work never ran")??;
    let ended = timeout(PATIENCE, running).await???;
    println!(
        "{shape:?} keeps: {} reports over {:?}; {} GETs found {:?} unchanged, {:?} at the end with PTTL {} ms; token fired: {} ({:?}); ended {ended:?}",
        kept.reporting.reports,
        kept.ran_for,
        kept.reporting.same,
        kept.reporting.value,
        kept.value_at_end,
        kept.pttl_at_end,
        kept.fired,
        kept.loss,
    );

    // The server: the same lease (holder and fencing token) at every
    // report and at the end, and still live, three ttls after the start.
    assert_eq!(
        kept.reporting.changed, None,
        "{shape:?}: the key changed while the job reported"
    );
    assert_eq!(
        kept.value_at_end.as_deref(),
        Some(kept.reporting.value.as_str()),
        "{shape:?}: the key at the end"
    );
    assert!(
        kept.pttl_at_end > 0,
        "{shape:?}: PTTL {} at the end",
        kept.pttl_at_end
    );
    assert!(
        kept.ran_for >= KEEP_FOR && KEEP_FOR >= 3 * TTL,
        "{shape:?}: ran {:?}",
        kept.ran_for
    );
    assert!(
        kept.reporting.same >= 25,
        "{shape:?}: only {} checks",
        kept.reporting.same
    );
    // The holder: its token never fired.
    assert!(
        !kept.reporting.fired && !kept.fired,
        "{shape:?}: the token fired"
    );
    assert_eq!(kept.loss, None, "{shape:?}: the lease ended");
    // The work completed, and the call succeeded with its output.
    match ended {
        Ended::Output(_) => {}
        Ended::LeaseEnded(reason) => panic!("{shape:?}: the call ended with the lease {reason}"),
    }
    timeout(PATIENCE, manager.shutdown()).await?;
    Ok(())
}

/// What the job that stopped reporting saw when its token fired.
#[derive(Debug)]
struct Stall {
    reporting: Reporting,
    /// When the token fired (as the work saw it), and why.
    fired: Instant,
    loss: Option<LossReason>,
    /// The key's value and `PTTL` on the server just after.
    value_at_fire: Option<String>,
    pttl_at_fire: i64,
}

/// A job that reports for [`STALL_AFTER`], then stops reporting, waits for
/// its token, tells the test, and goes on (ignoring its token, as a stuck
/// job would) until the test lets it finish.
async fn report_then_stall(
    work: WorkContext,
    mut side: MultiplexedConnection,
    key: String,
    stalled: oneshot::Sender<Result<Stall, Error>>,
    finish: oneshot::Receiver<()>,
) {
    let stall = async {
        let reporting = report_for(&work, &mut side, &key, STALL_AFTER).await?;
        timeout(PATIENCE, work.cancelled())
            .await
            .map_err(|_| "the token did not fire")?;
        let fired = Instant::now();
        let (value_at_fire, pttl_at_fire): (Option<String>, i64) = redis::pipe()
            .atomic()
            .get(&key)
            .pttl(&key)
            .query_async(&mut side)
            .await?;
        Ok(Stall {
            reporting,
            fired,
            loss: work.loss_reason(),
            value_at_fire,
            pttl_at_fire,
        })
    };
    let _ = stalled.send(stall.await);
    let _ = timeout(PATIENCE, finish).await;
}

/// Polls the key on the side connection until it no longer holds `value`
/// (gone, or held by someone else): when, and what it then held.
async fn released(
    side: &mut MultiplexedConnection,
    key: &str,
    value: &str,
) -> Result<(Instant, Option<String>), Error> {
    timeout(PATIENCE, async {
        loop {
            let now: Option<String> = side.get(key).await?;
            if now.as_deref() != Some(value) {
                return Ok::<_, Error>((Instant::now(), now));
            }
            sleep(PROBE_EVERY).await;
        }
    })
    .await
    .map_err(|_| format!("{key} still held {value:?} {PATIENCE:?} later"))?
}

async fn stalls(shape: Shape, name: &str) -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(RedisBackend::connect(&server.url()).await?)?;
    let options = lease_options().build()?;
    let key = shape.redis_key(name);
    let mut probe = side(&server).await?;
    let (stalled_tx, stalled_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel();
    let body = {
        let side = side(&server).await?;
        let key = key.clone();
        move |work: WorkContext| report_then_stall(work, side, key, stalled_tx, finish_rx)
    };
    let running = spawn_under(shape, manager.clone(), name, body)?;
    let stall = timeout(STALL_AFTER + PATIENCE, stalled_rx)
        .await
        .map_err(|_| "the work did not stall")?
        .map_err(|_| "the work never ran")??;
    // The work still runs, ignoring its token: the watchdog releases.
    let (gone, held_then) = released(&mut probe, &key, &stall.reporting.value).await?;
    let _ = finish_tx.send(());
    let ended = timeout(PATIENCE, running).await???;

    let silent = stall.fired - stall.reporting.last_report;
    let bound = WINDOW + options.renew_interval();
    let release = gone - stall.fired;
    let pttl = Duration::from_millis(u64::try_from(stall.pttl_at_fire).unwrap_or(0));
    println!(
        "{shape:?} stalls: {} reports, {} GETs unchanged; token fired {silent:?} after the last report (window {WINDOW:?}, bound {bound:?} + slack {SLACK:?}), {:?}, the key then {:?} with PTTL {} ms; gone from the server {release:?} after the fire (safety margin {:?}), now {held_then:?}; ended {ended:?}",
        stall.reporting.reports,
        stall.reporting.same,
        stall.loss,
        stall.value_at_fire,
        stall.pttl_at_fire,
        options.safety_margin(),
    );

    // It reported, and kept its lease, until it stopped.
    assert_eq!(
        stall.reporting.changed, None,
        "{shape:?}: the key changed while the job reported"
    );
    assert!(
        !stall.reporting.fired,
        "{shape:?}: the token fired while the job reported"
    );
    assert!(
        stall.reporting.reports >= 8,
        "{shape:?}: {} reports",
        stall.reporting.reports
    );
    // The token: stalled, within the documented bound of the last report.
    assert_eq!(stall.loss, Some(LossReason::Stalled), "{shape:?}");
    assert!(
        silent > WINDOW,
        "{shape:?}: fired {silent:?} after the last report, within the window"
    );
    assert!(
        silent <= bound + SLACK,
        "{shape:?}: fired {silent:?} after the last report, past {bound:?} + {SLACK:?}"
    );
    // The server: the key still this lease's when the token fired, then
    // gone while the work still ran, released before it would expire.
    assert_eq!(
        stall.value_at_fire.as_deref(),
        Some(stall.reporting.value.as_str()),
        "{shape:?}: the key when the token fired"
    );
    assert!(
        stall.pttl_at_fire > 0,
        "{shape:?}: PTTL {} when the token fired",
        stall.pttl_at_fire
    );
    assert_eq!(held_then, None, "{shape:?}: the key after the release");
    assert!(
        release <= options.safety_margin() + SLACK,
        "{shape:?}: gone {release:?} after the token fired"
    );
    assert!(
        release < pttl,
        "{shape:?}: gone {release:?} after the token fired, not before its expiry {pttl:?} later"
    );
    // The call: the lease ended as stalled (an election's term simply
    // ends, and the election returns once stopped).
    match (shape, ended) {
        (Shape::Election, Ended::Output(())) => {}
        (Shape::WithLease | Shape::Tick, Ended::LeaseEnded(LossReason::Stalled)) => {}
        (_, ended) => panic!("{shape:?}: the call ended {ended:?}"),
    }
    timeout(PATIENCE, manager.shutdown()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_keeps_its_lease_while_the_work_reports() -> TestResult {
    keeps(Shape::WithLease, "progress-with-lease-keeps").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_loses_its_lease_when_the_work_stops_reporting() -> TestResult {
    stalls(Shape::WithLease, "progress-with-lease-stalls").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_term_keeps_its_lease_while_the_leader_reports() -> TestResult {
    keeps(Shape::Election, "progress-election-keeps").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_term_loses_its_lease_when_the_leader_stops_reporting() -> TestResult {
    stalls(Shape::Election, "progress-election-stalls").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_run_keeps_its_lease_while_the_job_reports() -> TestResult {
    keeps(Shape::Tick, "progress-tick-keeps").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_run_loses_its_lease_when_the_job_stops_reporting() -> TestResult {
    stalls(Shape::Tick, "progress-tick-stalls").await
}
