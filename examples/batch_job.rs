//! A long batch job under a lease, as a newcomer writes it: the watchdog
//! renews the lease while the job runs, the job reports its progress (a
//! job that stalls loses its lease, `Stalled`), it is capped (held at most
//! a minute, `MaxHold`), and it writes each chunk through a fenced store,
//! so that a holder that lost its lease cannot overwrite what a newer
//! holder wrote.
//!
//! Run with `cargo run --example batch_job`.
//!
//! It uses the Redis at `LEASEHOLD_REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` if one is installed; otherwise it runs on the
//! in-process `MemoryBackend` and says so (with an in-process fence).
//!
//! The job runs twice: once to completion (about 5 s under a 1 s lease,
//! kept alive by renewals you can see in the log), and once while an
//! "operator" deletes the lease halfway: the token fires (`Lost`), the job
//! stops at its next chunk, another holder takes the lease and seals the
//! report, and the first holder's late write is refused by the store.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Store;
use leasehold::backend::LeaseBackend;
use leasehold::redis::{Fence, FencedWrite, RedisBackend};
use leasehold::{FencingToken, LeaseError, LeaseKey, LeaseManager, LeaseOptions, MemoryBackend};
use tracing::info;

const KEY: &str = "reports:nightly";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing("info,leasehold_watchdog=debug");
    let key = LeaseKey::new(KEY)?;
    match common::choose_store() {
        Store::Redis { url, .. } => {
            let backend = RedisBackend::connect(url.as_str()).await?;
            let store = Chunks::Redis(backend.fence(&key));
            let operator = backend.clone();
            let delete = move || {
                let (operator, key) = (operator.clone(), key.clone());
                async move { operator.force_release(&key).await.map(|_| ()) }
            };
            demo(backend, store, delete).await
        }
        Store::Memory => {
            let backend = MemoryBackend::new();
            let operator = backend.clone();
            let delete = move || {
                operator.vanish(&key);
                async { Ok::<(), std::io::Error>(()) }
            };
            demo(backend, Chunks::Memory(Arc::default()), delete).await
        }
    }
}

async fn demo<B, F, E>(
    backend: B,
    store: Chunks,
    delete: impl Fn() -> F,
) -> Result<(), Box<dyn std::error::Error>>
where
    B: LeaseBackend,
    F: Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let manager = LeaseManager::new(backend)?;
    let options = LeaseOptions::builder()
        .ttl(Duration::from_secs(1))
        .progress_window(Duration::from_secs(2)) // a job silent for 2 s has stalled
        .hold_at_most(Duration::from_secs(60)) // and none runs past a minute
        .wait(Duration::from_secs(10))
        .name("nightly-report")
        .build()?;

    info!("run 1: a 5 s job under a 1 s lease");
    // The shortest correct batch job: the work gets the lease's context
    // (token, fencing token, progress) and the lease is released on every
    // path.
    let chunks = &store;
    let written = manager
        .with_lease(KEY, &options, |work| async move {
            let mut written = 0;
            for chunk in 0..10 {
                if work.is_cancelled() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await; // the chunk's work
                chunks.write(chunk, work.fencing_token()).await?;
                work.progress().report();
                written += 1;
            }
            Ok::<_, Box<dyn std::error::Error>>(written)
        })
        .await??;
    info!("run 1 wrote {written} of 10 chunks");

    info!("run 2: the same job, and an operator deletes the lease after 2 s");
    let lease = manager.acquire(KEY, &options).await?;
    let (stale, token) = (lease.fencing_token(), lease.token());
    for chunk in 0..10 {
        if chunk == 4 {
            delete().await?;
            info!("operator deleted the lease");
        }
        tokio::select! {
            () = token.cancelled() => {
                info!(reason = ?lease.loss_reason(), "token fired: stopping");
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                store.write(chunk, stale).await?;
                lease.progress().report();
            }
        }
    }
    drop(lease);

    // Another holder takes the lease and seals the report before any work:
    // the first holder's late write (a paused process waking up) is refused.
    let newer = manager.acquire(KEY, &options).await?;
    store.seal(newer.fencing_token()).await?;
    match store.write(9, stale).await? {
        Written::Refused(newer) => {
            info!(%stale, %newer, "the stale holder's late write was refused")
        }
        Written::Yes => return Err("a stale write was accepted".into()),
    }
    newer.release().await?;
    manager.shutdown().await;
    match manager.acquire(KEY, &options).await {
        Err(LeaseError::ManagerStopped) => Ok(()),
        other => Err(format!("a stopped manager acquired: {other:?}").into()),
    }
}

/// Where the report's chunks go: a fenced Redis resource, or, on the
/// in-process backend, the same rule in a map.
enum Chunks {
    Redis(Fence),
    Memory(Arc<Mutex<HashMap<String, u64>>>),
}

enum Written {
    Yes,
    Refused(FencingToken),
}

impl Chunks {
    async fn write(
        &self,
        chunk: u32,
        token: FencingToken,
    ) -> Result<Written, Box<dyn std::error::Error>> {
        let resource = format!("chunk:{chunk}");
        match self {
            Self::Redis(fence) => match fence
                .write(&resource, token, format!("rows of {chunk}"))
                .await?
            {
                FencedWrite::Written => Ok(Written::Yes),
                FencedWrite::Refused { newer } => Ok(Written::Refused(newer)),
            },
            Self::Memory(fences) => {
                let mut fences = fences.lock().map_err(|_| "poisoned")?;
                let seen = fences.entry(resource).or_insert(0);
                if token.get() < *seen {
                    return Ok(Written::Refused(FencingToken(*seen)));
                }
                *seen = token.get();
                Ok(Written::Yes)
            }
        }
    }

    async fn seal(&self, token: FencingToken) -> Result<(), Box<dyn std::error::Error>> {
        match self {
            Self::Redis(fence) => {
                // A seal by the newest holder raises the fence: refused
                // only if a newer one sealed first.
                if let FencedWrite::Refused { newer } = fence.seal("chunk:9", token).await? {
                    return Err(format!("sealed by a newer holder ({newer})").into());
                }
            }
            Self::Memory(fences) => {
                let mut fences = fences.lock().map_err(|_| "poisoned")?;
                let seen = fences.entry("chunk:9".to_owned()).or_insert(0);
                *seen = (*seen).max(token.get());
            }
        }
        Ok(())
    }
}
