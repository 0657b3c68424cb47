//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, Grant, HolderId, LeaseBackend, LeaseInfo,
    LeaseKey, Ttl,
};
use leasehold_redis::{KeyLayout, RedisBackend};
use leasehold_testkit::RedisServer;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) fn key(name: &str) -> LeaseKey {
    LeaseKey::new(name).expect("valid lease key")
}

pub(crate) fn ttl(text: &str) -> Ttl {
    Ttl::parse(text).expect("valid ttl")
}

pub(crate) fn holder() -> HolderId {
    HolderId::generate().expect("the OS has entropy")
}

/// The Redis key of a lease in the default namespace.
pub(crate) fn storage_key(key: &LeaseKey) -> String {
    KeyLayout::default().lease(key)
}

pub(crate) async fn connect(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(server.url())
        .await
        .expect("connects to the test server")
}

/// Acquires a lease that must be free.
pub(crate) async fn acquire(
    backend: &RedisBackend,
    key: &LeaseKey,
    holder: HolderId,
    ttl: Ttl,
) -> Result<Grant, BackendError> {
    match backend
        .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
        .await?
    {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        AcquireOutcome::Held(info) => panic!("{key} should be free, is held: {info:?}"),
    }
}

/// Acquires a lease that must be held by someone else, returning what is shown of it.
pub(crate) async fn held(
    backend: &RedisBackend,
    key: &LeaseKey,
    ttl: Ttl,
) -> Result<LeaseInfo, BackendError> {
    match backend
        .try_acquire(&AcquireRequest::new(key.clone(), holder(), ttl))
        .await?
    {
        AcquireOutcome::Held(info) => Ok(info),
        AcquireOutcome::Acquired(grant) => panic!("{key} should be held, was acquired: {grant:?}"),
    }
}

/// Retries `op` while it fails with a transient error (a reconnection after
/// a restart), for at most 5 s.
pub(crate) async fn retry_transient<T, F, Fut>(mut op: F) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match op().await {
            Err(e) if e.is_transient() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}
