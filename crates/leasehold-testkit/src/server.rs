//! Spawning, faulting and stopping one `redis-server` process.

use std::fs;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

use crate::resp::{self, Value};
use crate::{TestkitError, redis_server_binary};

/// How long a new server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How often readiness (and process state) is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Timeouts of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Timeout of [`RedisServer::cli`].
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`RedisServer::stop`] waits for the process to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `pause`/`resume` wait for the kernel to report the new state.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// How many free ports are tried when the chosen one is taken meanwhile.
const PORT_ATTEMPTS: usize = 5;
/// How many lines of the log file go into errors.
const LOG_TAIL_LINES: usize = 20;
/// The log file, inside the server's directory.
const LOG_FILE: &str = "redis.log";
/// The port of a developer's own Redis, never handed out.
const DEFAULT_REDIS_PORT: u16 = 6379;

/// Returns a currently free TCP port on 127.0.0.1, found by binding port 0.
///
/// The port is released before this returns, so another process may take
/// it; [`RedisServer::start`] retries with a new port when that happens.
/// Never returns 6379.
///
/// # Errors
///
/// [`TestkitError::Io`] if binding fails.
pub fn free_port() -> Result<u16, TestkitError> {
    loop {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        if port != DEFAULT_REDIS_PORT {
            return Ok(port);
        }
    }
}

/// Configures a [`RedisServer`] before starting it; see [`RedisServer::builder`].
///
/// The defaults are those of [`RedisServer::start`]: a free loopback port,
/// no persistence (`--save "" --appendonly no`), no extra arguments.
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct ServerBuilder {
    appendonly: Option<bool>,
    args: Vec<String>,
    port: Option<u16>,
    config_file: Option<PathBuf>,
    binary: Option<PathBuf>,
    envs: Vec<(String, String)>,
}

impl ServerBuilder {
    /// Turns on the append-only file (`--appendonly yes`). With
    /// `fsync_always` it also passes `--appendfsync always`, so every
    /// acknowledged write, keys and ttls alike, survives a SIGKILL followed
    /// by [`RedisServer::restart`]; otherwise `--appendfsync everysec`.
    ///
    /// Default: off (`--appendonly no`).
    pub fn appendonly(mut self, fsync_always: bool) -> Self {
        self.appendonly = Some(fsync_always);
        self
    }

    /// Appends one raw `redis-server` argument, after the testkit's own
    /// (so it overrides them), e.g. `.arg("--requirepass").arg("secret")`.
    ///
    /// When the arguments set `--requirepass`, [`RedisServer::cli`] and the
    /// readiness check authenticate with that password.
    ///
    /// Default: no extra arguments.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Uses this fixed port instead of a free one. If it is taken, `start`
    /// fails with [`TestkitError::PortInUse`] instead of trying another.
    ///
    /// Default: a free port from [`free_port`].
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Passes a configuration file as the first argument (the testkit's own
    /// arguments still follow and override it). A sentinel needs one, and
    /// must be able to rewrite it.
    ///
    /// Default: none.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config_file = Some(path.into());
        self
    }

    /// Runs this server binary instead of the one [`redis_server_binary`]
    /// finds (for example a build that runs under libfaketime, for tests
    /// that move the server's clock).
    ///
    /// Default: [`redis_server_binary`].
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Sets an environment variable of the server process (kept across
    /// [`RedisServer::restart`]), such as `LD_PRELOAD` for libfaketime.
    ///
    /// Default: the test's own environment, unchanged.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.push((name.into(), value.into()));
        self
    }

    /// Spawns the server in a new temporary directory and waits until it
    /// answers `PING` (at most 5 s).
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotInstalled`] without a `redis-server` binary,
    /// [`TestkitError::Spawn`], [`TestkitError::NotReady`],
    /// [`TestkitError::Exited`], [`TestkitError::PortInUse`] (a fixed port, or
    /// five free ports in a row taken by others), [`TestkitError::Io`].
    pub fn start(self) -> Result<RedisServer, TestkitError> {
        let binary = match self.binary {
            Some(binary) => binary,
            None => redis_server_binary()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()?;
        let password = requirepass(&self.args);
        let mut server = RedisServer {
            binary,
            port: self.port.unwrap_or(0),
            appendonly: self.appendonly,
            args: self.args,
            config_file: self.config_file,
            envs: self.envs,
            password,
            child: None,
            paused: false,
            log_offset: 0,
            dir,
        };
        if self.port.is_some() {
            server.launch()?;
            return Ok(server);
        }
        on_a_free_port(|port| {
            server.port = port;
            server.launch()
        })?;
        Ok(server)
    }
}

/// Starts a server with `launch` on a free port, and on another if the
/// port was taken meanwhile (another process bound it between the check
/// and the server's own bind), up to [`PORT_ATTEMPTS`] times: the port it
/// started on.
pub(crate) fn on_a_free_port(
    mut launch: impl FnMut(u16) -> Result<(), TestkitError>,
) -> Result<u16, TestkitError> {
    let mut attempt = 1;
    loop {
        let port = free_port()?;
        match launch(port) {
            Ok(()) => return Ok(port),
            Err(TestkitError::PortInUse { .. }) if attempt < PORT_ATTEMPTS => attempt += 1,
            Err(TestkitError::PortInUse { port, log_tail, .. }) => {
                return Err(TestkitError::PortInUse {
                    port,
                    attempts: attempt,
                    log_tail,
                });
            }
            Err(other) => return Err(other),
        }
    }
}

/// Finds the password of a `--requirepass` argument, given either as two
/// arguments or as one (`"--requirepass secret"`).
fn requirepass(args: &[String]) -> Option<String> {
    let mut password = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let mut words = arg.split_whitespace();
        if words.next() == Some("--requirepass") {
            password = match words.next() {
                Some(inline) => Some(inline.to_owned()),
                None => iter.next().cloned(),
            };
        }
    }
    password.filter(|p| !p.is_empty())
}

/// A throwaway `redis-server` process listening on 127.0.0.1.
///
/// It runs in its own temporary directory (which also holds its log file,
/// `redis.log`) and without persistence unless
/// [`ServerBuilder::appendonly`] was used. All methods are blocking and
/// quick (milliseconds), so they may be called from inside
/// `#[tokio::test]` functions.
///
/// Dropping it resumes the process if it is paused, kills it with SIGKILL,
/// reaps it, and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    port: u16,
    appendonly: Option<bool>,
    args: Vec<String>,
    config_file: Option<PathBuf>,
    envs: Vec<(String, String)>,
    password: Option<String>,
    child: Option<Child>,
    paused: bool,
    /// Length of the log file when the current process was spawned.
    log_offset: u64,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server on a free loopback port with no persistence; the same
    /// as `RedisServer::builder().start()`.
    ///
    /// # Errors
    ///
    /// As [`ServerBuilder::start`].
    pub fn start() -> Result<RedisServer, TestkitError> {
        Self::builder().start()
    }

    /// Returns a builder for a server with non-default settings.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// The TCP port the server listens on; it stays the same across
    /// [`restart`](Self::restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The socket address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A connection URL, `redis://127.0.0.1:PORT` (without any password).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's working directory (kept across restarts, removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The process id, or `None` after [`kill`](Self::kill) or
    /// [`stop`](Self::stop) (until [`restart`](Self::restart)).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the process with SIGSTOP and waits until the kernel reports
    /// it stopped. TCP connects still succeed while it is paused (the
    /// kernel queues them), but nothing is answered; keys keep expiring by
    /// wall clock. Does nothing if already paused.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotRunning`] after `kill`/`stop`,
    /// [`TestkitError::Signal`].
    pub fn pause(&mut self) -> Result<(), TestkitError> {
        if self.paused {
            return Ok(());
        }
        let pid = self.pid().ok_or(TestkitError::NotRunning)?;
        send(pid, Signal::SIGSTOP, "SIGSTOP")?;
        self.paused = true;
        wait_for_state(pid, |state| state == 'T');
        Ok(())
    }

    /// Thaws a paused process with SIGCONT; commands queued meanwhile are
    /// then executed. Does nothing if not paused.
    ///
    /// # Errors
    ///
    /// [`TestkitError::NotRunning`] after `kill`/`stop`,
    /// [`TestkitError::Signal`].
    pub fn resume(&mut self) -> Result<(), TestkitError> {
        let pid = self.pid().ok_or(TestkitError::NotRunning)?;
        if !self.paused {
            return Ok(());
        }
        send(pid, Signal::SIGCONT, "SIGCONT")?;
        self.paused = false;
        wait_for_state(pid, |state| state != 'T');
        Ok(())
    }

    /// Whether the process is currently paused by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Kills the process with SIGKILL (a crash: nothing is saved) and reaps
    /// it. Does nothing if it is not running.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] if killing or waiting fails.
    pub fn kill(&mut self) -> Result<(), TestkitError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        self.paused = false;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Stops the process gracefully with SIGTERM (resuming it first if
    /// paused) and waits for it to exit. Does nothing if it is not running.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Signal`]; [`TestkitError::Timeout`] if it has not
    /// exited after 10 s (it is then killed with SIGKILL).
    pub fn stop(&mut self) -> Result<(), TestkitError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        self.resume()?;
        send(pid, Signal::SIGTERM, "SIGTERM")?;
        let started = Instant::now();
        while let Some(child) = self.child.as_mut() {
            if child.try_wait()?.is_some() {
                self.child = None;
                return Ok(());
            }
            if started.elapsed() >= STOP_TIMEOUT {
                self.kill()?;
                return Err(TestkitError::Timeout {
                    what: "redis-server to exit after SIGTERM",
                    after: started.elapsed(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
        Ok(())
    }

    /// Kills the process if it is running, then starts it again with the
    /// same arguments, on the same port and in the same directory (so an
    /// append-only file is replayed), and waits until it answers `PING`.
    ///
    /// # Errors
    ///
    /// As [`ServerBuilder::start`]; a taken port is not retried.
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        self.kill()?;
        self.launch()
    }

    /// Runs one command over a fresh TCP connection and returns the reply as
    /// text: simple strings, integers and bulk strings as they are, a nil
    /// as `(nil)`, arrays one element per line (an empty one as
    /// `(empty array)`, nested error elements as `(error) MSG`). Waits at
    /// most 5 s for the reply.
    ///
    /// If the server was started with `--requirepass`, the connection
    /// authenticates first.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), leasehold_testkit::TestkitError> {
    /// let server = leasehold_testkit::RedisServer::start()?;
    /// assert_eq!(server.cli(&["SET", "k", "v"])?, "OK");
    /// assert_eq!(server.cli(&["GET", "k"])?, "v");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`TestkitError::Reply`] for an error reply (such as `WRONGTYPE ...`),
    /// [`TestkitError::Timeout`], [`TestkitError::Protocol`],
    /// [`TestkitError::Io`] (for example connection refused after `kill`).
    pub fn cli(&self, args: &[&str]) -> Result<String, TestkitError> {
        self.cli_with_timeout(args, CLI_TIMEOUT)
    }

    /// A counter of `INFO <section>`: the `field` of the line named
    /// `line`, as `info_counter("commandstats", "cmdstat_evalsha",
    /// "calls")` or `info_counter("errorstats", "errorstat_NOSCRIPT",
    /// "count")`; 0 when the server has no such line (nothing counted since
    /// the stats were reset). The server's own count, for tests that judge
    /// what the server did.
    ///
    /// # Errors
    ///
    /// As [`cli`](Self::cli); [`TestkitError::Protocol`] when the line has
    /// no such field, or its value is not a number.
    pub fn info_counter(
        &self,
        section: &str,
        line: &str,
        field: &str,
    ) -> Result<u64, TestkitError> {
        let info = self.cli(&["INFO", section])?;
        let prefix = format!("{line}:");
        let Some(rest) = info
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
        else {
            return Ok(0);
        };
        rest.split(',')
            .find_map(|kv| kv.strip_prefix(field)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                TestkitError::Protocol(format!("no {field} in INFO {section} {line}: {rest}"))
            })
    }

    /// How many times the server ran `command` since its stats were reset
    /// (`cmdstat_<command>` `calls` in `INFO commandstats`; commands a
    /// script runs count too); 0 when it never ran it.
    ///
    /// # Errors
    ///
    /// As [`info_counter`](Self::info_counter).
    pub fn command_calls(&self, command: &str) -> Result<u64, TestkitError> {
        self.info_counter("commandstats", &format!("cmdstat_{command}"), "calls")
    }

    /// Like [`cli`](Self::cli), with the given connect, write and read
    /// timeout instead of 5 s; useful to observe a paused server quickly.
    ///
    /// # Errors
    ///
    /// As [`cli`](Self::cli).
    pub fn cli_with_timeout(
        &self,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, TestkitError> {
        let command = resp::command(args)?;
        let mut connection = resp::connect(self.addr(), self.password.as_deref(), timeout)
            .map_err(|e| resp::testkit_error(e, resp::CONNECTING, timeout))?;
        command
            .query(&mut connection)
            .map(resp::render)
            .map_err(|e| resp::testkit_error(e, resp::REPLYING, timeout))
    }

    /// The last lines of the log file written by the current (or last)
    /// process.
    fn log_tail(&self) -> String {
        let bytes = fs::read(self.log_path()).unwrap_or_default();
        let start = usize::try_from(self.log_offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let text = String::from_utf8_lossy(&bytes[start..]);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }

    /// The command line, without the binary.
    fn command_args(&self) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let log = self.log_path().to_string_lossy().into_owned();
        let config = self
            .config_file
            .iter()
            .map(|path| path.to_string_lossy().into_owned());
        let mut args: Vec<String> = config.collect();
        args.extend(
            [
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                &dir,
                "--logfile",
                &log,
                "--protected-mode",
                "no",
                "--enable-debug-command",
                "local",
            ]
            .iter()
            .map(|arg| (*arg).to_owned()),
        );
        match self.appendonly {
            None => args.extend(["--appendonly".into(), "no".into()]),
            Some(fsync_always) => args.extend([
                "--appendonly".into(),
                "yes".into(),
                "--appendfsync".into(),
                if fsync_always { "always" } else { "everysec" }.into(),
            ]),
        }
        args.extend(self.args.iter().cloned());
        args
    }

    /// The command line, shell-quoted where needed, for error messages.
    fn command_line(&self) -> String {
        std::iter::once(self.binary.to_string_lossy().into_owned())
            .chain(self.command_args())
            .map(|arg| shell_quote(&arg))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Spawns the process on `self.port` and waits until it is ready. On
    /// failure the process is gone and `self.child` is `None`.
    fn launch(&mut self) -> Result<(), TestkitError> {
        self.log_offset = fs::metadata(self.log_path()).map_or(0, |meta| meta.len());
        let child = Command::new(&self.binary)
            .args(self.command_args())
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| TestkitError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        self.paused = false;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), TestkitError> {
        let started = Instant::now();
        loop {
            let child = self.child.as_mut().ok_or(TestkitError::NotRunning)?;
            let pid = child.id();
            if let Some(status) = child.try_wait()? {
                self.child = None;
                let log_tail = self.log_tail();
                return Err(if log_tail.contains("Address already in use") {
                    TestkitError::PortInUse {
                        port: self.port,
                        attempts: 1,
                        log_tail,
                    }
                } else {
                    TestkitError::Exited {
                        port: self.port,
                        status,
                        command: self.command_line(),
                        log_tail,
                    }
                });
            }
            if self.answers_as(pid) {
                return Ok(());
            }
            if started.elapsed() >= READY_TIMEOUT {
                // Best effort: the NotReady error matters more than a failed kill.
                let _ = self.kill();
                return Err(TestkitError::NotReady {
                    port: self.port,
                    after: started.elapsed(),
                    log_tail: self.log_tail(),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Whether the server on our port answers `PING` with `PONG` and is the
    /// process `pid`, not another test's server that grabbed the port.
    ///
    /// Anything else means "not yet": a refused or timed-out connection, a
    /// rejected `AUTH`, and error replies such as `LOADING` (a restarted
    /// server still replaying its append-only file) are polled again.
    fn answers_as(&self, pid: u32) -> bool {
        let Ok(mut connection) =
            resp::connect(self.addr(), self.password.as_deref(), PROBE_TIMEOUT)
        else {
            return false;
        };
        match redis::cmd("PING").query::<Value>(&mut connection) {
            Ok(Value::SimpleString(pong)) if pong == "PONG" => {}
            // Password protection we do not know about (an ACL file, say):
            // it answers, which is all we can check.
            Err(error) if error.code() == Some("NOAUTH") => return true,
            _ => return false,
        }
        match redis::cmd("INFO")
            .arg("server")
            .query::<Value>(&mut connection)
        {
            Ok(Value::BulkString(info)) => String::from_utf8_lossy(&info)
                .lines()
                .any(|line| line.trim_end() == format!("process_id:{pid}")),
            _ => false,
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                let _ = send(child.id(), Signal::SIGCONT, "SIGCONT");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn send(pid: u32, signal: Signal, name: &'static str) -> Result<(), TestkitError> {
    let raw = i32::try_from(pid).map_err(|_| TestkitError::Signal {
        signal: name,
        pid,
        source: io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"),
    })?;
    signal::kill(Pid::from_raw(raw), signal).map_err(|errno| TestkitError::Signal {
        signal: name,
        pid,
        source: io::Error::from(errno),
    })
}

/// Polls the process state letter in `/proc/PID/stat` until `done` accepts
/// it or a second has passed. Without procfs it returns at once.
fn wait_for_state(pid: u32, done: impl Fn(char) -> bool) {
    let started = Instant::now();
    while started.elapsed() < SIGNAL_SETTLE_TIMEOUT {
        match process_state(pid) {
            Some(state) if !done(state) => thread::sleep(Duration::from_millis(1)),
            _ => return,
        }
    }
}

fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) S ...": COMM may itself contain parentheses and spaces.
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.trim_start().chars().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| (*arg).to_owned()).collect()
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("--port"), "--port");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b'c"), r"'a b'\''c'");
    }

    #[test]
    fn finds_requirepass() {
        assert_eq!(requirepass(&strings(&[])), None);
        assert_eq!(
            requirepass(&strings(&["--requirepass", "secret"])),
            Some("secret".to_owned())
        );
        assert_eq!(
            requirepass(&strings(&["--maxmemory", "1mb", "--requirepass secret"])),
            Some("secret".to_owned())
        );
        assert_eq!(requirepass(&strings(&["--requirepass"])), None);
        assert_eq!(requirepass(&strings(&["--requirepass", ""])), None);
    }

    #[test]
    fn free_port_is_not_6379() -> Result<(), TestkitError> {
        let port = free_port()?;
        assert_ne!(port, DEFAULT_REDIS_PORT);
        assert_ne!(port, 0);
        Ok(())
    }

    #[test]
    fn a_password_the_testkit_does_not_know_still_counts_as_ready() -> Result<(), TestkitError> {
        // The password is in a configuration file, not in a --requirepass
        // argument, so the readiness probe cannot authenticate: NOAUTH is
        // its only sign of life.
        let config_dir = tempfile::tempdir()?;
        let config = config_dir.path().join("redis.conf");
        fs::write(&config, "requirepass from-a-file\n")?;
        let server = RedisServer::builder().config_file(&config).start()?;
        match server.cli(&["PING"]) {
            Err(TestkitError::Reply(message)) => {
                assert!(message.starts_with("NOAUTH"), "{message}")
            }
            other => panic!("expected a NOAUTH reply, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn reads_own_process_state() {
        let state = process_state(std::process::id());
        if cfg!(target_os = "linux") {
            assert!(matches!(state, Some('R' | 'S')), "{state:?}");
        } else {
            assert_ne!(state, Some('T'));
        }
    }
}
