//! `LEASEHOLD_SERVER` chooses which binary every server is started from,
//! and `LEASEHOLD_REDIS_SERVER` still wins over it.
//!
//! The test re-runs itself as a child process (setting a variable
//! in-process needs `unsafe` in edition 2024) with `PATH` set to a
//! directory of stand-ins named `redis-server` and `valkey-server`. Each
//! stand-in writes its own name to a file and then runs the real server
//! found by the parent, so the file, written by the binary that was
//! started, tells which one the testkit chose whatever is installed.

use std::error::Error;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use leasehold_testkit::{REDIS_SERVER_ENV, RedisServer, SERVER_ENV, redis_server_binary};

const CHILD_MARKER: &str = "LEASEHOLD_TESTKIT_SERVER_CHOICE_CHILD";
const STARTED: &str = "LEASEHOLD_TESTKIT_SERVER_CHOICE_STARTED";

/// Writes a stand-in `name` into `dir` that records its name in `started`
/// and then becomes `real`.
fn stand_in(dir: &Path, name: &str, real: &Path, started: &Path) -> Result<(), Box<dyn Error>> {
    let script = format!(
        "#!/bin/sh\necho {name} >> '{}'\nexec '{}' \"$@\"\n",
        started.display(),
        real.display()
    );
    let path = dir.join(name);
    std::fs::write(&path, script)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Runs the child with `server` as `LEASEHOLD_SERVER` (and `override_name`
/// as `LEASEHOLD_REDIS_SERVER`) and returns the names of the stand-ins
/// that were started.
fn started_with(server: &str, override_name: Option<&str>) -> Result<String, Box<dyn Error>> {
    let real = redis_server_binary()?;
    let dir = tempfile::tempdir()?;
    let started = dir.path().join("started");
    for name in ["redis-server", "valkey-server"] {
        stand_in(dir.path(), name, &real, &started)?;
    }
    let mut child = Command::new(std::env::current_exe()?);
    child
        .args(["--exact", "the_setting_chooses_the_binary", "--nocapture"])
        .env("PATH", dir.path())
        .env(SERVER_ENV, server)
        .env_remove(REDIS_SERVER_ENV)
        .env(CHILD_MARKER, "1")
        .env(STARTED, &started);
    if let Some(name) = override_name {
        child.env(REDIS_SERVER_ENV, name);
    }
    let output = leasehold_testkit::output_within(&mut child, Duration::from_secs(60))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "child ran no test:\n{stdout}");
    Ok(std::fs::read_to_string(&started)?)
}

#[test]
fn the_setting_chooses_the_binary() -> Result<(), Box<dyn Error>> {
    if std::env::var_os(CHILD_MARKER).is_some() {
        let server = RedisServer::start()?;
        assert_eq!(server.cli(&["PING"])?, "PONG");
        return Ok(());
    }
    assert_eq!(started_with("valkey", None)?, "valkey-server\n");
    assert_eq!(started_with("redis", None)?, "redis-server\n");
    assert_eq!(started_with("", None)?, "redis-server\n");
    // The explicit override wins over the setting.
    assert_eq!(
        started_with("valkey", Some("redis-server"))?,
        "redis-server\n"
    );
    Ok(())
}
