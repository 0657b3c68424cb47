//! The lease spine end to end on a real `redis-server` started by the testkit.

#[path = "common/server_clock.rs"]
#[allow(dead_code)] // this file uses part of it
mod server_clock;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, HolderId, LeaseBackend, RenewOutcome, RenewRequest,
};
use leasehold::redis::{ConnectError, RedisBackend};
use leasehold::{
    LeaseError, LeaseKey, LeaseManager, LeaseOptions, LossReason, ReleaseOutcome, Ttl,
};
use leasehold_testkit::RedisServer;
use server_clock::{Monitor, ms_after};
use tokio::time::{Instant, timeout};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn backend(server: &RedisServer) -> Result<RedisBackend, ConnectError> {
    RedisBackend::builder(server.url())
        .op_timeout(Duration::from_millis(250))
        .connect()
        .await
}

fn opts(ttl: &str, wait: Option<Duration>) -> LeaseOptions {
    let b = LeaseOptions::builder().ttl(Ttl::parse(ttl).expect("valid ttl"));
    match wait {
        Some(w) => b.wait(w),
        None => b,
    }
    .build()
    .expect("valid options")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_contenders_never_overlap_and_all_get_the_lease() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let mut managers = Vec::new();
    for _ in 0..4 {
        managers.push(LeaseManager::new(backend(&server).await?)?);
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let manager = managers[i % managers.len()].clone();
        let (holders, most) = (Arc::clone(&holders), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let lease = manager
                .acquire("contended", &opts("2s", Some(Duration::from_secs(60))))
                .await?;
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            let token = lease.fencing_token();
            assert_eq!(lease.release().await?, ReleaseOutcome::Released);
            Ok::<_, LeaseError>(token)
        }));
    }
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.push(task.await??);
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two tasks held the lease at once"
    );
    assert_eq!(tokens.len(), 32, "every task got the lease");
    tokens.sort();
    tokens.dedup();
    assert_eq!(
        tokens.len(),
        32,
        "every acquisition had its own fencing token"
    );
    Ok(())
}

#[tokio::test]
async fn a_one_second_lease_is_held_for_five_seconds_by_renewals() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(backend(&server).await?)?;
    let lease = manager.acquire("long-job", &opts("1s", None)).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(lease.loss_reason(), None);
    assert!(
        lease.renewals() >= 12,
        "only {} renewals in 5 s",
        lease.renewals()
    );
    let key = LeaseKey::new("long-job")?;
    let info = manager
        .backend()
        .inspect(&key)
        .await?
        .ok_or("the lease vanished")?;
    assert_eq!(info.fencing_token, Some(lease.fencing_token()));
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    assert_eq!(manager.backend().inspect(&key).await?, None);
    Ok(())
}

#[tokio::test]
async fn a_lease_deleted_or_overwritten_behind_the_holders_back_is_lost_within_a_renew_interval()
-> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(backend(&server).await?)?;
    let options = opts("1s", None);
    let allowed = options.renew_interval() + Duration::from_millis(150);
    // The connection that renews tracks the lease from its grant (client
    // tracking, docs/design.md): the server pushes an invalidation while
    // it runs the change, before it answers it, and the holder ends the
    // lease on it. So the token fires within one loopback hop plus the
    // scheduling of the notice and watchdog tasks on a loaded 2-core
    // machine (50 ms, the campaigns' allowance), measured 0.2–2 ms. The
    // change comes 50 ms after the grant, so the next renewal (the only
    // other way to learn of it) is a renew interval less 50 ms away:
    // 283 ms here, far outside this bound.
    let notice_bound = Duration::from_millis(50);
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    for (key, sabotage) in [
        ("deleted", vec!["DEL", "leasehold:{deleted}"]),
        (
            "overwritten",
            vec!["SET", "leasehold:{overwritten}", "someone-else"],
        ),
    ] {
        let lease = manager.acquire(key, &options).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let at = Instant::now();
        let mut change = redis::cmd(sabotage[0]);
        for arg in &sabotage[1..] {
            change.arg(*arg);
        }
        timeout(
            Duration::from_secs(5),
            change.query_async::<redis::Value>(&mut side),
        )
        .await??;
        assert_eq!(
            timeout(Duration::from_secs(5), lease.lost()).await?,
            LossReason::Lost
        );
        let took = at.elapsed();
        println!("{key}: token fired {took:?} after the change (allowed {notice_bound:?})");
        assert!(
            took <= allowed && took <= notice_bound,
            "{key}: token fired {took:?} after the change: not at once (within {notice_bound:?}) as client tracking reports it; the next renewal was {:?} away",
            options.renew_interval() - Duration::from_millis(50)
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_paused_server_fires_the_deadline_before_the_lease_can_expire() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let mut server = RedisServer::start()?;
    let monitor = Monitor::start(server.addr()).await?;
    let manager = LeaseManager::new(backend(&server).await?)?;
    let options = opts("1s", None);
    let ttl = options.ttl().get();
    let lease = manager.acquire("paused", &options).await?;
    // Let two renewals run on the server first.
    monitor
        .wait_for(Duration::from_secs(5), 2, |e| {
            e.renews("leasehold:{paused}")
        })
        .await?;
    let first_token = lease.fencing_token();
    server.pause()?;
    let reason = timeout(Duration::from_secs(5), lease.lost()).await?;
    let fired = SystemTime::now();
    let resumed = SystemTime::now();
    server.resume()?;
    assert_eq!(reason, LossReason::Deadline);
    // The server's own record: the last ttl it gave the lease before the
    // pause, and so the earliest moment it can expire it.
    monitor.sync().await?;
    let applied = monitor
        .last_ttl_set("leasehold:{paused}", resumed)
        .ok_or("the server never gave the lease a ttl")?;
    let earliest_expiry = applied.earliest_expiry(ttl);
    let margin = ms_after(earliest_expiry, fired);
    // The promise is the safety margin plus the drift allowance. Slack:
    // the deadline timer's lateness and this task's wake-up on a loaded
    // two-core machine, 30 ms (serial runs here: the margin falls 1–5 ms
    // short of the promise).
    let promised = options.safety_margin() + leasehold::backend::clock_drift(ttl);
    let least = promised.saturating_sub(Duration::from_millis(30));
    assert!(
        margin >= least.as_secs_f64() * 1e3,
        "token fired {margin:.1} ms before the server could expire the lease: less than {least:?} of the {promised:?} promised"
    );
    println!(
        "SIGSTOP: token fired {margin:.1} ms before the server could expire the lease (promised {promised:?})"
    );

    // After SIGCONT the same manager works again, and late replies to the
    // requests queued during the pause are not taken for newer answers.
    drop(lease);
    let again = manager
        .acquire("paused", &opts("1s", Some(Duration::from_secs(5))))
        .await?;
    assert!(again.fencing_token() > first_token);
    let info = manager
        .backend()
        .inspect(&LeaseKey::new("paused")?)
        .await?
        .ok_or("lease missing")?;
    assert_eq!(info.fencing_token, Some(again.fencing_token()));
    timeout(Duration::from_secs(5), async {
        while again.renewals() < 3 {
            assert_eq!(again.loss_reason(), None);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await?;
    assert_eq!(again.release().await?, ReleaseOutcome::Released);
    Ok(())
}

#[tokio::test]
async fn only_the_holder_can_renew_or_release() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let backend = backend(&server).await?;
    let key = LeaseKey::new("mine")?;
    let ttl = Ttl::parse("10s")?;
    let (owner, intruder) = (HolderId::generate()?, HolderId::generate()?);
    let AcquireOutcome::Acquired(grant) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), owner, ttl))
        .await?
    else {
        return Err("a free key must be acquired".into());
    };
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), intruder, ttl))
            .await?,
        RenewOutcome::Lost
    );
    assert_eq!(
        backend.release(&key, &intruder).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    let info = backend
        .inspect(&key)
        .await?
        .ok_or("the intruder removed the lease")?;
    assert_eq!(info.fencing_token, Some(grant.fencing_token));
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), owner, ttl))
            .await?,
        RenewOutcome::Renewed
    );
    assert_eq!(
        backend.release(&key, &owner).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_over_a_thousand_acquisitions() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(backend(&server).await?)?;
    let options = opts("10s", None);
    let mut last = None;
    for _ in 0..1000 {
        let lease = manager.acquire("fenced", &options).await?;
        let token = lease.fencing_token();
        assert!(last < Some(token), "token {token} after {last:?}");
        last = Some(token);
        assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    }
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_the_documented_errors() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    use leasehold::InputError;
    for key in ["", "line\nbreak", &"k".repeat(LeaseKey::MAX_LEN + 1)] {
        assert!(
            matches!(LeaseKey::new(key), Err(InputError::InvalidKey { .. })),
            "{key:?}"
        );
    }
    for ttl in ["0s", "99ms", "25h", "1s 500us"] {
        assert!(
            matches!(Ttl::parse(ttl), Err(InputError::InvalidTtl { .. })),
            "{ttl:?}"
        );
    }
    for ttl in ["", "ten seconds", "5", "-1s"] {
        assert!(
            matches!(Ttl::parse(ttl), Err(InputError::InvalidDuration { .. })),
            "{ttl:?}"
        );
    }
    for url in [
        "http://localhost:6379",
        "not a url",
        "redis://:hunter2@localhost:99999",
    ] {
        match RedisBackend::connect(url).await {
            Err(e @ ConnectError::InvalidUrl { .. }) => {
                assert!(!e.to_string().contains("hunter2"), "{e}")
            }
            Err(other) => return Err(format!("{url}: expected InvalidUrl, got {other}").into()),
            Ok(_) => return Err(format!("{url}: connected").into()),
        }
    }
    // A manager refuses a bad key before talking to the server.
    let server = RedisServer::start()?;
    let manager = LeaseManager::new(backend(&server).await?)?;
    assert!(matches!(
        manager
            .acquire("bad\u{7}key", &LeaseOptions::default())
            .await,
        Err(LeaseError::Invalid(InputError::InvalidKey { .. }))
    ));
    Ok(())
}
