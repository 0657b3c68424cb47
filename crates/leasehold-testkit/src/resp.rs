//! One command over a short-lived blocking connection, through the `redis`
//! crate's synchronous client, and the reply rendered as text.
//!
//! The testkit talks to servers it may have paused, killed or left loading
//! a file, so every connection carries the caller's timeout on connect, on
//! its setup and on each read and write, and is dropped after one use: a
//! reply that arrives late is never taken for the answer to a later request.

use std::error::Error as StdError;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, RedisError};

pub(crate) use redis::Value;

use crate::TestkitError;

/// What a timeout while connecting waited for.
pub(crate) const CONNECTING: &str = "a connection to redis";
/// What a timeout after the command was sent waited for.
pub(crate) const REPLYING: &str = "a reply from redis";

/// Connects to `addr`, authenticating with `password` when given. `timeout`
/// bounds the connect, then every read and write.
///
/// The client sends nothing of its own (no `CLIENT SETINFO`), so a server
/// that does not know a command, such as a sentinel, answers like any
/// other. `AUTH` is sent here rather than by the client's handshake, which
/// would replace the server's refusal (`WRONGPASS ...`) with a message of
/// its own.
pub(crate) fn connect(
    addr: SocketAddr,
    password: Option<&str>,
    timeout: Duration,
) -> Result<redis::Connection, RedisError> {
    let info = ConnectionAddr::Tcp(addr.ip().to_string(), addr.port())
        .into_connection_info()?
        .set_redis_settings(RedisConnectionInfo::default().set_skip_set_lib_name());
    let mut connection = redis::Client::open(info)?.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    if let Some(password) = password {
        redis::cmd("AUTH")
            .arg(password)
            .query::<()>(&mut connection)?;
    }
    Ok(connection)
}

/// Builds the command `args[0]` with the remaining arguments.
pub(crate) fn command(args: &[&str]) -> Result<redis::Cmd, TestkitError> {
    let (name, rest) = args
        .split_first()
        .ok_or_else(|| TestkitError::Protocol("no command given".to_owned()))?;
    let mut command = redis::cmd(name);
    command.arg(rest);
    Ok(command)
}

/// Renders a reply as text: simple strings, integers and bulk strings as
/// they are, a nil as `(nil)`, arrays one element per line (an empty one as
/// `(empty array)`, error elements as `(error) CODE DETAIL`).
pub(crate) fn render(reply: Value) -> String {
    let mut lines = Vec::new();
    render_into(reply, &mut lines);
    lines.join("\n")
}

fn render_into(reply: Value, lines: &mut Vec<String>) {
    match reply {
        Value::Nil => lines.push("(nil)".to_owned()),
        Value::Okay => lines.push("OK".to_owned()),
        Value::SimpleString(text) => lines.push(text),
        Value::Int(n) => lines.push(n.to_string()),
        Value::BulkString(bytes) => lines.push(String::from_utf8_lossy(&bytes).into_owned()),
        Value::Array(items) if items.is_empty() => lines.push("(empty array)".to_owned()),
        Value::Array(items) => items.into_iter().for_each(|item| render_into(item, lines)),
        Value::ServerError(error) => lines.push(format!(
            "(error) {}",
            error_text(error.code(), error.details())
        )),
        // RESP3 types never arrive: the connection speaks RESP2.
        other => lines.push(format!("{other:?}")),
    }
}

/// `CODE DETAIL`, as the server sent it.
fn error_text(code: &str, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_owned(),
    }
}

/// Turns a client error into the testkit's: an error reply into
/// [`TestkitError::Reply`] (with the server's own text), a read, write or
/// connect that ran out of time into [`TestkitError::Timeout`] (waiting for
/// `what`), any other socket error into [`TestkitError::Io`], and the rest
/// (an unparsable reply) into [`TestkitError::Protocol`].
pub(crate) fn testkit_error(
    error: RedisError,
    what: &'static str,
    after: Duration,
) -> TestkitError {
    if let Some(code) = error.code() {
        return TestkitError::Reply(error_text(code, error.detail()));
    }
    if error.is_timeout() {
        return TestkitError::Timeout { what, after };
    }
    match io_kind(&error) {
        Some(kind) => TestkitError::Io(io::Error::new(kind, error.to_string())),
        None if error.is_io_error() => TestkitError::Io(io::Error::other(error.to_string())),
        None => TestkitError::Protocol(error.to_string()),
    }
}

/// The kind of the socket error underneath, when there is one. The client
/// keeps it behind a shared pointer, so both layers are looked through.
fn io_kind(error: &RedisError) -> Option<io::ErrorKind> {
    let source = StdError::source(error)?;
    source
        .downcast_ref::<io::Error>()
        .or_else(|| {
            source
                .downcast_ref::<Arc<dyn StdError + Send + Sync>>()
                .and_then(|shared| shared.downcast_ref::<io::Error>())
        })
        .map(io::Error::kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_bytes(bytes: &[u8]) -> Result<String, RedisError> {
        redis::parse_redis_value(bytes).map(render)
    }

    #[test]
    fn renders_scalars() -> Result<(), RedisError> {
        assert_eq!(render_bytes(b"+OK\r\n")?, "OK");
        assert_eq!(render_bytes(b"+PONG\r\n")?, "PONG");
        assert_eq!(render_bytes(b":-42\r\n")?, "-42");
        assert_eq!(render_bytes(b"$5\r\nhe\r\no\r\n")?, "he\r\no");
        assert_eq!(render_bytes(b"$0\r\n\r\n")?, "");
        assert_eq!(render_bytes(b"$-1\r\n")?, "(nil)");
        assert_eq!(render_bytes(b"*-1\r\n")?, "(nil)");
        Ok(())
    }

    #[test]
    fn renders_arrays_one_element_per_line() -> Result<(), RedisError> {
        assert_eq!(
            render_bytes(b"*3\r\n$1\r\na\r\n:2\r\n$-1\r\n")?,
            "a\n2\n(nil)"
        );
        assert_eq!(render_bytes(b"*0\r\n")?, "(empty array)");
        assert_eq!(
            render_bytes(b"*2\r\n*2\r\n+x\r\n+y\r\n-ERR inner\r\n")?,
            "x\ny\n(error) ERR inner"
        );
        Ok(())
    }

    #[test]
    fn an_empty_command_is_refused() {
        assert!(matches!(command(&[]), Err(TestkitError::Protocol(_))));
    }

    #[test]
    fn an_error_reply_keeps_the_servers_text() -> Result<(), RedisError> {
        let reply = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n")?;
        let Err(error) = reply.extract_error() else {
            panic!("an error reply was taken for a value");
        };
        match testkit_error(error, REPLYING, Duration::from_secs(1)) {
            TestkitError::Reply(message) => {
                assert_eq!(message, "WRONGTYPE Operation against a key");
            }
            other => panic!("expected a Reply error, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn a_wrong_password_gets_the_servers_refusal() -> Result<(), TestkitError> {
        // The password is in a configuration file, so the testkit does not
        // know it and the connections below are the only ones that try one.
        let config_dir = tempfile::tempdir()?;
        let config = config_dir.path().join("redis.conf");
        std::fs::write(&config, "requirepass right\n")?;
        let server = crate::RedisServer::builder().config_file(&config).start()?;
        let timeout = Duration::from_secs(5);
        let error = connect(server.addr(), Some("wrong"), timeout)
            .err()
            .ok_or_else(|| TestkitError::Protocol("AUTH with a wrong password passed".into()))?;
        match testkit_error(error, CONNECTING, timeout) {
            TestkitError::Reply(message) => assert!(message.starts_with("WRONGPASS"), "{message}"),
            other => panic!("expected a WRONGPASS reply, got {other:?}"),
        }
        let mut connection = connect(server.addr(), Some("right"), timeout)
            .map_err(|e| testkit_error(e, CONNECTING, timeout))?;
        let pong: String = redis::cmd("PING")
            .query(&mut connection)
            .map_err(|e| testkit_error(e, REPLYING, timeout))?;
        assert_eq!(pong, "PONG");
        Ok(())
    }

    #[test]
    fn a_refused_connection_is_an_io_error() -> Result<(), TestkitError> {
        // A port that was free a moment ago: nothing listens on it.
        let port = crate::free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let error = connect(addr, None, Duration::from_secs(1))
            .err()
            .ok_or_else(|| TestkitError::Protocol(format!("something listens on {addr}")))?;
        match testkit_error(error, CONNECTING, Duration::from_secs(1)) {
            TestkitError::Io(error) => assert_eq!(error.kind(), io::ErrorKind::ConnectionRefused),
            other => panic!("expected an Io error, got {other:?}"),
        }
        Ok(())
    }
}
