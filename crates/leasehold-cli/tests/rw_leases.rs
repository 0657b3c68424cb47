//! `leasehold run --shared` and `leasehold run --writer` against a real
//! `redis-server` from the testkit, judged by the read-write lease's keys
//! on the server. Children coordinate with the test through files in a
//! temporary directory.

mod common;

use std::time::Duration;

use common::{Fixture, OutputWithin, TestResult, text, wait_for_exit, wait_for_file, wait_until};

/// The keys of the read-write lease `rw` on the test server that match
/// `suffix` (a glob).
fn rw_keys(f: &Fixture, rw: &str, suffix: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    f.keys(&format!("leasehold:{{{rw}}}:{suffix}"))
}

/// The rows of a `status` table, split at whitespace, and its exit code.
type Status = (Vec<Vec<String>>, Option<i32>);

/// The rows of `status --rw KEY`, split at whitespace, without the header,
/// and the command's exit code.
fn rw_status(f: &Fixture, rw: &str) -> Result<Status, Box<dyn std::error::Error>> {
    let out = f.cmd(&["status", "--rw", rw]).output_within()?;
    let stdout = text(&out.stdout);
    let mut rows = stdout
        .lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>());
    assert_eq!(
        rows.next().unwrap_or_default(),
        ["KEY", "ROLE", "HOLDER", "FENCING", "TOKEN", "TTL", "LEFT"],
        "{stdout}{}",
        text(&out.stderr)
    );
    Ok((rows.collect(), out.status.code()))
}

/// The ttl left in a `status` row (its cells from the fifth on), which
/// must be more than nothing and at most `ttl`.
fn ttl_left(row: &[String], ttl: Duration) -> Result<Duration, Box<dyn std::error::Error>> {
    let left = humantime::parse_duration(&row[4..].join(" "))?;
    assert!(left > Duration::ZERO && left <= ttl, "{row:?}");
    Ok(left)
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
        readers.push(f.spawn_quiet(&[
            "run", "--shared", "--key", "doc", "--ttl", "2s", "--label", name, "--", "sh", "-c",
            &job,
        ])?);
    }
    // Both run at once (neither waits: try once is the default).
    wait_for_file(&f.path("a.started"))?;
    wait_for_file(&f.path("b.started"))?;
    assert_eq!(
        rw_keys(&f, "doc", "read:*")?.len(),
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
    let mut writer = f.spawn_quiet(&[
        "run",
        "--writer",
        "--key",
        "doc",
        "--ttl",
        "2s",
        "--wait",
        "20s",
        "--label",
        "w",
        "--",
        "sh",
        "-c",
        &writer_job,
    ])?;
    // Refused by the readers, the writer leaves its intent on the server.
    wait_until("the writer's intent", || {
        Ok(!rw_keys(&f, "doc", "write-wanted")?.is_empty())
    })?;
    assert!(
        !f.path("w.started").exists(),
        "the writer ran beside readers"
    );
    // `status --rw` shows both readers, with their labels, rising tokens
    // and the server's ttl, and the waiting writer by its label.
    let (rows, code) = rw_status(&f, "doc")?;
    assert_eq!(code, Some(0), "{rows:?}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let mut labels = Vec::new();
    let mut tokens = Vec::new();
    for row in &rows[..2] {
        assert_eq!(row[..2], ["doc", "reader"], "{rows:?}");
        labels.push(row[2].clone());
        tokens.push(row[3].parse::<u64>()?);
        ttl_left(row, Duration::from_secs(2))?;
    }
    labels.sort();
    assert_eq!(labels, ["a", "b"], "{rows:?}");
    assert!(tokens[0] < tokens[1], "readers by rising token: {rows:?}");
    assert_eq!(
        rows[2][..4],
        ["doc", "waiting-writer", "w", "-"],
        "{rows:?}"
    );
    ttl_left(&rows[2], Duration::from_secs(2))?;
    let json = text(
        &f.cmd(&["status", "--rw", "--json", "doc"])
            .output_within()?
            .stdout,
    );
    assert!(
        json.starts_with(r#"{"key":"doc","held":true,"writer":null,"readers":[{"label":"#)
            && json.matches("\"fencing_token\":").count() == 2
            && json.contains(r#"}],"waiting_writer":{"label":"w","ttl_left_ms":"#)
            && json.ends_with("}}\n"),
        "{json}"
    );
    // A new reader is kept out while the writer waits.
    let late = f
        .cmd(&[
            "run", "--shared", "--key", "doc", "--wait", "300ms", "--", "touch", "c.ran",
        ])
        .output_within()?;
    assert_eq!(late.status.code(), Some(75), "{}", text(&late.stderr));
    assert!(
        !f.path("c.ran").exists(),
        "a reader ran past the waiting writer"
    );

    std::fs::write(f.path("a.stop"), "")?;
    assert_eq!(wait_for_exit(&mut readers[0].0)?.code(), Some(0));
    assert_eq!(rw_keys(&f, "doc", "read:*")?.len(), 1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !f.path("w.started").exists(),
        "the writer ran beside a reader"
    );

    std::fs::write(f.path("b.stop"), "")?;
    assert_eq!(wait_for_exit(&mut readers[1].0)?.code(), Some(0));
    wait_for_file(&f.path("w.started"))?;
    assert!(
        rw_keys(&f, "doc", "read:*")?.is_empty(),
        "readers beside the writer"
    );
    assert_eq!(rw_keys(&f, "doc", "write")?, ["leasehold:{doc}:write"]);
    let key = std::fs::read_to_string(f.path("w.key"))?;
    assert_eq!(key.trim(), "{doc}:write", "LEASEHOLD_KEY");
    // The writer alone, with a token above both readers', and no intent.
    let (rows, code) = rw_status(&f, "doc")?;
    assert_eq!(code, Some(0), "{rows:?}");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0][..3], ["doc", "writer", "w"], "{rows:?}");
    assert!(rows[0][3].parse::<u64>()? > tokens[1], "{rows:?}");
    ttl_left(&rows[0], Duration::from_secs(2))?;

    std::fs::write(f.path("w.stop"), "")?;
    assert_eq!(wait_for_exit(&mut writer.0)?.code(), Some(0));
    assert!(rw_keys(&f, "doc", "write")?.is_empty());
    assert!(
        rw_keys(&f, "doc", "write-wanted")?.is_empty(),
        "the granted writer's intent"
    );
    // Free: one row, and the lease counts as not held.
    let (rows, code) = rw_status(&f, "doc")?;
    assert_eq!(rows, [["doc", "free", "-", "-", "-"]]);
    assert_eq!(code, Some(1));
    let json = text(
        &f.cmd(&["status", "--rw", "--json", "doc"])
            .output_within()?
            .stdout,
    );
    assert_eq!(
        json,
        "{\"key\":\"doc\",\"held\":false,\"writer\":null,\"readers\":[],\"waiting_writer\":null}\n"
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
            .output_within()?;
        assert!(!out.status.success(), "{flags:?} was accepted");
        assert!(
            text(&out.stderr).contains("cannot be used with"),
            "{}",
            text(&out.stderr)
        );
    }
    assert!(!f.path("ran").exists());
    let out = f
        .cmd(&["status", "--rw", "--permits=2", "doc"])
        .output_within()?;
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot be used with"));
    Ok(())
}
