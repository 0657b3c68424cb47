//! Redis backends for leasehold.
//!
//! [`RedisBackend`] implements [`leasehold_core::LeaseBackend`] on a
//! standalone Redis server (`redis://`, `rediss://` with the default `tls`
//! feature, `redis+unix://`), a Redis Cluster or a Sentinel-monitored
//! master; [`RedlockBackend`] on N independent masters. Every operation is one Lua script, run
//! atomically by the server:
//!
//! | operation      | script        | what the server does                                                   |
//! |----------------|---------------|------------------------------------------------------------------------|
//! | `try_acquire`  | `acquire.lua` | take the lease if free (or refresh our own), advance the fencing counter |
//! | `renew`, `renew_many` | `renew.lua` | if the lease is still ours, extend it (compare-and-pexpire), per lease |
//! | `release`      | `release.lua` | if the lease is still ours, delete it (compare-and-delete), or keep it until its minimum hold ends |
//! | `inspect`      | `inspect.lua` | read the lease's label, fencing token and ttl                          |
//!
//! The scripts are built once and called by `EVALSHA`; a server that forgot
//! them (restart, failover, `SCRIPT FLUSH`) gets a script again on a call's
//! `NOSCRIPT`, once for all the calls of that script that met it there.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold_core::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Ttl};
//! use leasehold_redis::RedisBackend;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::builder("redis://127.0.0.1:6379")
//!     .op_timeout(Duration::from_millis(500))
//!     .connect()
//!     .await?;
//! let key = LeaseKey::new("reports:nightly")?;
//! let holder = HolderId::generate()?;
//! let request = AcquireRequest::new(key.clone(), holder, Ttl::parse("30s")?).with_label("worker-3")?;
//! match backend.try_acquire(&request).await? {
//!     AcquireOutcome::Acquired(grant) => {
//!         println!("ours, fencing token {}", grant.fencing_token);
//!         backend.release(&key, &holder).await?;
//!     }
//!     AcquireOutcome::Held(info) => println!("held by {:?} for {:?}", info.label, info.ttl_left),
//! }
//! # Ok(()) }
//! ```
//!
//! # Key layout
//!
//! For a lease key `K` in namespace `N` (default `leasehold`, see
//! [`RedisBackendBuilder::namespace`]) the prefix `P` is `N:K` when `K` has a
//! Redis Cluster hash tag ([`LeaseKey::hash_tag`](leasehold_core::LeaseKey::hash_tag)),
//! else `N:{K}`:
//!
//! | lease key     | lease (`P`)                   | fencing counter (`P:fence`)         |
//! |---------------|-------------------------------|-------------------------------------|
//! | `reports`     | `leasehold:{reports}`         | `leasehold:{reports}:fence`         |
//! | `order:{42}`  | `leasehold:order:{42}`        | `leasehold:order:{42}:fence`        |
//!
//! Both keys of a lease share a hash tag, so they sit in one cluster slot by
//! construction, and a key with its own tag lands in the slot of the data
//! that carries the same tag.
//!
//! `P` holds the string `<holder id, 32 hex digits>:<fencing token>:<label>`
//! (the label may be empty) with an expiry of the lease's ttl. The holder id
//! never leaves the server through this crate: [`LeaseBackend::inspect`](leasehold_core::LeaseBackend::inspect)
//! and `Held` outcomes show only the label, the token and the ttl left.
//! `P:fence` holds the last fencing token handed out, for the fencing
//! counter's retention after each grant (an hour by default; see
//! [`RedisBackendBuilder::fence_retention`]).
//! A key written by something else shows up as held, with no token and, if
//! it has no expiry, no ttl.
//!
//! # Fencing tokens
//!
//! A new acquisition takes `max(counter + 1, server time in µs)` as its
//! token: tokens rise by one per acquisition, and keep rising even if a
//! restart without persistence lost the counter (as long as the server's
//! clock does not go back). A holder acquiring again keeps its token.
//!
//! # Timeouts and errors
//!
//! Every call is bounded by the op timeout (default 2 s); running out gives
//! [`BackendError::Timeout`](leasehold_core::BackendError::Timeout), whose
//! outcome is unknown. A lease key holding a non-string value gives
//! [`BackendError::WrongType`](leasehold_core::BackendError::WrongType) (a
//! renewal reports it as `Lost`). Setup errors are [`ConnectError`]s, and no error
//! message or `Debug` output shows a password.
//!
//! # Features
//!
//! - `tls` (default): `rediss://` URLs, with rustls and the operating
//!   system's root certificates. If no rustls crypto provider is installed
//!   for the process, connecting to a `rediss://` URL installs *ring*.
//! - `tls-insecure`: also accept `rediss://…/#insecure`, which skips
//!   certificate checks. For test setups; otherwise build a
//!   [`redis::Client`] with your CA and use [`RedisBackend::builder_for_client`].
//!
//! # Topologies
//!
//! The same backend talks to a standalone server, a Redis Cluster
//! (`redis+cluster://h1:7000,h2:7000`) or a Sentinel-monitored master
//! (`redis+sentinel://h1:26379,h2:26379/mymaster`), chosen by the
//! connection string ([`Endpoint`] lists every form).
//! [`RedlockBackend`] holds leases on a majority of N independent masters.
//! In a cluster, `renew_many` sends one script call per slot, all at once.
//! [`RedisBackendBuilder::wait_for_replicas`] adds a `WAIT` after every
//! write. `docs/topologies.md` states each topology's guarantees and limits.
//!
//! ```no_run
//! use leasehold_redis::{RedisBackend, RedlockBackend};
//!
//! # async fn run() -> Result<(), leasehold_redis::ConnectError> {
//! let cluster = RedisBackend::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
//! let sentinel = RedisBackend::connect("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster").await?;
//! let redlock = RedlockBackend::builder(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
//!     .connect()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Cargo features
//!
//! | feature | default | what it brings |
//! |---------|---------|----------------|
//! | `tls` | on | `rediss://` URLs (rustls with the operating system's root certificates) |
//! | `tls-insecure` | off | `rediss://…/#insecure`, which skips certificate checks |
//! | `cluster` | on | Redis Cluster (`redis+cluster://`), with the redis crate's `cluster-async` client |
//! | `sentinel` | on | Sentinel (`redis+sentinel://`), with the redis crate's `sentinel` client |
//!
//! A URL of a topology whose feature is off is refused when parsed, with
//! [`ConnectError::FeatureDisabled`] naming the feature. A cluster behind one
//! address (a proxy or a managed service) is a standalone URL and needs no
//! feature.

mod absent;
mod backend;
mod capabilities;
mod coalesce;
mod config;
mod connection;
mod error;
mod fair;
mod fence;
mod holds;
mod layout;
mod loads;
mod notices;
mod redlock;
mod reply;
mod scripts;
mod switches;
mod tracking;
mod url;

pub use backend::RedisBackend;
pub use capabilities::ServerInfo;
pub use config::RedisBackendBuilder;
pub use error::{ConnectError, Missing, redact};
pub use fence::{Fence, FencedValue, FencedWrite};
pub use layout::KeyLayout;
/// The redis client library, to build a [`redis::Client`] for
/// [`RedisBackend::builder_for_client`] (TLS certificates, credentials
/// from a secret store, TCP options).
pub use redis;
pub use redlock::{NoQuorum, RedlockBackend, RedlockBuilder};
pub use url::{Endpoint, Topology};
