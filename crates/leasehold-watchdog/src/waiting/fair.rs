//! Fair mode's waiting: the head of a key's local queue keeps a place in
//! the server's queue until the server grants it the lease.
//!
//! ```text
//!  Queued (waiting.rs) ──► Placing ──Acquired──────────────────► Granted
//!                            │ Waiting (place kept), or a transient error
//!                            ├── first time: Subscribing ──► Placing
//!                            ▼
//!                          Listening   (refused when the wait is over:
//!                            │          leave the place, GaveUp)
//!                            │ the releases it waits for were announced,
//!                            │ the place is due for a refresh, or the
//!                            │ wait ran out (a last call)
//!                            └──────────────────────► Placing
//! ```
//!
//! `Placing` is one [`try_acquire_fair`](leasehold_core::FairBackend::try_acquire_fair)
//! call: it takes a place at the tail of the server's queue (or refreshes
//! ours) and grants the lease only when it is free and ours is first. The
//! server's order decides, so none of the default mode's ways to take
//! turns (yielding, deferring, the local handover) take part. A free key
//! with no queue is granted without a place, and the first call is made
//! before any subscription: uncontended, fair mode costs one call to
//! acquire and one to release, as the default mode does. Refused once, the
//! waiter has its place, and `Subscribing` listens for releases (and
//! handovers) before it places again at once, so that no release after the
//! place was taken goes unheard.
//!
//! `Listening` knows how many places are ahead: after that many releases
//! (one more while the lease is held) it is our turn, and each release
//! announces itself. Notices can merge (releases close together, heard by
//! a process that was not scheduled in between, wake it once), so a waiter
//! asks again after half of them, which costs a call and re-reads the
//! count: a few calls per wait, and a waiter one or two releases from its
//! turn asks on every notice. It asks at the latest a third of the place
//! ttl after the last call, which refreshes the place (and notices a place
//! ahead that expired). The head, with no notice to wait for, asks on the
//! backoff, and no later than the holder's ttl runs out.
//!
//! Handovers: where the backend can announce them
//! ([`FairBackend::watch_handover`](leasehold_core::FairBackend::watch_handover)), a waiter asks in each call that a
//! release hand it the lease when its place is first, and the release of a
//! lease taken in fair mode ([`FairBackend::release_fair`](leasehold_core::FairBackend::release_fair)) grants it to
//! the head on the server, in the same atomic step. The head, Listening,
//! then holds the lease without another call: an owner switch costs the
//! release and its notice only. The server keeps a handed-over lease for
//! [`handover_hold`] from the head's latest call, and the head counts its
//! validity from when it sent that call ([`Grant::handed_over`]); its first
//! renewal, halfway to its deadline, extends it to the full ttl. While
//! Listening the lease
//! may become ours at any moment, so a wait given up (or dropped) then
//! releases it, as an attempt of unknown outcome is released.

use std::time::Duration;

use leasehold_core::{
    AcquireRequest, BackendError, FairOutcome, FairPlace, FencingToken, Grant, HandoverWatch,
    LeaseBackend, LeaseInfo, LeaseKey, PlaceTtl, ReleaseWatch, WatchPolicy, clock_drift,
};
use tokio::time::Instant;
use tracing::debug;

use super::{Manager, Won};
use crate::capability;
use crate::home::OrphanGuard;
use crate::queue::Turn;
use crate::{LeaseError, LeaseOptions};

/// Waits in the server's queue for `request`'s lease (`options` in fair
/// mode), the local turn `turn` already ours: from `Placing` to `Granted` or `GaveUp`.
///
/// # Cancel safety
///
/// Dropping the future leaves the local queue and has the watchdog release
/// an attempt whose outcome is unknown; the place on the server expires
/// after its place ttl.
pub(crate) async fn acquire<B: LeaseBackend>(
    manager: Manager<'_, B>,
    key: &LeaseKey,
    request: AcquireRequest,
    options: &LeaseOptions,
    turn: Turn,
    started: Instant,
    give_up_at: Option<Instant>,
) -> Result<Won, LeaseError> {
    let place_ttl = options.place_ttl();
    let mut orphan = OrphanGuard {
        commands: manager.commands,
        key,
        holder: request.holder,
        armed: false,
        permits: None,
        share: None,
    };
    // The first call is made before subscribing (unless this process
    // still listens on the key's channel from an earlier wait, which
    // costs nothing), and then asks for no handover: on a free key with
    // no queue it grants the lease at once (fair.lua, 1b), so an
    // acquisition no one contends costs what it costs in the default
    // mode. Refused, the waiter has its place; it subscribes, then calls
    // again at once (`Subscribing`), so that no release after its place
    // was taken goes unheard.
    let mut ears = Ears::deaf();
    if options.release_notices() {
        let listening = subscribe(manager.backend, key, WatchPolicy::AlreadyListening).await;
        if listening.is_supported() {
            ears = Ears::new(manager.backend, key, &request, options, listening).await;
        }
    }
    let refresh = place_ttl.get() / 3;
    let mut attempt = 0u32;
    // When the latest call the server answered was sent.
    let mut placed_at = None;
    loop {
        // Placing.
        orphan.armed = true;
        let sent_at = Instant::now();
        let outcome = Box::pin(capability::acquire_fair(
            manager.backend,
            &request,
            place_ttl,
            ears.hold,
        ))
        .await;
        let now = Instant::now();
        let (failure, retry_at, releases) = match outcome {
            Ok(FairOutcome::Acquired { grant, queued }) => {
                orphan.armed = false;
                crate::metrics::fair_queued(options.shared_name(), queued);
                if in_time(&grant, options) {
                    return Ok(granted(&manager, key, grant, turn, ears.releases));
                }
                // Too late to use: the next call (same holder) refreshes it;
                // given up on, the guard releases it.
                orphan.armed = true;
                (not_acquired(key, started, LeaseInfo::default()), now, 0)
            }
            Ok(FairOutcome::Waiting(place)) => {
                // Asked for a handover, the lease may be ours from now on.
                orphan.armed = ears.hold.is_some();
                placed_at = Some(sent_at);
                crate::metrics::fair_queued(options.shared_name(), place.queued);
                let (retry_at, releases) =
                    listen_plan(&place, options, ears.notices(), attempt, now, refresh);
                let holder = place.holder.unwrap_or_default();
                (not_acquired(key, started, holder), retry_at, releases)
            }
            Err(error) if error.is_transient() => {
                let retry_at = now + options.backoff().delay(attempt).min(refresh);
                (LeaseError::Backend(error), retry_at, 0)
            }
            Err(error) => {
                leave(manager.backend, key, &request).await;
                return Err(error.into());
            }
        };
        // Listening, unless the wait is over (a wait of none: one call).
        let Some(give_up_at) = give_up_at.filter(|at| now < *at) else {
            leave(manager.backend, key, &request).await;
            return Err(failure);
        };
        if ears.releases.is_none() && options.release_notices() {
            // Subscribing: after the first refusal, then at once Placing
            // again (which keeps the place and asks for a handover).
            let subscribed = subscribe(manager.backend, key, WatchPolicy::Uncounted).await;
            ears = Ears::new(manager.backend, key, &request, options, subscribed).await;
            continue;
        }
        debug!(attempt, releases, "waiting in the fair queue");
        let until = retry_at.min(give_up_at);
        if let Some(token) = listen(&mut ears, until, releases).await
            && let (Some(placed_at), Some(hold)) = (placed_at, ears.hold)
        {
            // Granted.
            let grant = Grant::handed_over(
                key.clone(),
                request.holder,
                token,
                request.ttl,
                placed_at,
                hold,
            );
            if in_time(&grant, options) {
                orphan.armed = false;
                return Ok(granted(&manager, key, grant, turn, ears.releases));
            }
            // Too late to use: the next call finds it ours and refreshes it.
            debug!("a handover came too late to use; asking for the lease");
        }
        attempt = attempt.saturating_add(1);
    }
}

/// `Granted`: the lease is ours, by a call or a handover.
fn granted<B: LeaseBackend>(
    manager: &Manager<'_, B>,
    key: &LeaseKey,
    grant: Grant,
    turn: Turn,
    watch: Option<ReleaseWatch>,
) -> Won {
    manager.queues.turns().note_won(key, grant.fencing_token);
    Won {
        grant,
        turn: Some(turn),
        watch,
        handed_over: false,
    }
}

/// When to ask again, and after how many release notices (0: only at
/// that time), for a place the server reported.
fn listen_plan(
    place: &FairPlace,
    options: &LeaseOptions,
    notices: bool,
    attempt: u32,
    now: Instant,
    refresh: Duration,
) -> (Instant, u32) {
    let mut retry_after = refresh;
    if place.ahead == 0 || !notices {
        // The head (or anyone without notices) also polls on the backoff,
        // and no later than the holder's lease runs out.
        retry_after = retry_after.min(options.backoff().delay(attempt));
    }
    if let Some(left) = place.holder.as_ref().and_then(|h| h.ttl_left)
        && place.ahead == 0
    {
        retry_after = retry_after.min(left + Duration::from_millis(1));
    }
    // Our turn comes after `ahead` releases, one more while the lease is
    // held. Releases close together may be heard as one notice, so ask
    // again halfway, which re-reads the count: a few calls per wait, and
    // every notice counts once our turn is one or two releases away.
    let held = u32::from(place.holder.is_some());
    let releases = (place.ahead.saturating_add(held) / 2).max(1);
    (now + retry_after, if notices { releases } else { 0 })
}

/// How long the server keeps a lease a release hands to a waiter, counted
/// from the waiter's latest call: long enough that, when the handover comes
/// as late as a place can live (a place ttl after that call, plus a third
/// for the renewal that follows), the lease is still valid beyond the
/// safety margin and the clock-drift allowance; never more than the ttl.
/// This is also how long a waiter that died at the head holds the queue up.
fn handover_hold(options: &LeaseOptions, place_ttl: PlaceTtl) -> Duration {
    let ttl = options.ttl().get();
    let place = place_ttl.get();
    (place + place / 3 + options.safety_margin() + clock_drift(ttl)).min(ttl)
}

async fn watch_handover<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    request: &AcquireRequest,
) -> HandoverWatch {
    // Boxed, as in waiting.rs.
    let watch: Result<HandoverWatch, BackendError> =
        Box::pin(capability::watch_handover(backend, key, &request.holder)).await;
    watch.unwrap_or_else(|error| {
        debug!(%error, "no handovers; asking for the lease");
        HandoverWatch::unsupported()
    })
}

/// `Listening`: until `until`, until `releases` notices (if any) came, or
/// until a release hands us the lease (its fencing token).
async fn listen(ears: &mut Ears, until: Instant, releases: u32) -> Option<FencingToken> {
    let poll = tokio::time::sleep_until(until);
    let handover = &mut ears.handover;
    let notices = async {
        match ears.releases.as_mut() {
            Some(watch) if releases > 0 => {
                for _ in 0..releases {
                    watch.released().await;
                }
            }
            _ => std::future::pending().await,
        }
    };
    tokio::select! {
        token = handover.handed_over() => {
            debug!("a release handed the lease over");
            return Some(token);
        }
        () = poll => {}
        () = notices => debug!("release notice; asking the fair queue"),
    }
    None
}

/// Leaves the place on the server, so the waiters behind need not wait for
/// it to expire; if that fails, it expires.
async fn leave<B: LeaseBackend>(backend: &B, key: &LeaseKey, request: &AcquireRequest) {
    if let Err(error) = Box::pin(capability::leave_fair_queue(backend, key, &request.holder)).await
    {
        debug!(%error, "could not leave the fair queue; the place expires");
    }
}

/// What a fair waiter listens with.
struct Ears {
    /// Its release watch; `None` until it subscribed.
    releases: Option<ReleaseWatch>,
    handover: HandoverWatch,
    /// How long a lease handed over is kept ([`handover_hold`]); `None`:
    /// no handover is asked for.
    hold: Option<Duration>,
}

impl Ears {
    /// Before subscribing: nothing heard, no handover asked for.
    fn deaf() -> Self {
        Self {
            releases: None,
            handover: HandoverWatch::unsupported(),
            hold: None,
        }
    }

    /// With the release watch `releases`, and a handover watch where the
    /// options and the backend allow one.
    async fn new<B: LeaseBackend>(
        backend: &B,
        key: &LeaseKey,
        request: &AcquireRequest,
        options: &LeaseOptions,
        releases: ReleaseWatch,
    ) -> Self {
        let handover = if releases.is_supported() && options.fair_handover() {
            watch_handover(backend, key, request).await
        } else {
            HandoverWatch::unsupported()
        };
        let hold = handover
            .is_supported()
            .then(|| handover_hold(options, options.place_ttl()));
        Self {
            releases: Some(releases),
            handover,
            hold,
        }
    }

    /// Whether release notices reach this waiter.
    fn notices(&self) -> bool {
        self.releases
            .as_ref()
            .is_some_and(ReleaseWatch::is_supported)
    }
}

/// A release watch of `key` (`policy`: the server's queue decides the
/// turns, so the number of processes listening is of no use here).
async fn subscribe<B: LeaseBackend>(
    backend: &B,
    key: &LeaseKey,
    policy: WatchPolicy,
) -> ReleaseWatch {
    // Boxed, as in waiting.rs.
    let watch: Result<ReleaseWatch, BackendError> =
        Box::pin(backend.watch_releases(key, policy)).await;
    watch.unwrap_or_else(|error| {
        debug!(%error, "no release notices; polling");
        ReleaseWatch::unsupported()
    })
}

fn in_time(grant: &Grant, options: &LeaseOptions) -> bool {
    Instant::now() < grant.valid_until - options.safety_margin()
}

fn not_acquired(key: &LeaseKey, started: Instant, holder: LeaseInfo) -> LeaseError {
    LeaseError::NotAcquired {
        key: key.to_string(),
        waited: started.elapsed(),
        holder,
    }
}
