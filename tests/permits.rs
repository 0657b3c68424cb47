//! Counting leases through the manager on a real `redis-server`, judged by
//! the server's own state read on a side connection: the permit keys that
//! exist, and their PTTL.

#[path = "common/holders.rs"]
mod holders;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::backend::PermitBackend;
use leasehold::redis::RedisBackend;
use leasehold::redis::redis::AsyncCommands;
use leasehold::{Backoff, LeaseManager, LeaseOptions, PermitLimit, Ttl};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

use holders::{Error, crash_holding, manager, side, stored, within};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn options(ttl: &str, wait: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .wait(wait)
        .backoff(Backoff::fixed(Duration::from_millis(500)))
        .build()
        .expect("valid options")
}

/// 32 contenders on 8 managers share the 4 permits of one semaphore. While
/// each holds its permit, it checks in with the server: its own permit key
/// exists, and the server has at most 4 permit keys; and at most 4
/// contenders believe they hold a permit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_contenders_never_exceed_four_permits() -> TestResult {
    const LIMIT: u32 = 4;
    let server = RedisServer::start()?;
    let mut managers = Vec::new();
    for _ in 0..8 {
        managers.push(manager(&server).await?);
    }
    // Holders outlive the ttl: only renewal keeps their permits.
    let options = options("600ms", Duration::from_secs(60));
    let believing = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32 {
        let manager = managers[i % managers.len()].clone();
        let mut side = side(&server).await?;
        let options = options.clone();
        let (believing, most) = (Arc::clone(&believing), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let limit = PermitLimit::new(LIMIT)?;
            for round in 0..2u64 {
                let permit = manager.acquire_permit("jobs", limit, &options).await?;
                let now = believing.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(
                    now <= LIMIT as usize,
                    "{now} contenders believe they hold a permit"
                );
                let mine: bool = side.exists(stored(&permit.server_key())).await?;
                assert!(mine, "{} is not on the server", permit.server_key());
                let keys: Vec<String> = side.keys("leasehold:{jobs}:permit:*").await?;
                assert!(
                    keys.len() <= LIMIT as usize,
                    "permit keys on the server: {keys:?}"
                );
                tokio::time::sleep(Duration::from_millis(
                    if (i as u64 + round).is_multiple_of(4) {
                        900
                    } else {
                        20
                    },
                ))
                .await;
                assert_eq!(permit.loss_reason(), None, "a holder lost its permit");
                believing.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(120), "a contender", task).await??;
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT as usize,
        "the permits were shared"
    );
    let mut side = side(&server).await?;
    let left: Vec<String> = side.keys("leasehold:{jobs}:permit:*").await?;
    assert!(left.is_empty(), "permits left behind: {left:?}");
    Ok(())
}

/// A holder whose process dies (its runtime, and with it its watchdog,
/// gone without a release) keeps its permit on the server until the ttl
/// runs out, no longer; then a waiter elsewhere gets that permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_frees_at_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let permit_key = crash_holding(&server, async |manager| {
        let limit = PermitLimit::new(1)?;
        Ok(manager
            .acquire_permit("crash", limit, &options("2s", Duration::ZERO))
            .await?)
    })?;
    let crashed_at = Instant::now();
    let mut side = side(&server).await?;
    let pttl: i64 = side.pttl(&permit_key).await?;
    assert!(
        pttl > 0 && pttl <= 2000,
        "PTTL right after the crash: {pttl}"
    );
    let waiter = manager(&server).await?;
    let got = within(
        Duration::from_secs(20),
        "the waiter",
        waiter.acquire_permit(
            "crash",
            PermitLimit::new(1)?,
            &options("5s", Duration::from_secs(15)),
        ),
    )
    .await?;
    let waited = crashed_at.elapsed();
    assert_eq!(stored(&got.server_key()), permit_key);
    // Free no later than the ttl (plus the waiter's poll) after the crash,
    // and not before the PTTL the server gave it.
    assert!(
        waited >= Duration::from_millis(u64::try_from(pttl)? - 50),
        "waited {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2000 + 700),
        "waited {waited:?}"
    );
    got.release().await?;
    let exists: bool = side.exists(&permit_key).await?;
    assert!(!exists);
    Ok(())
}

/// The watchdog renews a permit: three ttls on, its key is still on the
/// server with a live PTTL, never having run out in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_renewed_past_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let manager = manager(&server).await?;
    let permit = manager
        .acquire_permit(
            "renewed",
            PermitLimit::new(3)?,
            &options("900ms", Duration::ZERO),
        )
        .await?;
    let key = stored(&permit.server_key());
    let mut side = side(&server).await?;
    let until = Instant::now() + Duration::from_millis(2700);
    let mut samples = 0;
    while Instant::now() < until {
        let pttl: i64 = side.pttl(&key).await?;
        assert!(pttl > 0, "PTTL of {key} after {samples} samples: {pttl}");
        samples += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pttl: i64 = side.pttl(&key).await?;
    assert!(pttl > 0, "PTTL of {key} after three ttls: {pttl}");
    assert!(permit.renewals() >= 3, "renewals: {}", permit.renewals());
    assert_eq!(permit.loss_reason(), None);
    permit.release().await?;
    Ok(())
}

/// Redlock has no permits: the manager says so at once, with what to use
/// instead, rather than retrying for the whole wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_permits_at_once() -> TestResult {
    let masters = [
        RedisServer::start()?,
        RedisServer::start()?,
        RedisServer::start()?,
    ];
    let backend = leasehold::redis::RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    let manager = LeaseManager::new(backend)?;
    let started = Instant::now();
    let error = within(
        Duration::from_secs(30),
        "the refusal",
        manager.acquire_permit(
            "jobs",
            PermitLimit::new(2)?,
            &options("5s", Duration::from_secs(20)),
        ),
    )
    .await
    .expect_err("Redlock has no permits");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            &error,
            leasehold::LeaseError::Backend(leasehold::backend::BackendError::Unsupported { .. })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("use a standalone"), "{error}");
    for master in &masters {
        assert_eq!(
            master.cli(&["DBSIZE"])?.trim(),
            "0",
            "something was written"
        );
    }
    Ok(())
}

/// A try whose reply is late (the link is slow, the operation times out)
/// may still have taken a permit on the server. Giving up then releases it
/// for its holder, whichever permit it was: the server's permit keys are
/// seen to appear, then to go long before the 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_given_up_after_a_late_reply_releases_its_permit() -> TestResult {
    let server = RedisServer::start()?;
    let link = leasehold_testkit::Proxy::start(server.addr()).await?;
    let backend = RedisBackend::builder(link.url())
        .op_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    let slow = LeaseManager::new(backend)?;
    let mut side = side(&server).await?;
    // Two permits held elsewhere, so the late one is permit 2.
    let others = manager(&server).await?;
    let limit = PermitLimit::new(3)?;
    let _a = others
        .acquire_permit("late", limit, &options("30s", Duration::ZERO))
        .await?;
    let _b = others
        .acquire_permit("late", limit, &options("30s", Duration::ZERO))
        .await?;
    // The server has the release scripts now, the one-lease script and the
    // batch one (a lone release goes alone; releases in flight together,
    // as the late try's three are, share one call): they run as their
    // first EVALSHA, with no round trip to load a script over the slow link.
    let loaded = others
        .acquire_permit("late", limit, &options("30s", Duration::ZERO))
        .await?;
    loaded.release().await?;
    let primer = options("30s", Duration::ZERO);
    let (p1, p2, p3) = tokio::try_join!(
        others.acquire("primer-1", &primer),
        others.acquire("primer-2", &primer),
        others.acquire("primer-3", &primer),
    )?;
    let (r1, r2, r3) = tokio::join!(p1.release(), p2.release(), p3.release());
    r1?;
    r2?;
    r3?;
    // Each way 500 ms: the request reaches the server after the 300 ms
    // timeout, and is carried out there.
    link.set_mode(leasehold_testkit::ProxyMode::Delay(Duration::from_millis(
        500,
    )));
    let error = slow
        .acquire_permit("late", limit, &options("30s", Duration::ZERO))
        .await
        .expect_err("the reply comes after the timeout");
    assert!(
        matches!(error, leasehold::LeaseError::Backend(_)),
        "{error:?}"
    );
    let late = "leasehold:{late}:permit:2";
    within(
        Duration::from_secs(5),
        "the late permit on the server",
        async {
            while !side.exists::<_, bool>(late).await.unwrap_or(false) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    within(
        Duration::from_secs(10),
        "the late permit's release",
        async {
            while side.exists::<_, bool>(late).await.unwrap_or(true) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    // Only the late try's own permit went.
    let keys: Vec<String> = side.keys("leasehold:{late}:permit:*").await?;
    assert_eq!(keys.len(), 2, "{keys:?}");
    Ok(())
}

/// On Redis 7.0 a permit's grant tracks every permit key of its semaphore
/// (a read in a script tracks every key the call names), so each other
/// holder's next write to one is reported to this manager as a change of a
/// lease it does not hold. Those reports are no sign of a full tracking
/// table: a manager holding a permit of each of 20 semaphores of 100, while
/// 1980 others are taken beside it, keeps tracking on, and so still learns
/// at once that one of its permits was deleted on the server, long before
/// its next renewal (10 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_holders_permits_are_no_tracking_storm() -> TestResult {
    const SEMAPHORES: usize = 20;
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let holder = LeaseManager::new(backend.clone())?;
    let limit = PermitLimit::new(PermitLimit::MAX)?;
    let mut held = Vec::new();
    for s in 0..SEMAPHORES {
        held.push(
            holder
                .acquire_permit(format!("storm{s}"), limit, &options("30s", Duration::ZERO))
                .await?,
        );
    }
    assert!(backend.tracks_lease_changes(), "tracking was never on");

    // Every other permit, taken at once by holders that track nothing.
    let others = RedisBackend::builder(server.url())
        .track_lease_changes(false)
        .connect()
        .await?;
    let ttl = Ttl::parse("30s")?;
    let mut takes = Vec::new();
    for s in 0..SEMAPHORES {
        for _ in 1..PermitLimit::MAX {
            let others = others.clone();
            let key = leasehold::LeaseKey::new(format!("storm{s}"))?;
            takes.push(tokio::spawn(async move {
                let request = leasehold::backend::AcquireRequest::new(
                    key,
                    leasehold::backend::HolderId::generate()?,
                    ttl,
                );
                Ok::<_, Error>(others.try_acquire_permit(&request, limit).await?)
            }));
        }
    }
    for take in takes {
        let taken = within(Duration::from_secs(30), "another holder's permit", take).await??;
        assert!(
            matches!(taken, leasehold::backend::AcquireOutcome::Acquired(_)),
            "{taken:?}"
        );
    }
    let mut side = side(&server).await?;
    let keys: Vec<String> = side.keys("leasehold:{storm*}:permit:*").await?;
    assert_eq!(keys.len(), SEMAPHORES * PermitLimit::MAX as usize);

    // The backend's own view first, to say why if the next check fails.
    assert!(
        backend.tracks_lease_changes(),
        "tracking was turned off by reports of permits this manager does not hold"
    );
    // One of its permits deleted behind its back: told at once.
    let lease = held.pop().ok_or("no permit held")?;
    let deleted: bool = side.del(stored(&lease.server_key())).await?;
    assert!(deleted);
    within(
        Duration::from_secs(2),
        "the deleted permit's token",
        lease.token().cancelled(),
    )
    .await;
    Ok(())
}
