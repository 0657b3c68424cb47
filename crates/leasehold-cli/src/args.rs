//! The command line, as clap reads it.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold_core::{AcquireRequest, LeaseKey, LockDelay, Ttl};

/// Run commands under distributed leases held in Redis, and inspect leases.
///
/// Exit codes: the command's own for `run`; 64 bad usage, 69 Redis
/// unreachable, 70 internal error, 74 output not written, 75 lease not acquired in time, 76 lease
/// lost while the command ran, 78 bad configuration; 1 for `status` or
/// `release` of a lease that is not held.
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
    /// Unset options are read from LEASEHOLD_TTL, LEASEHOLD_WAIT,
    /// LEASEHOLD_MAX_RENEWALS, LEASEHOLD_SAFETY_MARGIN, LEASEHOLD_NAME and
    /// LEASEHOLD_LABEL.
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
    Run(RunArgs),
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
        #[arg(long, conflicts_with = "permits")]
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
    /// Polls the lease every 100 ms, so a holder that comes and goes within
    /// one poll is not seen.
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
    /// The lease key.
    #[arg(long, value_parser = parse_key)]
    pub(crate) key: LeaseKey,
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
    #[arg(long, conflicts_with_all = ["permits", "writer"])]
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
    /// The lease name in logs (a bounded set, not a key) [default: default]
    #[arg(long)]
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
    /// --permits, --shared, --writer or --fair) [default: none]
    #[arg(
        long,
        value_parser = parse_at_least,
        value_name = "DURATION",
        conflicts_with_all = ["permits", "shared", "writer", "fair"]
    )]
    pub(crate) at_least: Option<Duration>,
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
        assert_eq!(run.key.as_str(), "k");
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
        ] {
            let error = Cli::try_parse_from(std::iter::once("leasehold").chain(args.clone()));
            match error {
                Err(e) => assert!(e.to_string().contains(value), "{args:?}: {e}"),
                Ok(cli) => panic!("{args:?} was accepted: {cli:?}"),
            }
        }
    }
}
