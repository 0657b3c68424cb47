//! `leasehold run --schedule` and `leasehold jobs` against a real
//! `redis-server` from the testkit, and the refusals of `run` that keep a
//! minimum hold or a scheduled job from running a command twice.
//!
//! The witness is the server's own state, read on a side connection
//! (`redis-cli HGETALL` of the job's record, `PTTL` and `EXISTS` of the
//! run's lease), and the lines the commands under test append to a file.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{
    BIN, Fixture, OutputWithin, PATIENCE, Running, TestResult, text, wait_for_exit, wait_for_file,
};

/// Every hour at minute 0, startable all hour long: a test's invocations
/// ask for the current hour's tick and find it on time.
const HOURLY: [&str; 4] = ["--schedule", "0 * * * *", "--start-deadline", "1h"];

fn unix_ms(at: SystemTime) -> u64 {
    u64::try_from(
        at.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(u64::MAX)
}

/// The start of the current hour, in UNIX ms, once at least `room` is left
/// of it (waiting for the next hour otherwise), so that every invocation
/// of a test asks for the same hourly tick.
fn this_hour(room: Duration) -> u64 {
    const HOUR: u64 = 3_600_000;
    let now = unix_ms(SystemTime::now());
    let left = HOUR - now % HOUR;
    if Duration::from_millis(left) < room {
        std::thread::sleep(Duration::from_millis(left + 50));
        return this_hour(room);
    }
    now - now % HOUR
}

/// The job's record as the server holds it (`HGETALL`).
fn record(f: &Fixture, job: &str) -> Result<HashMap<String, String>, Box<dyn std::error::Error>> {
    let key = format!("leasehold:job:{{{job}}}:record");
    let reply = f.server.cli(&["HGETALL", &key])?;
    let lines: Vec<&str> = reply.lines().collect();
    Ok(lines
        .chunks(2)
        .filter_map(|pair| match pair {
            [field, value] => Some(((*field).to_owned(), (*value).to_owned())),
            _ => None,
        })
        .collect())
}

fn field<'a>(record: &'a HashMap<String, String>, name: &str) -> &'a str {
    record.get(name).map_or("(absent)", String::as_str)
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Appends the run's environment to `runs` in the test's directory.
const RECORD_RUN: &str =
    "echo \"$LEASEHOLD_JOB $LEASEHOLD_TICK $LEASEHOLD_FENCING_TOKEN $LEASEHOLD_KEY $0\" >> runs";

fn scheduled(f: &Fixture, job: &str, label: &str, exit: u8) -> std::io::Result<Output> {
    let script = format!("{RECORD_RUN}; exit {exit}");
    let mut args = vec!["run"];
    args.extend(HOURLY);
    args.extend([
        "--job", job, "--label", label, "--", "sh", "-c", &script, label,
    ]);
    f.output(&args)
}

/// A refused `run`: its flags, its LEASEHOLD_* variables, and what its
/// message says.
type Refused = (&'static [&'static str], Env, &'static [&'static str]);
type Env = &'static [(&'static str, &'static str)];

/// Each combination `run` refuses: exit 64 with why, before connecting to
/// the server (nothing is written there) and without running the command,
/// whether a flag or a LEASEHOLD_* variable brought it.
#[test]
fn refused_combinations_exit_64_and_say_why() -> TestResult {
    let f = Fixture::new()?;
    let cases: [Refused; 19] = [
        // The library's lease options from the environment: none brings a
        // refused combination back.
        (
            &["--key", "k", "--wait", "5m"],
            &[("LEASEHOLD_HOLD_AT_LEAST", "10m")],
            &["LEASEHOLD_HOLD_AT_LEAST=10m cannot be used with --wait 5m"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n"],
            &[("LEASEHOLD_HOLD_AT_LEAST", "1m")],
            &["--schedule cannot be used with LEASEHOLD_HOLD_AT_LEAST=1m"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n"],
            &[("LEASEHOLD_FAIR", "true")],
            &["--schedule cannot be used with LEASEHOLD_FAIR"],
        ),
        (
            &["--key", "k"],
            &[("LEASEHOLD_PROGRESS_WINDOW", "1m")],
            &["LEASEHOLD_PROGRESS_WINDOW needs --progress-file"],
        ),
        (
            &["--key", "k", "--permits", "2"],
            &[("LEASEHOLD_HOLD_AT_LEAST", "1m")],
            &["LEASEHOLD_HOLD_AT_LEAST=1m cannot be used with --permits"],
        ),
        (
            &["--key", "k", "--at-least", "10m", "--wait", "5m"],
            &[],
            &[
                "--at-least 10m cannot be used with --wait 5m",
                "run the command again",
            ],
        ),
        (
            &["--key", "k", "--at-least", "10m"],
            &[("LEASEHOLD_WAIT", "5m")],
            &[
                "--at-least 10m cannot be used with LEASEHOLD_WAIT=5m",
                "unset LEASEHOLD_WAIT",
            ],
        ),
        (
            &["--key", "k", "--at-least", "10m", "--ttl", "30s"],
            &[],
            &[
                "--at-least 10m cannot be used with --ttl 30s",
                "end the hold early",
            ],
        ),
        (
            &["--key", "k", "--at-least", "10m"],
            &[("LEASEHOLD_TTL", "1m")],
            &["--at-least 10m cannot be used with LEASEHOLD_TTL=1m"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--at-least", "1m"],
            &[],
            &["--schedule cannot be used with --at-least", "record"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--wait", "1m"],
            &[],
            &["--schedule cannot be used with --wait 1m", "record"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n"],
            &[("LEASEHOLD_WAIT", "1m")],
            &[
                "--schedule cannot be used with LEASEHOLD_WAIT=1m",
                "unset LEASEHOLD_WAIT",
            ],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--permits", "2"],
            &[],
            &[
                "--schedule cannot be used with --permits",
                "exclusive run lease",
            ],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--shared"],
            &[],
            &["--schedule cannot be used with --shared"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--writer"],
            &[],
            &["--schedule cannot be used with --writer"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--fair"],
            &[],
            &["--schedule cannot be used with --fair"],
        ),
        (
            &["--schedule", "0 2 * * *", "--job", "n", "--key", "k"],
            &[],
            &["--key", "cannot be used with"],
        ),
        (&["--schedule", "0 2 * * *"], &[], &["--job"]),
        (
            &[
                "--schedule",
                "0 2 * * *",
                "--job",
                "n",
                "--time-zone",
                "Mars/Olympus",
            ],
            &[],
            &["Mars/Olympus"],
        ),
    ];
    for (args, env, says) in cases {
        let mut cmd = f.cmd(&["run"]);
        cmd.args(args).args(["--", "touch", "ran"]);
        for (var, value) in env {
            cmd.env(var, value);
        }
        let out = cmd.output_within()?;
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?} {env:?}: {stderr}");
        for said in says {
            assert!(
                stderr.contains(said),
                "{args:?} {env:?}: {said:?} not in {stderr}"
            );
        }
        assert!(!f.path("ran").exists(), "{args:?} {env:?}: the command ran");
    }
    assert_eq!(
        f.keys("*")?,
        Vec::<String>::new(),
        "a refused run wrote to the server"
    );
    Ok(())
}

/// `--at-least` with no ttl given: the ttl is the hold, so the key the
/// command holds lives the hold even if leasehold were killed now (its
/// PTTL while the command runs is far above the 30s default ttl).
#[test]
fn at_least_with_no_ttl_holds_for_the_hold() -> TestResult {
    let f = Fixture::new()?;
    let mut run = f.spawn(&[
        "run",
        "--key",
        "held",
        "--at-least",
        "2m",
        "--",
        "sh",
        "-c",
        "touch started; while [ ! -e stop ]; do sleep 0.01; done",
    ])?;
    wait_for_file(&f.path("started"))?;
    let pttl: i64 = f
        .server
        .cli(&["PTTL", "leasehold:{held}"])?
        .trim()
        .parse()?;
    std::fs::write(f.path("stop"), "")?;
    let status = wait_for_exit(&mut run)?;
    assert_eq!(status.code(), Some(0));
    assert!(
        (110_000..=120_000).contains(&pttl),
        "while the command ran the key's PTTL was {pttl} ms, not the 2m hold's"
    );
    Ok(())
}

/// The library's names work on the command line (`--hold-at-least`), and
/// `LEASEHOLD_HOLD_AT_LEAST` sets the hold as the flag does: the key's
/// PTTL while the command runs is the hold's, not the 30s default ttl's.
#[test]
fn the_hold_from_the_environment_holds_as_the_flag_does() -> TestResult {
    let f = Fixture::new()?;
    for (args, env) in [
        (&["--hold-at-least", "2m"][..], None),
        (&[][..], Some(("LEASEHOLD_HOLD_AT_LEAST", "2m"))),
    ] {
        let _ = std::fs::remove_file(f.path("stop"));
        let _ = std::fs::remove_file(f.path("started"));
        let mut cmd = f.cmd(&["run", "--key", "env-held"]);
        cmd.args(args).args([
            "--",
            "sh",
            "-c",
            "touch started; while [ ! -e stop ]; do sleep 0.01; done",
        ]);
        if let Some((var, value)) = env {
            cmd.env(var, value);
        }
        let mut run = cmd.spawn()?;
        wait_for_file(&f.path("started"))?;
        let pttl: i64 = f
            .server
            .cli(&["PTTL", "leasehold:{env-held}"])?
            .trim()
            .parse()?;
        std::fs::write(f.path("stop"), "")?;
        let status = wait_for_exit(&mut run)?;
        assert_eq!(status.code(), Some(0), "{args:?} {env:?}");
        assert!(
            (110_000..=120_000).contains(&pttl),
            "{args:?} {env:?}: while the command ran the key's PTTL was {pttl} ms, not the 2m hold's"
        );
        // Released at the end of the hold, not before: free it for the
        // next round.
        f.server.cli(&[
            "DEL",
            "leasehold:{env-held}",
            "leasehold:{env-held}:held-until",
        ])?;
    }
    Ok(())
}

/// A tick granted to the first invocation runs its command once (which
/// sees the job, the tick, the fencing token and the run's key, and whose
/// exit code passes through); a second invocation for the same tick does
/// not run it, exits 0 and says who decided it; the server's record says
/// completed, with the run's token and label; the run's lease is gone;
/// `jobs` lists the job; another schedule for the job is refused (78).
#[test]
fn a_granted_tick_runs_once_and_is_recorded_completed() -> TestResult {
    let f = Fixture::new()?;
    let tick = this_hour(Duration::from_secs(30));
    let first = scheduled(&f, "hourly", "host-a", 3)?;
    assert_eq!(first.status.code(), Some(3), "{}", text(&first.stderr));
    let runs = lines_of(&f.path("runs"));
    let [run] = runs.as_slice() else {
        return Err(format!("the command should have run once: {runs:?}").into());
    };
    let parts: Vec<&str> = run.split(' ').collect();
    let [job, run_tick, token, key, label] = parts[..] else {
        return Err(format!("bad run line {run:?}").into());
    };
    assert_eq!((job, key, label), ("hourly", "job:{hourly}:run", "host-a"));
    assert_eq!(run_tick.parse::<u64>()?, tick);
    let token: u64 = token.parse()?;
    assert!(token > 0);

    let second = scheduled(&f, "hourly", "host-b", 0)?;
    let stderr = text(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{stderr}");
    assert_eq!(lines_of(&f.path("runs")).len(), 1, "the tick ran twice");
    assert!(
        stderr.contains("decided already: completed by \"host-a\"")
            && stderr.contains(&format!("fencing token {token}")),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");

    let record = record(&f, "hourly")?;
    for (name, expected) in [
        ("decided", tick.to_string()),
        ("decided_state", "completed".to_owned()),
        ("run_state", "completed".to_owned()),
        ("run_tick", tick.to_string()),
        ("run_token", token.to_string()),
        ("run_label", "host-a".to_owned()),
        ("started", "1".to_owned()),
        ("completed", "1".to_owned()),
        ("fingerprint", "0 0 * * * * UTC".to_owned()),
    ] {
        assert_eq!(field(&record, name), expected, "{name} in {record:?}");
    }
    assert_eq!(
        f.server
            .cli(&["EXISTS", "leasehold:job:{hourly}:run"])?
            .trim(),
        "0"
    );

    let json = f.output(&["jobs", "--json"])?;
    assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
    let listed = text(&json.stdout);
    let [line] = listed.lines().collect::<Vec<_>>()[..] else {
        return Err(format!("jobs --json should list one job: {listed}").into());
    };
    let job: serde_json::Value = serde_json::from_str(line)?;
    assert_eq!(job["job"], "hourly", "{job}");
    assert_eq!(job["decided"]["tick_ms"], tick, "{job}");
    assert_eq!(job["decided"]["state"], "completed", "{job}");
    assert_eq!(job["run"]["label"], "host-a", "{job}");
    assert_eq!(job["run"]["fencing_token"], token, "{job}");
    assert_eq!(job["run"]["state"], "completed", "{job}");
    assert_eq!(job["next_tick_ms"], tick + 3_600_000, "{job}");
    assert_eq!(job["counts"]["started"], 1, "{job}");
    assert_eq!(job["counts"]["completed"], 1, "{job}");
    let table = f.output(&["jobs"])?;
    let table = text(&table.stdout);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].starts_with("JOB") && rows[0].contains("NEXT TICK"),
        "{table}"
    );
    assert!(
        rows[1].starts_with("hourly")
            && rows[1].contains("completed")
            && rows[1].contains("host-a"),
        "{table}"
    );
    let one = f.output(&["jobs", "--job", "hourly", "--json"])?;
    assert_eq!(text(&one.stdout).lines().count(), 1);
    let none = f.output(&["jobs", "--job", "nope"])?;
    assert_eq!(none.status.code(), Some(1), "{}", text(&none.stderr));

    // Another schedule for the job: refused, not run, with what to do.
    let other = f.output(&[
        "run",
        "--schedule",
        "30 * * * *",
        "--job",
        "hourly",
        "--",
        "sh",
        "-c",
        RECORD_RUN,
    ])?;
    let stderr = text(&other.stderr);
    assert_eq!(other.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("every host") && stderr.contains("0 0 * * * * UTC"),
        "{stderr}"
    );
    assert_eq!(lines_of(&f.path("runs")).len(), 1);
    Ok(())
}

/// With no record, a tick asked for after its start deadline is missed:
/// not run, exit 0, said so, and recorded as missed.
#[test]
fn a_late_tick_is_missed_and_recorded() -> TestResult {
    let f = Fixture::new()?;
    // New Year's midnight: this year's is long past its 1m start deadline
    // (except in the first minutes of the year).
    let out = f.output(&[
        "run",
        "--schedule",
        "0 0 1 1 *",
        "--job",
        "yearly",
        "--",
        "touch",
        "ran",
    ])?;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("not run: missed"), "{stderr}");
    assert!(!f.path("ran").exists());
    let record = record(&f, "yearly")?;
    assert_eq!(field(&record, "decided_state"), "missed", "{record:?}");
    assert_eq!(field(&record, "missed"), "1", "{record:?}");
    Ok(())
}

/// A scheduled run whose lease is taken away is stopped as a plain run's
/// job is (killed at once, exit 76), and the next invocation finds the
/// tick decided: abandoned, not run again (--on-abandon skip).
#[test]
fn a_scheduled_run_that_loses_its_lease_is_stopped_and_abandoned() -> TestResult {
    let f = Fixture::new()?;
    let _tick = this_hour(Duration::from_secs(30));
    let mut args = vec!["run"];
    args.extend(HOURLY);
    args.extend([
        "--job",
        "lost",
        "--ttl",
        "1s",
        "--label",
        "host-a",
        "--",
        "sh",
        "-c",
        "touch started; sleep 30",
    ]);
    let mut run = f.spawn(&args)?;
    wait_for_file(&f.path("started"))?;
    f.server.cli(&["DEL", "leasehold:job:{lost}:run"])?;
    let began = Instant::now();
    let status = wait_for_exit(&mut run)?;
    assert_eq!(status.code(), Some(76));
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "stopped after {:?}",
        began.elapsed()
    );
    let again = f.output(&[
        "run",
        "--schedule",
        "0 * * * *",
        "--start-deadline",
        "1h",
        "--job",
        "lost",
        "--",
        "touch",
        "again",
    ])?;
    let stderr = text(&again.stderr);
    assert_eq!(again.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("decided already: abandoned"), "{stderr}");
    assert!(!f.path("again").exists(), "an abandoned tick ran again");
    let record = record(&f, "lost")?;
    assert_eq!(field(&record, "decided_state"), "abandoned", "{record:?}");
    assert_eq!(field(&record, "abandoned"), "1", "{record:?}");
    Ok(())
}

/// A scheduled run at its renewal cap is told why, as a run under --key
/// is: its command gets SIGTERM and the grace (it traps the signal and
/// leaves a mark), not SIGKILL at once as for a lost lease.
#[test]
fn a_scheduled_run_at_its_renewal_cap_gets_sigterm_and_the_grace() -> TestResult {
    let f = Fixture::new()?;
    let _tick = this_hour(Duration::from_secs(30));
    let mut args = vec!["run"];
    args.extend(HOURLY);
    args.extend([
        "--job",
        "capped",
        "--ttl",
        "1s",
        "--max-renewals",
        "1",
        "--grace",
        "2s",
        "--",
        "sh",
        "-c",
        "trap 'touch terminated; exit 0' TERM; touch started; while :; do sleep 0.05; done",
    ]);
    let mut run = f.spawn(&args)?;
    wait_for_file(&f.path("started"))?;
    let status = wait_for_exit(&mut run)?;
    assert_eq!(status.code(), Some(76), "{status:?}");
    assert!(
        f.path("terminated").exists(),
        "the command was not given SIGTERM before the cap's end"
    );
    Ok(())
}

/// `leasehold ARGS` on `url` under libfaketime with the wall clock
/// `offset_ms` off (the monotonic clock, on which tokio's timers run, is
/// left alone), with no leasehold variables inherited.
fn skewed(lib: &Path, offset_ms: i64, dir: &Path) -> Command {
    let mut cmd = Command::new("sh");
    cmd.env("LD_PRELOAD", lib)
        .env("FAKETIME", leasehold_testkit::faketime_offset(offset_ms))
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .current_dir(dir);
    for (var, _) in std::env::vars_os() {
        if var.to_string_lossy().starts_with("LEASEHOLD_") || var == "REDIS_URL" {
            cmd.env_remove(var);
        }
    }
    cmd
}

/// The clock a skewed process reads, in seconds, less the machine's.
fn measured_offset(
    lib: &Path,
    offset_ms: i64,
    dir: &Path,
) -> Result<i64, Box<dyn std::error::Error>> {
    let before = unix_ms(SystemTime::now());
    let out = skewed(lib, offset_ms, dir)
        .args(["-c", "date +%s%3N"])
        .output_within()?;
    let theirs: i64 = text(&out.stdout).trim().parse()?;
    let after = unix_ms(SystemTime::now());
    Ok((theirs - i64::try_from(before / 2 + after / 2)?) / 1_000)
}

const HOSTS: [(&str, i64); 3] = [("behind", -7_000), ("on-time", 0), ("ahead", 7_000)];

/// The same crontab line on three hosts whose clocks are 7 s behind, on
/// time and 7 s ahead, for a schedule every 10 s: the test starts the
/// three "crons" at the same moment, each fires `leasehold run` when its
/// own clock reaches the tick (a loop on `date` under the host's clock),
/// so the host ahead asks 7 s early and the host behind 7 s late. Exactly
/// one of them runs the command; the others exit 0 saying the tick is
/// decided; the server's record says the tick completed, by the host that
/// ran it.
#[test]
fn one_run_per_tick_across_skewed_clocks() -> TestResult {
    let f = Fixture::new()?;
    let lib = leasehold_testkit::libfaketime()?;
    for (host, offset) in HOSTS {
        let measured = measured_offset(&lib, offset, f.dir.path())?;
        assert!(
            (measured - offset / 1_000).abs() <= 1,
            "{host}'s clock is {measured} s off, not {offset} ms: is libfaketime working?"
        );
    }
    // The tick: on the 10 s grid, late enough that the host ahead fires
    // after its cron started.
    let now = unix_ms(SystemTime::now()) / 1_000;
    let tick = (now + 9).div_ceil(10) * 10;
    let url = f.server.url();
    let cron =
        "t=$1; shift; while [ \"$(date +%s)\" -lt \"$t\" ]; do sleep 0.05; done; exec \"$@\"";
    let mut hosts = Vec::new();
    for (host, offset) in HOSTS {
        let record = format!("echo \"$LEASEHOLD_TICK $LEASEHOLD_FENCING_TOKEN {host}\" >> runs");
        let mut cmd = skewed(&lib, offset, f.dir.path());
        cmd.args(["-c", cron, "cron", &tick.to_string(), BIN, "--url", &url])
            .args(["run", "--schedule", "*/10 * * * * *", "--job", "skewed"])
            .args(["--label", host, "--", "sh", "-c", &record])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        hosts.push((host, Running(cmd.spawn()?)));
    }
    // Every host is done 7 s after the tick (the one behind fires then).
    let deadline = Instant::now()
        + Duration::from_secs(tick.saturating_sub(now))
        + Duration::from_secs(7)
        + PATIENCE;
    let mut said = Vec::new();
    for (host, running) in &mut hosts {
        let status = loop {
            if let Some(status) = running.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                return Err(format!("{host} did not exit in time").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = running.stderr.take() {
            std::io::Read::read_to_string(&mut pipe, &mut stderr)?;
        }
        assert_eq!(status.code(), Some(0), "{host}: {stderr}");
        said.push((*host, stderr));
    }
    let runs = lines_of(&f.path("runs"));
    let [run] = runs.as_slice() else {
        return Err(format!("the tick should have run once: {runs:?}; hosts said {said:?}").into());
    };
    let parts: Vec<&str> = run.split(' ').collect();
    let [run_tick, token, runner] = parts[..] else {
        return Err(format!("bad run line {run:?}").into());
    };
    assert_eq!(run_tick.parse::<u64>()?, tick * 1_000, "{run}");
    for (host, stderr) in &said {
        if host == &runner {
            assert!(stderr.is_empty(), "{host} ran the tick and said {stderr:?}");
        } else {
            assert!(
                stderr.contains("decided already") && stderr.contains(&format!("by \"{runner}\"")),
                "{host}: {stderr}"
            );
        }
    }
    let record = record(&f, "skewed")?;
    assert_eq!(
        field(&record, "decided"),
        (tick * 1_000).to_string(),
        "{record:?}"
    );
    assert_eq!(field(&record, "decided_state"), "completed", "{record:?}");
    assert_eq!(field(&record, "run_label"), runner, "{record:?}");
    assert_eq!(field(&record, "run_token"), token, "{record:?}");
    assert_eq!(field(&record, "started"), "1", "{record:?}");
    Ok(())
}

/// A host whose clock is more than a period ahead of the server's asks
/// for nothing: exit 75, said so, nothing recorded.
#[test]
fn a_clock_more_than_a_period_ahead_exits_75() -> TestResult {
    let f = Fixture::new()?;
    let lib = leasehold_testkit::libfaketime()?;
    let out = skewed(&lib, 30_000, f.dir.path())
        .args(["-c", "exec \"$@\"", "sh", BIN, "--url", &f.server.url()])
        .args([
            "run",
            "--schedule",
            "*/10 * * * * *",
            "--job",
            "ahead",
            "--",
            "touch",
            "ran",
        ])
        .output_within()?;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(stderr.contains("ahead of the server's"), "{stderr}");
    assert!(!f.path("ran").exists());
    assert!(record(&f, "ahead")?.is_empty());
    Ok(())
}
