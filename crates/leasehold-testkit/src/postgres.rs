//! Throwaway PostgreSQL servers, for the tests of the fenced store
//! (`leasehold-postgres`), started the way [`RedisServer`](crate::RedisServer)
//! starts `redis-server`: on a free port of 127.0.0.1, in a temporary
//! directory, without durability.
//!
//! How it runs (checked on Debian 12 with PostgreSQL 15):
//!
//! - The binaries are found in [`PG_BIN_ENV`] (`LEASEHOLD_PG_BIN`, a `bin`
//!   directory), else the newest `/usr/lib/postgresql/<version>/bin`
//!   (Debian keeps them off `PATH`), else the directory of an `initdb` on
//!   `PATH`.
//! - `initdb` and `postgres` refuse to run as root, and CI runs as root: as
//!   root the directory is handed to the `postgres` user (the package
//!   creates it) and `initdb` and `pg_ctl` run under `runuser -u postgres
//!   --`; as anyone else they run directly. Clients (`createdb`, `psql`, the
//!   driver under test) connect over TCP as the superuser `test`, without a
//!   password (`initdb -U test -A trust`).
//! - `pg_ctl start -w` returns once the server accepts connections (at most
//!   30 s); a port taken meanwhile by another process is
//!   retried with a new one. `fsync=off`: the data needs to survive no crash.
//! - The server runs in a session of its own (`pg_ctl` detaches it), so it
//!   is not this process's child and would outlive it. Two things stop it,
//!   always by its data directory (`pg_ctl stop -m immediate`), never by a
//!   process name: dropping the [`PostgresServer`], and a *guard*, a small
//!   shell started with it that waits for its standard input to close. This
//!   process holds the other end of that pipe, so when it exits in any way
//!   (a panic, SIGKILL, or the end of a test binary whose
//!   [`PostgresServer::shared`] server is never dropped) the guard stops the
//!   server and removes its directory.
//!
//! initdb and start take 1 to 3 s, so a test binary starts one server
//! ([`PostgresServer::shared`]) and gives each test a database of its own
//! ([`PostgresServer::create_database`]).

use std::env;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{TestkitError, output_within};

/// Environment variable naming the directory of PostgreSQL's binaries
/// (`initdb`, `pg_ctl`, `createdb`, `psql`), for a PostgreSQL that is not in
/// `/usr/lib/postgresql/<version>/bin` or whose `initdb` is not on `PATH`.
pub const PG_BIN_ENV: &str = "LEASEHOLD_PG_BIN";

/// The superuser `initdb` creates, whom clients connect as (no password).
pub const PG_USER: &str = "test";

/// How long `pg_ctl start` waits for the server to accept connections.
const START_TIMEOUT_SECS: u32 = 30;

/// The system user that runs the server when the tests run as root.
const SYSTEM_USER: &str = "postgres";
/// Where Debian and Ubuntu install each major version.
const DEBIAN_ROOT: &str = "/usr/lib/postgresql";
/// How long `initdb` may take (about a second here).
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `pg_ctl` itself may take, beyond the wait it is told.
const PG_CTL_TIMEOUT: Duration = Duration::from_secs(START_TIMEOUT_SECS as u64 + 10);
/// How long a client command (`createdb`, `psql`) may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long dropping the server waits for its guard to finish.
const GUARD_TIMEOUT: Duration = Duration::from_secs(10);
/// How many lines of the log file go into errors.
const LOG_TAIL_LINES: usize = 20;
/// The data directory and the log file, inside the server's directory
/// (which also holds the Unix socket).
const DATA_DIR: &str = "data";
const LOG_FILE: &str = "postgres.log";

/// The guard: waits until this process closes (or loses) the pipe on its
/// standard input, then runs the stop command and removes the directory.
/// It ignores the terminal's signals, so that a Ctrl-C that ends the tests
/// does not end the guard before it has stopped the server.
/// `$1` is the directory, the rest the stop command.
const GUARD_SCRIPT: &str = r#"trap '' INT TERM HUP QUIT
dir=$1
shift
read -r _ignored
"$@" >/dev/null 2>&1
rm -rf -- "$dir""#;

/// The directory holding PostgreSQL's binaries: [`PG_BIN_ENV`] when set,
/// else the newest `/usr/lib/postgresql/<version>/bin`, else the directory
/// of an `initdb` on `PATH`.
///
/// # Errors
///
/// [`TestkitError::Io`] (`NotFound`, saying how to install PostgreSQL) when
/// none of them has an `initdb`.
pub fn postgres_bin_dir() -> Result<PathBuf, TestkitError> {
    if let Some(dir) = env::var_os(PG_BIN_ENV).filter(|dir| !dir.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").is_file() {
            return Ok(dir);
        }
        return Err(not_installed(&format!(
            "{PG_BIN_ENV} is {}, which has no initdb; set it to PostgreSQL's bin directory",
            dir.display()
        )));
    }
    let newest = fs::read_dir(DEBIAN_ROOT).ok().and_then(|entries| {
        entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let version: u32 = entry.file_name().to_str()?.parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("initdb").is_file().then_some((version, bin))
            })
            .max_by_key(|(version, _)| *version)
    });
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let on_path = env::var_os("PATH")
        .and_then(|path| env::split_paths(&path).find(|dir| dir.join("initdb").is_file()));
    on_path.ok_or_else(|| {
        not_installed(&format!(
            "PostgreSQL's initdb was found neither in {DEBIAN_ROOT}/<version>/bin nor on PATH"
        ))
    })
}

fn not_installed(what: &str) -> TestkitError {
    TestkitError::Io(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{what}: install PostgreSQL (`apt-get install -y postgresql` on Debian/Ubuntu, \
             which scripts/test.sh does; `brew install postgresql` on macOS), or set \
             {PG_BIN_ENV} to the directory of its binaries"
        ),
    ))
}

/// A throwaway PostgreSQL server listening on 127.0.0.1, with the
/// superuser [`PG_USER`] and no password.
///
/// Its directory holds the data directory, the Unix socket and the log
/// file (`postgres.log`). Calls are blocking (`createdb` takes about
/// 100 ms, `psql` about 30 ms), fine inside `#[tokio::test]`.
///
/// Dropping it stops the server (`pg_ctl stop -m immediate`) and removes
/// the directory; the guard described in the module does the same if this
/// process dies first.
///
/// ```no_run
/// use leasehold_testkit::{PostgresServer, TestkitError};
///
/// # fn main() -> Result<(), TestkitError> {
/// let server = PostgresServer::shared()?; // one per test binary
/// let url = server.create_database()?; // one per test
/// println!("connect tokio-postgres to {url}");
/// assert_eq!(server.psql(&url, "SELECT 1 + 1")?, "2");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PostgresServer {
    bin: PathBuf,
    port: u16,
    /// Whether the server's tools run as [`SYSTEM_USER`] (this process is root).
    as_system_user: bool,
    running: bool,
    /// Stops the server when this process goes away without dropping it.
    guard: Option<Child>,
    databases: AtomicUsize,
    dir: TempDir,
}

/// The server of [`PostgresServer::shared`].
static SHARED: Mutex<Option<&'static PostgresServer>> = Mutex::new(None);

impl PostgresServer {
    /// Creates a cluster with `initdb` in a new temporary directory and
    /// starts it on a free loopback port; returns once it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`]: PostgreSQL not installed (see
    /// [`postgres_bin_dir`]), no `postgres` user to run it as root, or
    /// `initdb` failed (with its output); [`TestkitError::Spawn`] for the
    /// guard; [`TestkitError::TopologyNotReady`] when the server did not
    /// start (with its log), [`TestkitError::PortInUse`] when five free
    /// ports in a row were taken by others.
    pub fn start() -> Result<PostgresServer, TestkitError> {
        let bin = postgres_bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("leasehold-postgres-")
            .tempdir()?;
        let as_system_user = nix::unistd::geteuid().is_root();
        if as_system_user {
            hand_to_system_user(dir.path())?;
        }
        let mut server = PostgresServer {
            bin,
            port: 0,
            as_system_user,
            running: false,
            guard: None,
            databases: AtomicUsize::new(0),
            dir,
        };
        server.initdb()?;
        server.spawn_guard()?;
        crate::server::on_a_free_port(|port| {
            server.port = port;
            server.pg_ctl_start()
        })?;
        Ok(server)
    }

    /// The server of this test binary, started by the first call and
    /// shared by every later one (tests run on threads of one process).
    /// It is never dropped: its guard stops it when the process exits.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); a later call tries again.
    pub fn shared() -> Result<&'static PostgresServer, TestkitError> {
        let mut slot = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(server) = *slot {
            return Ok(server);
        }
        let server: &'static PostgresServer = Box::leak(Box::new(Self::start()?));
        *slot = Some(server);
        Ok(server)
    }

    /// The TCP port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding PostgreSQL's binaries that runs this server.
    pub fn bin_dir(&self) -> &Path {
        &self.bin
    }

    /// The server's directory (data directory, socket, log file).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The connection URL of `database`, as tokio-postgres and `psql`
    /// take it: `postgresql://test@127.0.0.1:PORT/DATABASE`.
    pub fn url(&self, database: &str) -> String {
        format!("postgresql://{PG_USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a new empty database, named `test_<n>` (`n` counts the
    /// databases this value created), and returns its URL. Each test takes
    /// one, so that tests sharing the server share no table.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] when `createdb` fails (with its output) or
    /// takes more than 30 s.
    pub fn create_database(&self) -> Result<String, TestkitError> {
        let name = format!(
            "test_{}",
            self.databases.fetch_add(1, Ordering::Relaxed) + 1
        );
        let mut createdb = Command::new(self.bin.join("createdb"));
        createdb
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
            ])
            .arg(&name)
            .stdin(Stdio::null());
        run(&mut createdb, CLIENT_TIMEOUT)?;
        Ok(self.url(&name))
    }

    /// Runs `sql` with `psql` against the database of `url` (a URL from
    /// [`url`](Self::url) or [`create_database`](Self::create_database))
    /// and returns what it printed, unaligned and without headers: one
    /// line per row, columns separated by `|`, trailing newline removed.
    /// A separate program on a separate connection: a witness of the
    /// database's own state that shares nothing with the driver under test.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] when `psql` fails (an SQL error stops it: its
    /// message is in the error) or takes more than 30 s.
    pub fn psql(&self, url: &str, sql: &str) -> Result<String, TestkitError> {
        let mut psql = Command::new(self.bin.join("psql"));
        psql.args([
            "-X",
            "-q",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            url,
            "-c",
            sql,
        ])
        .stdin(Stdio::null());
        let stdout = run(&mut psql, CLIENT_TIMEOUT)?;
        Ok(stdout.trim_end_matches('\n').to_owned())
    }

    /// Stops the server at once (`pg_ctl stop -m immediate`: no checkpoint,
    /// like a crash); does nothing if it is not running. Dropping the
    /// server does this too.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] when `pg_ctl` fails or takes too long.
    pub fn stop(&mut self) -> Result<(), TestkitError> {
        if !self.running {
            return Ok(());
        }
        let mut pg_ctl = self.server_tool("pg_ctl");
        pg_ctl.args(self.stop_args());
        run(&mut pg_ctl, PG_CTL_TIMEOUT)?;
        self.running = false;
        Ok(())
    }

    fn initdb(&self) -> Result<(), TestkitError> {
        let mut initdb = self.server_tool("initdb");
        initdb
            .arg("-D")
            .arg(self.data_dir())
            .args(["-U", PG_USER, "-A", "trust", "-E", "UTF8", "--locale=C"])
            // No fsync of the new cluster: it need not survive a crash.
            .args(["--no-sync", "--no-instructions"]);
        run(&mut initdb, INITDB_TIMEOUT)?;
        Ok(())
    }

    fn pg_ctl_start(&mut self) -> Result<(), TestkitError> {
        let log_offset = fs::metadata(self.log_path()).map_or(0, |meta| meta.len());
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.path().display()
        );
        let mut pg_ctl = self.server_tool("pg_ctl");
        pg_ctl
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args([
                "-w",
                "-t",
                &START_TIMEOUT_SECS.to_string(),
                "-o",
                &options,
                "start",
            ]);
        let started = Instant::now();
        let outcome = output_within(&mut pg_ctl, PG_CTL_TIMEOUT);
        match outcome {
            Ok(output) if output.status.success() => {
                self.running = true;
                Ok(())
            }
            Ok(output) => {
                let log_tail = self.log_tail(log_offset);
                if log_tail.contains("Address already in use") {
                    return Err(TestkitError::PortInUse {
                        port: self.port,
                        attempts: 1,
                        log_tail,
                    });
                }
                Err(TestkitError::TopologyNotReady {
                    topology: "PostgreSQL server",
                    after: started.elapsed(),
                    detail: format!(
                        "pg_ctl start failed with {}: {}{}; last log lines:\n{log_tail}",
                        output.status,
                        String::from_utf8_lossy(&output.stdout).trim(),
                        String::from_utf8_lossy(&output.stderr).trim(),
                    ),
                })
            }
            Err(error) => {
                // pg_ctl hung: the server may be up or half up; stop it by
                // its data directory before reporting.
                let _ = run(
                    self.server_tool("pg_ctl").args(self.stop_args()),
                    PG_CTL_TIMEOUT,
                );
                Err(TestkitError::TopologyNotReady {
                    topology: "PostgreSQL server",
                    after: started.elapsed(),
                    detail: format!("{error}; last log lines:\n{}", self.log_tail(log_offset)),
                })
            }
        }
    }

    /// Starts the guard: a shell that stops the server and removes the
    /// directory once this process's end of its standard input closes.
    fn spawn_guard(&mut self) -> Result<(), TestkitError> {
        let stop = self.server_tool("pg_ctl");
        let mut guard = Command::new("sh");
        guard
            .args(["-c", GUARD_SCRIPT, "leasehold-postgres-guard"])
            .arg(self.dir.path())
            .arg(stop.get_program())
            .args(stop.get_args())
            .args(self.stop_args())
            .current_dir(self.dir.path())
            // The pipe's write end stays here, close-on-exec, so no other
            // child (the server included) keeps the guard waiting.
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = guard.spawn().map_err(|source| TestkitError::Spawn {
            binary: PathBuf::from("sh"),
            source,
        })?;
        self.guard = Some(child);
        Ok(())
    }

    /// The arguments of `pg_ctl` that stop this server, by its data directory.
    fn stop_args(&self) -> Vec<String> {
        vec![
            "-D".to_owned(),
            self.data_dir().to_string_lossy().into_owned(),
            "stop".to_owned(),
            "-m".to_owned(),
            "immediate".to_owned(),
            "-w".to_owned(),
        ]
    }

    /// A command for one of the server's own tools (`initdb`, `pg_ctl`),
    /// which refuse to run as root: as root, run by [`SYSTEM_USER`].
    fn server_tool(&self, tool: &str) -> Command {
        let program = self.bin.join(tool);
        let mut command = if self.as_system_user {
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", SYSTEM_USER, "--"]).arg(program);
            runuser
        } else {
            Command::new(program)
        };
        // A working directory the system user can enter.
        command.current_dir(self.dir.path()).stdin(Stdio::null());
        command
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join(DATA_DIR)
    }

    /// The last lines the server logged since `offset`.
    fn log_tail(&self, offset: u64) -> String {
        let bytes = fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // Best effort: a drop has no one to report to, and the guard
        // stops the server again below if this failed.
        let _ = self.stop();
        if let Some(mut guard) = self.guard.take() {
            drop(guard.stdin.take());
            let started = Instant::now();
            loop {
                match guard.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if started.elapsed() >= GUARD_TIMEOUT => {
                        let _ = guard.kill();
                        let _ = guard.wait();
                        break;
                    }
                    Ok(None) => thread::sleep(Duration::from_millis(5)),
                }
            }
        }
    }
}

/// Gives the directory to [`SYSTEM_USER`], who runs the server when this
/// process is root.
fn hand_to_system_user(dir: &Path) -> Result<(), TestkitError> {
    let user = nix::unistd::User::from_name(SYSTEM_USER)
        .map_err(io::Error::from)?
        .ok_or_else(|| {
            TestkitError::Io(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "the tests run as root, and PostgreSQL refuses to: it is run as the \
                     {SYSTEM_USER:?} user, which does not exist; install Debian's postgresql \
                     package (it creates the user) or run the tests as another user"
                ),
            ))
        })?;
    nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).map_err(io::Error::from)?;
    Ok(())
}

/// Runs `command` within `limit` and returns its standard output; a
/// failure is an [`io::Error`] naming the command, its status and output.
fn run(command: &mut Command, limit: Duration) -> Result<String, TestkitError> {
    let output = output_within(command, limit)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(TestkitError::Io(io::Error::other(format!(
        "{command:?} failed with {}: {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim(),
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpStream};

    fn accepts_connections(port: u16) -> bool {
        TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(10), "{what}");
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn starts_serves_a_database_per_test_and_stops_on_drop() -> Result<(), TestkitError> {
        let server = PostgresServer::start()?;
        let (port, dir) = (server.port(), server.dir().to_owned());
        let first = server.create_database()?;
        let second = server.create_database()?;
        assert_ne!(first, second);
        server.psql(
            &first,
            "CREATE TABLE t (v int); INSERT INTO t VALUES (1), (2)",
        )?;
        assert_eq!(server.psql(&first, "SELECT v FROM t ORDER BY v")?, "1\n2");
        // A database of its own: the other one has no such table.
        assert!(server.psql(&second, "SELECT v FROM t").is_err());
        // Loopback only, as the superuser `test`.
        assert_eq!(
            server.psql(
                &first,
                "SELECT current_user, current_setting('listen_addresses')"
            )?,
            "test|127.0.0.1"
        );
        drop(server);
        assert!(!accepts_connections(port), "still listening after drop");
        assert!(!dir.exists(), "{} left behind", dir.display());
        Ok(())
    }

    #[test]
    fn the_guard_stops_a_server_whose_process_would_be_gone() -> Result<(), TestkitError> {
        let mut server = PostgresServer::start()?;
        let (port, dir) = (server.port(), server.dir().to_owned());
        assert!(accepts_connections(port));
        // What the kernel does when this process exits: the guard's pipe closes.
        let guard = server.guard.as_mut().expect("a guard");
        drop(guard.stdin.take());
        wait_until("the guard stopped the server", || {
            !accepts_connections(port)
        });
        wait_until("the guard removed the directory", || !dir.exists());
        // The drop that follows finds nothing left to do.
        server.running = false;
        Ok(())
    }
}
