//! Read-write leases through the manager, on `MemoryBackend` and tokio's
//! paused clock. The backend's own store (`inspect` of the share keys) and
//! an in-test count of believing holders are the witnesses.

mod common;

use common::{
    RequiredOnly, TestResult, check_not_taken_straight_back, check_renewed_then_lost, key, waiting,
    within,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{BackendError, LeaseBackend, LeaseKey, MemoryBackend, Ttl};
use leasehold_watchdog::{Backoff, LeaseError, LeaseManager, LeaseOptions, LossReason};
use tokio::time::{Instant, sleep};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Whether the store has a writer for the read-write lease `rw`.
async fn writer_in_store(backend: &MemoryBackend, rw: &LeaseKey) -> bool {
    let writer = rw.writer_key().expect("writer key");
    backend.inspect(&writer).await.expect("inspect").is_some()
}

#[tokio::test(start_paused = true)]
async fn readers_overlap_and_a_writer_overlaps_no_one() -> TestResult {
    let backend = MemoryBackend::new();
    backend.set_latency(ms(3));
    let rw = key("catalog");
    // Holders outlive their 1.5 s ttl: only renewal keeps their shares.
    let options = waiting("1500ms", ms(700));
    let managers = [
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    ];
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..24u64 {
        let manager = managers[i as usize % managers.len()].clone();
        let (backend, rw, options) = (backend.clone(), rw.clone(), options.clone());
        let (readers, writers, most) = (
            Arc::clone(&readers),
            Arc::clone(&writers),
            Arc::clone(&most_readers),
        );
        tasks.push(tokio::spawn(async move {
            // Arrivals spread over a few seconds, one in four a writer.
            sleep(ms(150 * i)).await;
            if i % 4 == 1 {
                let lease = manager.acquire_write(rw.as_str(), &options).await?;
                let others = writers.fetch_add(1, Ordering::SeqCst);
                assert_eq!(others, 0, "two writers believe they hold");
                assert_eq!(readers.load(Ordering::SeqCst), 0, "a writer with readers");
                let stored = backend.inspect(&lease.server_key()).await?;
                assert_eq!(
                    stored.and_then(|s| s.fencing_token),
                    Some(lease.fencing_token())
                );
                sleep(ms(1800)).await;
                assert_eq!(lease.loss_reason(), None, "a writer lost its hold");
                writers.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            } else {
                let lease = manager.acquire_read(rw.as_str(), &options).await?;
                let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert_eq!(writers.load(Ordering::SeqCst), 0, "a reader with a writer");
                assert!(
                    !writer_in_store(&backend, &rw).await,
                    "a reader beside a stored writer"
                );
                assert!(backend.inspect(&lease.server_key()).await?.is_some());
                sleep(ms(1600 + 100 * (i % 5))).await;
                assert_eq!(lease.loss_reason(), None, "a reader lost its hold");
                readers.fetch_sub(1, Ordering::SeqCst);
                lease.release().await?;
            }
            Ok::<_, LeaseError>(())
        }));
    }
    for task in tasks {
        within(Duration::from_secs(300), "a contender", task).await??;
    }
    let most = most_readers.load(Ordering::SeqCst);
    assert!(most >= 2, "readers never overlapped (at most {most})");
    assert!(!writer_in_store(&backend, &rw).await);
    Ok(())
}

/// Readers that each hold `hold`, a new one every `every`, so that some
/// reader always holds while they keep coming.
fn reader_stream(
    manager: &LeaseManager<MemoryBackend>,
    options: &LeaseOptions,
    hold: Duration,
    every: Duration,
    count: u64,
) -> Vec<tokio::task::JoinHandle<Result<Instant, LeaseError>>> {
    (0..count)
        .map(|i| {
            let (manager, options) = (manager.clone(), options.clone());
            tokio::spawn(async move {
                sleep(every * i as u32).await;
                let lease = manager.acquire_read("feed", &options).await?;
                let at = Instant::now();
                sleep(hold).await;
                lease.release().await?;
                Ok(at)
            })
        })
        .collect()
}

/// Queues a writer at once and returns when it was granted, holding it
/// for `hold`.
fn writer_after(
    manager: &LeaseManager<MemoryBackend>,
    options: &LeaseOptions,
    after: Duration,
    hold: Duration,
) -> tokio::task::JoinHandle<Result<(Instant, Instant), LeaseError>> {
    let (manager, options) = (manager.clone(), options.clone());
    tokio::spawn(async move {
        sleep(after).await;
        let queued = Instant::now();
        let lease = manager.acquire_write("feed", &options).await?;
        let granted = Instant::now();
        sleep(hold).await;
        lease.release().await?;
        Ok((queued, granted))
    })
}

async fn a_writer_among_arriving_readers(notices: bool) -> TestResult {
    let backend = MemoryBackend::new();
    backend.set_latency(ms(2));
    let hold = Duration::from_secs(1);
    // Polls far apart, and a writer's ttl short beside the hold and the
    // readers' ttl (which bounds a refused writer's sleep): the writer's
    // intent outlives its first refusal only if the writer asks again.
    let options = |ttl: &str| {
        LeaseOptions::builder()
            .ttl(Ttl::parse(ttl).expect("valid ttl"))
            .wait(Duration::from_secs(60))
            .backoff(Backoff::fixed(Duration::from_secs(5)))
            .release_notices(notices)
            .build()
            .expect("valid options")
    };
    let readers_side = LeaseManager::new(backend.clone())?;
    let writer_side = LeaseManager::new(backend.clone())?;
    let readers = reader_stream(&readers_side, &options("3s"), hold, ms(100), 40);
    let writer = writer_after(&writer_side, &options("300ms"), ms(1050), ms(200));
    let (queued, granted) = within(Duration::from_secs(60), "the writer", writer).await??;
    // The readers that held when the writer queued all release within one
    // hold; none that came after may delay it. A few attempt round trips
    // (2 ms each way) and, without notices, one intent refresh (100 ms)
    // on top.
    let waited = granted - queued;
    assert!(
        waited <= hold + ms(150),
        "the writer waited {waited:?} behind readers that hold {hold:?}"
    );
    let mut after_writer = 0;
    for reader in readers {
        let at = within(Duration::from_secs(120), "a reader", reader).await??;
        assert!(
            at <= queued + ms(10) || at >= granted,
            "a reader got in while the writer waited"
        );
        after_writer += usize::from(at >= granted);
    }
    assert!(after_writer > 0, "readers came after the writer");
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_waiting_writer_is_granted_within_one_reader_hold() -> TestResult {
    a_writer_among_arriving_readers(true).await
}

#[tokio::test(start_paused = true)]
async fn a_polling_writer_keeps_its_intent_alive() -> TestResult {
    // No release notices: only the writer's retries within its ttl keep
    // its intent, and with it the new readers, out.
    a_writer_among_arriving_readers(false).await
}

#[tokio::test(start_paused = true)]
async fn a_reader_behind_a_writer_wakes_on_its_release() -> TestResult {
    let backend = MemoryBackend::new();
    let writer_side = LeaseManager::new(backend.clone())?;
    let reader_side = LeaseManager::new(backend.clone())?;
    let options = waiting("20s", Duration::from_secs(30));
    let writer = writer_side.acquire_write("ledger", &options).await?;
    let waiting = tokio::spawn(async move {
        let lease = reader_side.acquire_read("ledger", &options).await?;
        Ok::<_, LeaseError>((Instant::now(), lease))
    });
    sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "a reader got in beside the writer");
    let released_at = Instant::now();
    let token = writer.fencing_token();
    writer.release().await?;
    let (acquired_at, reader) = within(Duration::from_secs(90), "the reader", waiting).await??;
    // Woken by the release, not by its poll (at least 18 s away: the
    // writer's remaining ttl bounds it).
    assert!(
        acquired_at - released_at < Duration::from_secs(1),
        "the reader got in {:?} after the release",
        acquired_at - released_at
    );
    assert!(token < reader.fencing_token());
    assert!(backend.inspect(&reader.server_key()).await?.is_some());
    Ok(())
}

/// A writer that releases and asks again at once, as a loop does, while a
/// writer elsewhere heard the release: that writer goes first (the
/// releasing manager yields, as after an exclusive lease's release). The
/// lease's name is spelled both ways a backend keeps in one place.
#[tokio::test(start_paused = true)]
async fn a_write_released_to_a_writer_elsewhere_is_not_taken_straight_back() -> TestResult {
    for rw in ["ledger", "{ledger}"] {
        let options = waiting("20s", Duration::from_secs(30));
        check_not_taken_straight_back("write lease", move |manager| {
            let options = options.clone();
            async move { manager.acquire_write(rw, &options).await }
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_share_is_renewed_and_its_loss_fires_the_token() -> TestResult {
    let backend = MemoryBackend::new();
    // Changes are not reported: only a renewal can tell of the loss.
    backend.cut_changes();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::with_ttl(Ttl::parse("600ms")?);
    for share in [
        manager.acquire_read("render", &options).await?,
        manager.acquire_read("render", &options).await?,
    ] {
        check_renewed_then_lost(&backend, share).await?;
    }
    let writer = manager.acquire_write("render", &options).await?;
    check_renewed_then_lost(&backend, writer).await
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise_across_readers_and_writers() -> TestResult {
    let backend = MemoryBackend::new();
    let managers = [
        LeaseManager::new(backend.clone())?,
        LeaseManager::new(backend.clone())?,
    ];
    let options = waiting("10s", Duration::from_secs(1));
    let mut tokens = Vec::new();
    for round in 0..6 {
        let manager = &managers[round % 2];
        let first = manager.acquire_read("fence", &options).await?;
        let second = managers[(round + 1) % 2]
            .acquire_read("fence", &options)
            .await?;
        tokens.push(first.fencing_token());
        tokens.push(second.fencing_token());
        first.release().await?;
        second.release().await?;
        let writer = manager.acquire_write("fence", &options).await?;
        assert_eq!(writer.server_key().as_str(), "{fence}:write");
        tokens.push(writer.fencing_token());
        writer.release().await?;
    }
    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "tokens did not rise: {tokens:?}");
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_dropped_share_and_a_shut_down_manager_free_their_keys() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = waiting("10s", Duration::from_secs(1));
    let dropped = manager.acquire_write("freed", &options).await?;
    let dropped_key = dropped.server_key();
    drop(dropped);
    within(
        Duration::from_secs(5),
        "the dropped writer's release",
        async {
            while backend.inspect(&dropped_key).await.ok().flatten().is_some() {
                sleep(ms(10)).await;
            }
        },
    )
    .await;
    let reader = manager.acquire_read("freed", &options).await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    assert_eq!(reader.loss_reason(), Some(LossReason::Shutdown));
    assert_eq!(backend.inspect(&reader.server_key()).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_backend_without_shares_is_a_final_error() -> TestResult {
    let manager = LeaseManager::new(RequiredOnly(MemoryBackend::new()))?;
    let options = waiting("10s", Duration::from_secs(1));
    for write in [false, true] {
        let started = Instant::now();
        let attempt = async {
            if write {
                manager.acquire_write("pool", &options).await
            } else {
                manager.acquire_read("pool", &options).await
            }
        };
        let error = within(Duration::from_secs(90), "the refusal", attempt)
            .await
            .expect_err("no read-write leases");
        // Not retried: retries are a second apart.
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(
            matches!(error, LeaseError::Backend(BackendError::Unsupported { .. })),
            "{error:?}"
        );
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_exclusive_lease_and_a_read_write_lease_of_one_name_do_not_mix() -> TestResult {
    // One manager, one name, both kinds: the exclusive lease's release
    // never hands a waiting writer the exclusive lease.
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = waiting("10s", Duration::from_secs(5));
    let exclusive = manager.acquire("mixed", &options).await?;
    let reader = manager.acquire_read("mixed", &options).await?;
    let (m1, o1) = (manager.clone(), options.clone());
    let writer = tokio::spawn(async move { m1.acquire_write("mixed", &o1).await });
    sleep(ms(100)).await;
    exclusive.release().await?;
    sleep(ms(100)).await;
    assert!(!writer.is_finished(), "a writer got the exclusive lease");
    reader.release().await?;
    let got = within(Duration::from_secs(60), "the writer", writer).await??;
    assert_eq!(got.server_key().as_str(), "{mixed}:write");
    assert_eq!(backend.inspect(&key("mixed")).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_share_granted_too_late_to_use_is_released_when_the_wait_ends() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    // Every reply comes after the share's validity less the safety margin:
    // each grant is useless, and the holder gives the last one back.
    backend.set_latency(ms(900));
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("1s")?)
        .wait(Duration::from_secs(3))
        .backoff(Backoff::fixed(ms(100)))
        .build()?;
    let rw = key("late");
    for write in [true, false] {
        let attempt = async {
            if write {
                manager.acquire_write("late", &options).await
            } else {
                manager.acquire_read("late", &options).await
            }
        };
        let error = within(Duration::from_secs(60), "the wait", attempt)
            .await
            .expect_err("every grant came too late");
        assert!(matches!(error, LeaseError::NotAcquired { .. }), "{error:?}");
        backend.set_latency(Duration::ZERO);
        // Released at once, not left to expire (a second after its grant).
        sleep(ms(50)).await;
        assert!(
            !writer_in_store(&backend, &rw).await,
            "the writer key was left behind"
        );
        let after = manager
            .acquire_write("late", &LeaseOptions::default())
            .await;
        assert!(after.is_ok(), "a share was left behind: {after:?}");
        after?.release().await?;
        backend.set_latency(ms(900));
    }
    Ok(())
}
