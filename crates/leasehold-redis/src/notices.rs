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
//! The connection is opened on the first subscription, so programs that never
//! wait open none. Messages are dispatched by the connection's push callback
//! itself (a map lookup and a counter bump), so no task of ours runs. After
//! a reconnect the redis crate subscribes again, and every waiter is woken
//! once, since notices may have been missed meanwhile.
//!
//! Unsubscribing needs a round trip, which a `Drop` cannot make: channels no
//! one watches any more are unsubscribed by the next subscription.
//!
//! Redis sends a message to a channel's subscribers in the order they
//! subscribed, so a process that subscribes again goes to the end of that
//! order: waiters in different processes take turns being told first.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_core::ReleaseWatch;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Client, ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::{OnceCell, watch};

use crate::reply::Failure;

pub(crate) struct Notices {
    source: Source,
    connect_timeout: Duration,
    op_timeout: Duration,
    conn: OnceCell<Subscriber>,
    channels: Arc<Mutex<Channels>>,
}

/// Where the subscription connection goes.
enum Source {
    /// A standalone server: plain channels. (Boxed: a client is ten times
    /// the size of the cluster's node list.)
    Server(Box<Client>),
    /// A cluster's seed nodes: sharded channels.
    Cluster(Vec<ConnectionInfo>),
}

/// The subscription connection, once open. Both kinds subscribe again by
/// themselves after a reconnect.
#[derive(Clone)]
enum Subscriber {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Subscriber {
    async fn subscribe(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        match self {
            Self::Server(conn) => conn.subscribe(channel).await,
            Self::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    async fn unsubscribe(&mut self, channels: &[Vec<u8>]) -> redis::RedisResult<()> {
        match self {
            Self::Server(conn) => conn.unsubscribe(channels).await,
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
    watched: HashMap<Vec<u8>, Channel>,
    /// Channels no one watches any more, still subscribed on the server.
    stale: Vec<Vec<u8>>,
}

struct Channel {
    notices: watch::Sender<u64>,
    watchers: usize,
    subscribed: bool,
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
            let was_subscribed = channel.subscribed;
            channels.watched.remove(&self.name);
            if was_subscribed {
                channels.stale.push(std::mem::take(&mut self.name));
            }
        }
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
            channels: Arc::default(),
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
            channels: Arc::default(),
        }
    }

    /// Subscribes to `channel` and returns a watch that fires on each notice.
    pub(crate) async fn watch(&self, channel: String) -> Result<ReleaseWatch, Failure> {
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
                });
            entry.watchers += 1;
            let receiver = entry.notices.subscribe();
            let subscribe = !entry.subscribed;
            // Our own channel too, if it is still subscribed from an earlier
            // wait: unsubscribing and subscribing again moves this process
            // to the end of the server's subscriber list, which is the order
            // notices go out in. Otherwise the process that subscribed first
            // would hear of every release first and win nearly every handoff.
            let stale: Vec<Vec<u8>> = std::mem::take(&mut channels.stale)
                .into_iter()
                .filter(|c| *c == name || !channels.watched.contains_key(c))
                .collect();
            (receiver, subscribe, stale)
        };
        // From here on a dropped future still gives the interest back.
        let subscription = Subscription {
            channels: Arc::clone(&self.channels),
            name: name.clone(),
        };
        let mut conn = self.connection().await?.clone();
        if !stale.is_empty() {
            // Best effort: a failure leaves a few idle subscriptions behind.
            let _ = self.bounded(conn.unsubscribe(&stale)).await;
        }
        if subscribe {
            self.bounded(conn.subscribe(&name)).await?;
            if let Some(channel) = lock(&self.channels).watched.get_mut(&name) {
                channel.subscribed = true;
            }
        }
        Ok(ReleaseWatch::new(receiver, subscription))
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

    async fn connection(&self) -> Result<&Subscriber, Failure> {
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

/// Runs on the connection's I/O task for every push: must not block.
fn dispatch(channels: &Mutex<Channels>, push: &PushInfo) {
    let channels = lock(channels);
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(name)) = push.data.first()
                && let Some(channel) = channels.watched.get(name)
            {
                channel.notices.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        // Notices may have been missed while the connection was down: let
        // every waiter look again.
        PushKind::Disconnection => {
            for channel in channels.watched.values() {
                channel.notices.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
        _ => {}
    }
}
