//! The `leasehold` binary against a real `redis-server` from the testkit.
//!
//! Children coordinate with the tests through files in a temporary
//! directory: a test waits until a file appears instead of sleeping.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use leasehold_testkit::RedisServer;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

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

    fn output(&self, args: &[&str]) -> Result<Output, std::io::Error> {
        self.cmd(args).output()
    }

    fn spawn(&self, args: &[&str]) -> Result<Child, std::io::Error> {
        self.cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
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

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(stderr) = child.stderr.as_mut() {
        let _ = std::io::Read::read_to_string(stderr, &mut text);
    }
    text
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_commands_exit_code_passes_through() -> TestResult {
    let f = Fixture::new()?;
    let out = f.output(&["run", "--key", "pass", "--", "sh", "-c", "exit 7"])?;
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let out = f.output(&["run", "--key", "pass", "--", "true"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A command ended by a signal is reported as 128 + the signal, as shells do.
    let out = f.output(&["run", "--key", "pass", "--", "sh", "-c", "kill -KILL $$"])?;
    assert_eq!(out.status.code(), Some(128 + 9), "{}", text(&out.stderr));
    // The lease is released when the command exits.
    let status = f.output(&["status", "pass"])?;
    assert_eq!(status.status.code(), Some(1), "{}", text(&status.stdout));
    assert!(f.server.cli(&["EXISTS", "leasehold:{pass}"])? == "0");
    let missing = f.output(&["run", "--key", "pass", "--", "no-such-command-anywhere"])?;
    assert_eq!(missing.status.code(), Some(127));
    assert!(text(&missing.stderr).contains("no-such-command-anywhere"));
    Ok(())
}

#[test]
fn the_child_sees_its_key_and_fencing_token() -> TestResult {
    let f = Fixture::new()?;
    let script = "echo \"$LEASEHOLD_KEY $LEASEHOLD_FENCING_TOKEN\"; leasehold_status=$($0 --url \"$1\" status --json env:check); echo \"$leasehold_status\"";
    let url = f.server.url();
    let out = f.output(&[
        "run",
        "--key",
        "env:check",
        "--",
        "sh",
        "-c",
        script,
        BIN,
        &url,
    ])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let first = lines.next().unwrap_or_default();
    let (key, token) = first.split_once(' ').ok_or("no key and token")?;
    assert_eq!(key, "env:check");
    let token: u64 = token.parse()?;
    assert!(token > 0);
    // `status --json`, run by the child, sees the same holder.
    let json = lines.next().unwrap_or_default();
    assert!(
        json.starts_with(r#"{"key":"env:check","held":true,"#),
        "{json}"
    );
    assert!(
        json.contains(&format!("\"fencing_token\":{token},")),
        "{json}"
    );
    Ok(())
}

#[test]
fn a_held_key_is_not_acquired_in_time() -> TestResult {
    let f = Fixture::new()?;
    let started = f.path("started");
    let holder_script = "touch started; while [ ! -e stop ]; do sleep 0.01; done";
    let mut holder = f.spawn(&[
        "run",
        "--key",
        "busy",
        "--ttl",
        "1s",
        "--label",
        "first",
        "--",
        "sh",
        "-c",
        holder_script,
    ])?;
    wait_for_file(&started)?;

    let begun = Instant::now();
    let out = f.output(&[
        "run", "--key", "busy", "--wait", "300ms", "--", "touch", "ran",
    ])?;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(begun.elapsed() >= Duration::from_millis(300));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("\"busy\"") && stderr.contains("\"first\""),
        "{stderr}"
    );
    assert!(!f.path("ran").exists(), "the command ran without the lease");

    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut holder)?.code(), Some(0));
    Ok(())
}

#[test]
fn a_deleted_lease_stops_the_command_with_sigterm_given_a_lost_grace() -> TestResult {
    let f = Fixture::new()?;
    let script = "trap 'echo terminated > term; exit 0' TERM; touch started; while true; do sleep 0.01; done";
    let mut run = f.spawn(&[
        "run",
        "--key",
        "doomed",
        "--ttl",
        "600ms",
        "--lost-grace",
        "5s",
        "--",
        "sh",
        "-c",
        script,
    ])?;
    wait_for_file(&f.path("started"))?;
    assert_eq!(f.server.cli(&["DEL", "leasehold:{doomed}"])?, "1");
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert_eq!(std::fs::read_to_string(f.path("term"))?, "terminated\n");
    Ok(())
}

#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_lost_grace() -> TestResult {
    let f = Fixture::new()?;
    let script = "trap '' TERM; touch started; while true; do sleep 0.01; done";
    let mut run = f.spawn(&[
        "run",
        "--key",
        "stubborn",
        "--ttl",
        "600ms",
        "--lost-grace",
        "200ms",
        "--",
        "sh",
        "-c",
        script,
    ])?;
    wait_for_file(&f.path("started"))?;
    let deleted = Instant::now();
    assert_eq!(f.server.cli(&["DEL", "leasehold:{stubborn}"])?, "1");
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("killing it"), "{stderr}");
    // SIGKILL only after the grace.
    assert!(deleted.elapsed() >= Duration::from_millis(200));
    Ok(())
}

#[test]
fn two_runs_on_one_key_never_overlap() -> TestResult {
    let f = Fixture::new()?;
    let script =
        "echo \"start $(date +%s%N)\" >> log; sleep 0.2; echo \"end $(date +%s%N)\" >> log";
    let args = [
        "run", "--key", "serial", "--ttl", "1s", "--wait", "10s", "--", "sh", "-c", script,
    ];
    let runs: Vec<Child> = (0..3).map(|_| f.spawn(&args)).collect::<Result<_, _>>()?;
    for mut run in runs {
        assert_eq!(
            wait_for_exit(&mut run)?.code(),
            Some(0),
            "{}",
            stderr_of(&mut run)
        );
    }
    let log = std::fs::read_to_string(f.path("log"))?;
    let events: Vec<(&str, u128)> = log
        .lines()
        .map(|l| {
            let (what, at) = l.split_once(' ').ok_or("bad line")?;
            Ok::<_, Box<dyn std::error::Error>>((what, at.parse()?))
        })
        .collect::<Result<_, _>>()?;
    assert_eq!(events.len(), 6, "{log}");
    for (i, pair) in events.chunks(2).enumerate() {
        assert_eq!((pair[0].0, pair[1].0), ("start", "end"), "{log}");
        if let Some(next) = events.get(2 * i + 2) {
            assert!(pair[1].1 <= next.1, "run {i} overlapped the next: {log}");
        }
    }
    Ok(())
}

#[test]
fn sigterm_to_leasehold_reaches_the_command_and_the_lease_is_released() -> TestResult {
    let f = Fixture::new()?;
    let script = "trap 'exit 3' TERM; touch started; while true; do sleep 0.01; done";
    let mut run = f.spawn(&["run", "--key", "forward", "--", "sh", "-c", script])?;
    wait_for_file(&f.path("started"))?;
    let pid = Pid::from_raw(i32::try_from(run.id())?);
    kill(pid, Signal::SIGTERM)?;
    let status = wait_for_exit(&mut run)?;
    assert_eq!(status.code(), Some(3), "{}", stderr_of(&mut run));
    assert_eq!(f.server.cli(&["EXISTS", "leasehold:{forward}"])?, "0");
    Ok(())
}

#[test]
fn status_release_and_watch() -> TestResult {
    let f = Fixture::new()?;
    let mut watch = f.spawn(&["watch", "admin"])?;
    let (lines, seen) = mpsc::channel();
    let stdout = watch.stdout.take().ok_or("no stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let next_line = || seen.recv_timeout(PATIENCE);
    assert!(next_line()?.ends_with("\"admin\" free"));

    let script =
        "echo $LEASEHOLD_FENCING_TOKEN > token; touch started; while true; do sleep 0.01; done";
    let mut run = f.spawn(&[
        "run", "--key", "admin", "--ttl", "600ms", "--label", "worker-7", "--", "sh", "-c", script,
    ])?;
    wait_for_file(&f.path("started"))?;
    let token = std::fs::read_to_string(f.path("token"))?.trim().to_owned();
    let held = next_line()?;
    assert!(
        held.contains("held by \"worker-7\"") && held.contains(&format!("fencing token {token}")),
        "{held}"
    );

    let status = f.output(&["status", "admin"])?;
    assert_eq!(status.status.code(), Some(0));
    let stdout = text(&status.stdout);
    assert!(
        stdout.contains("\"worker-7\"") && stdout.contains(&token),
        "{stdout}"
    );

    let refused = f.output(&["release", "admin"])?;
    assert_eq!(refused.status.code(), Some(64));
    assert!(text(&refused.stderr).contains("--force"));
    assert_eq!(f.server.cli(&["EXISTS", "leasehold:{admin}"])?, "1");

    let forced = f.output(&["release", "admin", "--force"])?;
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    assert!(text(&forced.stderr).contains("warning"));
    assert!(next_line()?.ends_with("\"admin\" free"));
    // The holder learns at its next renewal and stops its command.
    assert_eq!(wait_for_exit(&mut run)?.code(), Some(76));
    let again = f.output(&["release", "admin", "--force"])?;
    assert_eq!(again.status.code(), Some(1));

    kill(Pid::from_raw(i32::try_from(watch.id())?), Signal::SIGINT)?;
    assert_eq!(wait_for_exit(&mut watch)?.code(), Some(0));
    Ok(())
}

#[test]
fn bad_values_get_clear_errors_and_usage_or_config_codes() -> TestResult {
    let f = Fixture::new()?;
    let out = f.output(&["run", "--key", "k", "--ttl", "1x", "--", "true"])?;
    assert_eq!(out.status.code(), Some(64));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("'1x'") && stderr.contains("--ttl"),
        "{stderr}"
    );

    let out = Command::new(BIN)
        .args(["--url", "foo://nowhere", "run", "--key", "k", "--", "true"])
        .output()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("\"foo://nowhere\""), "{stderr}");

    let out = f
        .cmd(&["run", "--key", "k", "--", "true"])
        .env("LEASEHOLD_WAIT", "a while")
        .output()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("LEASEHOLD_WAIT \"a while\""), "{stderr}");

    let out = Command::new(BIN)
        .args(["--url", "redis://127.0.0.1:1", "status", "k"])
        .output()?;
    assert_eq!(out.status.code(), Some(69));
    assert!(text(&out.stderr).contains("could not connect"));
    Ok(())
}

/// On a terminal (here the pseudo-terminal of util-linux `script`), `run`
/// shows that it waits, on which key, for whom, and for how long.
#[test]
fn waiting_is_shown_on_a_terminal() -> TestResult {
    let f = Fixture::new()?;
    let holder_script = "touch started; while [ ! -e stop ]; do sleep 0.01; done";
    let mut holder = f.spawn(&[
        "run",
        "--key",
        "queue",
        "--ttl",
        "1s",
        "--label",
        "first",
        "--",
        "sh",
        "-c",
        holder_script,
    ])?;
    wait_for_file(&f.path("started"))?;
    let waiter = format!(
        "{BIN} --url {} run --key queue --wait 1500ms -- true",
        f.server.url()
    );
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command", &waiter, "/dev/null"])
        .current_dir(f.dir.path())
        .stdin(Stdio::null())
        .output()?;
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(75), "{shown}");
    assert!(
        shown.contains("waiting for lease \"queue\" held by \"first\": 1s of 1s 500ms"),
        "{shown}"
    );
    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut holder)?.code(), Some(0));
    Ok(())
}

#[test]
fn sigint_reaches_the_command_too() -> TestResult {
    let f = Fixture::new()?;
    let script = "trap 'exit 4' INT; touch started; while true; do sleep 0.01; done";
    let mut run = f.spawn(&["run", "--key", "interrupt", "--", "sh", "-c", script])?;
    wait_for_file(&f.path("started"))?;
    kill(Pid::from_raw(i32::try_from(run.id())?), Signal::SIGINT)?;
    assert_eq!(
        wait_for_exit(&mut run)?.code(),
        Some(4),
        "{}",
        stderr_of(&mut run)
    );
    assert_eq!(f.server.cli(&["EXISTS", "leasehold:{interrupt}"])?, "0");
    Ok(())
}

#[test]
fn interrupted_while_waiting_exits_130_without_running_the_command() -> TestResult {
    let f = Fixture::new()?;
    let holder_script = "touch started; while [ ! -e stop ]; do sleep 0.01; done";
    let mut holder = f.spawn(&["run", "--key", "line", "--", "sh", "-c", holder_script])?;
    wait_for_file(&f.path("started"))?;
    let mut waiter = f.spawn(&["run", "--key", "line", "--wait", "1m", "--", "touch", "ran"])?;
    // A waiter subscribes to the key's release notices: that is when it waits.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let channels = [
            f.server.cli(&["PUBSUB", "SHARDCHANNELS"])?,
            f.server.cli(&["PUBSUB", "CHANNELS"])?,
        ];
        if channels
            .iter()
            .any(|c| c.contains("leasehold:{line}:released"))
        {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never subscribed");
        std::thread::sleep(Duration::from_millis(5));
    }
    kill(Pid::from_raw(i32::try_from(waiter.id())?), Signal::SIGINT)?;
    assert_eq!(wait_for_exit(&mut waiter)?.code(), Some(130));
    assert!(!f.path("ran").exists());
    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut holder)?.code(), Some(0));
    Ok(())
}
