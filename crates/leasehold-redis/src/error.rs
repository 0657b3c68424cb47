//! The errors of setting up a Redis backend, and URL redaction.

use std::fmt;

/// A Redis backend could not be set up.
///
/// Errors of lease operations on a running backend are
/// [`leasehold_core::BackendError`]s. No message or `Debug` output of this
/// type contains a password: URLs are shown through [`redact`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The connection URL could not be used.
    #[error(
        "invalid Redis URL {url_redacted:?}: {reason}; write it as redis://[[user]:password@]host[:port][/db], rediss://… for TLS, or redis+unix:///path/to/socket"
    )]
    InvalidUrl {
        /// The URL with its password replaced by `***`.
        url_redacted: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No connection could be made to the server.
    #[error(
        "could not connect to Redis at {url_redacted}; check that the server is running and reachable from here, and that the credentials and TLS settings are right"
    )]
    Connect {
        /// The URL with its password replaced by `***`.
        url_redacted: String,
        /// Why the connection failed (a timeout is an I/O error of kind `TimedOut`).
        #[source]
        source: redis::RedisError,
    },
    /// Too few Redlock masters could be reached to ever form a majority.
    #[error(
        "only {reached} of {total} Redlock masters could be reached, and {needed} are needed; check that a majority of the masters is running and reachable"
    )]
    TooFewMasters {
        /// How many masters answered.
        reached: usize,
        /// How many must answer: a majority.
        needed: usize,
        /// How many masters were given.
        total: usize,
        /// The first master's connection failure.
        #[source]
        source: Box<ConnectError>,
    },
    /// The server lacks a command or a version the library needs (checked
    /// once at connect, on every server of the topology).
    #[error(
        "{server} at {url_redacted} cannot hold leases: {missing}; leasehold needs Redis 6.0 or later (7.0 for Cluster) or Valkey, with the commands its scripts call left enabled"
    )]
    UnsupportedServer {
        /// The server (or cluster node) with its password replaced by `***`.
        url_redacted: String,
        /// The server's name and version as it reported them (`HELLO`),
        /// e.g. `redis 7.0.15`.
        server: String,
        /// What it lacks.
        missing: Missing,
    },
    /// A builder setting is out of range.
    #[error("invalid {field}: {reason}")]
    InvalidConfig {
        /// The builder setting (`namespace`, `op_timeout`, `connect_timeout`).
        field: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The URL names a topology whose Cargo feature was left out of this
    /// build (`cluster` for `redis+cluster://`, `sentinel` for
    /// `redis+sentinel://`).
    #[error(
        "Redis URL {url_redacted:?} names a {topology}, which needs the `{feature}` feature of leasehold-redis (and of leasehold), left out of this build; enable it in Cargo.toml"
    )]
    FeatureDisabled {
        /// The URL with its password replaced by `***`.
        url_redacted: String,
        /// The topology the URL names: `"Redis Cluster"` or `"Sentinel-monitored master"`.
        topology: &'static str,
        /// The Cargo feature it needs: `"cluster"` or `"sentinel"`.
        feature: &'static str,
    },
}

/// What a refused server lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Missing {
    /// A command the scripts or the connection call is not known to the
    /// server (renamed or disabled in its configuration, or too old).
    Command(String),
    /// The server is older than the first version with a feature the
    /// library needs.
    Version {
        /// The first version with the feature, e.g. `"Redis 7.0"`.
        needed: &'static str,
        /// The feature.
        feature: &'static str,
    },
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Command(name) => write!(
                f,
                "it has no {name} command (renamed or disabled in its configuration?), which leasehold calls"
            ),
            Self::Version { needed, feature } => {
                write!(f, "{feature} needs {needed} or later")
            }
        }
    }
}

const MASK: &str = "***";

/// Replaces the password in a connection URL with `***`, keeping the rest.
///
/// It works on malformed input too, so that any URL can go into a message:
/// the user info is everything between `://` (or the start) and the last
/// `@`, and its password is what follows its first `:`. The `pass` and
/// `password` query parameters (used by `redis+unix://` URLs) are masked as
/// well. It errs on the side of masking too much.
///
/// ```
/// use leasehold_redis::redact;
/// assert_eq!(redact("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// assert_eq!(redact("redis+unix:///run/redis.sock?pass=s3cret"), "redis+unix:///run/redis.sock?pass=***");
/// assert_eq!(redact("redis://db:6379"), "redis://db:6379");
/// ```
#[must_use]
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let mut out = String::with_capacity(url.len());
    let (head, rest) = url.split_at(start);
    out.push_str(head);
    let rest = match rest.rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            match userinfo.find(':') {
                Some(colon) => {
                    out.push_str(&userinfo[..=colon]);
                    out.push_str(MASK);
                }
                None => out.push_str(userinfo),
            }
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match rest.find('?') {
        Some(q) => {
            out.push_str(&rest[..=q]);
            let (query, fragment) = match rest[q + 1..].find('#') {
                Some(h) => rest[q + 1..].split_at(h),
                None => (&rest[q + 1..], ""),
            };
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) if is_secret_param(name) => format!("{name}={MASK}"),
                    _ => pair.to_owned(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
            out.push_str(fragment);
        }
        None => out.push_str(rest),
    }
    out
}

fn is_secret_param(name: &str) -> bool {
    name.eq_ignore_ascii_case("pass") || name.eq_ignore_ascii_case("password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords_and_nothing_else() {
        let cases = [
            ("redis://:pw@", "redis://:***@"),
            (
                "redis://:s3cret@localhost:6379",
                "redis://:***@localhost:6379",
            ),
            (
                "rediss://user:s3cret@db.example:6380/2",
                "rediss://user:***@db.example:6380/2",
            ),
            ("redis://user@db:6379", "redis://user@db:6379"),
            (
                "redis://db:6379/0?protocol=resp3",
                "redis://db:6379/0?protocol=resp3",
            ),
            ("redis://:p@ss:w@rd@db", "redis://:***@db"),
            ("redis://:p/ss@db", "redis://:***@db"),
            (
                "unix:///tmp/r.sock?db=1&pass=s3cret&user=u",
                "unix:///tmp/r.sock?db=1&pass=***&user=u",
            ),
            (
                "redis+unix:///tmp/r.sock?PASSWORD=s3cret#x",
                "redis+unix:///tmp/r.sock?PASSWORD=***#x",
            ),
            (":s3cret@db:6379", ":***@db:6379"),
            ("not a url", "not a url"),
            ("", ""),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
        }
    }

    #[test]
    fn messages_never_show_the_password() {
        let url = "redis://admin:hunter2@db:99999";
        let err = ConnectError::InvalidUrl {
            url_redacted: redact(url),
            reason: "invalid port number".to_owned(),
        };
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("admin:***@db"), "{shown}");
    }
}
