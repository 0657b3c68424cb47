//! The watchdog: one task and one timer queue for every lease of a manager.
//!
//! Each lease has exactly one timer at a time: `Renew` while it waits for
//! its next renewal, `Deadline` while a renewal is in flight (or after the
//! renewal cap is reached). Renewals that fall due together go to the
//! backend as one `renew_many` batch; when a renewal timer fires, the
//! renewals due within a short window after it ([`RENEW_WINDOW_DIVISOR`])
//! are pulled forward into the same batch, so leases acquired close together
//! share their round trips from the first renewal on, and renewed together,
//! they stay together. Renewals are only ever sent early, never late.
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
use crate::lease::{LossReason, Shared};

/// The most renewals sent to the backend in one call.
pub(crate) const MAX_BATCH: usize = 1000;

/// A renewal due within `renew_interval / RENEW_WINDOW_DIVISOR` of a batch
/// being sent joins it. Renewing that much early costs a lease 1/16 of an
/// interval of validity it would have had anyway (the next renewal comes
/// early too); in exchange, leases spread over time coalesce into batches.
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

/// How one lease is kept, fixed at acquisition.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) renew_interval: Duration,
    pub(crate) safety_margin: Duration,
    pub(crate) max_renewals: Option<u32>,
}

impl Timing {
    /// After a failed renewal, try again this much later (bounded by the deadline).
    fn retry_delay(&self) -> Duration {
        (self.renew_interval / 4).max(Duration::from_millis(1))
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
    entries: HashMap<u64, Entry>,
    timers: DelayQueue<(u64, Event)>,
    work: FuturesUnordered<Work>,
    commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
}

impl<B: LeaseBackend> Watchdog<B> {
    pub(crate) fn new(
        backend: B,
        commands: mpsc::UnboundedReceiver<Command>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            backend,
            entries: HashMap::new(),
            timers: DelayQueue::new(),
            work: FuturesUnordered::new(),
            commands,
            shutdown,
        }
    }

    /// Runs until shut down, or until no handle or manager is left.
    pub(crate) async fn run(mut self) {
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
                else => break,
            }
            if stopping && self.work.is_empty() {
                break;
            }
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
                let deadline = valid_until(sent_at, shared.ttl) - timing.safety_margin;
                let entry = Entry {
                    shared,
                    deadline,
                    timer: None,
                    ended: false,
                };
                let renew_at = sent_at + timing.renew_interval;
                self.entries.insert(id, entry);
                self.schedule(id, renew_at);
            }
            Command::Release { id, reply } => match self.entries.remove(&id) {
                Some(mut entry) => {
                    self.cancel_timer(&mut entry);
                    self.release(&entry.shared.key, entry.shared.holder, reply);
                }
                None => {
                    // Released at shutdown already.
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(ReleaseOutcome::NotHeld));
                    }
                }
            },
            Command::ReleaseOrphan { key, holder } => self.release(&key, holder, None),
        }
    }

    /// Sets the entry's next timer: a renewal at `renew_at`, or the deadline
    /// when the cap is reached. Ends the lease at once if the deadline passed.
    fn schedule(&mut self, id: u64, renew_at: Instant) {
        let now = Instant::now();
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
        if !due.is_empty() {
            self.pull_renewals_due_soon(now, &mut due);
        }
        for ids in due.chunks(MAX_BATCH) {
            self.send_renewals(ids.to_vec());
        }
    }

    /// Moves the renewals due within their lease's window after `now` into
    /// `due`, earliest first, stopping at the first timer that is not such a
    /// renewal. The timer wheel's next slot is looked at, not scanned: a
    /// renewal missed here is sent on time by its own timer.
    fn pull_renewals_due_soon(&mut self, now: Instant, due: &mut Vec<u64>) {
        while let Some(key) = self.timers.peek() {
            let when = self.timers.deadline(&key);
            let (id, event) = self.timers.remove(&key).into_inner();
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // every live timer has an entry; nothing to keep
            };
            let window = entry.shared.timing.renew_interval / RENEW_WINDOW_DIVISOR;
            if matches!(event, Event::Renew) && when <= now + window && now < entry.deadline {
                entry.timer = Some(self.timers.insert_at((id, Event::Deadline), entry.deadline));
                due.push(id);
            } else {
                // Not ours to take early: put it back as it was.
                entry.timer = Some(self.timers.insert_at((id, event), when));
                return;
            }
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
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            let Some(entry) = self.entries.get_mut(&id) else {
                continue; // released while the renewal was in flight
            };
            if entry.ended {
                continue; // its deadline came first: a late success changes nothing
            }
            match outcome {
                Ok(RenewOutcome::Renewed) => {
                    let valid = valid_until(sent_at, entry.shared.ttl);
                    entry.deadline = valid - entry.shared.timing.safety_margin;
                    entry.shared.renewed(valid);
                    let renew_at = sent_at + entry.shared.timing.renew_interval;
                    debug!(key = %entry.shared.key, name = %entry.shared.name, "lease renewed");
                    self.schedule(id, renew_at);
                }
                Ok(RenewOutcome::Lost) => self.end(id, LossReason::Lost),
                Err(error) => {
                    debug!(key = %entry.shared.key, name = %entry.shared.name, %error, "renewal failed; retrying");
                    let retry_at = now + entry.shared.timing.retry_delay();
                    self.schedule(id, retry_at);
                }
            }
        }
    }

    /// Cancels the holder's token; the entry stays until its handle releases it.
    fn end(&mut self, id: u64, reason: LossReason) {
        let Some(entry) = self.entries.get_mut(&id) else {
            return;
        };
        entry.ended = true;
        if let Some(key) = entry.timer.take() {
            self.timers.try_remove(&key);
        }
        if entry.shared.end(reason) {
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
        for (_, entry) in std::mem::take(&mut self.entries) {
            entry.shared.end(LossReason::Shutdown);
            self.release(&entry.shared.key, entry.shared.holder, None);
        }
    }

    fn release(&mut self, key: &LeaseKey, holder: HolderId, reply: Option<ReleaseReply>) {
        let backend = self.backend.clone();
        let key = key.clone();
        self.work.push(Box::pin(async move {
            let outcome = backend.release(&key, &holder).await;
            if let Err(error) = &outcome {
                debug!(%key, %error, "release failed; the lease expires by itself");
            }
            if let Some(reply) = reply {
                let _ = reply.send(outcome.map_err(LeaseError::from));
            }
            Done::Released
        }));
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
        assert!(lease <= 40, "Lease is {lease} bytes");
        // A timer's payload: the lease id and what to do.
        assert!(std::mem::size_of::<(u64, Event)>() <= 16);
    }
}
