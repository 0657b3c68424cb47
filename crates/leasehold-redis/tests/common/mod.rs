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
pub(crate) async fn retry_transient<T, F, Fut>(op: F) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    retry_while(BackendError::is_transient, op).await
}

/// `op` again every 50 ms while it fails with an error `again` takes, for
/// at most 5 s; then its outcome, whatever it is.
pub(crate) async fn retry_while<T, F, Fut>(
    again: impl Fn(&BackendError) -> bool,
    mut op: F,
) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match op().await {
            Err(e) if again(&e) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// The server's clock (`TIME`), in milliseconds since 1970: the clock it
/// keeps its expiries by.
pub(crate) fn server_ms(server: &RedisServer) -> Result<i64, Box<dyn std::error::Error>> {
    let time = server.cli(&["TIME"])?;
    let mut parts = time.split_whitespace();
    let (Some(secs), Some(micros)) = (parts.next(), parts.next()) else {
        return Err(format!("TIME answered {time:?}").into());
    };
    Ok(secs.parse::<i64>()? * 1_000 + micros.parse::<i64>()? / 1_000)
}

/// When the server frees `key` (`PEXPIRETIME`, Redis 7.0): milliseconds
/// since 1970 by its clock, -1 for never, -2 for gone.
pub(crate) fn expires_at(
    server: &RedisServer,
    key: &str,
) -> Result<i64, Box<dyn std::error::Error>> {
    Ok(server.cli(&["PEXPIRETIME", key])?.parse()?)
}

/// Asserts that the server frees `key` `ms` after a write it made while
/// its clock read between `before` and `after` (`TIME` read just before
/// and just after the call, see [`server_ms`]): its `PEXPIRETIME` lies in
/// [before + ms, after + ms + 1], the server keeping an expiry in whole
/// milliseconds. The bound is as wide as the call's round trip on the
/// server's clock, with no allowance of its own: an expiry cut by any
/// part of `ms` shows. Returns the end.
pub(crate) fn assert_expires(
    server: &RedisServer,
    key: &str,
    (before, after): (i64, i64),
    ms: i64,
    what: &str,
) -> Result<i64, Box<dyn std::error::Error>> {
    let end = expires_at(server, key)?;
    let (low, high) = (before + ms, after + ms + 1);
    assert!(
        (low..=high).contains(&end),
        "{what}: the server frees {key} at {end}, {} ms after the call began by its clock, not {ms} ms after the call ([{low}, {high}])",
        end - before
    );
    Ok(end)
}
