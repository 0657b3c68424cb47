//! One connection type for every topology: how a script call, with or
//! without a replica acknowledgement, reaches the right server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelClient;
use redis::{AsyncConnectionConfig, Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};

#[cfg(not(feature = "cluster"))]
use crate::absent::ClusterConnection;
#[cfg(not(feature = "sentinel"))]
use crate::absent::SentinelClient;
use crate::capabilities::Needs;
use crate::loads::{Mark, Node, ScriptLoads};
use crate::scripts::{self, Call};
use crate::tracking::Tracking;

/// The connection of a [`RedisBackend`](crate::RedisBackend).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server; reconnects by itself.
    Standalone(ConnectionManager),
    /// Redis Cluster; follows MOVED/ASK and refreshes its slot map by itself.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))] // `absent.rs`
    Cluster(ClusterConnection),
    /// The current master of a Sentinel-monitored set.
    Sentinel(Arc<SentinelConn>),
}

/// A script's reply and, when asked for, how many replicas acknowledged it.
pub(crate) struct Reply {
    pub(crate) value: Value,
    pub(crate) acked: Option<i64>,
}

/// `WAIT numreplicas timeout`, sent right after a write on the same connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Conn {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Runs `call`, then `WAIT` if asked. On `NOSCRIPT` the call waits for
    /// its script to be loaded on the server that answered, one load at a
    /// time per script and server for all the calls that met it
    /// (`loads.rs`), and is sent again.
    pub(crate) async fn eval(
        &self,
        call: &Call,
        wait: Option<Wait>,
        loads: &ScriptLoads,
    ) -> RedisResult<Reply> {
        let mut sends = 0;
        loop {
            let sent = loads.mark();
            let noscript = match self.send(call, wait).await? {
                Sent::Reply(reply) => return Ok(reply),
                Sent::NoScript(err) => err,
            };
            sends += 1;
            if sends == SENDS {
                return Err(noscript);
            }
            // Boxed: it is rare, and the common path should not carry it.
            Box::pin(self.reload(call, sent, loads)).await?;
        }
    }

    /// Sends `call` once.
    async fn send(&self, call: &Call, wait: Option<Wait>) -> RedisResult<Sent> {
        match self {
            Self::Standalone(conn) => send_on(&mut conn.clone(), call, wait).await,
            // Boxed: the cluster client's future is several kilobytes, and
            // unboxed it would size (and be copied with) every caller's
            // future on every topology.
            Self::Cluster(conn) => Box::pin(send_on_cluster(&mut conn.clone(), call, wait)).await,
            Self::Sentinel(sentinel) => {
                Box::pin(sentinel.on_master(async |conn| send_on(conn, call, wait).await)).await
            }
        }
    }

    /// After `call`, sent at `sent`, met `NOSCRIPT`: waits for its script
    /// to be loaded on the server that answered (see
    /// [`ScriptLoads::after_noscript`]).
    async fn reload(&self, call: &Call, sent: Mark, loads: &ScriptLoads) -> RedisResult<()> {
        let node = self.node_of(call).await;
        loads
            .after_noscript(node, call.script().get_hash(), sent, || {
                self.load_script(call)
            })
            .await
    }

    /// The server `call` goes to, as the script loads know it. On a
    /// cluster, the node of the call's first key names itself: the cluster
    /// client routes by slot and does not say to which address, and a node
    /// id stays right behind address translation. A node that does not
    /// answer with its id is known by the call's slot instead, so that the
    /// load is still tried (and fails on its own if the node is down).
    // Without the feature the cluster arm is unreachable (`absent.rs`).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    async fn node_of(&self, call: &Call) -> Node {
        let Self::Cluster(conn) = self else {
            return Node::Only;
        };
        let mut myid = redis::cmd("CLUSTER");
        myid.arg("MYID");
        match routed(&mut conn.clone(), myid, route_for(call.first_key())).await {
            // Redis and Valkey answer with a bulk string, in RESP2 and RESP3.
            Ok(Value::BulkString(id)) => Node::Cluster(String::from_utf8_lossy(&id).into_owned()),
            _ => Node::Slot(Slot::for_key(call.first_key())),
        }
    }

    /// A load of `call`'s script on the server `call` goes to; it owns
    /// what it needs, so that whichever waiter polls it can drive it.
    // Without the feature the cluster arm is unreachable (`absent.rs`).
    #[cfg_attr(
        not(feature = "cluster"),
        allow(unused_variables, unused_mut, unreachable_code)
    )]
    fn load_script(&self, call: &Call) -> BoxFuture<'static, RedisResult<()>> {
        let load = scripts::load(call.script());
        match self {
            Self::Standalone(conn) => {
                let mut conn = conn.clone();
                async move { loaded(load.query_async(&mut conn).await?) }.boxed()
            }
            Self::Cluster(conn) => {
                let mut conn = conn.clone();
                let node = route_for(call.first_key());
                async move { loaded(routed(&mut conn, load, node).await?) }.boxed()
            }
            Self::Sentinel(sentinel) => {
                let sentinel = Arc::clone(sentinel);
                async move {
                    let reply = sentinel
                        .on_master(async |conn| load.query_async::<Value>(conn).await)
                        .await?;
                    loaded(reply)
                }
                .boxed()
            }
        }
    }

    /// Whether the next call will look the master up first (Sentinel, after
    /// the last connection was forgotten).
    pub(crate) fn needs_resolving(&self) -> bool {
        matches!(self, Self::Sentinel(sentinel) if sentinel.cached().is_none())
    }

    /// Behind Sentinel, looks the master up now if the last connection was
    /// forgotten, so that the calls that follow go over one connection.
    ///
    /// # Errors
    ///
    /// The lookup's failure; the next call looks the master up again.
    pub(crate) async fn resolve(&self) -> RedisResult<()> {
        if let Self::Sentinel(sentinel) = self
            && sentinel.cached().is_none()
        {
            sentinel.current().await?;
        }
        Ok(())
    }

    /// Runs one command on the server (or cluster node) that holds `key`.
    // Without the feature the cluster arm is unreachable (`absent.rs`).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables))]
    pub(crate) async fn command(&self, cmd: &Cmd, key: &str) -> RedisResult<Value> {
        match self {
            Self::Standalone(conn) => cmd.query_async(&mut conn.clone()).await,
            Self::Cluster(conn) => {
                routed(&mut conn.clone(), cmd.clone(), route_for(key.as_bytes())).await
            }
            Self::Sentinel(sentinel) => {
                sentinel
                    .on_master(async |conn| cmd.query_async(conn).await)
                    .await
            }
        }
    }
}

impl Conn {
    /// Runs `cmd` on the server, or on every node of a cluster: each
    /// server's address (`None` for the only one) and its reply, an error
    /// reply kept apart from a failure to ask.
    // Without the feature the cluster arm is unreachable (`absent.rs`).
    #[cfg_attr(not(feature = "cluster"), allow(unused_variables, unused_mut))]
    pub(crate) async fn on_every_server(
        &self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(Option<String>, RedisResult<Value>)>> {
        let one = |result: RedisResult<Value>| match result {
            Err(err) if matches!(err.kind(), ErrorKind::Server(_)) => Ok(vec![(None, Err(err))]),
            other => other.map(|value| vec![(None, Ok(value))]),
        };
        match self {
            Self::Standalone(conn) => one(cmd.query_async(&mut conn.clone()).await),
            Self::Sentinel(sentinel) => {
                one(Box::pin(sentinel.on_master(async |conn| cmd.query_async(conn).await)).await)
            }
            Self::Cluster(conn) => {
                let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None));
                // Boxed for the reason given in `eval`.
                let mut conn = conn.clone();
                match Box::pin(conn.route_command(cmd.clone(), every)).await? {
                    Value::Map(replies) => Ok(replies
                        .into_iter()
                        .map(|(node, reply)| {
                            let node = match node {
                                Value::BulkString(bytes) => {
                                    String::from_utf8_lossy(&bytes).into_owned()
                                }
                                other => format!("{other:?}"),
                            };
                            (Some(node), reply.extract_error())
                        })
                        .collect()),
                    other => Err(redis::RedisError::from((
                        ErrorKind::UnexpectedReturnType,
                        "a command sent to every cluster node did not answer per node",
                        format!("{other:?}"),
                    ))),
                }
            }
        }
    }
}

fn route_for(key: &[u8]) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key,
        SlotAddr::Master,
    )))
}

fn is_noscript(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// How many times a call is sent while it meets `NOSCRIPT`: once, again
/// after a load, and once more after another (the scripts lost again
/// while the first load ran, or a load that came just too late for the
/// call); then the `NOSCRIPT` is its error.
const SENDS: usize = 3;

/// What one send of a call got.
enum Sent {
    Reply(Reply),
    NoScript(redis::RedisError),
}

/// A load's reply: an error if the server refused it.
fn loaded(reply: Value) -> RedisResult<()> {
    reply.extract_error().map(drop)
}

/// `EVALSHA` (and `WAIT`) on one connection; the pair goes out as one
/// pipeline so that the `WAIT` cannot land on a newer connection than the
/// write it acknowledges (a fresh connection has nothing to wait for and
/// would be acknowledged at once).
async fn send_on(
    conn: &mut impl ConnectionLike,
    call: &Call,
    wait: Option<Wait>,
) -> RedisResult<Sent> {
    let Some(wait) = wait else {
        return match call.evalsha().query_async::<Value>(conn).await {
            Err(err) if is_noscript(&err) => Ok(Sent::NoScript(err)),
            other => other.map(|value| Sent::Reply(Reply { value, acked: None })),
        };
    };
    let replies: Vec<Value> = acked_pipeline(call, wait).query_async(conn).await?;
    split_acked(replies)
}

/// The same on the cluster node of the call's first key.
async fn send_on_cluster(
    conn: &mut ClusterConnection,
    call: &Call,
    wait: Option<Wait>,
) -> RedisResult<Sent> {
    let Some(wait) = wait else {
        return match routed(conn, call.evalsha().clone(), route_for(call.first_key())).await {
            Err(err) if is_noscript(&err) => Ok(Sent::NoScript(err)),
            other => other.map(|value| Sent::Reply(Reply { value, acked: None })),
        };
    };
    let node =
        SingleNodeRoutingInfo::SpecificNode(Route::with_key(call.first_key(), SlotAddr::Master));
    let replies = conn
        .route_pipeline(acked_pipeline(call, wait), 0, 2, node)
        .await?;
    split_acked(replies)
}

/// A command sent with explicit routing; the cluster client hands error
/// replies back as values then, so they are turned into errors here.
async fn routed(conn: &mut ClusterConnection, cmd: Cmd, route: RoutingInfo) -> RedisResult<Value> {
    conn.route_command(cmd, route).await?.extract_error()
}

fn acked_pipeline(call: &Call, wait: Wait) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let millis = u64::try_from(wait.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    pipe.add_command(call.evalsha().clone())
        .add_command({
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(wait.replicas).arg(millis);
            cmd
        })
        .ignore_errors();
    pipe
}

fn split_acked(replies: Vec<Value>) -> RedisResult<Sent> {
    let mut replies = replies.into_iter();
    let (Some(value), Some(acked), None) = (replies.next(), replies.next(), replies.next()) else {
        return Err(redis::RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "a script call followed by WAIT did not get exactly two replies",
        )));
    };
    let value = match value.extract_error() {
        Err(err) if is_noscript(&err) => return Ok(Sent::NoScript(err)),
        other => other?,
    };
    let acked = match acked.extract_error()? {
        Value::Int(n) => n,
        _ => {
            return Err(redis::RedisError::from((
                ErrorKind::UnexpectedReturnType,
                "WAIT did not answer with an integer",
            )));
        }
    };
    Ok(Sent::Reply(Reply {
        value,
        acked: Some(acked),
    }))
}

/// Whether an error means the connection may point at a server that is no
/// longer the master: a broken or refused connection, a timeout, or a
/// `READONLY` reply from a demoted master.
fn needs_new_master(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || matches!(err.code(), Some("READONLY" | "LOADING" | "MASTERDOWN"))
}

/// A master's address as the sentinels name it: host and port.
pub(crate) type MasterAddr = (String, u16);

/// How long a promotion the sentinels announced binds the lookups that
/// follow: within it, a lookup that names another master (a sentinel that
/// has not switched yet) is refused rather than used. Sentinels spread a
/// switch among themselves within a few seconds; past this, a lookup is
/// trusted as without an announcement, so that an announcement followed
/// by a later failover whose message was missed cannot keep the backend
/// from every master.
const ANNOUNCED_FOR: Duration = Duration::from_secs(10);

/// The master of a Sentinel-monitored set, re-resolved through the
/// sentinels whenever its connection fails or they announce a promotion
/// (`switches.rs`).
pub(crate) struct SentinelConn {
    /// Asks the sentinels for the master; one resolution at a time.
    client: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The connection to the master as last resolved, and what the
    /// sentinels announced.
    state: Mutex<State>,
    /// The generation of the next connection; never reused.
    next_generation: AtomicU64,
    /// Client tracking, told of every new connection to a master.
    tracking: Option<Arc<Tracking>>,
    /// What a master must offer, and the URL to name in a refusal: a
    /// master the sentinels promote later is checked as the first one was
    /// at connect (`capabilities.rs`).
    check: Option<(Needs, String)>,
    /// Dropped with the connection, which ends the subscriptions' tasks.
    stop: tokio::sync::watch::Sender<()>,
}

#[derive(Default)]
struct State {
    /// The connection to the master as last resolved, with a generation
    /// number so that a failure on an old connection does not drop a newer one.
    current: Option<Current>,
    /// The master the latest `+switch-master` named.
    announced: Option<MasterAddr>,
    /// While set, with when it came: the announced master has not been
    /// reached yet, and a lookup naming another is refused.
    pending: Option<tokio::time::Instant>,
    /// The announcement already reported every lease changed: the
    /// connection that follows it need not report them again.
    reported: bool,
}

#[derive(Clone)]
struct Current {
    generation: u64,
    conn: MultiplexedConnection,
    addr: Option<MasterAddr>,
}

impl SentinelConn {
    pub(crate) fn new(
        client: SentinelClient,
        config: AsyncConnectionConfig,
        tracking: Option<Arc<Tracking>>,
    ) -> Self {
        Self {
            client: tokio::sync::Mutex::new(client),
            config,
            state: Mutex::new(State::default()),
            next_generation: AtomicU64::new(0),
            tracking,
            check: None,
            stop: tokio::sync::watch::Sender::new(()),
        }
    }

    /// Checks every master resolved after the first (which the connect
    /// checks itself) for what the backend calls.
    pub(crate) fn checking(mut self, needs: Needs, shown: &str) -> Self {
        self.check = Some((needs, shown.to_owned()));
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update leaves the state whole; a panic elsewhere cannot tear it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        self.state()
            .current
            .as_ref()
            .map(|current| (current.generation, current.conn.clone()))
    }

    /// A receiver whose `changed()` fails once this connection is dropped.
    pub(crate) fn stopped(&self) -> tokio::sync::watch::Receiver<()> {
        self.stop.subscribe()
    }

    /// A sentinel announced that `master` is the set's master now
    /// (`+switch-master`). Unless the connection already goes there, it is
    /// forgotten, so that the next call asks the sentinels, and every
    /// lease is reported changed, as after a reconnection, so that the
    /// watchdog renews them all on the new master at once. Every sentinel
    /// announces the same switch: only the first announcement of a master
    /// counts.
    pub(crate) fn switched(&self, master: MasterAddr) {
        let mut state = self.state();
        if state.announced.as_ref() == Some(&master) {
            return;
        }
        if state
            .current
            .as_ref()
            .is_some_and(|current| current.addr.as_ref() == Some(&master))
        {
            // A failed call already led here; its connection reported.
            state.announced = Some(master);
            state.pending = None;
            return;
        }
        state.announced = Some(master);
        state.pending = Some(tokio::time::Instant::now());
        state.current = None;
        state.reported = true;
        drop(state);
        if let Some(tracking) = &self.tracking {
            tracking.new_connection(true);
        }
    }

    /// Runs `op` on the current master. An error that may mean the master
    /// moved, or a future dropped mid-call, makes the next call look the
    /// master up again.
    async fn on_master<T>(
        &self,
        op: impl AsyncFnOnce(&mut MultiplexedConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let (generation, mut conn) = self.current().await?;
        let mut guard = DropGuard {
            sentinel: self,
            generation,
            armed: true,
        };
        let result = op(&mut conn).await;
        guard.armed = match &result {
            Ok(_) => false,
            Err(err) => needs_new_master(err),
        };
        result
    }

    /// The connection to the current master, asking the sentinels for it
    /// (and checking that it says it is a master) if there is none. After
    /// an announced promotion, a master other than the one announced is
    /// refused (a transient error) for up to [`ANNOUNCED_FOR`]: a sentinel
    /// that has not switched yet, whose old master may still answer, must
    /// not bring the renewals back to it.
    pub(crate) async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let mut client = self.client.lock().await;
        // Another caller may have resolved it while we waited for the lock.
        if let Some(current) = self.cached() {
            return Ok(current);
        }
        let master = client.async_get_client().await?;
        let addr = master_addr(master.get_connection_info());
        self.check_announced(addr.as_ref())?;
        let mut conn = master
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        if self.next_generation.load(Ordering::Relaxed) > 0
            && let Some((needs, shown)) = &self.check
        {
            // A promoted master: refused (and not kept, so that the next
            // call asks the sentinels again) when it lacks what the
            // scripts call, with an error that names it, rather than a
            // script error later.
            refuse_unsupported(&mut conn, *needs, shown).await?;
        }
        let mut state = self.state();
        // An announcement may have come while this lookup ran.
        check_pending(&state, addr.as_ref())?;
        if state.announced.is_some() && state.announced == addr {
            state.pending = None;
        }
        let report = !std::mem::take(&mut state.reported);
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        state.current = Some(Current {
            generation,
            conn: conn.clone(),
            addr,
        });
        if let Some(tracking) = &self.tracking {
            // A new connection (perhaps to a newly promoted master, which
            // may lack writes the old one acknowledged): tracking must be
            // turned on again, and every lease checked, unless the
            // announcement that led here already reported them all (every
            // lease renewed since goes through this lookup). Under the
            // state's lock, so that an announcement cannot come between
            // the connection and its report.
            tracking.new_connection(generation > 0 && report);
        }
        drop(state);
        Ok((generation, conn))
    }

    fn check_announced(&self, addr: Option<&MasterAddr>) -> RedisResult<()> {
        check_pending(&self.state(), addr)
    }

    /// Forgets the connection of `generation`, so the next call asks the sentinels.
    fn forget(&self, generation: u64) {
        let mut state = self.state();
        if state
            .current
            .as_ref()
            .is_some_and(|current| current.generation == generation)
        {
            state.current = None;
        }
    }
}

/// Refuses a lookup that named `addr` while another master's promotion,
/// announced less than [`ANNOUNCED_FOR`] ago, has not been reached.
fn check_pending(state: &State, addr: Option<&MasterAddr>) -> RedisResult<()> {
    let (Some(announced), Some(since)) = (&state.announced, state.pending) else {
        return Ok(());
    };
    if addr == Some(announced) || since.elapsed() >= ANNOUNCED_FOR {
        return Ok(());
    }
    Err(redis::RedisError::from(std::io::Error::other(format!(
        "the sentinels announced {}:{} as the new master, but the lookup named {}; asking again",
        announced.0,
        announced.1,
        addr.map_or_else(
            || "another".to_owned(),
            |(host, port)| format!("{host}:{port}")
        )
    ))))
}

/// The host and port of a master's address (none for a Unix socket).
fn master_addr(info: &redis::ConnectionInfo) -> Option<MasterAddr> {
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port)
        | redis::ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
        _ => None,
    }
}

/// Asks a newly resolved master for its name, version and commands, and
/// turns a refusal into a server error whose code is `UNSUPPORTED` and
/// whose text is the connect-time refusal's (server, version, what is
/// missing). A master that cannot be judged is accepted, as at connect.
async fn refuse_unsupported(
    conn: &mut MultiplexedConnection,
    needs: Needs,
    shown: &str,
) -> RedisResult<()> {
    let (hello, info) = needs.probes();
    let mut both = conn.clone();
    let (hello, info) = tokio::join!(
        hello.query_async::<Value>(conn),
        info.query_async::<Value>(&mut both)
    );
    match needs.judge(hello, info, shown) {
        Ok(_) => Ok(()),
        Err(refused) => Err(redis::make_extension_error(
            "UNSUPPORTED".to_owned(),
            Some(refused.to_string()),
        )),
    }
}

/// Forgets a sentinel master's connection unless disarmed: the call failed
/// in a way that points at a failover, or it was dropped (timed out)
/// before an answer came, which is how a hung master shows.
struct DropGuard<'a> {
    sentinel: &'a SentinelConn,
    generation: u64,
    armed: bool,
}

impl Drop for DropGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.sentinel.forget(self.generation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> MasterAddr {
        ("127.0.0.1".to_owned(), port)
    }

    /// After an announcement, only the announced master is taken, until it
    /// is reached or [`ANNOUNCED_FOR`] has passed.
    #[tokio::test(start_paused = true)]
    async fn an_announced_master_binds_the_lookups_for_a_while() {
        let mut state = State::default();
        assert!(
            check_pending(&state, Some(&addr(1))).is_ok(),
            "nothing announced"
        );
        state.announced = Some(addr(2));
        state.pending = Some(tokio::time::Instant::now());
        let refused = check_pending(&state, Some(&addr(1)));
        assert!(
            refused.as_ref().is_err_and(redis::RedisError::is_io_error),
            "the old master is refused as a transient failure: {refused:?}"
        );
        assert!(check_pending(&state, None).is_err(), "an unknown address");
        assert!(check_pending(&state, Some(&addr(2))).is_ok());
        tokio::time::advance(ANNOUNCED_FOR).await;
        assert!(
            check_pending(&state, Some(&addr(1))).is_ok(),
            "past the announcement's hold, the sentinels are trusted again"
        );
        state.pending = None;
        assert!(check_pending(&state, Some(&addr(1))).is_ok(), "reached");
    }
}
