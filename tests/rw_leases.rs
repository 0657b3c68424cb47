//! Read-write leases through the manager on a real `redis-server`, judged
//! by the server's own state read on a side connection (the writer key and
//! the reader keys that exist, and their PTTL) and by an in-test count of
//! the holders that believe they hold.

#[path = "common/holders.rs"]
mod holders;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::{Backoff, LeaseError, LeaseOptions, Ttl};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

use holders::{Error, crash_holding, manager, side, stored, within};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn options(ttl: &str, wait: Duration, poll: Duration) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .wait(wait)
        .backoff(Backoff::fixed(poll))
        .build()
        .expect("valid options")
}

/// The reader keys of the read-write lease `rw` on the server.
async fn readers_on_server(
    side: &mut redis::aio::MultiplexedConnection,
    rw: &str,
) -> redis::RedisResult<Vec<String>> {
    side.keys(format!("leasehold:{{{rw}}}:read:*")).await
}

/// Whether the writer key of the read-write lease `rw` is on the server.
async fn writer_on_server(
    side: &mut redis::aio::MultiplexedConnection,
    rw: &str,
) -> redis::RedisResult<bool> {
    side.exists(format!("leasehold:{{{rw}}}:write")).await
}

/// 32 contenders on 8 managers, one in four a writer, each taking the
/// read-write lease twice. While each holds, it checks in with the server:
/// a writer's key exists and no reader key does; a reader's key exists and
/// the writer key does not; and no writer believes it holds beside anyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_contenders_never_see_a_writer_beside_anyone() -> TestResult {
    let server = RedisServer::start()?;
    let mut managers = Vec::new();
    for _ in 0..8 {
        managers.push(manager(&server).await?);
    }
    // Holders outlive the ttl: only renewal keeps their shares.
    let options = options("600ms", Duration::from_secs(90), Duration::from_millis(500));
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let manager = managers[i as usize % managers.len()].clone();
        let mut side = side(&server).await?;
        let options = options.clone();
        let (readers, writers, most) = (
            Arc::clone(&readers),
            Arc::clone(&writers),
            Arc::clone(&most_readers),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..2u64 {
                let hold = Duration::from_millis(if (i + round).is_multiple_of(4) {
                    700
                } else {
                    30
                });
                if i % 4 == 1 {
                    let lease = manager.acquire_write("doc", &options).await?;
                    let others = writers.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(others, 0, "two writers believe they hold");
                    assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer with readers");
                    let mine: bool = side.exists(stored(&lease.server_key())).await?;
                    assert!(mine, "{} is not on the server", lease.server_key());
                    let beside = readers_on_server(&mut side, "doc").await?;
                    assert!(beside.is_empty(), "readers beside a writer: {beside:?}");
                    tokio::time::sleep(hold).await;
                    assert_eq!(lease.loss_reason(), None, "a writer lost its hold");
                    writers.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await?;
                } else {
                    let lease = manager.acquire_read("doc", &options).await?;
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader with a writer");
                    let mine: bool = side.exists(stored(&lease.server_key())).await?;
                    assert!(mine, "{} is not on the server", lease.server_key());
                    assert!(
                        !writer_on_server(&mut side, "doc").await?,
                        "a writer beside a reader"
                    );
                    tokio::time::sleep(hold).await;
                    assert_eq!(lease.loss_reason(), None, "a reader lost its hold");
                    readers.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await?;
                }
            }
            Ok::<_, Error>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(180), "a contender", task).await??;
    }
    let most = most_readers.load(Ordering::SeqCst);
    assert!(most >= 2, "readers never overlapped (at most {most})");
    let mut side = side(&server).await?;
    assert!(readers_on_server(&mut side, "doc").await?.is_empty());
    assert!(!writer_on_server(&mut side, "doc").await?);
    Ok(())
}

/// Readers on four managers keep arriving, each holding `HOLD`, so that
/// some reader always holds; a writer that queues among them is granted
/// once the readers that held when it queued have released (writer
/// preference: every later reader is refused by its intent), so within
/// one hold plus its attempts. The guaranteed bound: the hold, the
/// readers granted during its first attempt's round trip, and one retry,
/// which comes with the last release's notice or at the latest a third of
/// the writer's ttl later (`intent_refresh`); 300 ms covers the round trips
/// of a loaded machine. Without the preference the writer would wait for
/// the stream to end (4 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_waits_about_one_reader_hold() -> TestResult {
    const HOLD: Duration = Duration::from_millis(400);
    let server = RedisServer::start()?;
    // Readers' ttl above the writer's: a refused writer's sleep is bounded
    // by the reader's time left, which must not be what refreshes its intent.
    let reader_options = options("3s", Duration::from_secs(30), Duration::from_millis(500));
    let writer_ttl = Duration::from_millis(600);
    let writer_options = options("600ms", Duration::from_secs(30), Duration::from_secs(5));
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..8u64 {
        let manager = manager(&server).await?;
        let (options, stop) = (reader_options.clone(), Arc::clone(&stop));
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50 * i)).await;
            let started = Instant::now();
            while !stop.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(4) {
                let lease = manager.acquire_read("feed", &options).await?;
                tokio::time::sleep(HOLD).await;
                lease.release().await?;
            }
            Ok::<_, Error>(())
        }));
    }
    let writer = manager(&server).await?;
    let mut side = side(&server).await?;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = readers_on_server(&mut side, "feed").await?;
    assert!(!before.is_empty(), "no reader held when the writer queued");
    let queued = Instant::now();
    let lease = within(
        Duration::from_secs(30),
        "the writer",
        writer.acquire_write("feed", &writer_options),
    )
    .await?;
    let waited = queued.elapsed();
    let beside = readers_on_server(&mut side, "feed").await?;
    assert!(beside.is_empty(), "readers beside the writer: {beside:?}");
    assert!(writer_on_server(&mut side, "feed").await?);
    eprintln!("the writer waited {waited:?} behind readers that hold {HOLD:?}");
    let bound = HOLD + writer_ttl / 3 + Duration::from_millis(300);
    assert!(
        waited <= bound,
        "the writer waited {waited:?}, over {bound:?}"
    );
    lease.release().await?;
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        within(Duration::from_secs(30), "a reader", reader).await??;
    }
    Ok(())
}

/// A reader whose process dies (its runtime, and with it its watchdog,
/// gone without a release) keeps its share on the server until the ttl
/// runs out, no longer; then a waiting writer elsewhere gets the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_readers_share_frees_at_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let share_key = crash_holding(&server, async |manager| {
        let options = options("2s", Duration::ZERO, Duration::from_millis(500));
        Ok(manager.acquire_read("crash", &options).await?)
    })?;
    let crashed_at = Instant::now();
    let mut side = side(&server).await?;
    let pttl: i64 = side.pttl(&share_key).await?;
    assert!(
        pttl > 0 && pttl <= 2000,
        "PTTL right after the crash: {pttl}"
    );
    let writer = manager(&server).await?;
    let got = within(
        Duration::from_secs(20),
        "the writer",
        writer.acquire_write(
            "crash",
            &options("5s", Duration::from_secs(15), Duration::from_millis(500)),
        ),
    )
    .await?;
    let waited = crashed_at.elapsed();
    let exists: bool = side.exists(&share_key).await?;
    assert!(
        !exists,
        "the crashed reader's key outlived the writer's grant"
    );
    // Free no later than the ttl (plus the writer's retry) after the
    // crash, and not before the PTTL the server gave it.
    assert!(
        waited >= Duration::from_millis(u64::try_from(pttl)? - 50),
        "waited {waited:?}"
    );
    assert!(
        waited < Duration::from_millis(2000 + 700),
        "waited {waited:?}"
    );
    got.release().await?;
    assert!(!writer_on_server(&mut side, "crash").await?);
    Ok(())
}

/// The writer's intent on the server: its value and PTTL (ms), or `None`.
async fn intent_on_server(
    side: &mut redis::aio::MultiplexedConnection,
    rw: &str,
) -> redis::RedisResult<Option<(String, i64)>> {
    let key = format!("leasehold:{{{rw}}}:write-wanted");
    let (value, pttl): (Option<String>, i64) = redis::pipe()
        .atomic()
        .get(&key)
        .pttl(&key)
        .query_async(side)
        .await?;
    Ok(value.map(|v| (v, pttl)))
}

/// Waits, up to 5 s, until the writer's intent on `rw` is on the server;
/// returns it.
async fn intent_appears(
    side: &mut redis::aio::MultiplexedConnection,
    rw: &str,
) -> Result<(String, i64), Error> {
    within(Duration::from_secs(5), "the writer's intent", async {
        loop {
            if let Some(intent) = intent_on_server(side, rw).await? {
                return Ok::<_, Error>(intent);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// A writer that gives up withdraws its intent, long before the intent's
/// 10 s PTTL runs out, and only its own: when its wait runs out (gone by
/// the time the error is returned, and a new reader gets in at once), and
/// when its acquisition is dropped (gone within a second); a second writer
/// giving up beside a first that still waits leaves the first's intent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_gives_up_withdraws_its_intent() -> TestResult {
    let server = RedisServer::start()?;
    let (readers, first, second) = (
        manager(&server).await?,
        manager(&server).await?,
        manager(&server).await?,
    );
    let mut side = side(&server).await?;
    let poll = Duration::from_millis(100);
    let _reader = readers
        .acquire_read("doc", &options("10s", Duration::ZERO, poll))
        .await?;

    // 1. The wait runs out.
    let giving_up = tokio::spawn({
        let first = first.clone();
        async move {
            first
                .acquire_write("doc", &options("10s", Duration::from_millis(500), poll))
                .await
        }
    });
    let (_, pttl) = intent_appears(&mut side, "doc").await?;
    assert!(pttl > 5000, "the intent's PTTL: {pttl}");
    let gave_up = within(Duration::from_secs(5), "the writer's give-up", giving_up).await?;
    assert!(
        matches!(gave_up, Err(LeaseError::NotAcquired { .. })),
        "{gave_up:?}"
    );
    let left = intent_on_server(&mut side, "doc").await?;
    assert_eq!(left, None, "the intent outlived the writer's wait");
    let late = readers
        .acquire_read("doc", &options("10s", Duration::ZERO, poll))
        .await;
    assert!(late.is_ok(), "a reader after the writer gave up: {late:?}");

    // 2. Another writer waits; one beside it gives up: the first's intent stays.
    let waiting = tokio::spawn({
        let first = first.clone();
        async move {
            first
                .acquire_write("doc", &options("10s", Duration::from_secs(60), poll))
                .await
        }
    });
    let (value, _) = intent_appears(&mut side, "doc").await?;
    let beside = second
        .acquire_write("doc", &options("10s", Duration::from_millis(300), poll))
        .await;
    assert!(
        matches!(beside, Err(LeaseError::NotAcquired { .. })),
        "{beside:?}"
    );
    let kept = intent_on_server(&mut side, "doc").await?;
    assert_eq!(
        kept.map(|(v, _)| v),
        Some(value),
        "a writer that gave up took another's intent"
    );

    // 3. The waiting writer's acquisition is dropped.
    waiting.abort();
    within(
        Duration::from_secs(1),
        "the dropped writer's withdrawal",
        async {
            while intent_on_server(&mut side, "doc").await?.is_some() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<_, Error>(())
        },
    )
    .await?;
    Ok(())
}
