//! How soon a long-lived node re-runs a scheduled run whose node died,
//! per topology (standalone, Sentinel, Cluster), judged by the server's
//! own clock: its `expired` keyspace event for the run's lease, its
//! `PEXPIRETIME` for that lease, and its `TIME` when the re-run starts.
//!
//! Each round:
//!
//! 1. A *dying* node (a [`LeaseManager`] whose [`RedisBackend`] reaches
//!    the master that owns the job's slot through the testkit [`Proxy`],
//!    on a plain `redis://` URL) runs the current tick of an hourly job
//!    ([`RUN_TTL`] run lease, start deadline an hour). Its work tells the
//!    test that it started, then waits for ever, ignoring its token.
//! 2. A *watcher* node (its own manager, on the topology's own URL:
//!    `redis://`, `redis+sentinel://` or `redis+cluster://`) runs
//!    [`LeaseManager::run_schedule`] for the job under
//!    [`OnAbandon::Rerun`]; it first finds the tick decided (started, by
//!    the dying run) and watches the run's lease.
//! 3. The proxy is switched to blackhole: the dying node can neither renew
//!    nor release, its token fires by its deadline, and the server expires
//!    the lease by its ttl. The `expired` event (`notify-keyspace-events
//!    Ex` on the owning master, a side subscription) marks the expiry; the
//!    re-run's work marks its start (a local instant and the server's
//!    `TIME`, on a side connection).
//!
//! Asserted: the re-run is [`TickOutcome::Ran`] for the same tick, reason
//! [`TickReason::Rerun`], with a fencing token above the dead run's; it
//! started after the server's expiry (its `TIME` past `PEXPIRETIME`); the
//! job's record counts one re-run; and it started within the topology's
//! bound of the expiry event ([`PUSHED_BOUND`], [`CLUSTER_BOUND`]).
//!
//! On Sentinel and Cluster the dying node's client is a plain client of
//! the owning master (through the proxy) rather than a Sentinel or Cluster
//! client: a Sentinel client asks the sentinels for the master's own
//! address, and a Cluster client the nodes for theirs, so neither would
//! keep to a proxy. What is measured is the watcher, which uses the
//! topology's own client; the dying node only has to hold the lease and
//! then go silent, which a cut link does on every topology alike, and the
//! server then expires the lease by its ttl, without a release.
//!
//! The first figure may be slightly negative: when the watcher's own read
//! is what finds the key expired (its timer runs 2 ms past the ttl it
//! read, often before the server's expire cycle), the server sends the
//! event in that step, and it arrives here about when the re-run starts.
//! The second figure, from `PEXPIRETIME` to the re-run's `TIME`, is on
//! the server's clock alone.
//!
//! Each test prints its figures:
//! `cargo test --test tick_rerun -- --nocapture`;
//! `LEASEHOLD_RERUN_ROUNDS=N` runs N rounds per topology (default 1) and
//! prints their range.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use leasehold::jobs::{TickReason, TickState};
use leasehold::redis::RedisBackend;
use leasehold::redis::redis;
use leasehold::{
    CancellationToken, Every, FencingToken, LeaseManager, LeaseOptions, OnAbandon, TickJob,
    TickOutcome, TickRun, UNREPORTED_RECHECK,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisCluster, RedisServer, SentinelSet};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, timeout, timeout_at};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

/// The job's period: one tick an hour, so that the next tick never comes
/// during a round and a re-run can only come from the watch.
const PERIOD: Duration = Duration::from_secs(3600);
/// How long after its tick a run may start: the whole period.
const START_DEADLINE: Duration = Duration::from_secs(3600);
/// The run lease's ttl.
const RUN_TTL: Duration = Duration::from_secs(2);
/// What a step with no timing claim (a start, a first answer, a
/// shutdown) may take on two shared cores before the test gives up.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long one round may take in all: a backstop.
const ROUND_LIMIT: Duration = Duration::from_secs(60);

/// Time for a handful of round trips and a task wake-up on this machine,
/// with room for two shared cores on which other builds run. What a
/// re-run needs after the watch learns the lease is gone: the watch's own
/// read (`inspect`), the claim (`claim_rerun`, which grants the new run's
/// lease), the run's registration, and the work's `TIME`: four local
/// round trips, each well under a millisecond on an idle machine.
const ROUND_TRIPS: Duration = Duration::from_millis(500);

/// Standalone and Sentinel: the bound from the server's `expired` event
/// to the re-run's start.
///
/// The watcher's leader watch reads the run key again whenever client
/// tracking pushes a change of it: each renewal of the dead run (so the
/// ttl it last read is the one the last renewal set), and its deletion
/// when the server expires it, which the server reports in the same step
/// as the `expired` event (Redis finds an expired key by its active expire
/// cycle, every 100 ms with the default `hz 10`, or by an access). Besides,
/// its fallback timer reads at that ttl plus 2 ms, so it does not wait for
/// the expire cycle: the read that finds the key gone comes at most 2 ms
/// after the expiry, or with the event when the event comes first. From
/// the event on, then, only [`ROUND_TRIPS`] remain.
const PUSHED_BOUND: Duration = ROUND_TRIPS;

/// Cluster: the bound from the server's `expired` event to the re-run's
/// start.
///
/// The redis crate's cluster client turns no tracking on, so the leader
/// watch has no change feed and reads the key again at the lease's
/// remaining ttl as read (plus 2 ms), at most [`UNREPORTED_RECHECK`] (1 s)
/// after the previous read. The last read before the expiry normally sees
/// under a second left and so reads again 2 ms past the expiry; but a read
/// whose reply came late and still saw a little over a second left reads
/// again a full recheck later, past the expiry. The first read after the
/// expiry is thus at most one recheck after it, and then [`ROUND_TRIPS`]
/// remain: 1.5 s.
const CLUSTER_BOUND: Duration = UNREPORTED_RECHECK.saturating_add(ROUND_TRIPS);

/// One topology under test, and the servers to judge it by.
enum Topology<'a> {
    Standalone(&'a RedisServer),
    Sentinel(&'a SentinelSet),
    Cluster(&'a RedisCluster),
}

impl Topology<'_> {
    fn name(&self) -> &'static str {
        match self {
            Self::Standalone(_) => "standalone",
            Self::Sentinel(_) => "sentinel",
            Self::Cluster(_) => "cluster",
        }
    }

    /// The watcher's URL: the topology's own client.
    fn url(&self) -> String {
        match self {
            Self::Standalone(server) => server.url(),
            Self::Sentinel(set) => set.url(),
            Self::Cluster(cluster) => cluster.url(),
        }
    }

    /// The master that holds `key`.
    fn owner(&self, key: &str) -> Result<&RedisServer, Error> {
        Ok(match self {
            Self::Standalone(server) => server,
            Self::Sentinel(set) => set.master(),
            Self::Cluster(cluster) => {
                let slot = cluster.keyslot(key)?;
                &cluster.nodes()[cluster.master_of_slot(slot)?]
            }
        })
    }

    fn bound(&self) -> Duration {
        match self {
            Self::Standalone(_) | Self::Sentinel(_) => PUSHED_BOUND,
            Self::Cluster(_) => CLUSTER_BOUND,
        }
    }
}

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`.
async fn within<T>(
    limit: Duration,
    what: &str,
    future: impl Future<Output = T>,
) -> Result<T, Error> {
    timeout(limit, future)
        .await
        .map_err(|_| format!("{what}: nothing within {limit:?}").into())
}

/// The server's clock, in microseconds since the UNIX epoch (`TIME`).
async fn server_us(conn: &mut redis::aio::MultiplexedConnection) -> Result<u64, Error> {
    let (secs, micros): (u64, u64) =
        within(PATIENCE, "TIME", redis::cmd("TIME").query_async(conn)).await??;
    Ok(secs * 1_000_000 + micros)
}

/// Milliseconds from `earlier` to `later`, negative when `later` is
/// before it.
fn ms_from(earlier: Instant, later: Instant) -> f64 {
    if later >= earlier {
        (later - earlier).as_secs_f64() * 1e3
    } else {
        -(earlier - later).as_secs_f64() * 1e3
    }
}

/// Milliseconds from `earlier_us` to `later_us` (server microseconds).
fn server_ms_from(earlier_us: u64, later_us: u64) -> f64 {
    // Microsecond counts since 1970 are far below 2^53: exact as f64.
    #[allow(clippy::cast_precision_loss)]
    let (earlier, later) = (earlier_us as f64, later_us as f64);
    (later - earlier) / 1e3
}

/// The job as one node runs it: hourly, an hour's start deadline, a
/// [`RUN_TTL`] run lease labelled `node`, abandoned runs re-run.
fn job(name: &str, node: &str) -> Result<TickJob, Error> {
    Ok(TickJob::builder(name, Every::new(PERIOD)?)
        .start_deadline(START_DEADLINE)
        .on_abandon(OnAbandon::Rerun)
        .lease(LeaseOptions::builder().ttl(RUN_TTL).label(node))
        .build()?)
}

/// Subscribes to the `expired` events of `client`'s server and returns a
/// receiver of the first one for `key`: the local instant it arrived, and
/// the server's `TIME` read just after (a bound above the event's).
async fn expiry_of(
    client: &redis::Client,
    key: String,
) -> Result<oneshot::Receiver<(Instant, Option<u64>)>, Error> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.subscribe("__keyevent@0__:expired").await?;
    let mut clock = client.get_multiplexed_async_connection().await?;
    let (send, receive) = oneshot::channel();
    tokio::spawn(async move {
        let mut messages = pubsub.into_on_message();
        while let Some(message) = messages.next().await {
            if message.get_payload::<String>().is_ok_and(|k| k == key) {
                let at = Instant::now();
                let server = server_us(&mut clock).await.ok();
                let _ = send.send((at, server));
                return;
            }
        }
    });
    Ok(receive)
}

/// Waits, when the current hour's tick is less than a minute from its
/// end, until the next hour has begun: the round's tick must stay the
/// newest while it runs. A wait for the clock, not for a signal.
async fn clear_of_the_hour(conn: &mut redis::aio::MultiplexedConnection) -> TestResult {
    let period_ms = u64::try_from(PERIOD.as_millis())?;
    let now_ms = server_us(conn).await? / 1000;
    let left = period_ms - now_ms % period_ms;
    if left < 60_000 {
        tokio::time::sleep(Duration::from_millis(left + 1000)).await;
    }
    Ok(())
}

/// What the re-run's work saw as it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Start {
    /// When, on this machine.
    at: Instant,
    /// The server's clock then (`TIME`, µs), if it answered.
    server_us: Option<u64>,
    tick: SystemTime,
    token: FencingToken,
}

/// The figures of one round.
struct Measured {
    /// From the `expired` event's arrival to the re-run's start (local).
    delay_ms: f64,
    /// From the server's expiry (`PEXPIRETIME`) to the re-run's `TIME`.
    server_delay_ms: Option<f64>,
    /// From the server's expiry to its `TIME` read when the event arrived.
    event_lag_ms: Option<f64>,
    /// How long before the `expired` event the dying node's token fired.
    dying_margin_ms: f64,
    /// From the cut to the `expired` event.
    cut_to_expiry_ms: f64,
}

/// One round on `topology`, for the job `name`.
#[allow(clippy::too_many_lines)] // one story, told in order
async fn round(topology: &Topology<'_>, name: &str) -> Result<Measured, Error> {
    let label = topology.name();
    let bound = topology.bound();
    let run_key = format!("leasehold:job:{{{name}}}:run");
    let record_key = format!("leasehold:job:{{{name}}}:record");
    let owner = topology.owner(&run_key)?;
    owner.cli(&["CONFIG", "SET", "notify-keyspace-events", "Ex"])?;
    let client = redis::Client::open(owner.url())?;
    let mut side = within(
        PATIENCE,
        "a side connection",
        client.get_multiplexed_async_connection(),
    )
    .await??;
    let expired = expiry_of(&client, run_key.clone()).await?;
    clear_of_the_hour(&mut side).await?;

    // 1. The dying node, through the proxy.
    let proxy = Proxy::start(owner.addr()).await?;
    let dying = LeaseManager::new(
        within(
            PATIENCE,
            "the dying node's connection",
            RedisBackend::connect(proxy.url()),
        )
        .await??,
    )?;
    let dying_job = job(name, "dying")?;
    let tick = dying_job
        .tick_to_ask(SystemTime::now())
        .ok_or("no tick on the grid")?;
    let (started, dying_started) =
        oneshot::channel::<(FencingToken, SystemTime, CancellationToken)>();
    let dying_run = tokio::spawn({
        let dying = dying.clone();
        async move {
            dying
                .run_tick(&dying_job, tick, move |run: TickRun| async move {
                    let _ = started.send((run.fencing_token(), run.tick(), run.token().clone()));
                    // It never completes, whatever its token says.
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    let (dead_token, dead_tick, dying_token) =
        within(PATIENCE, "the dying node's run to start", dying_started).await??;
    assert_eq!(
        dead_tick, tick,
        "{label}: the dying run runs the tick asked for"
    );

    // 2. The watcher, on the topology's own client.
    let watcher = LeaseManager::new(
        within(
            PATIENCE,
            "the watcher's connection",
            RedisBackend::connect(topology.url()),
        )
        .await??,
    )?;
    let watcher_job = job(name, "watcher")?;
    let (outcome_sent, mut outcomes) = mpsc::unbounded_channel();
    let (start_sent, mut starts) = mpsc::unbounded_channel::<Start>();
    let work = {
        let clock = side.clone();
        move |run: TickRun| {
            let (starts, mut clock) = (start_sent.clone(), clock.clone());
            async move {
                let at = Instant::now();
                let server_us = server_us(&mut clock).await.ok();
                let start = Start {
                    at,
                    server_us,
                    tick: run.tick(),
                    token: run.fencing_token(),
                };
                let _ = starts.send(start);
                start
            }
        }
    };
    let schedule = tokio::spawn({
        let watcher = watcher.clone();
        async move {
            watcher
                .run_schedule(&watcher_job, work, move |outcome| {
                    let _ = outcome_sent.send((Instant::now(), outcome));
                })
                .await
        }
    });
    let (_, first) = within(PATIENCE, "the watcher's first answer", outcomes.recv())
        .await?
        .ok_or("the watcher's loop ended")?;
    match first? {
        TickOutcome::Decided {
            tick: asked,
            decision,
        } if asked == tick
            && decision.state == TickState::Started
            && decision.run.as_ref().map(|r| r.fencing_token) == Some(dead_token) => {}
        other => {
            return Err(format!(
                "{label}: the watcher should find the tick started by the dying run ({dead_token}), found {other:?}"
            )
            .into());
        }
    }

    // 3. The cut: the dying node can neither renew nor release.
    proxy.set_mode(ProxyMode::Blackhole);
    let cut_at = Instant::now();
    within(
        RUN_TTL + PATIENCE,
        "the dying node's token",
        dying_token.cancelled(),
    )
    .await?;
    let lost_at = Instant::now();
    // Read once the dying node has stopped believing in its lease: any
    // renewal it sent before the cut has reached the server by then.
    let expires_ms: i64 = within(
        PATIENCE,
        "PEXPIRETIME",
        redis::cmd("PEXPIRETIME")
            .arg(&run_key)
            .query_async(&mut side),
    )
    .await??;
    let expires_us = u64::try_from(expires_ms).ok().map(|ms| ms * 1000);
    let (expired_at, event_server_us) =
        within(RUN_TTL + PATIENCE, "the server's expired event", expired).await??;

    // 4. The re-run's start, within the bound of the expiry.
    let start = timeout_at(expired_at + bound, starts.recv())
        .await
        .map_err(|_| {
            format!(
                "{label}: no re-run started within {bound:?} of the server's expired event for {run_key}"
            )
        })?
        .ok_or("the watcher's work is gone")?;
    let delay_ms = ms_from(expired_at, start.at);
    let (_, rerun) = within(PATIENCE, "the re-run's outcome", outcomes.recv())
        .await?
        .ok_or("the watcher's loop ended")?;
    match rerun? {
        TickOutcome::Ran {
            tick: ran,
            fencing_token,
            reason,
            output,
        } => {
            assert_eq!(reason, TickReason::Rerun, "{label}: the re-run's reason");
            assert_eq!(ran, tick, "{label}: the re-run is of the dead run's tick");
            assert_eq!(output, start, "{label}: the re-run is the start seen");
            assert!(
                fencing_token > dead_token,
                "{label}: the re-run's token {fencing_token} must be above the dead run's {dead_token}"
            );
        }
        other => return Err(format!("{label}: expected the re-run, got {other:?}").into()),
    }
    assert_eq!(
        start.tick, tick,
        "{label}: the re-run's work is given the tick"
    );
    let record: HashMap<String, String> = within(
        PATIENCE,
        "HGETALL",
        redis::cmd("HGETALL")
            .arg(&record_key)
            .query_async(&mut side),
    )
    .await??;
    let field = |f: &str| record.get(f).map_or("", String::as_str);
    assert_eq!(field("reruns"), "1", "{label}: one re-run in {record:?}");
    assert_eq!(field("run_reason"), "rerun", "{label}: {record:?}");
    assert_eq!(field("run_state"), "completed", "{label}: {record:?}");
    assert_eq!(
        field("run_token"),
        start.token.get().to_string(),
        "{label}: {record:?}"
    );
    let server_delay_ms = expires_us
        .zip(start.server_us)
        .map(|(expires, started)| server_ms_from(expires, started));
    if let Some(after) = server_delay_ms {
        assert!(
            after > 0.0,
            "{label}: the re-run started {after:.3} ms after the server's expiry of the dead run's lease: before it"
        );
    }
    assert!(
        delay_ms <= bound.as_secs_f64() * 1e3,
        "{label}: the re-run started {delay_ms:.1} ms after the expired event (bound {bound:?})"
    );
    // The same bound from the expiry itself, on the server's clock: the
    // watch does not wait for the server to report the expiry.
    if let Some(after) = server_delay_ms {
        assert!(
            after <= bound.as_secs_f64() * 1e3,
            "{label}: the re-run started {after:.1} ms after the server's expiry of the dead run's lease (bound {bound:?})"
        );
    }

    // Done: the watcher stops; the dying node is dropped, its work never
    // completed (and its link never healed).
    watcher.shutdown().await;
    within(PATIENCE, "the watcher's loop to end", schedule).await???;
    dying_run.abort();
    drop(proxy);
    Ok(Measured {
        delay_ms,
        server_delay_ms,
        event_lag_ms: expires_us
            .zip(event_server_us)
            .map(|(expires, seen)| server_ms_from(expires, seen)),
        dying_margin_ms: ms_from(lost_at, expired_at),
        cut_to_expiry_ms: ms_from(cut_at, expired_at),
    })
}

/// How many rounds each topology runs: `LEASEHOLD_RERUN_ROUNDS`, else 1.
fn rounds() -> Result<usize, Error> {
    match std::env::var("LEASEHOLD_RERUN_ROUNDS") {
        Ok(n) => Ok(n.parse::<usize>()?.max(1)),
        Err(_) => Ok(1),
    }
}

fn show(figure: Option<f64>) -> String {
    figure.map_or_else(|| "?".to_owned(), |ms| format!("{ms:.1} ms"))
}

/// Runs the rounds on `topology`, printing each round's figures and the
/// range of the measured delay.
async fn measure(topology: Topology<'_>) -> TestResult {
    let label = topology.name();
    let mut delays = Vec::new();
    for n in 0..rounds()? {
        let name = format!("rerun-{label}-{n}-{:08x}", fastrand::u32(..));
        let m = within(ROUND_LIMIT, "a round", round(&topology, &name)).await??;
        println!(
            "tick_rerun[{label}] round {n}: expired event -> re-run start {:.1} ms (bound {:?}); \
             server: PEXPIRETIME -> re-run TIME {}, PEXPIRETIME -> TIME at the event {}; \
             dying node's token fired {:.1} ms before the event; cut -> event {:.1} ms",
            m.delay_ms,
            topology.bound(),
            show(m.server_delay_ms),
            show(m.event_lag_ms),
            m.dying_margin_ms,
            m.cut_to_expiry_ms,
        );
        delays.push(m.delay_ms);
    }
    let min = delays.iter().copied().fold(f64::INFINITY, f64::min);
    let max = delays.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "tick_rerun[{label}]: expired event -> re-run start over {} round(s): min {min:.1} ms, max {max:.1} ms (bound {:?})",
        delays.len(),
        topology.bound(),
    );
    Ok(())
}

/// Standalone: the watch is pushed by client tracking, with its fallback
/// timer at the ttl last read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_reruns_an_abandoned_run_within_the_bound_of_its_expiry() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    measure(Topology::Standalone(&server)).await
}

/// Sentinel: the watcher reaches the master through the sentinels;
/// tracking runs on its master connection as on a standalone server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_reruns_an_abandoned_run_within_the_bound_of_its_expiry() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let set = SentinelSet::start()?;
    measure(Topology::Sentinel(&set)).await
}

/// Cluster: no change feed; the watch reads at the ttl it last read, at
/// most a recheck apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_reruns_an_abandoned_run_within_the_bound_of_its_expiry() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let cluster = RedisCluster::start(3, 0)?;
    measure(Topology::Cluster(&cluster)).await
}
