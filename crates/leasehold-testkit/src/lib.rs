//! Test support for leasehold: throwaway `redis-server` processes for
//! integration tests, and the faults a lease must survive.
//!
//! [`RedisServer::start`] spawns a real `redis-server` on a free port of
//! 127.0.0.1, in its own temporary directory, without persistence, and
//! returns once it answers `PING`. The server can then be paused (SIGSTOP),
//! resumed, killed (SIGKILL), stopped (SIGTERM) and restarted on the same
//! port and directory; [`RedisServer::cli`] sends single commands through
//! the `redis` crate's synchronous client, so `redis-cli` is not needed.
//! Dropping the server kills it and removes its directory.
//!
//! Topologies: [`RedisCluster`] (N masters with optional replicas, made
//! with `redis-cli --cluster create`), [`SentinelSet`] (a master, a replica
//! and three sentinels) and [`independent_masters`] (for Redlock). They
//! poll for readiness rather than sleep, and report their setup time.
//!
//! Server calls are synchronous and short, and work inside `#[tokio::test]`.
//! Network faults come from a [`Proxy`] between clients and the server
//! (delay, blackhole, reset, switchable at runtime). A [`History`] of what
//! lease holders believed, and of the writes a fenced resource accepted,
//! is judged by [`History::check`]; a [`FaultPlan`] drawn from a seed
//! schedules the faults of a campaign. The [`conformance`] suite checks
//! the backend contract against any `LeaseBackend`, leasehold's own or a
//! third party's.
//! The server is Redis by default; `LEASEHOLD_SERVER=valkey` runs every
//! server, cluster and sentinel on `valkey-server` (and `valkey-cli`)
//! instead. The binary is found on `PATH`, or named directly by
//! `LEASEHOLD_REDIS_SERVER` (`LEASEHOLD_REDIS_CLI` for the client); see
//! [`redis_server_binary`] and [`ServerKind`]. Unix only.
//!
//! ```no_run
//! use leasehold_testkit::{RedisServer, TestkitError};
//!
//! # fn main() -> Result<(), TestkitError> {
//! let mut server = RedisServer::builder().appendonly(true).start()?;
//! assert_eq!(server.cli(&["SET", "lease", "me", "PX", "30000"])?, "OK");
//!
//! server.pause()?; // clients now time out
//! server.resume()?;
//!
//! server.kill()?; // crash...
//! server.restart()?; // ...and recover from the append-only file
//! assert_eq!(server.cli(&["GET", "lease"])?, "me");
//! println!("connect to {}", server.url());
//! # Ok(()) }
//! ```

mod binary;
mod campaign;
mod clock;
mod cluster;
pub mod conformance;
mod error;
mod history;
mod masters;
mod postgres;
mod process;
mod proxy;
mod resp;
mod sentinel;
mod serial;
mod server;

pub use binary::{
    REDIS_CLI_ENV, REDIS_SERVER_ENV, SECOND_PASS_ENV, SERVER_ENV, ServerKind, redis_cli_binary,
    redis_server_binary, skip_on_second_pass,
};
pub use campaign::{Fault, FaultPlan, PlanShape, ScheduledFault, fault_length};
pub use clock::{
    FAKETIME_SERVER_ENV, LIBFAKETIME_ENV, ShiftedClock, UNPACKED_FAKETIME_SERVER, faketime_offset,
    faketime_server, libfaketime,
};
pub use cluster::RedisCluster;
pub use error::TestkitError;
pub use history::{
    Excess, Excuse, FENCED_WRITE_SCRIPT, GrantOrder, History, Hold, HoldEnd, HoldId, Overlap,
    Report, ServerTime, Share, StaleWrite, TokenViolation, WriteAttempt, Writes,
};
pub use masters::independent_masters;
pub use postgres::{PG_BIN_ENV, PG_USER, PostgresServer, postgres_bin_dir};
pub use process::{join_within, output_within};
pub use proxy::{Proxy, ProxyMode};
pub use sentinel::{MASTER_NAME, SentinelSet};
pub use serial::{serial, serial_blocking};
pub use server::{RedisServer, ServerBuilder, free_port};
