//! Behind Sentinel: hearing of a promotion from the sentinels themselves.
//!
//! Each sentinel publishes `+switch-master <name> <old-ip> <old-port>
//! <new-ip> <new-port>` when it moves a master set to a promoted replica.
//! The backend keeps one RESP2 subscription to that channel on every
//! sentinel of its URL, in one task per sentinel (the only tasks this
//! crate spawns). A message naming the backend's master set makes the
//! backend forget its master connection and report every lease changed
//! ([`SentinelConn::switched`]), as a reconnection does, so that the
//! watchdog renews every held lease on the new master at once rather than
//! at its next renewal retry.
//!
//! A message can be missed: while a subscription is being made again, or
//! for as long as a sentinel refuses it (an ACL without `+subscribe`).
//! A promotion whose old master stays up (a manual `SENTINEL FAILOVER`)
//! makes no call fail until the sentinels demote the old master, some 8
//! to 10 s later, while the leases on the promoted master age unrenewed.
//! So each task also asks its sentinel which master it names, with the
//! set's configuration epoch (`SENTINEL MASTER`): once after every
//! subscription, and every second while none stands. An epoch higher
//! than any seen is a promotion, handled as an announcement; a sentinel
//! that has not switched yet names an older epoch and is not followed.
//!
//! A sentinel that is down, refuses the subscription or stops answering
//! pings is tried again with a jittered backoff from 100 ms, doubling up
//! to 5 s; the first failure of each sentinel is logged as a warning,
//! later ones at debug level. Nothing here fails a call of the backend.
//! The tasks end when the backend (its last clone) is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{MultiplexedConnection, PubSub};
use redis::{Client, ConnectionInfo, Msg, RedisError, RedisResult, Value};
use tracing::{debug, warn};

use crate::connection::{MasterAddr, SentinelConn};
use crate::reply::Fields;

/// The channel a sentinel announces a promotion on.
pub(crate) const CHANNEL: &str = "+switch-master";
/// The first wait before subscribing again.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// The longest wait before subscribing again.
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a standing subscription is checked with a `PING`: a sentinel
/// that vanished without closing the connection (a blackhole) is noticed
/// within this plus the op timeout.
const PING_EVERY: Duration = Duration::from_secs(5);
/// How often a sentinel is asked which master it names while no
/// subscription to it stands: a promotion whose old master stays up is
/// then learned within this (and a sentinel's own reconfiguration), well
/// before a lease of a few seconds' ttl ages out on the promoted master.
const ASK_EVERY: Duration = Duration::from_secs(1);

/// What the subscriptions need besides the backend's master connection.
pub(crate) struct Watch {
    /// The sentinels of the URL, reached as they were for the master's address.
    pub(crate) sentinels: Vec<ConnectionInfo>,
    /// The master set's name.
    pub(crate) master: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) op_timeout: Duration,
}

/// Starts one subscription task per sentinel for `conn`. Without a tokio
/// runtime (none is running: `connect` was not awaited on one) nothing is
/// started, with a warning, and promotions are learned as before.
pub(crate) fn spawn(conn: &Arc<SentinelConn>, watch: Watch) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        warn!(
            "no tokio runtime: not subscribing to the sentinels' {CHANNEL}; a promotion is learned when a call to the old master fails"
        );
        return;
    };
    let watch = Arc::new(watch);
    // The highest configuration epoch any sentinel named, shared by the
    // tasks so that a sentinel behind the others is not followed.
    let epoch = Arc::new(AtomicU64::new(0));
    for index in 0..watch.sentinels.len() {
        let weak = Arc::downgrade(conn);
        let mut stop = conn.stopped();
        let watch = Arc::clone(&watch);
        let epoch = Arc::clone(&epoch);
        runtime.spawn(async move {
            tokio::select! {
                // Ends (with an error) when the backend's sender is dropped.
                _ = stop.changed() => {}
                () = listen(weak, &watch, &epoch, index) => {}
            }
        });
    }
}

/// Subscribes to sentinel `index` and hands its announcements to the
/// backend, subscribing again after every failure, until the backend is
/// gone; asks it which master it names after each subscription and every
/// [`ASK_EVERY`] while none stands.
async fn listen(conn: Weak<SentinelConn>, watch: &Watch, epoch: &AtomicU64, index: usize) {
    let Some(info) = watch.sentinels.get(index) else {
        return;
    };
    let sentinel = info.addr().to_string();
    let mut warned = false;
    let mut delay = BACKOFF_FIRST;
    let mut asking = None;
    loop {
        let failure = match subscribe(info, watch).await {
            Ok(pubsub) => {
                delay = BACKOFF_FIRST;
                debug!(sentinel, "subscribed to {CHANNEL}");
                // A promotion announced while there was no subscription.
                ask(info, watch, &mut asking, &conn, epoch, &sentinel).await;
                // No asks while the subscription stands: no idle
                // connection kept for them.
                asking = None;
                let ended = read(pubsub, &conn, watch).await;
                if conn.strong_count() == 0 {
                    return;
                }
                ended
            }
            Err(err) => err,
        };
        if warned {
            debug!(sentinel, error = %failure, "no subscription to {CHANNEL}; trying again");
        } else {
            warned = true;
            warn!(
                sentinel,
                error = %failure,
                "no subscription to the sentinel's {CHANNEL}; trying again with backoff. Until one stands, the sentinel is asked every second which master it names"
            );
        }
        let again = tokio::time::Instant::now() + jittered(delay);
        delay = backoff_after(delay);
        loop {
            ask(info, watch, &mut asking, &conn, epoch, &sentinel).await;
            if conn.strong_count() == 0 {
                return;
            }
            let next = tokio::time::Instant::now() + ASK_EVERY;
            if next >= again {
                tokio::time::sleep_until(again).await;
                break;
            }
            tokio::time::sleep_until(next).await;
        }
        if conn.strong_count() == 0 {
            return;
        }
    }
}

/// Asks the sentinel which master of the set it names, over `asking` (made
/// when there is none, dropped when it fails), and hands a promotion (an
/// epoch higher than any seen) to the backend as an announcement. Best
/// effort: a failure is logged at debug level.
async fn ask(
    info: &ConnectionInfo,
    watch: &Watch,
    asking: &mut Option<MultiplexedConnection>,
    conn: &Weak<SentinelConn>,
    epoch: &AtomicU64,
    sentinel: &str,
) {
    let named = async {
        // One connection for the asks, kept while it works: the asks come
        // every second while no subscription stands.
        let connection = match asking {
            Some(connection) => connection,
            None => {
                let client = Client::open(info.clone())?;
                asking.insert(
                    bounded(
                        watch.connect_timeout,
                        client.get_multiplexed_async_connection(),
                    )
                    .await?,
                )
            }
        };
        let reply: Value = bounded(
            watch.op_timeout,
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&watch.master)
                .query_async(connection),
        )
        .await?;
        Ok::<_, RedisError>(named_master(&reply))
    };
    let named = named.await;
    if named.is_err() {
        *asking = None;
    }
    match named {
        Ok(Some((master, named_epoch))) => {
            if let Some(conn) = conn.upgrade()
                && newer(epoch, named_epoch)
            {
                debug!(
                    sentinel,
                    epoch = named_epoch,
                    "the sentinel names a master of a newer epoch"
                );
                conn.switched(master);
            }
        }
        Ok(None) => debug!(sentinel, "the sentinel named no master of the set"),
        Err(err) => debug!(sentinel, error = %err, "could not ask the sentinel for the master"),
    }
}

/// Whether `named` is higher than every epoch seen so far, which it
/// then becomes.
fn newer(seen: &AtomicU64, named: u64) -> bool {
    seen.fetch_max(named, Ordering::AcqRel) < named
}

/// The master's address and configuration epoch in a `SENTINEL MASTER`
/// reply (field-value pairs, flat in RESP2 or as a map in RESP3); `None`
/// while the sentinel is failing the set over.
fn named_master(reply: &Value) -> Option<(MasterAddr, u64)> {
    let fields = Fields::of(reply)?;
    // The sentinel leading a failover raises the set's epoch when the
    // replica takes the master's role, but names the new master only once
    // it has finished: until then, the old address at the new epoch.
    if fields
        .get("flags")?
        .split(',')
        .any(|flag| flag == "failover_in_progress")
    {
        return None;
    }
    let host = fields.get("ip")?.to_owned();
    let port = fields.get("port")?.parse().ok()?;
    let epoch = fields.get("config-epoch")?.parse().ok()?;
    Some(((host, port), epoch))
}

/// A subscription to [`CHANNEL`] on one sentinel, each step bounded.
async fn subscribe(info: &ConnectionInfo, watch: &Watch) -> RedisResult<PubSub> {
    let client = Client::open(info.clone())?;
    let mut pubsub = bounded(watch.connect_timeout, client.get_async_pubsub()).await?;
    bounded(watch.op_timeout, pubsub.subscribe(CHANNEL)).await?;
    Ok(pubsub)
}

/// Reads announcements until the subscription breaks, and says why.
async fn read(pubsub: PubSub, conn: &Weak<SentinelConn>, watch: &Watch) -> RedisError {
    let (mut sink, mut stream) = pubsub.split();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.reset();
    loop {
        tokio::select! {
            biased;
            message = stream.next() => {
                let Some(message) = message else {
                    return closed("the sentinel closed the subscription");
                };
                let Some(conn) = conn.upgrade() else {
                    return closed("the backend was dropped");
                };
                if let Some(master) = switched_to(&message, &watch.master) {
                    conn.switched(master);
                }
            }
            _ = ping.tick() => {
                if let Err(err) = bounded(watch.op_timeout, sink.ping::<Value>()).await {
                    return err;
                }
            }
        }
    }
}

/// The new master an announcement names, if it names the set `master`.
fn switched_to(message: &Msg, master: &str) -> Option<MasterAddr> {
    if message.get_channel_name() != CHANNEL {
        return None;
    }
    let payload = std::str::from_utf8(message.get_payload_bytes()).ok()?;
    parse(payload, master)
}

/// `<name> <old-ip> <old-port> <new-ip> <new-port>`, for the set `master`.
fn parse(payload: &str, master: &str) -> Option<MasterAddr> {
    let mut words = payload.split_ascii_whitespace();
    let (Some(name), Some(_), Some(_), Some(host), Some(port), None) = (
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
        words.next(),
    ) else {
        return None;
    };
    if name != master {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

/// `future`, failing with a timeout error after `limit`.
async fn bounded<T>(
    limit: Duration,
    future: impl Future<Output = RedisResult<T>>,
) -> RedisResult<T> {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| {
            Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the sentinel did not answer in time",
            )))
        })
}

fn closed(why: &'static str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        why,
    ))
}

/// The wait before the next subscription after one of `delay` failed:
/// doubled, up to [`BACKOFF_MAX`].
fn backoff_after(delay: Duration) -> Duration {
    (delay * 2).min(BACKOFF_MAX)
}

/// `delay` less up to a quarter, so that many processes do not come back
/// to a sentinel in step.
fn jittered(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    jitter(delay, nanos)
}

/// `delay` less the share `noise % 1000` thousandths of a quarter of it.
fn jitter(delay: Duration, noise: u32) -> Duration {
    delay - delay / 4 * (noise % 1000) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_name_the_new_master_of_their_set() {
        assert_eq!(
            parse("mymaster 127.0.0.1 6380 127.0.0.1 6381", "mymaster"),
            Some(("127.0.0.1".to_owned(), 6381))
        );
        assert_eq!(
            parse("other 127.0.0.1 6380 127.0.0.1 6381", "mymaster"),
            None
        );
        assert_eq!(parse("mymaster 127.0.0.1 6380 127.0.0.1", "mymaster"), None);
        assert_eq!(
            parse("mymaster 127.0.0.1 6380 127.0.0.1 x", "mymaster"),
            None
        );
        assert_eq!(
            parse("mymaster 127.0.0.1 6380 127.0.0.1 6381 extra", "mymaster"),
            None
        );
    }

    /// Only a message on [`CHANNEL`] names a new master.
    #[test]
    fn only_the_switch_channel_names_a_master() {
        let message = |channel: &str| {
            let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
            Msg::from_owned_value(Value::Array(vec![
                bulk("message"),
                bulk(channel),
                bulk("mymaster 127.0.0.1 6380 127.0.0.1 6381"),
            ]))
            .expect("a message")
        };
        assert_eq!(
            switched_to(&message(CHANNEL), "mymaster"),
            Some(("127.0.0.1".to_owned(), 6381))
        );
        assert_eq!(switched_to(&message("+sdown"), "mymaster"), None);
        assert_eq!(switched_to(&message(CHANNEL), "other"), None);
    }

    /// A `SENTINEL MASTER` reply names the master and its epoch, as
    /// field-value pairs in RESP2 or as a map in RESP3.
    #[test]
    fn a_sentinel_master_reply_names_the_master_and_its_epoch() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let fields = [
            ("name", "mymaster"),
            ("ip", "127.0.0.1"),
            ("port", "6381"),
            ("flags", "master"),
            ("config-epoch", "7"),
        ];
        let flat = Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| [bulk(k), bulk(v)])
                .collect(),
        );
        let named = Some((("127.0.0.1".to_owned(), 6381), 7));
        assert_eq!(named_master(&flat), named);
        let map = Value::Map(fields.iter().map(|(k, v)| (bulk(k), bulk(v))).collect());
        assert_eq!(named_master(&map), named);
        let without_epoch = Value::Array(
            fields[..4]
                .iter()
                .flat_map(|(k, v)| [bulk(k), bulk(v)])
                .collect(),
        );
        assert_eq!(named_master(&without_epoch), None);
        let bad_port = Value::Array(vec![
            bulk("ip"),
            bulk("127.0.0.1"),
            bulk("port"),
            bulk("x"),
            bulk("config-epoch"),
            bulk("1"),
        ]);
        assert_eq!(named_master(&bad_port), None);
        // A failover in progress: the new epoch, still the old address.
        let failing_over = Value::Array(
            fields
                .iter()
                .map(|&(k, v)| {
                    (
                        k,
                        if k == "flags" {
                            "master,failover_in_progress"
                        } else {
                            v
                        },
                    )
                })
                .flat_map(|(k, v)| [bulk(k), bulk(v)])
                .collect(),
        );
        assert_eq!(named_master(&failing_over), None);
        assert_eq!(named_master(&Value::Nil), None);
    }

    /// Only an epoch higher than every one seen is followed: a sentinel
    /// that has not switched yet names an older one.
    #[test]
    fn only_a_newer_epoch_is_a_promotion() {
        let seen = AtomicU64::new(0);
        assert!(!newer(&seen, 0), "the epoch of a set never failed over");
        assert!(newer(&seen, 2));
        assert!(!newer(&seen, 2), "the same promotion again");
        assert!(!newer(&seen, 1), "a sentinel behind the others");
        assert_eq!(seen.load(Ordering::Relaxed), 2);
        assert!(newer(&seen, 3));
    }

    #[test]
    fn jitter_takes_off_at_most_a_quarter() {
        let delay = Duration::from_millis(400);
        let got = jittered(delay);
        assert!(got <= delay && got >= delay - delay / 4, "{got:?}");
        // Exactly: the noise's last three digits are the thousandths of
        // the quarter taken off.
        assert_eq!(jitter(delay, 0), delay);
        assert_eq!(jitter(delay, 500), Duration::from_millis(350));
        assert_eq!(jitter(delay, 1999), Duration::from_micros(300_100));
    }

    #[test]
    fn the_backoff_doubles_up_to_its_longest() {
        assert_eq!(BACKOFF_FIRST, Duration::from_millis(100));
        assert_eq!(backoff_after(BACKOFF_FIRST), Duration::from_millis(200));
        assert_eq!(
            backoff_after(Duration::from_secs(2)),
            Duration::from_secs(4)
        );
        assert_eq!(backoff_after(Duration::from_secs(4)), BACKOFF_MAX);
        assert_eq!(backoff_after(BACKOFF_MAX), BACKOFF_MAX);
        assert_eq!(BACKOFF_MAX, Duration::from_secs(5));
    }
}
