//! `leasehold run --fair` against a real `redis-server` from the testkit:
//! runs that start waiting one after another (each seen joining the
//! server's queue on a side connection) run in that order.

mod common;

use std::time::{Duration, Instant};

use common::{Fixture, PATIENCE, TestResult, wait_for_exit, wait_for_file};

/// How many places the server's fair queue of lease `key` (no hash tag) has.
fn queued(f: &Fixture, key: &str) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(f.server
        .cli(&["ZCARD", &format!("leasehold:{{{key}}}:fair")])?
        .parse()?)
}

/// A holder runs; three `run --fair` start waiting in turn, each once the
/// one before holds its place in the server's queue; when the holder
/// ends, they run in the order they started.
#[test]
fn fair_runs_run_in_the_order_they_started_waiting() -> TestResult {
    let f = Fixture::new()?;
    let holder = f.spawn_quiet(&[
        "run",
        "--fair",
        "--key",
        "queue",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        "touch started; while [ ! -e stop ]; do sleep 0.01; done",
    ])?;
    wait_for_file(&f.path("started"))?;
    let mut runs = vec![holder];
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let script = format!("echo {name} >> log");
        runs.push(f.spawn_quiet(&[
            "run", "--fair", "--key", "queue", "--ttl", "2s", "--wait", "20s", "--", "sh", "-c",
            &script,
        ])?);
        let deadline = Instant::now() + PATIENCE;
        while queued(&f, "queue")? != i + 1 {
            assert!(
                Instant::now() < deadline,
                "run {name} never joined the queue"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    std::fs::write(f.path("stop"), "")?;
    for mut run in runs {
        assert_eq!(wait_for_exit(&mut run)?.code(), Some(0));
    }
    assert_eq!(std::fs::read_to_string(f.path("log"))?, "a\nb\nc\n");
    Ok(())
}
