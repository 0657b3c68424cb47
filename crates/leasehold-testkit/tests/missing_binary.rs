//! A missing `redis-server` gives `NotInstalled` with an install hint.
//!
//! Setting an environment variable in-process needs `unsafe` in edition
//! 2024, so the test re-runs itself as a child process with
//! `LEASEHOLD_REDIS_SERVER=/nonexistent`.

use std::error::Error;
use std::process::Command;
use std::time::Duration;

use leasehold_testkit::{
    REDIS_SERVER_ENV, RedisServer, SERVER_ENV, TestkitError, redis_server_binary,
};

const CHILD_MARKER: &str = "LEASEHOLD_TESTKIT_MISSING_BINARY_CHILD";
const HINT: &str = "redis-server was not found on PATH; install it with \
    `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`, \
    or set LEASEHOLD_REDIS_SERVER";

#[test]
fn missing_binary_gives_not_installed() -> Result<(), Box<dyn Error>> {
    if std::env::var_os(CHILD_MARKER).is_some() {
        assert!(matches!(
            redis_server_binary(),
            Err(TestkitError::NotInstalled)
        ));
        match RedisServer::start() {
            Err(err @ TestkitError::NotInstalled) => assert_eq!(err.to_string(), HINT),
            other => panic!("expected NotInstalled, got {other:?}"),
        }
        return Ok(());
    }

    let output = leasehold_testkit::output_within(
        Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "missing_binary_gives_not_installed",
                "--nocapture",
            ])
            .env(REDIS_SERVER_ENV, "/nonexistent")
            // Redis's install hint, whichever server the suite runs on.
            .env(SERVER_ENV, "redis")
            .env(CHILD_MARKER, "1"),
        Duration::from_secs(60),
    )?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "child ran no test:\n{stdout}");
    Ok(())
}
