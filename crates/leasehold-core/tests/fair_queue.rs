//! `MemoryBackend`'s fair queue on tokio's paused clock: the lease goes to
//! the waiters in arrival order, a place lives its place ttl unless its
//! waiter comes back, a waiter can leave its place, and a holder asking
//! again (a lost reply) keeps its lease.

use std::time::Duration;

use leasehold_core::{
    AcquireRequest, FairBackend, FairOutcome, FairPlace, Grant, HolderId, LeaseBackend, LeaseKey,
    MemoryBackend, PlaceTtl, Ttl,
};
use tokio::time::advance;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn holder() -> HolderId {
    HolderId::generate().expect("the OS has entropy")
}

fn job() -> LeaseKey {
    LeaseKey::new("job").expect("a valid key")
}

async fn fair(
    backend: &MemoryBackend,
    who: HolderId,
    ttl: &str,
    place: u64,
) -> Result<FairOutcome, Box<dyn std::error::Error>> {
    let request = AcquireRequest::new(job(), who, Ttl::parse(ttl)?);
    Ok(backend
        .try_acquire_fair(&request, PlaceTtl::new(ms(place))?, None)
        .await?)
}

fn acquired(outcome: FairOutcome) -> Result<(Grant, u32), Box<dyn std::error::Error>> {
    match outcome {
        FairOutcome::Acquired { grant, queued } => Ok((grant, queued)),
        other => Err(format!("not acquired: {other:?}").into()),
    }
}

fn waiting(outcome: FairOutcome) -> Result<FairPlace, Box<dyn std::error::Error>> {
    match outcome {
        FairOutcome::Waiting(place) => Ok(place),
        other => Err(format!("not waiting: {other:?}").into()),
    }
}

#[tokio::test(start_paused = true)]
async fn the_lease_goes_to_the_waiters_in_arrival_order() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b, c) = (holder(), holder(), holder());
    let (first, queued) = acquired(fair(&backend, a, "10s", 2_000).await?)?;
    assert_eq!(queued, 0);
    let place = waiting(fair(&backend, b, "10s", 2_000).await?)?;
    assert_eq!((place.ahead, place.queued), (0, 1));
    assert!(place.holder.is_some(), "held by a");
    let place = waiting(fair(&backend, c, "10s", 2_000).await?)?;
    assert_eq!((place.ahead, place.queued), (1, 2));

    backend.release(&first.key, &a).await?;
    // Free, but b is ahead of c.
    let place = waiting(fair(&backend, c, "10s", 2_000).await?)?;
    assert_eq!((place.ahead, place.holder), (1, None));
    let (_, queued) = acquired(fair(&backend, b, "10s", 2_000).await?)?;
    assert_eq!(queued, 1, "c's place is left");
    Ok(())
}

/// A waiter that does not come back within its place ttl loses its place;
/// one that does keeps it.
#[tokio::test(start_paused = true)]
async fn a_place_lives_its_place_ttl_unless_its_waiter_comes_back() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b, c) = (holder(), holder(), holder());
    let (first, _) = acquired(fair(&backend, a, "10s", 1_000).await?)?;
    waiting(fair(&backend, b, "10s", 1_000).await?)?;
    waiting(fair(&backend, c, "10s", 1_000).await?)?;
    advance(ms(999)).await;
    // c comes back just in time; b does not.
    assert_eq!(waiting(fair(&backend, c, "10s", 1_000).await?)?.ahead, 1);
    advance(ms(1)).await;
    backend.release(&first.key, &a).await?;
    acquired(fair(&backend, c, "10s", 1_000).await?)?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_leaves_its_place_holds_no_one_up() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b, c) = (holder(), holder(), holder());
    let (first, _) = acquired(fair(&backend, a, "10s", 2_000).await?)?;
    waiting(fair(&backend, b, "10s", 2_000).await?)?;
    waiting(fair(&backend, c, "10s", 2_000).await?)?;
    backend.leave_fair_queue(&job(), &b).await?;
    backend.release(&first.key, &a).await?;
    let (_, queued) = acquired(fair(&backend, c, "10s", 2_000).await?)?;
    assert_eq!(queued, 0);
    Ok(())
}

/// A holder whose reply was lost asks again: it keeps its lease and token,
/// refreshed to a full ttl from the new request, and leaves its place.
#[tokio::test(start_paused = true)]
async fn a_holder_asking_again_keeps_its_lease_refreshed() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b) = (holder(), holder());
    let (first, _) = acquired(fair(&backend, a, "3s", 2_000).await?)?;
    waiting(fair(&backend, b, "3s", 2_000).await?)?;
    advance(ms(2_000)).await;
    let (again, queued) = acquired(fair(&backend, a, "3s", 2_000).await?)?;
    assert_eq!(again.fencing_token, first.fencing_token);
    assert_eq!(queued, 1, "b still waits");
    let info = backend.inspect(&job()).await?.ok_or("the lease is gone")?;
    assert_eq!(info.ttl_left, Some(ms(3_000)));
    Ok(())
}
