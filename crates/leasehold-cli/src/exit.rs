//! Exit codes (after sysexits.h) and the failures that lead to them.

use std::process::ExitCode;

use leasehold_redis::RedisBackend;

/// The command line was wrong (sysexits `EX_USAGE`).
pub(crate) const USAGE: u8 = 64;
/// Redis could not be reached or failed (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// A bug or an operating system failure (`EX_SOFTWARE`).
pub(crate) const SOFTWARE: u8 = 70;
/// The completions or manual pages could not be written (`EX_IOERR`).
pub(crate) const IO: u8 = 74;
/// The lease was not acquired within the wait (`EX_TEMPFAIL`: try again later).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// The lease was lost while the command ran; the command was stopped.
pub(crate) const LOST: u8 = 76;
/// The configuration (environment, Redis URL) cannot be used (`EX_CONFIG`).
pub(crate) const CONFIG: u8 = 78;
/// The command could not be executed (as in shells).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in shells).
pub(crate) const NOT_FOUND: u8 = 127;

/// Writes a line to stderr, ignoring a failure: a closed stderr (the reader
/// of a pipe went away) must not make leasehold panic while a command runs
/// under its lease, as `eprintln!` would.
macro_rules! note {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use note;

/// Why leasehold stops before or instead of the command's own exit.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(SOFTWARE, message)
    }

    /// Prints the message and its causes (each once) and gives the exit code.
    pub(crate) fn report(self) -> ExitCode {
        eprintln!("leasehold: {}", self.message);
        ExitCode::from(self.code)
    }
}

/// An error's message followed by those of its sources that it does not
/// already include.
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The Redis URL: the flag, else the environment, else the local default.
pub(crate) fn redis_url(flag: &Option<String>) -> String {
    flag.clone()
        .or_else(|| {
            ["LEASEHOLD_URL", "LEASEHOLD_REDIS_URL", "REDIS_URL"]
                .into_iter()
                .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
        })
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())
}

/// Connects to Redis, telling a bad URL (78) from an unreachable server (69).
pub(crate) async fn connect(
    url: &Option<String>,
    namespace: Option<&str>,
) -> Result<RedisBackend, Failure> {
    let url = redis_url(url);
    let mut builder = RedisBackend::builder(url);
    if let Some(namespace) = namespace {
        builder = builder.namespace(namespace);
    }
    builder.connect().await.map_err(|e| {
        let code = match &e {
            leasehold_redis::ConnectError::Connect { .. } => UNAVAILABLE,
            _ => CONFIG,
        };
        Failure::new(code, chain(&e))
    })
}

/// A backend error during an operation.
pub(crate) fn backend(error: &leasehold_core::BackendError) -> Failure {
    Failure::new(UNAVAILABLE, chain(error))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: inner detail")]
    struct Outer(#[source] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("inner detail")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("could not connect")]
    struct Plain(#[source] Inner);

    #[test]
    fn causes_are_printed_once() {
        assert_eq!(chain(&Outer(Inner)), "outer: inner detail");
        assert_eq!(chain(&Plain(Inner)), "could not connect: inner detail");
    }
}
