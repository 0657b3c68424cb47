//! Building a [`RedisBackend`]: the connection URL and the settings, checked
//! before the first connection is made.

use std::fmt;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::io::tcp::TcpSettings;
use redis::{Client, ConnectionAddr, IntoConnectionInfo};

use crate::layout::KeyLayout;
use crate::{Error, RedisBackend, redact};

/// Settings for a [`RedisBackend`], made by [`RedisBackend::builder`] or
/// [`RedisBackend::builder_for_client`] and finished by
/// [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_redis::RedisBackend;
///
/// # async fn run() -> Result<(), leasehold_redis::Error> {
/// let backend = RedisBackend::builder("redis://:s3cret@127.0.0.1:6379/0")
///     .op_timeout(Duration::from_millis(500))
///     .namespace("billing")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedisBackendBuilder {
    target: Target,
    op_timeout: Duration,
    connect_timeout: Duration,
    namespace: String,
}

enum Target {
    Url(String),
    // Boxed: a client is ten times the size of a URL.
    Client(Box<Client>),
}

impl Target {
    /// The server as it may be shown in messages: never with its password.
    fn shown(&self) -> String {
        match self {
            Self::Url(url) => redact(url),
            Self::Client(client) => client.get_connection_info().addr().to_string(),
        }
    }
}

/// How often a lost connection is retried (with jittered exponential
/// backoff from [`RECONNECT_MIN_DELAY`] up to [`RECONNECT_MAX_DELAY`])
/// before the operations waiting on it fail; the next operation starts over.
const RECONNECT_RETRIES: usize = 3;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(50);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(1);

/// Bounds accepted for both timeouts.
const MIN_TIMEOUT: Duration = Duration::from_millis(1);
const MAX_TIMEOUT: Duration = Duration::from_secs(600);

impl RedisBackendBuilder {
    /// The default [`op_timeout`](Self::op_timeout): 2 seconds.
    pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
    /// The default [`connect_timeout`](Self::connect_timeout): 2 seconds.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    fn new(target: Target) -> Self {
        Self {
            target,
            op_timeout: Self::DEFAULT_OP_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            namespace: KeyLayout::DEFAULT_NAMESPACE.to_owned(),
        }
    }

    /// The longest any one operation may take, from sending the request to
    /// reading the reply, including a reconnection and reloading a script
    /// the server forgot. Default: 2 s; accepted: 1 ms to 10 min.
    ///
    /// An operation that runs out of time returns
    /// [`BackendError::Timeout`](leasehold_core::BackendError::Timeout): its
    /// outcome is unknown, the server may still run it. Keep it well below
    /// a third of the shortest lease ttl, so that a hung renewal leaves time
    /// for another attempt.
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) waits for the first connection,
    /// all attempts included; each later reconnection attempt is bounded by
    /// it too. Default: 2 s; accepted: 1 ms to 10 min.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The prefix of every Redis key this backend writes (see
    /// [`KeyLayout`]). Default: `leasehold`. Processes that share leases
    /// must use the same namespace. At most 64 bytes, without braces,
    /// whitespace or control characters.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Checks the settings, connects, and returns the backend.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidConfig`] when a setting is out of range;
    /// - [`Error::InvalidUrl`] when the URL cannot be used;
    /// - [`Error::Connect`] when no connection (including the `AUTH` and
    ///   `SELECT` handshake) was made within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt; nothing is left
    /// running.
    pub async fn connect(self) -> Result<RedisBackend, Error> {
        let layout = KeyLayout::new(&self.namespace)?;
        check_timeout("op_timeout", self.op_timeout)?;
        check_timeout("connect_timeout", self.connect_timeout)?;
        let shown = self.target.shown();
        let client = match self.target {
            Target::Url(url) => client_for_url(&url)?,
            Target::Client(client) => *client,
        };
        if matches!(
            client.get_connection_info().addr(),
            ConnectionAddr::TcpTls { .. }
        ) {
            ensure_crypto_provider();
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.op_timeout))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(RECONNECT_MAX_DELAY);
        // Two connections: renewals get one of their own, so that no flood
        // of acquisitions (or the application's own traffic on a shared
        // client) can queue ahead of them.
        let ops = connect_named(
            client.clone(),
            config.clone(),
            OPS_CONNECTION,
            self.connect_timeout,
            &shown,
        )
        .await?;
        let renew = connect_named(
            client,
            config,
            RENEW_CONNECTION,
            self.connect_timeout,
            &shown,
        )
        .await?;
        Ok(RedisBackend::from_parts(
            ops,
            renew,
            layout,
            self.op_timeout,
            shown,
        ))
    }
}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("server", &self.target.shown())
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl RedisBackend {
    /// Starts configuring a backend for the standalone server at `url`:
    /// `redis://[[user]:password@]host[:port][/db]`, `rediss://…` for TLS
    /// (with the `tls` feature, on by default; append `#insecure` to skip
    /// certificate checks, with the `tls-insecure` feature), or
    /// `redis+unix:///path/to/socket?db=0&user=u&pass=p`. Add
    /// `?protocol=resp3` for RESP3.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Url(url.into()))
    }

    /// Starts configuring a backend for a [`redis::Client`] built by hand,
    /// for settings a URL cannot carry: credentials from a secret store,
    /// TLS with your own certificates ([`redis::Client::build_with_tls`]),
    /// TCP options.
    pub fn builder_for_client(client: Client) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Target::Client(Box::new(client)))
    }

    /// Connects to the standalone server at `url` with the default settings:
    /// `RedisBackend::builder(url).connect().await`.
    ///
    /// # Errors
    ///
    /// As [`RedisBackendBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }
}

/// The `CLIENT SETNAME` of the connection for acquire, release and inspect.
pub(crate) const OPS_CONNECTION: &str = "leasehold-ops";
/// The `CLIENT SETNAME` of the connection used only for renewals.
pub(crate) const RENEW_CONNECTION: &str = "leasehold-renew";

/// Opens one managed connection within `connect_timeout` and names it, so
/// that `CLIENT LIST` tells the connections apart.
async fn connect_named(
    client: Client,
    config: ConnectionManagerConfig,
    name: &str,
    connect_timeout: Duration,
    shown: &str,
) -> Result<ConnectionManager, Error> {
    let connecting = ConnectionManager::new_with_config(client, config);
    let mut conn = match tokio::time::timeout(connect_timeout, connecting).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(source)) => {
            return Err(Error::Connect {
                url_redacted: shown.to_owned(),
                source,
            });
        }
        Err(_) => {
            let waited = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within the connect timeout of {connect_timeout:?}"),
            );
            return Err(Error::Connect {
                url_redacted: shown.to_owned(),
                source: waited.into(),
            });
        }
    };
    // Only for operators reading CLIENT LIST: a server or ACL that refuses
    // it costs nothing else, so its outcome is ignored; a reconnection
    // starts unnamed.
    let mut setname = redis::cmd("CLIENT");
    setname.arg("SETNAME").arg(name);
    let _ = tokio::time::timeout(connect_timeout, setname.query_async::<()>(&mut conn)).await;
    Ok(conn)
}

fn check_timeout(field: &'static str, timeout: Duration) -> Result<(), Error> {
    if (MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            field,
            reason: format!("{timeout:?} is outside the accepted range of 1ms to 10min"),
        })
    }
}

/// Checks a URL and turns it into a client, with `TCP_NODELAY` on (leases
/// are small requests that should not wait for more to send).
fn client_for_url(url: &str) -> Result<Client, Error> {
    let invalid = |reason: String| Error::InvalidUrl {
        url_redacted: redact(url),
        reason,
    };
    let parsed = url::Url::parse(url.trim()).map_err(|e| invalid(parse_error_reason(e)))?;
    match parsed.scheme() {
        "redis" | "rediss" | "valkey" | "valkeys" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(invalid("it names no host".to_owned()));
            }
            if parsed.port() == Some(0) {
                return Err(invalid("port 0 cannot be connected to".to_owned()));
            }
            let tls = matches!(parsed.scheme(), "rediss" | "valkeys");
            if tls && cfg!(not(feature = "tls")) {
                return Err(invalid(
                    "TLS URLs need the `tls` feature of leasehold-redis, which is off".to_owned(),
                ));
            }
            if tls && parsed.fragment() == Some("insecure") && cfg!(not(feature = "tls-insecure")) {
                return Err(invalid(
                    "#insecure (no certificate checks) needs the `tls-insecure` feature of leasehold-redis, which is off; prefer RedisBackend::builder_for_client with your CA certificate".to_owned(),
                ));
            }
        }
        "redis+unix" | "valkey+unix" | "unix" => {}
        other => {
            return Err(invalid(format!(
                "{other}:// is not a Redis scheme; use redis://, rediss:// or redis+unix://"
            )));
        }
    }
    // The redis crate's messages name what is wrong, never the URL itself.
    let info = parsed
        .into_connection_info()
        .map_err(|e| invalid(e.to_string()))?;
    let tcp = TcpSettings::default().set_nodelay(true);
    Client::open(info.set_tcp_settings(tcp)).map_err(|e| invalid(e.to_string()))
}

fn parse_error_reason(error: url::ParseError) -> String {
    match error {
        url::ParseError::RelativeUrlWithoutBase => {
            "it does not start with a scheme such as redis://".to_owned()
        }
        url::ParseError::EmptyHost => "it names no host".to_owned(),
        url::ParseError::InvalidPort => "the port is not a number from 1 to 65535".to_owned(),
        other => other.to_string(),
    }
}

/// Makes sure rustls has a process-wide crypto provider, installing *ring*
/// if none is: the redis crate asks rustls for the default one, and rustls
/// panics when it cannot choose.
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Fails only if another thread installed one meanwhile: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls"))]
fn ensure_crypto_provider() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_urls_are_refused_without_showing_the_password() {
        for url in [
            "http://x",
            "redis://:hunter2@",
            "not a url",
            "redis://:hunter2@localhost:65536",
            "redis://:hunter2@localhost:0",
            "redis://localhost/notadb",
            "redis://localhost/?protocol=resp9",
            "",
        ] {
            let err = client_for_url(url).err();
            assert!(
                matches!(err, Some(Error::InvalidUrl { .. })),
                "{url}: {err:?}"
            );
            let shown = format!(
                "{} {:?}",
                err.as_ref().map(ToString::to_string).unwrap_or_default(),
                err
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert!(client_for_url("redis://:hunter2@localhost:6379/1").is_ok());
        assert!(client_for_url("redis+unix:///tmp/redis.sock?pass=hunter2").is_ok());
    }

    #[test]
    fn builder_debug_shows_no_password() {
        let builder = RedisBackend::builder("redis://app:hunter2@db:6379");
        let shown = format!("{builder:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("app:***@db"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn settings_are_checked_before_connecting() {
        let err = RedisBackend::builder("redis://127.0.0.1:1")
            .namespace("a{b}")
            .connect()
            .await;
        assert!(matches!(
            err,
            Err(Error::InvalidConfig {
                field: "namespace",
                ..
            })
        ));
        let err = RedisBackend::builder("redis://127.0.0.1:1")
            .op_timeout(Duration::ZERO)
            .connect()
            .await;
        assert!(matches!(
            err,
            Err(Error::InvalidConfig {
                field: "op_timeout",
                ..
            })
        ));
        let err = RedisBackend::builder("redis://127.0.0.1:1")
            .connect_timeout(Duration::from_secs(3600))
            .connect()
            .await;
        assert!(matches!(
            err,
            Err(Error::InvalidConfig {
                field: "connect_timeout",
                ..
            })
        ));
    }
}
