//! What the manager-level tests of counting and read-write leases share:
//! a manager and a side connection on the test server, waits with a bound,
//! and a holder that crashes while it holds.

use std::future::Future;
use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::redis::redis;
use leasehold::{Lease, LeaseKey, LeaseManager};
use leasehold_testkit::RedisServer;

pub(crate) type Error = Box<dyn std::error::Error + Send + Sync>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`, so that a broken mechanism fails the test instead of
/// hanging it.
pub(crate) async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

pub(crate) async fn manager(server: &RedisServer) -> Result<LeaseManager<RedisBackend>, Error> {
    manager_at(server.url()).await
}

/// A manager on the deployment at `url` (a cluster's or Sentinel's too).
pub(crate) async fn manager_at(url: String) -> Result<LeaseManager<RedisBackend>, Error> {
    Ok(LeaseManager::new(RedisBackend::connect(url).await?)?)
}

pub(crate) async fn side(
    server: &RedisServer,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await
}

/// The Redis key of a lease key (default namespace).
pub(crate) fn stored(key: &LeaseKey) -> String {
    format!("leasehold:{key}")
}

/// Takes a lease with `take` in a process of its own that then dies
/// holding it: a runtime of its own, dropped with the lease forgotten, so
/// that neither a release nor its watchdog outlives it. Returns the Redis
/// key the lease was stored at.
pub(crate) fn crash_holding<F>(server: &RedisServer, take: F) -> Result<String, Error>
where
    F: AsyncFnOnce(&LeaseManager<RedisBackend>) -> Result<Lease, Error> + Send + 'static,
{
    crash_holding_at(server.url(), take)
}

/// [`crash_holding`] on the deployment at `url`.
pub(crate) fn crash_holding_at<F>(url: String, take: F) -> Result<String, Error>
where
    F: AsyncFnOnce(&LeaseManager<RedisBackend>) -> Result<Lease, Error> + Send + 'static,
{
    let crashed = std::thread::spawn(move || -> Result<String, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let key = runtime.block_on(async {
            let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
            let lease = take(&manager).await?;
            let key = stored(&lease.server_key());
            // No release, no drop: the process dies holding it.
            std::mem::forget(lease);
            Ok::<_, Error>(key)
        })?;
        drop(runtime);
        Ok(key)
    });
    // Bounded: a holder that never dies must fail the test, not hang it.
    leasehold_testkit::join_within(crashed, Duration::from_secs(60))
        .map_err(|e| format!("the crashing holder's thread: {e}"))?
}
