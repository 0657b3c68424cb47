//! **leasehold**: watchdog-renewed leases on Redis.
//!
//! A lease is a time-bounded, owner-checked lock. leasehold acquires it
//! atomically with a fencing token, renews it from one background watchdog
//! for as long as your work runs, and cancels your
//! [`CancellationToken`] the moment the
//! lease can no longer be kept: *before* anyone else can take it.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold::{LeaseManager, LeaseOptions, redis::RedisBackend};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manager = LeaseManager::new(RedisBackend::connect("redis://127.0.0.1/").await?)?;
//! let options = LeaseOptions::builder().ttl("30s".parse()?).wait(Duration::from_secs(60)).build()?;
//! let lease = manager.acquire("reports:nightly", &options).await?;
//! let token = lease.token();
//! tokio::select! {
//!     () = token.cancelled() => eprintln!("lease ended: {:?}; stopping", lease.loss_reason()),
//!     () = tokio::time::sleep(Duration::from_secs(3600)) => println!("an hour of work done"),
//! }
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! This crate re-exports the parts: the vocabulary and [`MemoryBackend`]
//! from `leasehold-core`, the [`LeaseManager`] from `leasehold-watchdog`, and
//! the Redis backends as [`redis`].
//!
//! To operate leases: every manager records [`metrics`] (acquisitions,
//! renewals, losses, leases held, hold time) through the `metrics` facade,
//! [`LeaseConfig`] reads lease settings from TOML or `LEASEHOLD_*`
//! environment variables, and the `leasehold` command (crate
//! `leasehold-cli`) runs shell commands under a lease. docs/operations.md
//! has the details.
//!
//! For scheduled jobs: [`LeaseManager::run_tick`] with a [`TickJob`] runs
//! a job once per tick across a fleet, and crate `leasehold-cron` makes a
//! tokio-cron-scheduler job of it in one call.

pub use leasehold_core::*;
pub use leasehold_watchdog::*;

/// The Redis backends (and the `redis` client crate they use).
pub use leasehold_redis as redis;
