//! Running a command with a deadline: `Command::output` waits for ever.

use std::io::{self, Read};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// `Command::output`, failing (and killing the child) if the command has
/// not finished within `limit`. Its stdout and stderr are read on threads
/// of their own, which report when the child closes them; then its exit is
/// awaited until the same deadline.
pub(crate) fn output_within(cmd: &mut Command, limit: Duration) -> io::Result<Output> {
    let deadline = Instant::now() + limit;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
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
    let timed_out = |child: &mut std::process::Child| {
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
