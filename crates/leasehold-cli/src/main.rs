//! The `leasehold` command: run a command only while holding a lease on
//! Redis, and inspect, watch or take over leases.
//!
//! ```text
//! leasehold run --key reports:nightly --ttl 30s --wait 5m -- ./nightly-report.sh
//! leasehold run --schedule "0 2 * * *" --job nightly -- ./nightly-report.sh
//! leasehold jobs --json
//! leasehold status reports:nightly --json
//! leasehold watch reports:nightly
//! leasehold release reports:nightly --force
//! leasehold completions bash > /usr/share/bash-completion/completions/leasehold
//! leasehold man > /usr/share/man/man1/leasehold.1
//! ```
//!
//! See `leasehold --help` and docs/operations.md for the exit codes.

mod admin;
mod args;
mod environment;
mod exit;
mod job;
mod jobs;
mod packaging;
mod progress;
mod run;
mod scheduled;
mod stopping;

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::args::{Cli, Command};
use crate::exit::Failure;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(exit::USAGE);
        }
    };
    // Every command that talks to Redis reads the LEASEHOLD_* variables;
    // one that is no setting is refused before anything is done, as a
    // typo in a configuration file would be (environment.rs).
    let reads_environment = !matches!(
        cli.command,
        Command::Completions { .. } | Command::Man { .. }
    );
    if reads_environment && let Err(failure) = environment::lease_config() {
        return failure.report();
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return Failure::internal(format!("could not start the runtime: {e}")).report(),
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Run(run) => run::run(&cli.url, cli.namespace.as_deref(), *run).await,
            Command::Status {
                keys,
                json,
                permits,
                rw,
            } => admin::status(&cli.url, cli.namespace.as_deref(), &keys, permits, rw, json).await,
            Command::Release { key, force } => {
                admin::release(&cli.url, cli.namespace.as_deref(), &key, force).await
            }
            Command::Jobs { job, json } => {
                jobs::jobs(&cli.url, cli.namespace.as_deref(), job.as_ref(), json).await
            }
            Command::Watch { key } => admin::watch(&cli.url, cli.namespace.as_deref(), &key).await,
            Command::Completions { shell } => packaging::completions(shell),
            Command::Man { dir } => packaging::man(dir.as_deref()),
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(failure) => failure.report(),
    }
}
