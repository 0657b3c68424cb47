//! Finding the `redis-server` binary.

use std::env;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::TestkitError;

/// Environment variable that overrides where `redis-server` is looked for.
///
/// A value containing a `/` is used as a path as is; a bare name (for
/// example `redis-server-7.2`) is searched on `PATH`. An empty value is
/// ignored.
pub const REDIS_SERVER_ENV: &str = "LEASEHOLD_REDIS_SERVER";

/// Locates the `redis-server` executable.
///
/// Honours [`REDIS_SERVER_ENV`] (`LEASEHOLD_REDIS_SERVER`) when it is set and
/// non-empty, without falling back to `PATH` if it points nowhere; otherwise
/// searches `PATH` for `redis-server`.
///
/// # Errors
///
/// [`TestkitError::NotInstalled`], whose message explains how to install it.
pub fn redis_server_binary() -> Result<PathBuf, TestkitError> {
    find(env::var_os(REDIS_SERVER_ENV), env::var_os("PATH"))
}

/// Environment variable that overrides where `redis-cli` is looked for,
/// with the same rules as [`REDIS_SERVER_ENV`].
pub const REDIS_CLI_ENV: &str = "LEASEHOLD_REDIS_CLI";

/// Locates the `redis-cli` executable, which creates clusters
/// (`redis-cli --cluster create`).
///
/// Honours [`REDIS_CLI_ENV`] (`LEASEHOLD_REDIS_CLI`) as
/// [`redis_server_binary`] honours its variable; otherwise searches `PATH`.
///
/// # Errors
///
/// [`TestkitError::CliNotInstalled`], whose message explains how to install it.
pub fn redis_cli_binary() -> Result<PathBuf, TestkitError> {
    locate("redis-cli", env::var_os(REDIS_CLI_ENV), env::var_os("PATH"))
        .ok_or(TestkitError::CliNotInstalled)
}

/// The logic of [`redis_server_binary`] with the environment passed in.
pub(crate) fn find(
    override_value: Option<OsString>,
    path_var: Option<OsString>,
) -> Result<PathBuf, TestkitError> {
    locate("redis-server", override_value, path_var).ok_or(TestkitError::NotInstalled)
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

#[cfg(test)]
mod tests {
    use super::*;

    const HINT: &str = "redis-server was not found on PATH; install it with \
        `apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis`, \
        or set LEASEHOLD_REDIS_SERVER";

    #[test]
    fn nonexistent_override_is_not_installed() {
        let err = find(Some("/nonexistent".into()), Some("/usr/bin:/bin".into()));
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
        let err = find(None, Some("".into()));
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
        let err = find(None, None);
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
    }

    #[test]
    fn directory_is_not_an_executable() {
        let err = find(Some("/tmp".into()), None);
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
    }

    #[test]
    fn bare_override_name_is_searched_on_path() -> Result<(), TestkitError> {
        let dir = tempfile::tempdir()?;
        let fake = dir.path().join("my-redis");
        std::fs::write(&fake, "#!/bin/sh\n")?;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))?;
        let found = find(Some("my-redis".into()), Some(dir.path().into()))?;
        assert_eq!(found, fake);
        let found = find(Some(fake.clone().into()), None)?;
        assert_eq!(found, fake);
        Ok(())
    }

    #[test]
    fn non_executable_file_is_skipped() -> Result<(), TestkitError> {
        let dir = tempfile::tempdir()?;
        let fake = dir.path().join("redis-server");
        std::fs::write(&fake, "not a program")?;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o644))?;
        let err = find(None, Some(dir.path().into()));
        assert!(matches!(err, Err(TestkitError::NotInstalled)), "{err:?}");
        Ok(())
    }
}
