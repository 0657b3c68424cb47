//! The instant a holder's deadline fires after each kind of renewal or
//! grant the Redis backend brings about, on the paused clock: a renewal
//! a change report asked for (client tracking), the renewal of every
//! lease after a reconnection, a lease renewed early in another's batch,
//! and a grant handed over by a local release. Each reply here arrives
//! 100 ms after the backend ran the request, as over a network: the
//! deadline must count from when the request was sent (ttl − drift −
//! margin after it), never from when its reply came, and no renewal may
//! be left out of it.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, HandoverBackend,
    HandoverOutcome, HolderId, LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, MemoryBackend,
    ReleaseReport, ReleaseWatch, RenewOutcome, RenewRequest, Ttl, WatchPolicy,
};
use leasehold_watchdog::{Lease, LeaseManager, LeaseOptions, LossReason};
use tokio::sync::{Mutex, mpsc};
use tokio::time::{Instant, sleep, sleep_until, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// How long each renewal's and handover's reply takes to arrive.
const REPLY: Duration = Duration::from_millis(100);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// ttl 3 s (renew interval 1 s), safety margin 300 ms.
fn options() -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("3s").expect("valid ttl"))
        .safety_margin(ms(300))
        .build()
        .expect("valid options")
}

/// A `MemoryBackend` whose renewal and handover replies arrive [`REPLY`]
/// after it ran them, and whose change reports the test sends.
#[derive(Clone)]
struct Delayed {
    inner: MemoryBackend,
    reports: std::sync::Arc<Mutex<Option<mpsc::UnboundedReceiver<LeaseChange>>>>,
}

impl Delayed {
    fn new(inner: MemoryBackend) -> (Self, mpsc::UnboundedSender<LeaseChange>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let backend = Self {
            inner,
            reports: std::sync::Arc::new(Mutex::new(Some(rx))),
        };
        (backend, tx)
    }
}

impl LeaseBackend for Delayed {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let outcomes = self.inner.renew_many(requests).await;
        sleep(REPLY).await;
        outcomes
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
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
        self.inner.watch_releases(key, policy).await
    }

    fn changes(&self) -> Option<&impl ChangeBackend> {
        Some(self)
    }

    fn handover(&self) -> Option<&impl HandoverBackend> {
        Some(self)
    }
}

impl ChangeBackend for Delayed {
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        // The test's reports go to the first watch; any later one hears
        // nothing (the watchdog keeps one).
        match self.reports.lock().await.take() {
            Some(reports) => Ok(ChangeWatch::new(reports)),
            None => Ok(ChangeWatch::new(mpsc::unbounded_channel().1)),
        }
    }
}

impl HandoverBackend for Delayed {
    async fn release_to(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> Result<HandoverOutcome, BackendError> {
        let outcome = self.inner.release_to(key, holder, next).await;
        sleep(REPLY).await;
        outcome
    }
}

/// Waits (on the paused clock) for `lease`'s token and asserts it fired
/// for the deadline at exactly `at`.
async fn fires_at(lease: &Lease, at: Instant) -> TestResult {
    let reason = timeout(Duration::from_secs(30), lease.lost())
        .await
        .map_err(|_| format!("{}: no token within 30 s", lease.key()))?;
    assert_eq!(reason, LossReason::Deadline, "{}", lease.key());
    let now = Instant::now();
    assert!(
        now == at,
        "{}: fired {:?} {} the deadline counted from the request's sending",
        lease.key(),
        if now > at { now - at } else { at - now },
        if now > at { "after" } else { "before" },
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_renewal_a_change_asked_for_counts_from_when_it_was_sent() -> TestResult {
    let memory = MemoryBackend::new();
    let (backend, reports) = Delayed::new(memory.clone());
    let manager = LeaseManager::new(backend)?;
    let start = Instant::now();
    let lease = manager.acquire("tracked", &options()).await?;
    // The server reports a change of the lease at 400 ms, off the renewal
    // schedule (due at 1 s): the watchdog renews it at once, and the reply
    // says it is still ours at 500 ms.
    sleep_until(start + ms(400)).await;
    reports.send(LeaseChange::Changed(lease.key().clone()))?;
    sleep_until(start + ms(550)).await;
    assert_eq!(lease.renewals(), 1, "renewed when the change was reported");
    // From now on no renewal gets through.
    memory.fail_next(u64::MAX);
    fires_at(&lease, start + ms(400) + options().deadline_after()).await
}

#[tokio::test(start_paused = true)]
async fn renewals_after_a_reconnection_count_from_when_they_were_sent() -> TestResult {
    let memory = MemoryBackend::new();
    let (backend, reports) = Delayed::new(memory.clone());
    let manager = LeaseManager::new(backend)?;
    let start = Instant::now();
    let mut leases = Vec::new();
    for (i, at) in [0, 150, 700].into_iter().enumerate() {
        sleep_until(start + ms(at)).await;
        leases.push(manager.acquire(&format!("k{i}"), &options()).await?);
    }
    // The change watch came back at 800 ms (a reconnection): every lease
    // may have changed, and every one is renewed at once.
    sleep_until(start + ms(800)).await;
    reports.send(LeaseChange::All)?;
    sleep_until(start + ms(950)).await;
    for lease in &leases {
        assert_eq!(lease.renewals(), 1, "{} renewed at the report", lease.key());
    }
    memory.fail_next(u64::MAX);
    for lease in &leases {
        fires_at(lease, start + ms(800) + options().deadline_after()).await?;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lease_renewed_early_in_anothers_batch_counts_from_the_batch() -> TestResult {
    let memory = MemoryBackend::new();
    let (backend, _reports) = Delayed::new(memory.clone());
    let manager = LeaseManager::new(backend)?;
    let start = Instant::now();
    let first = manager.acquire("first", &options()).await?;
    // Due 60 ms after the first, within one step of the renewal grid
    // (62.5 ms): renewed early, in the first's batch at 1 s.
    sleep_until(start + ms(60)).await;
    let early = manager.acquire("early", &options()).await?;
    sleep_until(start + ms(1150)).await;
    assert_eq!((first.renewals(), early.renewals()), (1, 1));
    memory.fail_next(u64::MAX);
    // Both count from the batch's sending: the early one's deadline is
    // not its own due time's (60 ms later, which the server would not
    // honour).
    let at = start + ms(1000) + options().deadline_after();
    fires_at(&early, at).await?;
    fires_at(&first, at).await
}

#[tokio::test(start_paused = true)]
async fn a_grant_handed_over_counts_from_when_the_release_was_sent() -> TestResult {
    let memory = MemoryBackend::new();
    let (backend, _reports) = Delayed::new(memory.clone());
    let manager = LeaseManager::new(backend)?;
    let start = Instant::now();
    let holder = manager.acquire("baton", &options()).await?;
    // A waiter of the same manager queues at 100 ms.
    let waiting = {
        let manager = manager.clone();
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("3s")?)
            .safety_margin(ms(300))
            .wait(Duration::from_secs(10))
            .build()?;
        tokio::spawn(async move {
            sleep_until(start + ms(100)).await;
            manager.acquire("baton", &options).await
        })
    };
    // The holder releases at 500 ms, handing the lease over; the reply,
    // with the waiter's grant, arrives at 600 ms.
    sleep_until(start + ms(500)).await;
    holder.release().await?;
    let next = timeout(Duration::from_secs(5), waiting).await???;
    assert_eq!(
        Instant::now(),
        start + ms(600),
        "granted when the reply came"
    );
    sleep_until(start + ms(650)).await;
    memory.fail_next(u64::MAX);
    fires_at(&next, start + ms(500) + options().deadline_after()).await
}
