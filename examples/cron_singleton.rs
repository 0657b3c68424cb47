//! A cron job that three replicas schedule, started once per tick across
//! them: each replica has its own tokio-cron-scheduler, its own manager and
//! its own connection to one Redis, as three processes would, and
//! `leasehold_cron::fleet_job` asks the job's record on the server, whose
//! clock decides, for each tick. It prints who ran each tick, and ends
//! after 10 ticks.
//!
//! Run with `cargo run --example cron_singleton`.
//!
//! It uses the Redis at `LEASEHOLD_REDIS_URL` if set; otherwise it starts a
//! throwaway `redis-server` if one is installed; otherwise it runs on the
//! in-process `MemoryBackend` and says so.

mod common;

use std::time::Duration;

use common::Store;
use leasehold::backend::LeaseBackend;
use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, MemoryBackend, TickJob, TickOutcome};
use leasehold_cron::{Schedule, fleet_job_with_outcomes};
use tokio::sync::mpsc;
use tokio_cron_scheduler::JobScheduler;
use tracing::info;

/// Every second, on the second (cron with seconds first).
const SCHEDULE: &str = "* * * * * *";
const TICKS: usize = 10;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // tokio-cron-scheduler says at `info` when each scheduler starts.
    common::init_tracing("info,tokio_cron_scheduler=warn");

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
            demo(replicas).await
        }
        Store::Memory => {
            let backend = MemoryBackend::new();
            let replicas = (0..3)
                .map(|_| LeaseManager::new(backend.clone()))
                .collect::<Result<Vec<_>, _>>()?;
            demo(replicas).await
        }
    }
}

async fn demo<B: LeaseBackend>(
    replicas: Vec<LeaseManager<B>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let (ran, mut runs) = mpsc::unbounded_channel();
    let mut schedulers = Vec::new();
    for (i, manager) in replicas.into_iter().enumerate() {
        let name = format!("replica-{i}");
        // The label is what the record, and so the other replicas, show.
        let schedule = Schedule::parse(SCHEDULE)?;
        let job = TickJob::builder("report", schedule.clone())
            .lease(LeaseOptions::builder().label(name.clone()))
            .build()?;
        let ran = ran.clone();
        let me = name.clone();
        let work = move |run: leasehold::TickRun| {
            let (ran, me) = (ran.clone(), me.clone());
            async move {
                // The job itself: here, only saying who ran which tick.
                let _ = ran.send((run.tick(), me, run.fencing_token()));
            }
        };
        let skipped = move |_: &TickJob, outcome: Result<TickOutcome<()>, _>| match outcome {
            Ok(TickOutcome::Decided { decision, .. }) => {
                let by = decision.run.and_then(|r| r.label).unwrap_or_default();
                info!(
                    "{name}: decided already ({}, {by})",
                    decision.state.as_str()
                );
            }
            Ok(TickOutcome::Missed { .. }) => info!("{name}: the tick was missed"),
            Err(error) => info!("{name}: {error}"),
            Ok(_) => {}
        };
        let scheduler = JobScheduler::new().await?;
        scheduler
            .add(fleet_job_with_outcomes(
                manager, job, &schedule, work, skipped,
            )?)
            .await?;
        scheduler.start().await?;
        schedulers.push(scheduler);
    }
    drop(ran);

    for _ in 0..TICKS {
        // A tick a second; bounded, so that a broken setup ends the example.
        let (tick, replica, token) = tokio::time::timeout(Duration::from_secs(10), runs.recv())
            .await?
            .ok_or("every replica stopped")?;
        info!(
            "tick {}: {replica} ran it (fencing token {token})",
            humantime::format_rfc3339_seconds(tick)
        );
    }
    for mut scheduler in schedulers {
        scheduler.shutdown().await?;
    }
    Ok(())
}
