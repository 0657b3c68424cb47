//! `leasehold run --permits N` and `leasehold status --permits N` against a
//! real `redis-server` from the testkit, judged by the permit keys on the
//! server. Children coordinate with the test through files in a temporary
//! directory.

mod common;

use std::time::Duration;

use common::{Fixture, TestResult, text, wait_for_exit, wait_for_file};

/// The permit keys of `semaphore` on the test server.
fn permit_keys(f: &Fixture, semaphore: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    f.keys(&format!("leasehold:{{{semaphore}}}:permit:*"))
}

/// Two `run --permits 2` on one semaphore run at once, each on a permit
/// key of its own on the server; a third does not run and exits with 75
/// when its wait runs out; `status --permits 2` shows both holders with
/// their labels and remaining ttl, as a table and as JSON; a run with
/// another limit is refused as a configuration error.
#[test]
fn two_permits_let_two_runs_in_and_status_shows_both() -> TestResult {
    let f = Fixture::new()?;
    let script = |name: &str| {
        format!(
            "echo $LEASEHOLD_KEY > {name}.key; touch {name}.started; while [ ! -e stop ]; do sleep 0.01; done"
        )
    };
    let mut runs = Vec::new();
    for name in ["a", "b"] {
        let script = script(name);
        runs.push(f.spawn_quiet(&[
            "run",
            "--permits",
            "2",
            "--key",
            "pool",
            "--ttl",
            "2s",
            "--label",
            name,
            "--",
            "sh",
            "-c",
            &script,
        ])?);
    }
    // Both run at once (neither waits: try once is the default).
    wait_for_file(&f.path("a.started"))?;
    wait_for_file(&f.path("b.started"))?;
    let mut keys = permit_keys(&f, "pool")?;
    keys.sort();
    assert_eq!(
        keys,
        ["leasehold:{pool}:permit:0", "leasehold:{pool}:permit:1"],
        "the server's permit keys"
    );
    let mut seen = vec![
        std::fs::read_to_string(f.path("a.key"))?.trim().to_owned(),
        std::fs::read_to_string(f.path("b.key"))?.trim().to_owned(),
    ];
    seen.sort();
    assert_eq!(
        seen,
        ["{pool}:permit:0", "{pool}:permit:1"],
        "LEASEHOLD_KEY"
    );

    // A third finds both permits taken for its whole wait.
    let third = f
        .cmd(&[
            "run",
            "--permits",
            "2",
            "--key",
            "pool",
            "--wait",
            "300ms",
            "--",
            "touch",
            "c.ran",
        ])
        .output()?;
    assert_eq!(third.status.code(), Some(75), "{}", text(&third.stderr));
    assert!(!f.path("c.ran").exists(), "a third command ran");
    assert_eq!(permit_keys(&f, "pool")?.len(), 2);

    // Another limit for the same semaphore: a configuration error that says so.
    let other = f
        .cmd(&[
            "run",
            "--permits",
            "3",
            "--key",
            "pool",
            "--",
            "touch",
            "d.ran",
        ])
        .output()?;
    assert_eq!(other.status.code(), Some(78), "{}", text(&other.stderr));
    assert!(
        text(&other.stderr).contains("limit of 2"),
        "{}",
        text(&other.stderr)
    );
    assert!(!f.path("d.ran").exists());

    // The table: one row per permit, each with its holder's label and a
    // ttl left of at most the 2s ttl.
    let status = f.cmd(&["status", "--permits", "2", "pool"]).output()?;
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    let stdout = text(&status.stdout);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    let mut labels = Vec::new();
    for (i, row) in rows[1..].iter().enumerate() {
        assert_eq!(
            row[..2],
            [format!("{{pool}}:permit:{i}").as_str(), "held"],
            "{stdout}"
        );
        labels.push(row[2]);
        let ttl_left = humantime::parse_duration(&row[4..].join(" "))?;
        assert!(
            ttl_left > Duration::ZERO && ttl_left <= Duration::from_secs(2),
            "{stdout}"
        );
    }
    labels.sort_unstable();
    assert_eq!(labels, ["a", "b"], "{stdout}");

    let json = f
        .cmd(&["status", "--json", "--permits", "2", "pool"])
        .output()?;
    let json = text(&json.stdout);
    let lines: Vec<&str> = json.lines().collect();
    assert_eq!(lines.len(), 2, "{json}");
    for line in &lines {
        assert!(
            line.contains("\"held\":true") && line.contains("\"ttl_left_ms\":"),
            "{line}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains("\"label\":\"a\""))
            && lines.iter().any(|l| l.contains("\"label\":\"b\"")),
        "{json}"
    );

    std::fs::write(f.path("stop"), "")?;
    for run in &mut runs {
        assert_eq!(wait_for_exit(&mut run.0)?.code(), Some(0));
    }
    assert!(
        permit_keys(&f, "pool")?.is_empty(),
        "permits left after release"
    );
    // Every permit free: the semaphore is not held.
    let status = f.cmd(&["status", "--permits", "2", "pool"]).output()?;
    assert_eq!(status.status.code(), Some(1));
    Ok(())
}
