//! `leasehold run --permits N` and `leasehold status --permits N` against a
//! real `redis-server` from the testkit, judged by the permit keys on the
//! server. Children coordinate with the test through files in a temporary
//! directory.

mod common;

use std::time::Duration;

use common::{Fixture, OutputWithin, TestResult, text, wait_for_exit, wait_for_file};

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
        .output_within()?;
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
        .output_within()?;
    assert_eq!(other.status.code(), Some(78), "{}", text(&other.stderr));
    assert!(
        text(&other.stderr).contains("limit of 2"),
        "{}",
        text(&other.stderr)
    );
    assert!(!f.path("d.ran").exists());

    // The table: one row per permit, each with its holder's label and a
    // ttl left of at most the 2s ttl.
    let status = f
        .cmd(&["status", "--permits", "2", "pool"])
        .output_within()?;
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
        .output_within()?;
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
    let status = f
        .cmd(&["status", "--permits", "2", "pool"])
        .output_within()?;
    assert_eq!(status.status.code(), Some(1));
    Ok(())
}

/// A job that notes its pid, says it started, and runs until told to stop
/// (or about 30 s, so that a failed test leaves nothing running for long).
fn bounded_job(name: &str) -> String {
    format!(
        "echo $$ > {name}.pid; touch {name}.started; i=0; while [ ! -e stop ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done"
    )
}

/// `leasehold run --permits 2` holders a and b; a's leasehold process is
/// frozen with SIGSTOP (its job runs on: it is another process group).
/// Meanwhile the server never has more than 2 permit keys; a's permit key
/// frees at the PTTL the server gave it, no later than its ttl, and a
/// third run waiting for a permit gets it. On SIGCONT, a's leasehold stops
/// its job and exits with 76 (its lease was lost), and takes no permit
/// again: the server's keys are b's and c's.
#[test]
fn a_frozen_permit_holder_frees_its_permit_at_its_ttl_and_stops_its_job_on_resume() -> TestResult {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let f = Fixture::new()?;
    let run = |name: &str, wait: &str| {
        let job = bounded_job(name);
        f.spawn_quiet(&[
            "run",
            "--permits",
            "2",
            "--key",
            "pool",
            "--ttl",
            "1s",
            "--wait",
            wait,
            "--label",
            name,
            "--",
            "sh",
            "-c",
            &job,
        ])
    };
    let mut a = run("a", "0s")?;
    wait_for_file(&f.path("a.started"))?;
    let mut b = run("b", "0s")?;
    wait_for_file(&f.path("b.started"))?;
    // a's permit key: the one whose value ends with a's label.
    let a_key = permit_keys(&f, "pool")?
        .into_iter()
        .find(|k| {
            f.server
                .cli(&["GET", k])
                .is_ok_and(|v| v.trim_end().ends_with(":a"))
        })
        .ok_or("a's permit key")?;
    let a_pid = Pid::from_raw(i32::try_from(a.id())?);
    kill(a_pid, Signal::SIGSTOP)?;
    let frozen_at = std::time::Instant::now();
    let pttl: u64 = f.server.cli(&["PTTL", &a_key])?.trim().parse()?;
    assert!(pttl > 0 && pttl <= 1000, "a's PTTL when frozen: {pttl}");

    let mut c = run("c", "10s")?;
    // Until c runs, sample the server: never more than 2 permit keys.
    while !f.path("c.started").exists() {
        let keys = permit_keys(&f, "pool")?;
        assert!(keys.len() <= 2, "permit keys on the server: {keys:?}");
        assert!(
            frozen_at.elapsed() < Duration::from_secs(10),
            "c never got a permit"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let freed_after = frozen_at.elapsed();
    // a's permit went at its PTTL (less the 50 ms the look may lag), no
    // later than its ttl plus c's retry and start.
    assert!(
        freed_after >= Duration::from_millis(pttl.saturating_sub(50)),
        "a's permit freed {freed_after:?} after the freeze, before its PTTL of {pttl} ms"
    );
    assert!(
        freed_after < Duration::from_millis(1000 + 700),
        "a's permit freed {freed_after:?} after the freeze"
    );
    let mut keys = permit_keys(&f, "pool")?;
    keys.sort();
    assert_eq!(keys.len(), 2, "{keys:?}");
    let c_value = f.server.cli(&["GET", &a_key])?;
    assert!(
        c_value.trim_end().ends_with(":c"),
        "a's permit now holds {c_value}"
    );

    // Resumed: a stops its job and exits with 76.
    kill(a_pid, Signal::SIGCONT)?;
    let resumed = std::time::Instant::now();
    let status = wait_for_exit(&mut a.0)?;
    assert_eq!(status.code(), Some(76), "a's exit after SIGCONT");
    let job_pid: i32 = std::fs::read_to_string(f.path("a.pid"))?.trim().parse()?;
    assert!(
        kill(Pid::from_raw(job_pid), None).is_err(),
        "a's job outlived its leasehold"
    );
    eprintln!("a exited {:?} after SIGCONT", resumed.elapsed());
    // And took nothing back: b's and c's permits only.
    let mut labels: Vec<String> = permit_keys(&f, "pool")?
        .iter()
        .map(|k| {
            f.server.cli(&["GET", k]).map(|v| {
                v.trim_end()
                    .rsplit(':')
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            })
        })
        .collect::<Result<_, _>>()?;
    labels.sort();
    assert_eq!(labels, ["b", "c"]);

    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut b.0)?.code(), Some(0));
    assert_eq!(wait_for_exit(&mut c.0)?.code(), Some(0));
    Ok(())
}
