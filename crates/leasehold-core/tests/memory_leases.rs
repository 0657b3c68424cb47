//! `MemoryBackend`'s lease semantics on tokio's paused clock, instant by
//! instant: when a lease expires, what a renewal extends it to, what
//! `inspect` reports, how fencing tokens rise, and who hears a release.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, ChangeBackend, FencingToken, Grant, HandoverBackend,
    HandoverOutcome, HolderId, LeaseBackend, LeaseChange, LeaseKey, MemoryBackend, ReleaseOutcome,
    ReleaseReport, RenewOutcome, RenewRequest, Ttl, WatchPolicy,
};
use tokio::time::{Instant, advance, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn acquire(
    backend: &MemoryBackend,
    request: &AcquireRequest,
) -> Result<Grant, Box<dyn std::error::Error>> {
    match backend.try_acquire(request).await? {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        other => Err(format!("not acquired: {other:?}").into()),
    }
}

/// A lease lives exactly its ttl from the moment the server ran the
/// request: held by its holder 1 ms before, free at the instant itself.
#[tokio::test(start_paused = true)]
async fn a_lease_expires_exactly_its_ttl_after_the_server_ran_it() -> TestResult {
    let backend = MemoryBackend::new();
    let (key, a, b) = (
        LeaseKey::new("k")?,
        HolderId::generate()?,
        HolderId::generate()?,
    );
    let ttl = Ttl::parse("1s")?;
    let start = Instant::now();
    let grant = acquire(&backend, &AcquireRequest::new(key.clone(), a, ttl)).await?;
    assert_eq!(grant.sent_at, start);
    assert_eq!(grant.fencing_token, FencingToken(1));

    advance(ms(999)).await;
    match backend
        .try_acquire(&AcquireRequest::new(key.clone(), b, ttl))
        .await?
    {
        AcquireOutcome::Held(info) => {
            assert_eq!(info.label, None);
            assert_eq!(info.fencing_token, Some(FencingToken(1)));
            assert_eq!(info.ttl_left, Some(ms(1)));
        }
        other => return Err(format!("expected Held, got {other:?}").into()),
    }
    advance(ms(1)).await;
    assert_eq!(backend.inspect(&key).await?, None);
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), a, ttl))
            .await?,
        RenewOutcome::Lost
    );
    let theirs = acquire(&backend, &AcquireRequest::new(key.clone(), b, ttl)).await?;
    assert_eq!(theirs.fencing_token, FencingToken(2));
    Ok(())
}

/// A renewal extends the lease to a full ttl from when the server ran it
/// (after the latency), for its holder only; a re-acquisition by the
/// holder does the same, keeps the token and replaces the label.
#[tokio::test(start_paused = true)]
async fn renewals_extend_from_when_the_server_runs_them() -> TestResult {
    let backend = MemoryBackend::new();
    let (key, me, other) = (
        LeaseKey::new("k")?,
        HolderId::generate()?,
        HolderId::generate()?,
    );
    let ttl = Ttl::parse("1s")?;
    let first = AcquireRequest::new(key.clone(), me, ttl).with_label("host-a")?;
    let grant = acquire(&backend, &first).await?;

    advance(ms(400)).await;
    backend.set_latency(ms(100));
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), me, ttl))
            .await?,
        RenewOutcome::Renewed
    );
    backend.set_latency(Duration::ZERO);
    // Ran at 500 ms: it lives until 1.5 s.
    let info = backend.inspect(&key).await?.ok_or("the lease is held")?;
    assert_eq!(info.ttl_left, Some(ms(1000)));
    assert_eq!(info.label.as_deref(), Some("host-a"));
    assert_eq!(info.fencing_token, Some(grant.fencing_token));

    // Someone else's renewal changes nothing.
    advance(ms(300)).await;
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), other, ttl))
            .await?,
        RenewOutcome::Lost
    );
    assert_eq!(
        backend.inspect(&key).await?.and_then(|i| i.ttl_left),
        Some(ms(700))
    );

    // The holder acquires again: a full ttl, the same token, the new label.
    let again = AcquireRequest::new(key.clone(), me, Ttl::parse("2s")?).with_label("host-b")?;
    let regrant = acquire(&backend, &again).await?;
    assert_eq!(regrant.fencing_token, grant.fencing_token);
    let info = backend.inspect(&key).await?.ok_or("the lease is held")?;
    assert_eq!(info.ttl_left, Some(ms(2000)));
    assert_eq!(info.label.as_deref(), Some("host-b"));
    Ok(())
}

/// Fencing tokens count per key, across acquisitions and hand-overs alike.
#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise_by_one_per_key() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("1s")?;
    let (a, b) = (LeaseKey::new("a")?, LeaseKey::new("b")?);
    let me = HolderId::generate()?;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        tokens.push(
            acquire(&backend, &AcquireRequest::new(a.clone(), me, ttl))
                .await?
                .fencing_token,
        );
        assert_eq!(
            backend.release(&a, &me).await?.outcome(),
            ReleaseOutcome::Released
        );
    }
    tokens.push(backend.hand_over(&a, ttl)?.fencing_token);
    let on_b = acquire(&backend, &AcquireRequest::new(b.clone(), me, ttl)).await?;
    assert_eq!(tokens, [1, 2, 3, 4].map(FencingToken));
    assert_eq!(on_b.fencing_token, FencingToken(1));
    Ok(())
}

/// A release is heard when someone watches the key's notices, and wakes
/// them; with no watch it is not. A hand-over happens only while at most
/// the offering waiter's own watch listens, and only to its own key.
#[tokio::test(start_paused = true)]
async fn releases_are_heard_by_watchers_and_handed_over_only_without_others() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("5s")?;
    let key = LeaseKey::new("k")?;
    let (me, next) = (HolderId::generate()?, HolderId::generate()?);
    let mine = AcquireRequest::new(key.clone(), me, ttl);
    let theirs = AcquireRequest::new(key.clone(), next, ttl);

    acquire(&backend, &mine).await?;
    assert_eq!(
        backend.release(&key, &me).await?,
        ReleaseReport::Released { heard: false }
    );
    acquire(&backend, &mine).await?;
    let mut watch = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    assert!(watch.is_supported());
    assert_eq!(backend.release(&key, &next).await?, ReleaseReport::NotHeld);
    assert_eq!(
        backend.release(&key, &me).await?,
        ReleaseReport::Released { heard: true }
    );
    timeout(ms(1), watch.released()).await?;

    // One watch (the waiter's own): handed over, with the next token.
    let held = acquire(&backend, &mine).await?;
    match backend.release_to(&key, &me, &theirs).await? {
        HandoverOutcome::HandedOver(grant) => {
            assert_eq!(grant.holder, next);
            assert!(grant.fencing_token > held.fencing_token);
        }
        other => return Err(format!("expected a hand-over, got {other:?}").into()),
    }
    assert_eq!(
        backend.inspect(&key).await?.and_then(|i| i.fencing_token),
        Some(FencingToken(held.fencing_token.0 + 1))
    );
    assert_eq!(
        backend.release_to(&key, &me, &theirs).await?,
        HandoverOutcome::NotHeld
    );

    // Two watches: someone else waits, so it is only released, and heard.
    assert_eq!(
        backend.release(&key, &next).await?.outcome(),
        ReleaseOutcome::Released
    );
    acquire(&backend, &mine).await?;
    let mut other = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    assert_eq!(
        backend.release_to(&key, &me, &theirs).await?,
        HandoverOutcome::Released
    );
    assert_eq!(backend.inspect(&key).await?, None);
    timeout(ms(1), other.released()).await?;

    // An offer for another key is never taken.
    drop(other);
    acquire(&backend, &mine).await?;
    let elsewhere = AcquireRequest::new(LeaseKey::new("elsewhere")?, next, ttl);
    assert_eq!(
        backend.release_to(&key, &me, &elsewhere).await?,
        HandoverOutcome::Released
    );
    assert_eq!(backend.inspect(&LeaseKey::new("elsewhere")?).await?, None);
    drop(watch);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn debug_output_counts_the_leases() -> TestResult {
    let backend = MemoryBackend::new();
    let ttl = Ttl::parse("1s")?;
    for k in ["a", "b"] {
        acquire(
            &backend,
            &AcquireRequest::new(LeaseKey::new(k)?, HolderId::generate()?, ttl),
        )
        .await?;
    }
    assert_eq!(format!("{backend:?}"), "MemoryBackend { leases: 2, .. }");
    Ok(())
}

/// Operations wait while the backend hangs, for as long as it hangs, and
/// finish the moment it resumes.
#[tokio::test(start_paused = true)]
async fn a_hung_operation_finishes_when_the_backend_resumes() -> TestResult {
    let backend = MemoryBackend::new();
    let key = LeaseKey::new("k")?;
    backend.hang();
    let start = Instant::now();
    let pending = tokio::spawn({
        let backend = backend.clone();
        async move { backend.inspect(&key).await }
    });
    advance(Duration::from_secs(60)).await;
    assert!(!pending.is_finished());
    backend.resume();
    assert_eq!(timeout(ms(1), pending).await???, None);
    assert_eq!(Instant::now() - start, Duration::from_secs(60));
    Ok(())
}

/// `client()` stands for another process on the same leases: it is refused
/// a lease the first client holds, and the change watches of every client
/// hear the grants and releases of every other client, never their own
/// (as Redis tracking with `NOLOOP` reports them).
#[tokio::test(start_paused = true)]
async fn every_client_shares_the_leases_and_hears_the_others_writes_only() -> TestResult {
    let one = MemoryBackend::new();
    let (two, three) = (one.client(), one.client());
    let key = LeaseKey::new("job")?;
    let ttl = Ttl::parse("3s")?;
    let mut heard = [
        one.watch_changes().await?,
        two.watch_changes().await?,
        three.watch_changes().await?,
    ];
    let changed = || Some(LeaseChange::Changed(key.clone()));

    let first = HolderId::generate()?;
    acquire(&one, &AcquireRequest::new(key.clone(), first, ttl)).await?;
    let refused = two
        .try_acquire(&AcquireRequest::new(
            key.clone(),
            HolderId::generate()?,
            ttl,
        ))
        .await?;
    assert!(
        matches!(refused, AcquireOutcome::Held(_)),
        "another client sees the lease: {refused:?}"
    );
    let [ones, twos, threes] = &mut heard;
    assert_eq!(
        ones.try_next(),
        None,
        "a client does not hear its own grant"
    );
    assert_eq!(twos.try_next(), changed());
    assert_eq!(threes.try_next(), changed());

    one.release(&key, &first).await?;
    let second = HolderId::generate()?;
    acquire(&two, &AcquireRequest::new(key.clone(), second, ttl)).await?;
    // one's release, then two's grant.
    assert_eq!(ones.try_next(), changed());
    assert_eq!(ones.try_next(), None);
    assert_eq!(twos.try_next(), changed());
    assert_eq!(
        twos.try_next(),
        None,
        "a client does not hear its own grant"
    );
    assert_eq!(threes.try_next(), changed());
    assert_eq!(threes.try_next(), changed());
    assert_eq!(threes.try_next(), None);
    Ok(())
}
