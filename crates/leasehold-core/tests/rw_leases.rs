//! Read-write leases on `MemoryBackend`, on tokio's paused clock: readers
//! overlap, a writer overlaps no one, a refused writer's intent refuses
//! new readers until the writer is granted or its intent runs out, a
//! crashed share frees exactly at its ttl, fencing tokens rise across
//! readers and writers, releases wake the lease's watchers, and share keys
//! cannot be taken around the rules.

use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, Grant, HandoverBackend, HolderId, LeaseBackend,
    LeaseInfo, LeaseKey, MemoryBackend, ReadWriteBackend, ReleaseOutcome, ReleaseReport,
    RenewOutcome, RenewRequest, RwRole, Ttl, WatchPolicy,
};
use tokio::time::{advance, timeout};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn holder() -> HolderId {
    HolderId::generate().expect("the OS has entropy")
}

fn doc() -> LeaseKey {
    LeaseKey::new("doc").expect("a valid key")
}

fn ttl(s: &str) -> Ttl {
    Ttl::parse(s).expect("a valid ttl")
}

fn request(who: HolderId, ttl: Ttl) -> AcquireRequest {
    AcquireRequest::new(doc(), who, ttl)
}

async fn read(b: &MemoryBackend, who: HolderId, t: Ttl) -> Result<AcquireOutcome, BackendError> {
    b.try_acquire_read(&request(who, t)).await
}

async fn write(b: &MemoryBackend, who: HolderId, t: Ttl) -> Result<AcquireOutcome, BackendError> {
    b.try_acquire_write(&request(who, t)).await
}

fn granted(outcome: AcquireOutcome) -> Result<Grant, Box<dyn std::error::Error>> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        other => Err(format!("not granted: {other:?}").into()),
    }
}

fn refused(outcome: AcquireOutcome) -> Result<LeaseInfo, Box<dyn std::error::Error>> {
    match outcome {
        AcquireOutcome::Held(info) => Ok(info),
        other => Err(format!("not refused: {other:?}").into()),
    }
}

#[tokio::test(start_paused = true)]
async fn readers_overlap_and_each_holds_its_own_key() -> TestResult {
    let backend = MemoryBackend::new();
    let mut grants = Vec::new();
    for _ in 0..3 {
        let who = holder();
        let grant = granted(read(&backend, who, ttl("10s")).await?)?;
        assert_eq!(grant.key, doc().reader_key(&who)?);
        assert_eq!(grant.key.rw_of(), Some((doc(), RwRole::Reader(who))));
        grants.push(grant);
    }
    // All three are held at once, each by its own holder.
    for grant in &grants {
        assert!(backend.inspect(&grant.key).await?.is_some(), "{grant:?}");
        assert_eq!(
            backend
                .renew(&RenewRequest::new(
                    grant.key.clone(),
                    grant.holder,
                    ttl("10s")
                ))
                .await?,
            RenewOutcome::Renewed
        );
    }
    // A reader asking again keeps its token.
    let again = granted(read(&backend, grants[0].holder, ttl("10s")).await?)?;
    assert_eq!(again.fencing_token, grants[0].fencing_token);
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_writer_overlaps_no_one() -> TestResult {
    let backend = MemoryBackend::new();
    let (r, w, w2) = (holder(), holder(), holder());
    let reader = granted(read(&backend, r, ttl("10s")).await?)?;
    refused(write(&backend, w, ttl("10s")).await?)?;
    assert_eq!(
        backend.release(&reader.key, &r).await?.outcome(),
        ReleaseOutcome::Released
    );

    let writer = granted(write(&backend, w, ttl("10s")).await?)?;
    assert_eq!(writer.key, doc().writer_key()?);
    // Neither a reader nor a second writer while it holds; the refusal
    // names the writer's lease.
    let info = refused(read(&backend, holder(), ttl("10s")).await?)?;
    assert_eq!(info.fencing_token, Some(writer.fencing_token));
    refused(write(&backend, w2, ttl("10s")).await?)?;
    // The writer asking again keeps its token.
    let again = granted(write(&backend, w, ttl("10s")).await?)?;
    assert_eq!(again.fencing_token, writer.fencing_token);
    Ok(())
}

/// After a writer is refused because a reader holds, a new reader is
/// refused too; once the reader releases, the writer is granted, and new
/// readers come in only after the writer is done.
#[tokio::test(start_paused = true)]
async fn a_refused_writer_goes_before_new_readers() -> TestResult {
    let backend = MemoryBackend::new();
    let (r1, r2, w) = (holder(), holder(), holder());
    let first = granted(read(&backend, r1, ttl("10s")).await?)?;
    refused(write(&backend, w, ttl("10s")).await?)?;
    let info = refused(read(&backend, r2, ttl("10s")).await?)?;
    // The intent is not a lease: no token, its time left.
    assert_eq!(info.fencing_token, None);
    assert_eq!(info.ttl_left, Some(ms(10_000)));

    assert_eq!(
        backend.release(&first.key, &r1).await?.outcome(),
        ReleaseOutcome::Released
    );
    let writer = granted(write(&backend, w, ttl("10s")).await?)?;
    refused(read(&backend, r2, ttl("10s")).await?)?;
    assert_eq!(
        backend.release(&writer.key, &w).await?.outcome(),
        ReleaseOutcome::Released
    );
    // Granting the writer cleared its intent.
    granted(read(&backend, r2, ttl("10s")).await?)?;
    Ok(())
}

/// A writer that dies while waiting holds readers back only for its ttl.
#[tokio::test(start_paused = true)]
async fn a_dead_writers_intent_runs_out_at_its_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    granted(read(&backend, holder(), ttl("10s")).await?)?;
    refused(write(&backend, holder(), ttl("2s")).await?)?;
    advance(ms(1999)).await;
    refused(read(&backend, holder(), ttl("10s")).await?)?;
    advance(ms(1)).await;
    granted(read(&backend, holder(), ttl("10s")).await?)?;
    Ok(())
}

/// A reader or writer that vanishes without releasing frees the lease
/// exactly when its ttl runs out.
#[tokio::test(start_paused = true)]
async fn a_crashed_share_frees_at_its_ttl() -> TestResult {
    let backend = MemoryBackend::new();
    granted(read(&backend, holder(), ttl("1s")).await?)?;
    let w = holder();
    advance(ms(999)).await;
    refused(write(&backend, w, ttl("1s")).await?)?;
    advance(ms(1)).await;
    granted(write(&backend, w, ttl("1s")).await?)?;

    advance(ms(999)).await;
    refused(read(&backend, holder(), ttl("1s")).await?)?;
    advance(ms(1)).await;
    granted(read(&backend, holder(), ttl("1s")).await?)?;
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn fencing_tokens_rise_across_readers_and_writers() -> TestResult {
    let backend = MemoryBackend::new();
    let mut last = None;
    for round in 0..4 {
        let mut grants = Vec::new();
        for _ in 0..=round {
            grants.push(granted(read(&backend, holder(), ttl("1s")).await?)?);
        }
        let w = holder();
        refused(write(&backend, w, ttl("1s")).await?)?;
        for g in &grants {
            assert!(last < Some(g.fencing_token), "{last:?} then {g:?}");
            last = Some(g.fencing_token);
            backend.release(&g.key, &g.holder).await?;
        }
        let writer = granted(write(&backend, w, ttl("1s")).await?)?;
        assert!(last < Some(writer.fencing_token));
        last = Some(writer.fencing_token);
        backend.release(&writer.key, &w).await?;
    }
    // An exclusive lease on the same key counts with it too.
    let plain = granted(backend.try_acquire(&request(holder(), ttl("1s"))).await?)?;
    assert!(last < Some(plain.fencing_token));
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_release_of_any_share_wakes_the_leases_watchers() -> TestResult {
    let backend = MemoryBackend::new();
    let mut watch = backend.watch_releases(&doc(), WatchPolicy::Counted).await?;
    let (r, w) = (holder(), holder());
    let reader = granted(read(&backend, r, ttl("10s")).await?)?;
    backend.release(&reader.key, &r).await?;
    timeout(ms(10), watch.released()).await?;
    let writer = granted(write(&backend, w, ttl("10s")).await?)?;
    backend.release(&writer.key, &w).await?;
    timeout(ms(10), watch.released()).await?;
    Ok(())
}

/// A share key cannot be taken as an exclusive lease (it would not see
/// the other shares), nor be the lease of another read-write lease, nor
/// be handed over on release.
#[tokio::test(start_paused = true)]
async fn share_keys_cannot_be_taken_around_the_rules() -> TestResult {
    let backend = MemoryBackend::new();
    let r = holder();
    let reader = granted(read(&backend, r, ttl("10s")).await?)?;
    let writer_key = doc().writer_key()?;
    for key in [writer_key.clone(), reader.key.clone()] {
        let plain = AcquireRequest::new(key.clone(), holder(), ttl("10s"));
        assert!(matches!(
            backend.try_acquire(&plain).await,
            Err(BackendError::Unsupported { .. })
        ));
        assert!(matches!(
            backend.try_acquire_write(&plain).await,
            Err(BackendError::Unsupported { .. })
        ));
    }
    assert_eq!(backend.inspect(&writer_key).await?, None);
    let next = AcquireRequest::new(reader.key.clone(), holder(), ttl("10s"));
    let _only_listener = backend.watch_releases(&doc(), WatchPolicy::Counted).await?;
    assert_eq!(
        backend.release_to(&reader.key, &r, &next).await?,
        leasehold_core::HandoverOutcome::Released
    );
    Ok(())
}

/// `K` and `{K}` are one read-write lease, as they are one exclusive lease.
#[tokio::test(start_paused = true)]
async fn a_key_and_its_braced_form_are_one_lease() -> TestResult {
    let backend = MemoryBackend::new();
    granted(read(&backend, holder(), ttl("10s")).await?)?;
    let braced = AcquireRequest::new(LeaseKey::new("{doc}")?, holder(), ttl("10s"));
    refused(backend.try_acquire_write(&braced).await?)?;
    refused(read(&backend, holder(), ttl("10s")).await?)?;
    Ok(())
}

/// 32 contenders, 4 of them writers, each take the lease 5 times and hold
/// it for a while on the paused clock. A count of holders kept by the test
/// (readers +1, a writer -1000) shows any writer that holds with anyone.
#[tokio::test(start_paused = true)]
async fn a_writer_never_overlaps_anyone_under_32_contenders() -> TestResult {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
    let backend = MemoryBackend::new();
    let holding = Arc::new(AtomicI32::new(0));
    let together = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let (backend, holding, together) = (backend.clone(), holding.clone(), together.clone());
        let writer = i % 8 == 0;
        tasks.push(tokio::spawn(async move {
            if writer {
                // Readers first, so writers meet held reads.
                tokio::time::sleep(ms(1)).await;
            }
            let (mut held, mut me) = (0, holder());
            while held < 5 {
                let outcome = if writer {
                    write(&backend, me, ttl("30s")).await
                } else {
                    read(&backend, me, ttl("30s")).await
                };
                let Ok(AcquireOutcome::Acquired(grant)) = outcome else {
                    tokio::time::sleep(ms(if writer { 5 } else { 1 })).await;
                    continue;
                };
                held += 1;
                let weight = if writer { -1000 } else { 1 };
                let now = holding.fetch_add(weight, Ordering::SeqCst) + weight;
                if writer {
                    assert_eq!(now, -1000, "a writer holds with others");
                } else {
                    assert!(now > 0, "a reader holds with a writer");
                    together.fetch_add(usize::from(now > 1), Ordering::SeqCst);
                }
                tokio::time::sleep(ms(2 + i % 3)).await;
                holding.fetch_sub(weight, Ordering::SeqCst);
                let released = backend.release(&grant.key, &me).await;
                assert_eq!(
                    released.ok().map(ReleaseReport::outcome),
                    Some(ReleaseOutcome::Released)
                );
                me = holder();
            }
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(600), task).await??;
    }
    // Readers did hold together.
    assert!(together.load(Ordering::SeqCst) > 0);
    Ok(())
}

/// The first refused writer's intent is the lease's until it is granted,
/// withdrawn or runs out: its own retry renews it, and a second writer
/// refused meanwhile does not replace it.
#[tokio::test(start_paused = true)]
async fn the_first_writers_intent_stays_and_its_own_retry_renews_it() -> TestResult {
    let backend = MemoryBackend::new();
    let (first, second) = (holder(), holder());
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    refused(write(&backend, first, ttl("4s")).await?)?;
    advance(ms(3_000)).await;
    // Renewed: 4 s from now.
    refused(write(&backend, first, ttl("4s")).await?)?;
    // Would outlive the first writer's, were it put in its place.
    refused(write(&backend, second, ttl("10s")).await?)?;
    assert!(
        !backend.withdraw_write_intent(&doc(), &second).await?,
        "the second writer left no intent"
    );
    advance(ms(3_999)).await;
    let info = refused(read(&backend, holder(), ttl("30s")).await?)?;
    assert_eq!(info.ttl_left, Some(ms(1)), "the first writer's intent");
    advance(ms(1)).await;
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    Ok(())
}

/// A writer refused by readers is told when the first of them frees.
#[tokio::test(start_paused = true)]
async fn a_writer_refused_by_readers_is_told_when_the_first_of_them_frees() -> TestResult {
    let backend = MemoryBackend::new();
    for t in ["10s", "3s", "6s"] {
        granted(read(&backend, holder(), ttl(t)).await?)?;
    }
    let info = refused(write(&backend, holder(), ttl("5s")).await?)?;
    assert_eq!(info.ttl_left, Some(ms(3_000)));
    Ok(())
}

/// A writer that gives up withdraws its own intent, and only its own:
/// readers are then granted at once.
#[tokio::test(start_paused = true)]
async fn a_writer_withdraws_its_own_intent_only() -> TestResult {
    let backend = MemoryBackend::new();
    let writer = holder();
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    refused(write(&backend, writer, ttl("10s")).await?)?;
    assert!(!backend.withdraw_write_intent(&doc(), &holder()).await?);
    refused(read(&backend, holder(), ttl("30s")).await?)?;
    assert!(backend.withdraw_write_intent(&doc(), &writer).await?);
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    assert!(
        !backend.withdraw_write_intent(&doc(), &writer).await?,
        "withdrawn already"
    );
    Ok(())
}
