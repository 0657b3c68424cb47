//! Local handover on `MemoryBackend` and tokio's paused clock: every backend
//! operation takes 10 ms, so the clock counts operations, and a counting
//! wrapper says which ones ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, HandoverBackend, HandoverOutcome, HolderId,
    LeaseBackend, LeaseInfo, LeaseKey, MemoryBackend, ReleaseOutcome, ReleaseReport, ReleaseWatch,
    RenewOutcome, RenewRequest, Ttl, WatchPolicy,
};
use leasehold_watchdog::{Backoff, Lease, LeaseManager, LeaseOptions};
use tokio::time::{Instant, sleep};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

const OP: Duration = Duration::from_millis(10);

/// Beyond a waiter's 60 s wait: only a hang reaches it.
const WAITER_LIMIT: Duration = Duration::from_secs(90);

#[derive(Default)]
struct Counts {
    acquire: AtomicUsize,
    release: AtomicUsize,
    release_to: AtomicUsize,
    handed_over: AtomicUsize,
    watch: AtomicUsize,
    /// While set, `try_acquire` does its work and never replies, as a
    /// server cut off after it ran the command.
    lose_replies: std::sync::atomic::AtomicBool,
    /// When each `try_acquire` was sent.
    attempts: std::sync::Mutex<Vec<Instant>>,
}

/// `MemoryBackend`, counting the operations it is asked for.
#[derive(Clone)]
struct Counting {
    inner: MemoryBackend,
    counts: Arc<Counts>,
    /// The subscriber count its watches report, as Redis's do; none by default.
    listeners: Option<usize>,
}

impl Counting {
    fn new() -> Self {
        let inner = MemoryBackend::new();
        inner.set_latency(OP);
        Self {
            inner,
            counts: Arc::default(),
            listeners: None,
        }
    }

    /// Watches that report `listeners` processes listening.
    fn with_listeners(listeners: usize) -> Self {
        Self {
            listeners: Some(listeners),
            ..Self::new()
        }
    }

    /// When the `try_acquire` calls since `from` were sent.
    fn attempts_since(&self, from: Instant) -> Vec<Instant> {
        let attempts = self.counts.attempts.lock().expect("not poisoned");
        attempts.iter().copied().filter(|at| *at >= from).collect()
    }

    fn acquires(&self) -> usize {
        self.counts.acquire.load(Ordering::SeqCst)
    }

    fn watches(&self) -> usize {
        self.counts.watch.load(Ordering::SeqCst)
    }
}

impl LeaseBackend for Counting {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.counts.acquire.fetch_add(1, Ordering::SeqCst);
        self.counts
            .attempts
            .lock()
            .expect("not poisoned")
            .push(Instant::now());
        let outcome = self.inner.try_acquire(request).await;
        if self.counts.lose_replies.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        outcome
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.inner.renew_many(requests).await
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        self.counts.release.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, holder).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        self.inner.inspect(key).await
    }

    async fn watch_releases(
        &self,
        key: &LeaseKey,
        policy: WatchPolicy,
    ) -> Result<ReleaseWatch, BackendError> {
        self.counts.watch.fetch_add(1, Ordering::SeqCst);
        let watch = self.inner.watch_releases(key, policy).await?;
        Ok(match self.listeners {
            Some(listeners) => watch.with_listeners(listeners),
            None => watch,
        })
    }

    fn handover(&self) -> Option<&impl HandoverBackend> {
        Some(self)
    }
}

impl HandoverBackend for Counting {
    async fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> Result<HandoverOutcome, BackendError> {
        self.counts.release_to.fetch_add(1, Ordering::SeqCst);
        let outcome = self.inner.release_to(key, holder, next).await;
        if matches!(outcome, Ok(HandoverOutcome::HandedOver(_))) {
            self.counts.handed_over.fetch_add(1, Ordering::SeqCst);
        }
        outcome
    }
}

/// Long ttl, long wait, and a fallback poll far beyond the test, so every
/// wake-up comes from a release.
fn patient() -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("60s").expect("valid ttl"))
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(Duration::from_secs(30)))
        .build()
        .expect("valid options")
}

/// Waits (on the paused clock) until `done` holds.
async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        sleep(Duration::from_millis(1)).await;
    }
    panic!("condition not reached");
}

/// A waiter task that reports when it got the lease, and the lease.
fn waiter(
    manager: &LeaseManager<Counting>,
) -> tokio::task::JoinHandle<Result<(Instant, Lease), leasehold_watchdog::LeaseError>> {
    let manager = manager.clone();
    tokio::spawn(async move {
        let lease = manager.acquire("job", &patient()).await?;
        Ok((Instant::now(), lease))
    })
}

/// Until a fresh waiter has been refused twice (before and after it
/// subscribed) and so waits on its offer: `acquires` attempts in all.
async fn until_waiting(backend: &Counting, acquires: usize) {
    until(|| backend.acquires() >= acquires).await;
    // Its second refusal comes back one operation later.
    sleep(OP + Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_release_hands_the_lease_to_the_local_waiter_in_one_operation() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    let next = waiter(&manager);
    until_waiting(&backend, 3).await;
    assert_eq!(backend.watches(), 1);

    let released_at = Instant::now();
    assert_eq!(holder.release().await?, ReleaseOutcome::Released);
    let (got_at, lease) = within(WAITER_LIMIT, "the next waiter", next).await??;
    // One operation: release and grant in one. Release, notice and a new
    // attempt would take two.
    assert_eq!(got_at - released_at, OP);
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 1);
    assert_eq!(backend.acquires(), 3, "the waiter did not ask again");
    assert!(lease.fencing_token() > leasehold_core::FencingToken(1));
    let info = backend.inspect(&LeaseKey::new("job")?).await?;
    assert_eq!(
        info.and_then(|i| i.fencing_token),
        Some(lease.fencing_token())
    );
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_waiter_in_another_manager_is_not_overtaken() -> TestResult {
    let backend = Counting::new();
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let holder = here.acquire("job", &patient()).await?;
    let mut theirs = waiter(&elsewhere);
    until_waiting(&backend, 3).await;
    let mut ours = waiter(&here);
    until_waiting(&backend, 5).await;
    assert_eq!(backend.watches(), 2);

    let released_at = Instant::now();
    holder.release().await?;
    // Not handed over: released and announced, and both waiters try.
    assert_eq!(backend.counts.release_to.load(Ordering::SeqCst), 1);
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 0);
    let (first, second) = tokio::select! {
        got = &mut theirs => (got??, ours),
        got = &mut ours => (got??, theirs),
        () = sleep(WAITER_LIMIT) => panic!("neither waiter got the lease within {WAITER_LIMIT:?}"),
    };
    assert_eq!(first.0 - released_at, 2 * OP, "release, then an attempt");
    drop(first.1);
    let _ = within(WAITER_LIMIT, "the second waiter", second).await??;
    Ok(())
}

/// With two processes listening, the one that just released holds back
/// one measured round trip (here: one operation) after its release before
/// it tries again, and the waiter elsewhere, which never held the key,
/// tries at once and gets it. Then the first process has waited longer:
/// it tries at once on the next release.
#[tokio::test(start_paused = true)]
async fn the_process_that_released_defers_to_the_one_that_waited_longer() -> TestResult {
    let backend = Counting::with_listeners(2);
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let holder = here.acquire("job", &patient()).await?;
    let theirs = waiter(&elsewhere);
    until_waiting(&backend, 3).await;
    let ours = waiter(&here);
    until_waiting(&backend, 5).await;

    let released_at = Instant::now();
    holder.release().await?;
    let announced_at = released_at + OP;
    let (their_at, their_lease) =
        within(WAITER_LIMIT, "the other manager's waiter", theirs).await??;
    assert_eq!(their_at, announced_at + OP, "an attempt at once");
    assert!(!ours.is_finished(), "the releasing manager took it back");
    // Ours was refused: it tried one operation after theirs, not with it.
    assert_eq!(
        backend.attempts_since(announced_at),
        vec![announced_at, announced_at + OP]
    );

    // Ours is listening again (after one more refused attempt: the notice
    // of the release it deferred on was still unread).
    sleep(5 * OP).await;
    let released_at = Instant::now();
    their_lease.release().await?;
    let (our_at, our_lease) =
        within(WAITER_LIMIT, "the releasing manager's waiter", ours).await??;
    // Nobody waited longer than this manager now: an attempt at once.
    assert_eq!(our_at, released_at + 2 * OP);
    assert_eq!(backend.attempts_since(released_at), vec![released_at + OP]);
    our_lease.release().await?;
    Ok(())
}

/// Four processes (managers, one worker each) take one key in a loop:
/// after each release only the process whose turn it is asks. The others
/// count the releases they hear until their turn comes, and the one that
/// released waits for the next holder's notice before it asks again. So
/// refused attempts stay well under one per acquisition (with every
/// process trying after every release they were about three), and every
/// process gets its share.
#[tokio::test(start_paused = true)]
async fn processes_taking_turns_ask_about_once_per_release() -> TestResult {
    const PROCESSES: usize = 4;
    const ACQUISITIONS: usize = 200;
    let backend = Counting::with_listeners(PROCESSES);
    let done = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..PROCESSES {
        let manager = LeaseManager::new(backend.clone())?;
        let done = Arc::clone(&done);
        workers.push(tokio::spawn(async move {
            let mut mine = 0usize;
            while done.load(Ordering::SeqCst) < ACQUISITIONS {
                let lease = manager.acquire("job", &patient()).await?;
                done.fetch_add(1, Ordering::SeqCst);
                mine += 1;
                sleep(OP / 2).await;
                lease.release().await?;
            }
            Ok::<_, leasehold_watchdog::LeaseError>(mine)
        }));
    }
    let mut counts = Vec::new();
    for worker in workers {
        counts.push(within(WAITER_LIMIT, "a worker", worker).await??);
    }
    let acquisitions: usize = counts.iter().sum();
    let refused = backend.acquires() - acquisitions;
    println!("{acquisitions} acquisitions {counts:?}, {refused} refused attempts");
    assert!(
        refused * 2 <= acquisitions,
        "{refused} refused attempts for {acquisitions} acquisitions"
    );
    assert!(
        counts.iter().all(|&n| n * PROCESSES * 2 >= acquisitions),
        "a process was passed over: {counts:?}"
    );
    // One subscription per wait at most, and no local handover (one
    // worker per process).
    assert!(backend.watches() <= acquisitions + PROCESSES);
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 0);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_release_heard_elsewhere_is_not_taken_straight_back() -> TestResult {
    let backend = Counting::new();
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let holder = here.acquire("job", &patient()).await?;
    let theirs = waiter(&elsewhere);
    until_waiting(&backend, 3).await;

    // A worker that releases and asks again at once, as a loop would.
    let ours = tokio::spawn(async move {
        holder.release().await?;
        let lease = here.acquire("job", &patient()).await?;
        Ok::<_, leasehold_watchdog::LeaseError>((Instant::now(), lease))
    });
    let (their_at, their_lease) =
        within(WAITER_LIMIT, "the other manager's waiter", theirs).await??;
    assert!(
        !ours.is_finished(),
        "the releasing manager took the lease back first"
    );
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 0);
    let their_token = their_lease.fencing_token();
    their_lease.release().await?;
    let (our_at, our_lease) =
        within(WAITER_LIMIT, "the releasing manager's waiter", ours).await??;
    assert!(our_at > their_at);
    assert!(our_lease.fencing_token() > their_token);
    our_lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_release_heard_by_no_one_else_is_taken_straight_back() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    holder.release().await?;
    let asked_at = Instant::now();
    let lease = manager.acquire("job", &patient()).await?;
    // One attempt, at once: nobody listened, so there is no one to wait for.
    assert_eq!(Instant::now() - asked_at, OP);
    assert_eq!(backend.acquires(), 2);
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gone_during_the_handover_leaves_no_lease_behind() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    let next = waiter(&manager);
    until_waiting(&backend, 3).await;

    let release = tokio::spawn(holder.release());
    // Halfway through the handover, the waiter leaves.
    sleep(OP / 2).await;
    next.abort();
    assert!(
        within(WAITER_LIMIT, "the aborted waiter", next)
            .await
            .is_err_and(|e| e.is_cancelled())
    );
    assert_eq!(
        within(WAITER_LIMIT, "the release", release).await??,
        ReleaseOutcome::Released
    );
    until(|| backend.counts.release.load(Ordering::SeqCst) >= 1).await;
    sleep(OP + Duration::from_millis(1)).await;
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 1);
    assert_eq!(backend.inspect(&LeaseKey::new("job")?).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn after_a_handover_the_next_head_waits_without_asking_the_backend() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    let first = waiter(&manager);
    until_waiting(&backend, 3).await;
    let second = waiter(&manager);
    // The second waits behind the first in the local queue, asking nothing.
    sleep(10 * OP).await;
    assert_eq!(backend.acquires(), 3);

    holder.release().await?;
    let (_, first_lease) = within(WAITER_LIMIT, "the first waiter", first).await??;
    // The second is the head now, holding the first's watch: it offers
    // without an attempt or a subscription of its own.
    sleep(10 * OP).await;
    assert_eq!(backend.acquires(), 3);
    assert_eq!(backend.watches(), 1);

    let released_at = Instant::now();
    first_lease.release().await?;
    let (got_at, lease) = within(WAITER_LIMIT, "the second waiter", second).await??;
    assert_eq!(got_at - released_at, OP);
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 2);
    assert_eq!(backend.acquires(), 3);
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn after_an_acquisition_of_its_own_the_next_head_offers_without_asking() -> TestResult {
    let backend = Counting::new();
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let holder = elsewhere.acquire("job", &patient()).await?;
    let first = waiter(&here);
    until_waiting(&backend, 3).await;
    let second = waiter(&here);
    sleep(10 * OP).await;

    // Released elsewhere: announced, and the first waiter takes the lease
    // with an attempt of its own.
    holder.release().await?;
    until(|| backend.acquires() >= 4).await;
    let (_, first_lease) = within(WAITER_LIMIT, "the first waiter", first).await??;
    // The second is the head now. The lease is held in its manager, so it
    // offers at once and subscribes anew (moving this process to the end
    // of the subscriber order), without an attempt.
    sleep(10 * OP).await;
    assert_eq!(backend.acquires(), 4, "the next head asked the backend");
    assert_eq!(backend.watches(), 2);

    let released_at = Instant::now();
    first_lease.release().await?;
    let (got_at, lease) = within(WAITER_LIMIT, "the second waiter", second).await??;
    assert_eq!(got_at - released_at, OP);
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 1);
    assert_eq!(backend.acquires(), 4);
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_handover_after_an_attempt_of_unknown_outcome_is_kept() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    let next = waiter(&manager);
    // The waiter's second attempt (after it subscribed) fails on the way:
    // its outcome is unknown, which arms the release of an orphan.
    // (The holder's acquisition is the first, the waiter's first refusal the second.)
    until(|| backend.acquires() >= 3).await;
    backend.inner.fail_next(1);
    sleep(2 * OP).await;
    assert_eq!(backend.acquires(), 3);

    holder.release().await?;
    let (_, lease) = within(WAITER_LIMIT, "the next waiter", next).await??;
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 1);
    // Nothing releases the handed-over lease behind its holder's back.
    sleep(10 * OP).await;
    assert_eq!(backend.counts.release.load(Ordering::SeqCst), 0);
    let info = backend.inspect(&LeaseKey::new("job")?).await?;
    assert_eq!(
        info.and_then(|i| i.fencing_token),
        Some(lease.fencing_token())
    );
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    Ok(())
}

/// An acquisition dropped while its first attempt is out (made before
/// queueing, as the key is quiet), after the server granted it the lease,
/// leaves no lease behind: the watchdog releases it.
#[tokio::test(start_paused = true)]
async fn a_dropped_first_attempt_that_took_the_lease_leaves_none_behind() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let key = LeaseKey::new("job")?;
    backend.counts.lose_replies.store(true, Ordering::SeqCst);
    let dropped = tokio::time::timeout(10 * OP, manager.acquire("job", &patient())).await;
    assert!(dropped.is_err(), "the reply was lost: {dropped:?}");
    backend.counts.lose_replies.store(false, Ordering::SeqCst);
    assert_eq!(backend.acquires(), 1);
    // Taken on the server, by the holder that went away.
    assert!(backend.inspect(&key).await?.is_some());
    within(Duration::from_secs(1), "the orphan's release", async {
        while backend.inspect(&key).await?.is_some() {
            sleep(OP).await;
        }
        Ok::<_, BackendError>(())
    })
    .await?;
    assert_eq!(backend.counts.release.load(Ordering::SeqCst), 1);
    Ok(())
}

/// A burst of acquisitions of one held key sends one attempt before
/// queueing, not one each: the first newcomer tries, the others queue,
/// and the head of the queue asks as a head does (before and after it
/// subscribes).
#[tokio::test(start_paused = true)]
async fn a_burst_of_newcomers_sends_one_first_attempt() -> TestResult {
    let backend = Counting::new();
    let here = LeaseManager::new(backend.clone())?;
    let elsewhere = LeaseManager::new(backend.clone())?;
    let holder = elsewhere.acquire("job", &patient()).await?;
    assert_eq!(backend.acquires(), 1);
    let burst: Vec<_> = (0..5)
        .map(|_| {
            let here = here.clone();
            tokio::spawn(async move { here.acquire("job", &patient()).await?.release().await })
        })
        .collect();
    // Long enough for every attempt the burst makes before it listens.
    sleep(10 * OP).await;
    // The holder's, the first newcomer's, and the head's two.
    assert_eq!(backend.acquires(), 4);
    holder.release().await?;
    for task in burst {
        within(WAITER_LIMIT, "a waiter of the burst", task).await??;
    }
    Ok(())
}

/// A waiter that polls (release notices off) takes no part in the local
/// handover, even when it comes to the head of the queue behind a waiter
/// that was handed the lease (and left a baton for the next head): each
/// release here frees the lease, and the polling waiter gets it by its
/// own next attempt, at its poll interval.
#[tokio::test(start_paused = true)]
async fn a_polling_waiter_is_not_handed_the_lease() -> TestResult {
    let backend = Counting::new();
    let manager = LeaseManager::new(backend.clone())?;
    let holder = manager.acquire("job", &patient()).await?;
    let first = waiter(&manager);
    until_waiting(&backend, 3).await;
    let polling = LeaseOptions::builder()
        .ttl(Ttl::parse("60s")?)
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(Duration::from_secs(30)))
        .release_notices(false)
        .build()?;
    let second = {
        let manager = manager.clone();
        tokio::spawn(async move {
            let lease = manager.acquire("job", &polling).await?;
            Ok::<_, leasehold_watchdog::LeaseError>((Instant::now(), lease))
        })
    };
    sleep(10 * OP).await;
    // The first waiter, which listens, is handed the lease.
    assert_eq!(holder.release().await?, ReleaseOutcome::Released);
    let (_, lease) = within(WAITER_LIMIT, "the first waiter", first).await??;
    assert_eq!(backend.counts.handed_over.load(Ordering::SeqCst), 1);
    sleep(10 * OP).await;
    let released_at = Instant::now();
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    let (got_at, lease) = within(WAITER_LIMIT, "the polling waiter", second).await??;
    assert_eq!(
        backend.counts.handed_over.load(Ordering::SeqCst),
        1,
        "the polling waiter was handed the lease"
    );
    assert!(
        got_at - released_at > 10 * OP,
        "got it {:?} after the release, before its next poll",
        got_at - released_at
    );
    lease.release().await?;
    Ok(())
}
