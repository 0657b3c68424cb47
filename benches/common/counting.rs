//! A `RedisBackend` that counts what the watchdog sends it: the benches
//! that hold many leases read their renewals from here.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, HolderId,
    LeaseBackend, ReleaseReport, RenewOutcome, RenewRequest,
};
use leasehold::redis::RedisBackend;
use leasehold::{LeaseInfo, LeaseKey};

/// The most renewals one script call carries: a batch of more is sent as
/// several calls, each a round trip.
pub(crate) const RENEWALS_PER_CALL: usize = 1000;

/// Counts the watchdog's renew_many calls, the round trips they take,
/// the renewals in them, those in flight and the slowest call.
#[derive(Clone)]
pub(crate) struct Counting {
    pub(crate) inner: RedisBackend,
    /// Renewals sent.
    pub(crate) renewals: Arc<AtomicU64>,
    /// renew_many calls made.
    pub(crate) calls: Arc<AtomicU64>,
    /// Script calls they took (one per [`RENEWALS_PER_CALL`] renewals).
    pub(crate) round_trips: Arc<AtomicU64>,
    /// renew_many calls out now, so that a measured window can start and
    /// end while the server is idle between two rounds.
    pub(crate) in_flight: Arc<AtomicU64>,
    /// The slowest renew_many call, in microseconds.
    pub(crate) slowest_us: Arc<AtomicU64>,
}

impl Counting {
    pub(crate) fn new(inner: RedisBackend) -> Self {
        Self {
            inner,
            renewals: Arc::default(),
            calls: Arc::default(),
            round_trips: Arc::default(),
            in_flight: Arc::default(),
            slowest_us: Arc::default(),
        }
    }
}

impl LeaseBackend for Counting {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        self.inner.try_acquire(request).await
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let started = Instant::now();
        let outcomes = self.inner.renew_many(requests).await;
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.slowest_us.fetch_max(took, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        let round_trips = requests.len().div_ceil(RENEWALS_PER_CALL) as u64;
        self.round_trips.fetch_add(round_trips, Ordering::SeqCst);
        self.renewals
            .fetch_add(requests.len() as u64, Ordering::SeqCst);
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
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

impl ChangeBackend for Counting {
    async fn watch_changes(&self) -> Result<ChangeWatch, BackendError> {
        self.inner.watch_changes().await
    }
}
