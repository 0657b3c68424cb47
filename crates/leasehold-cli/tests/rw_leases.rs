//! `leasehold run --shared` and `leasehold run --writer` against a real
//! `redis-server` from the testkit, judged by the read-write lease's keys
//! on the server. Children coordinate with the test through files in a
//! temporary directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::RedisServer;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
/// Generous bounds for conditions that normally hold within milliseconds.
const PATIENCE: Duration = Duration::from_secs(10);

struct Fixture {
    server: RedisServer,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Self {
            server: RedisServer::start()?,
            dir: tempfile::tempdir()?,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `leasehold ARGS` against the test server, with no leasehold
    /// variables inherited from the environment running the tests.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("--url").arg(self.server.url()).args(args);
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("LEASEHOLD_") || var == "REDIS_URL" {
                cmd.env_remove(var);
            }
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn spawn(&self, args: &[&str]) -> Result<Running, std::io::Error> {
        self.cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Running)
    }

    /// The keys of the read-write lease `rw` on the server that match
    /// `suffix` (a glob).
    fn rw_keys(&self, rw: &str, suffix: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let reply = self
            .server
            .cli(&["KEYS", &format!("leasehold:{{{rw}}}:{suffix}")])?;
        Ok(reply
            .lines()
            .filter(|l| l.starts_with("leasehold:"))
            .map(str::to_owned)
            .collect())
    }
}

/// A leasehold started by a test, killed if the test ends (fails) before
/// it exited.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for_file(path: &Path) -> Result<(), String> {
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
fn wait_for_exit(child: &mut Child) -> Result<ExitStatus, String> {
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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Waits until `condition` holds, failing after [`PATIENCE`].
fn wait_until(
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

/// A job that notes its key, says it started, and runs until told to stop.
fn job(name: &str) -> String {
    format!(
        "echo $LEASEHOLD_KEY > {name}.key; touch {name}.started; while [ ! -e {name}.stop ]; do sleep 0.01; done"
    )
}

/// Two `run --shared` on one key run at once, each on a reader key of its
/// own on the server; a `run --writer` waits (its intent on the server)
/// until both have ended, keeps a third `--shared` out meanwhile, and then
/// runs alone: no reader key beside its writer key.
#[test]
fn two_shared_runs_together_and_a_writer_waits_for_both() -> TestResult {
    let f = Fixture::new()?;
    let mut readers = Vec::new();
    for name in ["a", "b"] {
        let job = job(name);
        readers.push(f.spawn(&[
            "run", "--shared", "--key", "doc", "--ttl", "2s", "--label", name, "--", "sh", "-c",
            &job,
        ])?);
    }
    // Both run at once (neither waits: try once is the default).
    wait_for_file(&f.path("a.started"))?;
    wait_for_file(&f.path("b.started"))?;
    assert_eq!(
        f.rw_keys("doc", "read:*")?.len(),
        2,
        "the server's reader keys"
    );
    for name in ["a", "b"] {
        let key = std::fs::read_to_string(f.path(&format!("{name}.key")))?;
        assert!(
            key.trim().starts_with("{doc}:read:"),
            "LEASEHOLD_KEY: {key}"
        );
    }

    let writer_job = job("w");
    let mut writer = f.spawn(&[
        "run",
        "--writer",
        "--key",
        "doc",
        "--ttl",
        "2s",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        &writer_job,
    ])?;
    // Refused by the readers, the writer leaves its intent on the server.
    wait_until("the writer's intent", || {
        Ok(!f.rw_keys("doc", "write-wanted")?.is_empty())
    })?;
    assert!(
        !f.path("w.started").exists(),
        "the writer ran beside readers"
    );
    // A new reader is kept out while the writer waits.
    let late = f
        .cmd(&[
            "run", "--shared", "--key", "doc", "--wait", "300ms", "--", "touch", "c.ran",
        ])
        .output()?;
    assert_eq!(late.status.code(), Some(75), "{}", text(&late.stderr));
    assert!(
        !f.path("c.ran").exists(),
        "a reader ran past the waiting writer"
    );

    std::fs::write(f.path("a.stop"), "")?;
    assert_eq!(wait_for_exit(&mut readers[0].0)?.code(), Some(0));
    assert_eq!(f.rw_keys("doc", "read:*")?.len(), 1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !f.path("w.started").exists(),
        "the writer ran beside a reader"
    );

    std::fs::write(f.path("b.stop"), "")?;
    assert_eq!(wait_for_exit(&mut readers[1].0)?.code(), Some(0));
    wait_for_file(&f.path("w.started"))?;
    assert!(
        f.rw_keys("doc", "read:*")?.is_empty(),
        "readers beside the writer"
    );
    assert_eq!(f.rw_keys("doc", "write")?, ["leasehold:{doc}:write"]);
    let key = std::fs::read_to_string(f.path("w.key"))?;
    assert_eq!(key.trim(), "{doc}:write", "LEASEHOLD_KEY");

    std::fs::write(f.path("w.stop"), "")?;
    assert_eq!(wait_for_exit(&mut writer.0)?.code(), Some(0));
    assert!(f.rw_keys("doc", "write")?.is_empty());
    assert!(
        f.rw_keys("doc", "write-wanted")?.is_empty(),
        "the granted writer's intent"
    );
    Ok(())
}

#[test]
fn shared_and_writer_and_permits_do_not_combine() -> TestResult {
    let f = Fixture::new()?;
    for flags in [
        ["--shared", "--writer"],
        ["--shared", "--permits=2"],
        ["--writer", "--permits=2"],
    ] {
        let out = f
            .cmd(&[
                "run", flags[0], flags[1], "--key", "doc", "--", "touch", "ran",
            ])
            .output()?;
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(
            text(&out.stderr).contains("cannot be used with"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(!f.path("ran").exists());
    Ok(())
}
