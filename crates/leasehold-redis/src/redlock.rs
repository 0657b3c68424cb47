//! [`RedlockBackend`]: leases held by a majority of independent masters.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FairBackend, FairOutcome, FencingToken, Grant,
    HandoverWatch, HolderId, LeaseBackend, LeaseInfo, LeaseKey, PermitBackend, PermitLimit,
    PlaceTtl, ReadWriteBackend, ReleaseOutcome, ReleaseReport, ReleaseWatch, RenewOutcome,
    RenewRequest, WatchPolicy, clock_drift,
};
use tokio::time::Instant;

use crate::url::{Endpoint, Topology};
use crate::{ConnectError, RedisBackend};

/// A [`LeaseBackend`] over N independent Redis masters, after the Redlock
/// algorithm: a lease is held when a majority (`N/2 + 1`) of the masters
/// hold it.
///
/// - **Acquire** asks every master at once, each bounded by the node
///   timeout, and succeeds when a majority granted the lease while some of
///   its validity is left: `ttl − elapsed − drift > 0`, with
///   drift = [`clock_drift`]`(ttl)` (1% + 2 ms). The grant's
///   `valid_until` is `sent_at + ttl − drift`. Otherwise the lease is
///   released on every master, and the outcome is `Held` (some master holds
///   it for someone else) or an error (too few masters answered).
/// - **Renew** succeeds only when a majority renewed in time; it is `Lost`
///   when a majority says the lease is gone, and an error (outcome unknown)
///   otherwise. Each master's call is bounded by the node timeout, so a
///   paused or slow minority delays a renewal by at most that, however
///   long it stays away.
/// - A **lock-delay** reaches every master: each keeps the key for
///   ttl + lock-delay, while the validity above counts from the ttl alone.
/// - The **fencing token** is the largest token among the masters that
///   granted the lease. Each master keeps its own counter, floored by its
///   clock in microseconds, so tokens rise across acquisitions as long as
///   the masters' clocks roughly agree; see `docs/topologies.md`.
/// - The **random retry delay** of Redlock is the watchdog's jittered
///   backoff between attempts (`LeaseOptions::backoff` in
///   leasehold-watchdog); this backend makes one attempt per call.
///
/// - **Read-write leases** are refused with [`BackendError::Unsupported`].
///   Quorum intersection would keep a writer from a reader (any two
///   majorities share a master, which would refuse the later one), but the
///   writer-preference intent would be a per-master vote too: a writer
///   refused on some masters and granted on none leaves intents that hold
///   readers back on a minority, and partial grants and intents must be
///   undone on every master. That protocol is not built; use a standalone,
///   Sentinel or Cluster deployment for read-write leases.
/// - **Permits** (counting leases) are refused with
///   [`BackendError::Unsupported`]. A permit is the first free permit key
///   *as one server sees it*; independent masters each pick their own, so
///   a majority need not agree on any one permit key, and no majority holds
///   a limit for the holders to agree on. Asking every master for one named
///   permit key at a time would be safe (at most one holder per key) but
///   turns every acquisition into a search over the permits, split votes
///   and all. Use a Sentinel or Cluster deployment for semaphores.
/// - **Fair mode** is refused with [`BackendError::Unsupported`]. Each
///   master would keep its own queue, in the order requests reached *it*:
///   a waiter may be first on some masters and not on others, so the
///   waiters at the heads split the votes and none may reach a majority,
///   and a place pruned on one master lives on another. Ordering waiters
///   across independent masters needs a consensus the protocol does not
///   have; use a standalone, Sentinel or Cluster deployment for fair mode.
///
///   These three are capabilities the backend answers rather than lacks
///   ([`LeaseBackend::permits`], [`LeaseBackend::read_write`] and
///   [`LeaseBackend::fair`] return it), so that the refusal a manager
///   passes on says why, and nothing is written on any master.
/// - **A minimum hold** ([`AcquireRequest::hold_at_least`]) is refused with
///   [`BackendError::Unsupported`]. Each master would keep its key for the
///   minimum on a release, including the give-back of a vote that lost:
///   a failed acquisition would block the masters it won for the minimum,
///   and contended acquisitions could block one another for as long. Use a
///   standalone, Sentinel or Cluster deployment for a minimum hold.
///
/// Redlock's safety rests on bounded clock drift between this process and
/// the masters, and on the masters not losing a lease (persistence with
/// `appendfsync always`, or delayed restarts of at least one ttl).
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_redis::RedlockBackend;
///
/// # async fn run() -> Result<(), leasehold_redis::ConnectError> {
/// let backend = RedlockBackend::builder([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.0.2:6379",
///     "redis://10.0.0.3:6379",
/// ])
/// .node_timeout(Duration::from_millis(50))
/// .connect()
/// .await?;
/// assert_eq!(backend.quorum(), 2);
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// As for every backend: dropping an operation's future leaves its effect
/// unknown on each master.
#[derive(Clone)]
pub struct RedlockBackend {
    shared: Arc<Shared>,
}

struct Shared {
    nodes: Vec<RedisBackend>,
    quorum: usize,
    node_timeout: Duration,
}

/// Settings for a [`RedlockBackend`], made by [`RedlockBackend::builder`].
#[must_use = "a builder does nothing until `connect` is awaited"]
pub struct RedlockBuilder {
    urls: Vec<String>,
    node_timeout: Duration,
    connect_timeout: Duration,
    namespace: Option<String>,
    fence_retention: Option<Duration>,
}

/// Why [`RedlockBackend`] refuses read-write leases.
const REDLOCK_RW: &str = "Redlock has no read-write leases: readers, writers and a waiting writer's intent would each need a majority vote undone on failure, which is not built; use a standalone, Sentinel or Cluster deployment for read-write leases";

/// Why [`RedlockBackend`] refuses a minimum hold.
const REDLOCK_HOLD: &str = "Redlock has no minimum hold: every master would keep its key for the minimum on a release, the give-back of a lost vote included, which would block the next acquisitions; use a standalone, Sentinel or Cluster deployment for a minimum hold";

impl RedlockBackend {
    /// Starts configuring a backend over the masters at `urls`, one
    /// standalone URL each (`redis://`, `rediss://`, `redis+unix://`; see
    /// [`Endpoint`]). Use 3 or 5 masters that do not replicate each other.
    pub fn builder<I, S>(urls: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder {
            urls: urls.into_iter().map(Into::into).collect(),
            node_timeout: RedlockBuilder::DEFAULT_NODE_TIMEOUT,
            connect_timeout: RedlockBuilder::DEFAULT_CONNECT_TIMEOUT,
            namespace: None,
            fence_retention: None,
        }
    }

    /// How many masters must agree: `N/2 + 1`.
    #[must_use]
    pub fn quorum(&self) -> usize {
        self.shared.quorum
    }

    /// The backends of the masters, in the order of the URLs.
    #[must_use]
    pub fn nodes(&self) -> &[RedisBackend] {
        &self.shared.nodes
    }

    /// The bound on each call to one master.
    #[must_use]
    pub fn node_timeout(&self) -> Duration {
        self.shared.node_timeout
    }

    /// Calls `op` on every master at once and feeds each outcome to
    /// `tally`. Every call runs to its end (each is bounded by the node
    /// timeout): stopping at the first majority would drop calls already
    /// on their way, and with them the script load a restarted master
    /// needs, leaving the lease on fewer masters than it could be.
    async fn gather<'a, T, F, Fut>(&'a self, op: F, mut tally: impl FnMut(T))
    where
        F: Fn(&'a RedisBackend) -> Fut,
        Fut: Future<Output = T> + 'a,
    {
        for result in join_all(self.shared.nodes.iter().map(op)).await {
            tally(result);
        }
    }

    /// Releases on every master, whatever the outcome.
    async fn release_everywhere(&self, key: &LeaseKey, holder: &HolderId) {
        // Best effort after a failed acquisition: a master that does not
        // answer lets the lease run out after its ttl.
        join_all(self.shared.nodes.iter().map(|n| n.release(key, holder))).await;
    }
}

impl RedlockBuilder {
    /// The default [`node_timeout`](Self::node_timeout): 100 ms.
    pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);
    /// The default [`connect_timeout`](Self::connect_timeout): 2 s.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

    /// The bound on each call to one master. Keep it small beside the ttl
    /// (Redlock suggests 5–50 ms for a 10 s ttl): a master that does not
    /// answer within it counts as not agreeing. Default: 100 ms; accepted:
    /// 1 ms to 10 min.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long [`connect`](Self::connect) waits for each master. Default: 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The key prefix on every master; see
    /// [`RedisBackendBuilder::namespace`](crate::RedisBackendBuilder::namespace).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// How long each master keeps a fencing counter after the latest grant
    /// of its key, as
    /// [`RedisBackendBuilder::fence_retention`](crate::RedisBackendBuilder::fence_retention).
    pub fn fence_retention(mut self, retention: Duration) -> Self {
        self.fence_retention = Some(retention);
        self
    }

    /// Checks the settings and connects to every master at once.
    ///
    /// A master that cannot be reached now is connected to later, on first
    /// use, as long as a majority was reached.
    ///
    /// # Errors
    ///
    /// - [`ConnectError::InvalidConfig`] with fewer than 3 URLs or a setting out of range;
    /// - [`ConnectError::InvalidUrl`] for a malformed URL, or one that names a
    ///   cluster or sentinels rather than one master;
    /// - [`ConnectError::TooFewMasters`] when fewer than a majority could be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the connection attempts.
    pub async fn connect(self) -> Result<RedlockBackend, ConnectError> {
        let total = self.urls.len();
        if total < 3 {
            return Err(ConnectError::InvalidConfig {
                field: "nodes",
                reason: format!(
                    "Redlock needs at least 3 independent masters, got {total}; use 3 or 5"
                ),
            });
        }
        for url in &self.urls {
            let endpoint = Endpoint::parse(url)?;
            if endpoint.topology() != Topology::Standalone {
                return Err(ConnectError::InvalidUrl {
                    url_redacted: endpoint.to_string(),
                    reason: "Redlock needs independent standalone masters, not a cluster or a sentinel set".to_owned(),
                });
            }
        }
        let builder = |url: &String| {
            let b = RedisBackend::builder(url.clone())
                .op_timeout(self.node_timeout)
                .connect_timeout(self.connect_timeout);
            let b = match self.fence_retention {
                Some(retention) => b.fence_retention(retention),
                None => b,
            };
            match &self.namespace {
                Some(ns) => b.namespace(ns.clone()),
                None => b,
            }
        };
        let eager = join_all(self.urls.iter().map(|url| builder(url).connect())).await;
        let quorum = total / 2 + 1;
        let mut nodes = Vec::with_capacity(total);
        let mut first_failure = None;
        for (url, result) in self.urls.iter().zip(eager) {
            match result {
                Ok(node) => nodes.push(node),
                Err(err @ ConnectError::Connect { .. }) => {
                    first_failure.get_or_insert(err);
                    nodes.push(builder(url).connect_with(true).await?);
                }
                Err(other) => return Err(other),
            }
        }
        if let Some(source) = first_failure {
            let reached = nodes.len() - self.unreached(&nodes).await;
            if reached < quorum {
                return Err(ConnectError::TooFewMasters {
                    reached,
                    needed: quorum,
                    total,
                    source: Box::new(source),
                });
            }
        }
        Ok(RedlockBackend {
            shared: Arc::new(Shared {
                nodes,
                quorum,
                node_timeout: self.node_timeout,
            }),
        })
    }

    /// How many of `nodes` do not answer a probe now.
    async fn unreached(&self, nodes: &[RedisBackend]) -> usize {
        let probe = LeaseKey::new("leasehold:probe");
        let Ok(probe) = probe else { return nodes.len() };
        join_all(nodes.iter().map(|n| n.inspect(&probe)))
            .await
            .iter()
            .filter(|r| r.is_err())
            .count()
    }
}

impl fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: Vec<String> = self.urls.iter().map(|u| crate::redact(u)).collect();
        f.debug_struct("RedlockBuilder")
            .field("nodes", &shown)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("namespace", &self.namespace)
            .field("fence_retention", &self.fence_retention)
            .finish()
    }
}

impl fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.shared.nodes)
            .field("quorum", &self.shared.quorum)
            .field("node_timeout", &self.shared.node_timeout)
            .finish()
    }
}

/// Why a Redlock operation reached no decision: the cause of its
/// [`BackendError::Unavailable`].
#[derive(Debug, thiserror::Error)]
#[error(
    "only {agreed} of {total} Redlock masters {verb} in time, and {needed} must agree; check that a majority of the masters is running and reachable"
)]
pub struct NoQuorum {
    /// What the agreeing masters did (`granted the lease`, `renewed the lease`, …).
    pub verb: &'static str,
    /// How many masters agreed.
    pub agreed: usize,
    /// How many must agree.
    pub needed: usize,
    /// How many masters there are.
    pub total: usize,
    /// The first error a master returned, if any.
    #[source]
    pub first_error: Option<BackendError>,
}

/// What the masters that hold a lease show of it, as one: the label and
/// token of the copy with the largest token (the holder's token is the
/// largest of its majority), and the shortest ttl left, so that a waiter
/// does not sleep past the first copy's expiry.
fn combine(held: Vec<LeaseInfo>) -> Option<LeaseInfo> {
    let soonest = held.iter().filter_map(|info| info.ttl_left).min();
    let mut info = held.into_iter().max_by_key(|info| info.fencing_token)?;
    info.ttl_left = soonest;
    Some(info)
}

fn no_quorum(op: &'static str, key: &LeaseKey, cause: NoQuorum) -> BackendError {
    BackendError::Unavailable {
        op,
        key: key.as_str().to_owned(),
        source: Arc::new(cause),
    }
}

impl LeaseBackend for RedlockBackend {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        const OP: &str = "acquire";
        if request.hold_at_least.is_some() {
            return Err(BackendError::Unsupported {
                op: OP,
                key: request.key.as_str().to_owned(),
                reason: REDLOCK_HOLD,
            });
        }
        let total = self.shared.nodes.len();
        let quorum = self.shared.quorum;
        let sent_at = Instant::now();
        let mut granted = 0;
        let mut token: Option<FencingToken> = None;
        let mut held: Vec<LeaseInfo> = Vec::new();
        let mut first_error = None;
        self.gather(
            |node| node.try_acquire(request),
            |result| match result {
                Ok(AcquireOutcome::Acquired(grant)) => {
                    granted += 1;
                    token = token.max(Some(grant.fencing_token));
                }
                Ok(AcquireOutcome::Held(info)) => held.push(info),
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            },
        )
        .await;
        let ttl = request.ttl.get();
        let elapsed = sent_at.elapsed();
        if granted >= quorum
            && let Some(token) = token
        {
            if elapsed + clock_drift(ttl) < ttl {
                return Ok(AcquireOutcome::Acquired(Grant::new(
                    request.key.clone(),
                    request.holder,
                    token,
                    request.ttl,
                    sent_at,
                )));
            }
            // A majority agreed, but too late for any validity to be left.
            self.release_everywhere(&request.key, &request.holder).await;
            return Err(BackendError::Timeout {
                op: OP,
                key: request.key.as_str().to_owned(),
                after: elapsed,
            });
        }
        self.release_everywhere(&request.key, &request.holder).await;
        match combine(held) {
            Some(info) => Ok(AcquireOutcome::Held(info)),
            None => Err(no_quorum(
                OP,
                &request.key,
                NoQuorum {
                    verb: "granted the lease",
                    agreed: granted,
                    needed: quorum,
                    total,
                    first_error,
                },
            )),
        }
    }

    /// Sends each master one `renew_many` batch, all at once, and decides
    /// each lease by majority.
    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let total = self.shared.nodes.len();
        let quorum = self.shared.quorum;
        let sent_at = Instant::now();
        let mut renewed = vec![0usize; requests.len()];
        let mut lost = vec![0usize; requests.len()];
        let mut first_error: Vec<Option<BackendError>> = vec![None; requests.len()];
        self.gather(
            |node| node.renew_many(requests),
            |results| {
                for (i, result) in results.into_iter().enumerate().take(requests.len()) {
                    match result {
                        Ok(RenewOutcome::Renewed) => renewed[i] += 1,
                        Ok(RenewOutcome::Lost) => lost[i] += 1,
                        Err(err) => {
                            first_error[i].get_or_insert(err);
                        }
                    }
                }
            },
        )
        .await;
        let elapsed = sent_at.elapsed();
        requests
            .iter()
            .enumerate()
            .map(|(i, request)| {
                let ttl = request.ttl.get();
                if renewed[i] >= quorum {
                    if elapsed + clock_drift(ttl) < ttl {
                        Ok(RenewOutcome::Renewed)
                    } else {
                        Err(BackendError::Timeout {
                            op: "renew",
                            key: request.key.as_str().to_owned(),
                            after: elapsed,
                        })
                    }
                } else if lost[i] >= quorum {
                    Ok(RenewOutcome::Lost)
                } else {
                    Err(no_quorum(
                        "renew",
                        &request.key,
                        NoQuorum {
                            verb: "renewed the lease",
                            agreed: renewed[i],
                            needed: quorum,
                            total,
                            first_error: first_error[i].take(),
                        },
                    ))
                }
            })
            .collect()
    }

    /// Releases on every master. `Released` when any master still had the
    /// lease (heard when a master's notice reached a waiter elsewhere),
    /// `NotHeld` when a majority did not; an error otherwise.
    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        let results = join_all(self.shared.nodes.iter().map(|n| n.release(key, holder))).await;
        let released = results
            .iter()
            .filter(|r| matches!(r, Ok(ReleaseReport::Released { .. })))
            .count();
        let heard = results
            .iter()
            .any(|r| matches!(r, Ok(report) if report.heard()));
        let not_held = results
            .iter()
            .filter(|r| matches!(r, Ok(ReleaseReport::NotHeld)))
            .count();
        if released > 0 {
            Ok(ReleaseReport::Released { heard })
        } else if not_held >= self.shared.quorum {
            Ok(ReleaseReport::NotHeld)
        } else {
            Err(no_quorum(
                "release",
                key,
                NoQuorum {
                    verb: "answered",
                    agreed: not_held,
                    needed: self.shared.quorum,
                    total: results.len(),
                    first_error: results.into_iter().find_map(Result::err),
                },
            ))
        }
    }

    /// Held when a majority of the masters holds the lease (the info shown
    /// is the one with the largest fencing token), free when a majority has
    /// no lease, an error otherwise.
    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        let results = join_all(self.shared.nodes.iter().map(|n| n.inspect(key))).await;
        let total = results.len();
        let mut held: Vec<LeaseInfo> = Vec::new();
        let mut free = 0;
        let mut first_error = None;
        for result in results {
            match result {
                Ok(Some(info)) => held.push(info),
                Ok(None) => free += 1,
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        if held.len() >= self.shared.quorum {
            Ok(combine(held))
        } else if free >= self.shared.quorum {
            Ok(None)
        } else {
            Err(no_quorum(
                "inspect",
                key,
                NoQuorum {
                    verb: "agreed on the lease",
                    agreed: held.len().max(free),
                    needed: self.shared.quorum,
                    total,
                    first_error,
                },
            ))
        }
    }

    /// Subscribes on every master that answers within the node timeout
    /// (each master's release publishes there); the first notice wins. With
    /// no master answering, waiters poll. Redlock never hands over: the
    /// backend has no [`handover`](LeaseBackend::handover): a release
    /// releases everywhere. Every policy subscribes on the masters as
    /// [`WatchPolicy::Counted`] does.
    async fn watch_releases(
        &self,
        key: &LeaseKey,
        policy: WatchPolicy,
    ) -> Result<ReleaseWatch, BackendError> {
        let _ = policy;
        let limit = self.shared.node_timeout;
        let watches = join_all(
            self.shared
                .nodes
                .iter()
                .map(|n| tokio::time::timeout(limit, n.watch_releases(key, WatchPolicy::Counted))),
        )
        .await;
        Ok(ReleaseWatch::any(
            watches.into_iter().filter_map(|w| w.ok()?.ok()),
        ))
    }

    /// `Some`, to refuse permits with the reason (see the type's
    /// documentation).
    fn permits(&self) -> Option<&impl PermitBackend> {
        Some(self)
    }

    /// `Some`, to refuse read-write leases with the reason (see the type's
    /// documentation).
    fn read_write(&self) -> Option<&impl ReadWriteBackend> {
        Some(self)
    }

    /// `Some`, to refuse fair mode with the reason (see the type's
    /// documentation).
    fn fair(&self) -> Option<&impl FairBackend> {
        Some(self)
    }
}

impl PermitBackend for RedlockBackend {
    /// Refused: see the type's documentation.
    async fn try_acquire_permit(
        &self,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> Result<AcquireOutcome, BackendError> {
        let _ = limit;
        Err(BackendError::Unsupported {
            op: "acquire_permit",
            key: request.key.as_str().to_owned(),
            reason: "Redlock has no counting leases: independent masters would each pick their own free permit, so no majority agrees on one; use a standalone, Sentinel or Cluster deployment for semaphores",
        })
    }
}

impl ReadWriteBackend for RedlockBackend {
    /// Refused: see the type's documentation.
    async fn try_acquire_read(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        Err(BackendError::Unsupported {
            op: "acquire_read",
            key: request.key.as_str().to_owned(),
            reason: REDLOCK_RW,
        })
    }

    /// Refused: see the type's documentation.
    async fn try_acquire_write(
        &self,
        request: &AcquireRequest,
    ) -> Result<AcquireOutcome, BackendError> {
        Err(BackendError::Unsupported {
            op: "acquire_write",
            key: request.key.as_str().to_owned(),
            reason: REDLOCK_RW,
        })
    }

    /// No intents to withdraw: no writer ever left one.
    async fn withdraw_write_intent(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<bool, BackendError> {
        let _ = (key, holder);
        Ok(false)
    }
}

impl FairBackend for RedlockBackend {
    /// Refused: see the type's documentation.
    async fn try_acquire_fair(
        &self,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        handover: Option<std::time::Duration>,
    ) -> Result<FairOutcome, BackendError> {
        let _ = (place_ttl, handover);
        Err(BackendError::Unsupported {
            op: "acquire_fair",
            key: request.key.as_str().to_owned(),
            reason: "Redlock has no fair mode: each independent master would queue waiters in the order they reached it, so the heads split the votes and no majority agrees on whose turn it is; use a standalone, Sentinel or Cluster deployment for fair mode",
        })
    }

    /// Nothing to hand over: no lease is taken in fair mode.
    async fn release_fair(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseOutcome, BackendError> {
        Ok(self.release(key, holder).await?.outcome())
    }

    /// Nothing is handed over.
    async fn watch_handover(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<HandoverWatch, BackendError> {
        let _ = (key, holder);
        Ok(HandoverWatch::unsupported())
    }

    /// No queue to leave.
    async fn leave_fair_queue(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<(), BackendError> {
        let _ = (key, holder);
        Ok(())
    }
}
