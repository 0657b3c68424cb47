//! Read-write leases against real servers, judged by the server's own
//! state read on a side connection: which reader and writer keys exist
//! (KEYS in one MULTI, so a sample is one instant of the server), their
//! PTTL, the writer's intent, the reader index (SMEMBERS), the fencing
//! counter, the release channel, the cluster slot of each key.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::time::Duration;

use common::{TestResult, assert_expires, connect, expires_at, holder, key, server_ms, ttl};
use futures_util::StreamExt;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, FairBackend, FencingToken, Grant,
    HolderId, LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, ReadWriteBackend, ReleaseOutcome,
    RenewOutcome, RenewRequest, Ttl, WatchPolicy,
};
use leasehold_redis::redis::{self, AsyncCommands};
use leasehold_redis::{RedisBackend, RedlockBackend};
use leasehold_testkit::{RedisCluster, RedisServer};
use tokio::time::{Instant, timeout};

type Side = redis::aio::MultiplexedConnection;

const WRITER: &str = "leasehold:{doc}:write";
const INTENT: &str = "leasehold:{doc}:write-wanted";
const READERS: &str = "leasehold:{doc}:readers";

async fn side(url: &str) -> redis::RedisResult<Side> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

fn doc() -> LeaseKey {
    key("doc")
}

fn reader_key(who: &HolderId) -> String {
    format!("leasehold:{{doc}}:read:{}", who.to_hex())
}

async fn read(
    b: &impl ReadWriteBackend,
    who: HolderId,
    t: Ttl,
) -> Result<AcquireOutcome, BackendError> {
    b.try_acquire_read(&AcquireRequest::new(doc(), who, t))
        .await
}

async fn write(
    b: &impl ReadWriteBackend,
    who: HolderId,
    t: Ttl,
) -> Result<AcquireOutcome, BackendError> {
    b.try_acquire_write(&AcquireRequest::new(doc(), who, t))
        .await
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

async fn exists(side: &mut Side, key: &str) -> redis::RedisResult<bool> {
    side.exists(key).await
}

/// The writer keys and reader keys of `doc` at one instant of the server.
async fn sample(side: &mut Side) -> redis::RedisResult<(usize, usize)> {
    let (writers, readers): (Vec<String>, Vec<String>) = redis::pipe()
        .atomic()
        .keys(WRITER)
        .keys("leasehold:{doc}:read:*")
        .query_async(side)
        .await?;
    Ok((writers.len(), readers.len()))
}

/// A reader's renewal lengthens the reader index to the reader's own new
/// life (renew.lua, 2a.), in a batch beside an exclusive lease too: a
/// writer finds the reader for as long as its key lives.
#[tokio::test]
async fn a_readers_renewal_lengthens_the_reader_index() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let r = holder();
    let share = granted(read(&backend, r, ttl("2s")).await?)?;
    let exclusive = AcquireRequest::new(key("plain"), r, ttl("2s"));
    let exclusive = granted(backend.try_acquire(&exclusive).await?)?;
    let batch = [
        RenewRequest::new(exclusive.key, r, ttl("60s")),
        RenewRequest::new(share.key, r, ttl("60s")),
    ];
    for outcome in backend.renew_many(&batch).await {
        assert_eq!(outcome?, RenewOutcome::Renewed);
    }
    let left: i64 = side.pttl(READERS).await?;
    assert!(left > 50_000, "the reader index has {left} ms left");
    Ok(())
}

/// A fair release of a share is a plain one (fair mode queues exclusive
/// leases only): the reader's key goes, and a writer is granted at once.
#[tokio::test]
async fn a_fair_release_of_a_share_is_a_plain_release() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let r = holder();
    let share = granted(read(&backend, r, ttl("30s")).await?)?;
    assert!(exists(&mut side, READERS).await?);
    assert_eq!(
        FairBackend::release_fair(&backend, &share.key, &r).await?,
        ReleaseOutcome::Released
    );
    assert!(
        !exists(&mut side, &reader_key(&r)).await?,
        "the reader's key"
    );
    granted(write(&backend, holder(), ttl("30s")).await?)?;
    Ok(())
}

/// Several readers hold at once: each has its own key on the server and
/// is listed in the reader index.
#[tokio::test]
async fn readers_overlap() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let mut readers = Vec::new();
    for _ in 0..4 {
        let backend = connect(&server).await;
        let who = holder();
        let grant = granted(read(&backend, who, ttl("30s")).await?)?;
        assert_eq!(grant.key, doc().reader_key(&who)?);
        readers.push(who);
    }
    assert_eq!(sample(&mut side).await?, (0, 4));
    let mut members: Vec<String> = side.smembers(READERS).await?;
    members.sort();
    let mut expected: Vec<String> = readers.iter().map(HolderId::to_hex).collect();
    expected.sort();
    assert_eq!(members, expected);
    Ok(())
}

/// 32 contenders on 8 connections, 4 of them writers, take and
/// give back the lease for a while. A sampler on a side connection reads
/// the writer and reader keys in one MULTI: at every sample there are
/// either no writer keys, or one and no reader keys. Each contender also
/// checks a shared in-test count of holders when it is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_never_overlaps_anyone_under_32_contenders() -> TestResult {
    let server = RedisServer::start()?;
    let mut backends = Vec::new();
    for _ in 0..8 {
        backends.push(connect(&server).await);
    }
    // Readers count +1, a writer -1000: a writer with anyone shows.
    let holding = Arc::new(AtomicI32::new(0));
    let (reads, writes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let mut side = side(&server.url()).await?;
        let done = done.clone();
        tokio::spawn(async move {
            let (mut samples, mut shared, mut exclusive) = (0usize, 0usize, 0usize);
            while !done.load(Ordering::SeqCst) {
                let (writers, readers) = sample(&mut side).await?;
                assert!(
                    writers == 0 || (writers == 1 && readers == 0),
                    "{writers} writer key(s) and {readers} reader key(s) at once"
                );
                samples += 1;
                shared += usize::from(readers > 1);
                exclusive += writers;
            }
            Ok::<_, redis::RedisError>((samples, shared, exclusive))
        })
    };
    let mut tasks = Vec::new();
    for i in 0..32 {
        let backend = backends[i % backends.len()].clone();
        let (holding, reads, writes) = (holding.clone(), reads.clone(), writes.clone());
        let writer = i % 8 == 0;
        tasks.push(tokio::spawn(async move {
            // Five holds each, asking until granted (bounded by the
            // test's timeout below).
            // One holder id per hold, kept while asking again, as a
            // waiting acquisition keeps it: its intent is its own.
            let (mut held, mut me) = (0, holder());
            while held < 5 {
                let outcome = if writer {
                    write(&backend, me, ttl("30s")).await?
                } else {
                    read(&backend, me, ttl("30s")).await?
                };
                let AcquireOutcome::Acquired(grant) = outcome else {
                    // A refused writer waits a little (as a waiter for the
                    // release notice would), so readers get turns too.
                    let pause = if writer { 5 } else { 1 };
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                    continue;
                };
                held += 1;
                let me = std::mem::replace(&mut me, holder());
                let weight = if writer { -1000 } else { 1 };
                let now = holding.fetch_add(weight, Ordering::SeqCst) + weight;
                if writer {
                    assert_eq!(now, -1000, "a writer holds with others");
                    writes.fetch_add(1, Ordering::Relaxed);
                } else {
                    assert!(now > 0, "a reader holds with a writer");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                holding.fetch_sub(weight, Ordering::SeqCst);
                assert_eq!(
                    backend.release(&grant.key, &me).await?.outcome(),
                    ReleaseOutcome::Released
                );
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        timeout(Duration::from_secs(120), task)
            .await??
            .map_err(|e| e.to_string())?;
    }
    done.store(true, Ordering::SeqCst);
    let (samples, shared, exclusive) = timeout(Duration::from_secs(10), sampler).await???;
    let (reads, writes) = (
        reads.load(Ordering::Relaxed),
        writes.load(Ordering::Relaxed),
    );
    eprintln!(
        "{reads} reads, {writes} writes; {samples} samples: {shared} with readers together, {exclusive} with a writer"
    );
    // The contention was real: both kinds were granted, and the sampler saw
    // readers together and a writer alone.
    assert!(reads > 0 && writes > 0, "{reads} reads, {writes} writes");
    assert!(
        shared > 0 && exclusive > 0,
        "{samples} samples: {shared} with readers together, {exclusive} with a writer"
    );
    Ok(())
}

/// A refused writer that gives up withdraws its intent: only its own
/// (another holder's withdrawal leaves it), once (then there is none), and
/// a new reader is granted after it.
#[tokio::test]
async fn a_writer_withdraws_its_own_intent_only() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let (r, w) = (holder(), holder());
    granted(read(&backend, r, ttl("30s")).await?)?;
    refused(write(&backend, w, ttl("30s")).await?)?;
    assert!(exists(&mut side, INTENT).await?);
    assert!(!backend.withdraw_write_intent(&doc(), &holder()).await?);
    assert!(exists(&mut side, INTENT).await?, "another's withdrawal");
    assert!(backend.withdraw_write_intent(&doc(), &w).await?);
    assert!(!exists(&mut side, INTENT).await?, "withdrawn");
    assert!(!backend.withdraw_write_intent(&doc(), &w).await?);
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    Ok(())
}

/// After a writer is refused because a reader holds, its intent is on the
/// server and a new reader is refused (no reader key appears); once the
/// reader releases, the writer is granted and its intent is gone. Then the
/// same with a reader that expires instead of releasing.
#[tokio::test]
async fn a_refused_writer_goes_before_new_readers() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let (r1, r2, w) = (holder(), holder(), holder());
    let first = granted(read(&backend, r1, ttl("30s")).await?)?;
    refused(write(&backend, w, ttl("30s")).await?)?;
    assert!(
        exists(&mut side, INTENT).await?,
        "no intent after a refusal"
    );
    let info = refused(read(&backend, r2, ttl("30s")).await?)?;
    assert_eq!(info.fencing_token, None, "{info:?}");
    assert!(!exists(&mut side, &reader_key(&r2)).await?);

    backend.release(&first.key, &r1).await?;
    let writer = granted(write(&backend, w, ttl("30s")).await?)?;
    assert!(exists(&mut side, WRITER).await?);
    assert!(
        !exists(&mut side, INTENT).await?,
        "the intent outlived the grant"
    );
    backend.release(&writer.key, &w).await?;
    granted(read(&backend, r2, ttl("30s")).await?)?;
    backend.release(&doc().reader_key(&r2)?, &r2).await?;

    // The reader crashes instead: the writer is granted once its key is
    // gone from the server, and not before.
    let (r, w) = (holder(), holder());
    granted(read(&backend, r, ttl("1s")).await?)?;
    refused(write(&backend, w, ttl("30s")).await?)?;
    refused(read(&backend, holder(), ttl("30s")).await?)?;
    let (_, readers) = sample(&mut side).await?;
    assert_eq!(readers, 1);
    // Each attempt is judged by the reader's PTTL on the server, read just
    // before it: a grant before that much time passed came while the
    // reader's key still existed. (A grant later may have raced the
    // expiry, and is the writer's turn.)
    timeout(Duration::from_secs(5), async {
        loop {
            let looked = Instant::now();
            let left: i64 = side.pttl(reader_key(&r)).await?;
            let Ok(left) = u64::try_from(left) else {
                return Ok::<_, Box<dyn std::error::Error>>(()); // gone (-2)
            };
            match write(&backend, w, ttl("30s")).await? {
                AcquireOutcome::Acquired(_) => {
                    let after = looked.elapsed();
                    assert!(
                        after >= Duration::from_millis(left),
                        "the writer was granted {after:?} after the reader's key had {left} ms left"
                    );
                    return Ok(());
                }
                other => {
                    refused(other)?;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| "the crashed reader's key outlived its ttl")??;
    // Granted, or granted again (the same writer: an idempotent re-acquire).
    granted(write(&backend, w, ttl("30s")).await?)?;
    // The writer's scan pruned the expired reader from the index.
    let members: Vec<String> = side.smembers(READERS).await?;
    assert!(members.is_empty(), "{members:?}");
    Ok(())
}

/// A writer that dies while waiting holds readers back for its ttl only:
/// its intent is kept for the writer's ttl from its refusal, by the
/// server's clock, and no longer.
#[tokio::test]
async fn a_dead_writers_intent_runs_out_at_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    let before = server_ms(&server)?;
    refused(write(&backend, holder(), ttl("1s")).await?)?;
    let after = server_ms(&server)?;
    assert_expires(
        &server,
        INTENT,
        (before, after),
        1_000,
        "a refused writer's intent",
    )?;
    let pttl: i64 = side.pttl(INTENT).await?;
    refused(read(&backend, holder(), ttl("30s")).await?)?;
    tokio::time::sleep(Duration::from_millis(u64::try_from(pttl)? + 20)).await;
    assert!(!exists(&mut side, INTENT).await?);
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    Ok(())
}

/// Each share keeps the expiry asked for, by the server's clock
/// (`PEXPIRETIME` against `TIME` read around each call, see
/// `common::assert_expires`): a reader or a writer taken again by its
/// holder, for the new ttl; the reader index, at least as long as its
/// reader after the reader's grant, its re-acquisition and a renewal that
/// lengthens it, so that a writer always finds a live reader. An
/// inspection shows the writer, the waiting writer's intent and each
/// reader with no more than its ttl and no less than the server's `PTTL`
/// read after it.
#[tokio::test]
async fn each_share_keeps_the_expiry_asked_for() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let (r, w, waiting) = (holder(), holder(), holder());
    let index_outlives = |reader: i64, what: &str| -> TestResult {
        let index = expires_at(&server, READERS)?;
        assert!(
            index >= reader,
            "{what}: the reader index is freed at {index}, before its reader at {reader}"
        );
        Ok(())
    };

    granted(read(&backend, r, ttl("1s")).await?)?;
    let before = server_ms(&server)?;
    granted(read(&backend, r, ttl("20s")).await?)?;
    let after = server_ms(&server)?;
    let end = assert_expires(
        &server,
        &reader_key(&r),
        (before, after),
        20_000,
        "a reader taken again",
    )?;
    index_outlives(end, "a reader taken again")?;
    let before = server_ms(&server)?;
    let renewal = RenewRequest::new(doc().reader_key(&r)?, r, ttl("60s"));
    assert_eq!(backend.renew(&renewal).await?, RenewOutcome::Renewed);
    let after = server_ms(&server)?;
    let end = assert_expires(
        &server,
        &reader_key(&r),
        (before, after),
        60_000,
        "a renewed reader",
    )?;
    index_outlives(end, "a renewed reader")?;

    // A second reader, and an inspection of both.
    let other = holder();
    granted(read(&backend, other, ttl("30s")).await?)?;
    let info = backend.inspect_rw(&doc()).await?;
    assert_eq!(info.readers.len(), 2, "{info:?}");
    // Shown by rising fencing token: the first reader first.
    for (reader, (who, most)) in info.readers.iter().zip([(r, 60), (other, 30)]) {
        let shown = reader.ttl_left.ok_or("a reader shown without a ttl")?;
        let left: u64 = server.cli(&["PTTL", &reader_key(&who)])?.parse()?;
        assert!(
            Duration::from_millis(left) <= shown && shown <= Duration::from_secs(most),
            "a reader shown with {shown:?} left; the server had {left} ms left just after, of {most} s"
        );
    }
    for who in [r, other] {
        assert_eq!(
            backend
                .release(&doc().reader_key(&who)?, &who)
                .await?
                .outcome(),
            ReleaseOutcome::Released
        );
    }

    // A writer, taken again; another writer's intent; an inspection.
    granted(write(&backend, w, ttl("1s")).await?)?;
    let before = server_ms(&server)?;
    granted(write(&backend, w, ttl("20s")).await?)?;
    let after = server_ms(&server)?;
    assert_expires(
        &server,
        WRITER,
        (before, after),
        20_000,
        "a writer taken again",
    )?;
    let before = server_ms(&server)?;
    refused(write(&backend, waiting, ttl("30s")).await?)?;
    let after = server_ms(&server)?;
    assert_expires(
        &server,
        INTENT,
        (before, after),
        30_000,
        "a refused writer's intent",
    )?;
    let info = backend.inspect_rw(&doc()).await?;
    let writer = info.writer.ok_or("no writer shown")?.ttl_left;
    let intent = info.waiting_writer.ok_or("no intent shown")?.ttl_left;
    for (key, shown, most) in [(WRITER, writer, 20), (INTENT, intent, 30)] {
        let shown = shown.ok_or("shown without a ttl")?;
        let left: u64 = server.cli(&["PTTL", key])?.parse()?;
        assert!(
            Duration::from_millis(left) <= shown && shown <= Duration::from_secs(most),
            "{key} shown with {shown:?} left; the server had {left} ms left just after, of {most} s"
        );
    }
    Ok(())
}

/// A reader or writer whose holder vanished frees the lease when its key
/// expires on the server (PTTL at most its ttl), with no process running.
#[tokio::test]
async fn a_crashed_reader_or_writer_frees_at_its_ttl() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let other = connect(&server).await;
    for crashed_writer in [false, true] {
        let crashed = connect(&server).await;
        let who = holder();
        let grant = if crashed_writer {
            granted(write(&crashed, who, ttl("1s")).await?)?
        } else {
            granted(read(&crashed, who, ttl("1s")).await?)?
        };
        drop(crashed);
        let redis_key = format!("leasehold:{}", grant.key);
        let pttl: i64 = side.pttl(&redis_key).await?;
        assert!(pttl > 0 && pttl <= 1000, "PTTL {pttl} of {redis_key}");
        let me = holder();
        let blocked = if crashed_writer {
            read(&other, me, ttl("30s")).await?
        } else {
            write(&other, me, ttl("30s")).await?
        };
        refused(blocked)?;
        tokio::time::sleep(Duration::from_millis(u64::try_from(pttl)? + 20)).await;
        assert!(
            !exists(&mut side, &redis_key).await?,
            "{redis_key} outlived its ttl"
        );
        let freed = if crashed_writer {
            read(&other, me, ttl("30s")).await?
        } else {
            write(&other, me, ttl("30s")).await?
        };
        let grant = granted(freed)?;
        other.release(&grant.key, &me).await?;
    }
    Ok(())
}

/// Tokens strictly increase across readers and writers, and each grant's
/// token is the one the server's counter of the lease holds right after
/// it: one counter for readers and writers (separate counters would also
/// rise, from the server clock's floor, so the counter is the witness).
#[tokio::test]
async fn fencing_tokens_strictly_increase_across_readers_and_writers() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let mut tokens: Vec<FencingToken> = Vec::new();
    for round in 0..4 {
        let mut readers = Vec::new();
        for _ in 0..=round {
            let grant = granted(read(&backend, holder(), ttl("30s")).await?)?;
            let fence: u64 = side.get("leasehold:{doc}:fence").await?;
            assert_eq!(FencingToken(fence), grant.fencing_token, "reader");
            tokens.push(grant.fencing_token);
            readers.push(grant);
        }
        let w = holder();
        refused(write(&backend, w, ttl("30s")).await?)?;
        for grant in &readers {
            backend.release(&grant.key, &grant.holder).await?;
        }
        let writer = granted(write(&backend, w, ttl("30s")).await?)?;
        let fence: u64 = side.get("leasehold:{doc}:fence").await?;
        assert_eq!(FencingToken(fence), writer.fencing_token, "writer");
        tokens.push(writer.fencing_token);
        backend.release(&writer.key, &w).await?;
    }
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{tokens:?}");
    Ok(())
}

/// A release of a reader and of the writer is announced on the lease's
/// own channel, where waiters of either kind listen.
#[tokio::test]
async fn a_release_of_any_share_is_announced_on_the_leases_channel() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let waiter = connect(&server).await;
    let mut pubsub = redis::Client::open(server.url())?
        .get_async_pubsub()
        .await?;
    pubsub.subscribe("leasehold:{doc}:released").await?;
    let mut watch = waiter.watch_releases(&doc(), WatchPolicy::Counted).await?;
    let (r, w) = (holder(), holder());
    let reader = granted(read(&backend, r, ttl("30s")).await?)?;
    assert_eq!(
        backend.release(&reader.key, &r).await?.outcome(),
        ReleaseOutcome::Released
    );
    let writer = granted(write(&backend, w, ttl("30s")).await?)?;
    assert_eq!(
        backend.release(&writer.key, &w).await?.outcome(),
        ReleaseOutcome::Released
    );
    let mut messages = pubsub.on_message();
    for _ in 0..2 {
        let message = timeout(Duration::from_secs(5), messages.next())
            .await?
            .expect("the subscription is open");
        assert_eq!(message.get_channel_name(), "leasehold:{doc}:released");
    }
    timeout(Duration::from_secs(5), watch.released()).await?;
    Ok(())
}

/// On a cluster, the writer's and readers' keys, the index, the intent and
/// the counter hash to one slot, on that slot's master; the writer's
/// script reads the readers' keys there (they are not in its KEYS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_leases_keys_share_one_cluster_slot() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    for lease in ["doc", "order:{42}"] {
        let lease = key(lease);
        let request = |who| AcquireRequest::new(lease.clone(), who, ttl("30s"));
        let (r1, r2, w) = (holder(), holder(), holder());
        let reader = granted(backend.try_acquire_read(&request(r1)).await?)?;
        granted(backend.try_acquire_read(&request(r2)).await?)?;
        refused(backend.try_acquire_write(&request(w)).await?)?;
        let layout = backend.layout();
        let slot = cluster.keyslot(&layout.lease(&lease))?;
        let master = &cluster.nodes()[cluster.master_of_slot(slot)?];
        for redis_key in [
            layout.lease(&reader.key),
            layout.lease(&lease.reader_key(&r2)?),
            layout.readers(&lease),
            layout.write_wanted(&lease),
            layout.fence(&lease),
        ] {
            assert_eq!(cluster.keyslot(&redis_key)?, slot, "{redis_key}");
            assert_eq!(master.cli(&["EXISTS", &redis_key])?, "1", "{redis_key}");
        }
        backend.release(&reader.key, &r1).await?;
        backend.release(&lease.reader_key(&r2)?, &r2).await?;
        let writer = granted(backend.try_acquire_write(&request(w)).await?)?;
        let writer_key = layout.lease(&writer.key);
        assert_eq!(cluster.keyslot(&writer_key)?, slot);
        assert_eq!(master.cli(&["EXISTS", &writer_key])?, "1");
        assert_eq!(master.cli(&["SCARD", &layout.readers(&lease)])?, "0");
    }
    Ok(())
}

/// Behind Sentinel, the shares live on the master the sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_leases_behind_sentinel_live_on_the_master() -> TestResult {
    let set = tokio::task::block_in_place(leasehold_testkit::SentinelSet::start)?;
    let backend = RedisBackend::connect(set.url()).await?;
    let mut master = side(&set.master().url()).await?;
    let (r1, r2) = (holder(), holder());
    granted(read(&backend, r1, ttl("30s")).await?)?;
    granted(read(&backend, r2, ttl("30s")).await?)?;
    refused(write(&backend, holder(), ttl("30s")).await?)?;
    assert_eq!(sample(&mut master).await?, (0, 2));
    assert!(exists(&mut master, INTENT).await?);
    Ok(())
}

/// Redlock refuses read-write leases with a typed error, before asking any
/// master.
#[tokio::test]
async fn redlock_refuses_read_write_leases() -> TestResult {
    let masters = leasehold_testkit::independent_masters(3)?;
    let backend = RedlockBackend::builder(masters.iter().map(RedisServer::url))
        .connect()
        .await?;
    let request = AcquireRequest::new(doc(), holder(), ttl("30s"));
    for (op, refused) in [
        ("acquire_read", backend.try_acquire_read(&request).await),
        ("acquire_write", backend.try_acquire_write(&request).await),
    ] {
        assert!(
            matches!(&refused, Err(BackendError::Unsupported { op: o, .. }) if *o == op),
            "{refused:?}"
        );
    }
    // No writer ever left an intent there: none is withdrawn.
    assert!(!backend.withdraw_write_intent(&doc(), &holder()).await?);
    for master in &masters {
        assert_eq!(master.cli(&["DBSIZE"])?, "0");
    }
    Ok(())
}

/// A share key cannot be taken as an exclusive lease around the rules: the
/// writer's key is refused while a reader holds, and nothing is written.
#[tokio::test]
async fn share_keys_cannot_be_acquired_as_exclusive_leases() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    granted(read(&backend, holder(), ttl("30s")).await?)?;
    let plain = AcquireRequest::new(doc().writer_key()?, holder(), ttl("30s"));
    assert!(matches!(
        backend.try_acquire(&plain).await,
        Err(BackendError::Unsupported { .. })
    ));
    assert!(!exists(&mut side, WRITER).await?);
    Ok(())
}

/// Reader and writer keys are tracked from the script that grants them, as
/// any lease: a SET behind the holder's back is reported for the share key.
/// The index, the intent and the counter name no lease: writing them first
/// reports nothing for them.
#[tokio::test]
async fn a_share_changed_behind_its_holder_is_reported() -> TestResult {
    let server = RedisServer::start()?;
    let mut side = side(&server.url()).await?;
    let backend = connect(&server).await;
    assert!(backend.tracks_lease_changes());
    let mut watch = backend.watch_changes().await?;
    for writer in [false, true] {
        let who = holder();
        let mine = if writer {
            granted(write(&backend, who, ttl("30s")).await?)?
        } else {
            granted(read(&backend, who, ttl("30s")).await?)?
        };
        let () = side.sadd(READERS, "0").await?;
        let () = side.set(INTENT, "x").await?;
        let () = side.set("leasehold:{doc}:fence", "1").await?;
        let () = side
            .set(format!("leasehold:{}", mine.key), "someone-else")
            .await?;
        let first = timeout(Duration::from_secs(5), watch.next())
            .await?
            .expect("the watch is open");
        assert_eq!(
            first,
            LeaseChange::Changed(mine.key.clone()),
            "writer: {writer}"
        );
        let () = side.del(&[READERS, INTENT]).await?;
        let () = side.del(format!("leasehold:{}", mine.key)).await?;
        while let Ok(Some(_)) = timeout(Duration::from_millis(200), watch.next()).await {}
    }
    Ok(())
}

/// A share taken with a lock-delay stays on the server for ttl + delay,
/// readers and writer alike, as any lease does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_keeps_its_key_for_ttl_plus_lock_delay() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(&server).await;
    let mut side = side(&server.url()).await?;
    let delay = leasehold_core::LockDelay::new(Duration::from_secs(2))?;
    let (r, w) = (holder(), holder());
    let request = |who| AcquireRequest::new(doc(), who, ttl("1s")).with_lock_delay(delay);
    let reader = granted(backend.try_acquire_read(&request(r)).await?)?;
    let pttl: i64 = side.pttl(reader_key(&r)).await?;
    assert!((2000..=3000).contains(&pttl), "reader PTTL {pttl}");
    backend.release(&reader.key, &r).await?;
    let writer = granted(backend.try_acquire_write(&request(w)).await?)?;
    let pttl: i64 = side.pttl(WRITER).await?;
    assert!((2000..=3000).contains(&pttl), "writer PTTL {pttl}");
    backend.release(&writer.key, &w).await?;
    assert!(!exists(&mut side, WRITER).await?);
    Ok(())
}
