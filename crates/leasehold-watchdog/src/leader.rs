//! Who leads: a [`tokio::sync::watch`] of the holder of one lease key,
//! pushed by the backend's signals rather than polled.
//!
//! One *driver* task per manager and key keeps a `watch::Sender<Option<Leader>>`
//! true. It reads the lease ([`LeaseBackend::inspect`]) once at the start
//! and again whenever something says the lease may have changed:
//!
//! - a **change** of the key reported by the backend's change feed
//!   ([`ChangeBackend::watch_changes`](leasehold_core::ChangeBackend::watch_changes)): on Redis, client tracking pushes an
//!   invalidation when another connection grants, renews, releases or
//!   deletes the key, and when the server expires it (the driver's read
//!   tracks the key again); [`LeaseChange::All`] (a flush, a lost
//!   connection) counts too;
//! - a **release notice** of the key ([`WatchPolicy::Uncounted`]),
//!   which reaches every process, the releasing one included;
//! - a **grant through this manager**: a server does not report a
//!   connection's own writes back to it (Redis tracking runs with NOLOOP),
//!   so the manager tells its drivers of the leases it registers;
//! - a **fallback timer** at the lease's remaining ttl as read: a lease whose
//!   holder vanished is gone on the server by then, whether or not the
//!   server's expiry cycle has reported it yet;
//! - only where the backend reports no changes (a Redis Cluster, or a
//!   server whose tracking was turned off: the change watch ended), a
//!   re-read every [`UNREPORTED_RECHECK`] while the key is free or has no
//!   expiry, as nothing else would show a new holder there.
//!
//! A read that fails is retried after [`RETRY_AFTER_FAILURE`]; the watched
//! value keeps what was last read meanwhile. Receivers are woken only when
//! the leader changes (another fencing token or label, or none), not at
//! every renewal. The driver ends when its last receiver is dropped or the
//! manager shuts down; receivers then see the sender closed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_core::{
    ChangeWatch, FencingToken, LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, ReleaseWatch,
    WatchPolicy,
};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::LeaseError;

/// How long a driver waits before reading again after a failed read.
const RETRY_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// How often a leader watch reads a free (or unexpiring) key when the
/// backend reports no changes (a Redis Cluster, or tracking turned off):
/// nothing else shows a new holder there.
pub const UNREPORTED_RECHECK: Duration = Duration::from_secs(1);

/// Past the remaining ttl a read reported, how long the fallback timer
/// waits: the server expires a key once its clock is past the expiry, in
/// whole milliseconds.
const EXPIRY_SLACK: Duration = Duration::from_millis(2);

/// The holder of a watched lease key, as an observer learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's public label (a host or pod name), if it set one.
    pub label: Option<String>,
    /// The fencing token of the leader's lease; `None` when the key was
    /// written by something other than leasehold.
    pub fencing_token: Option<FencingToken>,
    /// The lease's remaining ttl when this observer learned of the leader
    /// (`None` for a key without expiry). Not updated at renewals.
    pub ttl_left: Option<Duration>,
    /// When this observer learned of the leader (its local monotonic clock).
    pub since: Instant,
}

impl Leader {
    fn from_info(info: LeaseInfo, now: Instant) -> Self {
        Self {
            label: info.label,
            fencing_token: info.fencing_token,
            ttl_left: info.ttl_left,
            since: now,
        }
    }

    /// Whether `self` and `other` are one term: the same fencing token and label.
    fn same_term(&self, other: &Self) -> bool {
        self.fencing_token == other.fencing_token && self.label == other.label
    }
}

/// The drivers of one manager, by key.
#[derive(Default)]
pub(crate) struct Leaders {
    drivers: Mutex<HashMap<LeaseKey, Driver>>,
}

/// What the manager keeps of a running driver.
struct Driver {
    sender: watch::Sender<Option<Leader>>,
    /// Wakes the driver to read again (a grant through this manager).
    local: Arc<Notify>,
}

impl Leaders {
    fn lock(&self) -> MutexGuard<'_, HashMap<LeaseKey, Driver>> {
        // Every update is one insert or remove: a panic cannot tear the map.
        self.drivers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This manager registered a lease of `key`: its driver, if any, reads
    /// again, as the server does not report the manager's own writes.
    pub(crate) fn granted(&self, key: &LeaseKey) {
        if let Some(driver) = self.lock().get(key) {
            driver.local.notify_one();
        }
    }

    /// A receiver of `key`'s leader: of the running driver, or of a new one
    /// started on `backend` after its first read.
    pub(crate) async fn watch<B: LeaseBackend>(
        self: &Arc<Self>,
        backend: &B,
        key: LeaseKey,
        shutdown: &CancellationToken,
    ) -> Result<watch::Receiver<Option<Leader>>, LeaseError> {
        if shutdown.is_cancelled() {
            return Err(LeaseError::ManagerStopped);
        }
        if let Some(driver) = self.lock().get(&key) {
            return Ok(driver.sender.subscribe());
        }
        // Subscribed before the first read, so that no change after the
        // read goes unheard.
        let changes = crate::capability::watch_changes(backend).await?;
        let releases = backend.watch_releases(&key, WatchPolicy::Uncounted).await?;
        let info = backend.inspect(&key).await?;
        let read_at = Instant::now();
        let mut drivers = self.lock();
        if let Some(driver) = drivers.get(&key) {
            // Another watch started one meanwhile.
            return Ok(driver.sender.subscribe());
        }
        let deadline = next_read(info.as_ref(), read_at, changes.is_supported());
        let (sender, receiver) = watch::channel(info.map(|i| Leader::from_info(i, read_at)));
        let local = Arc::new(Notify::new());
        drivers.insert(
            key.clone(),
            Driver {
                sender: sender.clone(),
                local: Arc::clone(&local),
            },
        );
        drop(drivers);
        let run = Run {
            backend: backend.clone(),
            key,
            sender,
            changes,
            releases,
            local,
            deadline,
            failing: false,
            leaders: Arc::clone(self),
        };
        tokio::spawn(run.run(shutdown.clone()));
        Ok(receiver)
    }
}

/// When to read again without a signal: at the lease's expiry as read; or,
/// where the backend reports no changes, after [`UNREPORTED_RECHECK`] when
/// nothing else would show a new holder.
fn next_read(info: Option<&LeaseInfo>, read_at: Instant, reported: bool) -> Option<Instant> {
    match info.and_then(|i| i.ttl_left) {
        Some(ttl_left) if !reported => {
            Some(read_at + (ttl_left + EXPIRY_SLACK).min(UNREPORTED_RECHECK))
        }
        Some(ttl_left) => Some(read_at + ttl_left + EXPIRY_SLACK),
        None if reported => None,
        None => Some(read_at + UNREPORTED_RECHECK),
    }
}

/// A running driver.
struct Run<B> {
    backend: B,
    key: LeaseKey,
    sender: watch::Sender<Option<Leader>>,
    changes: ChangeWatch,
    releases: ReleaseWatch,
    local: Arc<Notify>,
    /// When to read again if nothing else says to.
    deadline: Option<Instant>,
    /// Whether the last read failed (its error was logged once).
    failing: bool,
    leaders: Arc<Leaders>,
}

/// Why a driver reads again.
enum Wake {
    Signal,
    Idle,
    Stop,
}

impl<B: LeaseBackend> Run<B> {
    async fn run(mut self, shutdown: CancellationToken) {
        loop {
            match self.wait(&shutdown).await {
                Wake::Stop => break,
                Wake::Idle => continue,
                Wake::Signal => self.read().await,
            }
        }
        if shutdown.is_cancelled() {
            // No watch starts on a stopped manager: the entry is this driver's.
            self.leaders.lock().remove(&self.key);
        }
    }

    /// Waits for a reason to read again.
    async fn wait(&mut self, shutdown: &CancellationToken) -> Wake {
        let deadline = self.deadline;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => Wake::Stop,
            () = self.sender.closed() => {
                // Decided and undone under the lock, so that a watch
                // subscribing now either finds this driver alive or finds
                // none and starts its own.
                let mut drivers = self.leaders.lock();
                if self.sender.receiver_count() == 0 {
                    drivers.remove(&self.key);
                    return Wake::Stop;
                }
                Wake::Idle
            }
            change = self.changes.next(), if self.changes.is_supported() => match change {
                Some(LeaseChange::Changed(key)) if key != self.key => Wake::Idle,
                Some(_) => Wake::Signal,
                // The backend stopped reporting: the fallback timers rule from here.
                None => Wake::Signal,
            },
            () = self.releases.released() => Wake::Signal,
            () = self.local.notified() => Wake::Signal,
            () = sleep_until(deadline), if deadline.is_some() => Wake::Signal,
        }
    }

    /// Reads the lease and publishes its leader if it changed.
    async fn read(&mut self) {
        match self.backend.inspect(&self.key).await {
            Ok(info) => {
                let now = Instant::now();
                if std::mem::take(&mut self.failing) {
                    debug!(key = %self.key, "reading the leader works again");
                }
                self.deadline = next_read(info.as_ref(), now, self.changes.is_supported());
                let leader = info.map(|i| Leader::from_info(i, now));
                self.sender.send_if_modified(|current| {
                    let same = match (current.as_ref(), leader.as_ref()) {
                        (None, None) => true,
                        (Some(a), Some(b)) => a.same_term(b),
                        _ => false,
                    };
                    if !same {
                        *current = leader;
                    }
                    !same
                });
            }
            Err(error) => {
                if !std::mem::replace(&mut self.failing, true) {
                    warn!(key = %self.key, %error, "cannot read the leader; retrying, and keeping the last one read");
                }
                self.deadline = Some(Instant::now() + RETRY_AFTER_FAILURE);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ttl_left: Option<Duration>) -> LeaseInfo {
        let mut info = LeaseInfo::default();
        info.ttl_left = ttl_left;
        info.fencing_token = Some(FencingToken(3));
        info.label = Some("node-a".to_owned());
        info
    }

    /// Where changes are reported, a held key is read again 2 ms past its
    /// remaining ttl and a free one only on a signal; where they are not,
    /// at the latest after the recheck period.
    #[tokio::test(start_paused = true)]
    async fn the_next_read_comes_at_the_expiry_or_the_recheck() {
        let now = Instant::now();
        let five = Duration::from_secs(5);
        let short = Duration::from_millis(300);
        assert_eq!(
            next_read(Some(&info(Some(five))), now, true),
            Some(now + five + EXPIRY_SLACK)
        );
        assert_eq!(
            next_read(Some(&info(Some(five))), now, false),
            Some(now + UNREPORTED_RECHECK)
        );
        assert_eq!(
            next_read(Some(&info(Some(short))), now, false),
            Some(now + short + EXPIRY_SLACK)
        );
        assert_eq!(next_read(None, now, true), None);
        assert_eq!(next_read(None, now, false), Some(now + UNREPORTED_RECHECK));
        assert_eq!(next_read(Some(&info(None)), now, true), None);
        assert_eq!(
            next_read(Some(&info(None)), now, false),
            Some(now + UNREPORTED_RECHECK)
        );
    }

    /// One term is one token and one label; a renewal (a new ttl, a later
    /// read) is the same term and publishes nothing.
    #[tokio::test(start_paused = true)]
    async fn a_term_is_its_token_and_label() {
        let now = Instant::now();
        let a = Leader::from_info(info(Some(Duration::from_secs(5))), now);
        let renewed = Leader::from_info(
            info(Some(Duration::from_secs(9))),
            now + Duration::from_secs(1),
        );
        assert!(a.same_term(&renewed));
        let mut other_token = info(Some(Duration::from_secs(5)));
        other_token.fencing_token = Some(FencingToken(4));
        assert!(!a.same_term(&Leader::from_info(other_token, now)));
        let mut other_label = info(Some(Duration::from_secs(5)));
        other_label.label = Some("node-b".to_owned());
        assert!(!a.same_term(&Leader::from_info(other_label, now)));
        let mut neither = info(Some(Duration::from_secs(5)));
        neither.fencing_token = Some(FencingToken(4));
        neither.label = Some("node-b".to_owned());
        assert!(!a.same_term(&Leader::from_info(neither, now)));
    }
}
