//! The metrics a manager records, read back from a global
//! `DebuggingRecorder` (the watchdog runs on its own task, so only a global
//! recorder sees it). Runs on `MemoryBackend` and tokio's paused clock.
//!
//! The recorder is shared by the whole test binary and each snapshot drains
//! it (counters and gauges restart from zero, histograms are emptied), so
//! the snapshots are summed up here, the tests take turns, and each uses its
//! own lease name.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use leasehold_core::{LeaseKey, MemoryBackend, PermitLimit, Ttl};
use leasehold_watchdog::metrics::{
    ACQUIRE_WAIT, ACQUISITIONS, CANDIDATES, HELD, HOLD_TIME, LOSSES, RENEWAL_LATENCY, RENEWALS,
    SAFETY_MARGIN, TTL,
};
use leasehold_watchdog::metrics::{KIND_EXCLUSIVE as EXCLUSIVE, KIND_PERMIT as PERMIT};
use leasehold_watchdog::{Election, LeaseError, LeaseManager, LeaseOptions, LossReason};
use metrics::Unit;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::time::sleep;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}
/// A metric's key, unit and value summed over every snapshot.
type Entry = (metrics_util::CompositeKey, Option<Unit>, Value);

#[derive(Debug, Clone)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

impl From<DebugValue> for Value {
    fn from(value: DebugValue) -> Self {
        match value {
            DebugValue::Counter(n) => Self::Counter(n),
            DebugValue::Gauge(g) => Self::Gauge(g.0),
            DebugValue::Histogram(values) => Self::Histogram(values.iter().map(|v| v.0).collect()),
        }
    }
}

/// Installs the recorder (before any manager records into the void) and
/// waits for this test's turn.
async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    snapshotter();
    TURN.lock().await
}

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    })
}

/// Everything recorded so far by this test binary.
fn snapshot() -> Vec<Entry> {
    static TOTALS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    let mut totals = TOTALS.lock().expect("not poisoned");
    for (key, unit, _, value) in snapshotter().snapshot().into_vec() {
        let value = Value::from(value);
        let Some(total) = totals.iter_mut().find(|(k, ..)| *k == key) else {
            totals.push((key, unit, value));
            continue;
        };
        total.1 = total.1.or(unit);
        match (&mut total.2, value) {
            (Value::Counter(sum), Value::Counter(n)) => *sum += n,
            // The watchdog only moves the gauge up and down, so deltas add up.
            (Value::Gauge(sum), Value::Gauge(g)) => *sum += g,
            (Value::Histogram(all), Value::Histogram(more)) => all.extend(more),
            (slot, value) => *slot = value,
        }
    }
    totals.clone()
}

/// The value of `metric` with exactly these labels.
fn value<'a>(snap: &'a [Entry], metric: &str, labels: &[(&str, &str)]) -> Option<&'a Value> {
    snap.iter()
        .find(|(ck, ..)| {
            let key = ck.key();
            key.name() == metric
                && key.labels().count() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(.., value)| value)
}

fn counter(snap: &[Entry], metric: &str, labels: &[(&str, &str)]) -> u64 {
    match value(snap, metric, labels) {
        Some(Value::Counter(n)) => *n,
        _ => 0,
    }
}

/// The held gauge of exclusive leases of `name`.
fn gauge(snap: &[Entry], name: &str) -> Option<f64> {
    held(snap, name, EXCLUSIVE)
}

fn held(snap: &[Entry], name: &str, kind: &str) -> Option<f64> {
    match value(snap, HELD, &[("name", name), ("kind", kind)]) {
        Some(Value::Gauge(g)) => Some(*g),
        _ => None,
    }
}

fn gauge_of(snap: &[Entry], metric: &str, name: &str) -> Option<f64> {
    match value(snap, metric, &[("name", name)]) {
        Some(Value::Gauge(g)) => Some(*g),
        _ => None,
    }
}

fn histogram(snap: &[Entry], metric: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    match value(snap, metric, labels) {
        Some(Value::Histogram(values)) => values.clone(),
        _ => Vec::new(),
    }
}

fn options(name: &'static str) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("3s").expect("valid ttl"))
        .name(name)
        .build()
        .expect("valid options")
}

/// Lets the watchdog task process what it was sent, without moving the clock.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn acquisitions_renewals_gauge_and_hold_time_of_a_released_lease() -> TestResult {
    let _turn = turn().await;
    let batches_before = histogram(&snapshot(), RENEWAL_LATENCY, &[]).len();
    let manager = LeaseManager::new(MemoryBackend::new())?;
    let name = "m-released";
    let lease = manager.acquire("metrics:released", &options(name)).await?;
    let busy = manager.acquire("metrics:released", &options(name)).await;
    assert!(matches!(busy, Err(LeaseError::NotAcquired { .. })));
    // Sleeping (not `advance`) lets the paused clock stop at each renewal.
    sleep(Duration::from_millis(3500)).await;
    assert_eq!(lease.renewals(), 3);

    let snap = snapshot();
    let acquired = [("name", name), ("kind", EXCLUSIVE), ("outcome", "acquired")];
    assert_eq!(counter(&snap, ACQUISITIONS, &acquired), 1);
    let not_acquired = [
        ("name", name),
        ("kind", EXCLUSIVE),
        ("outcome", "not_acquired"),
    ];
    assert_eq!(counter(&snap, ACQUISITIONS, &not_acquired), 1);
    assert_eq!(histogram(&snap, ACQUIRE_WAIT, &acquired), vec![0.0]);
    let renewed = [("name", name), ("outcome", "renewed")];
    assert_eq!(counter(&snap, RENEWALS, &renewed), 3);
    let batches = histogram(&snap, RENEWAL_LATENCY, &[]).len() - batches_before;
    assert_eq!(batches, 3);
    assert_eq!(gauge(&snap, name), Some(1.0));
    // Not ended yet: no hold time.
    assert!(
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", "released")]
        )
        .is_empty()
    );
    let units: Vec<_> = snap
        .iter()
        .filter(|(ck, ..)| ck.key().name() == HOLD_TIME || ck.key().name() == ACQUIRE_WAIT)
        .map(|(_, unit, ..)| *unit)
        .collect();
    assert!(units.iter().all(|u| *u == Some(Unit::Seconds)), "{units:?}");

    lease.release().await?;
    let snap = snapshot();
    assert_eq!(gauge(&snap, name), Some(0.0));
    assert_eq!(
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", "released")]
        ),
        vec![3.5]
    );
    // No key or holder id in any label.
    for (ck, ..) in &snap {
        for label in ck.key().labels() {
            assert!(!label.value().contains("metrics:"), "{ck:?}");
        }
    }
    Ok(())
}

/// A permit's acquisitions, acquire wait, held gauge, hold time and loss
/// carry `kind="permit"`, and none of them is counted as exclusive.
#[tokio::test(start_paused = true)]
async fn a_permit_is_labelled_kind_permit() -> TestResult {
    let _turn = turn().await;
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let name = "m-permit";
    let limit = PermitLimit::new(2)?;
    let first = manager
        .acquire_permit("metrics:permit", limit, &options(name))
        .await?;
    let second = manager
        .acquire_permit("metrics:permit", limit, &options(name))
        .await?;
    let full = manager
        .acquire_permit("metrics:permit", limit, &options(name))
        .await;
    assert!(matches!(full, Err(LeaseError::NotAcquired { .. })));
    let snap = snapshot();
    let acquired = [("name", name), ("kind", PERMIT), ("outcome", "acquired")];
    assert_eq!(counter(&snap, ACQUISITIONS, &acquired), 2);
    let not_acquired = [
        ("name", name),
        ("kind", PERMIT),
        ("outcome", "not_acquired"),
    ];
    assert_eq!(counter(&snap, ACQUISITIONS, &not_acquired), 1);
    assert_eq!(histogram(&snap, ACQUIRE_WAIT, &acquired), vec![0.0, 0.0]);
    assert_eq!(held(&snap, name, PERMIT), Some(2.0));

    sleep(Duration::from_millis(1500)).await;
    first.release().await?;
    assert!(backend.vanish(&second.server_key()));
    assert_eq!(
        within(Duration::from_secs(10), "the token", second.lost()).await,
        LossReason::Lost
    );
    settle().await;
    let snap = snapshot();
    let of = |ended| [("name", name), ("kind", PERMIT), ("ended", ended)];
    assert_eq!(histogram(&snap, HOLD_TIME, &of("released")), vec![1.5]);
    assert_eq!(histogram(&snap, HOLD_TIME, &of("lost")).len(), 1);
    let lost = [("name", name), ("kind", PERMIT), ("reason", "lost")];
    assert_eq!(counter(&snap, LOSSES, &lost), 1);
    assert_eq!(held(&snap, name, PERMIT), Some(0.0));
    // Nothing of this name was recorded as an exclusive lease.
    let exclusive: Vec<_> = snap
        .iter()
        .map(|(ck, ..)| ck.key())
        .filter(|key| key.labels().any(|l| l.key() == "name" && l.value() == name))
        .filter(|key| {
            key.labels()
                .any(|l| l.key() == "kind" && l.value() != PERMIT)
        })
        .collect();
    assert!(exclusive.is_empty(), "{exclusive:?}");
    Ok(())
}

/// A reader's share and a writer's hold are labelled `kind="read"` and
/// `kind="write"`: their acquisitions, held gauge and hold time.
#[tokio::test(start_paused = true)]
async fn read_and_write_holds_are_labelled_by_kind() -> TestResult {
    let _turn = turn().await;
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let (name, read, write) = ("m-rw", "read", "write");
    let reader = manager.acquire_read("metrics:rw", &options(name)).await?;
    let snap = snapshot();
    let acquired = |kind| [("name", name), ("kind", kind), ("outcome", "acquired")];
    assert_eq!(counter(&snap, ACQUISITIONS, &acquired(read)), 1);
    assert_eq!(held(&snap, name, read), Some(1.0));
    sleep(Duration::from_millis(500)).await;
    reader.release().await?;
    let writer = manager.acquire_write("metrics:rw", &options(name)).await?;
    sleep(Duration::from_millis(250)).await;
    writer.release().await?;
    settle().await;
    let snap = snapshot();
    assert_eq!(counter(&snap, ACQUISITIONS, &acquired(write)), 1);
    let of = |kind| [("name", name), ("kind", kind), ("ended", "released")];
    assert_eq!(histogram(&snap, HOLD_TIME, &of(read)), vec![0.5]);
    assert_eq!(histogram(&snap, HOLD_TIME, &of(write)), vec![0.25]);
    assert_eq!(held(&snap, name, write), Some(0.0));
    assert_eq!(held(&snap, name, EXCLUSIVE), None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_counts_one_loss_and_one_hold_time() -> TestResult {
    let _turn = turn().await;
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let name = "m-lost";
    let lease = manager.acquire("metrics:lost", &options(name)).await?;
    assert!(backend.vanish(&LeaseKey::new("metrics:lost")?));
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Lost
    );
    settle().await;
    let snap = snapshot();
    assert_eq!(
        counter(
            &snap,
            LOSSES,
            &[("name", name), ("kind", EXCLUSIVE), ("reason", "lost")]
        ),
        1
    );
    assert_eq!(
        counter(&snap, RENEWALS, &[("name", name), ("outcome", "lost")]),
        1
    );
    assert_eq!(gauge(&snap, name), Some(0.0));
    // The first renewal, at a third of the 3 s ttl, found it gone.
    assert_eq!(
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", "lost")]
        ),
        vec![1.0]
    );

    // Dropping the handle afterwards does not end it a second time.
    drop(lease);
    settle().await;
    let snap = snapshot();
    assert!(
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", "dropped")]
        )
        .is_empty()
    );
    assert_eq!(gauge(&snap, name), Some(0.0));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn renewal_limit_dropped_and_shutdown_are_told_apart() -> TestResult {
    let _turn = turn().await;
    let manager = LeaseManager::new(MemoryBackend::new())?;
    let name = "m-ends";
    let capped = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .max_renewals(1)
        .name(name)
        .build()?;
    let limited = manager.acquire("metrics:capped", &capped).await?;
    let dropped = manager.acquire("metrics:dropped", &options(name)).await?;
    let kept = manager.acquire("metrics:kept", &options(name)).await?;
    settle().await;
    assert_eq!(gauge(&snapshot(), name), Some(3.0));

    assert_eq!(
        within(Duration::from_secs(10), "the capped token", limited.lost()).await,
        LossReason::RenewalLimit
    );
    drop(dropped);
    settle().await;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    assert_eq!(kept.loss_reason(), Some(LossReason::Shutdown));

    let snap = snapshot();
    assert_eq!(gauge(&snap, name), Some(0.0));
    let ended = |how| {
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", how)],
        )
    };
    assert_eq!(ended("renewal_limit").len(), 1);
    assert_eq!(ended("dropped").len(), 1);
    assert_eq!(ended("shutdown").len(), 1);
    // The capped lease was held past its one renewal (at 1 s) until its
    // token fired; the other was dropped at that same instant.
    assert!(
        ended("renewal_limit")[0] > 1.0,
        "{:?}",
        ended("renewal_limit")
    );
    assert_eq!(ended("dropped"), ended("renewal_limit"));
    for reason in ["renewal_limit", "shutdown"] {
        assert_eq!(
            counter(
                &snap,
                LOSSES,
                &[("name", name), ("kind", EXCLUSIVE), ("reason", reason)]
            ),
            1,
            "{reason}"
        );
    }
    assert_eq!(
        counter(
            &snap,
            LOSSES,
            &[("name", name), ("kind", EXCLUSIVE), ("reason", "lost")]
        ),
        0
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_large_batch_is_counted_per_name() -> TestResult {
    let _turn = turn().await;
    let batches_before = histogram(&snapshot(), RENEWAL_LATENCY, &[]).len();
    let manager = LeaseManager::new(MemoryBackend::new())?;
    let mut leases = Vec::new();
    for i in 0..1500 {
        let name = if i % 3 == 0 { "m-batch-a" } else { "m-batch-b" };
        leases.push(
            manager
                .acquire(format!("metrics:batch:{i}"), &options(name))
                .await?,
        );
    }
    sleep(Duration::from_millis(1100)).await;
    assert!(leases.iter().all(|l| l.renewals() == 1));
    let snap = snapshot();
    let renewed = |name| counter(&snap, RENEWALS, &[("name", name), ("outcome", "renewed")]);
    assert_eq!(renewed("m-batch-a"), 500);
    assert_eq!(renewed("m-batch-b"), 1000);
    assert_eq!(gauge(&snap, "m-batch-a"), Some(500.0));
    // Renewals due together go out in batches, not one call per lease (the
    // timer queue hands over at most tokio's cooperative budget of expired
    // timers per poll, so more than the two batches of 1,000 a single poll
    // would give).
    let batches = histogram(&snap, RENEWAL_LATENCY, &[]).len() - batches_before;
    assert!((2..=20).contains(&batches), "{batches} batches");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_hanging_backend_ends_the_lease_by_deadline() -> TestResult {
    let _turn = turn().await;
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let name = "m-deadline";
    let options = options(name);
    let lease = manager.acquire("metrics:deadline", &options).await?;
    backend.hang();
    assert_eq!(
        within(Duration::from_secs(10), "the token", lease.lost()).await,
        LossReason::Deadline
    );
    settle().await;
    let snap = snapshot();
    assert_eq!(
        counter(
            &snap,
            LOSSES,
            &[("name", name), ("kind", EXCLUSIVE), ("reason", "deadline")]
        ),
        1
    );
    // The renewal in flight never answered: neither renewed nor lost.
    for outcome in ["renewed", "lost", "error"] {
        assert_eq!(
            counter(&snap, RENEWALS, &[("name", name), ("outcome", outcome)]),
            0,
            "{outcome}"
        );
    }
    // Held from the acquisition to the deadline, on the paused clock.
    assert_eq!(
        histogram(
            &snap,
            HOLD_TIME,
            &[("name", name), ("kind", EXCLUSIVE), ("ended", "deadline")]
        ),
        vec![options.deadline_after().as_secs_f64()]
    );
    assert_eq!(gauge(&snap, name), Some(0.0));
    backend.resume();
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn ttl_and_safety_margin_are_set_by_acquire() -> TestResult {
    let _turn = turn().await;
    let manager = LeaseManager::new(MemoryBackend::new())?;
    let name = "m-timing";
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .safety_margin(Duration::from_millis(450))
        .name(name)
        .build()?;
    let lease = manager.acquire("metrics:timing", &options).await?;
    let snap = snapshot();
    assert_eq!(gauge_of(&snap, TTL, name), Some(3.0));
    assert_eq!(gauge_of(&snap, SAFETY_MARGIN, name), Some(0.45));
    let units: Vec<_> = snap
        .iter()
        .filter(|(ck, ..)| [TTL, SAFETY_MARGIN].contains(&ck.key().name()))
        .map(|(_, unit, ..)| *unit)
        .collect();
    assert!(units.iter().all(|u| *u == Some(Unit::Seconds)), "{units:?}");
    lease.release().await?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn election_candidates_count_while_alive_won_or_not() -> TestResult {
    let _turn = turn().await;
    let manager = LeaseManager::new(MemoryBackend::new())?;
    let name = "m-election";
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .name(name)
        .build()?;
    let first = Election::new(manager.clone(), "metrics:election", options.clone())?;
    let second = Election::new(manager.clone(), "metrics:election", options)?.pause(Duration::ZERO);
    // Neither has campaigned: both count, and nothing is held.
    let snap = snapshot();
    assert_eq!(gauge_of(&snap, CANDIDATES, name), Some(2.0));
    assert_eq!(gauge(&snap, name), None);

    let leader = within(Duration::from_secs(10), "the campaign", first.campaign()).await?;
    assert_eq!(gauge(&snapshot(), name), Some(1.0));
    drop(second);
    assert_eq!(gauge_of(&snapshot(), CANDIDATES, name), Some(1.0));
    leader.release().await?;
    drop(first);
    let snap = snapshot();
    assert_eq!(gauge_of(&snap, CANDIDATES, name), Some(0.0));
    assert_eq!(gauge(&snap, name), Some(0.0));
    Ok(())
}
