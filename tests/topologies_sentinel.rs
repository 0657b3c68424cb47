//! Leases on a Sentinel-monitored master, through a real failover.

use std::time::Duration;

use leasehold::redis::{KeyLayout, RedisBackend, Topology};
use leasehold::{LeaseBackend, LeaseKey, LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::SentinelSet;

#[path = "common/notice.rs"]
mod notice;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_master_keeps_replicated_leases_and_reports_the_rest_lost() -> TestResult {
    let mut set = SentinelSet::start()?;
    println!(
        "sentinel set (master, replica, 3 sentinels) set up in {:?}",
        set.setup_time()
    );
    let backend = RedisBackend::builder(set.url())
        .op_timeout(Duration::from_millis(250))
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    assert_eq!(backend.topology(), Topology::Sentinel);
    let manager = LeaseManager::new(backend)?;
    // A ttl that outlasts the failover (2–3 s), renewed often.
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("10s")?)
        .renew_interval(Duration::from_millis(300))
        .build()?;
    let mut replicated = Vec::new();
    for i in 0..10 {
        replicated.push(manager.acquire(format!("kept-{i}"), &options).await?);
    }
    let layout = KeyLayout::default();
    let last = layout.lease(&LeaseKey::new("kept-9")?);
    // Wait until the replica has them all (by polling it, not by sleeping).
    while set.replica().cli(&["EXISTS", &last])? != "1" {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Cut the replica off, then take leases it never sees: the failover loses them.
    set.replica_mut().pause()?;
    set.master().cli(&["CLIENT", "KILL", "TYPE", "replica"])?;
    let mut unreplicated = Vec::new();
    for i in 0..5 {
        unreplicated.push(manager.acquire(format!("lost-{i}"), &options).await?);
    }
    set.kill_master()?;
    set.replica_mut().resume()?;
    let killed_at = tokio::time::Instant::now();
    let took = tokio::task::block_in_place(|| set.wait_for_failover())?;
    println!("sentinels promoted the replica {took:?} after the master was killed");

    for (i, lease) in unreplicated.iter().enumerate() {
        let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost())
            .await
            .map_err(|_| format!("lost-{i} was not reported within 5 s of the failover"))?;
        assert_eq!(reason, LossReason::Lost, "lost-{i}");
    }
    println!(
        "unreplicated leases reported Lost {:?} after the kill",
        killed_at.elapsed()
    );

    // Every replicated lease renews on the new master (or is reported).
    let counts: Vec<u32> = replicated.iter().map(leasehold::Lease::renewals).collect();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until
        && replicated
            .iter()
            .zip(&counts)
            .any(|(l, n)| l.loss_reason().is_none() && l.renewals() < n + 1)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut kept = 0;
    for (i, lease) in replicated.iter().enumerate() {
        match lease.loss_reason() {
            Some(reason) => println!("kept-{i} reported {reason:?}"),
            None => {
                assert!(
                    lease.renewals() > counts[i],
                    "kept-{i} stopped renewing without a signal"
                );
                let info = manager
                    .backend()
                    .inspect(lease.key())
                    .await?
                    .ok_or_else(|| {
                        format!("kept-{i} is gone from the new master, yet its token did not fire")
                    })?;
                assert_eq!(info.fencing_token, Some(lease.fencing_token()), "kept-{i}");
                kept += 1;
            }
        }
    }
    println!(
        "{kept} of {} replicated leases kept renewing on the new master",
        replicated.len()
    );

    // The new master takes new leases, with tokens above the old ones.
    let fresh = manager.acquire("lost-0", &options).await?;
    assert!(fresh.fencing_token() > unreplicated[0].fencing_token());
    assert_eq!(
        set.master()
            .cli(&["EXISTS", &layout.lease(&LeaseKey::new("lost-0")?)])?,
        "1"
    );
    Ok(())
}

/// A release by one backend wakes a waiter of another (as in another
/// process) on `key`, well under the fallback poll.
async fn release_wakes_waiter(
    set: &SentinelSet,
    holder: &LeaseManager<RedisBackend>,
    waiter: &LeaseManager<RedisBackend>,
    key: &'static str,
) -> TestResult {
    let options = notice::options();
    let lease = holder.acquire(key, &options).await?;
    let waiting = notice::spawn_waiter(waiter, key, &options);
    let channel = KeyLayout::default().released(&LeaseKey::new(key)?);
    notice::release_wakes(key, lease, waiting, || {
        let reply = set.master().cli(&["PUBSUB", "NUMSUB", &channel])?;
        Ok::<_, leasehold_testkit::TestkitError>(reply.lines().nth(1) == Some("1"))
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_reach_waiters_before_and_after_a_failover() -> TestResult {
    let mut set = SentinelSet::start()?;
    let url = set.url();
    let connect = || {
        RedisBackend::builder(&url)
            .op_timeout(Duration::from_millis(250))
            .connect_timeout(Duration::from_millis(500))
            .connect()
    };
    let holder = LeaseManager::new(connect().await?)?;
    let waiter = LeaseManager::new(connect().await?)?;
    release_wakes_waiter(&set, &holder, &waiter, "before-failover").await?;

    set.kill_master()?;
    let took = tokio::task::block_in_place(|| set.wait_for_failover())?;
    println!("sentinels promoted the replica {took:?} after the master was killed");
    // The waiter's subscription connection died with the master; its next
    // acquisition attempt subscribes again on the new one. The holder is a
    // fresh backend, so the only subscriber on the new master is the waiter.
    drop(holder);
    let holder = LeaseManager::new(connect().await?)?;
    release_wakes_waiter(&set, &holder, &waiter, "after-failover").await
}

/// Client tracking behind Sentinel: the master reports a change to a
/// renewed lease, and the holder hears of it without waiting to renew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwritten_lease_is_reported_by_the_master() -> TestResult {
    use leasehold::{AcquireOutcome, AcquireRequest, HolderId, LeaseChange, RenewRequest};
    let set = SentinelSet::start()?;
    let backend = RedisBackend::connect(set.url()).await?;
    assert!(backend.tracks_lease_changes());
    let mut watch = backend.watch_changes().await?;
    let (key, me, ttl) = (
        LeaseKey::new("watched")?,
        HolderId::generate()?,
        Ttl::parse("30s")?,
    );
    let acquired = backend
        .try_acquire(&AcquireRequest::new(key.clone(), me, ttl))
        .await?;
    assert!(matches!(acquired, AcquireOutcome::Acquired(_)));
    // Watched from its first renewal on.
    backend
        .renew(&RenewRequest::new(key.clone(), me, ttl))
        .await?;
    let stored = KeyLayout::default().lease(&key);
    assert_eq!(set.master().cli(&["SET", &stored, "someone-else"])?, "OK");
    let mut changed = Vec::new();
    while !changed.contains(&LeaseChange::Changed(key.clone())) {
        // Far above the milliseconds a push takes: only a missing report reaches it.
        let change = tokio::time::timeout(Duration::from_secs(5), watch.next())
            .await
            .map_err(|_| format!("no change reported within 5 s; got {changed:?}"))?
            .ok_or("the backend stopped reporting changes")?;
        changed.push(change);
    }
    Ok(())
}
