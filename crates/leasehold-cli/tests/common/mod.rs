//! What the tests of the `leasehold` binary share: a real `redis-server`
//! from the testkit with a temporary directory through which children and
//! tests coordinate (a test waits until a file appears instead of
//! sleeping), and waits that fail after [`PATIENCE`] instead of hanging.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::RedisServer;

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
/// Generous bounds for conditions that normally hold within milliseconds.
pub(crate) const PATIENCE: Duration = Duration::from_secs(10);

pub(crate) struct Fixture {
    pub(crate) server: RedisServer,
    pub(crate) dir: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn new() -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Self {
            server: RedisServer::start()?,
            dir: tempfile::tempdir()?,
        })
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasehold ARGS` against the test server, with no leasehold
    /// variables inherited from the environment running the tests.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_at(&self.server.url(), args)
    }

    /// `leasehold ARGS` against the server at `url` (a proxy in front of
    /// the test server).
    pub(crate) fn cmd_at(&self, url: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--url").arg(url).args(args);
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("LEASEHOLD_") || var == "REDIS_URL" {
                cmd.env_remove(var);
            }
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    pub(crate) fn output(&self, args: &[&str]) -> Result<Output, std::io::Error> {
        self.cmd(args).output_within()
    }

    /// Starts `leasehold ARGS` with its stdout and stderr piped.
    pub(crate) fn spawn(&self, args: &[&str]) -> Result<Running, std::io::Error> {
        spawn(&mut self.cmd(args))
    }

    /// Starts `leasehold ARGS` with its stdout and stderr discarded.
    pub(crate) fn spawn_quiet(&self, args: &[&str]) -> Result<Running, std::io::Error> {
        self.cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Running)
    }

    /// The keys on the test server that match `pattern` (a `KEYS` glob).
    pub(crate) fn keys(&self, pattern: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let reply = self.server.cli(&["KEYS", pattern])?;
        Ok(reply
            .lines()
            .filter(|l| l.starts_with("leasehold:"))
            .map(str::to_owned)
            .collect())
    }
}

/// A leasehold started by a test, killed if the test ends (fails) before
/// it exited.
pub(crate) struct Running(pub(crate) Child);

impl std::ops::Deref for Running {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

pub(crate) fn spawn(cmd: &mut Command) -> Result<Running, std::io::Error> {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Running)
}

pub(crate) fn wait_for_file(path: &Path) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        if Instant::now() > deadline {
            return Err(format!("{} did not appear", path.display()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Waits for a child, killing it and failing if it takes too long.
pub(crate) fn wait_for_exit(child: &mut Child) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("leasehold did not exit in time".to_owned());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `condition` holds, failing after [`PATIENCE`].
pub(crate) fn wait_until(
    what: &str,
    mut condition: impl FnMut() -> Result<bool, Box<dyn std::error::Error>>,
) -> TestResult {
    let deadline = Instant::now() + PATIENCE;
    while !condition()? {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {PATIENCE:?}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `Command::output` with a deadline: `output()` waits for ever.
pub(crate) trait OutputWithin {
    /// Runs the command to its end, failing (and killing it) if it takes
    /// longer than [`PATIENCE`].
    fn output_within(&mut self) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    fn output_within(&mut self) -> std::io::Result<Output> {
        leasehold_testkit::output_within(self, PATIENCE)
    }
}
