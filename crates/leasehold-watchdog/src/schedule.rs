//! A job's grid, the server's clock as a node learns it, and the loop of a
//! long-lived node that fires on that clock and re-runs abandoned runs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::pin::Pin;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use leasehold_core::{
    BackendError, FencingToken, LeaseBackend, OnAbandon, RerunReply, RerunRequest, TickAnswer,
    TickBackend, TickReason, TickState,
};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::tick::{instant, ticks_of};
use crate::{LeaseError, LeaseManager, TickJob, TickOutcome, TickRun};

/// The instants a job's schedule fires at, as every node of the fleet
/// computes them. The cron adapter (crate `leasehold-cron`) implements it
/// for cron expressions; [`Every`] for a fixed period.
///
/// The two directions must agree: [`tick_at`](Self::tick_at) of any
/// instant is a tick that [`next_after`](Self::next_after) reaches, so
/// that a local time skipped or repeated by a daylight-saving change names
/// one instant whichever way it is looked up.
pub trait TickGrid: Send + Sync {
    /// The latest tick at or before `at`, if any.
    fn tick_at(&self, at: SystemTime) -> Option<SystemTime>;

    /// The first tick after `tick`, if any.
    fn next_after(&self, tick: SystemTime) -> Option<SystemTime>;

    /// The schedule's fingerprint (its text and time zone): nodes with
    /// another fingerprint are refused by the job's record.
    fn fingerprint(&self) -> String;

    /// The longest gap between two ticks (a weekday schedule's weekend):
    /// the job's record lives at least this plus the start deadline.
    fn longest_gap(&self) -> Duration;
}

/// A grid of one tick every `period`, at the multiples of the period since
/// the UNIX epoch (so every node names the same ticks).
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use leasehold_watchdog::{Every, TickGrid};
///
/// let grid = Every::new(Duration::from_secs(2))?;
/// let at = UNIX_EPOCH + Duration::from_millis(1_800_000_001_300);
/// assert_eq!(grid.tick_at(at), Some(UNIX_EPOCH + Duration::from_secs(1_800_000_000)));
/// assert_eq!(grid.fingerprint(), "every 2s");
/// # Ok::<(), leasehold_watchdog::LeaseError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Every {
    period_ms: u64,
}

impl Every {
    /// A grid of one tick every `period`.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidOptions`] for a period under a millisecond,
    /// not in whole milliseconds, or over a year.
    pub fn new(period: Duration) -> Result<Self, LeaseError> {
        let refuse = || LeaseError::InvalidOptions {
            reason: format!(
                "a period of {} cannot make a grid: give whole milliseconds, from 1ms to 365d",
                humantime::format_duration(period)
            ),
        };
        if period.is_zero()
            || !period.subsec_nanos().is_multiple_of(1_000_000)
            || period > Duration::from_secs(365 * 24 * 60 * 60)
        {
            return Err(refuse());
        }
        let period_ms = u64::try_from(period.as_millis()).map_err(|_| refuse())?;
        Ok(Self { period_ms })
    }
}

impl TickGrid for Every {
    fn tick_at(&self, at: SystemTime) -> Option<SystemTime> {
        let ms = u64::try_from(at.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
        Some(instant(ms - ms % self.period_ms))
    }

    fn next_after(&self, tick: SystemTime) -> Option<SystemTime> {
        let ms = u64::try_from(tick.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
        Some(instant(
            (ms - ms % self.period_ms).checked_add(self.period_ms)?,
        ))
    }

    fn fingerprint(&self) -> String {
        format!(
            "every {}",
            humantime::format_duration(Duration::from_millis(self.period_ms))
        )
    }

    fn longest_gap(&self) -> Duration {
        Duration::from_millis(self.period_ms)
    }
}

/// The server's clock as a node learns it from the server's answers: the
/// server's time at the round trip's midpoint, carried on from there by
/// this process's monotonic clock (so that a step of the node's own wall
/// clock does not move it), shared by every clone of a job.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    learned: std::sync::Mutex<Option<(u64, Instant)>>,
}

impl ServerClock {
    /// Sends `ask` and learns the server's clock from its answer.
    pub(crate) async fn ask<Fut>(&self, ask: impl FnOnce() -> Fut) -> Result<TickAnswer, LeaseError>
    where
        Fut: Future<Output = Result<TickAnswer, BackendError>>,
    {
        let sent = Instant::now();
        let answer = ask().await?;
        let midpoint = sent + sent.elapsed() / 2;
        *self
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some((answer.server_time, midpoint));
        Ok(answer)
    }

    /// The server's clock now, as last learned: `None` before the first
    /// answer.
    pub(crate) fn now(&self) -> Option<SystemTime> {
        let learned = *self
            .learned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (server_ms, at) = learned?;
        let now = Instant::now();
        let server = UNIX_EPOCH + Duration::from_millis(server_ms);
        if now >= at {
            server.checked_add(now - at)
        } else {
            server.checked_sub(at - now)
        }
    }
}

/// How long the loop waits before asking again after a failure.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

impl<B: LeaseBackend> LeaseManager<B> {
    /// Runs `job` on this node for as long as the manager lives: fires for
    /// each tick of its grid on the *server's* clock (learned from every
    /// answer), asks for it with [`run_tick`](Self::run_tick), and hands
    /// each outcome to `on_outcome`. It also watches a run started by
    /// another node: when its lease ends without a completion, the run is
    /// settled as [`TickJob::on_abandon`] says, and under
    /// [`OnAbandon::Rerun`] this node may re-run it (the first node to
    /// claim it does). The watch is the manager's
    /// [`watch_leader`](Self::watch_leader) of the job's run key: pushed
    /// by the server's change reports where it sends them, a timer at the
    /// lease's remaining ttl where it does not.
    ///
    /// At start it asks for the latest tick at or before the server's
    /// clock, so that a node started within a tick's start deadline still
    /// starts it, and a node started later records it as the catch-up
    /// policy says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{Every, LeaseManager, TickJob};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let job = TickJob::builder("report", Every::new(Duration::from_millis(50))?).build()?;
    /// let node = manager.clone();
    /// let running = tokio::spawn(async move {
    ///     node.run_schedule(&job, |run| async move { run.tick() }, |outcome| {
    ///         println!("{outcome:?}");
    ///     })
    ///     .await
    /// });
    /// tokio::time::sleep(Duration::from_millis(120)).await;
    /// manager.shutdown().await;
    /// running.await??;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] at once when the backend keeps no job
    /// records (Redlock); the errors of single ticks go to `on_outcome`
    /// and the loop goes on. It returns `Ok` when the manager shuts down.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the loop; a run in progress is dropped,
    /// and its lease released without a completion (abandoned).
    pub async fn run_schedule<F, Fut, T, O>(
        &self,
        job: &TickJob,
        work: F,
        mut on_outcome: O,
    ) -> Result<(), LeaseError>
    where
        F: Fn(TickRun) -> Fut + Sync,
        Fut: Future<Output = T> + Send,
        T: Send,
        O: FnMut(Result<TickOutcome<T>, LeaseError>),
    {
        ticks_of(self.backend(), "decide_tick", job.name())?;
        let stopped = self.shutdown_token().clone();
        let mut leader = self.watch_leader(job.name().run_key()).await?;
        // The run of another node that this node saw start: watched until
        // its lease is gone.
        let mut watched: Option<FencingToken> = None;
        // When to ask again about a watched run the server said still
        // holds, though the watch saw it go.
        let mut recheck: Option<Instant> = None;
        let mut settling = false;
        let mut asked: Option<SystemTime> = None;
        // The asks and runs in flight: a run does not hold up the next
        // tick's ask, which the server then records as an overlap.
        let mut flight: FuturesUnordered<Pin<Box<dyn Future<Output = Event<T>> + Send + '_>>> =
            FuturesUnordered::new();
        let (mut due_tick, mut due_at) = plan(job, asked);
        loop {
            tokio::select! {
                () = stopped.cancelled() => return Ok(()),
                () = tokio::time::sleep_until(due_at), if due_tick.is_some() => {
                    if let Some(tick) = due_tick.take() {
                        asked = Some(tick);
                        let work = &work;
                        flight.push(Box::pin(async move {
                            Event::Tick(self.run_tick(job, tick, work).await)
                        }));
                    }
                }
                Some(event) = flight.next(), if !flight.is_empty() => match event {
                    Event::Tick(outcome) => {
                        match &outcome {
                            Ok(TickOutcome::Decided { decision, .. })
                                if decision.state == TickState::Started =>
                            {
                                if let Some(run) = &decision.run {
                                    watched = Some(run.fencing_token);
                                }
                            }
                            // Our own run too: its end finds it settled,
                            // one claim.
                            Ok(TickOutcome::Overlap { running, .. }) => {
                                watched = Some(running.fencing_token);
                            }
                            _ => {}
                        }
                        on_outcome(outcome);
                    }
                    Event::Settled { watch, again, outcome } => {
                        settling = false;
                        watched = watch;
                        recheck = again;
                        if let Some(outcome) = outcome {
                            on_outcome(outcome);
                        }
                    }
                },
                () = sleep_until_some(recheck), if watched.is_some() && recheck.is_some() && !settling => {
                    recheck = None;
                    if let Some(token) = watched {
                        settling = true;
                        flight.push(Box::pin(self.settle(job, token, &work)));
                    }
                }
                changed = leader.changed(), if watched.is_some() && !settling => {
                    if changed.is_err() {
                        return Ok(());
                    }
                }
            }
            // A watched run whose lease is gone (seen now or before) is
            // settled.
            if let Some(token) = watched
                && !settling
                && recheck.is_none()
                && leader
                    .borrow()
                    .as_ref()
                    .is_none_or(|l| l.fencing_token != Some(token))
            {
                settling = true;
                flight.push(Box::pin(self.settle(job, token, &work)));
            }
            if due_tick.is_none() || job.clock().now().is_some() {
                (due_tick, due_at) = plan(job, asked);
            }
        }
    }

    /// Settles the run with `token` whose lease looked gone: records it as
    /// abandoned or re-runs it, as the job says. Returns the run to go on
    /// watching (the same one while its lease still holds, with when to
    /// ask again), and the re-run's outcome.
    async fn settle<F, Fut, T>(&self, job: &TickJob, token: FencingToken, work: &F) -> Event<T>
    where
        F: Fn(TickRun) -> Fut + Sync,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let name = job.name();
        let claim = async {
            let ticks = ticks_of(self.backend(), "claim_rerun", name)?;
            let request = RerunRequest::new(
                name.clone(),
                token,
                job.on_abandon(),
                job.record_ttl(),
                job.run_request(leasehold_core::HolderId::generate()?)?,
            );
            Ok::<_, LeaseError>(ticks.claim_rerun(&request).await?)
        };
        let settled = |watch, again, outcome| Event::Settled {
            watch,
            again,
            outcome,
        };
        match claim.await {
            Ok(RerunReply::Granted { tick, grant }) => {
                info!(job = %name, tick, abandoned = %token, "re-running an abandoned run");
                crate::metrics::tick_abandoned(name.as_str());
                let outcome = self
                    .run_granted(job, instant(tick), grant, TickReason::Rerun, work)
                    .await;
                settled(None, None, Some(outcome))
            }
            Ok(RerunReply::Abandoned { tick }) => {
                crate::metrics::tick_abandoned(name.as_str());
                warn!(job = %name, tick, abandoned = %token, "a run's lease ended without a completion; recorded as abandoned (not re-run: on_abandon is skip)");
                settled(None, None, None)
            }
            Ok(RerunReply::StillHeld { ttl_left }) => {
                debug!(job = %name, ?ttl_left, "the watched run still holds");
                let left = ttl_left.unwrap_or(RETRY_AFTER_ERROR);
                settled(Some(token), Some(Instant::now() + left), None)
            }
            Ok(_) => settled(None, None, None),
            Err(error) => {
                warn!(job = %name, %error, "could not settle a run that looked abandoned");
                if job.on_abandon() == OnAbandon::Rerun {
                    settled(Some(token), Some(Instant::now() + RETRY_AFTER_ERROR), None)
                } else {
                    settled(None, None, None)
                }
            }
        }
    }
}

/// What finished in a node's loop.
enum Event<T> {
    /// An ask for a tick, and its run if granted.
    Tick(Result<TickOutcome<T>, LeaseError>),
    /// A watched run settled.
    Settled {
        watch: Option<FencingToken>,
        again: Option<Instant>,
        outcome: Option<Result<TickOutcome<T>, LeaseError>>,
    },
}

/// The next tick to ask for after `asked`, and when: the latest tick at
/// or before the server's clock when it has not been asked for yet (at
/// start, or when this node's clock turned out to be behind), at once;
/// else the one after `asked`, when the server's clock reaches it.
fn plan(job: &TickJob, asked: Option<SystemTime>) -> (Option<SystemTime>, Instant) {
    let server_now = job.clock().now().unwrap_or_else(SystemTime::now);
    let latest = job.grid().tick_at(server_now);
    let now = Instant::now();
    match (asked, latest) {
        (None, latest) => (latest, now),
        (Some(last), Some(latest)) if latest > last => (Some(latest), now),
        (Some(last), _) => match job.grid().next_after(last) {
            Some(next) => {
                let wait = next.duration_since(server_now).unwrap_or_default();
                (Some(next), now + wait)
            }
            None => (None, now),
        },
    }
}

/// Sleeps until `at`; never wakes without one (the caller's branch is
/// disabled then).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
