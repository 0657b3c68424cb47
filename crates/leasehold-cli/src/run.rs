//! `leasehold run`: a command under a lease.

use std::io::IsTerminal;
use std::process::Command;
use std::time::Duration;

use leasehold_core::{
    BackendError, FencingToken, JobName, LeaseBackend, LeaseInfo, LeaseKey, PermitLimit, Ttl,
};
use leasehold_redis::RedisBackend;
use leasehold_watchdog::{
    Backoff, Lease, LeaseError, LeaseManager, LeaseOptions, LeaseOptionsBuilder, LossReason,
    Progress, TickRun,
};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use crate::args::{Merged, RunArgs, Source};
use crate::environment;
use crate::exit::{self, Failure, note};
use crate::job::Job;
use crate::progress::ProgressFile;
use crate::stopping::{Fit, KILL_ALLOWANCE, whole_ms};

/// The signals `run` passes on to the command. Each would otherwise end
/// leasehold and leave the job running with no one to renew its lease or
/// stop it in time: SIGHUP comes when the terminal closes, to leasehold's
/// group while the job's has the terminal.
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, Failure> {
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
    pub(crate) async fn next(&mut self) -> Signal {
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
    if let (Some(schedule), Some(job)) = (&args.schedule, &args.job) {
        let (schedule, job) = (schedule.clone(), job.clone());
        return crate::scheduled::run(url, namespace, &args, schedule, job, options, &fit, signals)
            .await;
    }
    let Some(key) = args.key.clone() else {
        return Err(Failure::new(
            exit::USAGE,
            "run needs --key KEY, or --schedule CRON with --job NAME",
        ));
    };
    let options = options
        .build()
        .map_err(|e| Failure::new(exit::CONFIG, exit::chain(&e)))?;
    let backend = exit::connect(url, namespace).await?;
    let manager =
        LeaseManager::new(backend.clone()).map_err(|e| Failure::internal(e.to_string()))?;
    let acquired = tokio::select! {
        acquired = acquire(&manager, &backend, &key, &args, &options) => acquired,
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
            return Err(lease_failure(&error));
        }
    };
    let code = supervise(&args, &fit, &Held::Lease(&lease), &mut signals).await;
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

/// The failure, and exit code, of a lease that could not be had.
pub(crate) fn lease_failure(error: &LeaseError) -> Failure {
    let code = match error {
        LeaseError::NotAcquired { .. } => exit::NOT_ACQUIRED,
        // Another --permits than the semaphore's holders use.
        LeaseError::Backend(BackendError::PermitLimitMismatch { .. }) => exit::CONFIG,
        LeaseError::Backend(_) => exit::UNAVAILABLE,
        LeaseError::Invalid(_)
        | LeaseError::InvalidOptions { .. }
        | LeaseError::NotApplicable { .. }
        | LeaseError::InvalidTick { .. } => exit::CONFIG,
        _ => exit::SOFTWARE,
    };
    Failure::new(code, exit::chain(error))
}

/// The lease options, to build: LEASEHOLD_* variables, overridden by the
/// flags, with a safety margin that leaves room to stop the command (see
/// [`crate::stopping`]). Combinations `run` refuses are refused here (64),
/// whether a flag or a variable brought them.
fn options(args: &RunArgs) -> Result<(LeaseOptionsBuilder, Fit), Failure> {
    let mut config = environment::lease_config()?;
    let from_env = |var: &str| std::env::var_os(var).is_some();
    let source = |flag: bool, var: &str| {
        if flag {
            Source::Flag
        } else if from_env(var) {
            Source::Env
        } else {
            Source::Default
        }
    };
    let ttl_source = source(args.ttl.is_some(), "LEASEHOLD_TTL");
    let wait_source = source(args.wait.is_some(), "LEASEHOLD_WAIT");
    if let Some(ttl) = args.ttl {
        config.ttl = ttl;
    }
    if args.wait.is_some() {
        config.wait = args.wait;
    }
    // Every lease option a LEASEHOLD_* variable may set, the flag first.
    let at_least = args
        .at_least
        .map(|d| (d, Source::Flag))
        .or(config.hold_at_least.map(|d| (d, Source::Env)));
    let fair = if args.fair {
        Some(Source::Flag)
    } else {
        config.fair.map(|_| Source::Env)
    };
    let merged = Merged {
        wait: config.wait.map(|wait| (wait, wait_source)),
        ttl: (config.ttl, ttl_source),
        at_least,
        fair,
    };
    if let Some(refusal) = args.refusal(&merged) {
        return Err(Failure::new(exit::USAGE, refusal));
    }
    if config.progress_window.is_some() && args.progress_file.is_none() {
        return Err(Failure::new(
            exit::USAGE,
            "LEASEHOLD_PROGRESS_WINDOW needs --progress-file: the command shows its progress by \
             touching that file, and without one it would be stopped after the window; give \
             --progress-file, or unset the variable"
                .to_owned(),
        ));
    }
    let at_least = at_least.map(|(d, _)| d);
    // A minimum hold outlives a leasehold killed or cut off only with a
    // ttl of at least the hold: with no ttl given, the ttl is the hold.
    if let Some(minimum) = at_least
        && ttl_source == Source::Default
        && config.ttl.get() < minimum
    {
        config.ttl = Ttl::new(minimum).map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
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
    let fair_mode = if args.fair {
        Some(config.fair.unwrap_or_default())
    } else {
        config.fair
    };
    let mut builder = LeaseOptions::builder()
        .ttl(config.ttl)
        .safety_margin(fit.safety_margin)
        .renew_interval(config.renew_interval.unwrap_or(fit.renew_interval))
        .backoff(Backoff::new(config.backoff_initial, config.backoff_max))
        .name(config.name)
        .lock_delay(config.lock_delay)
        .fair(fair_mode);
    if let Some(max) = config.max_renewals {
        builder = builder.max_renewals(max);
    }
    if let Some(wait) = config.wait {
        builder = builder.wait(wait);
    }
    if let Some(minimum) = at_least {
        builder = builder.hold_at_least(minimum);
    }
    if let Some(label) = config.label {
        builder = builder.label(label);
    }
    if let Some(max) = args.at_most.or(config.hold_at_most) {
        builder = builder.hold_at_most(max);
    }
    if let Some(window) = args.progress_window.or(config.progress_window) {
        builder = builder.progress_window(window);
    }
    Ok((builder, fit))
}

/// Acquires the lease, showing on a terminal that it is waiting.
async fn acquire(
    manager: &LeaseManager<RedisBackend>,
    backend: &RedisBackend,
    key: &LeaseKey,
    args: &RunArgs,
    options: &LeaseOptions,
) -> Result<Lease, LeaseError> {
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

/// What the job runs under: a lease `run` acquired, or the run's lease of
/// a scheduled job's tick, which the manager holds for the tick (and ends
/// with the tick's completion).
pub(crate) enum Held<'a> {
    /// A lease taken with `run --key`.
    Lease(&'a Lease),
    /// The run of a tick of `job`, granted by the job's record.
    Tick {
        /// The run.
        run: &'a TickRun,
        /// Its job.
        job: &'a JobName,
    },
}

impl Held<'_> {
    /// The key the job's lease is held on, as the user names it.
    fn key(&self) -> LeaseKey {
        match self {
            Self::Lease(lease) => lease.server_key(),
            Self::Tick { job, .. } => job.run_key(),
        }
    }

    fn fencing_token(&self) -> FencingToken {
        match self {
            Self::Lease(lease) => lease.fencing_token(),
            Self::Tick { run, .. } => run.fencing_token(),
        }
    }

    fn progress(&self) -> Progress {
        match self {
            Self::Lease(lease) => lease.progress(),
            Self::Tick { run, .. } => run.progress().clone(),
        }
    }

    /// Waits until the lease ends, with its reason (`None` only if a
    /// tick's run ended without one recorded, which the watchdog never
    /// does: the reason is recorded before the token fires).
    async fn ended(&self) -> Option<LossReason> {
        match self {
            Self::Lease(lease) => Some(lease.lost().await),
            Self::Tick { run, .. } => {
                run.token().cancelled().await;
                run.loss_reason()
            }
        }
    }

    /// The end of the lease's certain validity.
    fn valid_until(&self) -> Option<Instant> {
        match self {
            Self::Lease(lease) => Some(lease.valid_until()),
            Self::Tick { run, .. } => Some(run.valid_until()),
        }
    }

    /// What the job finds in its environment.
    fn environment(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("LEASEHOLD_KEY", self.key().as_str().to_owned()),
            ("LEASEHOLD_FENCING_TOKEN", self.fencing_token().to_string()),
        ];
        if let Self::Tick { run, job } = self {
            vars.push(("LEASEHOLD_JOB", job.as_str().to_owned()));
            let tick = run
                .tick()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            vars.push(("LEASEHOLD_TICK", tick.to_string()));
        }
        vars
    }
}

/// Runs the command while the lease is held; returns leasehold's exit code.
pub(crate) async fn supervise(
    args: &RunArgs,
    fit: &Fit,
    held: &Held<'_>,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(Failure::new(exit::USAGE, "no command to run"));
    };
    let mut command = Command::new(program);
    command.args(rest).envs(held.environment());
    // Watched from before the job starts, so that its first touch counts.
    let _progress = args
        .progress_file
        .clone()
        .zip(args.progress_window)
        .map(|(path, window)| ProgressFile::watch(path, window, held.progress()));
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
    let mut ended = false;
    // While the job is being stopped, the group is also checked on a timer:
    // a process of the job whose parent is not leasehold dies without a
    // SIGCHLD to leasehold.
    let mut recheck = tokio::time::interval(RECHECK);
    // Ticks missed while no stop was under way are not made up in a burst.
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !job.is_gone() {
        if job.exit_code().is_some() && !stop.is_stopping() {
            stop.leftovers(&job, held, fit.grace);
        }
        tokio::select! {
            biased;
            reason = held.ended(), if !ended => {
                ended = true;
                stop.lease_ended(&job, held, reason, fit, args.lost_grace);
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
        (true, _) => Ok(exit::LOST),
        (false, Some(code)) => Ok(code),
        (false, None) => Err(Failure::internal("the command's exit status was lost")),
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
    fn leftovers(&mut self, job: &Job, held: &Held<'_>, grace: Duration) {
        self.leftovers_told = true;
        note!(
            "leasehold: the command exited but processes it started are still running; \
             stopping them before releasing lease {:?} (SIGTERM, SIGKILL after {})",
            held.key().as_str(),
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
    ///
    /// A lease ended with no reason recorded (`None`) is stopped as for a
    /// lost lease, with `--lost-grace` cut to the grace.
    fn lease_ended(
        &mut self,
        job: &Job,
        held: &Held<'_>,
        reason: Option<LossReason>,
        fit: &Fit,
        lost_grace: Duration,
    ) {
        let key = held.key();
        let key = key.as_str();
        let grace = match reason {
            Some(
                LossReason::RenewalLimit
                | LossReason::Deadline
                | LossReason::MaxHold
                | LossReason::Stalled,
            ) => {
                let left = held
                    .valid_until()
                    .map_or(Duration::ZERO, |until| {
                        until.saturating_duration_since(Instant::now())
                    })
                    .saturating_sub(KILL_ALLOWANCE);
                whole_ms(fit.grace.min(left))
            }
            Some(_) => lost_grace,
            None => lost_grace.min(fit.grace),
        };
        let why = reason.map_or_else(
            || "no reason was recorded; stopped as for a lost lease".to_owned(),
            |reason| reason.to_string(),
        );
        if grace.is_zero() {
            note!("leasehold: lease {key:?} ended: {why}; killing the command (SIGKILL) at once");
        } else {
            note!(
                "leasehold: lease {key:?} ended: {why}; stopping the command (SIGTERM, \
                 SIGKILL after {})",
                humantime::format_duration(grace),
            );
        }
        self.terminate(job, grace);
    }
}
