//! `leasehold run`: a command under a lease.

use std::io::IsTerminal;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{BackendError, LeaseBackend, LeaseInfo, PermitLimit};
use leasehold_redis::RedisBackend;
use leasehold_watchdog::{
    Backoff, Fair, Lease, LeaseConfig, LeaseError, LeaseManager, LeaseOptions, LossReason,
};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::args::RunArgs;
use crate::exit::{self, Failure, note};
use crate::job::Job;
use crate::progress::ProgressFile;
use crate::stopping::{Fit, KILL_ALLOWANCE, whole_ms};

/// The signals `run` passes on to the command. Each would otherwise end
/// leasehold and leave the job running with no one to renew its lease or
/// stop it in time: SIGHUP comes when the terminal closes, to leasehold's
/// group while the job's has the terminal.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self, Failure> {
        let install = |kind| {
            signal(kind).map_err(|e| Failure::internal(format!("could not handle signals: {e}")))
        };
        Ok(Self {
            interrupt: install(SignalKind::interrupt())?,
            terminate: install(SignalKind::terminate())?,
            hangup: install(SignalKind::hangup())?,
        })
    }

    /// The next SIGINT, SIGTERM or SIGHUP.
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
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
    let (options, fit) = options(&args)?;
    let backend = exit::connect(url, namespace).await?;
    let manager =
        LeaseManager::new(backend.clone()).map_err(|e| Failure::internal(e.to_string()))?;
    let acquired = tokio::select! {
        acquired = acquire(&manager, &backend, &args, &options) => acquired,
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
                // Another --permits than the semaphore's holders use.
                LeaseError::Backend(BackendError::PermitLimitMismatch { .. }) => exit::CONFIG,
                LeaseError::Backend(_) => exit::UNAVAILABLE,
                LeaseError::Invalid(_)
                | LeaseError::InvalidOptions { .. }
                | LeaseError::NotApplicable { .. } => exit::CONFIG,
                _ => exit::SOFTWARE,
            };
            return Err(Failure::new(code, exit::chain(&error)));
        }
    };
    let code = supervise(&args, &fit, &lease, &mut signals).await;
    let key = lease.server_key();
    if let Err(error) = lease.release().await {
        note!(
            "leasehold: could not release lease {:?} ({}); it expires by itself",
            key.as_str(),
            exit::chain(&error)
        );
    }
    manager.shutdown().await;
    code
}

/// The lease options: LEASEHOLD_* variables, overridden by the flags, with
/// a safety margin that leaves room to stop the command (see
/// [`crate::stopping`]).
fn options(args: &RunArgs) -> Result<(LeaseOptions, Fit), Failure> {
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
    if let Some(delay) = args.lock_delay {
        config.lock_delay = delay;
    }
    if config.label.is_none() {
        // Shown by `status`: where the holder runs is what an operator asks first.
        config.label = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok());
    }
    let fit = Fit::new(config.ttl, config.safety_margin, args.grace)
        .map_err(|reason| Failure::new(exit::CONFIG, reason))?;
    if let Some(message) = fit.cut_message(config.ttl) {
        note!("leasehold: {message}");
    }
    let mut builder = LeaseOptions::builder()
        .ttl(config.ttl)
        .safety_margin(fit.safety_margin)
        .renew_interval(fit.renew_interval)
        .backoff(Backoff::new(config.backoff_initial, config.backoff_max))
        .name(config.name)
        .lock_delay(config.lock_delay)
        .fair(args.fair.then(Fair::default));
    if let Some(max) = config.max_renewals {
        builder = builder.max_renewals(max);
    }
    if let Some(wait) = config.wait {
        builder = builder.wait(wait);
    }
    if let Some(minimum) = args.at_least {
        builder = builder.hold_at_least(minimum);
    }
    if let Some(label) = config.label {
        builder = builder.label(label);
    }
    if let Some(max) = args.at_most {
        builder = builder.hold_at_most(max);
    }
    if let Some(window) = args.progress_window {
        builder = builder.progress_window(window);
    }
    let options = builder
        .build()
        .map_err(|e| Failure::new(exit::CONFIG, exit::chain(&e)))?;
    Ok((options, fit))
}

/// Acquires the lease, showing on a terminal that it is waiting.
async fn acquire(
    manager: &LeaseManager<RedisBackend>,
    backend: &RedisBackend,
    args: &RunArgs,
    options: &LeaseOptions,
) -> Result<Lease, LeaseError> {
    let key = &args.key;
    let acquire = async {
        match args.permits {
            Some(n) => {
                let limit = PermitLimit::new(n)?;
                manager.acquire_permit(key.as_str(), limit, options).await
            }
            None if args.shared => manager.acquire_read(key.as_str(), options).await,
            None if args.writer => manager.acquire_write(key.as_str(), options).await,
            None => manager.acquire(key.as_str(), options).await,
        }
    };
    // What the waiting line names: a read-write lease's writer, if any.
    let shown_key = match (args.shared || args.writer).then(|| key.writer_key()) {
        Some(Ok(writer)) => writer,
        _ => key.clone(),
    };
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
                let holder = match backend.inspect(&shown_key).await {
                    Ok(Some(info)) => holder_text(&info),
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

/// Who holds the lease the command waits for, and for how much longer
/// unless it is renewed (the server's PTTL, to a tenth of a second).
fn holder_text(info: &LeaseInfo) -> String {
    let who = info
        .label
        .as_deref()
        .map_or_else(|| "another holder".to_owned(), |label| format!("{label:?}"));
    match info.ttl_left {
        Some(left) => {
            let tenths = Duration::from_millis(
                u64::try_from(left.as_millis() / 100 * 100).unwrap_or(u64::MAX),
            );
            format!(
                " held by {who} (expires in {} unless renewed)",
                humantime::format_duration(tenths)
            )
        }
        None => format!(" held by {who} (no expiry)"),
    }
}

/// Runs the command while the lease is held; returns leasehold's exit code.
async fn supervise(
    args: &RunArgs,
    fit: &Fit,
    lease: &Lease,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(Failure::new(exit::USAGE, "no command to run"));
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LEASEHOLD_KEY", lease.server_key().as_str())
        .env("LEASEHOLD_FENCING_TOKEN", lease.fencing_token().to_string());
    // Watched from before the job starts, so that its first touch counts.
    let _progress = args
        .progress_file
        .clone()
        .zip(args.progress_window)
        .map(|(path, window)| ProgressFile::watch(path, window, lease.progress()));
    let mut job = Job::spawn(&mut command).map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::CANNOT_EXECUTE,
        };
        Failure::new(
            code,
            format!("could not run {:?}: {e}", program.to_string_lossy()),
        )
    })?;
    let mut stop = Stop::default();
    let mut ended = None;
    // While the job is being stopped, the group is also checked on a timer:
    // a process of the job whose parent is not leasehold dies without a
    // SIGCHLD to leasehold.
    let mut recheck = tokio::time::interval(RECHECK);
    // Ticks missed while no stop was under way are not made up in a burst.
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !job.is_gone() {
        if job.exit_code().is_some() && !stop.is_stopping() {
            stop.leftovers(&job, lease, fit.grace);
        }
        tokio::select! {
            biased;
            reason = lease.lost(), if ended.is_none() => {
                ended = Some(reason);
                stop.lease_ended(&job, lease, reason, fit, args.lost_grace);
            }
            () = sleep_until(stop.kill_at), if stop.kill_at.is_some() => stop.grace_over(&job),
            () = sleep_until(stop.dead_by), if stop.dead_by.is_some() => stop.still_alive(),
            () = job.changed() => {}
            _ = recheck.tick(), if stop.is_stopping() => {}
            signal = signals.next() => job.signal(signal),
        }
    }
    match (ended, job.exit_code()) {
        // The lease ended while the job ran: it was stopped.
        (Some(_), _) => Ok(exit::LOST),
        (None, Some(code)) => Ok(code),
        (None, None) => Err(Failure::internal("the command's exit status was lost")),
    }
}

/// How often a job being stopped is checked for processes left.
const RECHECK: Duration = Duration::from_millis(20);

/// Sleeps until `at`; forever when there is nothing to wait for (the
/// `select!` branch is disabled then anyway).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Where stopping the job stands.
#[derive(Default)]
struct Stop {
    /// When SIGKILL is due.
    kill_at: Option<Instant>,
    /// When the job should be seen dead after SIGKILL.
    dead_by: Option<Instant>,
    /// The processes the command left behind were told to stop.
    leftovers_told: bool,
    /// SIGKILL was sent.
    killed: bool,
}

impl Stop {
    fn is_stopping(&self) -> bool {
        self.kill_at.is_some() || self.killed || self.leftovers_told
    }

    /// SIGTERM now and SIGKILL after `grace`, unless SIGKILL is due sooner.
    fn terminate(&mut self, job: &Job, grace: Duration) {
        if self.killed {
            return;
        }
        if grace.is_zero() {
            self.kill(job);
            return;
        }
        job.signal(Signal::SIGTERM);
        let at = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
    }

    fn kill(&mut self, job: &Job) {
        job.signal(Signal::SIGKILL);
        self.kill_at = None;
        if !self.killed {
            self.killed = true;
            self.dead_by = Some(Instant::now() + KILL_ALLOWANCE);
        }
    }

    fn grace_over(&mut self, job: &Job) {
        note!("leasehold: the command did not exit within the grace; killing it (SIGKILL)");
        self.kill(job);
    }

    fn still_alive(&mut self) {
        self.dead_by = None;
        note!(
            "leasehold: the command is still alive {} after SIGKILL (a process in \
             uninterruptible sleep, such as on a hung disk or network file system?); \
             waiting for it",
            humantime::format_duration(KILL_ALLOWANCE),
        );
    }

    /// The command exited but processes it started are still in its group:
    /// they are stopped too before the lease is released.
    fn leftovers(&mut self, job: &Job, lease: &Lease, grace: Duration) {
        self.leftovers_told = true;
        note!(
            "leasehold: the command exited but processes it started are still running; \
             stopping them before releasing lease {:?} (SIGTERM, SIGKILL after {})",
            lease.server_key().as_str(),
            humantime::format_duration(grace),
        );
        self.terminate(job, grace);
    }

    /// The lease ended while the job runs.
    ///
    /// At the renewal cap, the maximum hold, a stall or the deadline the
    /// lease is still ours for the safety margin (after a stall or at the
    /// maximum the watchdog releases it then), which makes room for the
    /// grace and the kill; the grace is also bounded by what is left of the
    /// certain validity, in case leasehold heard of the end late. A lost lease may already be someone
    /// else's: the job is killed at once unless `--lost-grace` says otherwise.
    fn lease_ended(
        &mut self,
        job: &Job,
        lease: &Lease,
        reason: LossReason,
        fit: &Fit,
        lost_grace: Duration,
    ) {
        let key = lease.server_key();
        let key = key.as_str();
        let grace = match reason {
            LossReason::RenewalLimit
            | LossReason::Deadline
            | LossReason::MaxHold
            | LossReason::Stalled => {
                let left = lease
                    .valid_until()
                    .saturating_duration_since(Instant::now())
                    .saturating_sub(KILL_ALLOWANCE);
                whole_ms(fit.grace.min(left))
            }
            _ => lost_grace,
        };
        if grace.is_zero() {
            note!(
                "leasehold: lease {key:?} ended: {reason}; killing the command (SIGKILL) at once"
            );
        } else {
            note!(
                "leasehold: lease {key:?} ended: {reason}; stopping the command (SIGTERM, \
                 SIGKILL after {})",
                humantime::format_duration(grace),
            );
        }
        self.terminate(job, grace);
    }
}
