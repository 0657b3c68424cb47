//! Running a command with a deadline: `Command::output` waits for ever, and
//! a test that hangs on a child process never says why.

use std::io::{self, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `Command::output`, failing with [`io::ErrorKind::TimedOut`] (and killing
/// the child) if the command has not finished within `limit`. Its stdout
/// and stderr are read on threads of their own, which report when the
/// child closes them; then its exit is awaited until the same deadline.
/// Standard input is left as `cmd` sets it (inherited by default).
///
/// # Errors
///
/// The spawn's error, or `TimedOut` naming the command and the limit.
///
/// # Example
///
/// ```
/// use std::process::Command;
/// use std::time::Duration;
///
/// let out = leasehold_testkit::output_within(Command::new("true").arg("x"), Duration::from_secs(5))?;
/// assert!(out.status.success());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn output_within(cmd: &mut Command, limit: Duration) -> io::Result<Output> {
    let deadline = Instant::now() + limit;
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (tx, rx) = mpsc::channel();
    let pipes: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    for (i, pipe) in pipes.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            let _ = tx.send((i, buf));
        });
    }
    let timed_out = |child: &mut Child| {
        let _ = child.kill();
        let _ = child.wait();
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{cmd:?} did not finish within {limit:?}"),
        )
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok((0, buf)) => stdout = buf,
            Ok((_, buf)) => stderr = buf,
            Err(_) => return Err(timed_out(&mut child)),
        }
    }
    // Both pipes closed: the child is exiting (or closed them and runs on,
    // which the deadline catches). No signal is left to wait for but the
    // exit itself, which std can only poll for without blocking.
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Output {
                status,
                stdout,
                stderr,
            });
        }
        if Instant::now() >= deadline {
            return Err(timed_out(&mut child));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `JoinHandle::join`, failing with [`io::ErrorKind::TimedOut`] if the
/// thread has not finished within `limit` (it is then left running: a
/// thread cannot be killed), and with [`io::ErrorKind::Other`] if it
/// panicked. A test that waits for a thread says why it stopped waiting.
///
/// # Errors
///
/// `TimedOut` naming the limit, or `Other` for a panic.
///
/// # Example
///
/// ```
/// use std::time::Duration;
///
/// let handle = std::thread::spawn(|| 6 * 7);
/// assert_eq!(leasehold_testkit::join_within(handle, Duration::from_secs(5))?, 42);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn join_within<T>(handle: std::thread::JoinHandle<T>, limit: Duration) -> io::Result<T> {
    let deadline = Instant::now() + limit;
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("a thread did not finish within {limit:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    handle
        .join()
        .map_err(|_| io::Error::other("the thread panicked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_limit_is_killed_and_named() {
        let mut sleeper = Command::new("sleep");
        sleeper.arg("30");
        let error = output_within(&mut sleeper, Duration::from_millis(200))
            .expect_err("a 30 s sleep within 200 ms");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("sleep"), "{error}");
    }

    #[test]
    fn a_command_within_its_limit_gives_its_output() -> io::Result<()> {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
            Duration::from_secs(30),
        )?;
        assert!(out.status.success());
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        Ok(())
    }
}
