//! The command line, as clap reads it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold_core::{AcquireRequest, CatchUp, JobName, LeaseKey, LockDelay, OnAbandon, Ttl};
use leasehold_cron::Schedule;

/// Run commands under distributed leases held in Redis, and inspect leases.
///
/// Exit codes: the command's own for `run`; 64 bad usage, 69 Redis
/// unreachable, 70 internal error, 74 output not written, 75 lease not
/// acquired in time (with --schedule: this host's clock is more than a
/// period ahead of the server's), 76 lease lost while the command ran, 78
/// bad configuration (with --schedule: the job runs under another schedule
/// on the server); 0 for `run --schedule` when the tick is not run here; 1
/// for `status` or `release` of a lease that is not held, or `jobs --job`
/// of a job with no record.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, max_term_width = 100)]
pub(crate) struct Cli {
    /// The Redis server [default: $LEASEHOLD_URL, $LEASEHOLD_REDIS_URL,
    /// $REDIS_URL, or redis://127.0.0.1:6379]
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) url: Option<String>,
    /// The prefix of the keys leasehold stores in Redis (a lease KEY is
    /// stored as NAMESPACE:{KEY}) [default: leasehold]
    #[arg(long, global = true, value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command only while holding a lease (like flock, across machines).
    ///
    /// Waits for the lease, runs CMD with LEASEHOLD_KEY and
    /// LEASEHOLD_FENCING_TOKEN in its environment, renews the lease while CMD
    /// runs, and releases it when CMD exits; CMD's exit code is passed
    /// through (128+N when a signal N ended it).
    ///
    /// CMD runs as a job: a process group of its own, with every process it
    /// starts. Signals go to the whole job, and the lease is released only
    /// once no process of the job is left: processes CMD leaves behind get
    /// SIGTERM, then SIGKILL after the grace. A process that leaves the group
    /// (setsid, setpgid, as daemons do) is not part of the job and is neither
    /// stopped nor waited for. When leasehold runs in the foreground of a
    /// terminal, the job is the terminal's foreground group while it runs, so
    /// CMD may read it and Ctrl-C reaches CMD directly; a job suspended with
    /// Ctrl-Z is resumed at once.
    ///
    /// If the lease ends while the job runs, the job is stopped and
    /// leasehold exits with 76. At the renewal cap or when renewals kept
    /// failing, the lease's safety margin is made at least the grace plus
    /// 250ms to kill: the job gets SIGTERM, then SIGKILL after the grace,
    /// and is dead before the lease can expire on the server. If the server
    /// lost the lease (it expired, was deleted or taken over), another holder
    /// may already run: the job is killed at once (SIGKILL), or gets
    /// --lost-grace after SIGTERM. SIGINT, SIGTERM and SIGHUP sent to
    /// leasehold are passed to the job. A leasehold killed with SIGKILL cannot stop its
    /// job.
    ///
    /// Unset options are read from LEASEHOLD_* variables named after the
    /// library's settings: LEASEHOLD_TTL, LEASEHOLD_WAIT,
    /// LEASEHOLD_MAX_RENEWALS, LEASEHOLD_SAFETY_MARGIN, LEASEHOLD_NAME,
    /// LEASEHOLD_LABEL, LEASEHOLD_LOCK_DELAY, LEASEHOLD_HOLD_AT_LEAST and
    /// the others docs/operations.md lists. Any other LEASEHOLD_ variable
    /// is refused (78), naming it and the setting it is nearest to, except
    /// LEASEHOLD_URL and the variables `run` sets for CMD, which a nested
    /// `leasehold run` inherits.
    ///
    /// With --permits N, KEY is a semaphore: up to N commands run at once,
    /// each under one of its permits (a lease of its own, renewed and
    /// stopped as above); LEASEHOLD_KEY then names the permit's key. Every
    /// holder of a semaphore must give the same N.
    ///
    /// With --shared or --writer, KEY is a read-write lease: commands run
    /// with --shared run together, one run with --writer runs alone (no
    /// --shared beside it), and a waiting --writer keeps new --shared runs
    /// out so that it waits only for those already running. LEASEHOLD_KEY
    /// then names the reader's or the writer's key. A read-write lease KEY
    /// is another lock than the exclusive lease a plain `run KEY` takes.
    ///
    /// With --at-least, the lease stays taken until that long after it was
    /// granted, even when CMD ends sooner. Unlike the library's minimum
    /// hold, `run` refuses it with a wait (--wait or LEASEHOLD_WAIT: a
    /// waiting host would take the lease when the hold ends and run CMD
    /// again) and with a ttl below the hold (a leasehold killed or cut off
    /// would let the key expire after the ttl, before the hold ends); with
    /// no --ttl and no LEASEHOLD_TTL, the ttl is the hold (when it is
    /// longer than 30s).
    ///
    /// With --schedule CRON --job NAME (and no --key), the same crontab
    /// line on every host runs CMD once per tick across the hosts, decided
    /// on the Redis server's clock, not the hosts': leasehold asks the
    /// server for the tick at or before now on the schedule (waiting, at
    /// most one period, for a tick the server's clock has not reached),
    /// and the job's record on the server grants it to one host, which
    /// runs CMD under the job's run lease (`job:{NAME}:run`, renewed and
    /// stopped as above) and records its completion when CMD exits,
    /// whatever its exit code. CMD gets LEASEHOLD_JOB, LEASEHOLD_TICK (the
    /// tick in UNIX milliseconds, the same on every host: use it as the
    /// run's idempotency key), LEASEHOLD_KEY and LEASEHOLD_FENCING_TOKEN.
    /// Every other host exits with 0 and one line on stderr saying why the
    /// tick is not run here (decided already, by whom; missed: asked for
    /// after its start deadline; skipped: the previous run still holds the
    /// job's lease). A record that names another schedule (or time zone)
    /// is refused with 78: roll the new schedule out to every host. A
    /// host whose clock is more than a period ahead of the server's exits
    /// with 75 without asking. Not with --at-least, --wait (nor
    /// LEASEHOLD_WAIT), --permits, --shared, --writer or --fair: the record
    /// decides who runs, with no hold and no wait. CMD is stopped when the
    /// run's lease ends exactly as under --key. With --on-abandon rerun, a
    /// one-shot command whose winner died leaves the re-run to a
    /// long-lived node; its next invocation records the abandonment.
    // Boxed: the other commands need far less room than its flags.
    Run(Box<RunArgs>),
    /// List the scheduled jobs' records: per job, its last decision, its
    /// last run and its counts, as the server keeps them.
    ///
    /// Per job: the highest tick decided (RFC 3339, UTC), its state
    /// (started, completed, missed, skipped, abandoned) and reason; the
    /// label and fencing token of the last run, its state (running,
    /// completed, abandoned) and duration (so far, while it runs); the
    /// next tick when the record's schedule is one leasehold reads (else
    /// "unknown"); and how many runs started, completed, were re-run or
    /// abandoned and how many ticks were missed or skipped over the
    /// record's life. A record expires the schedule's longest gap plus the
    /// start deadline after its last tick.
    ///
    /// Without --job it scans the namespace's job records: one SCAN per
    /// server, and on a Redis Cluster one SCAN per master (every master is
    /// visited).
    Jobs {
        /// Show this job only (exits with 1 when it has no record)
        #[arg(long, value_name = "NAME", value_parser = parse_job)]
        job: Option<JobName>,
        /// Print one JSON object per job, one per line, instead of the
        /// table: {"job","fingerprint","decided","run","next_tick",
        /// "counts","last_seen","server_time"}; instants as RFC 3339
        /// strings beside UNIX milliseconds (fields ending in _ms)
        #[arg(long)]
        json: bool,
    },
    /// Show who holds leases: a table of each key's holder label, fencing
    /// token and remaining ttl.
    ///
    /// Exits with 0 when every lease named is held and 1 when one is not.
    /// With --permits, each KEY is a semaphore: one row per permit, and a
    /// semaphore counts as held while any of its permits is. With --rw, each
    /// KEY is a read-write lease: a row for its writer, one per reader and
    /// one for a writer waiting for it, and it counts as held while a writer
    /// or a reader holds it.
    Status {
        /// The lease keys.
        #[arg(value_parser = parse_key, required = true, value_name = "KEY")]
        keys: Vec<LeaseKey>,
        /// Each KEY is a semaphore of N permits (1 to 100), as taken with
        /// `run --permits N`: show who holds each permit
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
        permits: Option<u32>,
        /// Each KEY is a read-write lease, as taken with `run --shared` and
        /// `run --writer`: show its writer, its readers and a waiting
        /// writer, as the server holds them at one instant
        #[arg(long, visible_alias = "write", conflicts_with = "permits")]
        rw: bool,
        /// Print one JSON object per key, one per line, instead of the table:
        /// {"key","held"} and, when held, "label", "fencing_token" and
        /// "ttl_left_ms"; with --rw, {"key","held","writer","readers",
        /// "waiting_writer"}, the writer and each reader with those three
        /// fields and the waiting writer with "label" and "ttl_left_ms".
        #[arg(long)]
        json: bool,
    },
    /// Delete a lease whatever its holder (an administrator's takeover).
    ///
    /// The holder is not told: it learns of the loss at its next renewal
    /// (within a third of the ttl) and meanwhile may still be working. Use
    /// it for a holder known to be dead. Refused without --force. Exits
    /// with 0 when a lease was deleted and 1 when none was held.
    Release {
        /// The lease key.
        #[arg(value_parser = parse_key)]
        key: LeaseKey,
        /// Yes, delete the lease even though someone may hold it.
        #[arg(long)]
        force: bool,
    },
    /// Print each change of a lease's holder as it happens, until interrupted.
    ///
    /// Told by the server (client tracking and release notices), not by
    /// polling: a change is printed within a round trip or two of it. A
    /// holder that comes and goes within that time may not be shown.
    Watch {
        /// The lease key.
        #[arg(value_parser = parse_key)]
        key: LeaseKey,
    },
    /// Print a shell completion script to stdout.
    ///
    /// For example, for bash: `leasehold completions bash >
    /// /usr/share/bash-completion/completions/leasehold`.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, leasehold(1), to stdout, or write it and a page
    /// per subcommand to a directory.
    ///
    /// For example: `leasehold man > /usr/share/man/man1/leasehold.1`.
    Man {
        /// Write leasehold.1 and leasehold-SUBCOMMAND.1 into this directory
        /// instead.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lease key (not with --schedule: a scheduled run holds its job's
    /// lease)
    #[arg(
        long,
        value_parser = parse_key,
        required_unless_present = "schedule",
        conflicts_with = "schedule"
    )]
    pub(crate) key: Option<LeaseKey>,
    /// How long Redis keeps the lease unless renewed (100ms to 24h; run needs
    /// about 400ms to stop the job in time); it is renewed every third of it,
    /// or more often when a long grace leaves less room [default: 30s]
    #[arg(long, value_parser = parse_ttl)]
    pub(crate) ttl: Option<Ttl>,
    /// Take one of the N permits (1 to 100) of the semaphore KEY instead of
    /// its exclusive lease
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub(crate) permits: Option<u32>,
    /// Take a shared (read) hold on the read-write lease KEY: runs with
    /// --shared run together, never beside a --writer
    #[arg(long, visible_alias = "read", conflicts_with_all = ["permits", "writer"])]
    pub(crate) shared: bool,
    /// Take the exclusive (write) hold on the read-write lease KEY: no
    /// --shared run and no other --writer runs beside it, and while it
    /// waits, new --shared runs wait behind it
    #[arg(long, conflicts_with = "permits")]
    pub(crate) writer: bool,
    /// Wait in the server's queue: waiting runs, from every host, get the
    /// lease in the order they started waiting (fair mode)
    #[arg(long, conflicts_with_all = ["permits", "shared", "writer"])]
    pub(crate) fair: bool,
    /// How long to wait while another holder has the lease [default: try once]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub(crate) wait: Option<Duration>,
    /// Stop renewing after N renewals. The job is stopped early rather than
    /// renewed through the grace: it gets SIGTERM when the grace plus 250ms
    /// is left of the last renewal's validity, and is dead before the lease
    /// can expire [default: no limit]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_renewals: Option<u32>,
    /// How long the job has to exit after SIGTERM before SIGKILL, when the
    /// renewal cap is reached, renewals keep failing or CMD left processes
    /// behind. It must fit before the lease can expire: stopping the job
    /// (the grace and 250ms to kill it) may take at most two thirds of the
    /// ttl, and a longer grace is cut to that, with a message
    #[arg(long, value_parser = parse_duration, default_value = "10s", value_name = "DURATION")]
    pub(crate) grace: Duration,
    /// How long the job has to exit after SIGTERM before SIGKILL when the
    /// server lost the lease. Another holder may already run meanwhile, so
    /// by default the job is killed at once
    #[arg(long, value_parser = parse_duration, default_value = "0s", value_name = "DURATION")]
    pub(crate) lost_grace: Duration,
    /// The lease name in logs (a bounded set, not a key; with --schedule
    /// the job's name is) [default: default]
    #[arg(long, conflicts_with = "schedule")]
    pub(crate) name: Option<String>,
    /// A public label stored beside the lease, shown by `status` [default:
    /// the host name]
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// Keep the lease taken on the server this long after it ends without a
    /// release (leasehold itself cut off or killed with SIGKILL), so that a
    /// job that outlives leasehold has that long to stop before another
    /// holder may start; a release frees it at once (0s to 1h) [default:
    /// LEASEHOLD_LOCK_DELAY, else 0s]
    #[arg(long, value_parser = parse_lock_delay, value_name = "DURATION")]
    pub(crate) lock_delay: Option<LockDelay>,
    /// Keep the lease taken on the server until this long after it was
    /// granted, even when the job ends sooner (the server's clock decides;
    /// a job that runs longer frees it when it ends). With the same line in
    /// every host's crontab, a job that ends early is not run again by a
    /// host whose clock is late (1ms to 24h; exclusive leases only: not with
    /// --permits, --shared, --writer or --fair; not with --wait or
    /// LEASEHOLD_WAIT; the ttl must be at least the hold, and is the hold
    /// when neither --ttl nor LEASEHOLD_TTL is given; not with --schedule,
    /// whose record decides instead) [default: none]
    #[arg(
        long = "hold-at-least",
        visible_alias = "at-least",
        value_parser = parse_at_least,
        value_name = "DURATION",
        conflicts_with_all = ["permits", "shared", "writer", "fair"]
    )]
    pub(crate) at_least: Option<Duration>,
    /// The longest the lease is held, from its acquisition (at least the
    /// ttl): renewals stop before they would hold it longer, and the job is
    /// stopped as at the renewal cap, dead before the maximum [default: no
    /// limit]
    #[arg(
        long = "hold-at-most",
        visible_alias = "at-most",
        value_parser = parse_duration,
        value_name = "DURATION"
    )]
    pub(crate) at_most: Option<Duration>,
    /// A file the job touches to show progress (its modification time is
    /// polled four times per --progress-window); see --progress-window
    #[arg(long, value_name = "PATH", requires = "progress_window")]
    pub(crate) progress_file: Option<PathBuf>,
    /// Renew the lease only while the job touched --progress-file within
    /// this long (at least the renew interval). A job that stops touching
    /// it is stopped as at the renewal cap within the window plus a quarter
    /// of it plus one renew interval, dead before the lease can expire, and
    /// leasehold exits with 76 [default: progress is not watched]
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", requires = "progress_file")]
    pub(crate) progress_window: Option<Duration>,
    /// Run CMD once per tick of this cron schedule across every host that
    /// runs the same line, decided on the Redis server's clock (see above):
    /// five fields as in a crontab ("0 2 * * *", at second 0), or six or
    /// seven with seconds first ("*/10 * * * * *"). Needs --job
    #[arg(long, value_name = "CRON", value_parser = parse_schedule, requires = "job")]
    pub(crate) schedule: Option<Schedule>,
    /// The scheduled job's name (1 to 64 ASCII letters, digits, '-', '_'
    /// and '.'): its record on the server and its run's lease
    /// `job:{NAME}:run` are named after it. Every host of the job gives the
    /// same --schedule and --time-zone
    #[arg(
        long,
        value_name = "NAME",
        value_parser = parse_job,
        requires = "schedule",
        conflicts_with = "key"
    )]
    pub(crate) job: Option<JobName>,
    /// The IANA time zone the schedule is read in ("Europe/Berlin")
    /// [default: UTC]
    #[arg(long, value_name = "TZ", requires = "schedule", conflicts_with = "key")]
    pub(crate) time_zone: Option<String>,
    /// How long after its tick, by the server's clock, a tick may still
    /// start (and never at or after the next tick); asked later, it is
    /// missed (whole milliseconds) [default: 1m]
    #[arg(
        long,
        value_parser = parse_duration,
        value_name = "DURATION",
        requires = "schedule",
        conflicts_with = "key"
    )]
    pub(crate) start_deadline: Option<Duration>,
    /// What becomes of a tick nobody started before its start deadline:
    /// none (it is missed) or latest (it still starts while it is the
    /// newest tick, before the next one; older ones are missed)
    /// [default: none]
    #[arg(
        long,
        value_name = "none|latest",
        value_parser = parse_catch_up,
        requires = "schedule",
        conflicts_with = "key"
    )]
    pub(crate) catch_up: Option<CatchUp>,
    /// What becomes of a run whose lease ended without a completion (its
    /// host died or lost the lease): skip (recorded as abandoned, not run
    /// again) or rerun (run again by a long-lived node that watches the
    /// job, with a higher fencing token, so CMD's work may run twice for
    /// one tick). `run` is one-shot and cannot watch a dead winner: a
    /// one-shot command whose winner died leaves the re-run to a
    /// long-lived node (the library's LeaseManager::run_schedule on the
    /// same job); its next invocation records the abandonment
    /// [default: skip]
    #[arg(
        long,
        value_name = "skip|rerun",
        value_parser = parse_on_abandon,
        requires = "schedule",
        conflicts_with = "key"
    )]
    pub(crate) on_abandon: Option<OnAbandon>,
    /// The command and its arguments (after `--`).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub(crate) command: Vec<OsString>,
}

fn parse_key(s: &str) -> Result<LeaseKey, String> {
    LeaseKey::new(s).map_err(|e| e.to_string())
}

fn parse_ttl(s: &str) -> Result<Ttl, String> {
    Ttl::parse(s).map_err(|e| e.to_string())
}

fn parse_lock_delay(s: &str) -> Result<LockDelay, String> {
    LockDelay::parse(s).map_err(|e| e.to_string())
}

fn parse_at_least(s: &str) -> Result<Duration, String> {
    let minimum = parse_duration(s)?;
    AcquireRequest::check_hold_at_least(minimum)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "a minimum hold of 0s holds nothing; leave --at-least out".to_owned())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    leasehold_core::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_job(s: &str) -> Result<JobName, String> {
    JobName::new(s).map_err(|e| e.to_string())
}

fn parse_schedule(s: &str) -> Result<Schedule, String> {
    Schedule::parse(s).map_err(|e| e.to_string())
}

fn parse_catch_up(s: &str) -> Result<CatchUp, String> {
    s.parse()
}

fn parse_on_abandon(s: &str) -> Result<OnAbandon, String> {
    s.parse()
}

/// Where a setting came from, for a refusal to name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The command line's flag.
    Flag,
    /// The LEASEHOLD_* environment variable.
    Env,
    /// Neither: the default.
    Default,
}

/// The settings a refusal looks at once the flags and the LEASEHOLD_*
/// variables are merged: the wait and the ttl, each with its source.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Merged {
    pub(crate) wait: Option<(Duration, Source)>,
    pub(crate) ttl: (Ttl, Source),
    /// The minimum hold, from --hold-at-least or LEASEHOLD_HOLD_AT_LEAST.
    pub(crate) at_least: Option<(Duration, Source)>,
    /// Fair mode, from --fair or LEASEHOLD_FAIR.
    pub(crate) fair: Option<Source>,
}

impl RunArgs {
    /// The combinations `run` refuses (exit 64) that clap does not: each
    /// with why. A LEASEHOLD_* variable cannot bring one back: a refusal
    /// names the variable that set the value.
    pub(crate) fn refusal(&self, merged: &Merged) -> Option<String> {
        // A wait of zero tries once, as no wait does.
        let wait = merged
            .wait
            .filter(|(wait, _)| !wait.is_zero())
            .map(|(wait, source)| {
                let wait = humantime::format_duration(wait);
                match source {
                    Source::Env => format!("LEASEHOLD_WAIT={wait}"),
                    _ => format!("--wait {wait}"),
                }
            });
        // The flag wins over the variable; a caller that merged neither
        // still has the flag.
        let held = merged.at_least.or(self.at_least.map(|d| (d, Source::Flag)));
        let at_least = held.map(|(hold, source)| {
            let hold = humantime::format_duration(hold).to_string();
            let given = match source {
                Source::Env => format!("LEASEHOLD_HOLD_AT_LEAST={hold}"),
                _ => format!("--at-least {hold}"),
            };
            (hold, given)
        });
        let fair = merged
            .fair
            .or(self.fair.then_some(Source::Flag))
            .map(|source| match source {
                Source::Env => "LEASEHOLD_FAIR",
                _ => "--fair",
            });
        if self.schedule.is_some() {
            let others = [
                (at_least.as_ref().map(|(_, given)| given.as_str())),
                self.permits.is_some().then_some("--permits"),
                self.shared.then_some("--shared"),
                self.writer.then_some("--writer"),
                fair,
            ];
            if let Some(flag) = others.into_iter().flatten().next() {
                return Some(format!(
                    "--schedule cannot be used with {flag}: the job's record on the server \
                     decides which host runs each tick, under the job's own exclusive run \
                     lease, with no minimum hold, no wait and no other kind of lease"
                ));
            }
            if let Some(wait) = wait {
                let unset = if wait.starts_with("LEASEHOLD_") {
                    "; unset LEASEHOLD_WAIT for this command"
                } else {
                    ""
                };
                return Some(format!(
                    "--schedule cannot be used with {wait}: the job's record on the server \
                     decides which host runs each tick; a host that is not granted it must \
                     not wait and run it later{unset}"
                ));
            }
            return None;
        }
        let (hold, given_hold) = at_least?;
        if let Some(fair) = fair
            && given_hold.starts_with("LEASEHOLD_")
        {
            return Some(format!(
                "{given_hold} cannot be used with {fair}: a minimum hold is for exclusive \
                 leases taken without fair mode"
            ));
        }
        if (self.permits.is_some() || self.shared || self.writer)
            && given_hold.starts_with("LEASEHOLD_")
        {
            return Some(format!(
                "{given_hold} cannot be used with --permits, --shared or --writer: a minimum \
                 hold is for exclusive leases; unset it for this command"
            ));
        }
        if let Some(wait) = wait {
            let unset = if wait.starts_with("LEASEHOLD_") {
                "; unset LEASEHOLD_WAIT for this command"
            } else {
                "; leave --wait out"
            };
            return Some(format!(
                "{given_hold} cannot be used with {wait}: a host that waits would take \
                 the lease when the hold ends and run the command again (with --at-least, a \
                 host that finds the lease held exits with 75){unset}"
            ));
        }
        let (ttl, source) = merged.ttl;
        let at_least = held.map_or(Duration::ZERO, |(d, _)| d);
        if ttl.get() < at_least && source != Source::Default {
            let given = match source {
                Source::Env => format!("LEASEHOLD_TTL={ttl}"),
                _ => format!("--ttl {ttl}"),
            };
            return Some(format!(
                "{given_hold} cannot be used with {given}: a leasehold killed or cut off \
                 leaves the key for its ttl, which would end the hold early and let another \
                 host run the command again; give a ttl of at least {hold}, or none (the ttl \
                 is then the hold)"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_its_options() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from([
            "leasehold",
            "run",
            "--key",
            "k",
            "--ttl",
            "5s",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])?;
        let Command::Run(run) = cli.command else {
            panic!("not run: {cli:?}");
        };
        assert_eq!(run.key.as_ref().map(LeaseKey::as_str), Some("k"));
        assert_eq!(
            run.ttl,
            Some(
                Ttl::parse("5s")
                    .map_err(|_| clap::Error::new(clap::error::ErrorKind::InvalidValue))?
            )
        );
        assert_eq!(run.grace, Duration::from_secs(10));
        assert_eq!(run.lock_delay, None);
        assert_eq!(run.at_least, None);
        assert!(!run.fair);
        assert_eq!(run.command, ["sh", "-c", "exit 3"]);
        Ok(())
    }

    #[test]
    fn at_least_is_for_exclusive_leases() -> Result<(), clap::Error> {
        let run = |extra: &[&str]| {
            let mut args = vec!["leasehold", "run", "--key", "k", "--at-least", "10m"];
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--", "true"]);
            Cli::try_parse_from(args)
        };
        let Command::Run(parsed) = run(&[])?.command else {
            panic!("not run");
        };
        assert_eq!(parsed.at_least, Some(Duration::from_secs(600)));
        for other in ["--shared", "--writer", "--permits=2", "--fair"] {
            assert!(
                run(&[other]).is_err(),
                "{other} with --at-least was accepted"
            );
        }
        for bad in ["25h", "0s", "1.5ms", "soon"] {
            let args = [
                "leasehold",
                "run",
                "--key",
                "k",
                "--at-least",
                bad,
                "--",
                "true",
            ];
            assert!(
                Cli::try_parse_from(args).is_err(),
                "--at-least {bad} was accepted"
            );
        }
        Ok(())
    }

    fn run_args(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let cli = Cli::try_parse_from(
            ["leasehold", "run"]
                .iter()
                .chain(args)
                .chain(&["--", "true"]),
        )?;
        match cli.command {
            Command::Run(run) => Ok(*run),
            _ => Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand)),
        }
    }

    #[test]
    fn a_schedule_takes_a_job_and_no_key() -> Result<(), clap::Error> {
        let run = run_args(&["--schedule", "0 2 * * *", "--job", "nightly"])?;
        assert_eq!(run.key, None);
        assert_eq!(
            run.schedule.map(|s| s.as_str().to_owned()).as_deref(),
            Some("0 0 2 * * *")
        );
        assert_eq!(run.job.as_ref().map(JobName::as_str), Some("nightly"));
        let run = run_args(&[
            "--schedule",
            "*/10 * * * * *",
            "--job",
            "j",
            "--time-zone",
            "Europe/Berlin",
            "--start-deadline",
            "5s",
            "--catch-up",
            "latest",
            "--on-abandon",
            "rerun",
        ])?;
        assert_eq!(run.time_zone.as_deref(), Some("Europe/Berlin"));
        assert_eq!(run.start_deadline, Some(Duration::from_secs(5)));
        assert_eq!(run.catch_up, Some(CatchUp::Latest));
        assert_eq!(run.on_abandon, Some(OnAbandon::Rerun));
        for (args, says) in [
            (&["--schedule", "0 2 * * *"][..], "--job"),
            (&["--job", "nightly"][..], "--schedule"),
            (&["--key", "k", "--job", "nightly"][..], "--key"),
            (&["--job", "nightly", "--key", "k"][..], "--key"),
            (
                &["--schedule", "0 2 * * *", "--job", "n", "--key", "k"][..],
                "--key",
            ),
            (&["--key", "k", "--time-zone", "UTC"][..], "--key"),
            (&["--key", "k", "--catch-up", "latest"][..], "--key"),
            (&["--key", "k", "--on-abandon", "rerun"][..], "--key"),
            (&["--key", "k", "--start-deadline", "1m"][..], "--key"),
            (&["--time-zone", "UTC"][..], "--schedule"),
            (
                &["--schedule", "61 * * * *", "--job", "n"][..],
                "61 * * * *",
            ),
            (
                &["--schedule", "0 2 * * *", "--job", "no spaces"][..],
                "--job",
            ),
            (
                &["--schedule", "0 2 * * *", "--job", "n", "--catch-up", "all"][..],
                "all",
            ),
            (
                &["--schedule", "0 2 * * *", "--job", "n", "--name", "x"][..],
                "--name",
            ),
        ] {
            match run_args(args) {
                Err(e) => assert!(e.to_string().contains(says), "{args:?}: {e}"),
                Ok(run) => panic!("{args:?} was accepted: {run:?}"),
            }
        }
        Ok(())
    }

    fn ttl(s: &str) -> Ttl {
        Ttl::parse(s).expect("a valid ttl")
    }

    fn merged(wait: Option<(u64, Source)>, ttl_: (&str, Source)) -> Merged {
        Merged {
            wait: wait.map(|(secs, source)| (Duration::from_secs(secs), source)),
            ttl: (ttl(ttl_.0), ttl_.1),
            at_least: None,
            fair: None,
        }
    }

    #[test]
    fn refused_combinations_say_why_and_name_the_variable() -> Result<(), clap::Error> {
        let default_ttl = ("30s", Source::Default);
        let at_least = run_args(&["--key", "k", "--at-least", "10m"])?;
        // Alone, with a ttl left to the default (raised to the hold), or
        // with a long enough one: accepted.
        assert_eq!(at_least.refusal(&merged(None, default_ttl)), None);
        assert_eq!(at_least.refusal(&merged(None, ("10m", Source::Flag))), None);
        assert_eq!(
            at_least.refusal(&merged(Some((0, Source::Env)), default_ttl)),
            None
        );
        let refused = |m: Merged| at_least.refusal(&m).unwrap_or_default();
        let text = refused(merged(Some((300, Source::Flag)), default_ttl));
        assert!(
            text.contains("--at-least 10m cannot be used with --wait 5m")
                && text.contains("run the command again"),
            "{text}"
        );
        let text = refused(merged(Some((300, Source::Env)), default_ttl));
        assert!(
            text.contains("with LEASEHOLD_WAIT=5m") && text.contains("unset LEASEHOLD_WAIT"),
            "{text}"
        );
        let text = refused(merged(None, ("30s", Source::Flag)));
        assert!(
            text.contains("--at-least 10m cannot be used with --ttl 30s"),
            "{text}"
        );
        let text = refused(merged(None, ("1m", Source::Env)));
        assert!(text.contains("with LEASEHOLD_TTL=1m"), "{text}");

        let scheduled = run_args(&["--schedule", "0 2 * * *", "--job", "n"])?;
        assert_eq!(scheduled.refusal(&merged(None, ("5s", Source::Flag))), None);
        let text = scheduled
            .refusal(&merged(Some((60, Source::Env)), default_ttl))
            .unwrap_or_default();
        assert!(
            text.contains("--schedule cannot be used with LEASEHOLD_WAIT=1m"),
            "{text}"
        );
        let text = scheduled
            .refusal(&merged(Some((60, Source::Flag)), default_ttl))
            .unwrap_or_default();
        assert!(
            text.contains("--schedule cannot be used with --wait 1m"),
            "{text}"
        );
        for flag in [
            &["--at-least", "1m"][..],
            &["--permits", "2"][..],
            &["--shared"][..],
            &["--writer"][..],
            &["--fair"][..],
        ] {
            let mut args = vec!["--schedule", "0 2 * * *", "--job", "n"];
            args.extend_from_slice(flag);
            let text = run_args(&args)?
                .refusal(&merged(None, default_ttl))
                .unwrap_or_default();
            assert!(
                text.contains(&format!("--schedule cannot be used with {}", flag[0]))
                    && text.contains("record"),
                "{flag:?}: {text}"
            );
        }
        Ok(())
    }

    #[test]
    fn fair_is_for_exclusive_leases() -> Result<(), clap::Error> {
        let cli = Cli::try_parse_from(["leasehold", "run", "--key", "k", "--fair", "--", "true"])?;
        let Command::Run(run) = cli.command else {
            panic!("not run: {cli:?}");
        };
        assert!(run.fair);
        for other in ["--shared", "--writer", "--permits=2"] {
            let args = [
                "leasehold",
                "run",
                "--key",
                "k",
                "--fair",
                other,
                "--",
                "true",
            ];
            assert!(
                Cli::try_parse_from(args).is_err(),
                "{other} with --fair was accepted"
            );
        }
        Ok(())
    }

    #[test]
    fn bad_values_are_refused_with_the_value() {
        for (args, value) in [
            (
                vec!["run", "--key", "k", "--ttl", "3 weeks ago", "--", "true"],
                "3 weeks ago",
            ),
            (
                vec!["run", "--key", "k", "--ttl", "10ms", "--", "true"],
                "10ms",
            ),
            (vec!["run", "--key", "", "--", "true"], "--key"),
            (
                vec!["run", "--key", "k", "--lock-delay", "2h", "--", "true"],
                "2h",
            ),
            (
                vec!["run", "--key", "k", "--max-renewals", "0", "--", "true"],
                "0",
            ),
            (vec!["run", "--key", "k"], "CMD"),
            (
                vec!["run", "--key", "k", "--progress-file", "p", "--", "true"],
                "--progress-window",
            ),
        ] {
            let error = Cli::try_parse_from(std::iter::once("leasehold").chain(args.clone()));
            match error {
                Err(e) => assert!(e.to_string().contains(value), "{args:?}: {e}"),
                Ok(cli) => panic!("{args:?} was accepted: {cli:?}"),
            }
        }
    }
}
