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
//! let options = LeaseOptions::builder().ttl(Duration::from_secs(30)).wait(Duration::from_secs(60)).build()?;
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
//! Without options, [`LeaseManager::try_acquire`] takes a lease once with
//! the defaults (a 30 s ttl renewed every 10 s).
//!
//! The root holds what a user of leases writes: the [`LeaseManager`] and
//! its [`LeaseOptions`] (with [`Fair`] for fair mode), the [`Lease`] handle, [`Election`], the error
//! users handle ([`Error`], the watchdog's [`LeaseError`]), the values they
//! pass ([`Ttl`], [`LockDelay`], [`PermitLimit`], [`PlaceTtl`], [`LeaseKey`])
//! and what they are told ([`FencingToken`], [`LossReason`], [`LeaseInfo`],
//! [`RwInfo`], [`ReleaseOutcome`], [`Leader`]), with [`MemoryBackend`] for
//! one process and the Redis backends as [`redis`]. What a backend
//! implementor needs (the [`LeaseBackend`] contract
//! and its requests and outcomes) lives in [`backend`].
//!
//! To operate leases: every manager records [`metrics`] (acquisitions,
//! renewals, losses, leases held, hold time) through the `metrics` facade,
//! `LeaseConfig` (feature `config`) reads lease settings from TOML or
//! `LEASEHOLD_*` environment variables, and the `leasehold` command (crate
//! `leasehold-cli`) runs shell commands under a lease. docs/operations.md
//! has the details.
//!
//! For scheduled jobs: a [`TickJob`] is started once per tick across a
//! fleet, decided on the server's clock by the job's record
//! ([`LeaseManager::run_tick`] for one tick, [`LeaseManager::run_schedule`]
//! for a long-lived node that also re-runs abandoned runs); crate
//! `leasehold-cron` gives cron schedules with time zones and a
//! tokio-cron-scheduler job in one call.
//!
//! # Cargo features
//!
//! All but `prometheus` on by default; leave out what you do not use with
//! `default-features = false` and a list of the ones you do:
//!
//! | feature | what it brings |
//! |---------|----------------|
//! | `tls` | `rediss://` URLs (rustls, the operating system's root certificates) |
//! | `cluster` | Redis Cluster URLs (`redis+cluster://`), with the redis crate's async cluster client |
//! | `sentinel` | Sentinel URLs (`redis+sentinel://`), with the redis crate's Sentinel client |
//! | `config` | `LeaseConfig` and `ConfigError`: lease settings from TOML files or `LEASEHOLD_*` variables (serde, toml) |
//! | `prometheus` (off by default) | `metrics::install_prometheus_buckets`: the buckets of every histogram, which the shipped alert rules and dashboard read, set on a `metrics-exporter-prometheus` 0.18 builder in one call (`metrics::BUCKETS` lists them without the feature) |
//!
//! A Cluster or Sentinel URL in a build without its feature is refused
//! with [`redis::ConnectError::FeatureDisabled`], which names the feature.

/// A backend's error, at the root too: [`Error::Backend`] carries it, and
/// users match on its kinds (a timeout, an unreachable server).
pub use leasehold_core::BackendError;
/// The error of invalid input (a key, a ttl, a duration) where it is
/// checked before any lease is asked for, such as [`LeaseKey::new`];
/// [`Error`] carries it as [`Error::Invalid`].
pub use leasehold_core::InputError;
/// The contract every backend fulfils, at the root too: code generic over a
/// manager's backend names it as a bound (`LeaseManager<B: LeaseBackend>`).
pub use leasehold_core::LeaseBackend;
pub use leasehold_core::{CatchUp, JobName, OnAbandon};
pub use leasehold_core::{
    FencingToken, LeaseInfo, LeaseKey, LockDelay, MemoryBackend, PermitLimit, PlaceTtl,
    ReleaseOutcome, RwInfo, RwRole, Ttl, WriteIntent,
};
/// The error users handle: [`LeaseError`], under the name a crate's error
/// usually has.
pub use leasehold_watchdog::LeaseError as Error;
pub use leasehold_watchdog::{
    Backoff, CancellationToken, DEFAULT_MAX_WAITERS, DEFAULT_SHUTDOWN_GRACE, Election, Every, Fair,
    Leader, Lease, LeaseError, LeaseManager, LeaseManagerBuilder, LeaseOptions,
    LeaseOptionsBuilder, LossReason, Progress, TickGrid, TickJob, TickJobBuilder, TickOutcome,
    TickRun, UNREPORTED_RECHECK, WorkContext, metrics, tick,
};
#[cfg(feature = "config")]
pub use leasehold_watchdog::{ConfigError, LeaseConfig};

/// What a backend implementor needs: the [`LeaseBackend`] contract (a
/// third-party backend starts from its four required methods), the
/// capability traits a backend implements when it can
/// ([`PermitBackend`](backend::PermitBackend),
/// [`ReadWriteBackend`](backend::ReadWriteBackend),
/// [`FairBackend`](backend::FairBackend),
/// [`HandoverBackend`](backend::HandoverBackend),
/// [`ChangeBackend`](backend::ChangeBackend),
/// [`TickBackend`](backend::TickBackend)), their requests and
/// outcomes, and the helpers that compute a grant's validity. A user of
/// leases does not need this module.
pub mod backend {
    pub use leasehold_core::{
        AcquireOutcome, AcquireRequest, BackendError, Cause, ChangeBackend, ChangeFeed,
        ChangeWatch, FairBackend, FairOutcome, FairPlace, Grant, HandoverBackend, HandoverOutcome,
        HandoverWatch, HolderId, LeaseBackend, LeaseChange, NoCapability, PermitBackend,
        ReadWriteBackend, ReleaseReport, ReleaseWatch, RenewOutcome, RenewRequest, WatchPolicy,
        clock_drift, parse_duration, valid_until,
    };
    pub use leasehold_core::{
        Completion, RerunReply, RerunRequest, TickAnswer, TickBackend, TickReply, TickRequest,
    };
}

/// A scheduled job's record as the backend keeps it, and the decisions
/// it holds: what `leasehold jobs` lists, and what a [`TickOutcome`]
/// reports.
pub mod jobs {
    pub use leasehold_core::{
        Decision, JobCounts, JobRecord, RunInfo, RunRecord, RunState, TickReason, TickState,
    };
}

pub mod redis {
    //! The Redis backends: [`RedisBackend`] on a standalone server, a
    //! Redis Cluster or a Sentinel-monitored master, chosen by the URL
    //! ([`Endpoint`] lists every form), and [`RedlockBackend`] on a
    //! majority of N independent masters. Every lease operation is one Lua
    //! script, run atomically by the server; [`KeyLayout`] shows the keys a
    //! lease keeps there, and [`RedisBackend::fence`] gives writes that the
    //! server refuses from a stale holder.
    //!
    //! ```no_run
    //! use std::time::Duration;
    //! use leasehold::LeaseManager;
    //! use leasehold::redis::{ConnectError, RedisBackend, RedlockBackend};
    //!
    //! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    //! let backend = RedisBackend::builder("redis://127.0.0.1:6379")
    //!     .op_timeout(Duration::from_millis(500))
    //!     .connect()
    //!     .await?;
    //! let manager = LeaseManager::new(backend)?;
    //!
    //! let cluster = RedisBackend::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    //! let sentinel = RedisBackend::connect("redis+sentinel://10.0.0.1:26379/mymaster").await?;
    //! let redlock = RedlockBackend::builder(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
    //!     .connect()
    //!     .await?;
    //!
    //! // Setting up can fail: a bad URL, a server that cannot be reached or
    //! // cannot hold leases, a feature left out of the build.
    //! match RedisBackend::connect("redis://cache.internal:6379").await {
    //!     Ok(backend) => drop(backend),
    //!     Err(e @ ConnectError::Connect { .. }) => eprintln!("not reachable yet: {e}"),
    //!     Err(e) => return Err(e.into()),
    //! }
    //! # Ok(()) }
    //! ```
    //!
    //! Setting up fails with a [`ConnectError`], whose messages never show a
    //! password ([`redact`]); a lease operation on a running backend fails
    //! with a [`BackendError`](crate::BackendError). The client crate the
    //! backends are built on is [`redis`], to build a client of
    //! your own (TLS certificates, credentials from a secret store) for
    //! [`RedisBackend::builder_for_client`].
    //!
    //! The crate leasehold-redis, which this module re-exports, documents
    //! the scripts, the key layout and the fencing counters in full, with
    //! its own paths; docs/topologies.md states each topology's guarantees.
    pub use leasehold_redis::{
        ConnectError, Endpoint, Fence, FencedValue, FencedWrite, KeyLayout, Missing, NoQuorum,
        RedisBackend, RedisBackendBuilder, RedlockBackend, RedlockBuilder, ServerInfo, Topology,
        redact,
    };
    // A link to the client crate's own documentation, not a copy of it.
    #[doc(no_inline)]
    pub use leasehold_redis::redis;
}
