//! `MemoryBackend`'s injected faults, operation by operation, on the paused clock.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, HolderId, LeaseBackend,
    LeaseChange, LeaseKey, MemoryBackend, ReleaseOutcome, RenewOutcome, RenewRequest, Ttl,
};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit` (tokio time: on the paused clock the runtime advances to
/// it), so that a broken mechanism fails the test instead of hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

#[tokio::test(start_paused = true)]
async fn fail_next_fails_exactly_n_operations_of_any_kind() -> TestResult {
    let backend = MemoryBackend::new();
    let (key, me, ttl) = (
        LeaseKey::new("k")?,
        HolderId::generate()?,
        Ttl::parse("5s")?,
    );
    backend.fail_next(4);
    let acquire = AcquireRequest::new(key.clone(), me, ttl);
    let errors = [
        backend.try_acquire(&acquire).await.err(),
        backend
            .renew(&RenewRequest::new(key.clone(), me, ttl))
            .await
            .err(),
        backend.release(&key, &me).await.err(),
        backend.inspect(&key).await.err(),
    ];
    for (error, op) in errors
        .into_iter()
        .zip(["acquire", "renew", "release", "inspect"])
    {
        match error {
            Some(e @ BackendError::Unavailable { op: got, .. }) => {
                assert_eq!(got, op);
                assert!(e.is_transient());
                assert_eq!(e.key(), "k");
            }
            other => return Err(format!("{op}: expected Unavailable, got {other:?}").into()),
        }
    }
    // A failed acquire did nothing; the next one works.
    assert_eq!(backend.inspect(&key).await?, None);
    assert!(matches!(
        backend.try_acquire(&acquire).await?,
        AcquireOutcome::Acquired(_)
    ));
    assert_eq!(
        backend.release(&key, &me).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_failed_batch_fails_every_request_in_it_and_counts_once() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("5s")?;
    let mut batch = Vec::new();
    for name in ["a", "b", "c"] {
        let (key, holder) = (LeaseKey::new(name)?, HolderId::generate()?);
        backend
            .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
            .await?;
        batch.push(RenewRequest::new(key, holder, ttl));
    }
    backend.fail_next(1);
    let failed = backend.renew_many(&batch).await;
    assert_eq!(failed.len(), 3);
    for (outcome, request) in failed.iter().zip(&batch) {
        match outcome {
            Err(e @ BackendError::Unavailable { .. }) => assert_eq!(e.key(), request.key.as_str()),
            other => return Err(format!("expected Unavailable, got {other:?}").into()),
        }
    }
    let renewed = backend.renew_many(&batch).await;
    assert!(
        renewed
            .iter()
            .all(|o| matches!(o, Ok(RenewOutcome::Renewed)))
    );
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn latency_and_failures_combine_and_zero_cancels_them() -> TestResult {
    let backend = MemoryBackend::new();
    let key = LeaseKey::new("k")?;
    backend.set_latency(Duration::from_millis(300));
    backend.fail_next(1);
    let started = Instant::now();
    assert!(backend.inspect(&key).await.is_err());
    // The failure comes after the latency, as a slow broken connection's would.
    assert_eq!(started.elapsed(), Duration::from_millis(300));
    backend.fail_next(5);
    backend.fail_next(0);
    backend.set_latency(Duration::ZERO);
    let started = Instant::now();
    assert_eq!(backend.inspect(&key).await?, None);
    assert_eq!(started.elapsed(), Duration::ZERO);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_hung_backend_lets_leases_expire_and_vanish_and_hand_over_replace_them() -> TestResult {
    let backend = MemoryBackend::new();
    let (key, me, ttl) = (
        LeaseKey::new("k")?,
        HolderId::generate()?,
        Ttl::parse("1s")?,
    );
    let AcquireOutcome::Acquired(mine) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), me, ttl))
        .await?
    else {
        return Err("a free key must be acquired".into());
    };
    backend.hang();
    let renewal = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move { backend.renew(&RenewRequest::new(key, me, ttl)).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    backend.resume();
    // The lease expired while the backend hung.
    assert_eq!(
        within(Duration::from_secs(10), "the hung renewal", renewal).await??,
        RenewOutcome::Lost
    );
    let theirs = backend.hand_over(&key, ttl)?;
    assert!(theirs.fencing_token > mine.fencing_token);
    assert_eq!(
        backend.release(&key, &me).await?.outcome(),
        ReleaseOutcome::NotHeld
    );
    assert!(backend.vanish(&key));
    assert!(!backend.vanish(&key));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn vanish_and_hand_over_are_reported_to_every_change_watch() -> TestResult {
    let backend = MemoryBackend::new();
    let (a, b, ttl) = (LeaseKey::new("a")?, LeaseKey::new("b")?, Ttl::parse("5s")?);
    let mut first = backend.watch_changes().await?;
    let mut second = backend.clone().watch_changes().await?;
    assert!(first.is_supported());
    backend
        .try_acquire(&AcquireRequest::new(a.clone(), HolderId::generate()?, ttl))
        .await?;
    // Nothing changed behind a holder's back yet: nothing is reported.
    assert_eq!(first.try_next(), None);
    assert!(backend.vanish(&a));
    // Vanishing a lease that is not there changes nothing.
    assert!(!backend.vanish(&a));
    backend.hand_over(&b, ttl)?;
    for watch in [&mut first, &mut second] {
        assert_eq!(
            within(Duration::from_secs(10), "the report of a", watch.next()).await,
            Some(LeaseChange::Changed(a.clone()))
        );
        assert_eq!(
            within(Duration::from_secs(10), "the report of b", watch.next()).await,
            Some(LeaseChange::Changed(b.clone()))
        );
        assert_eq!(watch.try_next(), None);
    }
    // A dropped watch is forgotten; the others still hear.
    drop(second);
    backend.hand_over(&a, ttl)?;
    assert_eq!(
        within(Duration::from_secs(10), "the report of a", first.next()).await,
        Some(LeaseChange::Changed(a))
    );
    Ok(())
}

/// A cut change feed reports nothing of what changes behind the holders'
/// backs, other clients' writes included, until it is restored: then
/// every watch hears `All` and changes are reported again.
#[tokio::test(start_paused = true)]
async fn a_cut_feed_reports_nothing_until_restored_and_then_all() -> TestResult {
    let backend = MemoryBackend::new();
    let other = backend.client();
    let (a, b, ttl) = (LeaseKey::new("a")?, LeaseKey::new("b")?, Ttl::parse("5s")?);
    let mut watch = backend.watch_changes().await?;
    backend.cut_changes();
    backend.hand_over(&a, ttl)?;
    other
        .try_acquire(&AcquireRequest::new(b.clone(), HolderId::generate()?, ttl))
        .await?;
    assert_eq!(watch.try_next(), None, "nothing reported while cut");
    backend.restore_changes();
    assert_eq!(watch.try_next(), Some(LeaseChange::All));
    assert!(backend.vanish(&b));
    assert_eq!(watch.try_next(), Some(LeaseChange::Changed(b)));
    assert_eq!(watch.try_next(), None);
    Ok(())
}
