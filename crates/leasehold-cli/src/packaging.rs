//! What a packager installs beside the binary: shell completions and the
//! manual page, both generated from the command line's own definition so
//! they never drift from `--help`.
//!
//! They are printed by the binary itself (`leasehold completions SHELL`,
//! `leasehold man`) rather than written into cargo's `OUT_DIR` by a build
//! script: a package recipe runs the binary it just built and redirects the
//! output where the distribution wants it, while `OUT_DIR` is a hashed
//! directory inside `target/` that a recipe (or `cargo install`) cannot name.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::{Generator, Shell};

use crate::args::Cli;
use crate::exit::{self, Failure};

/// The name the command is installed under.
const BIN: &str = "leasehold";

/// Prints the completion script for `shell`.
pub(crate) fn completions(shell: Shell) -> Result<u8, Failure> {
    let mut command = Cli::command();
    command.set_bin_name(BIN);
    command.build();
    let mut script = Vec::new();
    shell
        .try_generate(&command, &mut script)
        .map_err(|e| Failure::internal(format!("could not generate {shell} completions: {e}")))?;
    print(&script)
}

/// Prints leasehold(1), or writes it and one page per subcommand into `dir`.
pub(crate) fn man(dir: Option<&Path>) -> Result<u8, Failure> {
    // `leasehold help` has no page of its own; the page lists only those it
    // can refer to.
    let command = Cli::command().disable_help_subcommand(true);
    match dir {
        Some(dir) => {
            clap_mangen::generate_to(command, dir).map_err(|e| {
                Failure::new(
                    exit::IO,
                    format!(
                        "could not write the manual pages into {}: {e}",
                        dir.display()
                    ),
                )
            })?;
            Ok(0)
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut page)
                .map_err(|e| Failure::internal(format!("could not render the manual page: {e}")))?;
            print(&page)
        }
    }
}

fn print(bytes: &[u8]) -> Result<u8, Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::new(exit::IO, format!("could not write to stdout: {e}")))?;
    Ok(0)
}
