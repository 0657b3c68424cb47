//! A tiny blocking RESP2 client: just enough to send one command and render
//! the reply as text.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::TestkitError;

/// Bulk strings larger than this are treated as a protocol error.
const MAX_BULK_LEN: usize = 512 * 1024 * 1024;
/// Arrays longer than this (or nested deeper) are treated as a protocol error.
const MAX_ARRAY_LEN: usize = 16 * 1024 * 1024;
const MAX_DEPTH: usize = 32;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Value>),
}

impl Value {
    /// Renders the reply as text, or a top-level error reply as
    /// [`TestkitError::Reply`].
    pub(crate) fn render(self) -> Result<String, TestkitError> {
        match self {
            Value::Error(message) => Err(TestkitError::Reply(message)),
            other => {
                let mut lines = Vec::new();
                other.render_into(&mut lines);
                Ok(lines.join("\n"))
            }
        }
    }

    fn render_into(self, lines: &mut Vec<String>) {
        match self {
            Value::Simple(text) => lines.push(text),
            Value::Error(message) => lines.push(format!("(error) {message}")),
            Value::Integer(n) => lines.push(n.to_string()),
            Value::Bulk(bytes) => lines.push(String::from_utf8_lossy(&bytes).into_owned()),
            Value::Nil => lines.push("(nil)".to_owned()),
            Value::Array(items) if items.is_empty() => lines.push("(empty array)".to_owned()),
            Value::Array(items) => items.into_iter().for_each(|item| item.render_into(lines)),
        }
    }
}

/// Encodes a command as a RESP2 array of bulk strings.
pub(crate) fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one reply.
pub(crate) fn read_value(reader: &mut impl BufRead) -> Result<Value, TestkitError> {
    read_nested(reader, 0)
}

fn read_nested(reader: &mut impl BufRead, depth: usize) -> Result<Value, TestkitError> {
    if depth > MAX_DEPTH {
        return Err(protocol("reply nested too deeply"));
    }
    let line = read_line(reader)?;
    let (kind, rest) = line
        .split_first()
        .ok_or_else(|| protocol("empty reply line"))?;
    let text = String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(Value::Simple(text)),
        b'-' => Ok(Value::Error(text)),
        b':' => Ok(Value::Integer(parse_int(&text)?)),
        b'$' => match parse_len(&text, MAX_BULK_LEN)? {
            None => Ok(Value::Nil),
            Some(len) => {
                let mut buf = vec![0; len + 2];
                reader.read_exact(&mut buf)?;
                if !buf.ends_with(b"\r\n") {
                    return Err(protocol("bulk string not terminated by CRLF"));
                }
                buf.truncate(len);
                Ok(Value::Bulk(buf))
            }
        },
        b'*' => match parse_len(&text, MAX_ARRAY_LEN)? {
            None => Ok(Value::Nil),
            Some(len) => (0..len)
                .map(|_| read_nested(reader, depth + 1))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
        },
        other => Err(protocol(format!(
            "unexpected reply type byte {:?}",
            char::from(*other)
        ))),
    }
}

/// Reads one CRLF-terminated line, without the CRLF.
fn read_line(reader: &mut impl BufRead) -> Result<Vec<u8>, TestkitError> {
    let mut line = Vec::new();
    let read = reader.read_until(b'\n', &mut line)?;
    if read == 0 {
        return Err(TestkitError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        )));
    }
    if !line.ends_with(b"\r\n") {
        return Err(protocol("reply line not terminated by CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(text: &str) -> Result<i64, TestkitError> {
    text.parse()
        .map_err(|_| protocol(format!("invalid integer {text:?}")))
}

/// Parses a length; `-1` means nil.
fn parse_len(text: &str, max: usize) -> Result<Option<usize>, TestkitError> {
    match parse_int(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&len| len <= max)
            .map(Some)
            .ok_or_else(|| protocol(format!("invalid length {n}"))),
    }
}

fn protocol(message: impl Into<String>) -> TestkitError {
    TestkitError::Protocol(message.into())
}

/// A blocking connection with connect, read and write timeouts.
#[derive(Debug)]
pub(crate) struct Connection {
    reader: BufReader<TcpStream>,
    timeout: Duration,
}

impl Connection {
    /// Connects to `addr`; `timeout` applies to the connect and to every
    /// later read and write.
    pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> Result<Self, TestkitError> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| timeout_or_io(e, "connect", timeout))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            reader: BufReader::new(stream),
            timeout,
        })
    }

    /// Sends one command and reads its reply. After an error the connection
    /// must be dropped: a late reply could otherwise be taken for the answer
    /// to a later request.
    pub(crate) fn request(&mut self, args: &[&str]) -> Result<Value, TestkitError> {
        if args.is_empty() {
            return Err(protocol("no command given"));
        }
        let timeout = self.timeout;
        self.reader
            .get_mut()
            .write_all(&encode(args))
            .map_err(|e| timeout_or_io(e, "a write to redis", timeout))?;
        read_value(&mut self.reader).map_err(|e| match e {
            TestkitError::Io(e) => timeout_or_io(e, "a reply from redis", timeout),
            other => other,
        })
    }
}

fn timeout_or_io(error: io::Error, what: &'static str, after: Duration) -> TestkitError {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            TestkitError::Timeout { what, after }
        }
        _ => TestkitError::Io(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Result<Value, TestkitError> {
        read_value(&mut io::Cursor::new(bytes))
    }

    fn render(bytes: &[u8]) -> Result<String, TestkitError> {
        parse(bytes)?.render()
    }

    #[test]
    fn encodes_arrays_of_bulk_strings() {
        assert_eq!(
            encode(&["SET", "k", "héllo"]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$6\r\nh\xc3\xa9llo\r\n".to_vec()
        );
        assert_eq!(
            encode(&["SET", "", "v"]),
            b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$1\r\nv\r\n".to_vec()
        );
    }

    #[test]
    fn renders_scalars() -> Result<(), TestkitError> {
        assert_eq!(render(b"+OK\r\n")?, "OK");
        assert_eq!(render(b":-42\r\n")?, "-42");
        assert_eq!(render(b"$5\r\nhe\r\no\r\n")?, "he\r\no");
        assert_eq!(render(b"$0\r\n\r\n")?, "");
        assert_eq!(render(b"$-1\r\n")?, "(nil)");
        assert_eq!(render(b"*-1\r\n")?, "(nil)");
        Ok(())
    }

    #[test]
    fn renders_arrays_one_element_per_line() -> Result<(), TestkitError> {
        assert_eq!(render(b"*3\r\n$1\r\na\r\n:2\r\n$-1\r\n")?, "a\n2\n(nil)");
        assert_eq!(render(b"*0\r\n")?, "(empty array)");
        assert_eq!(
            render(b"*2\r\n*2\r\n+x\r\n+y\r\n-ERR inner\r\n")?,
            "x\ny\n(error) ERR inner"
        );
        Ok(())
    }

    #[test]
    fn error_reply_is_an_error() {
        match render(b"-WRONGTYPE Operation against a key\r\n") {
            Err(TestkitError::Reply(message)) => {
                assert_eq!(message, "WRONGTYPE Operation against a key");
            }
            other => panic!("expected a Reply error, got {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_input() {
        for bad in [
            &b"?what\r\n"[..],
            b"+OK\n",
            b":nope\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(TestkitError::Protocol(_))),
                "{bad:?} gave {:?}",
                parse(bad)
            );
        }
        assert!(matches!(parse(b""), Err(TestkitError::Io(_))));
        assert!(matches!(parse(b"$3\r\nab"), Err(TestkitError::Io(_))));
    }
}
