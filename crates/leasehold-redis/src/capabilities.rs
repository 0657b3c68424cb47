//! What a server must offer, checked once at connect (and behind Sentinel
//! on each master resolved later, `connection.rs`): its name and version
//! (`HELLO`, without arguments, so that the connection keeps its protocol)
//! and the commands the scripts call (`COMMAND INFO`), both sent at once.
//!
//! A server that lacks one is refused with [`ConnectError::UnsupportedServer`], naming
//! the server, its version and what is missing, instead of failing with a
//! script error at the first renewal. What the library does without (GETEX,
//! which the scripts replace by GET; MGET, which `renew.lua` replaces by a
//! read per lease; client tracking, which is then off) is not required.
//!
//! The minimum versions, from what the code uses:
//! - Redis 6.0 (any topology): the release notices and client tracking
//!   need RESP3 pushes, and `grant.lua` writes after `TIME`, which needs
//!   scripts replicated by their effects (the default since 5.0).
//! - Redis 7.0 for Cluster: sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`,
//!   `PUBSUB SHARDNUMSUB`) carries the release notices there.
//! - Valkey: every release (7.2 on) has both.
//!
//! A server or ACL that refuses `HELLO` or `COMMAND` cannot be judged: it
//! is accepted with a warning, and a missing command then shows at first
//! use, as before.

use std::fmt;

use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tracing::warn;

use crate::error::{ConnectError, Missing};
use crate::reply::Fields;

/// The name and version a server reported at connect (`HELLO`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    name: String,
    version: String,
}

impl ServerInfo {
    /// The server's name: `redis`, `valkey`, or what another server says.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's own version (for Valkey, Valkey's version, not the
    /// Redis version it reports for compatibility).
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }
}

impl fmt::Display for ServerInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.version)
    }
}

/// The commands every topology calls: the scripts' own (`redis.call`),
/// and the commands that send them. `GETEX` and `MGET` are left out:
/// the scripts fall back to `GET` without them.
const COMMANDS: &[&str] = &[
    "EVALSHA", "SCRIPT", "GET", "SET", "DEL", "PEXPIRE", "PTTL", "TIME", "EXISTS", "PUBLISH",
    "PUBSUB",
];
/// What a cluster calls besides: sharded pub/sub for the release notices.
const CLUSTER_COMMANDS: &[&str] = &["SPUBLISH", "SSUBSCRIBE"];

/// What the backend being connected will call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Needs {
    pub(crate) cluster: bool,
    /// `wait_for_replicas` is set: `WAIT` follows each write.
    pub(crate) wait: bool,
}

impl Needs {
    fn commands(self) -> Vec<&'static str> {
        let mut commands = COMMANDS.to_vec();
        if self.cluster {
            commands.extend_from_slice(CLUSTER_COMMANDS);
        }
        if self.wait {
            commands.push("WAIT");
        }
        commands
    }

    /// `HELLO` (name and version, in the connection's own protocol) and
    /// `COMMAND INFO` for every command needed, to send together.
    pub(crate) fn probes(self) -> (Cmd, Cmd) {
        let mut info = redis::cmd("COMMAND");
        info.arg("INFO").arg(self.commands());
        (redis::cmd("HELLO"), info)
    }

    /// Judges one server by its replies to [`probes`](Self::probes).
    /// `Ok(None)` when it could not be judged (see the module's text).
    pub(crate) fn judge(
        self,
        hello: Result<Value, RedisError>,
        info: Result<Value, RedisError>,
        shown: &str,
    ) -> Result<Option<ServerInfo>, ConnectError> {
        let refuse = |server: String, missing: Missing| ConnectError::UnsupportedServer {
            url_redacted: shown.to_owned(),
            server,
            missing,
        };
        let server = match hello {
            Ok(reply) => server_info(&reply),
            // Before Redis 6.0 there is no HELLO, and no RESP3.
            Err(err) if is_unknown_command(&err) => {
                return Err(refuse(
                    "a server without HELLO (before Redis 6.0)".to_owned(),
                    Missing::Version {
                        needed: "Redis 6.0",
                        feature: "RESP3 (release notices, client tracking)",
                    },
                ));
            }
            Err(err) => {
                warn!(server = shown, error = %err, "the server did not tell its name and version (HELLO); it is not checked");
                None
            }
        };
        let shown_server = server.as_ref().map_or_else(
            || "a server of unknown version".to_owned(),
            |s| s.to_string(),
        );
        if let Some(info) = &server
            && let Some(missing) = self.too_old(info)
        {
            return Err(refuse(shown_server, missing));
        }
        match info {
            Ok(Value::Array(entries)) => {
                let commands = self.commands();
                if let Some(name) = commands
                    .iter()
                    .zip(entries.iter().map(Some).chain(std::iter::repeat(None)))
                    .find_map(|(name, entry)| {
                        matches!(entry, None | Some(Value::Nil)).then_some(name)
                    })
                {
                    return Err(refuse(shown_server, Missing::Command((*name).to_owned())));
                }
            }
            Ok(other) => {
                warn!(server = shown, reply = ?other, "COMMAND INFO gave an unexpected reply; the commands are not checked");
            }
            Err(err) => {
                warn!(server = shown, error = %err, "the server refused COMMAND INFO; the commands are not checked");
            }
        }
        Ok(server)
    }

    /// What `server` lacks for its version, if anything.
    fn too_old(self, server: &ServerInfo) -> Option<Missing> {
        // Every Valkey release has what Redis 7.0 has.
        if server.name != "redis" {
            return None;
        }
        let version = parse_version(&server.version)?;
        if self.cluster && version < (7, 0) {
            return Some(Missing::Version {
                needed: "Redis 7.0",
                feature: "sharded pub/sub (release notices on a cluster)",
            });
        }
        if version < (6, 0) {
            return Some(Missing::Version {
                needed: "Redis 6.0",
                feature: "RESP3 (release notices, client tracking)",
            });
        }
        None
    }
}

fn is_unknown_command(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && err
            .to_string()
            .to_ascii_lowercase()
            .contains("unknown command")
}

/// The major and minor version of `7.0.15`.
fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => Some((major, minor)),
        _ => None,
    }
}

/// `server` and `version` from a `HELLO` reply: a map in RESP3, a flat
/// list of names and values in RESP2.
fn server_info(reply: &Value) -> Option<ServerInfo> {
    let fields = Fields::of(reply)?;
    Some(ServerInfo {
        name: fields.get("server")?.to_owned(),
        version: fields.get("version")?.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn hello(name: &str, version: &str) -> Value {
        Value::Map(vec![
            (bulk("server"), bulk(name)),
            (bulk("version"), bulk(version)),
            (bulk("proto"), Value::Int(3)),
        ])
    }

    fn known(needs: Needs) -> Value {
        Value::Array(
            needs
                .commands()
                .iter()
                .map(|_| Value::Array(vec![]))
                .collect(),
        )
    }

    const STANDALONE: Needs = Needs {
        cluster: false,
        wait: false,
    };
    const CLUSTER: Needs = Needs {
        cluster: true,
        wait: false,
    };

    #[test]
    fn versions_below_the_minimum_are_refused() {
        let judge = |needs: Needs, name: &str, version: &str| {
            needs.judge(Ok(hello(name, version)), Ok(known(needs)), "redis://db")
        };
        let err = judge(CLUSTER, "redis", "6.2.14").expect_err("6.2 has no sharded pub/sub");
        let message = err.to_string();
        assert!(message.contains("redis 6.2.14"), "{message}");
        assert!(message.contains("Redis 7.0"), "{message}");
        assert!(judge(STANDALONE, "redis", "6.2.14").is_ok());
        assert!(judge(STANDALONE, "redis", "5.0.7").is_err());
        assert!(judge(CLUSTER, "redis", "7.0.15").is_ok());
        assert!(judge(CLUSTER, "valkey", "8.0.1").is_ok());
        assert!(judge(STANDALONE, "redis", "10.1").is_ok());
    }

    #[test]
    fn a_missing_command_is_named() {
        let needs = Needs {
            cluster: true,
            wait: true,
        };
        let mut entries = match known(needs) {
            Value::Array(entries) => entries,
            _ => unreachable!(),
        };
        let at = needs.commands().iter().position(|c| *c == "WAIT");
        entries[at.expect("WAIT is needed")] = Value::Nil;
        let err = needs
            .judge(
                Ok(hello("valkey", "8.0.1")),
                Ok(Value::Array(entries)),
                "redis://db",
            )
            .expect_err("WAIT is missing");
        assert!(
            matches!(&err, ConnectError::UnsupportedServer { missing: Missing::Command(c), .. } if c == "WAIT"),
            "{err:?}"
        );
        assert!(err.to_string().contains("valkey 8.0.1"), "{err}");
    }

    #[test]
    fn a_server_that_cannot_be_judged_is_accepted() {
        let noperm =
            RedisError::from((ErrorKind::Server(ServerErrorKind::NoPerm), "no permission"));
        let judged = STANDALONE.judge(Err(noperm), Ok(known(STANDALONE)), "redis://db");
        assert!(matches!(judged, Ok(None)), "{judged:?}");
    }

    /// A server's own error reply, as the client reads it off the wire.
    fn server_error(wire: &[u8]) -> RedisError {
        match redis::parse_redis_value(wire) {
            Ok(Value::ServerError(e)) => RedisError::from(e),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    #[test]
    fn a_server_without_hello_is_refused_as_one_before_6() {
        let unknown = server_error(b"-ERR unknown command 'HELLO', with args beginning with: \r\n");
        let err = STANDALONE
            .judge(Err(unknown), Ok(known(STANDALONE)), "redis://db")
            .expect_err("no HELLO: before Redis 6.0");
        assert!(
            matches!(
                &err,
                ConnectError::UnsupportedServer {
                    missing: Missing::Version {
                        needed: "Redis 6.0",
                        ..
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        // Any other refusal of HELLO, an error reply of the same kind
        // included, leaves the server unjudged rather than refused.
        let other = server_error(b"-ERR Protocol error: something else\r\n");
        let judged = STANDALONE.judge(Err(other), Ok(known(STANDALONE)), "redis://db");
        assert!(matches!(judged, Ok(None)), "{judged:?}");
        let io = RedisError::from(std::io::Error::other("unknown command on the wire"));
        let judged = STANDALONE.judge(Err(io), Ok(known(STANDALONE)), "redis://db");
        assert!(matches!(judged, Ok(None)), "{judged:?}");
    }

    #[test]
    fn the_minimum_versions_themselves_are_accepted() {
        let judge = |needs: Needs, version: &str| {
            needs.judge(Ok(hello("redis", version)), Ok(known(needs)), "redis://db")
        };
        assert!(judge(STANDALONE, "6.0.0").is_ok());
        assert!(judge(CLUSTER, "7.0.0").is_ok());
        assert!(judge(STANDALONE, "5.9.9").is_err());
        assert!(judge(CLUSTER, "6.9.9").is_err());
    }

    #[test]
    fn hello_fields_as_status_or_verbatim_strings_are_read() {
        let reply = Value::Map(vec![
            (
                Value::SimpleString("server".into()),
                Value::SimpleString("redis".into()),
            ),
            (
                bulk("version"),
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: "7.2.4".into(),
                },
            ),
        ]);
        let info = server_info(&reply).expect("a server and a version");
        assert_eq!((info.name(), info.version()), ("redis", "7.2.4"));
    }

    #[test]
    fn resp2_hello_replies_are_read_too() {
        let reply = Value::Array(vec![
            bulk("server"),
            bulk("redis"),
            bulk("version"),
            bulk("7.0.15"),
        ]);
        let info = server_info(&reply).expect("a server and a version");
        assert_eq!((info.name(), info.version()), ("redis", "7.0.15"));
    }
}
