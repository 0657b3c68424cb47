//! The `LEASEHOLD_*` environment of the `leasehold` command against a real
//! `redis-server` from the testkit: a name that is no setting is refused
//! before anything is done (the command not run, nothing written to the
//! server), while the names the command sets for its child, and those of
//! leasehold's own test suite, pass.
//!
//! The witnesses are the command's exit code and message, the files the
//! commands under test write, and the server's keys.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{BIN, Fixture, OutputWithin, TestResult, text};

#[test]
fn an_unknown_leasehold_variable_is_refused_naming_it() -> TestResult {
    let f = Fixture::new()?;
    let out = f
        .cmd(&["run", "--key", "k", "--", "touch", "ran"])
        .env("LEASEHOLD_TTL_", "10s")
        .output_within()?;
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).trim_end(),
        "leasehold: unknown lease setting LEASEHOLD_TTL_; did you mean LEASEHOLD_TTL?"
    );
    assert!(!f.path("ran").exists(), "the command ran");
    assert_eq!(f.keys("leasehold:*")?, Vec::<String>::new());

    // Nothing near it: the message lists the settings.
    let colour = "LEASEHOLD_COLOUR"; // unknown on purpose
    let out = f
        .cmd(&["run", "--key", "k", "--", "touch", "ran"])
        .env(colour, "blue")
        .output_within()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "unknown lease setting {colour}; the settings are LEASEHOLD_TTL,"
        )),
        "{stderr}"
    );
    assert!(!f.path("ran").exists(), "the command ran");

    // Every command that talks to Redis reads the environment.
    let typo = "LEASEHOLD_ULR"; // unknown on purpose
    let out = f
        .cmd(&["status", "k"])
        .env(typo, "redis://elsewhere")
        .output_within()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{typo}; did you mean LEASEHOLD_URL?")),
        "{stderr}"
    );
    Ok(())
}

/// A `leasehold run` inside a scheduled run's command inherits
/// `LEASEHOLD_KEY`, `LEASEHOLD_FENCING_TOKEN`, `LEASEHOLD_JOB` and
/// `LEASEHOLD_TICK`, and runs as any other: its own command sees its own
/// key and token, beside the outer run's job and tick.
#[test]
fn a_nested_run_starts_with_the_variables_it_inherited() -> TestResult {
    let f = Fixture::new()?;
    // The hourly tick at or before now is on time all hour long; near the
    // end of an hour, wait for the next one, so that the outer run asks
    // for a tick that is still on time when the server decides.
    const HOUR_MS: u128 = 3_600_000;
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    if HOUR_MS - now % HOUR_MS < 30_000 {
        std::thread::sleep(Duration::from_millis(
            u64::try_from(HOUR_MS - now % HOUR_MS)? + 50,
        ));
    }
    let url = f.server.url();
    let inner =
        r#"echo "$LEASEHOLD_KEY $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_JOB $LEASEHOLD_TICK" > inner"#;
    let outer = format!(
        r#"echo "$LEASEHOLD_KEY $LEASEHOLD_FENCING_TOKEN" > outer; "$0" --url "$1" run --key inner -- sh -c '{inner}'"#
    );
    let out = f.output(&[
        "run",
        "--schedule",
        "0 * * * *",
        "--start-deadline",
        "1h",
        "--job",
        "nested",
        "--",
        "sh",
        "-c",
        &outer,
        BIN,
        &url,
    ])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let outer = std::fs::read_to_string(f.path("outer"))?;
    let (outer_key, outer_token) = outer.trim().split_once(' ').ok_or("no outer line")?;
    assert_eq!(outer_key, "job:{nested}:run");
    let inner = std::fs::read_to_string(f.path("inner"))?;
    let fields: Vec<&str> = inner.split_whitespace().collect();
    let [key, token, job, tick] = fields[..] else {
        return Err(format!("inner saw {inner:?}").into());
    };
    assert_eq!((key, job), ("inner", "nested"));
    assert!(token.parse::<u64>()? > 0 && token != outer_token, "{inner}");
    assert_eq!(tick.parse::<u128>()? % HOUR_MS, 0, "{inner}");
    Ok(())
}

/// The names the test script, the testkit and the benchmarks set do not
/// stop the command: the test suite runs it with them in its environment.
#[test]
fn the_test_suites_variables_pass() -> TestResult {
    let f = Fixture::new()?;
    let out = f
        .cmd(&["run", "--key", "k", "--", "touch", "ran"])
        .envs([
            ("LEASEHOLD_SERVER", "redis"),
            ("LEASEHOLD_SECOND_PASS", "0"),
            ("LEASEHOLD_REDIS_SERVER", "/usr/bin/redis-server"),
            ("LEASEHOLD_FAKETIME_SERVER", "/tmp/faketime/redis-server"),
            ("LEASEHOLD_PG_BIN", "/usr/lib/postgresql/16/bin"),
            ("LEASEHOLD_BENCH_QUICK", "1"),
            ("LEASEHOLD_CAMPAIGN_SEED", "7"),
        ])
        .output_within()?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(f.path("ran").exists(), "the command did not run");
    Ok(())
}
