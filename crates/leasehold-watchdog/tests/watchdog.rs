//! Timing of the watchdog on `MemoryBackend` and tokio's paused clock.

use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend, ReleaseOutcome, Ttl, clock_drift};
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, advance, sleep, sleep_until};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

const MS: Duration = Duration::from_millis(1);

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::with_ttl(Ttl::parse(ttl).expect("valid ttl"))
}

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).expect("valid key")
}

/// Lets the watchdog task process what it was sent, without moving the clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn renews_at_a_third_of_the_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let lease = manager.acquire("job", &options("3s")).await?;
    assert_eq!(lease.renewals(), 0);
    for n in 1..=6u32 {
        let due = start + Duration::from_secs(u64::from(n));
        sleep_until(due - MS).await;
        assert_eq!(lease.renewals(), n - 1, "renewal {n} came early");
        sleep_until(due + MS).await;
        assert_eq!(lease.renewals(), n, "renewal {n} did not come at {n}s");
        // valid_until counts from when the renewal was sent.
        assert_eq!(
            lease.valid_until(),
            due + Duration::from_secs(3) - clock_drift(Duration::from_secs(3))
        );
    }
    // The lease outlived its ttl twice over by renewals alone.
    assert!(backend.inspect(&key("job")).await?.is_some());
    assert!(!lease.token().is_cancelled());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn renewal_cap_fires_before_the_last_validity_ends() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .max_renewals(2)
        .build()?;
    let start = Instant::now();
    let lease = manager.acquire("capped", &options).await?;
    assert_eq!(
        within(Duration::from_secs(10), "the capped token", lease.lost()).await,
        LossReason::RenewalLimit
    );
    let fired = Instant::now();
    assert_eq!(lease.renewals(), 2);
    // The second renewal was sent at 2 s; the token fires a safety margin
    // before that renewal's validity ends, while the server still has it.
    assert_eq!(
        lease.valid_until(),
        start + Duration::from_secs(5) - clock_drift(Duration::from_secs(3))
    );
    assert_eq!(fired, lease.valid_until() - options.safety_margin());
    assert!(backend.inspect(&key("capped")).await?.is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn hanging_backend_fires_the_deadline_before_validity_ends() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = options("3s");
    let lease = manager.acquire("hang", &options).await?;
    let valid_until = lease.valid_until();
    backend.hang();
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Deadline
    );
    let fired = Instant::now();
    assert!(
        fired < valid_until,
        "token fired {:?} after validity",
        fired - valid_until
    );
    assert_eq!(fired, valid_until - options.safety_margin());
    assert_eq!(lease.renewals(), 0);
    // A renewal that finally answers after the deadline does not revive it.
    backend.resume();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn lease_taken_over_is_lost_at_once() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let lease = manager.acquire("stolen", &options("3s")).await?;
    sleep(Duration::from_millis(100)).await;
    let other = backend.hand_over(&key("stolen"), Ttl::parse("3s")?)?;
    assert!(other.fencing_token > lease.fencing_token());
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Lost
    );
    // The backend reported the change: the holder renewed at once rather
    // than at its next renewal (due at 1 s).
    assert_eq!(Instant::now(), start + Duration::from_millis(100));
    // Releasing a lost lease leaves the new holder alone.
    assert_eq!(lease.release().await?, ReleaseOutcome::NotHeld);
    assert!(backend.inspect(&key("stolen")).await?.is_some());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn vanished_lease_is_lost_at_the_next_renewal() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("vanish", &options("600ms")).await?;
    assert!(backend.vanish(&key("vanish")));
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Lost
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_woken_past_the_deadline_cancels_without_renewing() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("late", &options("3s")).await?;
    // The clock jumps in one step, as it does for a process that was not
    // scheduled: the renewal at 1 s and the deadline at 2.67 s are both past.
    advance(Duration::from_millis(2900)).await;
    settle().await;
    assert_eq!(lease.loss_reason(), Some(LossReason::Deadline));
    assert_eq!(lease.renewals(), 0);
    // No renewal reached the server: it still expires 3 s after acquisition.
    let left = backend
        .inspect(&key("late"))
        .await?
        .and_then(|i| i.ttl_left);
    assert_eq!(left, Some(Duration::from_millis(100)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn release_and_drop_free_the_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("a", &options("3s")).await?;
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    assert_eq!(backend.inspect(&key("a")).await?, None);

    let lease = manager.acquire("b", &options("3s")).await?;
    drop(lease);
    settle().await;
    assert_eq!(backend.inspect(&key("b")).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_release_dropped_in_flight_still_frees_the_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("dropped-release", &options("30s")).await?;
    backend.hang();
    let release = tokio::time::timeout(Duration::from_secs(1), lease.release()).await;
    assert!(release.is_err(), "the hung release must time out");
    // The release was abandoned before the server answered; the watchdog
    // releases in the background once it answers again, long before the
    // lease's 30 s would run out.
    backend.resume();
    settle().await;
    assert_eq!(backend.inspect(&key("dropped-release")).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_renewed_no_more() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("released", &options("3s")).await?;
    let token = lease.token();
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    // Someone else takes the key; the watchdog, had it kept the lease,
    // would renew it at 1 s, find it taken and count a loss.
    let other = manager.acquire("released", &options("3s")).await?;
    sleep(Duration::from_millis(3500)).await;
    assert!(!token.is_cancelled(), "a released lease is not lost");
    assert_eq!(other.renewals(), 3);
    assert!(other.loss_reason().is_none());
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn waiting_acquire_gets_the_lease_when_it_is_freed() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let other = LeaseManager::new(backend.clone())?;
    let first = manager.acquire("w", &options("3s")).await?;

    // Without a wait: one attempt, refused at once with who holds it.
    let start = Instant::now();
    match other.acquire("w", &options("3s")).await {
        Err(LeaseError::NotAcquired { holder, .. }) => {
            assert_eq!(holder.fencing_token, Some(first.fencing_token()));
        }
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    // In the holder's own manager the local queue answers without asking.
    assert!(matches!(
        manager.acquire("w", &options("3s")).await,
        Err(LeaseError::NotAcquired { .. })
    ));
    assert_eq!(Instant::now(), start);

    // With a wait shorter than the holder keeps it: refused when it runs out.
    let short = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(2))
        .build()?;
    let err = other.acquire("w", &short).await.err();
    assert!(
        matches!(err, Some(LeaseError::NotAcquired { .. })),
        "{err:?}"
    );
    assert_eq!(Instant::now(), start + Duration::from_secs(2));

    // With a longer wait, in another manager and in the holder's: the other
    // manager wakes on the release notice, at the very moment of release.
    let long = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(60))
        .backoff(leasehold_watchdog::Backoff::fixed(Duration::from_secs(30)))
        .build()?;
    let waiter = tokio::spawn({
        let other = other.clone();
        let long = long.clone();
        async move { other.acquire("w", &long).await.map(|l| (Instant::now(), l)) }
    });
    sleep(Duration::from_secs(1)).await;
    let released_at = Instant::now();
    let first_token = first.fencing_token();
    first.release().await?;
    let (acquired_at, second) = within(
        Duration::from_secs(90),
        "the other manager's waiter",
        waiter,
    )
    .await??;
    assert_eq!(
        acquired_at, released_at,
        "the waiter polled instead of waking on the notice"
    );
    assert!(second.fencing_token() > first_token);

    let local = tokio::spawn({
        let manager = manager.clone();
        async move {
            manager
                .acquire("w", &long)
                .await
                .map(|l| (Instant::now(), l))
        }
    });
    sleep(Duration::from_secs(1)).await;
    let released_at = Instant::now();
    second.release().await?;
    let (acquired_at, _third) = within(
        Duration::from_secs(90),
        "the holder's manager's waiter",
        local,
    )
    .await??;
    assert_eq!(acquired_at, released_at);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn without_notices_a_waiter_polls_on_its_backoff() -> TestResult {
    let backend = MemoryBackend::new();
    let holder = LeaseManager::new(backend.clone())?;
    let waiter = LeaseManager::new(backend.clone())?;
    let first = holder.acquire("p", &options("3s")).await?;
    let polling = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(60))
        .backoff(leasehold_watchdog::Backoff::fixed(Duration::from_millis(
            400,
        )))
        .release_notices(false)
        .build()?;
    let start = Instant::now();
    let task = tokio::spawn(async move {
        waiter
            .acquire("p", &polling)
            .await
            .map(|l| (Instant::now(), l))
    });
    sleep(Duration::from_millis(1000)).await;
    first.release().await?;
    let (acquired_at, _lease) =
        within(Duration::from_secs(90), "the polling waiter", task).await??;
    // Polls at 0, 400, 800, 1200 ms: the release at 1000 ms is seen at 1200.
    assert_eq!(acquired_at - start, Duration::from_millis(1200));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_order_bounded_and_may_leave() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::builder(backend.clone())
        .max_waiters(3)
        .start()?;
    let wait = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(600))
        .build()?;
    let head = manager.acquire("fifo", &wait).await?;
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (manager, wait, order) = (manager.clone(), wait.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let lease = manager.acquire("fifo", &wait).await?;
            order.lock().map_err(|_| "poisoned")?.push(i);
            sleep(Duration::from_millis(10)).await;
            lease.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
        settle().await;
    }
    // The queue holds three waiters: a fourth is refused at once.
    assert!(matches!(
        manager.acquire("fifo", &wait).await,
        Err(LeaseError::Busy { waiters: 3, .. })
    ));
    // A waiter that gives up leaves the queue: the one in the middle.
    waiters.remove(1).abort();
    settle().await;
    let fourth = tokio::spawn({
        let (manager, wait, order) = (manager.clone(), wait.clone(), order.clone());
        async move {
            let lease = manager.acquire("fifo", &wait).await?;
            order.lock().map_err(|_| "poisoned")?.push(3);
            lease.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
    });
    settle().await;
    head.release().await?;
    // Each waits up to 600 s; beyond that, only a hang is left.
    let limit = Duration::from_secs(700);
    for w in waiters {
        within(limit, "a queued waiter", w)
            .await?
            .map_err(|e| e.to_string())?;
    }
    within(limit, "the fourth waiter", fourth)
        .await?
        .map_err(|e| e.to_string())?;
    assert_eq!(*order.lock().map_err(|_| "poisoned")?, vec![0, 2, 3]);
    Ok(())
}

/// A newcomer that finds a waiter of its manager queued for the key
/// queues behind it: only an acquisition for a key no one here waits for
/// asks the backend before queueing, so a newcomer cannot take a freed
/// key from under a queued waiter. The waiter polls (no notices, so no
/// offer to hand the lease to), which leaves the key free from the
/// release to its next poll, when a newcomer that asked first would get it.
#[tokio::test(start_paused = true)]
async fn a_newcomer_does_not_overtake_a_queued_local_waiter() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let polling = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .wait(Duration::from_secs(60))
        .backoff(leasehold_watchdog::Backoff::fixed(Duration::from_millis(
            400,
        )))
        .release_notices(false)
        .build()?;
    let holder = manager.acquire("queued", &polling).await?;
    let start = Instant::now();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let take = |who: &'static str| {
        let (manager, polling, order) = (manager.clone(), polling.clone(), order.clone());
        tokio::spawn(async move {
            let lease = manager.acquire("queued", &polling).await?;
            order
                .lock()
                .map_err(|_| "poisoned")?
                .push((who, Instant::now() - start));
            sleep(Duration::from_millis(50)).await;
            lease.release().await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        })
    };
    let waiter = take("waiter");
    settle().await;
    sleep(Duration::from_millis(100)).await;
    holder.release().await?;
    // The key is free now, and the waiter polls next at 400 ms.
    let newcomer = take("newcomer");
    let limit = Duration::from_secs(90);
    within(limit, "the waiter", waiter)
        .await?
        .map_err(|e| e.to_string())?;
    within(limit, "the newcomer", newcomer)
        .await?
        .map_err(|e| e.to_string())?;
    let order = order.lock().map_err(|_| "poisoned")?.clone();
    let ms = Duration::from_millis;
    // The waiter at its poll; the newcomer, head from then on, refused
    // while the waiter holds (400 ms), gets it at its own poll after.
    assert_eq!(order, vec![("waiter", ms(400)), ("newcomer", ms(800))]);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_crashed_blocks_others_for_at_most_its_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    // A holder that acquired and then crashed: nothing renews or releases.
    let ttl = Ttl::parse("3s")?;
    let request = leasehold_core::AcquireRequest::new(
        key("crash"),
        leasehold_core::HolderId::generate()?,
        ttl,
    );
    let crashed_at = Instant::now();
    assert!(matches!(
        backend.try_acquire(&request).await?,
        leasehold_core::AcquireOutcome::Acquired(_)
    ));
    let manager = LeaseManager::new(backend.clone())?;
    let wait = LeaseOptions::builder()
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .build()?;
    let lease = manager.acquire("crash", &wait).await?;
    // Acquired as soon as the ttl ran out: the retry sleeps until the expiry.
    let blocked = Instant::now() - crashed_at;
    assert!(
        blocked >= ttl.get() && blocked <= ttl.get() + 2 * MS,
        "{blocked:?}"
    );
    drop(lease);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_and_releases_every_lease() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let a = manager.acquire("s1", &options("3s")).await?;
    let b = manager.acquire("s2", &options("3s")).await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    assert_eq!(a.loss_reason(), Some(LossReason::Shutdown));
    assert_eq!(b.loss_reason(), Some(LossReason::Shutdown));
    assert!(a.token().is_cancelled() && b.token().is_cancelled());
    assert_eq!(backend.inspect(&key("s1")).await?, None);
    assert_eq!(backend.inspect(&key("s2")).await?, None);
    assert!(matches!(
        manager.acquire("s3", &options("3s")).await,
        Err(LeaseError::ManagerStopped)
    ));
    assert!(matches!(a.release().await, Err(LeaseError::ManagerStopped)));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_acquisition_is_released_in_the_background() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    backend.hang();
    let attempt = tokio::time::timeout(
        Duration::from_secs(1),
        manager.acquire("orphan", &options("30s")),
    )
    .await;
    assert!(attempt.is_err(), "the hung acquisition must time out");
    // The acquisition was queued on the server and runs when it answers
    // again; the orphan release queued after it frees the key.
    backend.resume();
    settle().await;
    assert_eq!(backend.inspect(&key("orphan")).await?, None);
    Ok(())
}

#[test]
fn a_manager_needs_a_runtime() {
    assert!(matches!(
        LeaseManager::new(MemoryBackend::new()),
        Err(LeaseError::NoRuntime)
    ));
}
