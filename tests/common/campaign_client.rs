//! What both campaigns (tests/campaign.rs and tests/campaign_failover.rs)
//! share: their settings, the lease client they run (acquire a random key,
//! make fenced writes while the token is live, release, and record it all
//! in the history), and the end of a run with the checks every campaign
//! makes. Each campaign keeps its own faults and its own verdict on overlaps.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, LossReason, Ttl, clock_drift};
use leasehold_testkit::{
    FENCED_WRITE_SCRIPT, Fault, FaultPlan, History, HoldEnd, PlanShape, RedisServer, Report,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The campaigns' error type: clients run on their own tasks.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The campaigns' result type.
pub(crate) type TestResult = Result<(), BoxError>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A campaign's size and lease settings: `LEASEHOLD_CAMPAIGN_SECS`,
/// `_SEED` (default: the clock), `_CLIENTS` (default 4) and `_KEYS`, or the
/// campaign's own defaults.
pub(crate) struct Settings {
    pub(crate) run_for: Duration,
    pub(crate) seed: u64,
    pub(crate) clients: usize,
    pub(crate) keys: usize,
    pub(crate) ttl: Duration,
    pub(crate) options: LeaseOptions,
}

impl Settings {
    pub(crate) fn from_env(ttl: Duration, secs: u64, keys: u64) -> Result<Self, BoxError> {
        let seed = env_u64(
            "LEASEHOLD_CAMPAIGN_SEED",
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_secs()),
        );
        Ok(Self {
            run_for: Duration::from_secs(env_u64("LEASEHOLD_CAMPAIGN_SECS", secs)),
            seed,
            clients: usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_CLIENTS", 4))?.max(1),
            keys: usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_KEYS", keys))?.max(1),
            ttl,
            options: LeaseOptions::builder()
                .ttl(Ttl::new(ttl)?)
                .wait(ttl)
                .name("campaign")
                .build()?,
        })
    }

    pub(crate) fn renew_interval(&self) -> Duration {
        self.options.renew_interval()
    }

    /// The faults `draw` plans for this campaign.
    pub(crate) fn plan(&self, draw: fn(u64, PlanShape) -> FaultPlan) -> FaultPlan {
        draw(
            self.seed,
            PlanShape {
                run_for: self.run_for,
                clients: self.clients,
                ttl: self.ttl,
                renew_interval: self.renew_interval(),
            },
        )
    }
}

/// A fault as it happened: when it began and when it was healed.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub(crate) fault: Fault,
    pub(crate) began: Instant,
    pub(crate) healed: Instant,
}

/// A campaign's clients, running.
pub(crate) struct Clients {
    pub(crate) started: Instant,
    history: History,
    tally: Arc<Mutex<Tally>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<TestResult>>,
}

impl Clients {
    /// Starts one client per manager, writing to `resource`.
    pub(crate) async fn start(
        settings: &Settings,
        managers: &[LeaseManager<RedisBackend>],
        resource: &RedisServer,
    ) -> Result<Self, BoxError> {
        let history = History::new();
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = CancellationToken::new();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for (i, manager) in managers.iter().enumerate() {
            let conn = redis::Client::open(resource.url())?
                .get_multiplexed_async_connection()
                .await?;
            tasks.push(tokio::spawn(client(Client {
                name: format!("c{i}"),
                manager: manager.clone(),
                options: settings.options.clone(),
                keys: settings.keys,
                history: history.clone(),
                tally: Arc::clone(&tally),
                resource: conn,
                stop: stop.clone(),
                rng: fastrand::Rng::with_seed(settings.seed.wrapping_add(i as u64 + 1)),
            })));
        }
        Ok(Self {
            started,
            history,
            tally,
            stop,
            tasks,
        })
    }

    /// Stops the clients and shuts the managers down, adds the resource's
    /// own order of accepted writes to the history, and checks it.
    pub(crate) async fn finish(
        self,
        managers: &[LeaseManager<RedisBackend>],
        resource: &RedisServer,
        keys: usize,
    ) -> Result<(Report, Tally), BoxError> {
        self.stop.cancel();
        for task in self.tasks {
            task.await??;
        }
        for manager in managers {
            manager.shutdown().await;
        }
        let mut conn = redis::Client::open(resource.url())?
            .get_multiplexed_async_connection()
            .await?;
        for k in 0..keys {
            let log: Vec<String> = redis::cmd("LRANGE")
                .arg(format!("res:{k}:log"))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            for entry in log {
                let (token, holder) = entry.split_once(':').ok_or("malformed log entry")?;
                self.history
                    .resource_accepted(format!("key{k}"), holder, token.parse()?);
            }
        }
        let report = self.history.check();
        let tally = std::mem::take(&mut *self.tally.lock().map_err(|_| "tally poisoned")?);
        Ok((report, tally))
    }
}

/// What every campaign asserts, whatever its faults: enough leases to
/// judge, no stale write accepted, tokens in order, and no token fired by
/// deadline at or after its lease's earliest expiry.
pub(crate) fn assert_sound(report: &Report, tally: &Tally) {
    assert!(
        report.holds >= 10,
        "too few leases to judge anything: {report}"
    );
    assert!(
        report.stale_writes.is_empty(),
        "the fenced resource accepted stale writes: {:?}",
        report.stale_writes
    );
    assert!(
        report.token_violations.is_empty(),
        "fencing tokens did not increase: {:?}",
        report.token_violations
    );
    assert!(
        tally.deadline_margins.iter().all(|m| !m.is_zero()),
        "a token fired by deadline at or after the lease's earliest expiry"
    );
}

/// What the clients count beside the history.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) deadline_margins: Vec<Duration>,
    pub(crate) losses: BTreeMap<&'static str, usize>,
}

/// One client's part in a campaign.
struct Client {
    name: String,
    manager: LeaseManager<RedisBackend>,
    options: LeaseOptions,
    keys: usize,
    history: History,
    tally: Arc<Mutex<Tally>>,
    resource: redis::aio::MultiplexedConnection,
    stop: CancellationToken,
    rng: fastrand::Rng,
}

/// Acquire → fenced writes while the token is live → release, until stopped.
async fn client(mut c: Client) -> TestResult {
    let script = redis::Script::new(FENCED_WRITE_SCRIPT);
    let ttl = c.options.ttl().get();
    let renew = c.options.renew_interval();
    while !c.stop.is_cancelled() {
        let k = c.rng.usize(..c.keys);
        let key = format!("key{k}");
        let acquired = tokio::select! {
            biased;
            () = c.stop.cancelled() => break,
            acquired = c.manager.acquire(&key, &c.options) => acquired,
        };
        let Ok(lease) = acquired else {
            // Held by another client, or the server is unreachable: the
            // acquire already waited; try again at once.
            continue;
        };
        let acquired_at = Instant::now();
        // Before any renewal, valid_until is counted from the acquisition's sending.
        let requested_at = lease.valid_until() - (ttl - clock_drift(ttl));
        let token = lease.fencing_token().get();
        let hold = c
            .history
            .acquired(&key, &c.name, token, requested_at, acquired_at);

        // Notes the moment the token fires, on its own task so that a
        // write in flight does not delay the note.
        let fired = lease.token();
        let done = CancellationToken::new();
        let watcher = tokio::spawn({
            let done = done.clone();
            async move {
                tokio::select! {
                    biased;
                    () = fired.cancelled() => Some(Instant::now()),
                    () = done.cancelled() => None,
                }
            }
        });

        for _ in 0..c.rng.u32(2..=6) {
            if lease.token().is_cancelled() {
                break;
            }
            let accepted: i64 = script
                .key(format!("res:{k}"))
                .key(format!("res:{k}:log"))
                .arg(token)
                .arg(&c.name)
                .invoke_async(&mut c.resource)
                .await?;
            if accepted == 0 {
                c.history.resource_refused();
            }
            let pause = Duration::from_millis(c.rng.u64(0..=millis(renew * 2)));
            let live = lease.token();
            tokio::select! {
                () = live.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let releasing_at = Instant::now();
        done.cancel();
        match watcher.await? {
            Some(fired_at) => {
                let reason = lease.loss_reason().unwrap_or(LossReason::Lost);
                c.history.ended(
                    hold,
                    HoldEnd::Cancelled(reason.as_str().to_owned()),
                    fired_at,
                );
                let mut tally = c.tally.lock().map_err(|_| "tally poisoned")?;
                *tally.losses.entry(reason.as_str()).or_default() += 1;
                if reason == LossReason::Deadline {
                    // The server keeps the lease at least ttl after the last
                    // successful request was sent: valid_until + drift.
                    let expiry = lease.valid_until() + clock_drift(ttl);
                    tally
                        .deadline_margins
                        .push(expiry.saturating_duration_since(fired_at));
                }
            }
            None => c.history.ended(hold, HoldEnd::Released, releasing_at),
        }
        // Failures are fine: the lease then expires on its own.
        let _ = lease.release().await;
    }
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
