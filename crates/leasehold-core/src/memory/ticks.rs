//! Scheduled jobs' records on [`MemoryBackend`]: the [`TickBackend`]
//! capability, decided under the backend's lock on its settable wall clock,
//! with the run's lease an ordinary lease of the backend.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{Entry, MemoryBackend, State};
use crate::{
    AcquireRequest, BackendError, CatchUp, Completion, Decision, FencingToken, HolderId, JobCounts,
    JobName, JobRecord, LeaseKey, OnAbandon, RerunReply, RerunRequest, RunInfo, RunRecord,
    RunState, TickAnswer, TickBackend, TickReason, TickReply, TickRequest, TickState,
};

/// The backend's wall clock: a `SystemTime` read at a tokio instant, and
/// the tokio time elapsed since, so that it advances with tokio's paused
/// clock in tests.
pub(super) struct WallClock(Mutex<(SystemTime, Instant)>);

impl Default for WallClock {
    fn default() -> Self {
        Self(Mutex::new((SystemTime::now(), Instant::now())))
    }
}

impl WallClock {
    fn now(&self) -> SystemTime {
        let (at, since) = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = Instant::now().saturating_duration_since(since);
        at.checked_add(elapsed).unwrap_or(at)
    }

    fn set(&self, at: SystemTime) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = (at, Instant::now());
    }
}

/// Every job's record, by job.
pub(super) type Jobs = std::collections::HashMap<JobName, Record>;

/// A job's record, as the Redis backend keeps it in its job hash.
pub(super) struct Record {
    fingerprint: String,
    decided: Decision,
    run: Option<Run>,
    counts: JobCounts,
    /// The wall clock at the last write (UNIX ms).
    last_seen: u64,
    /// The record ttl the last write asked for: a completion, which names
    /// none, sets the expiry by it again.
    record_ttl: Duration,
    /// When the record is gone, on the tokio clock: `record_ttl` after the
    /// last write.
    expires_at: Instant,
}

/// The last run of a job.
struct Run {
    info: RunInfo,
    state: RunState,
    reason: TickReason,
    started_at: u64,
    ended_at: Option<u64>,
    /// Whether its abandonment was claimed under [`OnAbandon::Skip`]: a
    /// later claim of it is settled.
    claimed: bool,
}

impl Run {
    fn started(info: RunInfo, reason: TickReason, wall: u64) -> Self {
        Self {
            info,
            state: RunState::Running,
            reason,
            started_at: wall,
            ended_at: None,
            claimed: false,
        }
    }

    /// Whether `lease` (the run key's live lease) is this run's.
    fn holds(&self, lease: Option<&Entry>) -> bool {
        lease.is_some_and(|e| e.token == self.info.fencing_token)
    }
}

impl Record {
    fn new(fingerprint: &str, decided: Decision) -> Self {
        Self {
            fingerprint: fingerprint.to_owned(),
            decided,
            run: None,
            counts: JobCounts::default(),
            last_seen: 0,
            record_ttl: Duration::ZERO,
            expires_at: Instant::now(),
        }
    }

    /// What every write sets: the fingerprint, the last-seen time, and the
    /// expiry.
    fn touch(&mut self, fingerprint: &str, wall: u64, now: Instant, record_ttl: Duration) {
        if self.fingerprint != fingerprint {
            fingerprint.clone_into(&mut self.fingerprint);
        }
        self.refresh(wall, now, record_ttl);
    }

    /// The last-seen time and the expiry of a write that names no
    /// fingerprint.
    fn refresh(&mut self, wall: u64, now: Instant, record_ttl: Duration) {
        self.last_seen = wall;
        self.record_ttl = record_ttl;
        self.expires_at = later(now, record_ttl);
    }

    /// Records a run recorded as running whose lease is gone as abandoned
    /// (counted here, once), and its tick's decision with it if that is the
    /// highest. Whether it did.
    fn settle(&mut self, lease: Option<&Entry>, wall: u64) -> bool {
        let decides = self.run.as_ref().is_some_and(|run| self.decides(&run.info));
        let Some(run) = self.run.as_mut() else {
            return false;
        };
        if run.state != RunState::Running || run.holds(lease) {
            return false;
        }
        run.state = RunState::Abandoned;
        run.ended_at = Some(wall);
        self.counts.abandoned += 1;
        if decides {
            self.decided.state = TickState::Abandoned;
            self.decided.reason = TickReason::LeaseEnded;
        }
        true
    }

    /// Whether the highest decision is the one `run` was started for.
    fn decides(&self, run: &RunInfo) -> bool {
        self.decided.tick == run.tick
            && self
                .decided
                .run
                .as_ref()
                .is_some_and(|d| d.fencing_token == run.fencing_token)
    }

    /// Starts a run for `tick` with `grant`'s token, as the highest
    /// decision.
    fn start(
        &mut self,
        tick: u64,
        token: FencingToken,
        run: &AcquireRequest,
        reason: TickReason,
        wall: u64,
    ) {
        let info = RunInfo {
            tick,
            fencing_token: token,
            label: run.label.clone(),
        };
        self.decided = Decision {
            tick,
            state: TickState::Started,
            reason,
            run: Some(info.clone()),
        };
        self.run = Some(Run::started(info, reason, wall));
    }

    /// The record as read: a run recorded as running whose lease is gone
    /// is reported abandoned (without being recorded so).
    fn view(&self, job: &JobName, lease: Option<&Entry>, now: Instant, wall: u64) -> JobRecord {
        JobRecord {
            job: job.clone(),
            fingerprint: self.fingerprint.clone(),
            decided: self.decided.clone(),
            run: self.run.as_ref().map(|run| {
                let held = lease.filter(|e| e.token == run.info.fencing_token);
                RunRecord {
                    info: run.info.clone(),
                    state: match run.state {
                        RunState::Running if held.is_none() => RunState::Abandoned,
                        state => state,
                    },
                    reason: run.reason,
                    started_at: run.started_at,
                    ended_at: run.ended_at,
                    ttl_left: held.map(|e| e.expires_at.saturating_duration_since(now)),
                }
            }),
            counts: self.counts,
            last_seen: self.last_seen,
            server_time: wall,
        }
    }
}

/// UNIX milliseconds of `at` (0 before the epoch).
fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `now + d`, without overflowing: a record ttl too long for the clock
/// keeps the record for a century.
fn later(now: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl MemoryBackend {
    /// Re-bases the backend's wall clock, by which scheduled jobs' ticks
    /// are decided (see [`TickBackend`]), on `at`: from now on it reads
    /// `at` plus the tokio time elapsed since this call, for every clone
    /// and [client](Self::client) of the backend. Use it to test what a
    /// fleet does when the server's clock steps (NTP, a failover to a
    /// server whose clock differs); leases still expire on the tokio
    /// clock.
    ///
    /// Until it is called, the wall clock is the system's clock read when
    /// the backend was made, plus the tokio time elapsed since, so it
    /// advances with tokio's paused clock in tests.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use leasehold_core::MemoryBackend;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let backend = MemoryBackend::new();
    /// let midnight = UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01
    /// backend.clone().set_wall_clock(midnight);
    /// tokio::time::advance(Duration::from_secs(90)).await;
    /// assert_eq!(backend.wall_clock(), midnight + Duration::from_secs(90));
    /// # }
    /// ```
    pub fn set_wall_clock(&self, at: SystemTime) {
        self.inner.wall.set(at);
    }

    /// The backend's wall clock, by which scheduled jobs' ticks are
    /// decided: the system's clock read when the backend was made (or the
    /// time given to [`set_wall_clock`](Self::set_wall_clock)) plus the
    /// tokio time elapsed since.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// use leasehold_core::MemoryBackend;
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let before = SystemTime::now();
    /// let backend = MemoryBackend::new();
    /// tokio::time::advance(Duration::from_secs(3600)).await;
    /// // An hour later on the paused clock, though hardly any real time passed.
    /// assert!(backend.wall_clock() >= before + Duration::from_secs(3600));
    /// # }
    /// ```
    #[must_use]
    pub fn wall_clock(&self) -> SystemTime {
        self.inner.wall.now()
    }

    fn wall_ms(&self) -> u64 {
        unix_ms(self.wall_clock())
    }
}

impl State {
    /// Forgets the records whose time is up, so that the records of jobs
    /// nobody asks for any more take no room.
    fn forget_jobs(&mut self, now: Instant) {
        self.jobs.retain(|_, record| record.expires_at > now);
    }

    /// The live lease on the run key, if any.
    fn run_lease(&mut self, key: &LeaseKey, now: Instant) -> Option<Entry> {
        self.live(key, now).cloned()
    }

    /// Releases `holder`'s lease on `key` (whatever its token) as a release
    /// does: deleted, its fencing counter kept, and announced to the key's
    /// release watchers. (A run's lease has no minimum hold.)
    fn release_run(&mut self, key: &LeaseKey, holder: &HolderId, now: Instant) {
        if self.live(key, now).is_some_and(|e| e.holder == *holder) {
            self.leases.remove(key);
            self.announce(key);
        }
    }

    /// Steps 3 to 7 of [`TickBackend::decide_tick`] on the record taken
    /// out of `jobs` (put back by the caller).
    fn decide(
        &mut self,
        request: &TickRequest,
        record: &mut Option<Record>,
        key: &LeaseKey,
        now: Instant,
        wall: u64,
        sent_at: Instant,
    ) -> TickReply {
        let tick = request.tick;
        let lease = self.run_lease(key, now);
        let touch = |r: &mut Record| {
            r.touch(&request.fingerprint, wall, now, request.record_ttl);
        };
        if let Some(r) = record.as_mut() {
            if r.settle(lease.as_ref(), wall) {
                touch(r);
            }
            if tick <= r.decided.tick {
                return TickReply::Decided(r.decided.clone());
            }
        }
        let deadline = tick.saturating_add(millis(request.start_deadline));
        let reason = if wall < request.next.min(deadline) {
            TickReason::OnTime
        } else if request.catch_up == CatchUp::Latest && wall < request.next {
            TickReason::CatchUp
        } else {
            let decision = Decision {
                tick,
                state: TickState::Missed,
                reason: TickReason::Late,
                run: None,
            };
            let r =
                record.get_or_insert_with(|| Record::new(&request.fingerprint, decision.clone()));
            r.decided = decision;
            r.counts.missed += 1;
            touch(r);
            return TickReply::Missed;
        };
        if let Some(holding) = lease {
            let running = RunInfo {
                // The tick of a lease that is not the record's run (the
                // record expired while it ran, or it was taken outside the
                // job) is not known: 0.
                tick: record
                    .as_ref()
                    .and_then(|r| r.run.as_ref())
                    .filter(|run| run.info.fencing_token == holding.token)
                    .map_or(0, |run| run.info.tick),
                fencing_token: holding.token,
                label: holding.label,
            };
            let decision = Decision {
                tick,
                state: TickState::Skipped,
                reason: TickReason::Overlap,
                run: Some(running.clone()),
            };
            let r =
                record.get_or_insert_with(|| Record::new(&request.fingerprint, decision.clone()));
            r.decided = decision;
            r.counts.skipped += 1;
            touch(r);
            return TickReply::Overlap { running };
        }
        let grant = self.grant(&request.run, now, sent_at);
        let placeholder = Decision {
            tick,
            state: TickState::Started,
            reason,
            run: None,
        };
        let r = record.get_or_insert_with(|| Record::new(&request.fingerprint, placeholder));
        r.start(tick, grant.fencing_token, &request.run, reason, wall);
        r.counts.started += 1;
        touch(r);
        TickReply::Granted { grant, reason }
    }

    /// [`TickBackend::claim_rerun`] on the record taken out of `jobs` (put
    /// back by the caller).
    fn claim(
        &mut self,
        request: &RerunRequest,
        r: &mut Record,
        key: &LeaseKey,
        now: Instant,
        wall: u64,
        sent_at: Instant,
    ) -> RerunReply {
        let lease = self.run_lease(key, now);
        let Some(run) = r.run.as_ref() else {
            return RerunReply::Settled;
        };
        if run.info.fencing_token != request.abandoned
            || run.state == RunState::Completed
            || run.claimed
        {
            return RerunReply::Settled;
        }
        // The run key still held, by the run or by anyone (nothing could
        // start before it is free): ask again when it may have ended.
        if let Some(held) = lease {
            return RerunReply::StillHeld {
                ttl_left: Some(held.expires_at.saturating_duration_since(now)),
            };
        }
        // Counted once: only while it is still recorded as running.
        r.settle(None, wall);
        r.refresh(wall, now, request.record_ttl);
        match request.on_abandon {
            OnAbandon::Rerun => {
                let tick = r.decided.tick;
                let grant = self.grant(&request.run, now, sent_at);
                r.start(
                    tick,
                    grant.fencing_token,
                    &request.run,
                    TickReason::Rerun,
                    wall,
                );
                r.counts.reruns += 1;
                RerunReply::Granted { tick, grant }
            }
            OnAbandon::Skip => {
                let mut tick = 0;
                if let Some(run) = r.run.as_mut() {
                    run.claimed = true;
                    tick = run.info.tick;
                }
                RerunReply::Abandoned { tick }
            }
        }
    }
}

/// Kept as the Redis backend keeps them: one record per job beside the
/// run's lease, each operation one step under the backend's lock, on the
/// backend's [wall clock](MemoryBackend::wall_clock). Records expire on
/// the tokio clock, `record_ttl` after their last write.
impl TickBackend for MemoryBackend {
    async fn decide_tick(&self, request: &TickRequest) -> Result<TickAnswer, BackendError> {
        const OP: &str = "decide_tick";
        let sent_at = Instant::now();
        let key = request.job.run_key();
        request.check(OP)?;
        self.gate(OP, &key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let wall = self.wall_ms();
        state.forget_jobs(now);
        let answer = |reply| {
            Ok(TickAnswer {
                server_time: wall,
                reply,
            })
        };
        if let Some(r) = state.jobs.get(&request.job)
            && r.fingerprint != request.fingerprint
        {
            return answer(TickReply::Conflict {
                fingerprint: r.fingerprint.clone(),
            });
        }
        if request.tick > wall {
            let early = request.tick - wall;
            let period = request.next - request.tick;
            let by = Duration::from_millis(early);
            return answer(if early > period {
                TickReply::ClockAhead { ahead: by }
            } else {
                TickReply::Due { wait: by }
            });
        }
        let mut record = state.jobs.remove(&request.job);
        let reply = state.decide(request, &mut record, &key, now, wall, sent_at);
        if let Some(record) = record {
            state.jobs.insert(request.job.clone(), record);
        }
        answer(reply)
    }

    async fn complete_tick(
        &self,
        job: &JobName,
        holder: &HolderId,
        fencing_token: FencingToken,
    ) -> Result<Completion, BackendError> {
        const OP: &str = "complete_tick";
        let key = job.run_key();
        self.gate(OP, &key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let wall = self.wall_ms();
        state.forget_jobs(now);
        let lease = state
            .run_lease(&key, now)
            .filter(|e| e.holder == *holder && e.token == fencing_token);
        let Some(record) = state.jobs.get_mut(job) else {
            state.release_run(&key, holder, now);
            return Ok(Completion::Refused { current: None });
        };
        let current = record.run.as_ref().map(|run| run.info.clone());
        let accepted = lease.is_some()
            && record.run.as_ref().is_some_and(|run| {
                run.info.fencing_token == fencing_token && run.state == RunState::Running
            });
        let decides = record
            .run
            .as_ref()
            .is_some_and(|run| record.decides(&run.info));
        if accepted && let Some(run) = record.run.as_mut() {
            run.state = RunState::Completed;
            run.ended_at = Some(wall);
            record.counts.completed += 1;
            if decides {
                record.decided.state = TickState::Completed;
                record.decided.reason = TickReason::Done;
            }
            // A completion names no record ttl: the last one asked for.
            let record_ttl = record.record_ttl;
            record.refresh(wall, now, record_ttl);
        }
        state.release_run(&key, holder, now);
        Ok(if accepted {
            Completion::Completed { server_time: wall }
        } else {
            Completion::Refused { current }
        })
    }

    async fn claim_rerun(&self, request: &RerunRequest) -> Result<RerunReply, BackendError> {
        const OP: &str = "claim_rerun";
        let sent_at = Instant::now();
        let key = request.job.run_key();
        request.check(OP)?;
        self.gate(OP, &key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let wall = self.wall_ms();
        state.forget_jobs(now);
        let Some(mut record) = state.jobs.remove(&request.job) else {
            return Ok(RerunReply::Settled);
        };
        let reply = state.claim(request, &mut record, &key, now, wall, sent_at);
        state.jobs.insert(request.job.clone(), record);
        Ok(reply)
    }

    async fn job_record(&self, job: &JobName) -> Result<Option<JobRecord>, BackendError> {
        let key = job.run_key();
        self.gate("job_record", &key).await?;
        let now = Instant::now();
        let mut state = self.state();
        let wall = self.wall_ms();
        state.forget_jobs(now);
        let lease = state.run_lease(&key, now);
        Ok(state
            .jobs
            .get(job)
            .map(|r| r.view(job, lease.as_ref(), now, wall)))
    }

    async fn job_records(&self) -> Result<Vec<JobRecord>, BackendError> {
        self.wait_gate()
            .await
            .map_err(|source| BackendError::Unavailable {
                op: "job_records",
                key: "job:{*}:run".to_owned(),
                source,
            })?;
        let now = Instant::now();
        let mut state = self.state();
        let wall = self.wall_ms();
        state.forget_jobs(now);
        let mut jobs: Vec<JobName> = state.jobs.keys().cloned().collect();
        jobs.sort();
        let mut records = Vec::with_capacity(jobs.len());
        for job in jobs {
            let lease = state.run_lease(&job.run_key(), now);
            if let Some(r) = state.jobs.get(&job) {
                records.push(r.view(&job, lease.as_ref(), now, wall));
            }
        }
        Ok(records)
    }
}
