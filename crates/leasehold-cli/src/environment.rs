//! The `LEASEHOLD_*` environment: what the command reads, what it passes
//! over, and the refusal of the rest.
//!
//! The rule is the library's (`LeaseConfig`, "Unknown names"): a variable
//! whose name starts with `LEASEHOLD_` is a lease setting, or one of
//! `LeaseConfig::COMMAND_VARIABLES` (`LEASEHOLD_URL`, read here, and
//! `LEASEHOLD_KEY`, `LEASEHOLD_FENCING_TOKEN`, `LEASEHOLD_JOB`,
//! `LEASEHOLD_TICK`, set for the command `run` runs, so that a nested
//! `leasehold run` starts as any other), or it is refused with exit code 78,
//! naming it and the setting it is nearest to.
//!
//! One addition: the names leasehold's own test suite, benchmarks and
//! examples read ([`DEVELOPMENT`], and the families in
//! [`DEVELOPMENT_FAMILIES`]) are passed over as well, because the test
//! suite runs this command with them set. The test at the end checks that
//! every `LEASEHOLD_` name in the repository is a setting, one of the
//! command's, or one of these, so that a new one is classified when it is
//! added rather than refused in someone's test run.
//!
//! Every command that talks to Redis applies it (`completions` and `man`
//! read nothing from the environment).

use std::ffi::OsStr;

use leasehold_watchdog::LeaseConfig;

use crate::exit::{self, Failure};

/// The prefix of the command's variables.
pub(crate) const PREFIX: &str = "LEASEHOLD_";

/// Single names of the test suite, benchmarks and examples.
const DEVELOPMENT: [&str; 13] = [
    // The testkit: which server, where its binaries are.
    "LEASEHOLD_SERVER",
    "LEASEHOLD_REDIS_SERVER",
    "LEASEHOLD_REDIS_CLI",
    "LEASEHOLD_FAKETIME_SERVER",
    "LEASEHOLD_LIBFAKETIME",
    "LEASEHOLD_PG_BIN",
    // scripts/test.sh.
    "LEASEHOLD_SECOND_PASS",
    // The `ablation` feature's switches (docs/performance.md).
    "LEASEHOLD_ABLATE",
    // Test binaries: rounds, and a child process's role.
    "LEASEHOLD_LOSS_RUNS",
    "LEASEHOLD_RERUN_ROUNDS",
    "LEASEHOLD_POSTGRES_TEST_HOLDER",
    // examples/prometheus.rs.
    "LEASEHOLD_METRICS_ADDR",
    "LEASEHOLD_SERVE_SECS",
];

/// Prefixes under which every name belongs to one benchmark or test.
const DEVELOPMENT_FAMILIES: [&str; 10] = [
    "LEASEHOLD_BENCH_",
    "LEASEHOLD_PROFILE_",
    "LEASEHOLD_CAMPAIGN_",
    "LEASEHOLD_SOAK_",
    "LEASEHOLD_PROCESSES_",
    "LEASEHOLD_COMPARE_",
    "LEASEHOLD_FLEET_",
    "LEASEHOLD_ROLLING_",
    "LEASEHOLD_TESTKIT_",
    "LEASEHOLD_FENCE_CHILD_",
];

/// Whether `name` is one of the test suite's, benchmarks' or examples'.
fn is_development(name: &OsStr) -> bool {
    name.to_str().is_some_and(|name| {
        DEVELOPMENT.contains(&name)
            || DEVELOPMENT_FAMILIES
                .iter()
                .any(|family| name.starts_with(family))
    })
}

/// The lease settings of the environment; an unknown `LEASEHOLD_` name or
/// a bad value is a configuration failure (78).
pub(crate) fn lease_config() -> Result<LeaseConfig, Failure> {
    LeaseConfig::from_vars(
        PREFIX,
        std::env::vars_os().filter(|(name, _)| !is_development(name)),
    )
    .map_err(|e| Failure::new(exit::CONFIG, e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use leasehold_watchdog::ConfigError;

    use super::*;

    /// Names that look like variables and are not: the benchmarks' statics
    /// named after the lease scripts.
    const NOT_VARIABLES: [&str; 2] = ["LEASEHOLD_ACQUIRE", "LEASEHOLD_RELEASE"];

    /// Marks a line whose `LEASEHOLD_` names are made up to be refused.
    const MADE_UP: &str = "unknown on purpose";

    #[test]
    fn the_test_suites_names_pass_and_others_are_refused() {
        let vars = [
            ("LEASEHOLD_SERVER", "valkey"),
            ("LEASEHOLD_SECOND_PASS", "0"),
            ("LEASEHOLD_BENCH_QUICK", "1"),
            ("LEASEHOLD_KEY", "outer"),
            ("LEASEHOLD_TTL", "45s"),
        ];
        let passed = vars
            .into_iter()
            .filter(|(name, _)| !is_development(OsStr::new(name)));
        let config = LeaseConfig::from_vars(PREFIX, passed).map_err(|e| e.to_string());
        assert!(config.is_ok(), "{config:?}");
        // A development family is a prefix of whole names only.
        assert!(!is_development(OsStr::new("LEASEHOLD_BENCH"))); // unknown on purpose
        let typo = [("LEASEHOLD_SERVERS", "valkey")]; // unknown on purpose
        let refused = LeaseConfig::from_vars(PREFIX, typo);
        assert!(
            matches!(&refused, Err(ConfigError::Unknown { name, .. }) if name == "LEASEHOLD_SERVERS"), // unknown on purpose
            "{refused:?}"
        );
    }

    /// Every `LEASEHOLD_` name in the repository's sources, scripts and
    /// documents is a lease setting, one of the command's, or one of the
    /// development names above: a name added without a place here would
    /// be refused by `leasehold run` wherever it is set.
    #[test]
    fn every_leasehold_name_in_the_repository_has_its_place() -> std::io::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        if !root.join("Cargo.lock").exists() {
            // Built from a package, away from the repository.
            return Ok(());
        }
        let root = root.canonicalize()?;
        let mut files = Vec::new();
        collect(&root, &mut files)?;
        let mut unplaced = Vec::new();
        for file in files {
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            for line in text.lines().filter(|line| !line.contains(MADE_UP)) {
                for name in names(line) {
                    // The library's own judgement: a setting (refused
                    // here only for its empty value) or a command's name
                    // is not `Unknown`.
                    let known = LeaseConfig::from_vars(PREFIX, [(name, "")]);
                    let unknown = matches!(known, Err(ConfigError::Unknown { .. }));
                    if unknown
                        && !is_development(OsStr::new(name))
                        && !NOT_VARIABLES.contains(&name)
                    {
                        unplaced.push(format!(
                            "{name} in {}",
                            file.strip_prefix(&root).unwrap_or(&file).display()
                        ));
                    }
                }
            }
        }
        assert!(
            unplaced.is_empty(),
            "LEASEHOLD_ names with no place in crates/leasehold-cli/src/environment.rs \
             (a setting, LeaseConfig::COMMAND_VARIABLES, or the development names): {unplaced:#?}"
        );
        Ok(())
    }

    /// The whole `LEASEHOLD_*` names in `line`; a name that ends with `_`
    /// is a prefix (`LEASEHOLD_`, `LEASEHOLD_BENCH_`), not a name.
    fn names(line: &str) -> impl Iterator<Item = &str> {
        line.match_indices(PREFIX).filter_map(|(start, _)| {
            let preceded = line[..start]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            let rest = &line[start..];
            let len = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..len];
            (!preceded && !name.ends_with('_')).then_some(name)
        })
    }

    /// The text files of the repository, without build output and git's
    /// own files.
    fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            let name = entry.file_name();
            if entry.file_type()?.is_dir() {
                if name != "target" && name != ".git" {
                    collect(&path, files)?;
                }
            } else if path.extension().is_some_and(|ext| {
                ["rs", "md", "sh", "toml", "yml", "yaml", "lua", "txt"]
                    .iter()
                    .any(|known| ext == *known)
            }) || path.parent().and_then(Path::file_name) == Some(OsStr::new(".ci"))
            {
                files.push(path);
            }
        }
        Ok(())
    }
}
