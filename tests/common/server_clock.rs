//! The server's own account of when it did what, for tests that judge a
//! holder against the server rather than against the library's arithmetic.
//!
//! [`Monitor`] keeps a `MONITOR` connection open on a side connection and
//! records every command the server executes with the server's wall-clock
//! timestamp, including the commands a Lua script runs (`[0 lua]` lines:
//! the `SET … PX` of an acquisition, the `PEXPIREAT` of a renewal). The
//! server stamps with `gettimeofday`: the same clock as [`SystemTime`] in a
//! test on the same machine. Checked on Redis 7.0: a script's call
//! (`EVALSHA`) is stamped before the script runs, each command inside it
//! right after that command ran, and a `PEXPIRE` inside a script counts
//! from when it ran (not from the script's start).
//!
//! So a key given a ttl by a command inside a script is kept by the server
//! until at least [`earliest_expiry`]`(started, ttl)`, where `started` is
//! the stamp of the script's call ([`Executed::started`]): Redis stores the
//! expiry in whole milliseconds (its clock when the command ran, truncated,
//! plus the ttl) and expires a key only once its clock is past that. A
//! renewal's `PEXPIREAT` names that instant itself (the batch's `TIME`, in
//! whole milliseconds, plus the ttl): [`Executed::earliest_expiry`] reads it.
//!
//! Included with `#[path]` by the tests that need it, apart from `mod.rs`,
//! whose campaign client they do not use.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// How long [`Monitor::start`] and [`Monitor::sync`] wait for the server.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One command as the server executed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Executed {
    /// The server's wall-clock time when it printed the command.
    pub(crate) at: SystemTime,
    /// A moment at or before the command started: for a command a script
    /// ran, the stamp of the script's call; otherwise [`at`](Self::at).
    pub(crate) started: SystemTime,
    /// Whether a script ran the command.
    pub(crate) by_script: bool,
    /// The client that sent it, as the server names it (`127.0.0.1:5555`;
    /// `lua` for a command a script ran): one connection's commands share it.
    pub(crate) client: String,
    /// The command name and arguments, as the server printed them.
    pub(crate) args: Vec<String>,
}

impl Executed {
    /// Whether this command gave `key` a time to live: the acquisition's
    /// `SET key value PX ttl` or a renewal's `PEXPIREAT key at` (`PEXPIRE
    /// key ttl` where an ACL refuses `PEXPIREAT`).
    pub(crate) fn sets_ttl_of(&self, key: &str) -> bool {
        let name = self.args.first().map(|a| a.to_ascii_uppercase());
        let on_key = self.args.get(1).is_some_and(|k| k == key);
        match name.as_deref() {
            Some("PEXPIRE" | "PEXPIREAT") => on_key,
            Some("SET") => on_key && self.args.iter().any(|a| a.eq_ignore_ascii_case("PX")),
            _ => false,
        }
    }

    /// Whether this is a renewal's `PEXPIREAT key …` or `PEXPIRE key …`.
    pub(crate) fn renews(&self, key: &str) -> bool {
        self.sets_ttl_of(key)
            && self.args.first().is_some_and(|name| {
                name.eq_ignore_ascii_case("PEXPIRE") || name.eq_ignore_ascii_case("PEXPIREAT")
            })
    }

    /// The instant a `PEXPIREAT` gave its key (Unix milliseconds, on the
    /// server's clock); `None` for any other command.
    pub(crate) fn absolute_expiry(&self) -> Option<SystemTime> {
        match self.args.as_slice() {
            [name, _, at] if name.eq_ignore_ascii_case("PEXPIREAT") => {
                Some(UNIX_EPOCH + Duration::from_millis(at.parse().ok()?))
            }
            _ => None,
        }
    }

    /// The earliest wall-clock instant the server can expire the key this
    /// command gave a ttl of `ttl`: the instant a `PEXPIREAT` names, else
    /// [`earliest_expiry`]`(started, ttl)` (see the module comment).
    pub(crate) fn earliest_expiry(&self, ttl: Duration) -> SystemTime {
        self.absolute_expiry()
            .unwrap_or_else(|| earliest_expiry(self.started, ttl))
    }

    /// Whether this is `SET key …` (any options).
    pub(crate) fn sets(&self, key: &str) -> bool {
        self.args
            .first()
            .is_some_and(|name| name.eq_ignore_ascii_case("SET"))
            && self.args.get(1).is_some_and(|k| k == key)
    }
}

/// The earliest wall-clock instant a server can expire a key given `ttl`
/// by a command it stamped `at` (see the module comment).
pub(crate) fn earliest_expiry(at: SystemTime, ttl: Duration) -> SystemTime {
    let since_epoch = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole_ms = Duration::from_millis(
        u64::try_from(since_epoch.as_millis()).expect("a wall clock before the year 500,000,000"),
    );
    UNIX_EPOCH + whole_ms + ttl
}

/// Signed milliseconds from `b` to `a`: positive when `a` is later.
pub(crate) fn ms_after(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// A `MONITOR` side connection and everything it has seen so far.
pub(crate) struct Monitor {
    server: SocketAddr,
    seen: Arc<Mutex<Vec<Executed>>>,
    arrived: Arc<Notify>,
    reader: JoinHandle<()>,
}

impl Monitor {
    /// Connects to `server` (directly, not through any proxy under test)
    /// and starts recording. Commands executed after this returns are seen.
    pub(crate) async fn start(server: SocketAddr) -> Result<Self, Error> {
        Self::start_via(server, server).await
    }

    /// As [`start`](Self::start), through `watch`, another address of the
    /// same server (a port it listens on before it opens `server`'s):
    /// [`sync`](Self::sync) still goes to `server`.
    pub(crate) async fn start_via(watch: SocketAddr, server: SocketAddr) -> Result<Self, Error> {
        let mut stream = TcpStream::connect(watch).await?;
        stream.write_all(b"MONITOR\r\n").await?;
        let mut lines = BufReader::new(stream).lines();
        let ok = tokio::time::timeout(ANSWER_TIMEOUT, lines.next_line())
            .await??
            .ok_or("the server closed the MONITOR connection")?;
        if ok != "+OK" {
            return Err(format!("MONITOR answered {ok:?}").into());
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Notify::new());
        let reader = tokio::spawn({
            let (seen, arrived) = (Arc::clone(&seen), Arc::clone(&arrived));
            async move {
                // The stamp of the last command a client sent: the call of
                // the script that runs the `[0 lua]` lines after it.
                let mut call: Option<SystemTime> = None;
                // Ends when the server goes away (a kill) or the monitor is dropped.
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(mut executed) = parse(&line) {
                        if executed.by_script {
                            executed.started = call.map_or(executed.at, |c| c.min(executed.at));
                        } else {
                            call = Some(executed.at);
                        }
                        seen.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(executed);
                        arrived.notify_waiters();
                    }
                }
            }
        });
        Ok(Self {
            server,
            seen,
            arrived,
            reader,
        })
    }

    /// Waits until every command the server executed before this call has
    /// been seen: sends a marker on a fresh connection and waits for it to
    /// come back through the monitor (a server writes monitor lines in the
    /// order it executes commands).
    pub(crate) async fn sync(&self) -> Result<(), Error> {
        let marker = format!("monitor-sync-{:016x}", fastrand::u64(..));
        let mut echo = TcpStream::connect(self.server).await?;
        let command = format!("*2\r\n$4\r\nECHO\r\n${}\r\n{marker}\r\n", marker.len());
        echo.write_all(command.as_bytes()).await?;
        tokio::time::timeout(ANSWER_TIMEOUT, async {
            loop {
                let arrived = self.arrived.notified();
                if self.seen().iter().any(|e| e.args.get(1) == Some(&marker)) {
                    return;
                }
                arrived.await;
            }
        })
        .await
        .map_err(|_| "the monitor did not see its marker within 5 s")?;
        Ok(())
    }

    /// Waits until `count` commands satisfying `wanted` have been seen (at
    /// most `limit`) and returns the last of them.
    pub(crate) async fn wait_for(
        &self,
        limit: Duration,
        count: usize,
        wanted: impl Fn(&Executed) -> bool,
    ) -> Result<Executed, Error> {
        tokio::time::timeout(limit, async {
            loop {
                let arrived = self.arrived.notified();
                if let Some(found) = self.seen().into_iter().filter(&wanted).nth(count - 1) {
                    return found;
                }
                arrived.await;
            }
        })
        .await
        .map_err(|_| {
            format!("the server ran fewer than {count} such commands within {limit:?}").into()
        })
    }

    /// Everything seen so far, in the order the server executed it.
    pub(crate) fn seen(&self) -> Vec<Executed> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The last command that gave `key` a ttl, of those printed before
    /// `before`.
    pub(crate) fn last_ttl_set(&self, key: &str, before: SystemTime) -> Option<Executed> {
        self.seen()
            .into_iter()
            .rfind(|e| e.at < before && e.sets_ttl_of(key))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Parses `+1700000000.123456 [0 lua] "PEXPIRE" "key" "2000"`.
fn parse(line: &str) -> Option<Executed> {
    let line = line.strip_prefix('+')?;
    let (stamp, rest) = line.split_once(' ')?;
    let (secs, micros) = stamp.split_once('.')?;
    let at = UNIX_EPOCH
        + Duration::from_secs(secs.parse().ok()?)
        + Duration::from_micros(micros.parse().ok()?);
    let (source, quoted) = rest.split_once("] ")?;
    // `[0 127.0.0.1:5555` or `[0 lua`: the database, then the client.
    let client = source.split_once(' ').map_or("", |(_, client)| client);
    Some(Executed {
        at,
        started: at,
        by_script: client == "lua",
        client: client.to_owned(),
        args: unquote(quoted),
    })
}

/// Splits the server's quoted arguments (`"a" "b\"c"`), undoing its escapes.
fn unquote(quoted: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        if let Ok(byte) = u8::from_str_radix(&hex, 16) {
                            arg.push(char::from(byte));
                        }
                    }
                    Some(other) => arg.push(other),
                    None => {}
                },
                other => arg.push(other),
            }
        }
        args.push(arg);
    }
    args
}

#[test]
fn monitor_lines_parse_with_their_escapes() {
    let line = r#"+1795600370.850204 [0 lua] "PEXPIRE" "leasehold:{a b\"}" "2000""#;
    let executed = parse(line).expect("a monitor line");
    assert_eq!(executed.args, ["PEXPIRE", "leasehold:{a b\"}", "2000"]);
    assert_eq!(
        executed.at,
        UNIX_EPOCH + Duration::from_secs(1_795_600_370) + Duration::from_micros(850_204)
    );
    assert!(executed.by_script);
    assert_eq!(executed.client, "lua");
    assert!(executed.sets_ttl_of("leasehold:{a b\"}"));
    let sent = parse(r#"+1795600370.850204 [0 127.0.0.1:5555] "HELLO" "3""#).expect("a line");
    assert!(!sent.by_script);
    assert_eq!(sent.client, "127.0.0.1:5555");
    assert_eq!(
        executed.earliest_expiry(Duration::from_secs(2)),
        UNIX_EPOCH + Duration::from_millis(1_795_600_372_850)
    );
    // A PEXPIREAT names its instant, whatever the ttl.
    let line = r#"+1795600370.850204 [0 lua] "PEXPIREAT" "leasehold:{a}" "1795600372849""#;
    let executed = parse(line).expect("a monitor line");
    assert!(executed.renews("leasehold:{a}"));
    assert_eq!(
        executed.earliest_expiry(Duration::from_secs(2)),
        UNIX_EPOCH + Duration::from_millis(1_795_600_372_849)
    );
}
