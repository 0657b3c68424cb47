//! The vocabulary and the backend contract of leasehold.
//!
//! A *lease* is a time-bounded, owner-checked lock. This crate names its
//! parts and fixes what a storage backend must do, without any I/O:
//!
//! - [`LeaseKey`]: a validated key that knows its Redis Cluster hash tag;
//! - [`Ttl`]: a validated lease duration, parsed from humantime strings;
//! - [`HolderId`]: 128 unguessable bits naming one acquisition;
//! - [`FencingToken`]: strictly increasing per key across acquisitions;
//! - [`LockDelay`]: how long a key stays taken after its holder vanished;
//! - [`Grant`]: what a successful acquisition hands back, with a local,
//!   monotonic [`Grant::valid_until`];
//! - [`LeaseBackend`]: the core of the backend contract, one async method
//!   per atomic server-side operation every backend has, where a
//!   third-party backend starts; the optional capabilities are traits of
//!   their own ([`PermitBackend`], [`ReadWriteBackend`], [`FairBackend`],
//!   [`HandoverBackend`], [`ChangeBackend`], [`TickBackend`]) that a backend implements when
//!   it can;
//! - [`PermitLimit`] and [`LeaseKey::permit`]: counting leases, where up
//!   to N holders share a semaphore, each on a permit that is a lease;
//! - [`LeaseKey::writer_key`] and [`LeaseKey::reader_key`]: read-write
//!   leases, where readers share a key and a writer holds it alone;
//! - [`PlaceTtl`] and [`FairBackend::try_acquire_fair`]: fair mode, where
//!   waiters of every process queue on the server in arrival order;
//! - [`JobName`] and [`TickBackend::decide_tick`]: scheduled jobs whose
//!   ticks are decided on the backend's clock, one record per job;
//! - [`MemoryBackend`]: the same semantics in process, on the tokio clock.
//!
//! ```
//! use leasehold_core::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend, LeaseKey, MemoryBackend, Ttl};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = MemoryBackend::new();
//! let key = LeaseKey::new("reports:nightly")?;
//! let request = AcquireRequest::new(key, HolderId::generate()?, "30s".parse::<Ttl>()?);
//! match backend.try_acquire(&request).await? {
//!     AcquireOutcome::Acquired(grant) => println!("fencing token {}", grant.fencing_token),
//!     AcquireOutcome::Held(info) => println!("held for another {:?}", info.ttl_left),
//! }
//! # Ok(()) }
//! ```

#[doc(hidden)]
pub mod ablation;
mod backend;
mod capability;
mod change;
mod error;
mod fair;
mod fencing;
mod grant;
mod holder;
mod key;
mod lock_delay;
mod memory;
mod notice;
mod permit;
mod rw;
mod tick;
mod timing;
mod ttl;

pub use backend::{
    AcquireOutcome, AcquireRequest, HandoverOutcome, LeaseBackend, LeaseInfo, ReleaseOutcome,
    ReleaseReport, RenewOutcome, RenewRequest, WatchPolicy,
};
pub use capability::{
    ChangeBackend, FairBackend, HandoverBackend, NoCapability, PermitBackend, ReadWriteBackend,
};
pub use change::{ChangeFeed, ChangeWatch, LeaseChange};
pub use error::{BackendError, Cause, InputError};
pub use fair::{FairOutcome, FairPlace, HandoverWatch, PlaceTtl};
pub use fencing::FencingToken;
pub use grant::{Grant, valid_until};
pub use holder::HolderId;
pub use key::LeaseKey;
pub use lock_delay::LockDelay;
pub use memory::MemoryBackend;
pub use notice::ReleaseWatch;
pub use permit::PermitLimit;
pub use rw::{RwInfo, RwRole, WriteIntent};
pub use tick::{
    CatchUp, Completion, Decision, JobCounts, JobName, JobRecord, OnAbandon, RerunReply,
    RerunRequest, RunInfo, RunRecord, RunState, TickAnswer, TickBackend, TickReason, TickReply,
    TickRequest, TickState,
};
pub use timing::{clock_drift, parse_duration};
pub use ttl::Ttl;
