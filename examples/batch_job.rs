//! A long batch job under a lease: the watchdog renews it while the job
//! runs, and the job stops cleanly when the lease's token fires.
//!
//! Run with `cargo run --example batch_job`.
//!
//! It uses the Redis at `LEASEHOLD_REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` if one is installed; otherwise it runs on the
//! in-process `MemoryBackend` and says so.
//!
//! The job runs twice: once to completion (about 5 s under a 1 s lease,
//! kept alive by renewals you can see in the log), and once while an
//! "operator" deletes the lease halfway, so the token fires and the job
//! stops at its next checkpoint.

mod common;

use common::Store;
use std::time::Duration;

use leasehold::backend::LeaseBackend;
use leasehold::redis::RedisBackend;
use leasehold::{LeaseKey, LeaseManager, LeaseOptions, MemoryBackend, Ttl};
use tokio::time::Instant;
use tracing::info;

const KEY: &str = "reports:nightly";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing("info,leasehold_watchdog=debug");

    let store = common::choose_store();

    match &store {
        Store::Redis { url, .. } => {
            let backend = RedisBackend::connect(url.as_str()).await?;
            let saboteur = backend.clone();
            demo(backend, move || {
                let saboteur = saboteur.clone();
                async move {
                    saboteur.force_release(&LeaseKey::new(KEY)?).await?;
                    Ok(())
                }
            })
            .await
        }
        Store::Memory => {
            let backend = MemoryBackend::new();
            let saboteur = backend.clone();
            demo(backend, move || {
                let removed = saboteur.vanish(&LeaseKey::new(KEY).expect("valid key"));
                async move {
                    if removed {
                        Ok(())
                    } else {
                        Err("no lease to delete".into())
                    }
                }
            })
            .await
        }
    }
}

type Sabotage<F> = dyn Fn() -> F;

async fn demo<B, F>(backend: B, sabotage: impl Fn() -> F) -> Result<(), Box<dyn std::error::Error>>
where
    B: LeaseBackend,
    F: Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let manager = LeaseManager::new(backend)?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("1s")?)
        .wait(Duration::from_secs(10))
        .name("nightly-report")
        .build()?;

    info!("run 1: a 5 s job under a 1 s lease");
    let done = run_job(&manager, &options, None::<&Sabotage<F>>).await?;
    info!("run 1 finished {done} of 10 chunks");

    info!("run 2: the same job, and an operator deletes the lease after 2 s");
    let done = run_job(&manager, &options, Some(&sabotage)).await?;
    info!("run 2 stopped cleanly after {done} of 10 chunks");

    manager.shutdown().await;
    Ok(())
}

/// Processes 10 chunks of 500 ms, checking the lease's token between chunks.
async fn run_job<B, F>(
    manager: &LeaseManager<B>,
    options: &LeaseOptions,
    sabotage: Option<&(impl Fn() -> F + ?Sized)>,
) -> Result<u32, Box<dyn std::error::Error>>
where
    B: LeaseBackend,
    F: Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let lease = manager.acquire(KEY, options).await?;
    info!(fencing_token = %lease.fencing_token(), "lease acquired; renewing every {:?}", options.renew_interval());
    let token = lease.token();
    let started = Instant::now();
    let mut done = 0;
    while done < 10 {
        if let Some(sabotage) = sabotage.filter(|_| done == 4) {
            sabotage().await?;
            info!("operator deleted the lease");
        }
        tokio::select! {
            () = token.cancelled() => {
                info!(reason = ?lease.loss_reason(), "token fired: saving a checkpoint and stopping");
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(500)) => {
                done += 1;
                info!(chunk = done, renewals = lease.renewals(), elapsed = ?started.elapsed(), "chunk done");
            }
        }
    }
    let outcome = lease.release().await?;
    info!(?outcome, "lease released");
    Ok(done)
}
