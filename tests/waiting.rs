//! Waiting without polling, the local queue across managers, and elections,
//! on a real `redis-server`.

use leasehold::backend::{
    HandoverBackend, PermitBackend, ReadWriteBackend, ReleaseReport, WatchPolicy,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, HandoverOutcome, HolderId, LeaseBackend, RenewOutcome,
    RenewRequest,
};
use leasehold::redis::RedisBackend;
use leasehold::{
    Backoff, CancellationToken, Election, LeaseKey, LeaseManager, LeaseOptions, PermitLimit, Ttl,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use tokio::time::Instant;

#[path = "common/notice.rs"]
mod notice;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`, so that a broken mechanism fails the test instead of
/// hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

async fn manager(
    server: &RedisServer,
) -> Result<LeaseManager<RedisBackend>, Box<dyn std::error::Error + Send + Sync>> {
    Ok(LeaseManager::new(
        RedisBackend::connect(server.url()).await?,
    )?)
}

/// Waits long, and polls so rarely that only a release notice explains a
/// quick handoff.
fn patient(ttl: &str, poll: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .wait(Duration::from_secs(60))
        .backoff(Backoff::fixed(poll))
        .build()
        .expect("valid options")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_the_next_waiter_without_a_poll() -> TestResult {
    let server = RedisServer::start()?;
    let fallback = Duration::from_secs(2);
    let options = patient("5s", fallback);
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        // One manager each: only the server's notice can wake them.
        let manager = manager(&server).await?;
        let (options, events) = (options.clone(), Arc::clone(&events));
        tasks.push(tokio::spawn(async move {
            let lease = manager.acquire("handoff", &options).await?;
            let acquired = Instant::now();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let released = Instant::now();
            lease.release().await?;
            events
                .lock()
                .map_err(|_| "poisoned")?
                .push((acquired, released));
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(60), "a waiter", task).await??;
    }
    let mut events = events.lock().map_err(|_| "poisoned")?.clone();
    events.sort();
    assert_eq!(events.len(), 16);
    let gaps: Vec<Duration> = events
        .windows(2)
        .map(|w| w[1].0.saturating_duration_since(w[0].1))
        .collect();
    let worst = gaps.iter().max().copied().unwrap_or_default();
    println!("release-to-acquire gaps: worst {worst:?}, all {gaps:?}");
    assert!(
        worst < fallback / 10,
        "a handoff took {worst:?}: the waiter polled instead of waking"
    );
    Ok(())
}

#[tokio::test]
async fn a_lease_that_expires_unreleased_still_ends_the_wait() -> TestResult {
    let server = RedisServer::start()?;
    let manager = manager(&server).await?;
    // A holder that crashed right after acquiring: no release, no notice.
    let ttl = Ttl::parse("1s")?;
    let crashed = AcquireRequest::new(LeaseKey::new("expiring")?, HolderId::generate()?, ttl);
    let start = Instant::now();
    let AcquireOutcome::Acquired(_) = manager.backend().try_acquire(&crashed).await? else {
        return Err("a free key must be acquired".into());
    };
    let lease = manager
        .acquire("expiring", &patient("1s", Duration::from_secs(30)))
        .await?;
    let waited = start.elapsed();
    println!("acquired {waited:?} after the crashed holder took a 1 s lease");
    assert!(
        waited >= ttl.get() && waited < ttl.get() + Duration::from_millis(300),
        "{waited:?}"
    );
    lease.release().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_waiter_starves_across_a_thousand_handoffs() -> TestResult {
    let server = RedisServer::start()?;
    let options = patient("5s", Duration::from_millis(500));
    let handoffs = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    // Four managers (processes) of four workers each.
    for _ in 0..4 {
        let manager = manager(&server).await?;
        for _ in 0..4 {
            let (manager, options, handoffs) =
                (manager.clone(), options.clone(), Arc::clone(&handoffs));
            tasks.push(tokio::spawn(async move {
                let mut mine = 0usize;
                while handoffs.fetch_add(1, Ordering::SeqCst) < 1000 {
                    let lease = manager.acquire("fair", &options).await?;
                    mine += 1;
                    lease.release().await?;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(mine)
            }));
        }
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(within(Duration::from_secs(120), "a worker", task).await??);
    }
    let total: usize = counts.iter().sum();
    let (fewest, most) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    println!("acquisitions per worker over {total} handoffs: {counts:?}");
    assert!(total >= 1000);
    assert!(
        fewest * 4 >= total / counts.len(),
        "a worker starved: {counts:?}"
    );
    // Processes take turns, whatever order the server tells them of a
    // release in: each manager (its four workers, spawned together) gets
    // at least three quarters of its share.
    let per_manager: Vec<usize> = counts.chunks(4).map(|c| c.iter().sum()).collect();
    assert!(
        per_manager.iter().all(|&n| n * 4 * 4 >= total * 3),
        "a process was passed over: {per_manager:?}"
    );
    assert!(most > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_has_one_leader_at_a_time_and_moves_on_loss_and_shutdown() -> TestResult {
    let server = RedisServer::start()?;
    let leading = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::<String>::new()));
    let stop = CancellationToken::new();
    let mut managers = Vec::new();
    let mut runs = Vec::new();
    for i in 0..3 {
        let manager = manager(&server).await?;
        managers.push(manager.clone());
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("600ms")?)
            .label(format!("replica-{i}"))
            .build()?;
        let election =
            Election::new(manager, "singleton", options)?.pause(Duration::from_millis(50));
        let (leading, most, terms, stop) =
            (leading.clone(), most.clone(), terms.clone(), stop.clone());
        runs.push(tokio::spawn(async move {
            let me = format!("replica-{i}");
            election
                .run(stop, |work| {
                    let token = work.token().clone();
                    let (leading, most, terms, me) =
                        (leading.clone(), most.clone(), terms.clone(), me.clone());
                    async move {
                        let now = leading.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        if let Ok(mut terms) = terms.lock() {
                            terms.push(me);
                        }
                        // Lead for a while, or until the lease ends.
                        tokio::select! {
                            () = token.cancelled() => {}
                            () = tokio::time::sleep(Duration::from_millis(300)) => {}
                        }
                        leading.fetch_sub(1, Ordering::SeqCst);
                    }
                })
                .await
        }));
    }
    let observer = Election::new(managers[0].clone(), "singleton", LeaseOptions::default())?;
    let leader_label = || async {
        observer
            .observe()
            .await
            .map(|info| info.and_then(|i| i.label))
    };

    // Healthy terms hand over by stepping down: never two leaders at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    while terms.lock().map_err(|_| "poisoned")?.len() < 6 {
        assert!(Instant::now() < deadline, "elections stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(most.load(Ordering::SeqCst), 1, "two leaders at once");

    // The leader's lease is deleted behind its back: someone leads again.
    let before = terms.lock().map_err(|_| "poisoned")?.len();
    let mut current = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while current.is_none() {
        assert!(Instant::now() < deadline, "no leader to observe");
        current = leader_label().await?;
    }
    server.cli(&["DEL", "leasehold:{singleton}"])?;
    let deleted_at = Instant::now();
    while terms.lock().map_err(|_| "poisoned")?.len() <= before {
        assert!(
            deleted_at.elapsed() < Duration::from_secs(3),
            "no new leader after the deletion"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The leader's manager shuts down: another replica takes over.
    let mut leader = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while leader.is_none() {
        assert!(Instant::now() < deadline, "no leader to observe");
        leader = leader_label().await?;
    }
    let leader = leader.ok_or("no leader")?;
    let index: usize = leader.trim_start_matches("replica-").parse()?;
    let before = terms.lock().map_err(|_| "poisoned")?.len();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        managers[index].shutdown(),
    )
    .await
    .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    let shut_at = Instant::now();
    loop {
        let terms = terms.lock().map_err(|_| "poisoned")?.clone();
        if terms.len() > before && terms.last() != Some(&leader) {
            break;
        }
        drop(terms);
        assert!(
            shut_at.elapsed() < Duration::from_secs(3),
            "no new leader after the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.cancel();
    for run in runs {
        // The shut-down replica's run ends with ManagerStopped; the others cleanly.
        let _ = within(Duration::from_secs(10), "a stopped replica's run", run).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_survive_a_dropped_subscription_connection() -> TestResult {
    let server = RedisServer::start()?;
    let holder = manager(&server).await?;
    let waiter = manager(&server).await?;
    let options = notice::options();
    let lease = holder.acquire("resubscribe", &options).await?;
    let task = notice::spawn_waiter(&waiter, "resubscribe", &options);
    // Wait until the waiter has subscribed, then cut its subscription connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    while server
        .cli(&["PUBSUB", "NUMSUB", "leasehold:{resubscribe}:released"])?
        .lines()
        .nth(1)
        != Some("1")
    {
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = server.cli(&["CLIENT", "KILL", "TYPE", "pubsub"])?;
    assert_eq!(killed, "1", "exactly the subscription connection is cut");
    // It comes back and subscribes again by itself.
    notice::release_wakes("after a resubscription", lease, task, || {
        let reply = server.cli(&["PUBSUB", "NUMSUB", "leasehold:{resubscribe}:released"])?;
        Ok::<_, leasehold_testkit::TestkitError>(reply.lines().nth(1) == Some("1"))
    })
    .await?;
    Ok(())
}

/// Successful `EVALSHA` calls so far: calls less failed and rejected ones.
fn evalsha_succeeded(
    server: &RedisServer,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    let field = |name: &str| server.info_counter("commandstats", "cmdstat_evalsha", name);
    Ok(field("calls")? - field("failed_calls")? - field("rejected_calls")?)
}

#[tokio::test]
async fn release_to_hands_over_only_while_no_other_connection_listens() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let other = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("release-to")?;
    let ttl = Ttl::parse("10s")?;
    let request = |holder| AcquireRequest::new(key.clone(), holder, ttl);
    let mut holder = HolderId::generate()?;
    assert!(matches!(
        backend.try_acquire(&request(holder)).await?,
        AcquireOutcome::Acquired(_)
    ));

    // Our own single watch does not count as someone else.
    let own = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    let next = HolderId::generate()?;
    let HandoverOutcome::HandedOver(grant) =
        backend.release_to(&key, &holder, &request(next)).await?
    else {
        panic!("not handed over with only our own watch listening");
    };
    assert_eq!(grant.holder, next);
    let renew = |h| RenewRequest::new(key.clone(), h, ttl);
    assert_eq!(backend.renew(&renew(next)).await?, RenewOutcome::Renewed);
    assert_eq!(backend.renew(&renew(holder)).await?, RenewOutcome::Lost);
    let info = backend.inspect(&key).await?.ok_or("the lease is gone")?;
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    // Not ours: nothing happens.
    assert_eq!(
        backend
            .release_to(&key, &holder, &request(HolderId::generate()?))
            .await?,
        HandoverOutcome::NotHeld
    );
    holder = next;

    // A second watch on the same backend (another manager sharing it)
    // counts as someone else: a plain, announced release.
    let mut second = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    assert_eq!(
        backend
            .release_to(&key, &holder, &request(HolderId::generate()?))
            .await?,
        HandoverOutcome::Released
    );
    tokio::time::timeout(Duration::from_secs(5), second.released()).await?;
    assert_eq!(backend.inspect(&key).await?, None);
    drop(second);

    // So does a watch of another backend (another process).
    holder = HolderId::generate()?;
    backend.try_acquire(&request(holder)).await?;
    let mut theirs = other.watch_releases(&key, WatchPolicy::Counted).await?;
    assert_eq!(
        backend
            .release_to(&key, &holder, &request(HolderId::generate()?))
            .await?,
        HandoverOutcome::Released
    );
    tokio::time::timeout(Duration::from_secs(5), theirs.released()).await?;
    assert_eq!(backend.inspect(&key).await?, None);
    drop(own);
    Ok(())
}

#[tokio::test]
async fn a_release_is_heard_only_by_a_listener_elsewhere() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let other = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("heard")?;
    let ttl = Ttl::parse("10s")?;
    let acquired = async |holder| -> TestResult {
        match backend
            .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
            .await?
        {
            AcquireOutcome::Acquired(_) => Ok(()),
            AcquireOutcome::Held(_) => Err("the lease is held".into()),
        }
    };

    // No one listens.
    let holder = HolderId::generate()?;
    acquired(holder).await?;
    assert_eq!(
        backend.release(&key, &holder).await?,
        ReleaseReport::Released { heard: false }
    );
    // Only this backend's own watch listens: not someone else.
    let own = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    let holder = HolderId::generate()?;
    acquired(holder).await?;
    assert_eq!(
        backend.release(&key, &holder).await?,
        ReleaseReport::Released { heard: false }
    );
    // A watch of another backend (another process) hears it.
    let mut theirs = other.watch_releases(&key, WatchPolicy::Counted).await?;
    let holder = HolderId::generate()?;
    acquired(holder).await?;
    assert_eq!(
        backend.release(&key, &holder).await?,
        ReleaseReport::Released { heard: true }
    );
    tokio::time::timeout(Duration::from_secs(5), theirs.released()).await?;
    // Not ours: nothing happens, and no one is told.
    assert_eq!(
        backend.release(&key, &holder).await?,
        ReleaseReport::NotHeld
    );
    drop(own);
    Ok(())
}

/// The key a grant took (a permit's or a share's own), or an error when
/// the attempt was refused.
fn granted_key(
    outcome: AcquireOutcome,
) -> Result<LeaseKey, Box<dyn std::error::Error + Send + Sync>> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant.key),
        AcquireOutcome::Held(holder) => Err(format!("refused, held by {holder:?}").into()),
    }
}

/// A permit's and a write share's release are announced on their
/// semaphore's or read-write lease's channel, and reported heard when a
/// watch of that key elsewhere listens: what makes the releasing manager
/// yield (the watchdog notes the release under that key).
#[tokio::test]
async fn a_permit_or_share_release_is_heard_by_a_listener_of_its_key_elsewhere() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let other = RedisBackend::connect(server.url()).await?;
    let ttl = Ttl::parse("10s")?;
    let limit = PermitLimit::new(2)?;
    let semaphore = LeaseKey::new("heard-permits")?;
    let rw = LeaseKey::new("heard-rw")?;
    // Takes a permit of the semaphore (`permit`) or else the write share of
    // the read-write lease, and gives the key it took.
    let take = async |permit: bool,
                      holder|
           -> Result<LeaseKey, Box<dyn std::error::Error + Send + Sync>> {
        granted_key(if permit {
            let request = AcquireRequest::new(semaphore.clone(), holder, ttl);
            backend.try_acquire_permit(&request, limit).await?
        } else {
            let request = AcquireRequest::new(rw.clone(), holder, ttl);
            backend.try_acquire_write(&request).await?
        })
    };
    for (permit, key) in [(true, &semaphore), (false, &rw)] {
        // No one listens.
        let holder = HolderId::generate()?;
        let taken = take(permit, holder).await?;
        assert_ne!(&taken, key, "a share or permit has a key of its own");
        assert_eq!(
            backend.release(&taken, &holder).await?,
            ReleaseReport::Released { heard: false }
        );
        // A watch of the semaphore or lease elsewhere hears it.
        let mut theirs = other.watch_releases(key, WatchPolicy::Afresh).await?;
        let holder = HolderId::generate()?;
        let taken = take(permit, holder).await?;
        assert_eq!(
            backend.release(&taken, &holder).await?,
            ReleaseReport::Released { heard: true },
            "the release of {taken} was not heard by a watch of {key}"
        );
        within(Duration::from_secs(5), "the notice", theirs.released()).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_handoff_takes_one_script_call() -> TestResult {
    let server = RedisServer::start()?;
    let manager = manager(&server).await?;
    let options = patient("60s", Duration::from_secs(30));
    let holder = manager.acquire("one-call", &options).await?;
    let before_waiter = evalsha_succeeded(&server)?;
    let waiter = {
        let (manager, options) = (manager.clone(), options.clone());
        tokio::spawn(async move { manager.acquire("one-call", &options).await })
    };
    // The waiter is refused twice, before and after it subscribes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while evalsha_succeeded(&server)? < before_waiter + 2 {
        assert!(Instant::now() < deadline, "the waiter never asked");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Its offer is made in process after its last request, so no server-side
    // signal exists for it: give it a moment (a too-short pause would make
    // the release a plain one and fail the count below, never pass wrongly).
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = evalsha_succeeded(&server)?;
    holder.release().await?;
    let lease = tokio::time::timeout(Duration::from_secs(5), waiter).await???;
    let after = evalsha_succeeded(&server)?;
    assert_eq!(
        after - before,
        1,
        "release and acquisition in one script call"
    );
    let info = manager
        .backend()
        .inspect(lease.key())
        .await?
        .ok_or("the lease is gone")?;
    assert_eq!(info.fencing_token, Some(lease.fencing_token()));
    lease.release().await?;
    Ok(())
}

/// Calls of each command since the last `CONFIG RESETSTAT`, as the server
/// counts them (client-sent and script-internal alike).
fn calls(
    server: &RedisServer,
    command: &str,
) -> Result<u64, Box<dyn std::error::Error + Send + Sync>> {
    Ok(server.command_calls(command)?)
}

/// The server's count of a channel's subscribers.
fn subscribers(
    server: &RedisServer,
    channel: &str,
) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    let reply = server.cli(&["PUBSUB", "NUMSUB", channel])?;
    Ok(reply.lines().nth(1).unwrap_or_default().to_owned())
}

#[tokio::test]
async fn a_process_that_waits_again_keeps_its_subscription() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("linger")?;
    let channel = "leasehold:{linger}:released";
    drop(backend.watch_releases(&key, WatchPolicy::Counted).await?);
    // No watch left: the channel stays subscribed on the server.
    assert_eq!(subscribers(&server, channel)?, "1");
    server.cli(&["CONFIG", "RESETSTAT"])?;
    let mut again = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    assert_eq!(
        (calls(&server, "subscribe")?, calls(&server, "unsubscribe")?),
        (0, 0),
        "a second wait for the same key subscribes anew"
    );
    assert_eq!(subscribers(&server, channel)?, "1");
    // And the lingering subscription still delivers notices.
    let other = RedisBackend::connect(server.url()).await?;
    let holder = HolderId::generate()?;
    let request = AcquireRequest::new(key.clone(), holder, Ttl::parse("10s")?);
    assert!(matches!(
        other.try_acquire(&request).await?,
        AcquireOutcome::Acquired(_)
    ));
    other.release(&key, &holder).await?;
    within(Duration::from_secs(5), "the notice", again.released()).await;
    drop(again);
    // Watching another key unsubscribes the one no one watches.
    let _elsewhere = backend
        .watch_releases(&LeaseKey::new("elsewhere")?, WatchPolicy::Counted)
        .await?;
    assert_eq!(subscribers(&server, channel)?, "0");
    Ok(())
}

/// Watching one lingering channel again, with a round trip or without,
/// leaves the others lingering, to be sent away by the next subscription:
/// none stays subscribed for good.
#[tokio::test]
async fn watching_a_lingering_channel_again_leaves_the_others_to_be_sent_away() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let channel = |key: &str| format!("leasehold:{{{key}}}:released");
    for (policy, [a, b, c]) in [
        (
            WatchPolicy::Counted,
            ["counted-a", "counted-b", "counted-c"],
        ),
        (
            WatchPolicy::AlreadyListening,
            ["listening-a", "listening-b", "listening-c"],
        ),
    ] {
        let both = (
            backend
                .watch_releases(&LeaseKey::new(a)?, WatchPolicy::Counted)
                .await?,
            backend
                .watch_releases(&LeaseKey::new(b)?, WatchPolicy::Counted)
                .await?,
        );
        drop(both);
        // Both linger, subscribed with no watch.
        assert_eq!(subscribers(&server, &channel(a))?, "1");
        assert_eq!(subscribers(&server, &channel(b))?, "1");
        let again = backend.watch_releases(&LeaseKey::new(a)?, policy).await?;
        assert!(
            again.is_supported(),
            "{policy:?}: {a} is not listened to any more"
        );
        let _other = backend
            .watch_releases(&LeaseKey::new(c)?, WatchPolicy::Counted)
            .await?;
        assert_eq!(
            subscribers(&server, &channel(b))?,
            "0",
            "{policy:?}: {b} stayed subscribed with no watch"
        );
        assert_eq!(subscribers(&server, &channel(a))?, "1", "{policy:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_process_does_not_hear_its_own_release_while_no_waiter_listens() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let other = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("own")?;
    let ttl = Ttl::parse("10s")?;
    // A wait here ended: the channel lingers with no watch.
    drop(backend.watch_releases(&key, WatchPolicy::Counted).await?);
    let ours = HolderId::generate()?;
    assert!(matches!(
        backend
            .try_acquire(&AcquireRequest::new(key.clone(), ours, ttl))
            .await?,
        AcquireOutcome::Acquired(_)
    ));
    // Someone elsewhere listens, so the release is announced; a wait here
    // that starts while the notice is on its way (joined after the release
    // is sent, so its watch exists before the notice can arrive) must not
    // take it for the next holder's release.
    let mut theirs = other.watch_releases(&key, WatchPolicy::Counted).await?;
    let (released, next) = tokio::join!(
        backend.release(&key, &ours),
        backend.watch_releases(&key, WatchPolicy::Counted)
    );
    assert_eq!(released?, ReleaseReport::Released { heard: true });
    let mut next = next?;
    // The other process's watch shows the notice went out; ours would
    // have it within milliseconds.
    within(Duration::from_secs(5), "their notice", theirs.released()).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), next.released())
            .await
            .is_err(),
        "the process heard its own release"
    );
    // The next release, by someone else, is heard.
    let theirs_holder = HolderId::generate()?;
    other
        .try_acquire(&AcquireRequest::new(key.clone(), theirs_holder, ttl))
        .await?;
    other.release(&key, &theirs_holder).await?;
    within(Duration::from_secs(5), "the next notice", next.released()).await;
    Ok(())
}

/// The other side of the rule above: while a watch here listens, this
/// process's own release is announced to it like anyone's (a waiter here
/// for a lease a task here holds), though no one elsewhere heard it.
#[tokio::test]
async fn a_watch_here_hears_a_release_here() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("heard-here")?;
    let ttl = Ttl::parse("10s")?;
    let mut watch = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    let holder = HolderId::generate()?;
    assert!(matches!(
        backend
            .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
            .await?,
        AcquireOutcome::Acquired(_)
    ));
    assert_eq!(
        backend.release(&key, &holder).await?,
        ReleaseReport::Released { heard: false }
    );
    within(Duration::from_secs(5), "the notice here", watch.released()).await;
    Ok(())
}

/// Waiters that race on each notice (permits, shares) must not be told
/// last forever: Redis 7.0 tells a channel's subscribers in the order they
/// subscribed, so a process whose channel lingers from an earlier wait
/// would stay ahead of those that subscribed after it and win nearly every
/// race. Their watch subscribes a lingering channel again, at the end of
/// that order, and leaves one that a waiter of its process listens on as it
/// is. The server's own command counts are the witness.
#[tokio::test]
async fn a_racing_waiter_subscribes_its_lingering_channel_afresh() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("afresh")?;
    let channel = "leasehold:{afresh}:released";
    drop(backend.watch_releases(&key, WatchPolicy::Afresh).await?);
    assert_eq!(subscribers(&server, channel)?, "1", "the channel lingers");
    server.cli(&["CONFIG", "RESETSTAT"])?;
    let mut first = backend.watch_releases(&key, WatchPolicy::Afresh).await?;
    assert_eq!(
        (calls(&server, "unsubscribe")?, calls(&server, "subscribe")?),
        (1, 1),
        "the lingering channel is subscribed again"
    );
    assert_eq!(subscribers(&server, channel)?, "1");
    let mut second = backend.watch_releases(&key, WatchPolicy::Afresh).await?;
    assert_eq!(
        (calls(&server, "unsubscribe")?, calls(&server, "subscribe")?),
        (1, 1),
        "a channel a waiter here listens on is left as it is"
    );
    // Both hear the next release.
    let other = RedisBackend::connect(server.url()).await?;
    let holder = HolderId::generate()?;
    let request = AcquireRequest::new(key.clone(), holder, Ttl::parse("10s")?);
    assert!(matches!(
        other.try_acquire(&request).await?,
        AcquireOutcome::Acquired(_)
    ));
    other.release(&key, &holder).await?;
    within(
        Duration::from_secs(5),
        "the first watch's notice",
        first.released(),
    )
    .await;
    within(
        Duration::from_secs(5),
        "the second watch's notice",
        second.released(),
    )
    .await;
    Ok(())
}

/// While a waiter of this process subscribes its lingering channel afresh,
/// a release here still counts that subscription as the process's own: no
/// one else listens, so the release is not heard (which would make this
/// process's next acquisition yield for nothing). Through a proxy that
/// holds every request and every reply 600 ms, the release is sent after
/// the server took the new `SUBSCRIBE` and before its reply arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_resubscription_here_is_not_heard() -> TestResult {
    let server = RedisServer::start()?;
    let link = Proxy::start(server.addr()).await?;
    // Replies 1.2 s after their requests: well within the operation timeout.
    let backend = RedisBackend::builder(link.url())
        .op_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    let semaphore = LeaseKey::new("resub")?;
    let channel = "leasehold:{resub}:released";
    let take = async |holder| -> Result<LeaseKey, Box<dyn std::error::Error + Send + Sync>> {
        let request = AcquireRequest::new(semaphore.clone(), holder, Ttl::parse("30s")?);
        granted_key(
            backend
                .try_acquire_permit(&request, PermitLimit::new(1)?)
                .await?,
        )
    };
    // One release first, so that the script is loaded before the delay.
    let holder = HolderId::generate()?;
    let permit = take(holder).await?;
    backend.release(&permit, &holder).await?;
    let holder = HolderId::generate()?;
    let permit = take(holder).await?;
    drop(
        backend
            .watch_releases(&semaphore, WatchPolicy::Afresh)
            .await?,
    );
    assert_eq!(subscribers(&server, channel)?, "1", "the channel lingers");
    server.cli(&["CONFIG", "RESETSTAT"])?;
    link.set_mode(ProxyMode::Delay(Duration::from_millis(600)));
    let watching = backend.clone();
    let watched = semaphore.clone();
    let resubscribing =
        tokio::spawn(async move { watching.watch_releases(&watched, WatchPolicy::Afresh).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while calls(&server, "subscribe")? == 0 {
        assert!(Instant::now() < deadline, "no SUBSCRIBE reached the server");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(
        !resubscribing.is_finished(),
        "the SUBSCRIBE's reply came before the release was sent"
    );
    let heard = backend.release(&permit, &holder).await?;
    assert_eq!(
        heard,
        ReleaseReport::Released { heard: false },
        "a release here was heard, with only this process subscribed"
    );
    within(Duration::from_secs(10), "the resubscription", resubscribing).await??;
    assert_eq!(subscribers(&server, channel)?, "1");
    Ok(())
}

/// Through the manager: a permit's waiter, which races the waiters of other
/// processes, subscribes afresh on each wait; an exclusive lease's waiter,
/// whose turn is counted rather than raced, keeps its lingering channel
/// and sends nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_waiters_subscribe_afresh_and_lease_waiters_keep_their_channel() -> TestResult {
    let server = RedisServer::start()?;
    let waiter = manager(&server).await?;
    let other = manager(&server).await?;
    // Only the release notice wakes the waiter: its poll is a minute away.
    let options = patient("10s", Duration::from_secs(60));
    let limit = PermitLimit::new(1)?;
    let mut seen = Vec::new();
    for permit in [true, true, false, false] {
        let held = if permit {
            other.acquire_permit("jobs", limit, &options).await?
        } else {
            other.acquire("batch", &options).await?
        };
        server.cli(&["CONFIG", "RESETSTAT"])?;
        let wait = tokio::spawn({
            let (waiter, options) = (waiter.clone(), options.clone());
            async move {
                if permit {
                    waiter.acquire_permit("jobs", limit, &options).await
                } else {
                    waiter.acquire("batch", &options).await
                }
            }
        });
        // Released once the waiter was refused (its attempt is the first
        // script the server ran since the reset), so that it subscribes.
        within(
            Duration::from_secs(5),
            "the waiter's first attempt",
            async {
                while calls(&server, "evalsha")? == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            },
        )
        .await?;
        held.release().await?;
        let lease = within(Duration::from_secs(10), "the waiter's grant", wait).await??;
        lease.release().await?;
        seen.push((
            permit,
            calls(&server, "unsubscribe")?,
            calls(&server, "subscribe")?,
        ));
    }
    assert_eq!(
        seen,
        [(true, 0, 1), (true, 1, 1), (false, 1, 1), (false, 0, 0)],
        "(permit, UNSUBSCRIBE, SUBSCRIBE) per wait: a permit's second wait subscribes its channel again; a lease's second wait sends nothing (its first unsubscribes the semaphore's lingering channel)"
    );
    Ok(())
}

/// Four managers (processes) of one worker each take one key in turns:
/// after a release only the process whose turn it is asks for the lease,
/// so refused attempts stay well under one per acquisition (every waiting
/// process tried after every release before: three per acquisition here),
/// and no process subscribes more than once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_leads_to_about_one_attempt_across_processes() -> TestResult {
    let server = RedisServer::start()?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("10s")?)
        .wait(Duration::from_secs(30))
        .build()?;
    const MANAGERS: usize = 4;
    const ROUNDS: usize = 100;
    let mut managers = Vec::new();
    for _ in 0..MANAGERS {
        managers.push(manager(&server).await?);
    }
    server.cli(&["CONFIG", "RESETSTAT"])?;
    let acquired = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for manager in managers {
        let (options, acquired) = (options.clone(), Arc::clone(&acquired));
        tasks.push(tokio::spawn(async move {
            while acquired.load(Ordering::SeqCst) < ROUNDS * MANAGERS {
                let lease = manager.acquire("turns", &options).await?;
                acquired.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                lease.release().await?;
            }
            tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
                .await
                .map_err(|_| "a manager's shutdown did not end within 10 s")?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(120), "a worker", task).await??;
    }
    let acquisitions = acquired.load(Ordering::SeqCst) as u64;
    // One script call per acquisition and one per release; the rest were
    // refused.
    let refused = evalsha_succeeded(&server)?.saturating_sub(2 * acquisitions);
    let subscribed = calls(&server, "subscribe")?;
    println!("{acquisitions} acquisitions, {refused} refused attempts, {subscribed} SUBSCRIBEs");
    assert!(
        refused * 2 <= acquisitions,
        "{refused} refused attempts for {acquisitions} acquisitions"
    );
    assert!(subscribed <= MANAGERS as u64, "{subscribed} SUBSCRIBEs");
    Ok(())
}
