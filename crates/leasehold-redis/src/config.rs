//! Building a [`RedisBackend`]: the connection URL and the settings, checked
//! before the first connection is made.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "sentinel")]
use redis::io::tcp::TcpSettings;
use redis::{Client, ConnectionAddr, ProtocolVersion};

#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "sentinel")]
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use tracing::{info, warn};

#[cfg(not(feature = "sentinel"))]
use crate::absent::SentinelClient;
use crate::capabilities::{Needs, ServerInfo};
use crate::connection::{Conn, SentinelConn, Wait};
use crate::layout::KeyLayout;
use crate::notices::Notices;
use crate::scripts;
use crate::switches;
use crate::tracking::Tracking;
use crate::url::{Endpoint, Kind, client_for_url};
use crate::{ConnectError, RedisBackend, redact};

/// Settings for a [`RedisBackend`], made by [`RedisBackend::builder`] or
/// [`RedisBackend::builder_for_client`] and finished by
/// [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_redis::RedisBackend;
///
/// # async fn run() -> Result<(), leasehold_redis::ConnectError> {
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
    fence_retention: Duration,
    wait: Option<Wait>,
    track: bool,
    calls_in_flight: usize,
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
/// backoff from [`RECONNECT_MIN_DELAY`], times [`RECONNECT_GROWTH`] each
/// time, up to [`RECONNECT_MAX_DELAY`]) before the operations waiting on
/// it fail; the next operation starts over. The first retries come within
/// milliseconds and close together: a restarted server is back in 10 to
/// 20 ms, and the renewals waiting on the connection (every lease is
/// renewed when it is lost) learn whether their leases survived only once
/// it is back, while anyone else may take a lease the restart lost as soon
/// as the server listens. Each wait is its step plus up to as much again
/// (the jitter), so an attempt comes within about two thirds of the time
/// the server was away of its return (a quarter on average), where
/// doubling from 5 ms left a holder up to 20 ms behind a server back
/// after 12. A refused
/// attempt costs a socket and no round trip. The retries span 1.2 to 2.3 s.
const RECONNECT_RETRIES: usize = 14;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(2);
const RECONNECT_GROWTH: f32 = 1.5;
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);

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
            fence_retention: KeyLayout::DEFAULT_FENCE_RETENTION,
            wait: None,
            track: true,
            calls_in_flight: Self::DEFAULT_CALLS_IN_FLIGHT,
        }
    }

    /// The default [`calls_in_flight`](Self::calls_in_flight): 16.
    pub const DEFAULT_CALLS_IN_FLIGHT: usize = crate::backend::CALLS_IN_FLIGHT;

    /// How many acquisition calls, and as many release calls, may be in
    /// flight at once on one connection (on a cluster, per slot). An
    /// acquisition or release that finds that many out waits, and goes out
    /// together with the others that waited, as one script call, when one
    /// comes back; with fewer out it is sent at once, alone. The default,
    /// 16, keeps the client and the server busy together; 1 batches the
    /// most, which suits a server that is itself the bottleneck
    /// (docs/performance.md, acquire_release). Accepted: 1 to 1024.
    pub fn calls_in_flight(mut self, calls: usize) -> Self {
        self.calls_in_flight = calls;
        self
    }

    /// Whether the renewal connection asks the server to report changes to
    /// the leases it renews (RESP3 client tracking; standalone servers and
    /// Sentinel-monitored masters, not Cluster), so that a holder learns
    /// within a round trip that its lease was deleted or overwritten,
    /// instead of at its next renewal. Default: on.
    ///
    /// It costs the server about 100 bytes per held lease in its tracking
    /// table and one push message per change. A server that refuses it (an
    /// ACL without `HELLO` or `CLIENT`, a server before Redis 6) is used
    /// without it; so is one whose tracking table overflows (see
    /// `tracking-table-max-keys`), with a warning.
    pub fn track_lease_changes(mut self, on: bool) -> Self {
        self.track = on;
        self
    }

    /// After every acquisition and renewal, waits (`WAIT replicas timeout`,
    /// on the same connection; in a cluster, on the node of the lease's
    /// slot) until at least `replicas` replicas have the write.
    ///
    /// A missing acknowledgement makes an acquisition fail (the lease is
    /// given back, and the error is transient, so the watchdog retries) and
    /// a renewal's outcome unknown (an error, which the watchdog retries
    /// until the lease's deadline). This narrows the window in which a
    /// failover right after a write hands the lease to a second holder; it
    /// is not consensus: an acknowledged write can still be lost if the
    /// replica that has it is not the one promoted. Default: off. `replicas`
    /// must be at least 1; the timeout 1 ms to 10 min, and well below the op
    /// timeout, which bounds the whole call.
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some(Wait { replicas, timeout });
        self
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

    /// How long a lease's fencing counter (and a semaphore's permit
    /// limit) stays on the server after the latest grant of its key.
    /// Default: [`KeyLayout::DEFAULT_FENCE_RETENTION`] (1 h); accepted: 1 s
    /// to 30 days, in whole milliseconds. Fencing tokens keep rising after
    /// a counter expired as long as the server's clock never steps back by
    /// more than this; a longer retention keeps more counters in memory
    /// (one per key granted within it). Processes that share leases should
    /// use the same retention.
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.fence_retention = retention;
        self
    }

    /// Checks the settings, connects, and returns the backend.
    ///
    /// For a cluster URL this connects to the seed nodes and reads the
    /// slot map; for a sentinel URL it asks the sentinels for the master
    /// and checks that it says it is one.
    ///
    /// # Errors
    ///
    /// - [`ConnectError::InvalidConfig`] when a setting is out of range;
    /// - [`ConnectError::InvalidUrl`] when the URL cannot be used;
    /// - [`ConnectError::Connect`] when no connection (including the `AUTH` and
    ///   `SELECT` handshake) was made within the connect timeout.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempt; nothing is left
    /// running.
    pub async fn connect(self) -> Result<RedisBackend, ConnectError> {
        self.connect_with(false).await
    }

    /// `connect`, or with `lazy`, a standalone backend that makes its first
    /// connection on its first call (for Redlock, whose nodes may be down
    /// at start).
    pub(crate) async fn connect_with(mut self, lazy: bool) -> Result<RedisBackend, ConnectError> {
        let layout = KeyLayout::new(&self.namespace)?.with_fence_retention(self.fence_retention)?;
        check_timeout("op_timeout", self.op_timeout)?;
        check_timeout("connect_timeout", self.connect_timeout)?;
        if !(1..=1024).contains(&self.calls_in_flight) {
            return Err(ConnectError::InvalidConfig {
                field: "calls_in_flight",
                reason: format!(
                    "{} is out of range: at least 1 call must be allowed in flight, and at most 1024",
                    self.calls_in_flight
                ),
            });
        }
        if let Some(wait) = self.wait {
            check_timeout("wait_for_replicas timeout", wait.timeout)?;
            if wait.replicas == 0 {
                return Err(ConnectError::InvalidConfig {
                    field: "wait_for_replicas",
                    reason: "0 replicas would acknowledge every write; ask for at least 1, or leave it off".to_owned(),
                });
            }
        }
        let shown = self.target.shown();
        let target = std::mem::replace(&mut self.target, Target::Url(String::new()));
        let client = match target {
            Target::Url(url) => match Endpoint::parse(&url)?.kind {
                Kind::Standalone(checked) => client_for_url(&checked)?,
                Kind::Cluster(nodes) => {
                    let notices =
                        Notices::cluster(nodes.clone(), self.connect_timeout, self.op_timeout);
                    let (conn, renew_conn) = self.connect_cluster(nodes, &shown).await?;
                    let server_info = Box::pin(self.check_servers(&conn, &shown)).await?;
                    Box::pin(self.load_scripts(&conn, &shown)).await;
                    return Ok(RedisBackend::from_parts(
                        conn,
                        renew_conn,
                        Some(notices),
                        layout,
                        self.op_timeout,
                        shown,
                        self.wait,
                    )
                    .with_server_info(server_info)
                    .with_calls_in_flight(self.calls_in_flight));
                }
                Kind::Sentinel {
                    sentinels,
                    master,
                    master_info,
                    tls,
                } => {
                    let target = SentinelTarget {
                        sentinels,
                        master,
                        master_info,
                        tls,
                    };
                    let notices = self.sentinel_notices(&target, &shown)?;
                    let tracking = self.track.then(|| Arc::new(Tracking::new(layout.clone())));
                    let tracked = match &tracking {
                        Some(tracking) => {
                            match self.connect_sentinel(&target, Some(tracking), &shown).await {
                                Ok(conn) => Some(conn),
                                Err(ConnectError::Connect { source, .. }) if refused(&source) => {
                                    tracking.unavailable(&format!(
                                        "the master refused RESP3: {source}"
                                    ));
                                    None
                                }
                                Err(other) => return Err(other),
                            }
                        }
                        None => None,
                    };
                    let conn = match tracked {
                        Some(conn) => conn,
                        None => self.connect_sentinel(&target, None, &shown).await?,
                    };
                    if let Conn::Sentinel(sentinel) = &conn {
                        // Promotions announced by the sentinels themselves.
                        switches::spawn(
                            sentinel,
                            switches::Watch {
                                sentinels: target.sentinels.clone(),
                                master: target.master.clone(),
                                connect_timeout: self.connect_timeout,
                                op_timeout: self.op_timeout,
                            },
                        );
                    }
                    // The master the sentinels named.
                    let server_info = Box::pin(self.check_servers(&conn, &shown)).await?;
                    Box::pin(self.load_scripts(&conn, &shown)).await;
                    return Ok(RedisBackend::from_parts(
                        conn.clone(),
                        conn,
                        Some(notices),
                        layout,
                        self.op_timeout,
                        shown,
                        self.wait,
                    )
                    .with_tracking(tracking)
                    .with_server_info(server_info)
                    .with_calls_in_flight(self.calls_in_flight)
                    .start_tracking()
                    .await);
                }
            },
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
            .set_exponent_base(RECONNECT_GROWTH)
            .set_max_delay(RECONNECT_MAX_DELAY);
        let notices = Notices::new(&client, self.connect_timeout, self.op_timeout);
        let tracking = (self.track && !lazy).then(|| Arc::new(Tracking::new(layout.clone())));
        // Two connections: renewals get one of their own, so that no flood
        // of acquisitions (or the application's own traffic on a shared
        // client) can queue ahead of them.
        let mut by_slot = false;
        let (ops, renew, server_info) = if lazy {
            let lazy = |client: Client| {
                ConnectionManager::new_lazy_with_config(client, config.clone()).map_err(|source| {
                    ConnectError::Connect {
                        url_redacted: shown.clone(),
                        source,
                    }
                })
            };
            // Not reached yet: nothing to check (a Redlock master that was
            // down at connect).
            (lazy(client.clone())?, lazy(client)?, None)
        } else {
            let connecting = ConnectionManager::new_with_config(client.clone(), config.clone());
            let mut ops = self.bounded_connect(connecting, &shown).await?;
            // Checked before it is named, so that a refused server costs no
            // more, and the name is the last thing the connection did.
            let server_info =
                Box::pin(self.check_servers(&Conn::Standalone(ops.clone()), &shown)).await?;
            by_slot = self.is_cluster_node(&mut ops, &shown).await;
            Box::pin(self.load_scripts(&Conn::Standalone(ops.clone()), &shown)).await;
            self.set_name(&mut ops, OPS_CONNECTION).await;
            let tracked = match &tracking {
                Some(tracking) => {
                    self.connect_tracked(&client, config.clone(), tracking, &shown)
                        .await?
                }
                None => None,
            };
            let renew = match tracked {
                Some(renew) => renew,
                None => {
                    self.connect_named(client, config, RENEW_CONNECTION, &shown)
                        .await?
                }
            };
            (ops, renew, server_info)
        };
        Ok(RedisBackend::from_parts(
            Conn::Standalone(ops),
            Conn::Standalone(renew),
            Some(notices),
            layout,
            self.op_timeout,
            shown,
            self.wait,
        )
        .with_tracking(tracking)
        .with_server_info(server_info)
        .with_calls_in_flight(self.calls_in_flight)
        .with_batches_by_slot(by_slot)
        .start_tracking()
        .await)
    }

    /// Reads every server's name and version and checks that it has what
    /// the backend will call (see `capabilities.rs`): `HELLO` and
    /// `COMMAND INFO` go out together, one round trip, on every node of a
    /// cluster at once. Returns the first server's name and version.
    ///
    /// # Errors
    ///
    /// [`ConnectError::UnsupportedServer`] for a server that lacks something;
    /// [`ConnectError::Connect`] when the servers did not answer within the
    /// connect timeout.
    async fn check_servers(
        &self,
        conn: &Conn,
        shown: &str,
    ) -> Result<Option<ServerInfo>, ConnectError> {
        let needs = Needs {
            cluster: conn.is_cluster(),
            wait: self.wait.is_some(),
        };
        let (hello, info) = needs.probes();
        let asked =
            async { tokio::try_join!(conn.on_every_server(&hello), conn.on_every_server(&info)) };
        let (hellos, mut infos) = if conn.is_cluster() {
            // A node that cannot be asked now (a replica down, a master
            // being failed over) must not fail the connect of a cluster
            // that can serve: the check is skipped, with a warning.
            match tokio::time::timeout(self.connect_timeout, asked).await {
                Ok(Ok(replies)) => replies,
                Ok(Err(error)) => {
                    warn!(server = shown, %error, "could not ask every cluster node for its version and commands; they are not checked");
                    return Ok(None);
                }
                Err(_) => {
                    warn!(
                        server = shown,
                        "not every cluster node told its version and commands within the connect timeout; they are not checked"
                    );
                    return Ok(None);
                }
            }
        } else {
            self.bounded_connect(asked, shown).await?
        };
        let mut first = None;
        for (node, hello) in hellos {
            let info = match infos.iter().position(|(n, _)| *n == node) {
                Some(at) => infos.swap_remove(at).1,
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "no reply to COMMAND INFO from this server",
                ))),
            };
            let judged = needs.judge(hello, info, node.as_deref().unwrap_or(shown))?;
            first = first.or(judged);
        }
        Ok(first)
    }

    /// The renewal connection in RESP3, its pushes handed to `tracking`.
    /// `None` (and tracking off) when the server refuses RESP3 (`HELLO`):
    /// the caller then opens a plain one.
    ///
    /// # Errors
    ///
    /// [`ConnectError::Connect`] when the server cannot be reached at all.
    async fn connect_tracked(
        &self,
        client: &Client,
        config: ConnectionManagerConfig,
        tracking: &Arc<Tracking>,
        shown: &str,
    ) -> Result<Option<ConnectionManager>, ConnectError> {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let Ok(resp3) = Client::open(info.set_redis_settings(settings)) else {
            tracking.unavailable("no RESP3 client for this server");
            return Ok(None);
        };
        let pushes = Arc::clone(tracking);
        let config = config.set_push_sender(move |push| {
            pushes.on_push(push);
            Ok::<(), std::convert::Infallible>(())
        });
        match self
            .connect_named(resp3, config, RENEW_CONNECTION, shown)
            .await
        {
            Ok(conn) => Ok(Some(conn)),
            Err(ConnectError::Connect { source, .. }) if refused(&source) => {
                tracking.unavailable(&format!("the server refused RESP3: {source}"));
                Ok(None)
            }
            Err(other) => Err(other),
        }
    }

    /// Opens one managed connection within the connect timeout and names
    /// it, so that `CLIENT LIST` tells the connections apart.
    async fn connect_named(
        &self,
        client: Client,
        config: ConnectionManagerConfig,
        name: &str,
        shown: &str,
    ) -> Result<ConnectionManager, ConnectError> {
        let connecting = ConnectionManager::new_with_config(client, config);
        let mut conn = self.bounded_connect(connecting, shown).await?;
        self.set_name(&mut conn, name).await;
        Ok(conn)
    }

    /// Names a connection with `CLIENT SETNAME`. Only for operators reading
    /// CLIENT LIST: a server or ACL that refuses it costs nothing else, so
    /// its outcome is ignored; a reconnection starts unnamed.
    async fn set_name(&self, conn: &mut ConnectionManager, name: &str) {
        let mut setname = redis::cmd("CLIENT");
        setname.arg("SETNAME").arg(name);
        let _ = tokio::time::timeout(self.connect_timeout, setname.query_async::<()>(conn)).await;
    }

    /// Waits for a connection within the connect timeout.
    /// Loads every script on every server (every node of a cluster) before
    /// the first call, so that many calls sent at once on a fresh
    /// connection do not each meet `NOSCRIPT` and load the script again.
    /// A server that refuses (an ACL without `SCRIPT`) or does not answer
    /// in time is left to load each script on its first `NOSCRIPT`, as
    /// after a restart.
    async fn load_scripts(&self, conn: &Conn, shown: &str) {
        let loads: Vec<redis::Cmd> = scripts::all().map(scripts::load).into();
        let loading =
            futures_util::future::join_all(loads.iter().map(|cmd| conn.on_every_server(cmd)));
        match tokio::time::timeout(self.connect_timeout, loading).await {
            Ok(replies) => {
                let refused = replies.into_iter().find_map(|reply| match reply {
                    Err(error) => Some(error.to_string()),
                    Ok(nodes) => nodes
                        .into_iter()
                        .find_map(|(_, reply)| reply.err().map(|e| e.to_string())),
                });
                if let Some(error) = refused {
                    warn!(server = shown, %error, "could not load the scripts at connect; each is loaded on its first NOSCRIPT instead");
                }
            }
            Err(_) => warn!(
                server = shown,
                "the scripts were not loaded within the connect timeout; each is loaded on its first NOSCRIPT instead"
            ),
        }
    }

    /// Whether the server behind a plain URL is a Redis Cluster node
    /// (`INFO cluster` says `cluster_enabled:1`): it refuses a script whose
    /// keys hash to different slots, so batches must not cross them. A
    /// server that does not answer is taken as not one; a `CROSSSLOT`
    /// refusal later says otherwise (see `RedisBackend::bounded`).
    async fn is_cluster_node(&self, ops: &mut ConnectionManager, shown: &str) -> bool {
        let mut info = redis::cmd("INFO");
        info.arg("cluster");
        match tokio::time::timeout(self.op_timeout, info.query_async::<String>(ops)).await {
            Ok(Ok(reply)) => {
                let on = reply.lines().any(|l| l.trim() == "cluster_enabled:1");
                if on {
                    info!(
                        server = shown,
                        "the server is a Redis Cluster node behind one address: batches are grouped by slot"
                    );
                }
                on
            }
            _ => false,
        }
    }

    async fn bounded_connect<T>(
        &self,
        connecting: impl std::future::Future<Output = redis::RedisResult<T>>,
        shown: &str,
    ) -> Result<T, ConnectError> {
        match tokio::time::timeout(self.connect_timeout, connecting).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(source)) => Err(ConnectError::Connect {
                url_redacted: shown.to_owned(),
                source,
            }),
            Err(_) => {
                let waited = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no connection within the connect timeout of {:?}",
                        self.connect_timeout
                    ),
                );
                Err(ConnectError::Connect {
                    url_redacted: shown.to_owned(),
                    source: waited.into(),
                })
            }
        }
    }

    /// Without the `cluster` feature: never called, as a Cluster URL is
    /// refused when parsed.
    #[cfg(not(feature = "cluster"))]
    async fn connect_cluster(
        &self,
        nodes: Vec<redis::ConnectionInfo>,
        shown: &str,
    ) -> Result<(Conn, Conn), ConnectError> {
        let _ = nodes;
        Err(ConnectError::FeatureDisabled {
            url_redacted: shown.to_owned(),
            topology: "Redis Cluster",
            feature: "cluster",
        })
    }

    /// Two cluster connections: one for operations, one for renewals.
    #[cfg(feature = "cluster")]
    async fn connect_cluster(
        &self,
        nodes: Vec<redis::ConnectionInfo>,
        shown: &str,
    ) -> Result<(Conn, Conn), ConnectError> {
        if nodes
            .iter()
            .any(|n| matches!(n.addr(), ConnectionAddr::TcpTls { .. }))
        {
            ensure_crypto_provider();
        }
        let client = ClusterClientBuilder::new(nodes)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.op_timeout)
            // Requests are bounded by the op timeout; retries (after MOVED,
            // ASK, TRYAGAIN or a broken connection) happen within it.
            .retries(CLUSTER_RETRIES)
            .min_retry_wait(CLUSTER_MIN_RETRY_WAIT_MS)
            .max_retry_wait(CLUSTER_MAX_RETRY_WAIT_MS)
            .build()
            .map_err(|e| ConnectError::InvalidUrl {
                url_redacted: shown.to_owned(),
                reason: e.to_string(),
            })?;
        let conn = self
            .bounded_connect(client.get_async_connection(), shown)
            .await?;
        let renew = self
            .bounded_connect(client.get_async_connection(), shown)
            .await?;
        Ok((Conn::Cluster(conn), Conn::Cluster(renew)))
    }

    /// The connection to a Sentinel-monitored master; with `tracking`, in
    /// RESP3 with its pushes handed to it.
    async fn connect_sentinel(
        &self,
        target: &SentinelTarget,
        tracking: Option<&Arc<Tracking>>,
        shown: &str,
    ) -> Result<Conn, ConnectError> {
        let client = target.client(tracking.is_some(), shown)?;
        let mut config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.op_timeout));
        if let Some(tracking) = tracking {
            let pushes = Arc::clone(tracking);
            config = config.set_push_sender(move |push| {
                pushes.on_push(push);
                Ok::<(), std::convert::Infallible>(())
            });
        }
        let needs = Needs {
            cluster: false,
            wait: self.wait.is_some(),
        };
        let conn =
            Arc::new(SentinelConn::new(client, config, tracking.cloned()).checking(needs, shown));
        self.bounded_connect(conn.current(), shown).await?;
        Ok(Conn::Sentinel(conn))
    }

    /// Release notices behind Sentinel: a RESP3 connection of their own to
    /// the master the sentinels name, opened on first use.
    fn sentinel_notices(
        &self,
        target: &SentinelTarget,
        shown: &str,
    ) -> Result<Notices, ConnectError> {
        let client = target.client(true, shown)?;
        Ok(Notices::sentinel(
            client,
            self.connect_timeout,
            self.op_timeout,
        ))
    }
}

/// What every Sentinel connection is made from, as the URL gave it.
struct SentinelTarget {
    sentinels: Vec<redis::ConnectionInfo>,
    master: String,
    master_info: redis::RedisConnectionInfo,
    tls: bool,
}

impl SentinelTarget {
    /// A client for the master the sentinels name, in RESP3 if `resp3`,
    /// with TLS when the URL asked for it. One place for every Sentinel
    /// connection, so that none of them (the tracked one, the notices') can
    /// lose a setting the others have.
    #[cfg(not(feature = "sentinel"))]
    fn client(&self, resp3: bool, shown: &str) -> Result<SentinelClient, ConnectError> {
        // Never called: a Sentinel URL is refused when parsed.
        let _ = (
            resp3,
            &self.sentinels,
            &self.master,
            &self.master_info,
            self.tls,
        );
        Err(ConnectError::FeatureDisabled {
            url_redacted: shown.to_owned(),
            topology: "Sentinel-monitored master",
            feature: "sentinel",
        })
    }

    #[cfg(feature = "sentinel")]
    fn client(&self, resp3: bool, shown: &str) -> Result<SentinelClient, ConnectError> {
        let master_info = if resp3 {
            self.master_info
                .clone()
                .set_protocol(ProtocolVersion::RESP3)
        } else {
            self.master_info.clone()
        };
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(master_info)
            .set_tcp_settings(TcpSettings::default().set_nodelay(true));
        if self.tls {
            ensure_crypto_provider();
            node = node.set_tls_mode(redis::TlsMode::Secure);
        }
        SentinelClient::build(
            self.sentinels.clone(),
            self.master.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| ConnectError::InvalidUrl {
            url_redacted: shown.to_owned(),
            reason: e.to_string(),
        })
    }
}

/// Whether a failed connection attempt was refused by the server (an
/// error reply, such as to `HELLO 3`) rather than unable to reach it.
fn refused(source: &redis::RedisError) -> bool {
    !(source.is_io_error()
        || source.is_timeout()
        || source.is_connection_refusal()
        || source.is_connection_dropped())
}

/// How often the cluster client retries a request (after a redirection or
/// a broken connection) before giving up, and how long it waits in between.
#[cfg(feature = "cluster")]
const CLUSTER_RETRIES: u32 = 6;
#[cfg(feature = "cluster")]
const CLUSTER_MIN_RETRY_WAIT_MS: u64 = 10;
#[cfg(feature = "cluster")]
const CLUSTER_MAX_RETRY_WAIT_MS: u64 = 200;

impl RedisBackendBuilder {}

impl fmt::Debug for RedisBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackendBuilder")
            .field("server", &self.target.shown())
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("namespace", &self.namespace)
            .field("fence_retention", &self.fence_retention)
            .field("wait", &self.wait)
            .finish()
    }
}

impl RedisBackend {
    /// Starts configuring a backend for `url`: a standalone server
    /// (`redis://[[user]:password@]host[:port][/db]`, `rediss://…` for TLS
    /// with the `tls` feature, on by default — append `#insecure` to skip
    /// certificate checks, with the `tls-insecure` feature — or
    /// `redis+unix:///path/to/socket?db=0&user=u&pass=p`), a Redis Cluster
    /// (`redis+cluster://host:port,host:port`), or a Sentinel-monitored
    /// master (`redis+sentinel://host:port,host:port/master-name`). Add
    /// `?protocol=resp3` for RESP3. See [`Endpoint`] for every form.
    ///
    /// ```no_run
    /// use leasehold_redis::RedisBackend;
    /// # async fn run() -> Result<(), leasehold_redis::ConnectError> {
    /// let cluster = RedisBackend::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    /// let sentinel = RedisBackend::connect("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster").await?;
    /// # Ok(()) }
    /// ```
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
    pub async fn connect(url: impl Into<String>) -> Result<Self, ConnectError> {
        Self::builder(url).connect().await
    }
}

fn check_timeout(field: &'static str, timeout: Duration) -> Result<(), ConnectError> {
    if (MIN_TIMEOUT..=MAX_TIMEOUT).contains(&timeout) {
        Ok(())
    } else {
        Err(ConnectError::InvalidConfig {
            field,
            reason: format!("{timeout:?} is outside the accepted range of 1ms to 10min"),
        })
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

/// The `CLIENT SETNAME` of the connection for acquire, release and inspect.
pub(crate) const OPS_CONNECTION: &str = "leasehold-ops";
/// The `CLIENT SETNAME` of the connection used only for renewals.
pub(crate) const RENEW_CONNECTION: &str = "leasehold-renew";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_debug_shows_no_password() {
        for url in [
            "redis://app:hunter2@db:6379",
            "redis+cluster://app:hunter2@db:7000,db2:7000",
            "rediss+sentinel://app:hunter2@db:26379,db2:26379/mymaster",
        ] {
            let builder =
                RedisBackend::builder(url).wait_for_replicas(1, Duration::from_millis(10));
            let shown = format!("{builder:?}");
            assert!(
                !shown.contains("hunter2") && shown.contains("app:***@db"),
                "{shown}"
            );
        }
    }

    #[tokio::test]
    async fn topology_errors_do_not_show_the_password() {
        for url in [
            "redis+cluster://app:hunter2@127.0.0.1:1",
            "redis+sentinel://app:hunter2@127.0.0.1:1/mymaster",
        ] {
            let err = RedisBackend::builder(url)
                .connect_timeout(Duration::from_millis(200))
                .connect()
                .await
                .err();
            let shown = format!(
                "{} {err:?}",
                err.as_ref().map(ToString::to_string).unwrap_or_default()
            );
            assert!(
                matches!(err, Some(ConnectError::Connect { .. })),
                "{url}: {shown}"
            );
            assert!(!shown.contains("hunter2"), "{shown}");
        }
    }

    #[tokio::test]
    async fn settings_are_checked_before_connecting() {
        let err = RedisBackend::builder("redis://127.0.0.1:1")
            .namespace("a{b}")
            .connect()
            .await;
        assert!(matches!(
            err,
            Err(ConnectError::InvalidConfig {
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
            Err(ConnectError::InvalidConfig {
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
            Err(ConnectError::InvalidConfig {
                field: "connect_timeout",
                ..
            })
        ));
    }
}
