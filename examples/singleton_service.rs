//! Three replicas of a long-running singleton service (a queue consumer, a
//! controller) elect one leader, which consumes work for as long as it
//! leads; when the leader's lease is deleted, another replica takes over
//! within about one ttl.
//!
//! An election is for a service that must run on exactly one replica all
//! the time. It is not for ticks of a schedule: between two terms there is
//! a handover, and a tick due then is run by the old leader, the new one,
//! both or neither. A scheduled job's ticks are decided by its record on the
//! server (`TickJob`, `examples/cron_singleton.rs`).
//!
//! Run with `cargo run --example singleton_service`.
//!
//! It uses the Redis at `LEASEHOLD_REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` if one is installed; otherwise it runs on the
//! in-process `MemoryBackend` and says so.

mod common;

use common::Store;
use std::time::Duration;

use leasehold::backend::LeaseBackend;
use leasehold::redis::RedisBackend;
use leasehold::{
    CancellationToken, Election, LeaseKey, LeaseManager, LeaseOptions, MemoryBackend, Ttl,
};
use tokio::time::Instant;
use tracing::info;

const KEY: &str = "consumer";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::init_tracing("info");

    let store = common::choose_store();
    match &store {
        Store::Redis { url, .. } => {
            let mut replicas = Vec::new();
            for _ in 0..3 {
                // One connection per replica, as three processes would have.
                replicas.push(LeaseManager::new(
                    RedisBackend::connect(url.as_str()).await?,
                )?);
            }
            let admin = RedisBackend::connect(url.as_str()).await?;
            demo(replicas, move || {
                let admin = admin.clone();
                async move { Ok(admin.force_release(&LeaseKey::new(KEY)?).await?) }
            })
            .await
        }
        Store::Memory => {
            let backend = MemoryBackend::new();
            // A client each, as three processes would be.
            let replicas = (0..3)
                .map(|_| LeaseManager::new(backend.client()))
                .collect::<Result<Vec<_>, _>>()?;
            demo(replicas, move || {
                let deleted = backend.vanish(&LeaseKey::new(KEY).expect("valid key"));
                async move { Ok(deleted) }
            })
            .await
        }
    }
}

async fn demo<B, F>(
    replicas: Vec<LeaseManager<B>>,
    delete_lease: impl Fn() -> F,
) -> Result<(), Box<dyn std::error::Error>>
where
    B: LeaseBackend,
    F: Future<Output = Result<bool, Box<dyn std::error::Error>>>,
{
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut runs = Vec::new();
    // Who leads, as any replica (or a dashboard) can follow it: told of
    // each change, not polled.
    let mut leader = replicas
        .first()
        .ok_or("no replicas")?
        .watch_leader(KEY)
        .await?;
    for (i, manager) in replicas.into_iter().enumerate() {
        let name = format!("replica-{i}");
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse("3s")?)
            .label(name.clone())
            .name("consumer")
            .build()?;
        let election = Election::new(manager, KEY, options)?;
        let stop = stop.clone();
        runs.push(tokio::spawn(async move {
            election
                .run(stop, |work| {
                    let (token, fencing_token) = (work.token().clone(), work.fencing_token());
                    let name = name.clone();
                    async move {
                        info!("{name} leads (fencing token {fencing_token})");
                        // The service itself: here, a consumer that takes one
                        // item a second, and stops the moment it loses the
                        // lead (the token fires before another can lead).
                        let mut next = tokio::time::interval(Duration::from_secs(1));
                        let mut item = 0_u64;
                        loop {
                            tokio::select! {
                                () = token.cancelled() => break,
                                _ = next.tick() => {
                                    item += 1;
                                    info!("{name}: consumed item {item} at {:.1?}", started.elapsed());
                                }
                            }
                        }
                        info!("{name} stops leading");
                    }
                })
                .await
        }));
    }

    tokio::time::sleep(Duration::from_secs(4)).await;
    let deposed = leader.borrow_and_update().clone().ok_or("no one leads")?;
    info!(
        "operator deletes the lease of {:?}",
        deposed.label.unwrap_or_default()
    );
    let deleted_at = Instant::now();
    delete_lease().await?;
    let next = leader
        .wait_for(|l| {
            l.as_ref()
                .is_some_and(|l| l.fencing_token != deposed.fencing_token)
        })
        .await?
        .clone()
        .ok_or("no one leads")?;
    info!(
        "{} leads again {:.1?} after the deletion",
        next.label.unwrap_or_default(),
        deleted_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    for run in runs {
        run.await??;
    }
    info!("all replicas stopped");
    Ok(())
}
