//! One load of a script at a time per server, for every call of that
//! script that met `NOSCRIPT` on it.
//!
//! A server that lost its script cache (a restart, a failover to a replica,
//! `SCRIPT FLUSH`, a cluster node replaced) answers `NOSCRIPT` to every
//! call in flight on it, and there may be many: up to the calls in flight
//! per lane, of every kind of script, over both of the backend's
//! connections. Each of them loading its own script again would be a burst
//! of loads at the moment the server is recovering. Instead the first call
//! of a script that meets `NOSCRIPT` on a server starts one load of that
//! script (`SCRIPT LOAD`, one round trip); the other calls of it that meet
//! `NOSCRIPT` on that server while the load runs wait for it, then every
//! one of them sends its call again. A call of another script starts that
//! script's load the same way: at most one load per script and server per
//! loss.
//!
//! Only the script a call runs is loaded, not every script: the server
//! compiles each one it is sent (about 0.4 ms apiece for these scripts on
//! this project's 2-core machines), and a load of all 21 kept the
//! single-threaded server busy for about 7 ms, during which the call that
//! met `NOSCRIPT` waited. After a restart that call is the renewal sent as
//! soon as the connection is back, the one that tells a holder its lease
//! is gone: loading every script made a holder learn of its loss about
//! 7 ms after it could speak to the server again instead of under one.
//!
//! A load is a [`Shared`] future kept here while it runs, and driven by
//! whichever of its waiters polls it: no task is spawned. A waiter dropped
//! (its op timeout ran out) leaves the load to the others; a load whose
//! waiters were all dropped stays here, and the next call that meets
//! `NOSCRIPT` drives it on. A load is bounded by the op timeout of its own,
//! so it cannot be left waiting for ever.
//!
//! Whether a `NOSCRIPT` needs a new load is judged by a clock of events
//! ([`ScriptLoads::mark`]) read before each call is sent: a load of the
//! call's script finished after the call was sent may have come too late
//! for it (the call is then sent again, with no load), while a `NOSCRIPT`
//! to a call sent after that script's last load finished means the scripts
//! were lost again, and starts a new one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, RedisResult};

/// A server whose script cache is tracked on its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    /// The backend's only server: a standalone server, or the current
    /// master behind Sentinel.
    Only,
    /// A cluster node, by the id it gives itself (`CLUSTER MYID`).
    Cluster(String),
    /// The cluster node of a slot, when the node would not give its id (an
    /// ACL without `CLUSTER MYID`): the calls of one slot still share a load.
    Slot(Slot),
}

/// A load of one script on one server, as its waiters share it.
type Load = Shared<BoxFuture<'static, RedisResult<()>>>;

/// An instant on the [`ScriptLoads`] clock, read before a call is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Mark(u64);

/// The script loads of one backend, one at a time per script and server.
pub(crate) struct ScriptLoads {
    inner: Arc<Inner>,
}

struct Inner {
    /// Ticks once per finished load; a call reads it before it is sent.
    clock: AtomicU64,
    /// The bound on one load, as on every operation.
    limit: Duration,
    /// Numbers the loads, so that a finished one clears only itself.
    next_load: AtomicU64,
    /// By server and script (its SHA-1).
    scripts: Mutex<HashMap<(Node, &'static str), Script>>,
}

/// One script's loads on one server.
#[derive(Default)]
struct Script {
    /// The load running, with its number.
    running: Option<(u64, Load)>,
    /// When its last load succeeded, on the clock.
    loaded: Option<Mark>,
}

impl ScriptLoads {
    /// No load yet; each will be bounded by `limit`.
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                clock: AtomicU64::new(0),
                limit,
                next_load: AtomicU64::new(0),
                scripts: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The clock now: taken before a call is sent, and handed to
    /// [`after_noscript`](Self::after_noscript) if it meets `NOSCRIPT`.
    pub(crate) fn mark(&self) -> Mark {
        Mark(self.inner.clock.load(Ordering::SeqCst))
    }

    /// Waits until `script` (its SHA-1) may be on `node` again, after a
    /// call of it sent at `sent` met `NOSCRIPT` there: for the load of it
    /// running on that server if there is one; not at all if one finished
    /// after `sent` (it may have come just too late for the call);
    /// otherwise for a new load, made by `load` (called only then).
    ///
    /// # Errors
    ///
    /// The load's own: the server could not be reached, refused `SCRIPT
    /// LOAD` (an ACL), or did not answer within the op timeout. Every
    /// waiter gets it; the next `NOSCRIPT` starts another load.
    pub(crate) async fn after_noscript(
        &self,
        node: Node,
        script: &'static str,
        sent: Mark,
        load: impl FnOnce() -> BoxFuture<'static, RedisResult<()>>,
    ) -> RedisResult<()> {
        let running = {
            let mut scripts = self
                .inner
                .scripts
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let entry = (node, script);
            let loads = scripts.entry(entry.clone()).or_default();
            match &loads.running {
                Some((_, running)) => running.clone(),
                None if loads.loaded.is_some_and(|loaded| loaded >= sent) => return Ok(()),
                None => {
                    let number = self.inner.next_load.fetch_add(1, Ordering::Relaxed);
                    let running = bounded_load(
                        Arc::downgrade(&self.inner),
                        entry,
                        number,
                        self.inner.limit,
                        load(),
                    );
                    loads.running = Some((number, running.clone()));
                    running
                }
            }
        };
        running.await
    }
}

/// `load` under `limit`, recording its end in `inner` (if the backend is
/// still there): the load no longer runs, and, if it succeeded, when it
/// finished.
fn bounded_load(
    inner: Weak<Inner>,
    entry: (Node, &'static str),
    number: u64,
    limit: Duration,
    load: BoxFuture<'static, RedisResult<()>>,
) -> Load {
    async move {
        let result = match tokio::time::timeout(limit, load).await {
            Ok(result) => result,
            Err(_elapsed) => Err(RedisError::from((
                ErrorKind::Io,
                "the script was not loaded within the op timeout",
            ))),
        };
        if let Some(inner) = inner.upgrade() {
            let mut scripts = inner.scripts.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(loads) = scripts.get_mut(&entry)
                && loads.running.as_ref().is_some_and(|(n, _)| *n == number)
            {
                loads.running = None;
                if result.is_ok() {
                    // Stamped while the lock is held, so that no call can
                    // find the load neither running nor finished.
                    loads.loaded = Some(Mark(inner.clock.fetch_add(1, Ordering::SeqCst)));
                }
            }
        }
        result
    }
    .boxed()
    .shared()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Two scripts, by their SHA-1s.
    const RENEW: &str = "renew";
    const ACQUIRE: &str = "acquire";

    /// A load that counts itself and finishes when `gate` opens.
    fn counted(
        count: &Arc<AtomicUsize>,
        gate: &Arc<tokio::sync::Notify>,
    ) -> impl FnOnce() -> BoxFuture<'static, RedisResult<()>> {
        let (count, gate) = (Arc::clone(count), Arc::clone(gate));
        move || {
            count.fetch_add(1, Ordering::SeqCst);
            async move {
                gate.notified().await;
                Ok(())
            }
            .boxed()
        }
    }

    #[tokio::test]
    async fn calls_that_meet_noscript_together_share_one_load() -> RedisResult<()> {
        let loads = ScriptLoads::new(Duration::from_secs(5));
        let (count, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        let sent = loads.mark();
        let waiters = futures_util::future::join_all(
            (0..10).map(|_| loads.after_noscript(Node::Only, RENEW, sent, counted(&count, &gate))),
        );
        // Kept for the load if it has not waited yet.
        let opened = async { gate.notify_one() };
        let (results, ()) = tokio::time::timeout(Duration::from_secs(5), async {
            tokio::join!(waiters, opened)
        })
        .await
        .map_err(|_| RedisError::from((ErrorKind::Io, "timed out")))?;
        assert!(results.iter().all(Result::is_ok));
        assert_eq!(count.load(Ordering::SeqCst), 1);

        // Sent before that load finished: no new load.
        loads
            .after_noscript(Node::Only, RENEW, sent, counted(&count, &gate))
            .await?;
        assert_eq!(count.load(Ordering::SeqCst), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_later_loss_starts_a_new_load_on_that_node_only() -> RedisResult<()> {
        let loads = ScriptLoads::new(Duration::from_secs(5));
        let count = Arc::new(AtomicUsize::new(0));
        let ready = || {
            let count = Arc::clone(&count);
            move || {
                count.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }.boxed()
            }
        };
        loads
            .after_noscript(Node::Cluster("a".into()), RENEW, loads.mark(), ready())
            .await?;
        // Sent after the first load: a new loss.
        loads
            .after_noscript(Node::Cluster("a".into()), RENEW, loads.mark(), ready())
            .await?;
        assert_eq!(count.load(Ordering::SeqCst), 2);
        // Another node has loads of its own.
        let before_a = loads.mark();
        loads
            .after_noscript(Node::Cluster("b".into()), RENEW, before_a, ready())
            .await?;
        assert_eq!(count.load(Ordering::SeqCst), 3);
        Ok(())
    }

    #[tokio::test]
    async fn each_script_is_loaded_on_its_own_and_once() -> RedisResult<()> {
        let loads = ScriptLoads::new(Duration::from_secs(5));
        let (count, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        let sent = loads.mark();
        // The renewal's load is not held up by the acquisition's, which
        // never finishes here.
        let acquire = loads.after_noscript(Node::Only, ACQUIRE, sent, counted(&count, &gate));
        let renew = loads.after_noscript(Node::Only, RENEW, sent, || async { Ok(()) }.boxed());
        let stuck = tokio::time::timeout(Duration::from_millis(50), acquire).await;
        assert!(stuck.is_err(), "the acquisition's load is still running");
        tokio::time::timeout(Duration::from_secs(5), renew)
            .await
            .map_err(|_| RedisError::from((ErrorKind::Io, "the renewal waited")))??;
        // Loaded once: a call of it sent before that load needs none.
        loads
            .after_noscript(Node::Only, RENEW, sent, counted(&count, &gate))
            .await?;
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "only the acquisition's load"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_load_whose_waiters_were_dropped_is_driven_by_the_next() -> RedisResult<()> {
        let loads = ScriptLoads::new(Duration::from_secs(5));
        let (count, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        let sent = loads.mark();
        // Dropped while it waits for the load.
        let dropped = tokio::time::timeout(
            Duration::from_millis(10),
            loads.after_noscript(Node::Only, RENEW, sent, counted(&count, &gate)),
        )
        .await;
        assert!(dropped.is_err());
        // `notify_one` keeps its permit for the next to wait.
        gate.notify_one();
        tokio::time::timeout(
            Duration::from_secs(5),
            loads.after_noscript(Node::Only, RENEW, sent, counted(&count, &gate)),
        )
        .await
        .map_err(|_| RedisError::from((ErrorKind::Io, "the abandoned load is stuck")))??;
        assert_eq!(count.load(Ordering::SeqCst), 1, "joined, not started again");
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_load_that_never_answers_fails_within_its_bound_and_the_next_starts_afresh()
    -> RedisResult<()> {
        let loads = ScriptLoads::new(Duration::from_secs(2));
        let (count, gate) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(tokio::sync::Notify::new()),
        );
        let sent = loads.mark();
        let failed = loads
            .after_noscript(Node::Only, RENEW, sent, counted(&count, &gate))
            .await;
        assert!(failed.is_err_and(|e| e.kind() == ErrorKind::Io));
        gate.notify_one();
        loads
            .after_noscript(Node::Only, RENEW, sent, counted(&count, &gate))
            .await?;
        assert_eq!(count.load(Ordering::SeqCst), 2);
        Ok(())
    }
}
