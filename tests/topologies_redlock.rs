//! Redlock over independent masters started by the testkit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, RenewOutcome,
    RenewRequest,
};
use leasehold::redis::{ConnectError, KeyLayout, RedisBackend, RedlockBackend};
use leasehold::{LeaseError, LeaseKey, LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
use leasehold_testkit::{RedisServer, independent_masters};

#[path = "common/notice.rs"]
mod notice;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`, so that a broken mechanism fails the test instead of
/// hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

async fn redlock(masters: &[RedisServer]) -> Result<RedlockBackend, ConnectError> {
    RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .node_timeout(Duration::from_millis(100))
        .connect()
        .await
}

async fn try_acquire(
    backend: &RedlockBackend,
    key: &str,
) -> Result<AcquireOutcome, Box<dyn std::error::Error>> {
    let request = AcquireRequest::new(
        LeaseKey::new(key)?,
        HolderId::generate()?,
        Ttl::parse("5s")?,
    );
    Ok(backend.try_acquire(&request).await?)
}

/// Whether a master holds the lease `key` (in the default namespace).
fn holds(master: &RedisServer, key: &str) -> Result<bool, Box<dyn std::error::Error>> {
    let stored = KeyLayout::default().lease(&LeaseKey::new(key)?);
    Ok(master.cli(&["EXISTS", &stored])? == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_need_a_majority_of_masters() -> TestResult {
    let started = std::time::Instant::now();
    let mut masters = independent_masters(3)?;
    println!("3 independent masters set up in {:?}", started.elapsed());
    let backend = redlock(&masters).await?;
    assert_eq!(backend.quorum(), 2);

    let AcquireOutcome::Acquired(all_up) = try_acquire(&backend, "all-up").await? else {
        return Err("not acquired with every master up".into());
    };
    for master in &masters {
        assert!(holds(master, "all-up")?);
    }
    let drift = leasehold::backend::clock_drift(all_up.ttl.get());
    assert_eq!(
        all_up.valid_until,
        all_up.sent_at + all_up.ttl.get() - drift
    );

    masters[0].kill()?;
    assert!(matches!(
        try_acquire(&backend, "one-down").await?,
        AcquireOutcome::Acquired(_)
    ));
    masters[1].pause()?;
    let sent = tokio::time::Instant::now();
    let err = try_acquire(&backend, "two-down")
        .await
        .err()
        .ok_or("acquired with two of three masters down")?;
    let took = sent.elapsed();
    println!("with two masters down: {err} (after {took:?})");
    let err = err.downcast::<BackendError>().map_err(|e| format!("{e}"))?;
    assert!(matches!(*err, BackendError::Unavailable { .. }) && err.is_transient());
    assert!(
        took < Duration::from_secs(1),
        "a failed attempt took {took:?}"
    );
    assert!(
        !holds(&masters[2], "two-down")?,
        "the failed attempt was released on the master that granted it"
    );

    masters[1].resume()?;
    assert!(matches!(
        try_acquire(&backend, "one-paused-again").await?,
        AcquireOutcome::Acquired(_)
    ));
    masters[1].pause()?;
    masters[0].restart()?;
    // The first call to the restarted master finds its old connection
    // broken and reconnects; the watchdog retries such transient errors too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let one_paused = loop {
        match try_acquire(&backend, "one-paused").await {
            Err(e)
                if tokio::time::Instant::now() < deadline
                    && e.downcast_ref::<BackendError>()
                        .is_some_and(BackendError::is_transient) => {}
            other => break other?,
        }
    };
    assert!(
        matches!(one_paused, AcquireOutcome::Acquired(_)),
        "{one_paused:?}"
    );
    assert!(holds(&masters[0], "one-paused")? && holds(&masters[2], "one-paused")?);
    masters[1].resume()?;

    // Someone else's lease on a majority: Held, and nothing of ours is left behind.
    assert!(matches!(
        try_acquire(&backend, "all-up").await?,
        AcquireOutcome::Held(_)
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_minority_does_not_stall_renewals() -> TestResult {
    let mut masters = independent_masters(3)?;
    let manager = LeaseManager::new(redlock(&masters).await?)?;
    let options = LeaseOptions::builder().ttl(Ttl::parse("1s")?).build()?;
    let lease = manager.acquire("steady", &options).await?;
    masters[2].pause()?;
    let paused_at = tokio::time::Instant::now();
    let before = lease.renewals();
    // Three ttls with one master frozen: the lease must never be let go.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        lease.loss_reason(),
        None,
        "the lease was lost while a minority was paused"
    );
    let renewed = lease.renewals() - before;
    println!(
        "{renewed} renewals in {:?} with one of three masters paused",
        paused_at.elapsed()
    );
    assert!(
        renewed >= 7,
        "only {renewed} renewals in 3 s at a renew interval of ttl/3"
    );
    assert!(lease.valid_until() > tokio::time::Instant::now());
    assert!(holds(&masters[0], "steady")? && holds(&masters[1], "steady")?);
    masters[2].resume()?;
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    for master in &masters {
        assert!(!holds(master, "steady")?);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_contenders_never_hold_the_lease_at_once() -> TestResult {
    let masters = independent_masters(3)?;
    let mut managers = Vec::new();
    for _ in 0..4 {
        managers.push(LeaseManager::new(redlock(&masters).await?)?);
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .wait(Duration::from_secs(30))
        .build()?;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let manager = managers[i % managers.len()].clone();
        let (holders, most, tokens, options) = (
            Arc::clone(&holders),
            Arc::clone(&most),
            Arc::clone(&tokens),
            options.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let lease = manager.acquire("contended", &options).await?;
            let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            // In holding order, since only one task holds at a time.
            tokens
                .lock()
                .map_err(|_| LeaseError::ManagerStopped)?
                .push(lease.fencing_token());
            tokio::time::sleep(Duration::from_millis(5)).await;
            holders.fetch_sub(1, Ordering::SeqCst);
            let outcome = lease.release().await?;
            Ok::<_, LeaseError>(outcome)
        }));
    }
    for task in tasks {
        assert_eq!(
            within(Duration::from_secs(30), "a contender", task).await??,
            ReleaseOutcome::Released
        );
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "two tasks held the lease at once"
    );
    let tokens = tokens.lock().map_err(|_| "poisoned")?.clone();
    assert_eq!(tokens.len(), 16);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens did not rise in holding order: {tokens:?}"
    );
    Ok(())
}

#[tokio::test]
async fn bad_redlock_settings_are_refused_before_connecting() -> TestResult {
    let two = RedlockBackend::builder(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .connect()
        .await;
    assert!(
        matches!(two, Err(ConnectError::InvalidConfig { field: "nodes", .. })),
        "{two:?}"
    );
    let cluster = RedlockBackend::builder([
        "redis://127.0.0.1:1",
        "redis+cluster://:hunter2@127.0.0.1:2,127.0.0.1:3",
        "redis://127.0.0.1:4",
    ])
    .connect()
    .await;
    let shown = format!("{cluster:?}");
    assert!(
        matches!(cluster, Err(ConnectError::InvalidUrl { .. })),
        "{shown}"
    );
    assert!(!shown.contains("hunter2"), "{shown}");
    // The builder shows its settings, each master's URL without its
    // password.
    let builder = RedlockBackend::builder([
        "redis://:hunter2@127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ])
    .node_timeout(Duration::from_millis(40));
    let shown = format!("{builder:?}");
    assert!(
        shown.contains("127.0.0.1:1") && shown.contains("127.0.0.1:3") && shown.contains("40ms"),
        "{shown}"
    );
    assert!(!shown.contains("hunter2"), "{shown}");
    Ok(())
}

/// A master's clients as the server lists them, the listing's own
/// connection left out: how many there are, and how many track keys.
struct Clients {
    connected: usize,
    tracking: usize,
}

fn tracking_clients(master: &RedisServer) -> Result<Clients, Box<dyn std::error::Error>> {
    let list = master.cli(&["CLIENT", "LIST"])?;
    let flags: Vec<&str> = list
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("flags="))
                .ok_or("a client without flags")
        })
        .collect::<Result<_, _>>()?;
    Ok(Clients {
        connected: flags.len(),
        tracking: flags.iter().filter(|flags| flags.contains('t')).count(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_needs_a_majority_and_tolerates_a_minority_down() -> TestResult {
    let mut masters = independent_masters(3)?;
    masters[0].kill()?;
    let backend = redlock(&masters).await?;
    // The master down at connect gets a connection made on first use, on
    // which no server was asked to track: tracking is off there alone.
    let tracked: Vec<bool> = backend
        .nodes()
        .iter()
        .map(RedisBackend::tracks_lease_changes)
        .collect();
    assert_eq!(tracked, [false, true, true]);
    assert!(matches!(
        try_acquire(&backend, "late-start").await?,
        AcquireOutcome::Acquired(_)
    ));
    masters[0].restart()?;
    // The master that was down at start is connected to on first use.
    let key = LeaseKey::new("everywhere")?;
    let holder = HolderId::generate()?;
    let ttl = Ttl::parse("5s")?;
    let request = AcquireRequest::new(key.clone(), holder, ttl);
    let AcquireOutcome::Acquired(_) = backend.try_acquire(&request).await? else {
        return Err("not acquired".into());
    };
    assert!(holds(&masters[0], "everywhere")?);
    // A renewal goes through every master's renewal connection, the lazy
    // one included. The servers' own client lists say which of them were
    // asked to track keys: none on the late master, one on another.
    let renewed = backend.renew(&RenewRequest::new(key, holder, ttl)).await?;
    assert_eq!(renewed, RenewOutcome::Renewed);
    let late = tracking_clients(&masters[0])?;
    assert_eq!(
        late.connected, 2,
        "the late master's ops and renewal connections"
    );
    assert_eq!(late.tracking, 0, "a client tracks keys on the late master");
    assert_eq!(tracking_clients(&masters[1])?.tracking, 1);
    masters[1].kill()?;
    masters[0].kill()?;
    let none = redlock(&masters).await;
    assert!(
        matches!(
            none,
            Err(ConnectError::TooFewMasters {
                reached: 1,
                needed: 2,
                total: 3,
                ..
            })
        ),
        "{none:?}"
    );
    Ok(())
}

/// Five masters need three: connecting with two down succeeds, and with
/// three down it fails, counting the two it reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_masters_need_three_to_connect() -> TestResult {
    let mut masters = independent_masters(5)?;
    masters[0].kill()?;
    masters[1].kill()?;
    let backend = redlock(&masters).await?;
    assert_eq!(backend.quorum(), 3);
    assert_eq!(backend.nodes().len(), 5);
    assert_eq!(backend.node_timeout(), Duration::from_millis(100));
    let shown = format!("{backend:?}");
    assert!(
        shown.contains("quorum: 3") && shown.contains("100ms") && shown.contains(&masters[4].url()),
        "{shown}"
    );
    masters[2].kill()?;
    let none = redlock(&masters).await;
    assert!(
        matches!(
            none,
            Err(ConnectError::TooFewMasters {
                reached: 2,
                needed: 3,
                total: 5,
                ..
            })
        ),
        "{none:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_is_lost_only_when_a_majority_says_so() -> TestResult {
    let mut masters = independent_masters(3)?;
    let backend = redlock(&masters).await?;
    let ttl = Ttl::parse("5s")?;
    let holder = HolderId::generate()?;
    let layout = KeyLayout::default();
    for name in ["gone-on-two", "gone-on-one"] {
        let request = AcquireRequest::new(LeaseKey::new(name)?, holder, ttl);
        let AcquireOutcome::Acquired(_) = backend.try_acquire(&request).await? else {
            return Err(format!("{name} not acquired").into());
        };
    }
    let renew = |name: &str| -> Result<leasehold::backend::RenewRequest, leasehold::InputError> {
        Ok(leasehold::backend::RenewRequest::new(
            LeaseKey::new(name)?,
            holder,
            ttl,
        ))
    };
    let stored = |name: &str| -> Result<String, leasehold::InputError> {
        Ok(layout.lease(&LeaseKey::new(name)?))
    };

    // Gone from one master: a majority still renews it.
    masters[0].cli(&["DEL", &stored("gone-on-one")?])?;
    assert_eq!(
        backend.renew(&renew("gone-on-one")?).await?,
        leasehold::backend::RenewOutcome::Renewed
    );
    // Gone from two: a majority says Lost.
    masters[0].cli(&["DEL", &stored("gone-on-two")?])?;
    masters[1].cli(&["DEL", &stored("gone-on-two")?])?;
    assert_eq!(
        backend.renew(&renew("gone-on-two")?).await?,
        leasehold::backend::RenewOutcome::Lost
    );
    // Gone from one, another paused: one renewed, one lost, one silent —
    // no majority either way, so the outcome is unknown (an error).
    masters[1].pause()?;
    let unknown = backend.renew(&renew("gone-on-one")?).await;
    let err = unknown
        .err()
        .ok_or("a renewal without a majority was decided")?;
    assert!(err.is_transient(), "{err:?}");
    masters[1].resume()?;
    assert_eq!(
        backend.renew(&renew("gone-on-one")?).await?,
        leasehold::backend::RenewOutcome::Renewed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_elsewhere_with_one_master_down() -> TestResult {
    let mut masters = independent_masters(3)?;
    masters[0].kill()?;
    // Two backends, as two processes would have.
    let holder = LeaseManager::new(redlock(&masters).await?)?;
    let waiter = LeaseManager::new(redlock(&masters).await?)?;
    let options = notice::options();
    let lease = holder.acquire("redlock-notice", &options).await?;
    let waiting = notice::spawn_waiter(&waiter, "redlock-notice", &options);
    // Until the waiter listens on both live masters. The acquisition itself
    // waits out the dead master's 100 ms node timeout.
    let channel = KeyLayout::default().released(&LeaseKey::new("redlock-notice")?);
    notice::release_wakes("with one master down", lease, waiting, || {
        for master in &masters[1..] {
            if master.cli(&["PUBSUB", "NUMSUB", &channel])?.lines().nth(1) != Some("1") {
                return Ok(false);
            }
        }
        Ok::<_, leasehold_testkit::TestkitError>(true)
    })
    .await?;
    Ok(())
}
