//! Release notices: one RESP3 subscription connection per backend, shared by
//! every waiter, that turns `P:released` messages into wake-ups.
//!
//! On a standalone server the channel is a plain one (`SUBSCRIBE`, and
//! release scripts `PUBLISH`); on a cluster it is a sharded one
//! (`SSUBSCRIBE`, `SPUBLISH`): the channel name carries the key's hash tag,
//! so it lives in the lease's slot and the notice stays on that shard. The
//! cluster connection subscribes on the node that owns the slot, and again
//! after a reconnect or a slot move.
//!
//! Behind Sentinel the connection goes to the master the sentinels name. No
//! client reconnects and subscribes again there by itself, so a lost
//! connection is marked, and the next acquisition attempt of any waiter
//! ([`Notices::restore`]) asks the sentinels for the master again and
//! subscribes there to every channel still watched.
//!
//! The connection is opened on the first subscription, so programs that never
//! wait open none. Messages are dispatched by the connection's push callback
//! itself (a map lookup and a counter bump), so no task of ours runs. After
//! a reconnect the redis crate subscribes again, and every waiter is woken
//! once, since notices may have been missed meanwhile.
//!
//! Unsubscribing needs a round trip, which a `Drop` cannot make: a channel
//! no one watches any more stays subscribed (it lingers) until the next
//! subscription to another channel unsubscribes it. A process that waits
//! for the same key again, as a worker that takes a key in a loop does
//! after each release, finds its channel still subscribed and sends no
//! `SUBSCRIBE` (nor `UNSUBSCRIBE` when it stopped waiting), unless its
//! waiter races the other processes' on each notice (a permit's, a
//! share's): then a lingering channel is subscribed again, at the end of
//! the order in which Redis tells subscribers (see below). While its
//! channel lingers with no watch, the process's own release of the key is
//! announced to no one here: that one notice is dropped on arrival, so a
//! waiter that starts listening right after its release does not take its
//! own notice for the next holder's.
//!
//! Redis 7.0 sends a message to a channel's subscribers in the order they
//! subscribed; Valkey 8 keeps no such order. Waiters therefore do not rely
//! on it, and racing ones subscribe again so that no process stays first:
//! each watch carries the channel's subscriber count when it
//! subscribed (`PUBSUB NUMSUB`, one more round trip on this connection;
//! not on a cluster), and the waiters of the process that waited longest
//! go first (see the watchdog's `waiting.rs`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use leasehold_core::{FencingToken, HandoverWatch, HolderId, ReleaseWatch};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClientBuilder;
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
#[cfg(feature = "sentinel")]
use redis::sentinel::SentinelClient;

#[cfg(not(feature = "cluster"))]
use crate::absent::ClusterConnection;
#[cfg(not(feature = "sentinel"))]
use crate::absent::SentinelClient;
use redis::{Client, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{OnceCell, oneshot, watch};

use crate::reply::Failure;

pub(crate) struct Notices {
    /// This backend's own name among the processes that wait (32 random
    /// hex digits, drawn on first use): a handover to one of its waiters
    /// is announced on `P:released:<name>`, which only it subscribes to,
    /// rather than to every process listening on `P:released`.
    process: std::sync::OnceLock<[u8; 32]>,
    source: Source,
    connect_timeout: Duration,
    op_timeout: Duration,
    conn: OnceCell<Subscriber>,
    /// Behind Sentinel: the connection to the master as last resolved.
    sentinel_conn: Mutex<Option<MultiplexedConnection>>,
    channels: Arc<Mutex<Channels>>,
}

/// Where the subscription connection goes.
enum Source {
    /// A standalone server: plain channels. (Boxed: a client is ten times
    /// the size of the cluster's node list.)
    Server(Box<Client>),
    /// A cluster's seed nodes: sharded channels.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))] // `absent.rs`
    Cluster(Vec<ConnectionInfo>),
    /// The master a set of sentinels names (asked over RESP3): plain
    /// channels. (Boxed, as the client is.)
    Sentinel(Box<tokio::sync::Mutex<SentinelClient>>),
}

/// The subscription connection, once open. Both kinds subscribe again by
/// themselves after a reconnect.
#[derive(Clone)]
enum Subscriber {
    Server(ConnectionManager),
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))] // `absent.rs`
    Cluster(ClusterConnection),
    Sentinel(MultiplexedConnection),
}

impl Subscriber {
    async fn subscribe(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        match self {
            Self::Server(conn) => conn.subscribe(channel).await,
            Self::Cluster(conn) => conn.ssubscribe(channel).await,
            Self::Sentinel(conn) => conn.subscribe(channel).await,
        }
    }

    /// Subscribes to several plain channels at once (not on a cluster,
    /// where restoring is the client's own business).
    async fn subscribe_all(&mut self, channels: &[Vec<u8>]) -> redis::RedisResult<()> {
        match self {
            Self::Server(conn) => conn.subscribe(channels).await,
            Self::Sentinel(conn) => conn.subscribe(channels).await,
            Self::Cluster(conn) => {
                for channel in channels {
                    conn.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    /// How many connections subscribe to `channel` on the server (processes
    /// listening for it, each with one notices connection). `None` on a
    /// cluster, where the count would have to be asked of the slot's node.
    async fn listeners(&mut self, channel: &[u8]) -> redis::RedisResult<Option<usize>> {
        let mut numsub = redis::cmd("PUBSUB");
        numsub.arg("NUMSUB").arg(channel);
        let reply: (Vec<u8>, usize) = match self {
            Self::Server(conn) => numsub.query_async(conn).await?,
            Self::Sentinel(conn) => numsub.query_async(conn).await?,
            Self::Cluster(_) => return Ok(None),
        };
        Ok(Some(reply.1))
    }

    async fn unsubscribe(&mut self, channels: &[Vec<u8>]) -> redis::RedisResult<()> {
        match self {
            Self::Server(conn) => conn.unsubscribe(channels).await,
            Self::Sentinel(conn) => conn.unsubscribe(channels).await,
            Self::Cluster(conn) => {
                // One slot per SUNSUBSCRIBE: a cluster refuses several at once.
                for channel in channels {
                    conn.sunsubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }
}

#[derive(Default)]
struct Channels {
    /// Channels watched, and subscribed ones that linger with no watch.
    watched: HashMap<Vec<u8>, Channel>,
    /// Channels no one watches any more, still subscribed on the server
    /// (lingering), to unsubscribe when another channel is subscribed.
    stale: Vec<Vec<u8>>,
    /// How long a notice of this process's own release is waited for, to
    /// be dropped (see [`Channel::own_release`]).
    own_bound: Duration,
    /// The connection broke since it last subscribed (Sentinel: nothing
    /// subscribes again by itself).
    lost: bool,
    /// Waiters in fair queues listening for a release that hands them the
    /// lease, by holder id in hex (see [`Notices::watch_handover`]).
    handovers: HashMap<[u8; 32], oneshot::Sender<FencingToken>>,
}

struct Channel {
    notices: watch::Sender<u64>,
    /// Watches alive; 0 while the channel lingers.
    watchers: usize,
    subscribed: bool,
    /// Unsubscribed and subscribed again for a new watch (`afresh`), the
    /// two still on their way: `subscribed` is false meanwhile, so that a
    /// watch taken now subscribes too and a restore skips it, but a
    /// release by this process still counts the subscription as its own
    /// (`own_subscription`). The server has it before the `UNSUBSCRIBE` and
    /// after the `SUBSCRIBE`; counted as someone else's, a release of a
    /// permit here while another waiter here resubscribes would be heard
    /// by no one else and still make this process yield.
    resubscribing: bool,
    /// When this process released the key while the channel lingered with
    /// no watch: the notice of that release, the next to arrive, is for no
    /// one here and is dropped (unless it is later than `own_bound`, as
    /// when the release found the lease gone and announced nothing).
    own_release: Option<Instant>,
}

impl Channels {
    /// No channel yet, for a backend whose calls take at most the larger
    /// of `connect_timeout` and `op_timeout`: as long as a notice of this
    /// process's own release is waited for. One place for every source,
    /// so that the standalone suites judge the cluster's and Sentinel's.
    fn shared(connect_timeout: Duration, op_timeout: Duration) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Channels {
            own_bound: op_timeout.max(connect_timeout),
            ..Channels::default()
        }))
    }
}

fn lock(channels: &Mutex<Channels>) -> MutexGuard<'_, Channels> {
    // Every update is a single insert, remove or counter change.
    channels.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps one waiter's interest in a channel alive.
struct Subscription {
    channels: Arc<Mutex<Channels>>,
    name: Vec<u8>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut channels = lock(&self.channels);
        let Some(channel) = channels.watched.get_mut(&self.name) else {
            return;
        };
        channel.watchers -= 1;
        if channel.watchers == 0 {
            if channel.subscribed {
                // Lingers: a new watch of it sends nothing.
                channels.stale.push(std::mem::take(&mut self.name));
            } else {
                channels.watched.remove(&self.name);
            }
        }
    }
}

/// Keeps one fair waiter's interest in a handover alive.
struct HandoverInterest {
    channels: Arc<Mutex<Channels>>,
    holder: [u8; 32],
}

impl Drop for HandoverInterest {
    fn drop(&mut self) {
        lock(&self.channels).handovers.remove(&self.holder);
    }
}

impl Notices {
    /// Notices for the server `client` connects to, over a RESP3 copy of it.
    pub(crate) fn new(client: &Client, connect_timeout: Duration, op_timeout: Duration) -> Self {
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let resp3 = Client::open(info.set_redis_settings(settings));
        Self {
            // Opening a client only checks the connection info, which the
            // original client already passed; keep the original otherwise.
            source: Source::Server(Box::new(resp3.unwrap_or_else(|_| client.clone()))),
            connect_timeout,
            op_timeout,
            conn: OnceCell::new(),
            sentinel_conn: Mutex::new(None),
            process: std::sync::OnceLock::new(),
            channels: Channels::shared(connect_timeout, op_timeout),
        }
    }

    /// Notices on the cluster of the seed `nodes`, over sharded channels.
    pub(crate) fn cluster(
        nodes: Vec<ConnectionInfo>,
        connect_timeout: Duration,
        op_timeout: Duration,
    ) -> Self {
        Self {
            source: Source::Cluster(nodes),
            connect_timeout,
            op_timeout,
            conn: OnceCell::new(),
            sentinel_conn: Mutex::new(None),
            process: std::sync::OnceLock::new(),
            channels: Channels::shared(connect_timeout, op_timeout),
        }
    }

    /// Notices on the master the sentinels of `client` name; `client` must
    /// ask for RESP3 connections.
    pub(crate) fn sentinel(
        client: SentinelClient,
        connect_timeout: Duration,
        op_timeout: Duration,
    ) -> Self {
        Self {
            source: Source::Sentinel(Box::new(tokio::sync::Mutex::new(client))),
            connect_timeout,
            op_timeout,
            conn: OnceCell::new(),
            sentinel_conn: Mutex::new(None),
            process: std::sync::OnceLock::new(),
            channels: Channels::shared(connect_timeout, op_timeout),
        }
    }

    /// Whether [`restore`](Self::restore) has work to do: behind Sentinel,
    /// after the subscription connection broke.
    pub(crate) fn needs_restore(&self) -> bool {
        matches!(self.source, Source::Sentinel(_)) && lock(&self.channels).lost
    }

    /// Behind Sentinel, after the subscription connection broke: asks the
    /// sentinels for the master again and subscribes there to every channel
    /// still watched (lingering ones are forgotten), then wakes every
    /// waiter (notices may have been missed meanwhile). Elsewhere, and
    /// while the connection holds, a flag check. Best effort: a failure
    /// leaves the mark for the next attempt, and waiters poll meanwhile.
    pub(crate) async fn restore(&self) {
        if !matches!(self.source, Source::Sentinel(_)) {
            return;
        }
        let names: Vec<Vec<u8>> = {
            let mut channels = lock(&self.channels);
            if !std::mem::take(&mut channels.lost) {
                return;
            }
            // The old connection's subscriptions went with it. Lingering
            // channels (no watch) are forgotten rather than subscribed
            // again: subscribed again off the `stale` list, nothing would
            // ever unsubscribe them, and each failover would add its
            // lingering channels to the new master's for good.
            channels.stale.clear();
            channels.watched.retain(|_, c| c.watchers > 0);
            channels
                .watched
                .iter()
                .filter(|(_, c)| c.subscribed)
                .map(|(name, _)| name.clone())
                .collect()
        };
        *self
            .sentinel_conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        let resubscribed = async {
            let mut conn = self.connection().await?;
            if !names.is_empty() {
                self.bounded(conn.subscribe_all(&names)).await?;
            }
            Ok::<(), Failure>(())
        }
        .await;
        let channels = lock(&self.channels);
        match resubscribed {
            Ok(()) => {
                for channel in channels.watched.values() {
                    channel.notices.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            Err(_) => {
                drop(channels);
                lock(&self.channels).lost = true;
            }
        }
    }

    /// Subscribes to `channel` and returns a watch that fires on each
    /// notice; with `count`, the watch knows how many processes listen on
    /// the channel (one more round trip). With `afresh`, a channel that
    /// lingers (subscribed, watched by no one here) is unsubscribed and
    /// subscribed again, which puts this process at the end of the order in
    /// which Redis 7.0 tells the channel's subscribers: for waiters that
    /// race other processes' on each notice, which would otherwise lose
    /// nearly every race to the processes that subscribed before them.
    pub(crate) async fn watch(
        &self,
        channel: String,
        count: bool,
        afresh: bool,
    ) -> Result<ReleaseWatch, Failure> {
        let name = channel.into_bytes();
        let (receiver, subscribe, stale) = {
            let mut channels = lock(&self.channels);
            let entry = channels
                .watched
                .entry(name.clone())
                .or_insert_with(|| Channel {
                    notices: watch::Sender::new(0),
                    watchers: 0,
                    subscribed: false,
                    resubscribing: false,
                    own_release: None,
                });
            let again = (afresh || leasehold_core::ablation::off("linger"))
                && entry.subscribed
                && entry.watchers == 0;
            if again {
                // Subscribed again below (see `resubscribing`).
                entry.subscribed = false;
                entry.resubscribing = true;
            }
            entry.watchers += 1;
            let receiver = entry.notices.subscribe();
            let subscribe = !entry.subscribed;
            // A new subscription sends the lingering channels away, but
            // any another waiter took up meanwhile. Watching a lingering
            // channel again sends nothing, and leaves the others lingering:
            // a fair waiter watches two channels of its key each time
            // (`P:released` and its process's handover channel), which
            // must not send each other away.
            let mut stale = Vec::new();
            if again {
                stale.push(name.clone());
            }
            if subscribe {
                for c in std::mem::take(&mut channels.stale) {
                    if c != name && channels.watched.get(&c).is_none_or(|w| w.watchers == 0) {
                        channels.watched.remove(&c);
                        stale.push(c);
                    }
                }
            } else {
                channels.stale.retain(|c| *c != name);
            }
            (receiver, subscribe, stale)
        };
        // From here on a dropped future still gives the interest back.
        let subscription = Subscription {
            channels: Arc::clone(&self.channels),
            name: name.clone(),
        };
        let mut conn = self.connection().await?;
        if !stale.is_empty() {
            // Best effort: a failure leaves a few idle subscriptions behind.
            let _ = self.bounded(conn.unsubscribe(&stale)).await;
        }
        if subscribe {
            let subscribed = self.bounded(conn.subscribe(&name)).await;
            if let Some(channel) = lock(&self.channels).watched.get_mut(&name) {
                channel.resubscribing = false;
                if subscribed.is_ok() {
                    channel.subscribed = true;
                }
            }
            subscribed?;
        }
        let watch = ReleaseWatch::new(receiver, subscription);
        if !count {
            return Ok(watch);
        }
        // Best effort: without the count, waiters race on every notice as
        // before.
        match self.bounded(conn.listeners(&name)).await {
            Ok(Some(listeners)) => Ok(watch.with_listeners(listeners)),
            _ => Ok(watch),
        }
    }

    /// A watch of `channel` if this connection is subscribed to it already
    /// (watched, or lingering from an earlier wait): no round trip. `None`
    /// when it is not, or when the connection broke since (Sentinel: the
    /// channel must be subscribed again first).
    pub(crate) fn watch_subscribed(&self, channel: String) -> Option<ReleaseWatch> {
        let name = channel.into_bytes();
        let receiver = {
            let mut channels = lock(&self.channels);
            if channels.lost {
                return None;
            }
            let entry = channels.watched.get_mut(&name).filter(|c| c.subscribed)?;
            entry.watchers += 1;
            let receiver = entry.notices.subscribe();
            channels.stale.retain(|c| *c != name);
            receiver
        };
        let subscription = Subscription {
            channels: Arc::clone(&self.channels),
            name,
        };
        Some(ReleaseWatch::new(receiver, subscription))
    }

    /// This backend's name among waiting processes, once a waiter of it
    /// has listened for a handover (see [`Self::watch_handover`]).
    pub(crate) fn process(&self) -> Option<&[u8; 32]> {
        self.process.get()
    }

    /// Listens for a release that hands a lease to `holder`: the release's
    /// notice names the holder and the grant's fencing token
    /// (`release_fair.lua`), on `<released>:<process>`, this backend's own
    /// channel for the lease (`released` is the lease's release channel).
    /// Subscribed on first use, it lingers between waits as any channel.
    pub(crate) async fn watch_handover(
        &self,
        released: String,
        holder: &HolderId,
    ) -> Result<HandoverWatch, Failure> {
        let process = match self.process.get() {
            Some(process) => process,
            None => {
                let drawn = HolderId::generate()
                    .map_err(|e| Failure::Unexpected(format!("no random process name: {e}")))?;
                // Another waiter may have drawn one meanwhile: the first stays.
                let _ = self.process.set(drawn.to_hex_bytes());
                self.process.get().ok_or_else(|| {
                    Failure::Unexpected("no process name after drawing one".to_owned())
                })?
            }
        };
        let mut channel = released;
        channel.push(':');
        channel.push_str(std::str::from_utf8(process).unwrap_or_default());
        let (sender, receiver) = oneshot::channel();
        let holder = holder.to_hex_bytes();
        lock(&self.channels).handovers.insert(holder, sender);
        let interest = HandoverInterest {
            channels: Arc::clone(&self.channels),
            holder,
        };
        let subscription = self.watch(channel, false, false).await?;
        Ok(HandoverWatch::new(receiver, (interest, subscription)))
    }

    /// How many of `channel`'s subscribers on the server are this
    /// backend's notices connection: 1 while any watch holds it, else 0.
    /// The channel's name is built only when something is watched: a
    /// release with no waiter in this process (the usual one) builds none.
    ///
    /// Called just before the release is sent: with the channel lingering
    /// (no watch), the notice of this release is dropped on arrival.
    pub(crate) fn own_subscription(&self, channel: impl FnOnce() -> String) -> u8 {
        let mut channels = lock(&self.channels);
        if channels.watched.is_empty() {
            return 0;
        }
        match channels.watched.get_mut(channel().as_bytes()) {
            Some(c) if c.subscribed || c.resubscribing => {
                if c.watchers == 0 && !leasehold_core::ablation::off("own-notice") {
                    c.own_release = Some(Instant::now());
                }
                1
            }
            _ => 0,
        }
    }

    /// How many of `channel`'s subscribers on the server are a waiter of
    /// ours: 1 while exactly one watch listens on our connection (so the
    /// waiter offering a handover is that one), else 0, so that a second
    /// waiter sharing this backend is counted as someone else.
    pub(crate) fn own_listeners(&self, channel: &str) -> u8 {
        let channels = lock(&self.channels);
        match channels.watched.get(channel.as_bytes()) {
            Some(c) if c.subscribed && c.watchers == 1 => 1,
            _ => 0,
        }
    }

    async fn connection(&self) -> Result<Subscriber, Failure> {
        if let Source::Sentinel(client) = &self.source {
            return self.sentinel_connection(client).await;
        }
        self.conn
            .get_or_try_init(|| async {
                let channels = Arc::clone(&self.channels);
                let on_push = move |push: PushInfo| {
                    dispatch(&channels, &push);
                    Ok::<(), Infallible>(())
                };
                match &self.source {
                    Source::Server(client) => {
                        let config = ConnectionManagerConfig::new()
                            .set_connection_timeout(Some(self.connect_timeout))
                            .set_response_timeout(Some(self.op_timeout))
                            .set_automatic_resubscription()
                            .set_push_sender(on_push);
                        let connecting =
                            ConnectionManager::new_with_config((**client).clone(), config);
                        self.bounded(connecting).await.map(Subscriber::Server)
                    }
                    // `connection` sends Sentinel to its own path first;
                    // this only keeps the match whole.
                    Source::Sentinel(client) => self.sentinel_connection(client).await,
                    #[cfg(not(feature = "cluster"))]
                    Source::Cluster(_) => Err(Failure::from_redis(
                        crate::absent::cluster_feature_off(),
                        self.op_timeout,
                    )),
                    #[cfg(feature = "cluster")]
                    Source::Cluster(nodes) => {
                        let client = ClusterClientBuilder::new(nodes.clone())
                            .use_protocol(ProtocolVersion::RESP3)
                            .connection_timeout(self.connect_timeout)
                            .response_timeout(self.op_timeout)
                            .push_sender(on_push)
                            .build()
                            .map_err(|e| Failure::from_redis(e, self.op_timeout))?;
                        self.bounded(client.get_async_connection())
                            .await
                            .map(Subscriber::Cluster)
                    }
                }
            })
            .await
            .cloned()
    }

    /// The connection to the master the sentinels name, resolved if there is none.
    async fn sentinel_connection(
        &self,
        client: &tokio::sync::Mutex<SentinelClient>,
    ) -> Result<Subscriber, Failure> {
        let cached = || {
            self.sentinel_conn
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        };
        if let Some(conn) = cached() {
            return Ok(Subscriber::Sentinel(conn));
        }
        let mut client = client.lock().await;
        // Another waiter may have resolved it while we waited for the lock.
        if let Some(conn) = cached() {
            return Ok(Subscriber::Sentinel(conn));
        }
        let channels = Arc::clone(&self.channels);
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.op_timeout))
            .set_push_sender(move |push: PushInfo| {
                dispatch(&channels, &push);
                Ok::<(), Infallible>(())
            });
        let conn = self
            .bounded(client.get_async_connection_with_config(&config))
            .await?;
        *self
            .sentinel_conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(conn.clone());
        Ok(Subscriber::Sentinel(conn))
    }

    /// Whether release scripts must announce with `SPUBLISH` (a cluster).
    pub(crate) fn sharded(&self) -> bool {
        matches!(self.source, Source::Cluster(_))
    }

    async fn bounded<T>(
        &self,
        request: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(self.op_timeout.max(self.connect_timeout), request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(Failure::from_redis(err, self.op_timeout)),
            Err(_) => Err(Failure::Timeout(self.op_timeout)),
        }
    }
}

/// The new holder and fencing token a handover's notice names:
/// `<holder hex, 32 digits>:<token>` (a plain release says `1`).
fn handover(payload: &Value) -> Option<([u8; 32], FencingToken)> {
    let Value::BulkString(payload) = payload else {
        return None;
    };
    let (holder, rest) = payload.split_first_chunk::<32>()?;
    let token = std::str::from_utf8(rest.strip_prefix(b":")?).ok()?;
    Some((*holder, FencingToken(token.parse().ok()?)))
}

/// Runs on the connection's I/O task for every push: must not block.
fn dispatch(channels: &Mutex<Channels>, push: &PushInfo) {
    let mut channels = lock(channels);
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            let bound = channels.own_bound;
            if let Some(Value::BulkString(name)) = push.data.first()
                && let Some(channel) = channels.watched.get_mut(name)
            {
                if let Some((holder, token)) = push.data.get(1).and_then(handover) {
                    // A release that handed the lease over: the lease is
                    // not free, so no waiter is woken but the new holder.
                    if let Some(sender) = channels.handovers.remove(&holder) {
                        let _ = sender.send(token);
                    }
                    return;
                }
                // This process's own release, announced to no one here.
                if channel
                    .own_release
                    .take()
                    .is_some_and(|at| at.elapsed() < bound)
                {
                    return;
                }
                channel.notices.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        // Notices may have been missed while the connection was down: let
        // every waiter look again.
        PushKind::Disconnection => {
            channels.lost = true;
            for channel in channels.watched.values_mut() {
                channel.own_release = None;
                channel.notices.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handover's notice names the holder and token; a plain release's
    /// `1`, or anything malformed, is no handover.
    #[test]
    fn a_handover_notice_names_its_holder_and_token() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let hex = "0123456789abcdef0123456789abcdef";
        let (holder, token) =
            handover(&bulk(&format!("{hex}:1700000000123456"))).expect("a handover notice");
        assert_eq!(&holder, hex.as_bytes());
        assert_eq!(token, FencingToken(1_700_000_000_123_456));
        for plain in [
            "1",
            "",
            &format!("{hex}:"),
            &format!("{hex}-12"),
            &hex[..31],
        ] {
            assert!(handover(&bulk(plain)).is_none(), "{plain:?}");
        }
        assert!(handover(&Value::Int(1)).is_none());
    }

    /// A fair waiter's interest in a handover ends with its watch, and
    /// with its attempt to watch: a subscription that fails leaves no
    /// sender behind for a holder that no longer waits.
    #[tokio::test]
    async fn a_failed_handover_watch_leaves_no_interest_behind() {
        // A port nothing listens on: taken, then let go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let client = Client::open(format!("redis://127.0.0.1:{port}")).expect("a client");
        let notices = Notices::new(
            &client,
            Duration::from_millis(200),
            Duration::from_millis(200),
        );
        let holder = HolderId::generate().expect("an id");
        let watch = notices
            .watch_handover("lease:released".to_owned(), &holder)
            .await;
        assert!(watch.is_err(), "subscribed with no server");
        assert!(lock(&notices.channels).handovers.is_empty());
    }
}
