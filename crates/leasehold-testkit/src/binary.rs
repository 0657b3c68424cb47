//! Finding the server binary (`redis-server` or `valkey-server`) and the
//! command-line client (`redis-cli` or `valkey-cli`).
//!
//! One setting, [`SERVER_ENV`] (`LEASEHOLD_SERVER`), chooses the server the
//! whole suite runs on; the two override variables name a binary directly
//! and win over it.

use std::env;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::TestkitError;

/// Environment variable that chooses the server the testkit starts:
/// `redis` (the default, also when empty) or `valkey`.
pub const SERVER_ENV: &str = "LEASEHOLD_SERVER";

/// Environment variable that overrides where the server binary is looked
/// for, whatever [`SERVER_ENV`] says.
///
/// A value containing a `/` is used as a path as is; a bare name (for
/// example `redis-server-7.2`) is searched on `PATH`. An empty value is
/// ignored.
pub const REDIS_SERVER_ENV: &str = "LEASEHOLD_REDIS_SERVER";

/// Environment variable that overrides where the command-line client is
/// looked for, with the same rules as [`REDIS_SERVER_ENV`].
pub const REDIS_CLI_ENV: &str = "LEASEHOLD_REDIS_CLI";

/// The server family the testkit runs, chosen by [`SERVER_ENV`].
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    /// `redis-server` and `redis-cli`.
    Redis,
    /// `valkey-server` and `valkey-cli`.
    Valkey,
}

impl ServerKind {
    /// The kind [`SERVER_ENV`] names; [`ServerKind::Redis`] when it is unset
    /// or empty.
    ///
    /// # Errors
    ///
    /// [`TestkitError::UnknownServer`] for any other value than `redis` or
    /// `valkey` (in any case), so that a typo does not silently run the
    /// suite on the default server.
    pub fn from_env() -> Result<Self, TestkitError> {
        Self::parse(env::var_os(SERVER_ENV))
    }

    fn parse(value: Option<OsString>) -> Result<Self, TestkitError> {
        let Some(value) = value.filter(|v| !v.is_empty()) else {
            return Ok(Self::Redis);
        };
        match value.to_str().map(str::to_ascii_lowercase).as_deref() {
            Some("redis") => Ok(Self::Redis),
            Some("valkey") => Ok(Self::Valkey),
            _ => Err(TestkitError::UnknownServer {
                value: value.to_string_lossy().into_owned(),
            }),
        }
    }

    /// The name of the server binary searched on `PATH`.
    #[must_use]
    pub fn server_binary_name(self) -> &'static str {
        match self {
            Self::Redis => "redis-server",
            Self::Valkey => "valkey-server",
        }
    }

    /// The name of the command-line client searched on `PATH`.
    #[must_use]
    pub fn cli_binary_name(self) -> &'static str {
        match self {
            Self::Redis => "redis-cli",
            Self::Valkey => "valkey-cli",
        }
    }

    fn server_missing(self) -> TestkitError {
        match self {
            Self::Redis => TestkitError::NotInstalled,
            Self::Valkey => TestkitError::ValkeyNotInstalled {
                binary: "valkey-server",
            },
        }
    }

    fn cli_missing(self) -> TestkitError {
        match self {
            Self::Redis => TestkitError::CliNotInstalled,
            Self::Valkey => TestkitError::ValkeyNotInstalled {
                binary: "valkey-cli",
            },
        }
    }
}

/// Locates the server executable: the one [`REDIS_SERVER_ENV`]
/// (`LEASEHOLD_REDIS_SERVER`) names when it is set and non-empty, without
/// falling back to `PATH` if it points nowhere; otherwise the binary of the
/// [`ServerKind`] that [`SERVER_ENV`] (`LEASEHOLD_SERVER`) chooses
/// (`redis-server` by default, `valkey-server`), searched on `PATH`.
///
/// # Errors
///
/// [`TestkitError::NotInstalled`] (Redis) or
/// [`TestkitError::ValkeyNotInstalled`], whose message explains how to
/// install it; [`TestkitError::UnknownServer`] for a bad `LEASEHOLD_SERVER`.
pub fn redis_server_binary() -> Result<PathBuf, TestkitError> {
    find(
        ServerKind::from_env()?,
        env::var_os(REDIS_SERVER_ENV),
        env::var_os("PATH"),
    )
}

/// Locates the command-line client, which creates clusters
/// (`redis-cli --cluster create`; `valkey-cli` takes the same arguments).
///
/// Honours [`REDIS_CLI_ENV`] (`LEASEHOLD_REDIS_CLI`) and then [`SERVER_ENV`]
/// as [`redis_server_binary`] honours its variables.
///
/// # Errors
///
/// [`TestkitError::CliNotInstalled`] (Redis) or
/// [`TestkitError::ValkeyNotInstalled`], whose message explains how to
/// install it; [`TestkitError::UnknownServer`] for a bad `LEASEHOLD_SERVER`.
pub fn redis_cli_binary() -> Result<PathBuf, TestkitError> {
    let kind = ServerKind::from_env()?;
    locate(
        kind.cli_binary_name(),
        env::var_os(REDIS_CLI_ENV),
        env::var_os("PATH"),
    )
    .ok_or_else(|| kind.cli_missing())
}

/// The logic of [`redis_server_binary`] with the environment passed in.
pub(crate) fn find(
    kind: ServerKind,
    override_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, TestkitError> {
    locate(kind.server_binary_name(), override_value, path_var).ok_or_else(|| kind.server_missing())
}

/// Finds `default_name`, or the override, as described on [`redis_server_binary`].
fn locate(
    default_name: &str,
    override_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Option<PathBuf> {
    let name = match override_value.filter(|value| !value.is_empty()) {
        Some(value) => {
            let candidate = PathBuf::from(&value);
            if candidate.components().count() > 1 || candidate.is_absolute() {
                return is_executable(&candidate).then_some(candidate);
            }
            value
        }
        None => OsString::from(default_name),
    };
    search_path(&name, path_var.as_deref())
}

fn search_path(name: &OsStr, path_var: Option<&OsStr>) -> Option<PathBuf> {
    env::split_paths(path_var?)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Environment variable that `scripts/test.sh --valkey` sets for its second
/// pass: tests whose subject does not depend on the server family (a
/// scheduling fleet, a clock under libfaketime, a minute of batching) and
/// that already ran on the first pass skip themselves, to keep the two
/// passes within CI's budget. Any other value than `1` is ignored.
pub const SECOND_PASS_ENV: &str = "LEASEHOLD_SECOND_PASS";

/// Whether this is the second pass of the suite ([`SECOND_PASS_ENV`]), in
/// which `test` (a server-independent long test) is skipped. Says so on
/// stderr when it is, so that a skipped run is visible in the output.
#[must_use]
pub fn skip_on_second_pass(test: &str) -> bool {
    let skip = env::var(SECOND_PASS_ENV).is_ok_and(|v| v == "1");
    if skip {
        eprintln!(
            "{test}: skipped on the second pass ({SECOND_PASS_ENV}=1); it ran on the first, and its subject does not depend on the server family"
        );
    }
    skip
}

#[cfg(test)]
mod tests {
    use super::*;

    const HINT: &str = "redis-server was not found on PATH; install it with \
        `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`, \
        or set LEASEHOLD_REDIS_SERVER";

    /// A directory holding executable stand-ins named `names`.
    fn fake_bin(names: &[&str]) -> Result<tempfile::TempDir, TestkitError> {
        let dir = tempfile::tempdir()?;
        for name in names {
            let fake = dir.path().join(name);
            std::fs::write(&fake, "#!/bin/sh\n")?;
            std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(dir)
    }

    #[test]
    fn the_setting_chooses_the_server_family() -> Result<(), TestkitError> {
        assert_eq!(ServerKind::parse(None)?, ServerKind::Redis);
        assert_eq!(ServerKind::parse(Some("".into()))?, ServerKind::Redis);
        assert_eq!(ServerKind::parse(Some("redis".into()))?, ServerKind::Redis);
        assert_eq!(
            ServerKind::parse(Some("valkey".into()))?,
            ServerKind::Valkey
        );
        assert_eq!(
            ServerKind::parse(Some("Valkey".into()))?,
            ServerKind::Valkey
        );
        let err = ServerKind::parse(Some("valkey-server".into()));
        let Err(err @ TestkitError::UnknownServer { .. }) = err else {
            panic!("expected UnknownServer, got {err:?}");
        };
        assert!(err.to_string().contains("\"valkey-server\""), "{err}");
        Ok(())
    }

    #[test]
    fn each_family_finds_its_own_binaries() -> Result<(), TestkitError> {
        let dir = fake_bin(&["redis-server", "redis-cli", "valkey-server", "valkey-cli"])?;
        let path = || Some(dir.path().as_os_str().to_owned());
        let found = find(ServerKind::Valkey, None, path())?;
        assert_eq!(found, dir.path().join("valkey-server"));
        let found = find(ServerKind::Redis, None, path())?;
        assert_eq!(found, dir.path().join("redis-server"));
        let cli = ServerKind::Valkey.cli_binary_name();
        assert_eq!(
            locate(cli, None, path()),
            Some(dir.path().join("valkey-cli"))
        );
        // The override wins over the family.
        let found = find(ServerKind::Valkey, Some("redis-server".into()), path())?;
        assert_eq!(found, dir.path().join("redis-server"));
        Ok(())
    }

    #[test]
    fn a_missing_valkey_says_how_to_install_it() -> Result<(), TestkitError> {
        let dir = fake_bin(&["redis-server", "redis-cli"])?;
        let err = find(ServerKind::Valkey, None, Some(dir.path().into()));
        let Err(err @ TestkitError::ValkeyNotInstalled { binary }) = err else {
            panic!("expected ValkeyNotInstalled, got {err:?}");
        };
        assert_eq!(binary, "valkey-server");
        let message = err.to_string();
        assert!(message.contains("bookworm-backports"), "{message}");
        assert!(message.contains("--valkey"), "{message}");
        Ok(())
    }

    #[test]
    fn nonexistent_override_is_not_installed() {
        let err = find(
            ServerKind::Redis,
            Some("/nonexistent".into()),
            Some("/usr/bin:/bin".into()),
        );
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
        let message = err.map(|_| String::new()).unwrap_or_else(|e| e.to_string());
        assert_eq!(message, HINT);
    }

    #[test]
    fn missing_cli_is_reported_as_such() {
        assert_eq!(locate("redis-cli", None, Some("".into())), None);
        let message = TestkitError::CliNotInstalled.to_string();
        assert!(message.contains("redis-tools"), "{message}");
    }

    #[test]
    fn empty_path_is_not_installed() {
        let err = find(ServerKind::Redis, None, Some("".into()));
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
        let err = find(ServerKind::Redis, None, None);
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
    }

    #[test]
    fn directory_is_not_an_executable() {
        let err = find(ServerKind::Redis, Some("/tmp".into()), None);
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
    }

    #[test]
    fn bare_override_name_is_searched_on_path() -> Result<(), TestkitError> {
        let dir = fake_bin(&["my-redis"])?;
        let fake = dir.path().join("my-redis");
        let found = find(
            ServerKind::Redis,
            Some("my-redis".into()),
            Some(dir.path().into()),
        )?;
        assert_eq!(found, fake);
        let found = find(ServerKind::Redis, Some(fake.clone().into()), None)?;
        assert_eq!(found, fake);
        Ok(())
    }

    #[test]
    fn non_executable_file_is_skipped() -> Result<(), TestkitError> {
        let dir = tempfile::tempdir()?;
        let fake = dir.path().join("redis-server");
        std::fs::write(&fake, "not a program")?;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o644))?;
        let err = find(ServerKind::Redis, None, Some(dir.path().into()));
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
        Ok(())
    }
}
