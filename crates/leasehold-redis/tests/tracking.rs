//! Client tracking on the renewal connection: the server reports changes
//! to the leases a backend renews.

mod common;

use std::time::Duration;

use common::{
    TestResult, acquire, connect, holder, key, retry_transient, retry_while, storage_key, ttl,
};
use leasehold_core::{
    AcquireRequest, BackendError, ChangeBackend, ChangeWatch, HandoverBackend, HandoverOutcome,
    LeaseBackend, LeaseChange, LeaseKey, RenewOutcome, RenewRequest, WatchPolicy,
};
use leasehold_redis::RedisBackend;
use leasehold_testkit::RedisServer;

/// Far above the few milliseconds a push takes: only a missing report
/// reaches it.
const REPORT_BOUND: Duration = Duration::from_secs(5);

async fn next_change(watch: &mut ChangeWatch) -> Result<LeaseChange, Box<dyn std::error::Error>> {
    match tokio::time::timeout(REPORT_BOUND, watch.next()).await {
        Ok(Some(change)) => Ok(change),
        Ok(None) => Err("the backend stopped reporting changes".into()),
        Err(_) => Err(format!("no change reported within {REPORT_BOUND:?}").into()),
    }
}

/// The next change and every other one already reported. (`K` and `{K}`
/// share one Redis key, so a change of it names both.)
async fn changes(watch: &mut ChangeWatch) -> Result<Vec<LeaseChange>, Box<dyn std::error::Error>> {
    let mut changes = vec![next_change(watch).await?];
    while let Some(change) = watch.try_next() {
        changes.push(change);
    }
    Ok(changes)
}

#[tokio::test]
async fn a_set_or_del_behind_the_holder_is_reported_for_its_lease() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    assert!(backend.tracks_lease_changes());
    let mut watch = backend.watch_changes().await?;
    assert!(watch.is_supported());
    let (k, other, me) = (key("tracked"), key("untouched"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    acquire(&backend, &other, holder(), ttl("30s")).await?;
    let renew = RenewRequest::new(k.clone(), me, ttl("30s"));
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
    assert_eq!(
        server.cli(&["SET", &storage_key(&k), "someone-else", "PX", "60000"])?,
        "OK"
    );
    let changed = changes(&mut watch).await?;
    assert!(
        changed.contains(&LeaseChange::Changed(k.clone())),
        "{changed:?}"
    );
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Lost);
    // The renewal read it again: a DEL is reported too.
    assert_eq!(server.cli(&["DEL", &storage_key(&k)])?, "1");
    let changed = changes(&mut watch).await?;
    assert!(changed.contains(&LeaseChange::Changed(k)), "{changed:?}");
    // The other lease did not change: nothing else.
    assert_eq!(watch.try_next(), None);
    Ok(())
}

/// The number of keys in the server's tracking table: the server's own
/// count, which the backend does not shape.
fn tracked_keys(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let stats = server.cli(&["INFO", "stats"])?;
    let count = stats
        .lines()
        .find_map(|l| l.strip_prefix("tracking_total_keys:"))
        .ok_or("no tracking_total_keys in INFO stats")?;
    Ok(count.trim().parse()?)
}

/// Checks that `changed` reports `k`, and nothing but the Redis key of `k`
/// (which also names `{k}`).
fn only(changed: &[LeaseChange], k: &LeaseKey) {
    assert!(
        changed.contains(&LeaseChange::Changed(k.clone())),
        "{k}: {changed:?}"
    );
    assert!(
        changed
            .iter()
            .all(|c| matches!(c, LeaseChange::Changed(o) if storage_key(o) == storage_key(k))),
        "{k}: {changed:?}"
    );
}

/// A lease is tracked from the script that grants it (an acquisition, a
/// re-acquisition by its holder, a handover), before any renewal: a SET or
/// a DEL behind the holder is reported at once. Its fencing counter is not
/// tracked: a counter outlives its lease by its retention (an hour by
/// default), and would hold its entry in the server's tracking table long
/// after the lease is gone.
#[tokio::test]
async fn a_lease_is_tracked_from_its_grant_and_its_counter_is_not() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut watch = backend.watch_changes().await?;
    assert_eq!(tracked_keys(&server)?, 0);

    // Acquired: no renewal, yet a SET is reported. The counter is not
    // tracked, and a change of it is not reported (pushes come in order,
    // so a report of it would come first).
    let k = key("granted");
    acquire(&backend, &k, holder(), ttl("30s")).await?;
    assert_eq!(tracked_keys(&server)?, 1, "the lease, not its counter");
    server.cli(&["INCR", &format!("{}:fence", storage_key(&k))])?;
    assert_eq!(
        server.cli(&["SET", &storage_key(&k), "someone-else"])?,
        "OK"
    );
    only(&changes(&mut watch).await?, &k);

    // Acquired again by its holder (a retried acquisition): the refresh
    // writes the lease, which must not leave it untracked. A DEL is reported.
    let (k, me) = (key("refreshed"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    acquire(&backend, &k, me, ttl("30s")).await?;
    assert_eq!(server.cli(&["DEL", &storage_key(&k)])?, "1");
    only(&changes(&mut watch).await?, &k);

    // Handed over to a local waiter (only our own watch listens): the new
    // holder's lease is tracked too.
    let (k, first, next) = (key("handed"), holder(), holder());
    acquire(&backend, &k, first, ttl("30s")).await?;
    let before = tracked_keys(&server)?;
    let _listening = backend.watch_releases(&k, WatchPolicy::Counted).await?;
    let outcome = backend
        .release_to(
            &k,
            &first,
            &AcquireRequest::new(k.clone(), next, ttl("30s")),
        )
        .await?;
    assert!(
        matches!(outcome, HandoverOutcome::HandedOver(ref g) if g.holder == next),
        "{outcome:?}"
    );
    // The handover's writes dropped the lease's tracking, its read after
    // them tracked it again: as many keys are tracked as before.
    assert_eq!(tracked_keys(&server)?, before, "the handed-over lease");
    assert_eq!(
        server.cli(&["SET", &storage_key(&k), "someone-else"])?,
        "OK"
    );
    only(&changes(&mut watch).await?, &k);
    Ok(())
}

/// Releases over the tracked connection, with and without a minimum hold,
/// alone and batched, leave nothing in the server's tracking table: the
/// released leases' entries go with their writes, and the minimum-hold
/// mark, which every release looks for, is never tracked (Redis 7.0 tracks
/// every key a script call names on a read-only command; the mark is not
/// named).
#[tokio::test]
async fn releases_leave_no_tracking_entry_for_the_minimum_hold_mark() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .calls_in_flight(1)
        .connect()
        .await?;
    // Tracking is turned on by the first lease write.
    let _watch = backend.watch_changes().await?;
    let me = holder();
    let plain: Vec<LeaseKey> = (0..3).map(|i| key(&format!("plain-{i}"))).collect();
    let held: Vec<LeaseKey> = (0..3).map(|i| key(&format!("held-{i}"))).collect();
    for k in &plain {
        acquire(&backend, k, me, ttl("30s")).await?;
    }
    for k in &held {
        let request = AcquireRequest::new(k.clone(), me, ttl("30s"))
            .with_hold_at_least(Duration::from_secs(60))?;
        backend.try_acquire(&request).await?;
    }
    assert_eq!(tracked_keys(&server)?, 6, "the six leases");
    // Together: the first of each goes alone (release.lua), the others as
    // a batch (release_many.lua).
    for keys in [&plain, &held] {
        let released =
            futures_util::future::join_all(keys.iter().map(|k| backend.release(k, &me))).await;
        for outcome in released {
            outcome?;
        }
    }
    assert_eq!(server.cli(&["EXISTS", &storage_key(&held[2])])?, "1");
    assert_eq!(tracked_keys(&server)?, 0, "entries left after the releases");
    Ok(())
}

#[tokio::test]
async fn a_flush_and_a_lost_connection_report_every_lease() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut watch = backend.watch_changes().await?;
    let (k, me) = (key("flushed"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    let renew = RenewRequest::new(k.clone(), me, ttl("30s"));
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
    assert_eq!(server.cli(&["FLUSHALL"])?, "OK");
    assert_eq!(next_change(&mut watch).await?, LeaseChange::All);

    server.restart()?;
    assert_eq!(next_change(&mut watch).await?, LeaseChange::All);
    // Tracking is on again on the new connection: a renewal (lost, the
    // restart was empty) tracks the key, and a SET is reported.
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Lost);
    while watch.try_next().is_some() {}
    assert_eq!(server.cli(&["SET", &storage_key(&k), "x"])?, "OK");
    let changed = changes(&mut watch).await?;
    assert!(changed.contains(&LeaseChange::Changed(k)), "{changed:?}");
    assert!(backend.tracks_lease_changes());
    Ok(())
}

/// `op` until it succeeds, for at most 5 s, after a restart of a server
/// that then answers at once: a call may meet the connection the restart
/// broke (unavailable), but none may time out.
async fn after_the_restart<T, F, Fut>(op: F) -> Result<T, BackendError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BackendError>>,
{
    retry_while(|e| matches!(e, BackendError::Unavailable { .. }), op).await
}

/// Restarts `server` (empty: no persistence) and waits for the backend to
/// report every lease changed, as after any lost connection; the reports
/// before are drained.
async fn restarted(server: &mut RedisServer, watch: &mut ChangeWatch) -> TestResult {
    server.restart()?;
    assert_eq!(next_change(watch).await?, LeaseChange::All);
    while watch.try_next().is_some() {}
    Ok(())
}

/// A SET of `k` on a side connection is reported, for `k` alone: the key
/// is tracked on the backend's connection.
async fn a_write_behind_is_reported(
    server: &RedisServer,
    watch: &mut ChangeWatch,
    k: &LeaseKey,
) -> TestResult {
    assert_eq!(server.cli(&["SET", &storage_key(k), "x"])?, "OK");
    only(&changes(watch).await?, k);
    Ok(())
}

/// A read, or a grant, that is the first call after a reconnection turns
/// tracking on for the new connection before it goes out, at once: the
/// key it read or wrote is tracked, and a SET behind it is reported.
#[tokio::test]
async fn a_read_or_a_grant_after_a_reconnection_is_tracked() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut watch = backend.watch_changes().await?;
    let (read, granted) = (key("read-after"), key("granted-after"));
    assert_eq!(backend.inspect(&read).await?, None);

    restarted(&mut server, &mut watch).await?;
    assert_eq!(after_the_restart(|| backend.inspect(&read)).await?, None);
    a_write_behind_is_reported(&server, &mut watch, &read).await?;

    restarted(&mut server, &mut watch).await?;
    let me = holder();
    after_the_restart(|| acquire(&backend, &granted, me, ttl("30s"))).await?;
    a_write_behind_is_reported(&server, &mut watch, &granted).await
}

/// A `CLIENT TRACKING` that could not be sent (the server down) is not a
/// refusal: tracking stays on, and once the server is back the next read
/// turns it on for the new connection and is tracked.
#[tokio::test]
async fn a_prelude_that_could_not_be_sent_leaves_tracking_on() -> TestResult {
    let mut server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut watch = backend.watch_changes().await?;
    let k = key("down-then-up");
    assert_eq!(backend.inspect(&k).await?, None);
    server.kill()?;
    assert_eq!(next_change(&mut watch).await?, LeaseChange::All);
    let down = backend.inspect(&k).await;
    assert!(
        matches!(down, Err(BackendError::Unavailable { .. })),
        "{down:?}"
    );
    server.restart()?;
    assert_eq!(after_the_restart(|| backend.inspect(&k)).await?, None);
    assert!(backend.tracks_lease_changes(), "tracking is still on");
    while watch.try_next().is_some() {}
    a_write_behind_is_reported(&server, &mut watch, &k).await
}

#[tokio::test]
async fn a_refused_client_tracking_leaves_renewals_working() -> TestResult {
    let server = RedisServer::start()?;
    // A user that may speak RESP3 but not turn tracking on.
    assert_eq!(
        server.cli(&[
            "ACL", "SETUSER", "notrack", "on", ">pw-3c1d", "~*", "&*", "+@all", "-client"
        ])?,
        "OK"
    );
    let url = format!("redis://notrack:pw-3c1d@{}", server.addr());
    let backend = RedisBackend::connect(url).await?;
    let (k, me) = (key("untracked"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    let renew = RenewRequest::new(k.clone(), me, ttl("30s"));
    for _ in 0..3 {
        assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
    }
    assert!(!backend.tracks_lease_changes());
    assert!(!backend.watch_changes().await?.is_supported());
    Ok(())
}

#[tokio::test]
async fn tracking_can_be_turned_off() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .track_lease_changes(false)
        .connect()
        .await?;
    assert!(!backend.tracks_lease_changes());
    assert!(!backend.watch_changes().await?.is_supported());
    let (k, me) = (key("plain"), holder());
    acquire(&backend, &k, me, ttl("30s")).await?;
    let renew = RenewRequest::new(k.clone(), me, ttl("30s"));
    assert_eq!(backend.renew(&renew).await?, RenewOutcome::Renewed);
    // The renewal connection does not track.
    let list = server.cli(&["CLIENT", "LIST"])?;
    let renew_line = list
        .lines()
        .find(|l| l.contains("name=leasehold-renew"))
        .ok_or("no renewal connection")?;
    assert!(renew_line.contains("flags=N"), "{renew_line}");
    Ok(())
}

/// How many times the server ran `command` since the last `CONFIG
/// RESETSTAT`, inside scripts included: the server's own count.
fn calls(server: &RedisServer, command: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let stats = server.cli(&["INFO", "commandstats"])?;
    let prefix = format!("cmdstat_{command}:calls=");
    Ok(stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(Ok(0), str::parse)?)
}

/// Without tracking, a grant does not read its lease again once written:
/// the read only tracks it, and nothing tracks there. With tracking, the
/// test above sees the read's effect.
#[tokio::test]
async fn an_untracked_grant_does_not_read_its_lease_again() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::builder(server.url())
        .track_lease_changes(false)
        .connect()
        .await?;
    let (k, me) = (key("unread"), holder());
    assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
    acquire(&backend, &k, me, ttl("30s")).await?;
    // Refreshed by its holder: no read after that write either.
    acquire(&backend, &k, me, ttl("30s")).await?;
    // The scripts ran: the grant set the lease and its counter, the
    // refresh the lease.
    assert_eq!(calls(&server, "set")?, 3);
    assert_eq!(calls(&server, "pttl")?, 0);
    assert_eq!(server.cli(&["EXISTS", &storage_key(&k)])?, "1");
    Ok(())
}

/// Behind Sentinel, a call that times out makes the backend look the
/// master up again on its next call. A grant that is that next call must
/// still be tracked: the new connection gets tracking before the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_grant_on_a_new_connection_is_tracked() -> TestResult {
    let set = leasehold_testkit::SentinelSet::start()?;
    let backend = RedisBackend::builder(set.url())
        .op_timeout(Duration::from_millis(100))
        .connect()
        .await?;
    let mut watch = backend.watch_changes().await?;
    let first = key("before-pause");
    acquire(&backend, &first, holder(), ttl("30s")).await?;
    // The master holds every client for 300 ms: the inspection times out,
    // and the backend forgets its connection.
    set.master().cli(&["CLIENT", "PAUSE", "300", "ALL"])?;
    let timed_out = backend.inspect(&first).await;
    assert!(timed_out.is_err(), "{timed_out:?}");
    // The grant goes over a connection to the master opened for it (once
    // the pause is over: retried while it times out).
    let (k, me) = (key("after-pause"), holder());
    retry_transient(|| acquire(&backend, &k, me, ttl("30s"))).await?;
    while watch.try_next().is_some() {}
    assert_eq!(
        set.master()
            .cli(&["SET", &storage_key(&k), "someone-else"])?,
        "OK"
    );
    only(&changes(&mut watch).await?, &k);
    Ok(())
}

/// Without tracking, a renewal batch is not read again once renewed (the
/// read only tracks it); with tracking it is, once per batch. The server's
/// own command counts tell.
#[tokio::test]
async fn an_untracked_renewal_does_not_read_its_batch_again() -> TestResult {
    let server = RedisServer::start()?;
    for track in [false, true] {
        let backend = RedisBackend::builder(server.url())
            .track_lease_changes(track)
            .connect()
            .await?;
        let (a, b, me) = (key("renew-a"), key("renew-b"), holder());
        acquire(&backend, &a, me, ttl("30s")).await?;
        acquire(&backend, &b, me, ttl("30s")).await?;
        assert_eq!(server.cli(&["CONFIG", "RESETSTAT"])?, "OK");
        let batch = [
            RenewRequest::new(a.clone(), me, ttl("30s")),
            RenewRequest::new(b.clone(), me, ttl("30s")),
        ];
        let outcomes = backend.renew_many(&batch).await;
        assert_eq!(outcomes.len(), 2);
        for outcome in outcomes {
            assert_eq!(outcome?, RenewOutcome::Renewed);
        }
        // One PEXPIREAT per lease, to an instant read once for the batch.
        assert_eq!(calls(&server, "pexpireat")?, 2);
        assert_eq!(calls(&server, "time")?, 1);
        assert_eq!(calls(&server, "exists")?, u64::from(track), "track={track}");
        assert_eq!(
            server.cli(&["DEL", &storage_key(&a), &storage_key(&b)])?,
            "2"
        );
    }
    Ok(())
}
