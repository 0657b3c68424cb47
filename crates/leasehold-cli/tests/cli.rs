//! The `leasehold` binary against a real `redis-server` from the testkit.
//!
//! Children coordinate with the tests through files in a temporary
//! directory: a test waits until a file appears instead of sleeping.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{
    BIN, Fixture, OutputWithin, PATIENCE, Running, TestResult, spawn, text, wait_for_exit,
    wait_for_file,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What leasehold wrote to stderr. Read on a thread with a timeout: a
/// process of the job that outlived leasehold (the failure some tests look
/// for) holds the pipe open, and reading to its end would never return.
fn stderr_of(child: &mut Child) -> String {
    match child.stderr.take() {
        Some(stderr) => read_all(stderr),
        None => String::new(),
    }
}

fn read_all(mut pipe: impl std::io::Read + Send + 'static) -> String {
    let (done, text) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        let _ = done.send(text);
    });
    text.recv_timeout(PATIENCE)
        .unwrap_or_else(|_| "(the pipe is still open: a process outlived leasehold)".to_owned())
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

/// `--at-least 10m`: the job ends at once, and the key is still on the
/// server with a PTTL of the minimum less at most the time the run took
/// (measured here from before the spawn to after the exit, which brackets
/// the grant; +1 ms for Redis truncating its clock to whole milliseconds),
/// far above the 30 s default ttl a lease kept for its ttl would show; so
/// the same line on a second host does not run the job.
#[test]
fn at_least_keeps_the_key_after_the_job_ends_early() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let begun = Instant::now();
    let out = f.output(&[
        "run",
        "--key",
        "nightly",
        "--at-least",
        "10m",
        "--",
        "touch",
        "ran",
    ])?;
    let took = i64::try_from(begun.elapsed().as_millis())?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(f.path("ran").exists(), "the job did not run");
    let pttl = side.pttl("leasehold:{nightly}")?;
    let minimum = 600_000;
    assert!(
        (minimum - took - 1..=minimum).contains(&pttl),
        "after the job ended the key's PTTL is {pttl} ms, not the 10m minimum less the {took} ms the run took"
    );
    std::fs::remove_file(f.path("ran"))?;
    let again = f.output(&[
        "run",
        "--key",
        "nightly",
        "--at-least",
        "10m",
        "--",
        "touch",
        "ran",
    ])?;
    assert_eq!(again.status.code(), Some(75), "{}", text(&again.stderr));
    assert!(
        !f.path("ran").exists(),
        "the job ran twice within the minimum"
    );
    Ok(())
}

#[test]
fn a_held_key_is_not_acquired_in_time() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
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
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
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
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
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
    let runs: Vec<Running> = (0..3).map(|_| f.spawn(&args)).collect::<Result<_, _>>()?;
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

/// `signal` sent to leasehold reaches the command (which traps it and
/// exits with `code`), leasehold passes the code on, and the lease on `key`
/// is released.
fn a_signal_reaches_the_command(signal: Signal, trap: &str, code: i32, key: &str) -> TestResult {
    let f = Fixture::new()?;
    let script =
        format!("trap 'exit {code}' {trap}; touch started; while true; do sleep 0.01; done");
    let mut run = f.spawn(&["run", "--key", key, "--", "sh", "-c", &script])?;
    wait_for_file(&f.path("started"))?;
    kill(Pid::from_raw(i32::try_from(run.id())?), signal)?;
    let status = wait_for_exit(&mut run)?;
    assert_eq!(status.code(), Some(code), "{}", stderr_of(&mut run));
    assert_eq!(
        f.server.cli(&["EXISTS", &format!("leasehold:{{{key}}}")])?,
        "0"
    );
    Ok(())
}

#[test]
fn sigterm_to_leasehold_reaches_the_command_and_the_lease_is_released() -> TestResult {
    a_signal_reaches_the_command(Signal::SIGTERM, "TERM", 3, "forward")
}

/// `watch` is told of each change rather than looking every so often: a
/// holder (here a key written by a side client) that comes and goes five
/// times, 30 ms each, is shown held and then free every time. A watch that
/// looked every 100 ms would miss most of them (each with odds of 0.7).
#[test]
fn watch_shows_holders_that_come_and_go_between_two_looks() -> TestResult {
    let f = Fixture::new()?;
    let mut watch = f.spawn(&["watch", "brief"])?;
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
    assert!(next_line()?.ends_with("\"brief\" free"));
    for i in 0..5 {
        f.server
            .cli(&["SET", "leasehold:{brief}", "someone", "PX", "60000"])?;
        std::thread::sleep(Duration::from_millis(30));
        f.server.cli(&["DEL", "leasehold:{brief}"])?;
        let held = next_line()?;
        assert!(held.contains("\"brief\" held by"), "hold {i}: {held}");
        let free = next_line()?;
        assert!(free.ends_with("\"brief\" free"), "hold {i}: {free}");
    }
    kill(Pid::from_raw(i32::try_from(watch.id())?), Signal::SIGINT)?;
    assert_eq!(wait_for_exit(&mut watch)?.code(), Some(0));
    Ok(())
}

#[test]
fn status_release_and_watch() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
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

    // The table: a header, then a row whose ttl left is the server's PTTL
    // in humantime, at most the 600ms ttl.
    let status = f.output(&["status", "admin", "elsewhere"])?;
    assert_eq!(status.status.code(), Some(1), "one of the two is not held");
    let stdout = text(&status.stdout);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["KEY", "STATE", "HOLDER", "FENCING", "TOKEN", "TTL", "LEFT"],
        "{stdout}"
    );
    assert_eq!(
        rows[1][..4],
        ["admin", "held", "worker-7", &token],
        "{stdout}"
    );
    let ttl_left = humantime::parse_duration(&rows[1][4..].join(" "))?;
    assert!(
        ttl_left > Duration::ZERO && ttl_left <= Duration::from_millis(600),
        "{stdout}"
    );
    assert_eq!(rows[2], ["elsewhere", "free", "-", "-", "-"], "{stdout}");
    assert_eq!(rows.len(), 3, "{stdout}");

    // --json is one object per key, in the same form as ever.
    let json = f.output(&["status", "--json", "admin"])?;
    assert_eq!(json.status.code(), Some(0));
    let json = text(&json.stdout);
    let prefix = format!(
        r#"{{"key":"admin","held":true,"label":"worker-7","fencing_token":{token},"ttl_left_ms":"#
    );
    let ttl_ms: u64 = json
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("}\n"))
        .ok_or_else(|| format!("not the stable form: {json}"))?
        .parse()?;
    assert!(ttl_ms > 0 && ttl_ms <= 600, "{json}");
    let free = f.output(&["status", "--json", "elsewhere", "admin"])?;
    assert_eq!(free.status.code(), Some(1));
    let free = text(&free.stdout);
    let mut lines = free.lines();
    assert_eq!(lines.next(), Some(r#"{"key":"elsewhere","held":false}"#));
    assert!(
        lines.next().is_some_and(|l| l.starts_with(&prefix)),
        "{free}"
    );
    assert_eq!(lines.next(), None, "{free}");

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
        .output_within()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("\"foo://nowhere\""), "{stderr}");

    let out = f
        .cmd(&["run", "--key", "k", "--", "true"])
        .env("LEASEHOLD_WAIT", "a while")
        .output_within()?;
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("LEASEHOLD_WAIT \"a while\""), "{stderr}");

    let out = Command::new(BIN)
        .args(["--url", "redis://127.0.0.1:1", "status", "k"])
        .output_within()?;
    assert_eq!(out.status.code(), Some(69));
    assert!(text(&out.stderr).contains("could not connect"));
    Ok(())
}

/// Holds `key` with a 1s ttl under the label "first" until the file
/// `stop` appears.
fn hold(f: &Fixture, key: &str) -> Result<Running, Box<dyn std::error::Error>> {
    let holder_script = "touch started; while [ ! -e stop ]; do sleep 0.01; done";
    let holder = f.spawn(&[
        "run",
        "--key",
        key,
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
    Ok(holder)
}

/// On a terminal (here the pseudo-terminal of util-linux `script`), `run`
/// shows that it waits, on which key, for whom, how long the holder's lease
/// has left on the server unless renewed, and how long it has waited.
#[test]
fn waiting_is_shown_on_a_terminal() -> TestResult {
    let f = Fixture::new()?;
    let mut holder = hold(&f, "queue")?;
    let waiter = format!(
        "{BIN} --url {} run --key queue --wait 1500ms -- true",
        f.server.url()
    );
    let mut script = spawn(
        Command::new("script")
            .args(["--quiet", "--return", "--command", &waiter, "/dev/null"])
            .current_dir(f.dir.path())
            .stdin(Stdio::null()),
    )?;
    let status = wait_for_exit(&mut script)?;
    let shown = read_all(script.stdout.take().ok_or("no stdout")?);
    assert_eq!(status.code(), Some(75), "{shown}");
    let (_, line) = shown
        .split_once("waiting for lease \"queue\" held by \"first\" (expires in ")
        .ok_or_else(|| format!("no waiting line: {shown:?}"))?;
    let (left, waited) = line
        .split_once(" unless renewed): ")
        .ok_or_else(|| format!("no time left shown: {shown:?}"))?;
    // The holder's PTTL: never more than its 1s ttl (the waiter's own ttl
    // is 30s).
    assert!(
        humantime::parse_duration(left)? <= Duration::from_secs(1),
        "{shown:?}"
    );
    assert!(waited.starts_with("1s of 1s 500ms"), "{shown:?}");
    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut holder)?.code(), Some(0));
    Ok(())
}

/// Off a terminal (stderr a pipe, as under cron or systemd), a waiting
/// `run` writes nothing but the final reason it gives up.
#[test]
fn waiting_is_silent_off_a_terminal() -> TestResult {
    let f = Fixture::new()?;
    let mut holder = hold(&f, "quiet")?;
    // Long enough for the progress line to be due (after a second).
    let mut waiter = f.spawn(&["run", "--key", "quiet", "--wait", "1500ms", "--", "true"])?;
    let status = wait_for_exit(&mut waiter)?;
    let stderr = stderr_of(&mut waiter);
    assert_eq!(status.code(), Some(75), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.starts_with("leasehold: ") && !stderr.contains("waiting for lease"),
        "{stderr:?}"
    );
    assert!(!stderr.contains(['\r', '\x1b']), "{stderr:?}");
    std::fs::write(f.path("stop"), "")?;
    assert_eq!(wait_for_exit(&mut holder)?.code(), Some(0));
    Ok(())
}

#[test]
fn sigint_reaches_the_command_too() -> TestResult {
    a_signal_reaches_the_command(Signal::SIGINT, "INT", 4, "interrupt")
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

/// A connection of the test's own to the server, beside leasehold's: the
/// witness of when the lease is gone.
struct Side {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Side {
    fn connect(server: &RedisServer) -> Result<Self, std::io::Error> {
        let writer = TcpStream::connect(server.addr())?;
        writer.set_read_timeout(Some(PATIENCE))?;
        Ok(Self {
            reader: BufReader::new(writer.try_clone()?),
            writer,
        })
    }

    /// Sends one command and returns its reply line (integer, status or
    /// error; bulk replies are not needed here).
    fn call(&mut self, args: &[&str]) -> Result<String, Box<dyn std::error::Error>> {
        let mut request = format!("*{}\r\n", args.len());
        for arg in args {
            request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
        }
        self.writer.write_all(request.as_bytes())?;
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        Ok(line.trim_end().to_owned())
    }

    /// The key's remaining ttl in milliseconds; -2 once it is gone.
    fn pttl(&mut self, key: &str) -> Result<i64, Box<dyn std::error::Error>> {
        let reply = self.call(&["PTTL", key])?;
        Ok(reply
            .strip_prefix(':')
            .ok_or_else(|| format!("PTTL replied {reply:?}"))?
            .parse()?)
    }
}

/// A process of the job, known by its pid and start time (so that a
/// reused pid is not taken for it).
struct Process {
    pid: i32,
    started: String,
}

impl Process {
    /// Reads the pid a job process wrote to `path`.
    fn from_file(path: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        wait_for_file(path)?;
        let deadline = Instant::now() + PATIENCE;
        // The file may be created before its content is written.
        let pid: i32 = loop {
            if let Ok(pid) = std::fs::read_to_string(path)?.trim().parse() {
                break pid;
            }
            if Instant::now() > deadline {
                return Err(format!("no pid in {}", path.display()).into());
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let (_, started) = Self::stat(pid).ok_or(format!("process {pid} is not running"))?;
        Ok(Self { pid, started })
    }

    /// The process's state letter and start time, from /proc.
    fn stat(pid: i32) -> Option<(char, String)> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name in parentheses: state is field 3 and
        // starttime field 22.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        Some((
            fields.first()?.chars().next()?,
            (*fields.get(19)?).to_owned(),
        ))
    }

    /// Running or able to run: not gone, not a zombie (a dead process whose
    /// parent, after reparenting perhaps init, has not reaped it yet).
    fn alive(&self) -> bool {
        match Self::stat(self.pid) {
            Some((state, started)) => started == self.started && !matches!(state, 'Z' | 'X'),
            None => false,
        }
    }
}

/// A test that fails leaves no process of its job behind.
impl Drop for Process {
    fn drop(&mut self) {
        if self.alive() {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }
}

/// Polls the server and the job's processes until every process is dead,
/// and checks that they died before the server could expire (or had
/// deleted) `key`. Returns how long before the earliest possible expiry
/// the last process was seen dead.
///
/// Each round checks the processes, then asks the server for the key's
/// PTTL: a reply sent at `s` with `p` ms left means the key cannot expire
/// before `s + p` (renewals only move that later). The job passes when it
/// is seen all dead before that bound, taken from the latest reply that
/// still had the key, and fails if the server ever reports the key gone
/// while a process lives. The first reply is taken at once, so the key
/// must be on the server when this is called.
fn dead_before_expiry(
    side: &mut Side,
    key: &str,
    job: &[&Process],
    within: Duration,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let mut witness = Witness::start(side, key)?;
    witness.until_dead(job, within)
}

/// The server's bound on when a key can expire, kept up to date.
struct Witness<'a> {
    side: &'a mut Side,
    key: &'a str,
    /// The key cannot expire before this.
    bound: Instant,
}

impl<'a> Witness<'a> {
    fn start(side: &'a mut Side, key: &'a str) -> Result<Self, Box<dyn std::error::Error>> {
        let sent = Instant::now();
        let pttl = side.pttl(key)?;
        let left =
            u64::try_from(pttl).map_err(|_| format!("{key} is not on the server (PTTL {pttl})"))?;
        Ok(Self {
            side,
            key,
            bound: sent + Duration::from_millis(left),
        })
    }

    fn until_dead(
        &mut self,
        job: &[&Process],
        within: Duration,
    ) -> Result<Duration, Box<dyn std::error::Error>> {
        let key = self.key;
        let deadline = Instant::now() + within;
        loop {
            let checked = Instant::now();
            let living: Vec<i32> = job.iter().filter(|p| p.alive()).map(|p| p.pid).collect();
            let sent = Instant::now();
            let pttl = self.side.pttl(key)?;
            if let Ok(left) = u64::try_from(pttl) {
                self.bound = sent + Duration::from_millis(left);
            }
            if living.is_empty() {
                return self.bound.checked_duration_since(checked).ok_or_else(|| {
                    format!("the job was dead only after {key} could expire").into()
                });
            }
            if pttl == -2 {
                return Err(
                    format!("{key} is gone from the server while {living:?} still run").into(),
                );
            }
            if Instant::now() > deadline {
                return Err(format!("{living:?} still run after {within:?}").into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A job that ignores SIGTERM, as do the sleep it starts in the background
/// (it inherits the ignored signal) and the sleeps of its loop: only
/// SIGKILL, sent to the whole group, ends all of it. Writes its own pid to
/// `child` and the background sleep's to `grandchild`, then `started`.
const STUBBORN_JOB: &str = "trap '' TERM; sleep 300 & echo $! > grandchild; echo $$ > child; touch started; while :; do sleep 0.05; done";

fn job_of(f: &Fixture) -> Result<(Process, Process), Box<dyn std::error::Error>> {
    wait_for_file(&f.path("started"))?;
    Ok((
        Process::from_file(&f.path("child"))?,
        Process::from_file(&f.path("grandchild"))?,
    ))
}

/// The reported case: the default 10 s grace with a 3 s lease and one
/// renewal. The grace is cut to fit, and the job, children included, is
/// dead before the lease can expire on the server.
#[test]
fn at_the_renewal_cap_the_job_is_dead_before_the_lease_can_expire() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let mut run = f.spawn(&[
        "run",
        "--key",
        "capped",
        "--ttl",
        "3s",
        "--max-renewals",
        "1",
        "--",
        "sh",
        "-c",
        STUBBORN_JOB,
    ])?;
    let (child, grandchild) = job_of(&f)?;
    // Acquired, renewed once after a third of the ttl, then the cap.
    let early = dead_before_expiry(
        &mut side,
        "leasehold:{capped}",
        &[&child, &grandchild],
        PATIENCE,
    )?;
    println!(
        "| renewal cap (ttl 3s, --grace 10s cut to fit) | the job and its child dead before the server expired the lease by | {early:.1?} |"
    );
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("--grace 10s is cut to"), "{stderr}");
    Ok(())
}

/// Renewals that hang (Redis cut off by a blackholing proxy) end the lease
/// at its deadline; the job is dead before the server expires the lease.
#[test]
fn at_the_deadline_the_job_is_dead_before_the_lease_can_expire() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let f = Fixture::new()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let proxy = runtime.block_on(Proxy::start(f.server.addr()))?;
    let mut side = Side::connect(&f.server)?;
    let mut run = spawn(&mut f.cmd_at(
        &proxy.url(),
        &[
            "run",
            "--key",
            "cut-off",
            "--ttl",
            "3s",
            "--grace",
            "1s",
            "--",
            "sh",
            "-c",
            STUBBORN_JOB,
        ],
    ))?;
    let (child, grandchild) = job_of(&f)?;
    proxy.set_mode(ProxyMode::Blackhole);
    let early = dead_before_expiry(
        &mut side,
        "leasehold:{cut-off}",
        &[&child, &grandchild],
        PATIENCE,
    )?;
    println!(
        "| deadline (Redis blackholed) | the job and its child dead before the server expired the lease by | {early:.1?} |"
    );
    // Let the release fail fast instead of hanging on the partition.
    proxy.set_mode(ProxyMode::Reset);
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("renewals"), "{stderr}");
    Ok(())
}

/// A lease taken over on the server may already be someone else's: the
/// job is killed at once, whatever the grace. There is no expiry to race
/// here, so the bound is on the delay: once the lease was renewed (from
/// then on the server reports changes to it), leasehold hears of the
/// takeover within a round trip and sends SIGKILL at once. The bound is
/// that round trip plus the scheduling of leasehold's watchdog and of this
/// test on a loaded 2-core machine (50 ms, the allowance the campaigns
/// use), plus this test's 1 ms poll of the job: 51 ms, against about 1 ms
/// measured, and far below both the 5 s grace a SIGTERM would start and
/// the 2.3 s until the next regular renewal (the only other way to learn
/// of the takeover).
#[test]
fn a_lost_lease_kills_the_whole_job_at_once() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let key = "leasehold:{taken}";
    let mut run = f.spawn(&[
        "run",
        "--key",
        "taken",
        "--ttl",
        "10s",
        "--grace",
        "5s",
        "--",
        "sh",
        "-c",
        STUBBORN_JOB,
    ])?;
    let (child, grandchild) = job_of(&f)?;
    // The first renewal, seen on the server as a ttl that went up.
    let deadline = Instant::now() + PATIENCE;
    let mut last = side.pttl(key)?;
    loop {
        let pttl = side.pttl(key)?;
        if pttl > last {
            break;
        }
        last = pttl;
        assert!(Instant::now() < deadline, "the lease was never renewed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let taken = Instant::now();
    assert_eq!(
        side.call(&["SET", key, "another-holder", "PX", "30000"])?,
        "+OK"
    );
    let deadline = taken + PATIENCE;
    while child.alive() || grandchild.alive() {
        assert!(Instant::now() < deadline, "the job outlived its lost lease");
        std::thread::sleep(Duration::from_millis(1));
    }
    let delay = taken.elapsed();
    println!(
        "| lost (lease overwritten) | the job and its child dead after the overwrite by | {delay:.1?} |"
    );
    let bound = Duration::from_millis(51);
    assert!(
        delay < Duration::from_secs(1) && delay <= bound,
        "the job died {delay:?} after its lease was taken over: not at once (within {bound:?}), as client tracking reports the change"
    );
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("SIGKILL) at once"), "{stderr}");
    Ok(())
}

/// SIGTERM sent to leasehold reaches the processes the command started,
/// and the lease is released only once they are dead.
#[test]
fn sigterm_to_leasehold_reaches_the_whole_job() -> TestResult {
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let script = "sleep 300 & echo $! > grandchild; echo $$ > child; touch started; wait";
    let mut run = f.spawn(&["run", "--key", "term-all", "--", "sh", "-c", script])?;
    let (child, grandchild) = job_of(&f)?;
    // Taken before the signal: the job dies at once, and the lease is
    // released right after.
    let mut witness = Witness::start(&mut side, "leasehold:{term-all}")?;
    kill(Pid::from_raw(i32::try_from(run.id())?), Signal::SIGTERM)?;
    witness.until_dead(&[&child, &grandchild], PATIENCE)?;
    let status = wait_for_exit(&mut run)?;
    // The shell was ended by the forwarded SIGTERM.
    assert_eq!(status.code(), Some(128 + 15), "{}", stderr_of(&mut run));
    assert_eq!(side.pttl("leasehold:{term-all}")?, -2);
    Ok(())
}

/// Processes the command leaves behind are stopped before the lease is
/// released, and the command's own exit code is kept.
#[test]
fn processes_left_behind_are_stopped_before_the_release() -> TestResult {
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    // The sleep ignores SIGTERM too: it lives until SIGKILL, after the
    // grace. The command exits once the test watches the key.
    let script = "trap '' TERM; sleep 300 & echo $! > grandchild; while [ ! -e go ]; do sleep 0.01; done; exit 3";
    let mut run = f.spawn(&[
        "run", "--key", "leftover", "--grace", "1s", "--", "sh", "-c", script,
    ])?;
    let grandchild = Process::from_file(&f.path("grandchild"))?;
    let mut witness = Witness::start(&mut side, "leasehold:{leftover}")?;
    std::fs::write(f.path("go"), "")?;
    witness.until_dead(&[&grandchild], PATIENCE)?;
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("still running") && stderr.contains("killing it"),
        "{stderr}"
    );
    assert_eq!(side.pttl("leasehold:{leftover}")?, -2);
    Ok(())
}

/// A leasehold whose stderr reader went away (a closed pipe) still stops
/// its job in time: its messages fail, and it goes on.
#[test]
fn a_closed_stderr_does_not_keep_leasehold_from_stopping_the_job() -> TestResult {
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let mut run = f.spawn(&[
        "run",
        "--key",
        "deaf",
        "--ttl",
        "3s",
        "--max-renewals",
        "1",
        "--grace",
        "500ms",
        "--",
        "sh",
        "-c",
        STUBBORN_JOB,
    ])?;
    drop(run.stderr.take());
    let (child, grandchild) = job_of(&f)?;
    dead_before_expiry(
        &mut side,
        "leasehold:{deaf}",
        &[&child, &grandchild],
        PATIENCE,
    )?;
    assert_eq!(wait_for_exit(&mut run)?.code(), Some(76));
    Ok(())
}

/// On a terminal (the pseudo-terminal of util-linux `script`), the job is
/// the terminal's foreground group while it runs: it can read the
/// terminal, where a background group would be stopped (SIGTTIN), and
/// leasehold takes the terminal back when it is done.
#[test]
fn the_job_may_read_the_terminal() -> TestResult {
    let f = Fixture::new()?;
    let line = format!(
        "{BIN} --url {} run --key tty -- sh -c 'read l; echo got:$l'; echo after:$?; read m; echo then:$m",
        f.server.url()
    );
    let mut script = spawn(
        Command::new("script")
            .args(["--quiet", "--return", "--command", &line, "/dev/null"])
            .current_dir(f.dir.path())
            .stdin(Stdio::piped()),
    )?;
    script
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(b"hello\nworld\n")?;
    let status = wait_for_exit(&mut script)?;
    let shown = read_all(script.stdout.take().ok_or("no stdout")?);
    assert_eq!(status.code(), Some(0), "{shown}");
    assert!(shown.contains("got:hello"), "{shown}");
    assert!(shown.contains("after:0"), "{shown}");
    // The shell that ran leasehold reads the terminal again.
    assert!(shown.contains("then:world"), "{shown}");
    Ok(())
}

/// SIGHUP (the terminal closed) is passed to the job rather than ending
/// leasehold, which would leave the job running under a lease no one
/// renews.
#[test]
fn sighup_reaches_the_command_and_leasehold_stays() -> TestResult {
    a_signal_reaches_the_command(Signal::SIGHUP, "HUP", 5, "hangup")
}

/// Killed with SIGKILL, leasehold cannot release, and its job lives on:
/// with `--lock-delay` the server keeps the key for the ttl plus the delay
/// from the last renewal, so another run is refused past the ttl and gets
/// the key only after the delay.
#[test]
fn a_killed_run_leaves_the_key_taken_for_its_lock_delay() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let (ttl, delay) = (Duration::from_secs(1), Duration::from_secs(2));
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let key = "leasehold:{delayed}";
    let job = "echo $$ > pid; touch started; while true; do sleep 0.01; done";
    let mut holder = f.spawn(&[
        "run",
        "--key",
        "delayed",
        "--ttl",
        "1s",
        "--lock-delay",
        "2s",
        "--",
        "sh",
        "-c",
        job,
    ])?;
    wait_for_file(&f.path("started"))?;
    // The job outlives leasehold: kill it however the test ends.
    let _job = KillJob(Process::from_file(&f.path("pid"))?);
    // The grant and every renewal give the key ttl + delay, renewals come
    // at most a renew interval (ttl / 3) apart, and the read lags by at
    // most the scheduling allowance (50 ms) plus PTTL's millisecond.
    let renew = ttl / 3;
    let pttl = side.pttl(key)?;
    let least = ttl + delay - renew - Duration::from_millis(51);
    assert!(
        pttl > 2_000 && u128::try_from(pttl).unwrap_or(0) >= least.as_millis(),
        "the server keeps the key for only {pttl} ms, less than ttl + delay - renew interval - 51 ms ({least:?})"
    );

    let pid = i32::try_from(holder.id())?;
    kill(Pid::from_raw(pid), Signal::SIGKILL)?;
    let killed = Instant::now();
    wait_for_exit(&mut holder)?;

    // Past the ttl since the kill (the last renewal came before it).
    std::thread::sleep((ttl + Duration::from_millis(200)).saturating_sub(killed.elapsed()));
    let out = f.output(&["run", "--key", "delayed", "--", "touch", "ran"])?;
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(!f.path("ran").exists(), "the command ran without the lease");

    let deadline = Instant::now() + PATIENCE;
    while side.pttl(key)? != -2 {
        if Instant::now() > deadline {
            return Err("the key never expired".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let gone = killed.elapsed();
    // The last renewal was sent at most a renew interval before the kill
    // and the key lasts ttl + delay from it; the poll (every 5 ms) sees the
    // end at most 5 ms plus the scheduling allowance (50 ms) late.
    let (least, most) = (ttl + delay - renew, ttl + delay + Duration::from_millis(55));
    assert!(
        gone > ttl + delay / 2 && gone >= least && gone <= most,
        "the key was gone {gone:?} after the kill, outside [{least:?}, {most:?}]: ttl + delay from the last renewal"
    );
    let out = f.output(&["run", "--key", "delayed", "--", "touch", "ran"])?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(f.path("ran").exists());
    Ok(())
}

/// Kills a job process that outlived leasehold, when dropped.
struct KillJob(Process);

impl Drop for KillJob {
    fn drop(&mut self) {
        if self.0.alive() {
            let _ = kill(Pid::from_raw(self.0.pid), Signal::SIGKILL);
        }
    }
}

/// A job that ignores SIGTERM (as `STUBBORN_JOB`), touches `progress` five
/// times, 200 ms apart, then writes `quiet` and touches nothing more.
const STALLING_JOB: &str = "trap '' TERM; sleep 300 & echo $! > grandchild; echo $$ > child; touch started; for i in 1 2 3 4 5; do touch progress; sleep 0.2; done; touch quiet; while :; do sleep 0.05; done";

/// A job that stops touching its progress file loses its lease as stalled
/// once the window has passed without a touch; it and its child are dead
/// before the server could expire the lease, and the lease is released.
#[test]
fn a_job_that_stops_touching_its_progress_file_is_dead_before_the_lease_can_expire() -> TestResult {
    // Timing-bound: one such test of this binary at a time.
    let _serial = leasehold_testkit::serial_blocking();
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let key = "leasehold:{stalls}";
    let window = Duration::from_secs(1);
    let mut run = f.spawn(&[
        "run",
        "--key",
        "stalls",
        "--ttl",
        "3s",
        "--progress-file",
        "progress",
        "--progress-window",
        "1s",
        "--",
        "sh",
        "-c",
        STALLING_JOB,
    ])?;
    let (child, grandchild) = job_of(&f)?;
    let mut witness = Witness::start(&mut side, key)?;
    wait_for_file(&f.path("quiet"))?;
    let quiet = Instant::now();
    assert!(child.alive(), "stopped while it still touched its file");
    let early = witness.until_dead(&[&child, &grandchild], PATIENCE)?;
    let stalled_for = quiet.elapsed();
    println!(
        "| stalled (ttl 3s, window 1s) | the job and its child dead {stalled_for:.1?} after the last touch, before the server could expire the lease by | {early:.1?} |"
    );
    assert!(
        stalled_for > window,
        "stopped {stalled_for:?} after the last touch"
    );
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("the job reported no progress within its window"),
        "{stderr}"
    );
    assert_eq!(side.pttl(key)?, -2, "the lease was not released");
    Ok(())
}

/// A job that keeps touching its progress file runs to completion, over
/// many progress windows, and its exit code passes through.
#[test]
fn a_job_that_keeps_touching_its_progress_file_runs_to_completion() -> TestResult {
    let f = Fixture::new()?;
    let out = f.output(&[
        "run",
        "--key",
        "busy",
        "--ttl",
        "3s",
        "--progress-file",
        "progress",
        "--progress-window",
        "1s",
        "--",
        "sh",
        "-c",
        "for i in $(seq 1 20); do touch progress; sleep 0.2; done; exit 7",
    ])?;
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    Ok(())
}

/// At its maximum hold the job is stopped, dead before the lease can
/// expire on the server, and leasehold says why.
#[test]
fn at_its_maximum_hold_the_job_is_dead_before_the_lease_can_expire() -> TestResult {
    let f = Fixture::new()?;
    let mut side = Side::connect(&f.server)?;
    let mut run = f.spawn(&[
        "run",
        "--key",
        "bounded",
        "--ttl",
        "3s",
        "--at-most",
        "4s",
        "--",
        "sh",
        "-c",
        STUBBORN_JOB,
    ])?;
    let (child, grandchild) = job_of(&f)?;
    let started = Instant::now();
    let early = dead_before_expiry(
        &mut side,
        "leasehold:{bounded}",
        &[&child, &grandchild],
        PATIENCE,
    )?;
    let held = started.elapsed();
    println!(
        "| maximum hold (ttl 3s, --at-most 4s) | the job and its child dead {held:.1?} after it started, before the server could expire the lease by | {early:.1?} |"
    );
    assert!(held < Duration::from_secs(4), "{held:?}");
    let status = wait_for_exit(&mut run)?;
    let stderr = stderr_of(&mut run);
    assert_eq!(status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("it reached its maximum hold"), "{stderr}");
    Ok(())
}
