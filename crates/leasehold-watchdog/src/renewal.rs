//! The watchdog: one task and one timer queue for every lease of a manager.
//!
//! Each lease has exactly one timer at a time: `Renew` while it waits for
//! its next renewal, `Deadline` while a renewal is in flight (or after the
//! renewal cap is reached). Renewals that fall due together go to the
//! backend as one `renew_many` batch. Renewal times are moved back onto a
//! grid ([`RENEW_WINDOW_DIVISOR`] steps per renew interval, counted from the
//! watchdog's start), so leases acquired close together fall due in the same
//! timer tick and share their round trips from the first renewal on;
//! renewed together, they stay together. Renewals are only ever sent early,
//! never late.
//! Backend calls run as futures inside this task, so a slow batch never
//! delays a deadline: the timer branch of the loop fires on time whatever
//! the backend does.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use leasehold_core::{
    BackendError, HolderId, LeaseBackend, LeaseKey, ReleaseOutcome, RenewOutcome, RenewRequest,
    valid_until,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use tracing::{Instrument, debug, debug_span, warn};

use crate::LeaseError;
use crate::changes::Changes;
use crate::lease::{LossReason, Shared};
use crate::metrics::{self, RENEW_ERROR, RENEW_LOST, RENEWED, RenewalTally};
use crate::queue::Queues;

/// The most renewals sent to the backend in one call.
pub(crate) const MAX_BATCH: usize = 1000;

/// Renewal times are rounded down to a multiple of
/// `renew_interval / RENEW_WINDOW_DIVISOR` after the watchdog's start.
/// Renewing up to that much early costs a lease nothing it relies on (its
/// deadline counts from each renewal's send); in exchange, leases acquired
/// within one step of each other fall due in the same timer tick. (Finding
/// the renewals due soon when a timer fires would need a scan of the timer
/// wheel's slot, which at a million leases costs more than the batching saves.)
pub(crate) const RENEW_WINDOW_DIVISOR: u32 = 16;

/// A reply channel for a release.
pub(crate) type ReleaseReply = oneshot::Sender<Result<ReleaseOutcome, LeaseError>>;

/// What handles and the manager tell the watchdog.
pub(crate) enum Command {
    /// Start keeping a freshly acquired lease; `sent_at` is when its
    /// acquisition was sent.
    Register {
        id: u64,
        shared: Arc<Shared>,
        sent_at: Instant,
    },
    /// Stop keeping a lease and release it on the server.
    Release {
        id: u64,
        reply: Option<ReleaseReply>,
    },
    /// Release a lease that may exist on the server with no handle, after an
    /// acquisition whose outcome is unknown was abandoned.
    ReleaseOrphan { key: LeaseKey, holder: HolderId },
}

/// How one lease is kept, fixed at acquisition. Durations are kept in
/// nanoseconds (a day is 8.6e13, far inside a u64) rather than as
/// `Duration`s, which saves 16 bytes for each of a million leases.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    renew_interval_ns: u64,
    safety_margin_ns: u64,
    pub(crate) max_renewals: Option<u32>,
}

impl Timing {
    pub(crate) fn new(
        renew_interval: Duration,
        safety_margin: Duration,
        max_renewals: Option<u32>,
    ) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self {
            renew_interval_ns: ns(renew_interval),
            safety_margin_ns: ns(safety_margin),
            max_renewals,
        }
    }

    pub(crate) fn renew_interval(&self) -> Duration {
        Duration::from_nanos(self.renew_interval_ns)
    }

    pub(crate) fn safety_margin(&self) -> Duration {
        Duration::from_nanos(self.safety_margin_ns)
    }

    /// After the `failures`-th failed renewal in a row, try again this much
    /// later (bounded by the deadline): 5 ms, 20 ms, 80 ms, then a quarter of
    /// the renew interval. The first retry comes almost at once because the
    /// commonest failure is a connection that broke (a restart, a failover),
    /// and the client reconnects on it: waiting longer would only delay
    /// learning whether the lease survived.
    fn retry_delay(&self, failures: u8) -> Duration {
        let quick = Duration::from_millis(5) * 4u32.pow(u32::from(failures.min(3)));
        quick
            .min(self.renew_interval() / 4)
            .max(Duration::from_millis(1))
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Renew,
    Deadline,
}

/// The watchdog's own state per lease. Kept small, since a manager may
/// hold a million: the timing lives in `shared`, not here.
struct Entry {
    shared: Arc<Shared>,
    /// When the token fires unless a renewal succeeds first.
    deadline: Instant,
    timer: Option<delay_queue::Key>,
    ended: bool,
    /// Failed renewals in a row, for the retry delay.
    failures: u8,
    /// A renewal of this lease is in flight.
    in_flight: bool,
    /// The backend reported a change while the renewal was in flight:
    /// renew again as soon as it returns.
    again: bool,
}

impl Entry {
    /// Records the hold time and leaves the held gauge, once per lease.
    fn finish(&mut self, how: &'static str) {
        if !self.ended {
            self.ended = true;
            metrics::ended(&self.shared.name, how, self.shared.acquired_at.elapsed());
        }
    }
}

impl Entry {
    fn capped(&self) -> bool {
        self.shared
            .timing
            .max_renewals
            .is_some_and(|max| self.shared.renewals() >= max)
    }
}

enum Done {
    Renewals {
        ids: Vec<u64>,
        sent_at: Instant,
        outcomes: Vec<Result<RenewOutcome, BackendError>>,
    },
    Released,
}

type Work = Pin<Box<dyn Future<Output = Done> + Send>>;

pub(crate) struct Watchdog<B> {
    backend: B,
    /// For releases to hand a lease to a local waiter (see `handoff.rs`).
    queues: Arc<Queues>,
    entries: HashMap<u64, Entry>,
    timers: DelayQueue<(u64, Event)>,
    work: FuturesUnordered<Work>,
    commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
    /// Where the renewal grid starts.
    epoch: Instant,
    /// Changes the backend reports, and the leases each one names.
    changes: Changes,
}

impl<B: LeaseBackend> Watchdog<B> {
    pub(crate) fn new(
        backend: B,
        queues: Arc<Queues>,
        commands: mpsc::UnboundedReceiver<Command>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            backend,
            queues,
            entries: HashMap::new(),
            timers: DelayQueue::new(),
            work: FuturesUnordered::new(),
            commands,
            shutdown,
            epoch: Instant::now(),
            changes: Changes::none(),
        }
    }

    /// `at`, rounded down to the renewal grid of a lease renewed every
    /// `interval`: never later than `at`, at most `interval / 16` earlier.
    fn on_grid(&self, at: Instant, interval: Duration) -> Instant {
        let step = (interval / RENEW_WINDOW_DIVISOR).as_nanos();
        if step == 0 || at <= self.epoch {
            return at;
        }
        let early = (at - self.epoch).as_nanos() % step;
        // `early` is below `step`, itself below `interval`: it fits.
        at - Duration::from_nanos(u64::try_from(early).unwrap_or(0))
    }

    /// Runs until shut down, or until no handle or manager is left.
    ///
    /// Outside tokio's cooperative budget: with the budget (128 resource
    /// polls per turn), the timer queue stops yielding expired entries after
    /// about 128 in one turn, so a cohort of renewals due at one instant was
    /// split into batches of ~125 instead of 1,000. The loop still returns
    /// to the runtime whenever nothing is ready.
    pub(crate) async fn run(self) {
        tokio::task::coop::unconstrained(self.run_loop()).await;
    }

    async fn run_loop(mut self) {
        match self.backend.watch_changes().await {
            Ok(watch) => self.changes = Changes::new(watch),
            Err(error) => {
                warn!(%error, "the backend's changes cannot be watched; leases learn of a loss at their next renewal");
            }
        }
        let mut stopping = false;
        let mut commands_open = true;
        loop {
            tokio::select! {
                biased;
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    // Take what was sent before the shutdown (a lease acquired
                    // just before it must be released too); later sends fail.
                    self.commands.close();
                    while let Ok(command) = self.commands.try_recv() {
                        self.on_command(command);
                    }
                    self.stop_all();
                }
                command = self.commands.recv(), if commands_open && !stopping => match command {
                    Some(command) => self.on_command(command),
                    None => commands_open = false,
                },
                Some(expired) = self.timers.next(), if !self.timers.is_empty() => {
                    self.on_timers(expired.into_inner());
                }
                Some(done) = self.work.next(), if !self.work.is_empty() => self.on_done(done),
                change = self.changes.next(), if self.changes.is_open() && !stopping => {
                    if let Some(change) = change {
                        let ids = self.changes.affected(change);
                        self.renew_now(&ids);
                    }
                }
                else => break,
            }
            self.catch_up();
            if stopping && self.work.is_empty() {
                break;
            }
        }
    }

    /// Gives expired timers and finished backend calls a turn after every
    /// event, without waiting. With many leases a timer expires (or a
    /// command arrives) every millisecond, so the biased `select!` alone
    /// would always find an earlier branch ready: a flood of acquisitions
    /// would hold back deadlines, and a steady stream of renewal timers
    /// would keep the renewals' own replies from ever being read.
    /// (A noop waker is enough here: before the task sleeps, the `select!`
    /// polls every branch with the real one.)
    fn catch_up(&mut self) {
        if let Some(Some(expired)) = self.timers.next().now_or_never() {
            self.on_timers(expired.into_inner());
        }
        while let Some(Some(done)) = self.work.next().now_or_never() {
            self.on_done(done);
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Register {
                id,
                shared,
                sent_at,
            } => {
                let timing = shared.timing;
                let deadline = valid_until(sent_at, shared.ttl) - timing.safety_margin();
                metrics::held(&shared.name, 1.0);
                let entry = Entry {
                    shared,
                    deadline,
                    timer: None,
                    ended: false,
                    failures: 0,
                    in_flight: false,
                    again: false,
                };
                self.changes.insert(&entry.shared.key, id);
                let renew_at = sent_at + timing.renew_interval();
                self.entries.insert(id, entry);
                self.schedule(id, renew_at);
            }
            Command::Release { id, reply } => match self.entries.remove(&id) {
                Some(mut entry) => {
                    self.changes.remove(&entry.shared.key, id);
                    self.cancel_timer(&mut entry);
                    entry.finish(if reply.is_some() {
                        "released"
                    } else {
                        "dropped"
                    });
                    self.release(
                        &entry.shared.key,
                        Some(&entry.shared.name),
                        entry.shared.holder,
                        reply,
                    );
                }
                None => {
                    // Released at shutdown already.
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(ReleaseOutcome::NotHeld));
                    }
                }
            },
            Command::ReleaseOrphan { key, holder } => self.release(&key, None, holder, None),
        }
    }

    /// Sets the entry's next timer: a renewal at `renew_at`, or the deadline
    /// when the cap is reached. Ends the lease at once if the deadline passed.
    fn schedule(&mut self, id: u64, renew_at: Instant) {
        let now = Instant::now();
        let Some(interval) = self
            .entries
            .get(&id)
            .map(|e| e.shared.timing.renew_interval())
        else {
            return;
        };
        let renew_at = self.on_grid(renew_at, interval);
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        if now >= entry.deadline {
            self.end(id, LossReason::Deadline);
            return;
        }
        let (when, event) = if entry.capped() {
            (entry.deadline, Event::Deadline)
        } else {
            (renew_at.min(entry.deadline), Event::Renew)
        };
        if let Some(old) = entry.timer.take() {
            self.timers.try_remove(&old);
        }
        entry.timer = Some(self.timers.insert_at((id, event), when));
    }

    fn cancel_timer(&mut self, entry: &mut Entry) {
        if let Some(key) = entry.timer.take() {
            self.timers.try_remove(&key);
        }
    }

    /// Handles one expired timer and every other one already expired, then
    /// sends the due renewals in batches.
    fn on_timers(&mut self, first: (u64, Event)) {
        let now = Instant::now();
        let mut due = Vec::new();
        let mut next = Some(first);
        while let Some((id, event)) = next {
            if let Some(entry) = self.entries.get_mut(&id) {
                entry.timer = None;
                match event {
                    // Checked before renewing: a watchdog that was not
                    // scheduled for a while must not renew a lease whose
                    // holder should already have been told.
                    Event::Renew if now < entry.deadline => {
                        entry.timer =
                            Some(self.timers.insert_at((id, Event::Deadline), entry.deadline));
                        entry.in_flight = true;
                        due.push(id);
                    }
                    Event::Deadline if entry.capped() => self.end(id, LossReason::RenewalLimit),
                    Event::Renew | Event::Deadline => self.end(id, LossReason::Deadline),
                }
            }
            next = self
                .timers
                .next()
                .now_or_never()
                .flatten()
                .map(delay_queue::Expired::into_inner);
        }
        for ids in due.chunks(MAX_BATCH) {
            self.send_renewals(ids.to_vec());
        }
    }

    /// Renews the leases `ids` now rather than at their next renewal, for
    /// a change the backend reported. A lease whose renewal is in flight is
    /// renewed once more right after it returns (the change may have come
    /// after the server ran it); a lease past its cap, ended or released is
    /// left alone.
    fn renew_now(&mut self, ids: &[u64]) {
        let now = Instant::now();
        let mut due = Vec::new();
        for &id in ids {
            let Some(entry) = self.entries.get_mut(&id) else {
                continue;
            };
            if entry.ended || entry.capped() || now >= entry.deadline {
                continue;
            }
            if entry.in_flight {
                entry.again = true;
                continue;
            }
            if let Some(old) = entry.timer.take() {
                self.timers.try_remove(&old);
            }
            entry.timer = Some(self.timers.insert_at((id, Event::Deadline), entry.deadline));
            entry.in_flight = true;
            due.push(id);
        }
        for ids in due.chunks(MAX_BATCH) {
            self.send_renewals(ids.to_vec());
        }
    }

    fn send_renewals(&mut self, ids: Vec<u64>) {
        let requests: Vec<RenewRequest> = ids
            .iter()
            .filter_map(|id| self.entries.get(id))
            .map(|e| RenewRequest::new(e.shared.key.clone(), e.shared.holder, e.shared.ttl))
            .collect();
        let backend = self.backend.clone();
        let span = debug_span!("renew_batch", size = requests.len());
        self.work.push(Box::pin(
            async move {
                let sent_at = Instant::now();
                let outcomes = backend.renew_many(&requests).await;
                Done::Renewals {
                    ids,
                    sent_at,
                    outcomes,
                }
            }
            .instrument(span),
        ));
    }

    fn on_done(&mut self, done: Done) {
        let Done::Renewals {
            ids,
            sent_at,
            outcomes,
        } = done
        else {
            return;
        };
        let now = Instant::now();
        metrics::renew_batch(now.saturating_duration_since(sent_at));
        let mut tally = RenewalTally::default();
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // released while the renewal was in flight
            };
            entry.in_flight = false;
            if entry.ended {
                continue; // its deadline came first: a late success changes nothing
            }
            let again = std::mem::take(&mut entry.again);
            match outcome {
                Ok(RenewOutcome::Renewed) => {
                    tally.add(&entry.shared.name, RENEWED);
                    let valid = valid_until(sent_at, entry.shared.ttl);
                    entry.deadline = valid - entry.shared.timing.safety_margin();
                    entry.shared.renewed(valid);
                    entry.failures = 0;
                    // A change reported while this renewal was in flight
                    // may have come after the server ran it: check again now.
                    let renew_at = if again {
                        now
                    } else {
                        sent_at + entry.shared.timing.renew_interval()
                    };
                    debug!(key = %entry.shared.key, name = %entry.shared.name, "lease renewed");
                    self.schedule(id, renew_at);
                }
                Ok(RenewOutcome::Lost) => {
                    tally.add(&entry.shared.name, RENEW_LOST);
                    self.end(id, LossReason::Lost);
                }
                Err(error) => {
                    tally.add(&entry.shared.name, RENEW_ERROR);
                    debug!(key = %entry.shared.key, name = %entry.shared.name, %error, "renewal failed; retrying");
                    let retry_at = now + entry.shared.timing.retry_delay(entry.failures);
                    entry.failures = entry.failures.saturating_add(1);
                    self.schedule(id, retry_at);
                }
            }
        }
        tally.record();
    }

    /// Cancels the holder's token; the entry stays until its handle releases it.
    fn end(&mut self, id: u64, reason: LossReason) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.finish(reason.as_str());
        if let Some(key) = entry.timer.take() {
            self.timers.try_remove(&key);
        }
        if entry.shared.end(reason) {
            metrics::lost(&entry.shared.name, reason.as_str());
            let left = entry
                .shared
                .valid_until()
                .saturating_duration_since(Instant::now());
            warn!(
                key = %entry.shared.key,
                name = %entry.shared.name,
                reason = reason.as_str(),
                validity_left_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                "lease ended: {reason}",
            );
        }
    }

    fn stop_all(&mut self) {
        self.timers.clear();
        for (_, mut entry) in std::mem::take(&mut self.entries) {
            entry.finish(LossReason::Shutdown.as_str());
            if entry.shared.end(LossReason::Shutdown) {
                metrics::lost(&entry.shared.name, LossReason::Shutdown.as_str());
            }
            self.release(
                &entry.shared.key,
                Some(&entry.shared.name),
                entry.shared.holder,
                None,
            );
        }
    }

    fn release(
        &mut self,
        key: &LeaseKey,
        name: Option<&str>,
        holder: HolderId,
        reply: Option<ReleaseReply>,
    ) {
        let backend = self.backend.clone();
        let queues = Arc::clone(&self.queues);
        let span = debug_span!("release", key = %key, name);
        let key = key.clone();
        self.work.push(Box::pin(
            async move {
                let outcome = crate::handoff::release(&backend, &queues, &key, &holder).await;
                if let Err(error) = &outcome {
                    debug!(%key, %error, "release failed; the lease expires by itself");
                }
                if let Some(reply) = reply {
                    let _ = reply.send(outcome.map_err(LeaseError::from));
                }
                Done::Released
            }
            .instrument(span),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-lease structures docs/performance.md accounts for: the
    /// watchdog's entry, the state shared with the handle, and the handle.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn per_lease_structures_stay_small() {
        let entry = std::mem::size_of::<Entry>();
        let shared = std::mem::size_of::<Shared>();
        let lease = std::mem::size_of::<crate::Lease>();
        assert!(entry <= 48, "Entry is {entry} bytes");
        assert!(shared <= 160, "Shared is {shared} bytes");
        assert!(lease <= 32, "Lease is {lease} bytes");
        // A timer's payload: the lease id and what to do.
        assert!(std::mem::size_of::<(u64, Event)>() <= 16);
    }
}
