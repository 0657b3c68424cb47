//! A missing `redis-cli` makes `RedisCluster::start` fail with
//! `CliNotInstalled` and an install hint, before any server is started.
//!
//! The test re-runs itself as a child process with
//! `LEASEHOLD_REDIS_CLI=/nonexistent` (setting a variable in-process needs
//! `unsafe` in edition 2024).

use std::error::Error;
use std::process::Command;
use std::time::Duration;

use leasehold_testkit::{REDIS_CLI_ENV, RedisCluster, SERVER_ENV, TestkitError, redis_cli_binary};

const CHILD_MARKER: &str = "LEASEHOLD_TESTKIT_MISSING_CLI_CHILD";

#[test]
fn missing_cli_gives_cli_not_installed() -> Result<(), Box<dyn Error>> {
    if std::env::var_os(CHILD_MARKER).is_some() {
        assert!(matches!(
            redis_cli_binary(),
            Err(TestkitError::CliNotInstalled)
        ));
        match RedisCluster::start(3, 0) {
            Err(err @ TestkitError::CliNotInstalled) => {
                let message = err.to_string();
                assert!(
                    message.contains("apt-get install -y redis-tools"),
                    "{message}"
                );
                assert!(message.contains(REDIS_CLI_ENV), "{message}");
            }
            other => panic!("expected CliNotInstalled, got {other:?}"),
        }
        return Ok(());
    }

    let output = leasehold_testkit::output_within(
        Command::new(std::env::current_exe()?)
            .args([
                "--exact",
                "missing_cli_gives_cli_not_installed",
                "--nocapture",
            ])
            .env(REDIS_CLI_ENV, "/nonexistent")
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
