//! Keeping leases alive: the [`LeaseManager`], its single watchdog task, and
//! the [`Lease`] handle.
//!
//! A manager acquires leases from any [`LeaseBackend`] and renews each at a
//! third of its ttl. When a lease can no longer be kept, its holder's
//! [`CancellationToken`] is cancelled
//! with a [`LossReason`] *before* anyone else can take the lease:
//!
//! - [`LossReason::Lost`]: the server says it is gone or someone else's;
//! - [`LossReason::RenewalLimit`]: the cap on renewals was reached;
//! - [`LossReason::Deadline`]: renewals failed or hung until the lease's
//!   certain validity minus the safety margin ran out (no answer from the
//!   server needed);
//! - [`LossReason::MaxHold`]: the lease reached its maximum hold;
//! - [`LossReason::Stalled`]: the holder reported no progress within its
//!   window;
//! - [`LossReason::Shutdown`]: the manager shut down.
//!
//! ```
//! use std::time::Duration;
//! use leasehold_core::MemoryBackend;
//! use leasehold_watchdog::{LeaseManager, LeaseOptions};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let manager = LeaseManager::new(MemoryBackend::new())?;
//! let options = LeaseOptions::builder().ttl(Duration::from_secs(10)).wait(Duration::from_secs(5)).build()?;
//! let lease = manager.acquire("billing:close-month", &options).await?;
//! println!("fencing token {}", lease.fencing_token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! `config` (on by default): [`LeaseConfig`] and [`ConfigError`], lease
//! settings from TOML files or `LEASEHOLD_*` environment variables, with
//! serde and toml. `serde` is its former name.
//!
//! `prometheus` (off by default): `metrics::install_prometheus_buckets`,
//! which sets the buckets of every histogram on a
//! `metrics-exporter-prometheus` builder in one call (the bucket lists
//! themselves, [`metrics::BUCKETS`], need no feature).
//!
//! [`LeaseBackend`]: leasehold_core::LeaseBackend

mod attempt;
mod backoff;
mod bounds;
mod capability;
mod changes;
#[cfg(feature = "config")]
mod config;
mod election;
mod error;
mod handoff;
mod home;
mod intent;
mod leader;
mod lease;
#[cfg(all(test, loom))]
mod loom_races;
mod loss;
mod manager;
pub mod metrics;
mod options;
mod permits;
mod queue;
mod record;
mod renewal;
mod rw;
mod schedule;
mod scope;
mod shared;
mod shutdown;
pub mod tick;
mod timing;
mod turns;
mod waiting;
mod work;

pub use backoff::Backoff;
pub use bounds::Progress;
#[cfg(feature = "config")]
pub use config::{ConfigError, LeaseConfig};
pub use election::Election;
pub use error::LeaseError;
pub use leader::{Leader, UNREPORTED_RECHECK};
pub use lease::Lease;
/// The permit limit of a semaphore, re-exported for [`LeaseManager::acquire_permit`].
pub use leasehold_core::PermitLimit;
/// Fair mode's place ttl, re-exported for [`Fair::with_place_ttl`].
pub use leasehold_core::PlaceTtl;
/// The role of a read-write lease's share key, re-exported for
/// [`LeaseManager::acquire_read`] and [`LeaseManager::acquire_write`].
pub use leasehold_core::RwRole;
pub use loss::LossReason;
pub use manager::{DEFAULT_MAX_WAITERS, DEFAULT_SHUTDOWN_GRACE, LeaseManager, LeaseManagerBuilder};
pub use options::{Fair, LeaseOptions, LeaseOptionsBuilder};
pub use schedule::{Every, TickGrid};
pub use tick::{
    DEFAULT_START_DEADLINE, MAX_RECORD_TTL, MIN_RECORD_TTL, TickJob, TickJobBuilder, TickOutcome,
    TickRun,
};
/// The token type handed to holders, re-exported for convenience.
pub use tokio_util::sync::CancellationToken;
pub use work::WorkContext;
