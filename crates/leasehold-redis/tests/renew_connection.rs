//! Renewals travel over a connection of their own, so that a flood of
//! other operations cannot queue ahead of them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestResult, acquire, connect, holder, key, ttl};
use leasehold_core::{AcquireRequest, LeaseBackend, RenewOutcome, RenewRequest};
use leasehold_testkit::RedisServer;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`, so that a broken mechanism fails the test instead of
/// hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

/// The last command of the connection named `name`, from `CLIENT LIST`.
fn last_command(server: &RedisServer, name: &str) -> Result<String, Box<dyn std::error::Error>> {
    let list = server.cli(&["CLIENT", "LIST"])?;
    let line = list
        .lines()
        .find(|l| l.split(' ').any(|f| f == format!("name={name}")))
        .ok_or_else(|| format!("no connection named {name}: {list}"))?;
    let cmd = line
        .split(' ')
        .find_map(|f| f.strip_prefix("cmd="))
        .ok_or_else(|| format!("no cmd field: {line}"))?;
    Ok(cmd.to_owned())
}

#[tokio::test]
async fn renewals_and_other_operations_use_distinct_named_connections() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    // Both connections were named, and have done nothing else yet but,
    // on the renewal connection, turn client tracking on.
    assert_eq!(last_command(&server, "leasehold-ops")?, "client|setname");
    assert_eq!(last_command(&server, "leasehold-renew")?, "client|tracking");

    // With client tracking on, an acquisition travels with the renewals,
    // so that the server tracks the lease from its grant on.
    let (k, a) = (key("distinct"), holder());
    acquire(&backend, &k, a, ttl("30s")).await?;
    assert_eq!(last_command(&server, "leasehold-ops")?, "client|setname");
    assert_eq!(last_command(&server, "leasehold-renew")?, "evalsha");

    let renewed = backend
        .renew(&RenewRequest::new(k.clone(), a, ttl("30s")))
        .await?;
    assert_eq!(renewed, RenewOutcome::Renewed);
    assert_eq!(last_command(&server, "leasehold-renew")?, "evalsha");
    // A read travels with them too, so that it tracks the key it reads
    // (what a watch of the lease's leader relies on).
    backend.inspect(&k).await?;
    assert_eq!(last_command(&server, "leasehold-ops")?, "client|setname");
    assert_eq!(last_command(&server, "leasehold-renew")?, "evalsha");
    Ok(())
}

#[tokio::test]
async fn without_tracking_acquisitions_use_the_operations_connection() -> TestResult {
    let server = RedisServer::start()?;
    let backend = leasehold_redis::RedisBackend::builder(server.url())
        .track_lease_changes(false)
        .connect()
        .await?;
    acquire(&backend, &key("untracked"), holder(), ttl("30s")).await?;
    assert_eq!(last_command(&server, "leasehold-ops")?, "evalsha");
    assert_eq!(last_command(&server, "leasehold-renew")?, "client|setname");
    backend.inspect(&key("untracked")).await?;
    assert_eq!(last_command(&server, "leasehold-renew")?, "client|setname");
    Ok(())
}

#[tokio::test]
async fn a_flood_of_acquisitions_does_not_delay_a_renewal() -> TestResult {
    const FLOOD: usize = 20_000;
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (k, a) = (key("renewed-during-flood"), holder());
    acquire(&backend, &k, a, ttl("30s")).await?;

    // Tens of thousands of acquisitions at once: served one after another,
    // they take the server a while. (With client tracking on they travel
    // with the renewals, at most `WRITES_IN_FLIGHT` at a time.)
    let done = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let (backend, done) = (backend.clone(), Arc::clone(&done));
        flood.push(tokio::spawn(async move {
            let request = AcquireRequest::new(key(&format!("flood:{i}")), holder(), ttl("30s"));
            let _ = backend.try_acquire(&request).await;
            done.fetch_add(1, Ordering::Relaxed);
        }));
    }
    // Wait until the flood is on the wire.
    within(
        Duration::from_secs(30),
        "the flood's first acquisition",
        async {
            while done.load(Ordering::Relaxed) == 0 {
                tokio::task::yield_now().await;
            }
        },
    )
    .await;
    let renewed = backend
        .renew(&RenewRequest::new(k.clone(), a, ttl("30s")))
        .await?;
    let finished_before = done.load(Ordering::Relaxed);
    assert_eq!(renewed, RenewOutcome::Renewed);
    // Behind the flood on one connection, the renewal would come back after
    // every acquisition sent before it.
    assert!(
        finished_before < FLOOD / 2,
        "the renewal waited for {finished_before} of {FLOOD} acquisitions"
    );
    for task in flood {
        within(Duration::from_secs(60), "a flooding acquisition", task).await?;
    }
    assert_eq!(done.load(Ordering::Relaxed), FLOOD);
    Ok(())
}

/// `calls=` of one command in `INFO commandstats`, 0 when never called.
fn command_calls(server: &RedisServer, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(server.command_calls(command)?)
}

#[tokio::test]
async fn acquire_and_release_are_one_evalsha_each_with_scripts_loaded_once() -> TestResult {
    const CYCLES: u64 = 200;
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    // Every script is loaded at connect, once each.
    let loaded = command_calls(&server, "script|load")?;
    assert!(
        loaded >= 2,
        "acquire.lua and release.lua loaded at connect: {loaded}"
    );
    for i in 0..CYCLES {
        let (k, a) = (key(&format!("cycle:{i}")), holder());
        acquire(&backend, &k, a, ttl("30s")).await?;
        assert_eq!(
            backend.release(&k, &a).await?.outcome(),
            leasehold_core::ReleaseOutcome::Released
        );
    }
    // Each script's body went to the server once, at connect, and never
    // again; never with EVAL.
    assert_eq!(command_calls(&server, "script|load")?, loaded);
    assert_eq!(command_calls(&server, "eval")?, 0);
    // One EVALSHA per operation, none refused.
    assert_eq!(command_calls(&server, "evalsha")?, 2 * CYCLES);
    Ok(())
}
