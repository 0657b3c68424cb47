//! A waiter's life: how one [`acquire`](crate::LeaseManager::acquire) gets
//! its lease, as named states and one small function per transition.
//!
//! ```text
//!  Trying   no one of this manager waits for or tries the key, no
//!    │      yield due: one attempt before queueing ──Acquired────► Granted
//!    │ Held, or a transient error (no wait: GaveUp)
//!    ▼      (straight to Queued when someone here waits for or tries it)
//!  Queued ──(queue full / wait ran out)──────────────────────────► GaveUp
//!    │ head of the key's local queue (queue.rs)
//!    ├── baton from the previous head ──────────────► Refused (no attempt)
//!    ├── after Trying ───────────────────► Refused (by Trying's attempt)
//!    ▼
//!  Yielding   only after a release here that a waiter elsewhere heard:
//!    │        listens for the next holder's notice (then Deferring)
//!    ▼
//!  Attempting ──Acquired──────────────────────────────────────────► Granted
//!    │ Held, or a transient error
//!    ▼
//!  Refused ──(wait over)──────────────────────────────────────────► GaveUp
//!    │ baton gone stale, or first refusal (subscribe) ─► Attempting
//!    ▼
//!  Listening  for a notice or the fallback poll; Offered when an offer
//!    │        for a local handover stands beside it (handoff.rs)
//!    ├── the offer answered with the lease ───────────────────────► Granted
//!    ├── poll ─────────────────────────────────────────► Attempting
//!    ▼ notice, or the offer answered "released"
//!  Deferring  while waiters elsewhere waited longer: counts their
//!             releases' notices until its turn ─────────► Attempting
//! ```
//!
//! From the head of the queue on, each state is a value of `Step`, and
//! [`acquire`]'s loop runs one transition function per state, each
//! returning the next state: `at_head`, `yielding`, `attempting`,
//! `refused`, `listening`, `deferring`, `granted`. `Trying` and `Queued`
//! come before the loop, once.
//!
//! `Trying` is the uncontended acquisition: a key that no task of this
//! manager waits for or holds the turn of has no local order to keep, no
//! offer standing and no baton, so its first attempt needs no turn. It is
//! made only then (`Queues::try_first`): a newcomer never asks before a
//! waiter of this manager already queued for the key. One newcomer at a
//! time tries a key (a light mark per key fingerprint, not a queue
//! entry): others that come meanwhile queue, so a burst of acquisitions
//! of one key sends one first attempt, plus the head's. A newcomer that
//! queues while another tries may be head before the trying one is
//! refused and queues behind it, as a process that asked later may get a
//! lease first. The attempt is armed as every attempt is: dropped while it
//! is out, it leaves the watchdog to release what it may have taken. A
//! refused `Trying` queues, and at the head counts that refusal as its
//! first (subscribe, then try again). Fair mode never tries before
//! queueing: the server's queue decides who asks.
//!
//! `Deferring` is what keeps processes taking turns, and makes a release
//! lead to about one attempt across processes, not one per process. A
//! waiter ranks its process by how recently it held the key, counted in
//! acquisitions (the released holder's fencing token minus this process's
//! last one), against the number of processes that listen (the server's
//! subscriber count, carried by the watch): the process that held it
//! longest ago has rank 0 and tries at once, the one that released it has
//! the highest rank. Tokens count acquisitions only as `Yielding` counts
//! them, from this process's own grant, one per notice: the server's clock
//! floor makes real tokens microseconds apart, so a waiter that holds the
//! token of a holder that refused it ranks 0. A waiter of a higher rank
//! does not try: it waits for the next notice (one of those ahead of it
//! took the lease and released it), counts the holder after the released
//! one as released by it, and ranks again, one lower each time, until its
//! turn. If no notice comes
//! within the key's window (two turns, a turn being the longest interval
//! between two notices heard here lately, `queue.rs`) and one measured
//! attempt round trip per rank (tokio's timer rounds it up to the next
//! millisecond), or by the fallback poll, which starts again with each
//! notice, it tries anyway: the one ahead may not want the lease any more,
//! or hold it longer than others did, and a refusal tells the true holder
//! again. `Yielding` enters the same count from its own release: the
//! process that just released has the highest rank, and waits for the
//! next holder's notice before it asks at all.
//! Only the exclusive lease counts turns this way: a permit's or a share's
//! release may make room for several waiters, so their heads hold back
//! one moment per rank and then try, racing the heads of other processes;
//! they subscribe afresh on each wait
//! ([`WatchPolicy::Afresh`]), so that the order in which
//! the server tells processes does not keep one of them ahead. A process
//! that waits alone, or a backend without the count (memory, cluster),
//! never holds back. What the manager remembers for `Yielding` and
//! `Deferring`, and their tunables, are in `turns.rs`.
//!
//! `Granted` hands the turn on, if the waiter queued (with a baton when
//! others wait behind), and the manager registers the lease with the
//! watchdog.
//!
//! In fair mode (`LeaseOptions::fair`, for exclusive leases) `Queued` stays
//! local and the head then waits in the server's queue instead
//! (`waiting/fair.rs`): `Attempting` takes or keeps a place there, and
//! `Listening` waits for the releases ahead of it; `Yielding`, `Deferring`
//! and the local offer are not needed there, as the server's order already
//! decides.

mod fair;

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FencingToken, Grant, LeaseBackend, LeaseInfo,
    LeaseKey, ReleaseWatch, WatchPolicy,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::debug;

use crate::attempt::{Attempt, intent_refresh};
use crate::capability;
use crate::handoff::{Handoff, Withdrawn};
use crate::home::OrphanGuard;
use crate::queue::{QueueError, Queues, Turn};
use crate::renewal::Command;
use crate::{LeaseError, LeaseOptions};

/// What a waiter needs of its manager.
pub(crate) struct Manager<'a, B> {
    pub(crate) backend: &'a B,
    pub(crate) queues: &'a Arc<Queues>,
    pub(crate) commands: &'a mpsc::UnboundedSender<Command>,
}

/// A waiter that got its lease, still at the head of the queue if it
/// queued.
pub(crate) struct Won {
    pub(crate) grant: Grant,
    /// `None` when the first attempt, made before queueing, got the lease.
    pub(crate) turn: Option<Turn>,
    /// The waiter's release watch, if it subscribed.
    pub(crate) watch: Option<ReleaseWatch>,
    /// Whether the lease came by local handover (then the watch goes on
    /// with the baton; see `LeaseManager::took`).
    pub(crate) handed_over: bool,
}

/// Waits for `request`'s lease (or permit, per `attempt`): the whole life,
/// from `Trying` (or `Queued`) to `Granted` or `GaveUp` (an error).
///
/// # Cancel safety
///
/// Dropping the future leaves the queue, takes a standing offer back, and
/// has the watchdog release an attempt whose outcome is unknown.
/// `started` is when the caller's acquisition began: the wait counts from it.
pub(crate) async fn acquire<B: LeaseBackend>(
    manager: Manager<'_, B>,
    key: &LeaseKey,
    request: AcquireRequest,
    options: &LeaseOptions,
    attempt: Attempt,
    started: Instant,
) -> Result<Won, LeaseError> {
    let give_up_at = options.wait().map(|wait| started + wait);
    if let (Some(_), Attempt::Lease) = (options.fair(), attempt) {
        // Fair mode: the server's queue decides from the head of the local
        // one on (`waiting/fair.rs`); no one asks before taking a place.
        // Boxed, so that an acquisition in the default mode does not carry
        // the fair waiter's state.
        let turn = queued(manager.queues, key, started, give_up_at).await?;
        return Box::pin(fair::acquire(
            manager, key, request, options, turn, started, give_up_at,
        ))
        .await;
    }
    // Declared before the waiter, so that it is dropped after it: the
    // watch, then the orphan guard (which may hand a release to the
    // watchdog), then the turn.
    let turn: Turn;
    let mut waiter = Waiter {
        watch: None,
        orphan: OrphanGuard {
            commands: manager.commands,
            key,
            holder: request.holder,
            armed: false,
            permits: match attempt {
                Attempt::Permit(limit) => Some(limit),
                _ => None,
            },
            share: attempt.share_key(key, &request.holder),
        },
        manager,
        key,
        options,
        request,
        kind: attempt,
        started,
        give_up_at,
        attempt: 0,
        holder_token: None,
    };
    // `Trying`: with no one of this manager queued for the key (so no
    // turn, offer or baton to respect) and no yield due, one attempt
    // before queueing. The turn bookkeeping is left to acquisitions that
    // meet contention.
    let queues = waiter.manager.queues;
    let mut refused = None;
    if let Some(trying) = queues.try_first(key, give_up_at.is_some()) {
        let tried = waiter.attempting().await;
        drop(trying);
        match tried? {
            Step::Granted { grant, handed_over } => {
                return Ok(waiter.granted(None, grant, handed_over));
            }
            // No wait: the answer is the refusal.
            Step::Refused(refusal) if give_up_at.is_none() => return Err(refusal.failure),
            // Boxed: carried across the wait for a turn, it would size every
            // acquisition's state; only contention gets here.
            Step::Refused(refusal) => refused = Some(Box::new(refusal)),
            // `attempting` ends in one of the two above.
            Step::Attempting
            | Step::Yielding { .. }
            | Step::Listening { .. }
            | Step::Deferring { .. } => {}
        }
    }
    // Boxed: only contention queues, and inline the wait for the turn
    // (a lock and a timer) would size every acquisition's state.
    turn = Box::pin(queued(queues, key, started, give_up_at)).await?;
    let mut step = waiter.at_head(&turn, refused);
    loop {
        step = match step {
            // Moved out and dropped, so that the step is not kept in the
            // waiter's state while the backend call is out.
            attempting @ Step::Attempting => {
                drop(attempting);
                waiter.attempting().await?
            }
            Step::Refused(refusal) => waiter.refused(&turn, refusal).await?,
            // Boxed, these three: their states (a notice, a poll and an
            // offer, raced) are the largest, and every acquisition would
            // otherwise carry them, waiting or not; one allocation per
            // wait for a notice, beside that wait.
            Step::Yielding { until, then } => Box::pin(waiter.yielding(until, then)).await,
            Step::Listening { poll_at, offer } => Box::pin(waiter.listening(poll_at, offer)).await,
            Step::Deferring { then } => Box::pin(waiter.deferring(then)).await,
            Step::Granted { grant, handed_over } => {
                return Ok(waiter.granted(Some(turn), grant, handed_over));
            }
        };
    }
}

/// Where a waiter at the head is, between transitions.
enum Step<'a> {
    /// After a release here that a waiter elsewhere heard: listening for
    /// the next holder's notice until `until`, then `then`.
    Yielding { until: Instant, then: Then },
    /// About to ask the backend.
    Attempting,
    /// Not granted (refused, failed, or not asked because of a baton).
    Refused(Refusal),
    /// Waiting for a notice, the poll at `poll_at`, or an answer to `offer`
    /// (`Offered` when it has one).
    Listening {
        poll_at: Instant,
        offer: OfferGuard<'a>,
    },
    /// After a notice: holding back while processes that held the key
    /// longer ago take their turns, then `then`.
    Deferring { then: Then },
    /// The lease is ours.
    Granted { grant: Grant, handed_over: bool },
}

/// Where `Yielding` and `Deferring` lead when they are over.
enum Then {
    /// Ask the backend.
    Attempt,
    /// Take up the refusal of `Trying` (subscribe, then ask again).
    Refused(Box<Refusal>),
}

impl Then {
    fn step<'a>(self) -> Step<'a> {
        match self {
            Then::Attempt => Step::Attempting,
            Then::Refused(refusal) => Step::Refused(*refusal),
        }
    }
}

/// Why and for how long a waiter waits.
struct Refusal {
    failure: LeaseError,
    retry_after: Duration,
    /// The local release count of a baton, which lets the head offer
    /// without asking the backend first.
    baton: Option<u64>,
}

/// `Queued`: waits for the head of the key's local queue.
async fn queued(
    queues: &Arc<Queues>,
    key: &LeaseKey,
    started: Instant,
    give_up_at: Option<Instant>,
) -> Result<Turn, LeaseError> {
    match queues.enter(key, give_up_at).await {
        Ok(turn) => Ok(turn),
        Err(QueueError::Busy { waiters }) => Err(LeaseError::Busy {
            key: key.to_string(),
            waiters,
        }),
        Err(QueueError::Occupied) => Err(not_acquired(key, started, LeaseInfo::default())),
    }
}

/// Whether `grant` leaves time, as of `now`, to use it before the safety
/// margin.
fn in_time(grant: &Grant, now: Instant, options: &LeaseOptions) -> bool {
    now < grant.valid_until - options.safety_margin()
}

fn not_acquired(key: &LeaseKey, started: Instant, holder: LeaseInfo) -> LeaseError {
    LeaseError::NotAcquired {
        key: key.to_string(),
        waited: started.elapsed(),
        holder,
    }
}

/// A waiter and what it keeps while it waits; its turn at the head of the
/// key's queue, once it has one, is kept beside it (see [`acquire`]).
struct Waiter<'a, B> {
    // Dropped in this order: the watch, then the orphan guard (which may
    // hand a release to the watchdog).
    watch: Option<ReleaseWatch>,
    /// Releases in the background if the wait is dropped, or gives up,
    /// after an attempt whose outcome is unknown.
    orphan: OrphanGuard<'a>,
    manager: Manager<'a, B>,
    key: &'a LeaseKey,
    options: &'a LeaseOptions,
    /// Every attempt uses the same holder id, so an attempt whose reply was
    /// lost is recognised as ours by the next.
    request: AcquireRequest,
    kind: Attempt,
    started: Instant,
    give_up_at: Option<Instant>,
    attempt: u32,
    /// The fencing token of the holder that refused us last (or of this
    /// manager's own holder, with a baton): the one whose release a notice
    /// announces.
    holder_token: Option<FencingToken>,
}

impl<'a, B: LeaseBackend> Waiter<'a, B> {
    /// At the head: with a baton, straight to `Refused` (the lease is held
    /// in this manager and its release will look for our offer); after a
    /// release here that a waiter elsewhere heard, `Yielding`; else
    /// `Refused` by the attempt of `Trying` (`tried`), if it made one,
    /// else `Attempting`.
    fn at_head(&mut self, turn: &Turn, tried: Option<Box<Refusal>>) -> Step<'a> {
        // Only with notices on: a head that polls leaves every grant to its
        // own attempts.
        let baton = turn
            .handoff()
            .take_baton()
            .filter(|_| self.options.release_notices() && self.hands_over());
        if let Some(baton) = baton {
            self.watch = baton.watch;
            self.holder_token = self.manager.queues.turns().last_won(self.key);
            return Step::Refused(Refusal {
                failure: self.not_acquired(LeaseInfo::default()),
                retry_after: self.options.backoff().delay(self.attempt),
                baton: Some(baton.releases),
            });
        }
        // After a refusal, as after any: subscribe, then try again.
        let then = tried.map_or(Then::Attempt, Then::Refused);
        match self.give_up_at.and_then(|give_up_at| {
            let until = self.manager.queues.turns().yield_until(self.key)?;
            Some(until.min(give_up_at))
        }) {
            Some(until) => Step::Yielding { until, then },
            None => then.step(),
        }
    }

    /// `Yielding`: this manager released the key a moment ago and a waiter
    /// elsewhere heard it: let that waiter take it first. Listen meanwhile,
    /// so that this one is heard of when that one releases. That notice
    /// announces the release of the holder after ours, so from it on this
    /// waiter takes its turn as after any notice (`Deferring`), without
    /// having asked the backend: a process that takes a key in a loop makes
    /// one attempt per acquisition, not one per release.
    async fn yielding(&mut self, until: Instant, then: Then) -> Step<'a> {
        if !self.options.release_notices() {
            tokio::time::sleep_until(until).await;
            return then.step();
        }
        let mut watch = self.subscribe().await;
        if !self.counts_turns() {
            self.watch = Some(watch);
            tokio::time::sleep_until(until).await;
            return then.step();
        }
        let heard = tokio::select! {
            () = tokio::time::sleep_until(until) => false,
            () = watch.released() => true,
        };
        self.watch = Some(watch);
        if !heard {
            return then.step();
        }
        self.manager.queues.turns().note_notice(self.key);
        self.holder_token = self
            .manager
            .queues
            .turns()
            .last_won(self.key)
            .map(|won| FencingToken(won.0.saturating_add(1)));
        Step::Deferring { then }
    }

    /// `Attempting`: one `try_acquire`. `Granted` if the lease came in time
    /// to use, else `Refused`; an error that retrying cannot fix ends the wait.
    async fn attempting(&mut self) -> Result<Step<'a>, LeaseError> {
        self.orphan.armed = true;
        let sent = Instant::now();
        let outcome = self.try_acquire().await;
        let replied = Instant::now();
        self.manager
            .queues
            .turns()
            .note_round_trip(replied.saturating_duration_since(sent));
        let mut holder_left = None;
        let failure = match outcome {
            Ok(AcquireOutcome::Acquired(grant)) => {
                self.orphan.armed = false;
                if in_time(&grant, replied, self.options) {
                    return Ok(Step::Granted {
                        grant,
                        handed_over: false,
                    });
                }
                // The reply came too late to use the lease: give it back,
                // unless the next attempt (same holder) refreshes it.
                self.orphan.armed = true;
                self.not_acquired(LeaseInfo::default())
            }
            Ok(AcquireOutcome::Held(holder)) => {
                self.orphan.armed = false;
                self.holder_token = holder.fencing_token;
                holder_left = holder.ttl_left;
                self.not_acquired(holder)
            }
            Err(error) if error.is_transient() => LeaseError::Backend(error),
            Err(error) => return Err(error.into()),
        };
        // Drawn only on a refusal: a grant needs no delay (nor its jitter).
        let mut retry_after = self.options.backoff().delay(self.attempt);
        if let Some(left) = holder_left {
            // No point sleeping past the holder's expiry.
            retry_after = retry_after.min(left + Duration::from_millis(1));
        }
        if let Attempt::Write = self.kind {
            // The refusal left this writer's intent for one ttl: ask again
            // well within it, or readers may come in (`rw.rs`).
            retry_after = retry_after.min(intent_refresh(self.options.ttl()));
        }
        Ok(Step::Refused(Refusal {
            failure,
            retry_after,
            baton: None,
        }))
    }

    /// `Refused`: `GaveUp` when the wait is over; `Attempting` again at once
    /// when a baton went stale or the head has just subscribed; else
    /// `Listening`, with an offer when the watch works (or a baton stands).
    async fn refused(&mut self, turn: &Turn, refusal: Refusal) -> Result<Step<'a>, LeaseError> {
        let now = Instant::now();
        let Some(give_up_at) = self.give_up_at.filter(|at| now < *at) else {
            let mut failure = refusal.failure;
            // The wait as it ended, not as of the refusal: a refusal of
            // `Trying` may be a queue's wait old.
            if let LeaseError::NotAcquired { waited, .. } = &mut failure {
                *waited = self.started.elapsed();
            }
            return Err(failure);
        };
        let mut offer = self.offer_guard(turn);
        // With a baton, offer first: the holder's release looks for it.
        if let Some(releases) = refusal.baton {
            offer.answer = turn.handoff().offer(&self.request, Some(releases));
            if offer.answer.is_none() {
                // The baton went stale: the holder released meanwhile.
                return Ok(Step::Attempting);
            }
        }
        if self.watch.is_none() && self.options.release_notices() {
            self.watch = Some(self.subscribe().await);
            if offer.answer.is_none() {
                // Subscribe, then retry at once: a release between the
                // refused attempt and the subscription sent no notice we
                // saw. (With an offer standing, the holder's release
                // answers the offer whether it hands over or not.)
                return Ok(Step::Attempting);
            }
        }
        // Offer only with a working watch: a release here hands over only
        // while no other watch listens, which ours must be part of. (A
        // baton's offer may stand before its watch does: until then the
        // release counts none of ours, and hands over only if no one
        // listens at all.)
        if offer.answer.is_none()
            && self.hands_over()
            && self.watch.as_ref().is_some_and(ReleaseWatch::is_supported)
        {
            offer.answer = turn.handoff().offer(&self.request, None);
        }
        debug!(attempt = self.attempt, retry_after = ?refusal.retry_after, "lease not acquired yet; waiting");
        Ok(Step::Listening {
            poll_at: (now + refusal.retry_after).min(give_up_at),
            offer,
        })
    }

    /// `Listening` (or `Offered`): the first of the poll, a release notice
    /// and an answer to the offer. `Granted` when a release handed the
    /// lease over in time to use it; after a release, `Deferring`; else
    /// `Attempting`.
    async fn listening(&mut self, poll_at: Instant, mut offer: OfferGuard<'a>) -> Step<'a> {
        let poll = tokio::time::sleep_until(poll_at);
        let notice = async {
            match self.watch.as_mut() {
                Some(watch) => watch.released().await,
                None => std::future::pending().await,
            }
        };
        let answer = async {
            match offer.answer.as_mut() {
                Some(answer) => answer.await.ok(),
                None => std::future::pending().await,
            }
        };
        let (answered, released) = tokio::select! {
            () = poll => (None, false),
            () = notice => {
                debug!("release notice");
                if self.counts_turns() {
                    self.manager.queues.turns().note_notice(self.key);
                }
                (None, true)
            }
            grant = answer => (Some(grant), true),
        };
        let grant = match answered {
            // A release claimed the offer: the lease, or nothing when it
            // was only released (then try, as after a notice).
            Some(grant) => {
                offer.answer = None;
                if grant.is_none() {
                    self.skip_answered_notice().await;
                }
                grant
            }
            None => offer.settle().await,
        };
        if let Some(grant) = grant {
            // Ours now, whatever an earlier attempt of unknown outcome did.
            self.orphan.armed = false;
            if in_time(&grant, Instant::now(), self.options) {
                return Step::Granted {
                    grant,
                    handed_over: true,
                };
            }
            // Too late to use; the next attempt (same holder) refreshes it.
            self.orphan.armed = true;
        }
        self.attempt = self.attempt.saturating_add(1);
        if released && self.give_up_at.is_some() {
            return Step::Deferring {
                then: Then::Attempt,
            };
        }
        Step::Attempting
    }

    /// After an offer answered "released": that release was announced to
    /// this waiter's watch too. Takes its notice now (it may still be on its
    /// way: for up to one measured round trip), so that `Deferring` does
    /// not count it as the release of the holder after it.
    async fn skip_answered_notice(&mut self) {
        if !self.counts_turns() {
            return;
        }
        let Some(watch) = self.watch.as_mut() else {
            return;
        };
        let moment = self.manager.queues.turns().moment();
        let _ = tokio::time::timeout(moment, watch.released()).await;
    }

    /// `Deferring`: after a release, holds back while processes that
    /// held the key longer ago than this one take their turns (see the
    /// module documentation). At rank 0, or when no notice comes within
    /// two turns and one measured moment per rank, `then`; on the next
    /// notice (one of those ahead took its turn), `Deferring` again, one
    /// rank lower. The fallback poll starts again with each notice (the
    /// notices are flowing), and bounds every hold-back, as the end of
    /// the wait does.
    async fn deferring(&mut self, then: Then) -> Step<'a> {
        let (Some(rank), Some(give_up_at)) = (self.rank(), self.give_up_at) else {
            return then.step();
        };
        let now = Instant::now();
        let poll_at = (now + self.options.backoff().delay(self.attempt)).min(give_up_at);
        let turn_taking = self.manager.queues.turns();
        let moment = turn_taking.moment();
        let hold_back = now + moment.saturating_mul(rank);
        if !self.counts_turns() {
            // One moment per rank, then try: a release of a permit or a
            // share may make room for several.
            debug!(rank, ?moment, "waiters elsewhere waited longer; deferring");
            tokio::time::sleep_until(hold_back.min(poll_at)).await;
            return then.step();
        }
        let turns = turn_taking.window(self.key, now);
        let until = (hold_back + turns).min(poll_at);
        debug!(
            rank,
            ?moment,
            ?turns,
            "waiters elsewhere waited longer; deferring"
        );
        let notice = async {
            match self.watch.as_mut() {
                Some(watch) => watch.released().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep_until(until) => {
                debug!(rank, "no release notice within the window; trying");
                return then.step();
            }
            () = notice => {}
        }
        // One of those that went first released: the next notice
        // announces the release of the holder after it.
        self.manager.queues.turns().note_notice(self.key);
        self.holder_token = self
            .holder_token
            .map(|token| FencingToken(token.0.saturating_add(1)));
        Step::Deferring { then }
    }

    /// How many listening processes held the key longer ago than this one
    /// (0 for the one that held it longest ago, the count of the others for
    /// the one that just released it); `None` when this process goes at once:
    /// it waits alone, never held the key, or cannot tell.
    fn rank(&self) -> Option<u32> {
        let listeners = self.watch.as_ref().and_then(ReleaseWatch::listeners);
        self.manager
            .queues
            .turns()
            .rank(self.key, listeners, self.holder_token)
    }

    /// `Granted`: the lease and the turn (if the waiter queued) go to the
    /// manager, which hands the turn on and registers the lease.
    fn granted(self, turn: Option<Turn>, grant: Grant, handed_over: bool) -> Won {
        self.manager
            .queues
            .turns()
            .note_won(self.key, grant.fencing_token);
        Won {
            grant,
            turn,
            watch: self.watch,
            handed_over,
        }
    }

    /// The one backend call of `Attempting`.
    async fn try_acquire(&self) -> Result<AcquireOutcome, BackendError> {
        match self.kind {
            Attempt::Lease => self.manager.backend.try_acquire(&self.request).await,
            Attempt::Permit(limit) => {
                // Boxed for the reason `subscribe` is.
                Box::pin(capability::acquire_permit(
                    self.manager.backend,
                    &self.request,
                    limit,
                ))
                .await
            }
            Attempt::Read => {
                Box::pin(capability::acquire_read(
                    self.manager.backend,
                    &self.request,
                ))
                .await
            }
            Attempt::Write => {
                Box::pin(capability::acquire_write(
                    self.manager.backend,
                    &self.request,
                ))
                .await
            }
        }
    }

    /// Whether this waiter takes part in the local handover.
    fn hands_over(&self) -> bool {
        matches!(self.kind, Attempt::Lease) && !leasehold_core::ablation::off("offer")
    }

    /// Whether this waiter counts turns by release notices (`Deferring`,
    /// `Yielding`): only for the exclusive lease, where each release is
    /// followed by one grant. A permit's or a share's release may make
    /// room for several waiters at once.
    fn counts_turns(&self) -> bool {
        matches!(self.kind, Attempt::Lease)
    }

    /// Whether `grant` leaves time to use it before the safety margin.
    fn not_acquired(&self, holder: LeaseInfo) -> LeaseError {
        not_acquired(self.key, self.started, holder)
    }

    fn offer_guard(&self, turn: &Turn) -> OfferGuard<'a> {
        OfferGuard {
            handoff: turn.shared_handoff(),
            commands: self.manager.commands,
            key: self.key,
            answer: None,
        }
    }

    /// Subscribes to the key's release notices; a backend without them
    /// gives a watch that never fires, and the head polls.
    async fn subscribe(&self) -> ReleaseWatch {
        // Boxed: a subscription's future is large and is made once per
        // wait, and inline it would size (and be copied with) every
        // acquisition's future.
        let watch = if self.counts_turns() {
            // The count serves `Deferring` alone.
            let policy = if leasehold_core::ablation::off("defer") {
                WatchPolicy::Uncounted
            } else {
                WatchPolicy::Counted
            };
            Box::pin(self.manager.backend.watch_releases(self.key, policy)).await
        } else {
            // Waiters that race on each notice: the order in which the
            // server tells processes must not favour the ones that
            // subscribed first (`WatchPolicy::Afresh`).
            Box::pin(
                self.manager
                    .backend
                    .watch_releases(self.key, WatchPolicy::Afresh),
            )
            .await
        };
        watch.unwrap_or_else(|error| {
            debug!(%error, "no release notices; polling");
            ReleaseWatch::unsupported()
        })
    }
}

/// The head's offer while it waits. Dropped with an answer on its way, it
/// closes the channel: a grant already sent is released here, and one sent
/// later is released by the releasing side, so no lease is left behind.
struct OfferGuard<'a> {
    handoff: Arc<Handoff>,
    commands: &'a mpsc::UnboundedSender<Command>,
    key: &'a LeaseKey,
    answer: Option<oneshot::Receiver<Grant>>,
}

impl OfferGuard<'_> {
    /// Takes the offer back; if a release claimed it first, waits for its
    /// answer: the lease, or nothing when it was only released.
    async fn settle(&mut self) -> Option<Grant> {
        let answer = self.answer.as_mut()?;
        let grant = match self.handoff.withdraw() {
            Withdrawn::Unclaimed => None,
            Withdrawn::Claimed => answer.await.ok(),
        };
        self.answer = None;
        grant
    }
}

impl Drop for OfferGuard<'_> {
    fn drop(&mut self) {
        let Some(mut answer) = self.answer.take() else {
            return;
        };
        if let Withdrawn::Claimed = self.handoff.withdraw() {
            answer.close();
            if let Ok(grant) = answer.try_recv() {
                let _ = self.commands.send(Command::ReleaseOrphan {
                    key: self.key.clone(),
                    holder: grant.holder,
                });
            }
        }
    }
}
