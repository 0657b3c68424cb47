//! Changes reported by the backend (`LeaseBackend::watch_changes`): the
//! watchdog renews the leases concerned at once, on the paused clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, HolderId,
    LeaseBackend, LeaseInfo, LeaseKey, MemoryBackend, ReleaseOutcome, ReleaseReport, RenewOutcome,
    RenewRequest, Ttl,
};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep, sleep_until, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::with_ttl(Ttl::parse(ttl).expect("valid ttl"))
}

fn key(k: &str) -> LeaseKey {
    LeaseKey::new(k).expect("valid key")
}

/// A `MemoryBackend` whose renewal replies arrive `reply_delay` after the
/// renewal ran (as a reply in flight on a network), counting batches.
#[derive(Clone)]
struct SlowReplies {
    inner: MemoryBackend,
    reply_delay: Duration,
    batches: Arc<AtomicUsize>,
}

impl SlowReplies {
    fn new(inner: MemoryBackend, reply_delay: Duration) -> Self {
        Self {
            inner,
            reply_delay,
            batches: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl LeaseBackend for SlowReplies {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let outcomes = self.inner.renew_many(requests).await;
        sleep(self.reply_delay).await;
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

    fn changes(&self) -> Option<&impl ChangeBackend> {
        Some(self)
    }
}

impl ChangeBackend for SlowReplies {
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        self.inner.watch_changes().await
    }
}

#[tokio::test(start_paused = true)]
async fn a_vanished_lease_is_lost_at_once_and_the_others_are_left_alone() -> TestResult {
    let memory = MemoryBackend::new();
    let backend = SlowReplies::new(memory.clone(), Duration::ZERO);
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let gone = manager.acquire("gone", &options("3s")).await?;
    let kept = manager.acquire("kept", &options("3s")).await?;
    sleep(Duration::from_millis(300)).await;
    assert!(memory.vanish(&key("gone")));
    assert_eq!(
        timeout(Duration::from_secs(5), gone.lost()).await?,
        LossReason::Lost
    );
    assert_eq!(Instant::now(), start + Duration::from_millis(300));
    // Only the lease that changed was renewed.
    assert_eq!(backend.batches.load(Ordering::Relaxed), 1);
    assert_eq!(kept.renewals(), 0);
    assert_eq!(kept.loss_reason(), None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_change_during_a_renewal_in_flight_renews_once_more_right_after_it() -> TestResult {
    let memory = MemoryBackend::new();
    let backend = SlowReplies::new(memory.clone(), Duration::from_millis(100));
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let lease = manager.acquire("busy", &options("3s")).await?;
    // The renewal due at 1 s runs on the server at 1 s; its reply arrives
    // at 1.1 s. The lease is taken over at 1.05 s, after the server ran the
    // renewal: its reply says Renewed, so only a second renewal can tell.
    sleep_until(start + Duration::from_millis(1050)).await;
    memory.hand_over(&key("busy"), Ttl::parse("3s")?)?;
    assert_eq!(
        timeout(Duration::from_secs(5), lease.lost()).await?,
        LossReason::Lost
    );
    assert_eq!(lease.renewals(), 1);
    // Renewed again at 1.1 s, answered at 1.2 s; not at the next renewal (2.1 s).
    assert_eq!(Instant::now(), start + Duration::from_millis(1200));
    assert_eq!(backend.batches.load(Ordering::Relaxed), 2);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn changes_reported_together_share_batches() -> TestResult {
    let memory = MemoryBackend::new();
    let backend = SlowReplies::new(memory.clone(), Duration::ZERO);
    let manager = LeaseManager::new(backend.clone())?;
    let mut leases = Vec::new();
    for i in 0..1500 {
        leases.push(manager.acquire(&format!("k{i}"), &options("30s")).await?);
    }
    let start = Instant::now();
    // A flush, as a server would report it key by key: every change is
    // queued before the watchdog looks.
    for i in 0..1500 {
        assert!(memory.vanish(&key(&format!("k{i}"))));
    }
    for lease in &leases {
        assert_eq!(
            timeout(Duration::from_secs(5), lease.lost()).await?,
            LossReason::Lost
        );
    }
    assert_eq!(Instant::now(), start);
    // 1,500 renewals in batches of at most 1,000: two calls.
    assert_eq!(backend.batches.load(Ordering::Relaxed), 2);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_report_of_every_lease_renews_them_all_at_once_and_ends_those_deleted_meanwhile()
-> TestResult {
    let memory = MemoryBackend::new();
    let backend = SlowReplies::new(memory.clone(), Duration::ZERO);
    let manager = LeaseManager::new(backend.clone())?;
    let start = Instant::now();
    let mut leases = Vec::new();
    for i in 0..100 {
        leases.push(manager.acquire(&format!("k{i}"), &options("3s")).await?);
    }
    // The change-watching connection drops at 300 ms, and every third
    // lease is deleted while it is down: no one is told.
    sleep_until(start + Duration::from_millis(300)).await;
    memory.cut_changes();
    let deleted = |i: usize| i.is_multiple_of(3);
    for i in (0..100).filter(|&i| deleted(i)) {
        assert!(memory.vanish(&key(&format!("k{i}"))));
    }
    // It is back at 400 ms, well before the first renewal (1 s).
    sleep_until(start + Duration::from_millis(400)).await;
    assert!(leases.iter().all(|lease| lease.loss_reason().is_none()));
    assert_eq!(backend.batches.load(Ordering::Relaxed), 0);
    memory.restore_changes();
    for (i, lease) in leases.iter().enumerate().filter(|(i, _)| deleted(*i)) {
        let reason = timeout(Duration::from_secs(5), lease.lost()).await?;
        assert_eq!(reason, LossReason::Lost, "k{i}");
    }
    // All at the moment of the report, not at their next renewal.
    assert_eq!(Instant::now(), start + Duration::from_millis(400));
    // Every lease was renewed at once, in one batch; the others are still
    // held, and the backend's own record shows them renewed at 400 ms.
    assert_eq!(backend.batches.load(Ordering::Relaxed), 1);
    for (i, lease) in leases.iter().enumerate().filter(|(i, _)| !deleted(*i)) {
        assert_eq!(lease.loss_reason(), None, "k{i}");
        assert_eq!(lease.renewals(), 1, "k{i}");
        let info = memory
            .inspect(&key(&format!("k{i}")))
            .await?
            .ok_or("a kept lease vanished")?;
        assert_eq!(info.ttl_left, Some(Duration::from_secs(3)), "k{i}");
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_no_longer_watched() -> TestResult {
    let memory = MemoryBackend::new();
    let backend = SlowReplies::new(memory.clone(), Duration::ZERO);
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("done", &options("3s")).await?;
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    // Someone takes the key after the release: nothing of ours to renew.
    let _other = memory.hand_over(&key("done"), Ttl::parse("3s")?)?;
    sleep(Duration::from_millis(10)).await;
    assert_eq!(backend.batches.load(Ordering::Relaxed), 0);
    Ok(())
}
