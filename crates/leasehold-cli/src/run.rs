//! `leasehold run`: a command under a lease.

use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey};
use leasehold_redis::RedisBackend;
use leasehold_watchdog::{Lease, LeaseConfig, LeaseError, LeaseManager, LeaseOptions, LossReason};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::exit::{self, Failure};

/// The signals `run` passes on to the command.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, Failure> {
        let install = |kind| {
            signal(kind).map_err(|e| Failure::internal(format!("could not handle signals: {e}")))
        };
        Ok(Self {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM.
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
        }
    }
}

pub(crate) async fn run(
    url: &Option<String>,
    namespace: Option<&str>,
    args: RunArgs,
) -> Result<u8, Failure> {
    // Installed first: a signal while waiting must not kill leasehold before
    // it can give up its place cleanly.
    let mut signals = Signals::install()?;
    let options = options(&args)?;
    let backend = exit::connect(url, namespace).await?;
    let manager =
        LeaseManager::new(backend.clone()).map_err(|e| Failure::internal(e.to_string()))?;
    let acquired = tokio::select! {
        acquired = acquire(&manager, &backend, &args.key, &options) => acquired,
        signal = signals.next() => {
            if std::io::stderr().is_terminal() {
                // Clears the waiting line, if one was shown.
                eprint!("\r\x1b[K");
            }
            manager.shutdown().await;
            return Ok(128 + signal as u8);
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(error) => {
            manager.shutdown().await;
            let code = match &error {
                LeaseError::NotAcquired { .. } => exit::NOT_ACQUIRED,
                LeaseError::Backend(_) => exit::UNAVAILABLE,
                LeaseError::Invalid(_) | LeaseError::InvalidOptions { .. } => exit::CONFIG,
                _ => exit::SOFTWARE,
            };
            return Err(Failure::new(code, exit::chain(&error)));
        }
    };
    let code = supervise(&args, &lease, &mut signals).await;
    let key = lease.key().clone();
    if let Err(error) = lease.release().await {
        eprintln!(
            "leasehold: could not release lease {:?} ({}); it expires by itself",
            key.as_str(),
            exit::chain(&error)
        );
    }
    manager.shutdown().await;
    code
}

/// The lease options: LEASEHOLD_* variables, overridden by the flags.
fn options(args: &RunArgs) -> Result<LeaseOptions, Failure> {
    let mut config = LeaseConfig::from_env("LEASEHOLD_")
        .map_err(|e| Failure::new(exit::CONFIG, e.to_string()))?;
    if let Some(ttl) = args.ttl {
        config.ttl = ttl;
    }
    if args.wait.is_some() {
        config.wait = args.wait;
    }
    if args.max_renewals.is_some() {
        config.max_renewals = args.max_renewals;
    }
    if let Some(name) = &args.name {
        config.name.clone_from(name);
    }
    if args.label.is_some() {
        config.label.clone_from(&args.label);
    }
    if config.label.is_none() {
        // Shown by `status`: where the holder runs is what an operator asks first.
        config.label = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok());
    }
    config
        .lease_options()
        .map_err(|e| Failure::new(exit::CONFIG, e.to_string()))
}

/// Acquires the lease, showing on a terminal that it is waiting.
async fn acquire(
    manager: &LeaseManager<RedisBackend>,
    backend: &RedisBackend,
    key: &LeaseKey,
    options: &LeaseOptions,
) -> Result<Lease, LeaseError> {
    let acquire = manager.acquire(key.as_str(), options);
    let Some(wait) = options.wait().filter(|_| std::io::stderr().is_terminal()) else {
        return acquire.await;
    };
    tokio::pin!(acquire);
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    // The first tick is at once; a lease that is free is taken before it shows.
    tick.tick().await;
    let mut shown = false;
    let result = loop {
        tokio::select! {
            result = &mut acquire => break result,
            _ = tick.tick() => {
                let holder = match backend.inspect(key).await {
                    Ok(Some(info)) => match info.label {
                        Some(label) => format!(" held by {label:?}"),
                        None => " held by another holder".to_owned(),
                    },
                    _ => String::new(),
                };
                eprint!(
                    "\r\x1b[Kleasehold: waiting for lease {:?}{holder}: {} of {}",
                    key.as_str(),
                    humantime::format_duration(Duration::from_secs(started.elapsed().as_secs())),
                    humantime::format_duration(wait),
                );
                shown = true;
            }
        }
    };
    if shown {
        eprint!("\r\x1b[K");
    }
    result
}

/// Runs the command while the lease is held; returns leasehold's exit code.
async fn supervise(args: &RunArgs, lease: &Lease, signals: &mut Signals) -> Result<u8, Failure> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(Failure::new(exit::USAGE, "no command to run"));
    };
    let mut child = Command::new(program)
        .args(rest)
        .env("LEASEHOLD_KEY", lease.key().as_str())
        .env("LEASEHOLD_FENCING_TOKEN", lease.fencing_token().to_string())
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            Failure::new(
                code,
                format!("could not run {:?}: {e}", program.to_string_lossy()),
            )
        })?;
    loop {
        tokio::select! {
            status = child.wait() => return status_code(status),
            reason = lease.lost() => return stop(&mut child, lease, reason, args.grace).await,
            signal = signals.next() => send(&child, signal),
        }
    }
}

/// Stops the command after the lease was lost: SIGTERM, then SIGKILL after
/// the grace period.
async fn stop(
    child: &mut Child,
    lease: &Lease,
    reason: LossReason,
    grace: Duration,
) -> Result<u8, Failure> {
    eprintln!(
        "leasehold: lease {:?} ended: {reason}; stopping the command (SIGTERM, SIGKILL after {})",
        lease.key().as_str(),
        humantime::format_duration(grace),
    );
    send(child, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "leasehold: the command did not exit within {}; killing it",
            humantime::format_duration(grace)
        );
        child
            .kill()
            .await
            .map_err(|e| Failure::internal(format!("could not kill the command: {e}")))?;
    }
    Ok(exit::LOST)
}

fn send(child: &Child, signal: Signal) {
    // No id: the command has exited and been reaped, so there is no one to tell.
    if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

fn status_code(status: std::io::Result<ExitStatus>) -> Result<u8, Failure> {
    let status =
        status.map_err(|e| Failure::internal(format!("could not wait for the command: {e}")))?;
    if let Some(code) = status.code() {
        // Exit codes are 0..=255 on Unix.
        return Ok(u8::try_from(code).unwrap_or(u8::MAX));
    }
    // Ended by a signal: report it the way shells do.
    let signal = status.signal().unwrap_or(0);
    Ok(u8::try_from(128 + signal).unwrap_or(u8::MAX))
}
