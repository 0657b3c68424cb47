//! Fair mode's waiting: the head of a key's local queue keeps a place in
//! the server's queue until the server grants it the lease.
//!
//! ```text
//!  Queued (waiting.rs) ──► Placing ──Acquired──────────────────► Granted
//!                            │ Waiting (place kept), or a transient error
//!                            ▼
//!                          Listening   (refused when the wait is over:
//!                            │          leave the place, GaveUp)
//!                            │ the releases it waits for were announced,
//!                            │ the place is due for a refresh, or the
//!                            │ wait ran out (a last call)
//!                            └──────────────────────► Placing
//! ```
//!
//! `Placing` is one [`try_acquire_fair`](LeaseBackend::try_acquire_fair)
//! call: it takes a place at the tail of the server's queue (or refreshes
//! ours) and grants the lease only when it is free and ours is first. The
//! server's order decides, so none of the default mode's ways to take
//! turns (yielding, deferring, the local handover) take part.
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

use std::time::Duration;

use leasehold_core::{
    AcquireRequest, BackendError, FairOutcome, FairPlace, Grant, LeaseBackend, LeaseInfo, LeaseKey,
    ReleaseWatch,
};
use tokio::time::Instant;
use tracing::debug;

use crate::home::OrphanGuard;
use crate::queue::Turn;
use crate::waiting::{Manager, Won};
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
    let place_ttl = options.fair().unwrap_or_default();
    let mut orphan = OrphanGuard {
        commands: manager.commands,
        key,
        holder: request.holder,
        armed: false,
        permits: None,
        share: None,
    };
    // Subscribed before the first call, so that no release after it goes
    // unheard.
    let mut watch = if options.release_notices() {
        Some(subscribe(manager.backend, key).await)
    } else {
        None
    };
    let notices = watch.as_ref().is_some_and(ReleaseWatch::is_supported);
    let refresh = place_ttl.get() / 3;
    let mut attempt = 0u32;
    loop {
        // Placing.
        orphan.armed = true;
        let outcome = Box::pin(manager.backend.try_acquire_fair(&request, place_ttl)).await;
        let now = Instant::now();
        let (failure, retry_at, releases) = match outcome {
            Ok(FairOutcome::Acquired { grant, queued }) => {
                orphan.armed = false;
                crate::metrics::fair_queued(options.shared_name(), queued);
                if in_time(&grant, options) {
                    manager.queues.note_won(key, grant.fencing_token);
                    return Ok(Won {
                        grant,
                        turn,
                        watch,
                        handed_over: false,
                    });
                }
                // Too late to use: the next call (same holder) refreshes it;
                // given up on, the guard releases it.
                orphan.armed = true;
                (not_acquired(key, started, LeaseInfo::default()), now, 0)
            }
            Ok(FairOutcome::Waiting(place)) => {
                orphan.armed = false;
                crate::metrics::fair_queued(options.shared_name(), place.queued);
                let (retry_at, releases) =
                    listen_plan(&place, options, notices, attempt, now, refresh);
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
        debug!(attempt, releases, "waiting in the fair queue");
        listen(watch.as_mut(), retry_at.min(give_up_at), releases).await;
        attempt = attempt.saturating_add(1);
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

/// `Listening`: until `until`, or until `releases` notices (if any) came.
async fn listen(watch: Option<&mut ReleaseWatch>, until: Instant, releases: u32) {
    let poll = tokio::time::sleep_until(until);
    let notices = async {
        match watch {
            Some(watch) if releases > 0 => {
                for _ in 0..releases {
                    watch.released().await;
                }
            }
            _ => std::future::pending().await,
        }
    };
    tokio::select! {
        () = poll => {}
        () = notices => debug!("release notice; asking the fair queue"),
    }
}

/// Leaves the place on the server, so the waiters behind need not wait for
/// it to expire; if that fails, it expires.
async fn leave<B: LeaseBackend>(backend: &B, key: &LeaseKey, request: &AcquireRequest) {
    if let Err(error) = Box::pin(backend.leave_fair_queue(key, &request.holder)).await {
        debug!(%error, "could not leave the fair queue; the place expires");
    }
}

async fn subscribe<B: LeaseBackend>(backend: &B, key: &LeaseKey) -> ReleaseWatch {
    // Boxed, as in waiting.rs.
    let watch: Result<ReleaseWatch, BackendError> = Box::pin(backend.watch_releases(key)).await;
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
