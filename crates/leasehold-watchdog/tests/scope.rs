//! `with_lease` releases on every path; on `MemoryBackend` and the paused clock.

use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend};
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions, LossReason};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

fn key() -> LeaseKey {
    LeaseKey::new("scoped").expect("valid key")
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn success_returns_the_output_and_releases() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let probe = backend.clone();
    let out = manager
        .with_lease("scoped", &LeaseOptions::default(), |_token| async move {
            // Held while the work runs.
            probe.inspect(&key()).await.map(|i| i.is_some())
        })
        .await?;
    assert!(out?, "the lease was not held while the work ran");
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_error_of_the_work_is_returned_and_the_lease_released() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let out: Result<(), &str> = manager
        .with_lease("scoped", &LeaseOptions::default(), |_token| async {
            Err("disk full")
        })
        .await?;
    assert_eq!(out, Err("disk full"));
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_panic_releases_and_is_resumed() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let task = tokio::spawn(async move {
        manager
            .with_lease("scoped", &LeaseOptions::default(), |_token| async {
                panic!("the work failed")
            })
            .await
    });
    let joined = within(Duration::from_secs(10), "the panicking scope", task).await;
    assert!(joined.is_err_and(|e| e.is_panic()));
    settle().await;
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_the_work_and_says_why() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let saboteur = backend.clone();
    let options = LeaseOptions::default();
    let scoped = manager.with_lease("scoped", &options, |work| async move {
        saboteur.vanish(&key());
        work.cancelled().await;
        "stopped"
    });
    // The default ttl is 30 s: the loss comes well within it.
    let result = within(Duration::from_secs(60), "the lost lease's token", scoped).await;
    match result {
        Err(LeaseError::LeaseEnded { reason, .. }) => assert_eq!(reason, LossReason::Lost),
        other => return Err(format!("expected LeaseEnded, got {other:?}").into()),
    }
    // The key is free for the next holder.
    let again = manager.acquire("scoped", &LeaseOptions::default()).await?;
    drop(again);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_dropped_future_releases_in_the_background() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::default();
    let run = manager.with_lease("scoped", &options, |_token| std::future::pending::<()>());
    assert!(
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .is_err()
    );
    settle().await;
    assert_eq!(backend.inspect(&key()).await?, None);
    Ok(())
}
