//! Once per tick across a fleet: a scheduled job that every node fires, run
//! by one of them.
//!
//! # How
//!
//! Every node of a fleet runs the same schedule and, when it fires for the
//! tick scheduled at `T`, calls [`LeaseManager::run_tick`] with `T` as the
//! schedule's grid gives it (not the node's reading of its own clock). The
//! tick's lease key is the job's name and `T` in UNIX milliseconds,
//! `<job>:tick:<ms>`, so every node asks for the same key whatever its
//! clock says. The first to ask wins and runs the job under the lease; the
//! others are refused and are told who holds it ([`TickOutcome::Taken`]).
//!
//! Clocks differ, so the nodes fire at different times: a node whose clock
//! is behind by `d` asks `d` later than the first. A winner with a short
//! job would have released the key by then, and the late node would run
//! the tick again. So the winner's lease has a **minimum hold**
//! ([`LeaseOptionsBuilder::hold_at_least`]) of
//! [`max_skew`](TickJobBuilder::max_skew) +
//! [`max_lateness`](TickJobBuilder::max_lateness), counted on the server's
//! clock from the acquisition: a release before it leaves the key taken
//! until then, and every node that fires within that bound finds it taken.
//! A backend without the minimum hold (Redlock) refuses the tick's lease,
//! and `run_tick` returns its error.
//!
//! A node that fires later than that bound could find the key free again
//! and run the tick a second time. It never asks: a node measures its own
//! lateness (its wall clock when it fired minus `T`, plus the time since on
//! its monotonic clock) and gives the tick up when it exceeds
//! `max_lateness` ([`TickOutcome::Late`]), before asking and again once a
//! grant comes back (the request may have waited in the network). With the
//! clocks of any two nodes at most `max_skew` apart, the first grant is no
//! earlier than `T − skew` on the late node's clock, and a grant checked
//! on time is no later than `T + max_lateness` on it: within the minimum
//! hold, so refused.
//!
//! # At most once; a dead node's tick is missed
//!
//! A node only asks for a tick when it fires for it, and gives it up when
//! late; nothing retries a tick later. So a winner that dies (or loses its
//! lease) mid-tick leaves the tick **not run to completion, and not re-run
//! elsewhere**: the others, firing within the bound, find the key taken
//! (held by the dead node's lease until its ttl runs out, or by the
//! minimum hold) and skip it. The tick is missed, as with ShedLock's
//! `lockAtLeastFor`; the next tick runs as usual. A job that must not be
//! missed records its own completion and catches up on the next tick.
//!
//! # How long a tick's key lives
//!
//! From the winner's acquisition until the later of the minimum hold
//! (`max_skew + max_lateness`) and the end of the job; if the winner dies,
//! until its lease's ttl runs out from its last renewal (still at least the
//! minimum hold). Nothing else of a tick is kept but what the backend keeps
//! per key (a fencing counter on Redis).
//!
//! # What it does not promise
//!
//! - Clocks further apart than `max_skew`, or a node that fires late but
//!   reads its own lateness as small (its clock jumped), can run a tick
//!   twice.
//! - A job that stalls inside a write to another system can still act
//!   after its lease is gone: pass [`TickRun::fencing_token`] to that
//!   system, which can then refuse the stale write.
//!
//! [`LeaseOptionsBuilder::hold_at_least`]: crate::LeaseOptionsBuilder::hold_at_least

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt;
use leasehold_core::{FencingToken, LeaseBackend};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::{LeaseError, LeaseManager, LeaseOptions, LeaseOptionsBuilder};

/// The default bound on how far apart the clocks of two nodes may be:
/// 5 s. NTP keeps the clocks of a healthy fleet within milliseconds; 5 s
/// also covers a node whose time daemon has just started or stepped, and
/// costs only a key kept a few seconds longer.
pub const DEFAULT_MAX_SKEW: Duration = Duration::from_secs(5);

/// The default bound on how late, by its own clock, a node may ask for a
/// tick: 1 s. A scheduler that polls its schedule fires up to one poll
/// late (tokio-cron-scheduler polls every 500 ms); the rest is the time to
/// reach the server.
pub const DEFAULT_MAX_LATENESS: Duration = Duration::from_secs(1);

/// The longest job name accepted, in bytes.
pub const MAX_JOB_NAME_LEN: usize = 64;

/// A job run once per tick across a fleet: its name, the bounds that make a
/// tick run once, and the options of the lease a tick runs under.
///
/// ```
/// use std::time::Duration;
/// use leasehold_watchdog::{LeaseOptions, TickJob};
///
/// let job = TickJob::builder("report")
///     .max_skew(Duration::from_secs(2))
///     .lease(LeaseOptions::builder().ttl(Duration::from_secs(10)).label("node-a"))
///     .build()?;
/// assert_eq!(job.min_hold(), Duration::from_secs(3));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TickJob {
    name: Cow<'static, str>,
    max_skew: Duration,
    max_lateness: Duration,
    lease: LeaseOptions,
}

impl TickJob {
    /// A builder for the job called `name`, with the default bounds and
    /// lease options.
    pub fn builder(name: impl Into<Cow<'static, str>>) -> TickJobBuilder {
        TickJobBuilder {
            name: name.into(),
            max_skew: DEFAULT_MAX_SKEW,
            max_lateness: DEFAULT_MAX_LATENESS,
            lease: LeaseOptions::builder(),
        }
    }

    /// The job's name: the first part of its ticks' keys, and its label in
    /// metrics.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How far apart the clocks of two nodes may be.
    #[must_use]
    pub fn max_skew(&self) -> Duration {
        self.max_skew
    }

    /// How late, by its own clock, a node may ask for a tick.
    #[must_use]
    pub fn max_lateness(&self) -> Duration {
        self.max_lateness
    }

    /// How long the server keeps a tick's key taken at least, counted from
    /// its acquisition: `max_skew + max_lateness`.
    #[must_use]
    pub fn min_hold(&self) -> Duration {
        self.max_skew + self.max_lateness
    }

    /// The options of the lease each tick runs under: those given to the
    /// builder, named after the job, with the minimum hold and no waiting.
    #[must_use]
    pub fn lease_options(&self) -> &LeaseOptions {
        &self.lease
    }

    /// The lease key of the tick scheduled at `tick`: `<job>:tick:<UNIX ms>`.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTick`] for a tick before 1970.
    pub fn tick_key(&self, tick: SystemTime) -> Result<String, LeaseError> {
        let ms = tick
            .duration_since(UNIX_EPOCH)
            .map_err(|_| LeaseError::InvalidTick {
                job: self.name.to_string(),
                reason: "the tick is before 1970-01-01; pass the instant the schedule fired for"
                    .to_owned(),
            })?
            .as_millis();
        Ok(format!("{}:tick:{ms}", self.name))
    }
}

/// Builds a [`TickJob`]; every setter documents its default.
#[derive(Debug, Clone)]
#[must_use]
pub struct TickJobBuilder {
    name: Cow<'static, str>,
    max_skew: Duration,
    max_lateness: Duration,
    lease: LeaseOptionsBuilder,
}

impl TickJobBuilder {
    /// The most the clocks of any two nodes of the fleet may differ by.
    /// Beyond it a tick can run twice. Default: [`DEFAULT_MAX_SKEW`] (5 s).
    pub fn max_skew(mut self, skew: impl Into<Duration>) -> Self {
        self.max_skew = skew.into();
        self
    }

    /// How late, by its own clock, a node may still ask for a tick (its
    /// scheduler's firing delay plus the round trip to the server); a node
    /// later than that gives the tick up ([`TickOutcome::Late`]). Default:
    /// [`DEFAULT_MAX_LATENESS`] (1 s).
    pub fn max_lateness(mut self, lateness: impl Into<Duration>) -> Self {
        self.max_lateness = lateness.into();
        self
    }

    /// The options of the lease a tick runs under: its ttl (the job's
    /// lease is renewed for as long as the job runs) and above all its
    /// [`label`](LeaseOptionsBuilder::label), which the other nodes are
    /// told when they skip a tick. The name, the minimum hold and the wait
    /// are set by the job. Default: [`LeaseOptions::default`].
    pub fn lease(mut self, lease: LeaseOptionsBuilder) -> Self {
        self.lease = lease;
        self
    }

    /// Checks the name and the options.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTick`] for a name that is empty, longer than
    /// [`MAX_JOB_NAME_LEN`] bytes, or has characters other than ASCII
    /// letters, digits, `-`, `_` and `.` (it is a key part and a metrics
    /// label); [`LeaseError::InvalidOptions`] when the minimum hold is
    /// zero or longer than the lease's ttl (a dead winner's key lasts only
    /// its ttl); every error of [`LeaseOptionsBuilder::build`] (the
    /// minimum hold must be in whole milliseconds, and fair mode is
    /// refused).
    pub fn build(self) -> Result<TickJob, LeaseError> {
        check_name(&self.name)?;
        let min_hold = self.max_skew.saturating_add(self.max_lateness);
        if min_hold.is_zero() {
            return Err(LeaseError::InvalidOptions {
                reason: format!(
                    "job {:?}: max_skew + max_lateness is zero, which leaves a tick's key free the moment its winner releases it; give the fleet's clock skew",
                    self.name
                ),
            });
        }
        let lease = self
            .lease
            .name(self.name.clone())
            .hold_at_least(min_hold)
            .build()?
            // One attempt: a tick is run by whoever asks first, never waited for.
            .with_wait(None);
        // A winner that dies keeps the key for its ttl from its last
        // renewal, not for the minimum hold: a shorter ttl would free a dead
        // node's tick for a node firing within the skew.
        if lease.ttl().get() < min_hold {
            return Err(LeaseError::InvalidOptions {
                reason: format!(
                    "job {:?}: a ttl of {} is shorter than the minimum hold of {} (max_skew + max_lateness), so a tick whose winner died could run again; raise the ttl",
                    self.name,
                    lease.ttl(),
                    humantime::format_duration(min_hold),
                ),
            });
        }
        Ok(TickJob {
            name: self.name,
            max_skew: self.max_skew,
            max_lateness: self.max_lateness,
            lease,
        })
    }
}

fn check_name(name: &str) -> Result<(), LeaseError> {
    let refuse = |reason: &str| {
        Err(LeaseError::InvalidTick {
            job: name.to_owned(),
            reason: reason.to_owned(),
        })
    };
    if name.is_empty() {
        return refuse("the job name is empty; name the job, such as \"nightly-report\"");
    }
    if name.len() > MAX_JOB_NAME_LEN {
        return refuse("the job name is longer than 64 bytes; use a short name");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return refuse(
            "the job name may hold only ASCII letters, digits, '-', '_' and '.': it is part of every tick's key and a metrics label",
        );
    }
    Ok(())
}

/// What the job of a tick is given: the tick, the lease's fencing token and
/// its cancellation token.
#[derive(Debug, Clone)]
pub struct TickRun {
    tick: SystemTime,
    fencing_token: FencingToken,
    token: CancellationToken,
}

impl TickRun {
    /// The instant the tick was scheduled for.
    #[must_use]
    pub fn tick(&self) -> SystemTime {
        self.tick
    }

    /// The fencing token of this tick's lease: pass it to the stores the
    /// job writes to, so that they can refuse a write that comes after the
    /// lease was lost.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.fencing_token
    }

    /// Cancelled when the tick's lease is lost: the job should stop soon
    /// after.
    #[must_use]
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// What became of one node's attempt at a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickOutcome<T> {
    /// This node ran the tick.
    Ran {
        /// The tick.
        tick: SystemTime,
        /// The fencing token of the tick's lease.
        fencing_token: FencingToken,
        /// What the job returned.
        output: T,
    },
    /// Another node has the tick.
    Taken {
        /// The tick.
        tick: SystemTime,
        /// The label of the node holding it, if its lease has one.
        holder: Option<String>,
    },
    /// This node fired too late to ask for the tick safely (see
    /// [`TickJobBuilder::max_lateness`]), and did not run it.
    Late {
        /// The tick.
        tick: SystemTime,
        /// How late this node was, by its own clock.
        lateness: Duration,
    },
}

impl<T> TickOutcome<T> {
    /// Whether this node ran the tick.
    #[must_use]
    pub fn ran(&self) -> bool {
        matches!(self, Self::Ran { .. })
    }
}

impl<B: LeaseBackend> LeaseManager<B> {
    /// Runs `work` for the tick scheduled at `tick` if no other node of the
    /// fleet has it, under the tick's lease (see the [module](crate::tick)
    /// documentation for how, and what is promised).
    ///
    /// `tick` is the instant on the schedule's grid (the same on every
    /// node); `fired_at` is this node's wall clock when its scheduler fired
    /// for it (`SystemTime::now()` then), from which its lateness is
    /// measured, on the monotonic clock after that.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime, UNIX_EPOCH};
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions, TickJob, TickOutcome};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let fleet = MemoryBackend::new();
    /// let (a, b) = (LeaseManager::new(fleet.clone())?, LeaseManager::new(fleet)?);
    /// let job = |node: &str| {
    ///     TickJob::builder("report").lease(LeaseOptions::builder().label(node)).build()
    /// };
    /// let (job_a, job_b) = (job("node-a")?, job("node-b")?);
    /// // The tick both schedulers fired for, and when each fired.
    /// let tick = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    /// let ran = a.run_tick(&job_a, tick, tick, |run| async move { run.fencing_token() }).await?;
    /// assert!(ran.ran());
    /// let skipped = b.run_tick(&job_b, tick, tick + Duration::from_millis(300), |_| async {}).await?;
    /// assert!(matches!(skipped, TickOutcome::Taken { holder: Some(h), .. } if h == "node-a"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidTick`] for a tick before 1970; every error of
    /// [`acquire`](Self::acquire) but [`LeaseError::NotAcquired`] (which is
    /// [`TickOutcome::Taken`]); [`LeaseError::LeaseEnded`] when the lease
    /// was lost while the job ran (the job ran, perhaps in part: the tick is
    /// not run again elsewhere).
    ///
    /// # Panics
    ///
    /// A panic in `work` is resumed after the lease is released.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the job and releases the lease in the
    /// background; the minimum hold still keeps the tick from others.
    pub async fn run_tick<F, Fut, T>(
        &self,
        job: &TickJob,
        tick: SystemTime,
        fired_at: SystemTime,
        work: F,
    ) -> Result<TickOutcome<T>, LeaseError>
    where
        F: FnOnce(TickRun) -> Fut,
        Fut: Future<Output = T>,
    {
        // Lateness goes on from the wall-clock reading on the monotonic
        // clock, which a wall-clock step during the attempt does not move.
        let fired = Instant::now();
        let lateness = || {
            // Checked: an absurd `fired_at` must not panic; it reads as late.
            fired_at
                .checked_add(fired.elapsed())
                .map_or(Duration::MAX, |now| {
                    now.duration_since(tick).unwrap_or_default()
                })
        };
        let key = job.tick_key(tick)?;
        let late = |lateness: Duration| {
            crate::metrics::tick_skipped(&job.name, crate::metrics::SKIP_LATE);
            debug!(%key, ?lateness, "too late for the tick; left to the others");
            Ok(TickOutcome::Late { tick, lateness })
        };
        let before = lateness();
        if before > job.max_lateness {
            return late(before);
        }
        let lease = match self.acquire(&key, &job.lease).await {
            Ok(lease) => lease,
            Err(LeaseError::NotAcquired { holder, .. }) => {
                crate::metrics::tick_skipped(&job.name, crate::metrics::SKIP_TAKEN);
                return Ok(TickOutcome::Taken {
                    tick,
                    holder: holder.label,
                });
            }
            Err(error) => return Err(error),
        };
        // The grant may have come back late (a slow network or server): the
        // first winner's minimum hold may then have passed, and running
        // would run the tick twice.
        let after = lateness();
        if after > job.max_lateness {
            if let Err(error) = lease.release().await {
                debug!(%key, %error, "release of a late tick failed; it expires by itself");
            }
            return late(after);
        }
        crate::metrics::tick_ran(&job.name);
        let run = TickRun {
            tick,
            fencing_token: lease.fencing_token(),
            token: lease.token(),
        };
        let outcome = AssertUnwindSafe(work(run)).catch_unwind().await;
        let ended = lease.loss_reason();
        let fencing_token = lease.fencing_token();
        if let Err(error) = lease.release().await {
            warn!(%key, %error, "release after the tick failed; the lease expires by itself");
        }
        match (outcome, ended) {
            (Err(panic), _) => std::panic::resume_unwind(panic),
            (Ok(_), Some(reason)) => Err(LeaseError::LeaseEnded { key, reason }),
            (Ok(output), None) => Ok(TickOutcome::Ran {
                tick,
                fencing_token,
                output,
            }),
        }
    }
}
