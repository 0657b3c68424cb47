//! The errors of the lease vocabulary and of backends.

use std::sync::Arc;
use std::time::Duration;

/// A boxed, shareable cause of a [`BackendError`].
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Invalid input to one of the vocabulary types.
///
/// Each variant names the value that was refused and why, so the message can
/// be shown to whoever wrote the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// A lease key was empty, too long, or contained control characters.
    #[error("invalid lease key {key:?}: {reason}")]
    InvalidKey {
        /// The refused key (cut to its first 64 characters).
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A ttl was outside the accepted range or not a whole number of milliseconds.
    #[error("invalid ttl {value}: {reason}")]
    InvalidTtl {
        /// The refused ttl, written the humantime way.
        value: String,
        /// Why it was refused, with the accepted range.
        reason: String,
    },
    /// A lock-delay was above its ceiling or not a whole number of milliseconds.
    #[error("invalid lock-delay {value}: {reason}")]
    InvalidLockDelay {
        /// The refused lock-delay, written the humantime way.
        value: String,
        /// Why it was refused, with the accepted range.
        reason: String,
    },
    /// A minimum hold was above its ceiling or not a whole number of
    /// milliseconds.
    #[error("invalid minimum hold {value}: {reason}")]
    InvalidHoldAtLeast {
        /// The refused minimum hold, written the humantime way.
        value: String,
        /// Why it was refused, with the accepted range.
        reason: String,
    },
    /// A duration string could not be parsed.
    #[error(
        "invalid duration {value:?}: {reason}; write durations like \"30s\", \"1m 30s\" or \"500ms\""
    )]
    InvalidDuration {
        /// The string that was given.
        value: String,
        /// What the parser said.
        reason: String,
    },
    /// A holder label was too long or contained control characters.
    #[error("invalid holder label {label:?}: {reason}")]
    InvalidLabel {
        /// The refused label (cut to its first 64 characters).
        label: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A semaphore's permit limit was 0 or too large.
    #[error("invalid permit limit {limit}: {reason}")]
    InvalidPermitLimit {
        /// The refused limit.
        limit: u32,
        /// Why it was refused, with the accepted range.
        reason: &'static str,
    },
    /// A scheduled job's name was empty, too long, or had characters
    /// other than ASCII letters, digits, `-`, `_` and `.`.
    #[error("invalid job name {job:?}: {reason}")]
    InvalidJob {
        /// The refused name (cut to its first 64 characters).
        job: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A holder id string was not 32 hexadecimal digits.
    #[error("invalid holder id: expected 32 hexadecimal digits")]
    InvalidHolderId,
    /// The operating system's random number generator failed.
    #[error("the operating system could not supply random bytes for a holder id: {0}")]
    Entropy(String),
}

/// A backend operation that did not produce an outcome.
///
/// Outcomes the server decided (`Held`, `Lost`, `NotHeld`) are never errors;
/// an error means the operation's result is unknown or the input could not be
/// handled. [`BackendError::is_transient`] tells whether retrying may help.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// No reply arrived in time; the operation may or may not have taken effect.
    #[error(
        "{op} on lease {key:?} got no reply within {after:?}; its outcome is unknown (the server may be paused, overloaded or cut off)"
    )]
    Timeout {
        /// The operation (`acquire`, `renew`, `release`, `inspect`).
        op: &'static str,
        /// The lease key.
        key: String,
        /// How long the call waited.
        after: Duration,
    },
    /// The server could not be reached or the connection broke.
    #[error(
        "{op} on lease {key:?} could not reach the server; check that it is running and reachable"
    )]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The lease key.
        key: String,
        /// The transport error.
        #[source]
        source: Cause,
    },
    /// The lease key holds a value of another type than a string.
    #[error(
        "lease key {key:?} holds a value that is not a string (another program uses this key); choose another lease key or delete it"
    )]
    WrongType {
        /// The lease key.
        key: String,
    },
    /// The server replied with something the lease scripts never return.
    #[error("{op} on lease {key:?} got an unexpected reply from the server: {detail}")]
    UnexpectedReply {
        /// The operation.
        op: &'static str,
        /// The lease key.
        key: String,
        /// What was received.
        detail: String,
    },
    /// The server refused the operation.
    #[error("{op} on lease {key:?} was refused by the server: {detail}")]
    Server {
        /// The operation.
        op: &'static str,
        /// The lease key.
        key: String,
        /// The server's error code and message.
        detail: String,
        /// Whether the same call may succeed later (failover, loading, cluster reconfiguration).
        transient: bool,
    },
    /// The holders of a semaphore use another permit limit than this call.
    #[error(
        "semaphore {key:?} is held with a limit of {held} permit(s), not {asked}; every holder of a semaphore must use the same limit (change it once every permit is released)"
    )]
    PermitLimitMismatch {
        /// The semaphore key.
        key: String,
        /// The limit this call asked for.
        asked: u32,
        /// The limit the current holders use.
        held: u32,
    },
    /// The backend cannot perform this operation.
    #[error("{op} on lease {key:?} is not supported by this backend: {reason}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// The lease key.
        key: String,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// The request is not one a backend can take as it is (nothing was
    /// sent).
    #[error("{op} on lease {key:?} was refused before it was sent: {reason}")]
    InvalidRequest {
        /// The operation.
        op: &'static str,
        /// The lease key.
        key: String,
        /// What is wrong with the request.
        reason: &'static str,
    },
}

impl BackendError {
    /// Whether retrying the same operation later may succeed.
    ///
    /// Timeouts, broken connections and server states such as `LOADING`,
    /// `TRYAGAIN` or `CLUSTERDOWN` are transient; a key of the wrong type, a
    /// reply the scripts never return, a permit limit other than the
    /// holders' and an unsupported operation are not.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Unavailable { .. } => true,
            Self::Server { transient, .. } => *transient,
            Self::WrongType { .. }
            | Self::UnexpectedReply { .. }
            | Self::PermitLimitMismatch { .. }
            | Self::Unsupported { .. }
            | Self::InvalidRequest { .. } => false,
        }
    }

    /// The lease key the failed operation was about.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Self::Timeout { key, .. }
            | Self::Unavailable { key, .. }
            | Self::WrongType { key }
            | Self::UnexpectedReply { key, .. }
            | Self::Server { key, .. }
            | Self::PermitLimitMismatch { key, .. }
            | Self::Unsupported { key, .. }
            | Self::InvalidRequest { key, .. } => key,
        }
    }
}

/// Cuts user input to a length that is safe to put in an error message.
pub(crate) fn excerpt(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut cut: String = s.chars().take(MAX).collect();
        cut.push('…');
        cut
    }
}
