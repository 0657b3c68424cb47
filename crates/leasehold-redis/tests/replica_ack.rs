//! `wait_for_replicas` on a standalone master with one replica.

mod common;

use std::time::Duration;

use common::{TestResult, holder, key, ttl};
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FairBackend, HandoverBackend, HandoverOutcome,
    LeaseBackend, RenewOutcome, RenewRequest,
};
use leasehold_redis::{ConnectError, RedisBackend};
use leasehold_testkit::RedisServer;

/// Each call is sent with its `WAIT`: an acquisition no replica
/// acknowledged is given back and a renewal's outcome is unknown; an error
/// reply is the call's answer, and `NOSCRIPT` alone has its script loaded
/// and the call sent again. Nothing is handed over.
#[tokio::test]
async fn an_unacknowledged_acquisition_is_given_back_and_an_unacknowledged_renewal_is_unknown()
-> TestResult {
    // The master decides when to sync; without this it waits 5 s for more replicas.
    let master = RedisServer::builder()
        .arg("--repl-diskless-sync-delay")
        .arg("0")
        .start()?;
    let mut replica = RedisServer::builder()
        .arg("--replicaof")
        .arg("127.0.0.1")
        .arg(master.port().to_string())
        .start()?;
    // Linked on both sides: the replica says so at once, but the master
    // counts it for WAIT only after its first acknowledgement.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !replica
        .cli(&["INFO", "replication"])?
        .contains("master_link_status:up")
        || !master
            .cli(&["INFO", "replication"])?
            .contains("state=online")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the replica did not link within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A replica that has just synced may acknowledge only at its
    // once-a-second report, so the bound on WAIT is above a second.
    let backend = RedisBackend::builder(master.url())
        .op_timeout(Duration::from_secs(3))
        .wait_for_replicas(1, Duration::from_millis(1500))
        .connect()
        .await?;
    assert_eq!(
        backend.replica_ack(),
        Some((1, Duration::from_millis(1500)))
    );
    let (k, h) = (key("acked"), holder());
    let AcquireOutcome::Acquired(_) = backend
        .try_acquire(&AcquireRequest::new(k.clone(), h, ttl("10s")))
        .await?
    else {
        return Err("not acquired".into());
    };
    // The replica has the lease as soon as the acquisition returns.
    assert_eq!(replica.cli(&["EXISTS", "leasehold:{acked}"])?, "1");

    replica.pause()?;
    let other = key("unacked");
    let err = backend
        .try_acquire(&AcquireRequest::new(other.clone(), holder(), ttl("10s")))
        .await
        .err()
        .ok_or("acquired although no replica acknowledged it")?;
    assert!(
        matches!(err, BackendError::Server { .. }) && err.is_transient(),
        "{err:?}"
    );
    assert!(err.to_string().contains("given back"), "{err}");
    assert_eq!(backend.inspect(&other).await?, None);
    let renewal = backend
        .renew(&RenewRequest::new(k.clone(), h, ttl("10s")))
        .await;
    assert!(renewal.is_err(), "{renewal:?}");
    replica.resume()?;
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), h, ttl("10s")))
            .await?,
        RenewOutcome::Renewed
    );

    // An error reply of another kind is the call's answer: sent once.
    let wrong = key("a-hash");
    master.cli(&["HSET", "leasehold:{a-hash}", "field", "value"])?;
    assert_eq!(master.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    let refused = backend
        .try_acquire(&AcquireRequest::new(wrong, holder(), ttl("10s")))
        .await;
    assert!(
        matches!(refused, Err(BackendError::WrongType { .. })),
        "{refused:?}"
    );
    assert_eq!(master.command_calls("evalsha")?, 1, "sent once");
    assert_eq!(master.command_calls("script|load")?, 0);

    // Scripts lost on the master: a call with its WAIT meets NOSCRIPT,
    // loads its script and is sent again.
    assert_eq!(master.cli(&["SCRIPT", "FLUSH"])?, "OK");
    assert_eq!(master.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    assert_eq!(
        backend
            .renew(&RenewRequest::new(k.clone(), h, ttl("10s")))
            .await?,
        RenewOutcome::Renewed
    );
    assert_eq!(
        master.info_counter("errorstats", "errorstat_NOSCRIPT", "count")?,
        1
    );
    assert_eq!(master.command_calls("script|load")?, 1);

    // Nothing is handed over under WAIT (the handover's grant would go
    // unacknowledged): a handover watch is unsupported, and a release
    // offered to a waiter releases.
    let next = AcquireRequest::new(k.clone(), holder(), ttl("10s"));
    assert!(
        !backend
            .watch_handover(&k, &next.holder)
            .await?
            .is_supported()
    );
    assert_eq!(
        backend.release_to(&k, &h, &next).await?,
        HandoverOutcome::Released
    );
    assert_eq!(master.cli(&["EXISTS", "leasehold:{acked}"])?, "0");
    Ok(())
}

/// A grant with a minimum hold that no replica acknowledged is given back
/// at once: its mark is dropped before the release, so the key is freed
/// rather than kept for a minimum no holder used. The server's `EXISTS` is
/// the witness.
#[tokio::test]
async fn an_unacknowledged_grant_with_a_minimum_is_freed_at_once() -> TestResult {
    let master = RedisServer::start()?;
    let backend = RedisBackend::builder(master.url())
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect()
        .await?;
    let request = AcquireRequest::new(key("unacked-min"), holder(), ttl("10s"))
        .with_hold_at_least(Duration::from_secs(60))?;
    let err = backend
        .try_acquire(&request)
        .await
        .err()
        .ok_or("acquired although no replica exists")?;
    assert!(err.to_string().contains("given back"), "{err}");
    assert_eq!(master.cli(&["EXISTS", "leasehold:{unacked-min}"])?, "0");
    assert_eq!(
        master.cli(&["EXISTS", "leasehold:{unacked-min}:held-until"])?,
        "0"
    );
    Ok(())
}

#[tokio::test]
async fn asking_for_no_replicas_is_refused() {
    let err = RedisBackend::builder("redis://127.0.0.1:1")
        .wait_for_replicas(0, Duration::from_millis(100))
        .connect()
        .await;
    assert!(
        matches!(
            err,
            Err(ConnectError::InvalidConfig {
                field: "wait_for_replicas",
                ..
            })
        ),
        "{err:?}"
    );
}
