//! Client tracking on the renewal connection: the server tells the holder
//! when one of its lease keys changes, so the watchdog renews that lease at
//! once instead of at its next renewal.
//!
//! The renewal connection speaks RESP3 and runs `CLIENT TRACKING ON
//! NOLOOP`. Any write to a key drops its tracking (for every client, NOLOOP
//! or not), so a lease the renewal connection writes must be read again to
//! stay tracked. Which keys a read inside a script tracks differs: on Redis
//! 7.0 a read-only command makes the server track *every* key the script
//! call names, for the calling connection; Redis 7.2 and Valkey track only
//! the keys that command names. The scripts hold on both rules:
//!
//! - A lease is tracked from the script that grants it. While tracking is
//!   on, every lease write (acquisition, handover, release) travels over
//!   the renewal connection (the backend's `lease_writes`), at most
//!   `WRITES_IN_FLIGHT` (64) at a time so that a flood of them puts no more
//!   than that many scripts ahead of a renewal; NOLOOP keeps them from
//!   being reported back. `grant.lua` reads the lease (`PTTL`) after writing it,
//!   and writes the fencing counter last: the lease stays tracked, the
//!   counter (which outlives the lease) does not. A holder's re-acquisition reads
//!   its lease again after its `SET`. No round trip is added: the read is in
//!   the script.
//! - `renew.lua` reads the whole batch with one `MGET` and ends with one
//!   `EXISTS` naming every lease of the batch, so each read tracks the
//!   batch once under either rule, where a `GET` per lease tracked the
//!   whole batch once per lease on Redis 7.0 (quadratic in the batch size)
//!   and a single-key read tracked one lease of the batch on Valkey. An
//!   ACL without `MGET` gets a `GETEX` per lease (a write command, which
//!   tracking ignores).
//!
//! - `inspect` goes over the tracked connection too (while tracking is
//!   on): its `GET` tracks the key, so that an observer of a lease it does
//!   not hold (`LeaseManager::watch_leader`) hears of the next grant,
//!   renewal, release, deletion or expiry of it by anyone else, and reads
//!   it again, which tracks it again.
//!
//! The server then pushes an `invalidate` message when a tracked key changes
//! (a `SET`, a `DEL`, an expiry, an eviction), once per tracking of the key;
//! NOLOOP leaves out the connection's own writes. Each
//! push of a lease key becomes [`LeaseChange::Changed`]; a push of any other
//! key (a fencing counter, tracked when an acquisition found the lease
//! held, or a lease held by someone else, which a refused acquisition
//! reads) names no lease or one the watchdog does not hold, and changes
//! nothing. A flush (`invalidate` with no keys) and a lost connection
//! (changes may have been missed) become [`LeaseChange::All`].
//!
//! Tracking is turned on again before the first renewal or lease write on
//! every new connection (the connection counts its generations; a
//! disconnection, or behind Sentinel a new resolution of the master, starts
//! a new one). Before a grant, behind Sentinel, the master is looked up
//! first if the connection was forgotten, so that tracking is turned on for
//! the connection the grant then takes; a grant whose prelude fails fails
//! too (a transient error) rather than go out untracked. Only a connection
//! replaced between the prelude and the grant leaves a lease tracked from
//! its first renewal: the replacement reports [`LeaseChange::All`], which
//! renews the leases the watchdog holds by then. A server that refuses `CLIENT TRACKING` (an ACL without the right,
//! an old server) leaves renewals working without it, and lease writes go
//! over the other connection.
//!
//! Overflow: past `tracking-table-max-keys` the server evicts tracked keys
//! and reports each as changed; the renewal each report causes tracks the
//! key again and evicts another. A second in which at least
//! [`STORM_MIN_REPORTS`] held leases are reported changed, and more than a
//! quarter as many as were renewed, is taken for such a storm: tracking is
//! turned off for the backend, with a warning, and every open change watch
//! ends (as when the server refuses tracking), so that no one waits on a
//! feed that will stay quiet. Only reports of leases this
//! backend renewed in that second or the one before count: the keys a
//! storm keeps evicting are the ones its renewals keep tracking again,
//! while on Redis 7.0 a permit's grant also tracks every other permit of
//! its semaphore (the script names them all), whose holders' writes are
//! reported here once each and are no sign of overflow. Changes the
//! backend made itself over its other connection, which NOLOOP does not
//! cover, are not counted (none while tracking is on: its lease writes go
//! over the tracked one).

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold_core::{ChangeFeed, ChangeWatch, LeaseChange, LeaseKey, RenewRequest};
use redis::{PushInfo, PushKind, Value};
use tokio::time::Instant;
use tracing::warn;

use crate::layout::KeyLayout;

/// The shortest storm the overflow guard acts on: this many held leases
/// reported changed within [`STORM_WINDOW`].
pub(crate) const STORM_MIN_REPORTS: u64 = 1000;
/// The window the overflow guard counts in.
const STORM_WINDOW: Duration = Duration::from_secs(1);
/// A storm reports more than one in this many of the renewals sent in the
/// window. The server evicts tracked keys from its cron, a growing effort
/// of a hundred keys at a time, so in a storm the reports lag the renewals
/// that cause them: with a 100-key table and 3,000 leases renewed each
/// second, reports were seen running at about half the renewals in one
/// window and below it in the next, so "half" left the guard to chance.
/// Real changes to held leases (each one ends that lease) come nowhere near
/// a quarter of the renewals once a thousand leases are held.
const STORM_SHARE: u64 = 4;

/// The tracking state of one backend's renewal connection.
pub(crate) struct Tracking {
    layout: KeyLayout,
    /// Whether tracking is still wanted: false once the server refused it
    /// or the overflow guard turned it off.
    wanted: AtomicBool,
    /// Whether the server must be told to stop tracking (after the guard).
    turn_off: AtomicBool,
    /// The renewal connection's generation: bumped on every disconnection.
    generation: AtomicU64,
    /// The generation tracking was last turned on for (`u64::MAX`: never).
    enabled_for: AtomicU64,
    /// One turn-on at a time, so renewals wait for it rather than run
    /// untracked on a connection being set up.
    enabling: tokio::sync::Mutex<()>,
    /// Hashes the Redis keys of renewed leases, for the overflow guard.
    hasher: RandomState,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    feed: ChangeFeed,
    window: Window,
}

/// The hashes of a window's renewed leases' Redis keys: a `u64` each
/// rather than the key, so that counting renewals allocates nothing per
/// lease.
type Renewed = HashSet<u64>;

/// The overflow guard's counts for the current window.
#[derive(Default)]
struct Window {
    started: Option<Instant>,
    reported: u64,
    renewed: u64,
    /// Lease keys this backend wrote over its other connection in the window.
    own: HashSet<String>,
    /// The leases renewed in this window, and in the one just before it.
    renewed_keys: Renewed,
    renewed_before: Renewed,
}

impl Window {
    fn roll(&mut self, now: Instant) {
        let Some(started) = self.started else {
            self.started = Some(now);
            return;
        };
        let age = now.duration_since(started);
        if age >= STORM_WINDOW {
            // The keys renewed in the window that just ended still count in
            // the next; older ones do not.
            let before = if age < STORM_WINDOW * 2 {
                std::mem::take(&mut self.renewed_keys)
            } else {
                Renewed::default()
            };
            *self = Self {
                started: Some(now),
                renewed_before: before,
                ..Self::default()
            };
        }
    }

    /// Whether the lease whose Redis key hashes to `hash` was renewed in
    /// this window or the one before.
    fn was_renewed(&self, hash: u64) -> bool {
        self.renewed_keys.contains(&hash) || self.renewed_before.contains(&hash)
    }
}

/// What a renewal must send before its script, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prelude {
    /// `CLIENT TRACKING ON NOLOOP`, for the connection generation given.
    On(u64),
    /// `CLIENT TRACKING OFF`: the overflow guard turned tracking off.
    Off,
}

impl Tracking {
    pub(crate) fn new(layout: KeyLayout) -> Self {
        Self {
            layout,
            wanted: AtomicBool::new(true),
            turn_off: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            enabled_for: AtomicU64::new(u64::MAX),
            enabling: tokio::sync::Mutex::new(()),
            hasher: RandomState::new(),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole; a panic elsewhere cannot tear it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the server is asked to report changes.
    pub(crate) fn is_on(&self) -> bool {
        self.wanted.load(Ordering::Acquire)
    }

    /// A new watch of the changes reported from now on.
    pub(crate) fn watch(&self) -> ChangeWatch {
        self.state().feed.subscribe()
    }

    /// The lock a renewal holds while it sends a prelude, and what to send.
    /// `None` when nothing is needed (the common case: no lock is taken).
    pub(crate) async fn prelude(&self) -> Option<(tokio::sync::MutexGuard<'_, ()>, Prelude)> {
        if !self.needs_prelude() {
            return None;
        }
        let guard = self.enabling.lock().await;
        // Another renewal may have sent it while we waited.
        let prelude = if self.turn_off.load(Ordering::Acquire) {
            Prelude::Off
        } else if self.is_on() {
            let generation = self.generation.load(Ordering::Acquire);
            if self.enabled_for.load(Ordering::Acquire) == generation {
                return None;
            }
            Prelude::On(generation)
        } else {
            return None;
        };
        Some((guard, prelude))
    }

    /// Whether the next call on the renewal connection must send a prelude.
    pub(crate) fn needs_prelude(&self) -> bool {
        self.turn_off.load(Ordering::Acquire)
            || (self.is_on()
                && self.enabled_for.load(Ordering::Acquire)
                    != self.generation.load(Ordering::Acquire))
    }

    /// The server accepted `prelude`.
    pub(crate) fn done(&self, prelude: Prelude) {
        match prelude {
            Prelude::On(generation) => self.enabled_for.store(generation, Ordering::Release),
            Prelude::Off => self.turn_off.store(false, Ordering::Release),
        }
    }

    /// Ends every open change watch: tracking is off for good, and a
    /// watch that stayed open would look like a quiet server to those who
    /// wait on it (a leader watch would never see a new holder).
    fn stop_reporting(&self) {
        self.state().feed = ChangeFeed::new();
    }

    /// The server refused `CLIENT TRACKING`: renew without it from now on.
    pub(crate) fn refused(&self, error: &redis::RedisError) {
        self.turn_off.store(false, Ordering::Release);
        if self.wanted.swap(false, Ordering::AcqRel) {
            self.stop_reporting();
            warn!(%error, "the server refused CLIENT TRACKING; holders learn of a changed lease at their next renewal");
        }
    }

    /// Tracking cannot be had on this server: renew without it.
    pub(crate) fn unavailable(&self, why: &str) {
        if self.wanted.swap(false, Ordering::AcqRel) {
            self.stop_reporting();
            warn!(
                why,
                "client tracking is off; holders learn of a changed lease at their next renewal"
            );
        }
    }

    /// Counts the renewals of `batch` sent, and which leases they renew,
    /// for the overflow guard.
    pub(crate) fn renewing(&self, batch: &[RenewRequest]) {
        if !self.is_on() {
            return;
        }
        // Hashed before the lock, into one buffer for the whole batch.
        let mut redis_key = Vec::with_capacity(64);
        let hashes: Vec<u64> = batch
            .iter()
            .map(|request| {
                redis_key.clear();
                self.layout.write_lease(&request.key, &mut redis_key);
                self.hasher.hash_one(&redis_key[..])
            })
            .collect();
        let mut state = self.state();
        state.window.roll(Instant::now());
        state.window.renewed += batch.len() as u64;
        state.window.renewed_keys.extend(hashes);
    }

    /// Notes that this backend itself wrote `lease` (the Redis key) over its
    /// other connection: a report of it is no sign of overflow.
    pub(crate) fn own_write(&self, lease: String) {
        if self.is_on() {
            let mut state = self.state();
            state.window.roll(Instant::now());
            state.window.own.insert(lease);
        }
    }

    /// A connection other than the one tracking was turned on for will
    /// carry the renewals (Sentinel: the master was resolved again). With
    /// `report`, every lease is reported changed.
    pub(crate) fn new_connection(&self, report: bool) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if report && self.is_on() {
            self.state().feed.report(&LeaseChange::All);
        }
    }

    /// Handles one push from the renewal connection. Runs on the redis
    /// crate's connection task: it must not block.
    pub(crate) fn on_push(&self, push: PushInfo) {
        match push.kind {
            PushKind::Disconnection => {
                self.generation.fetch_add(1, Ordering::AcqRel);
                if self.is_on() {
                    self.state().feed.report(&LeaseChange::All);
                }
            }
            PushKind::Invalidate if self.is_on() => self.on_invalidate(&push.data),
            _ => {}
        }
    }

    fn on_invalidate(&self, data: &[Value]) {
        let keys = match data.first() {
            Some(Value::Array(keys)) => keys,
            // No keys: the server was flushed.
            _ => {
                self.state().feed.report(&LeaseChange::All);
                return;
            }
        };
        let now = Instant::now();
        let mut state = self.state();
        state.window.roll(now);
        for key in keys {
            let Value::BulkString(bytes) = key else {
                continue;
            };
            let Ok(redis_key) = std::str::from_utf8(bytes) else {
                continue;
            };
            let leases = lease_keys(&self.layout, redis_key);
            if leases.is_empty() {
                continue;
            }
            // Counted only for a lease renewed here lately (see the module
            // comment): not for another holder's permit, nor for this
            // backend's own write over its other connection.
            if state
                .window
                .was_renewed(self.hasher.hash_one(redis_key.as_bytes()))
                && !state.window.own.contains(redis_key)
            {
                state.window.reported += 1;
            }
            for lease in leases {
                state.feed.report(&LeaseChange::Changed(lease));
            }
        }
        let window = &state.window;
        if window.reported >= STORM_MIN_REPORTS && window.reported * STORM_SHARE > window.renewed {
            let (reported, renewed) = (window.reported, window.renewed);
            // Taken out under the lock: no report after this one.
            state.feed = ChangeFeed::new();
            drop(state);
            self.wanted.store(false, Ordering::Release);
            self.turn_off.store(true, Ordering::Release);
            warn!(
                reported,
                renewed,
                "the server reports more held leases changed than is plausible (its tracking table is full, see tracking-table-max-keys); turning client tracking off: holders learn of a changed lease at their next renewal"
            );
        }
    }
}

/// The lease keys whose Redis key is `redis_key`. A lease `K` without a
/// hash tag is kept at `N:{K}`, and a lease `{K}` is kept there too, so a
/// key of that form names both; other keys of the namespace (a lease with a
/// hash tag) name one.
pub(crate) fn lease_keys(layout: &KeyLayout, redis_key: &str) -> Vec<LeaseKey> {
    let Some(rest) = redis_key
        .strip_prefix(layout.namespace())
        .and_then(|r| r.strip_prefix(':'))
    else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    if let Some(inner) = rest.strip_prefix('{').and_then(|r| r.strip_suffix('}'))
        && let Ok(key) = LeaseKey::new(inner)
        && key.hash_tag().is_none()
    {
        keys.push(key);
    }
    if let Ok(key) = LeaseKey::new(rest)
        && key.hash_tag().is_some()
        && layout.lease(&key) == redis_key
    {
        keys.push(key);
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `invalidate` push's data naming `keys`.
    fn invalidated(keys: &[String]) -> Vec<Value> {
        vec![Value::Array(
            keys.iter()
                .map(|k| Value::BulkString(k.clone().into_bytes()))
                .collect(),
        )]
    }

    #[tokio::test(start_paused = true)]
    async fn only_leases_renewed_here_count_towards_a_storm()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let tracking = Tracking::new(layout.clone());
        let mut watch = tracking.watch();
        let n = usize::try_from(STORM_MIN_REPORTS).unwrap_or(usize::MAX);
        let (held, ours) = held(&layout, STORM_MIN_REPORTS)?;
        tracking.renewing(&held[..1]);
        // Others' leases (a semaphore's other permits), reported once each:
        // as many as a storm, and not one.
        let others: Vec<String> = (0..n)
            .map(|i| {
                layout.lease(&LeaseKey::new(format!("{{sem}}:permit:{i}")).expect("valid key"))
            })
            .collect();
        tracking.on_invalidate(&invalidated(&others));
        assert!(tracking.is_on(), "reports of leases not renewed here");
        // The leases renewed here, all reported in the next window: a storm.
        tokio::time::advance(STORM_WINDOW).await;
        tracking.renewing(&held);
        tracking.on_invalidate(&invalidated(&ours));
        assert!(!tracking.is_on(), "a storm of leases renewed here");
        // The watch reports what came before, then ends: no more reports
        // will come.
        let mut reported = 0;
        let ended = tokio::time::timeout(Duration::from_secs(1), async {
            while watch.next().await.is_some() {
                reported += 1;
            }
        });
        assert!(ended.await.is_ok(), "the watch stayed open");
        assert!(reported >= n, "{reported} reports before the end");
        assert!(!watch.is_supported());
        Ok(())
    }

    /// `n` leases held by one holder, and their Redis keys.
    fn held(
        layout: &KeyLayout,
        n: u64,
    ) -> Result<(Vec<RenewRequest>, Vec<String>), leasehold_core::InputError> {
        let ttl = leasehold_core::Ttl::parse("30s")?;
        let holder = leasehold_core::HolderId::generate()?;
        let held: Vec<RenewRequest> = (0..n)
            .map(|i| LeaseKey::new(format!("held:{i}")).map(|k| RenewRequest::new(k, holder, ttl)))
            .collect::<Result<_, _>>()?;
        let keys = held.iter().map(|r| layout.lease(&r.key)).collect();
        Ok((held, keys))
    }

    /// The guard counts within one window of [`STORM_WINDOW`]: a storm's
    /// worth of reports split across two windows, half in each, is no
    /// storm, while the same reports within one window are.
    #[tokio::test(start_paused = true)]
    async fn reports_count_towards_a_storm_within_one_window_only()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let (held, keys) = held(&layout, STORM_MIN_REPORTS)?;
        let (first, second) = keys.split_at(keys.len() / 2);
        let split = Tracking::new(layout.clone());
        split.renewing(&held);
        tokio::time::advance(STORM_WINDOW / 2).await;
        split.on_invalidate(&invalidated(first));
        tokio::time::advance(STORM_WINDOW / 2).await;
        split.renewing(&held);
        split.on_invalidate(&invalidated(second));
        assert!(split.is_on(), "half a storm in each of two windows");

        let whole = Tracking::new(layout);
        whole.renewing(&held);
        tokio::time::advance(STORM_WINDOW / 2).await;
        whole.on_invalidate(&invalidated(first));
        tokio::time::advance(STORM_WINDOW / 2 - Duration::from_millis(1)).await;
        whole.on_invalidate(&invalidated(second));
        assert!(!whole.is_on(), "a storm within one window");
        Ok(())
    }

    /// A window begins when the one before it ended, not at the next call
    /// after that: half a storm reported as a window ends and half a
    /// second later, once the next window has ended too, are counted
    /// apart.
    #[tokio::test(start_paused = true)]
    async fn a_window_begins_where_the_one_before_ended() -> Result<(), leasehold_core::InputError>
    {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let (held, keys) = held(&layout, STORM_MIN_REPORTS)?;
        let (first, second) = keys.split_at(keys.len() / 2);
        let tracking = Tracking::new(layout);
        tracking.renewing(&held);
        tokio::time::advance(STORM_WINDOW).await;
        tracking.on_invalidate(&invalidated(first));
        tokio::time::advance(STORM_WINDOW / 2).await;
        tracking.renewing(&held);
        tokio::time::advance(STORM_WINDOW / 2).await;
        tracking.on_invalidate(&invalidated(second));
        assert!(tracking.is_on(), "half a storm in each of two windows");
        Ok(())
    }

    /// Leases renewed in the window just before still count (the reports
    /// of a storm lag its renewals); leases renewed two windows back or
    /// earlier do not.
    #[tokio::test(start_paused = true)]
    async fn renewals_count_for_the_window_after_theirs_and_no_longer()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let (held, keys) = held(&layout, STORM_MIN_REPORTS)?;
        for (after, storm) in [
            (STORM_WINDOW, true),
            (STORM_WINDOW * 2 - Duration::from_millis(1), true),
            (STORM_WINDOW * 2, false),
        ] {
            let tracking = Tracking::new(layout.clone());
            tracking.renewing(&held);
            tokio::time::advance(after).await;
            tracking.on_invalidate(&invalidated(&keys));
            assert_eq!(
                !tracking.is_on(),
                storm,
                "reports {after:?} after the renewals"
            );
        }
        Ok(())
    }

    /// A storm is more reports than a quarter of the renewals of the
    /// window (and its one before): at a quarter exactly, or with the
    /// renewals counted once too few, none.
    #[tokio::test(start_paused = true)]
    async fn a_storm_is_more_reports_than_a_quarter_of_the_renewals()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let (held, keys) = held(&layout, STORM_MIN_REPORTS * STORM_SHARE)?;
        let n = usize::try_from(STORM_MIN_REPORTS).unwrap_or(usize::MAX);
        for (renewed, storm) in [(held.len(), false), (held.len() - 1, true), (2 * n, true)] {
            let tracking = Tracking::new(layout.clone());
            // Two batches, as the watchdog sends them.
            let (first, second) = held[..renewed].split_at(renewed / 2);
            tracking.renewing(first);
            tracking.renewing(second);
            tracking.on_invalidate(&invalidated(&keys[..n]));
            assert_eq!(
                !tracking.is_on(),
                storm,
                "{n} reports after {renewed} renewals"
            );
        }
        Ok(())
    }

    /// A lease this backend wrote itself over its other connection is no
    /// sign of overflow when it is reported: a storm's worth of them is
    /// none.
    #[tokio::test(start_paused = true)]
    async fn reports_of_the_backends_own_writes_are_no_storm()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let (held, keys) = held(&layout, STORM_MIN_REPORTS)?;
        let tracking = Tracking::new(layout);
        tracking.renewing(&held);
        for key in &keys {
            tracking.own_write(key.clone());
        }
        tracking.on_invalidate(&invalidated(&keys));
        assert!(tracking.is_on());
        Ok(())
    }

    /// Nothing is reported for a new connection that asks for no report,
    /// nor for a push once tracking is off.
    #[tokio::test(start_paused = true)]
    async fn no_report_unless_asked_for_and_tracking_is_on() {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        let tracking = Tracking::new(layout.clone());
        let mut watch = tracking.watch();
        tracking.new_connection(false);
        let next = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
        assert!(next.is_err(), "reported {next:?} for a new connection");
        tracking.new_connection(true);
        let next = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
        assert_eq!(next, Ok(Some(LeaseChange::All)));

        tracking.unavailable("a test");
        let mut after = tracking.watch();
        let lease = layout.lease(&LeaseKey::new("held").expect("valid key"));
        tracking.on_push(PushInfo {
            kind: PushKind::Invalidate,
            data: invalidated(&[lease]),
        });
        let next = tokio::time::timeout(Duration::from_secs(1), after.next()).await;
        assert!(next.is_err(), "reported {next:?} with tracking off");
    }

    /// Tracking that cannot be had ends the watches opened before.
    #[tokio::test(start_paused = true)]
    async fn tracking_given_up_ends_the_open_watches() {
        let tracking = Tracking::new(KeyLayout::new("ns").expect("valid namespace"));
        let mut watch = tracking.watch();
        tracking.unavailable("a test");
        let next = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
        assert_eq!(next, Ok(None), "the watch stayed open");
    }

    #[test]
    fn redis_keys_map_back_to_the_leases_kept_there() {
        let layout = KeyLayout::new("ns").expect("valid namespace");
        for name in ["job", "a:b", "{tag}x", "x{tag}"] {
            let key = LeaseKey::new(name).expect("valid key");
            assert!(
                lease_keys(&layout, &layout.lease(&key)).contains(&key),
                "{name}"
            );
        }
        // `job` and `{job}` share `ns:{job}`: both are named.
        let both = lease_keys(&layout, "ns:{job}");
        assert_eq!(both.len(), 2);
        // Keys outside the namespace name none.
        assert!(lease_keys(&layout, "other:{job}").is_empty());
        assert!(lease_keys(&layout, "nsx:{job}").is_empty());
        // A fencing counter is no lease's key: `{job}:fence` is not a valid
        // lease key, so a counter names none.
        assert!(lease_keys(&layout, "ns:{job}:fence").is_empty());
        assert!(lease_keys(&layout, "ns:order:{42}:fence").is_empty());
    }
}
