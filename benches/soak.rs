//! A soak: 10,000 leases of every kind held and churned for an hour through
//! two `LeaseManager`s against one append-only `redis-server` that is, in
//! turn, paused, restarted and cut off every few minutes.
//!
//! Run with `cargo bench --bench soak` (an hour; not run by CI, which runs
//! only the quick configuration below). Prints one JSON line on stdout and
//! a human summary on stderr; exits non-zero on a correctness violation.
//!
//! The leases (`LEASEHOLD_SOAK_LEASES`, default 10,000, split in these
//! proportions): exclusive leases on keys of their own, each re-acquired
//! under a new name after its release, so keys come and go (one in ten in
//! fair mode); semaphores of up to 100 permits (a tenth of the leases) whose permits a few more holders want than
//! there are; 10 read-write leases, each with many readers and one writer
//! that comes back every so often (a waiting writer keeps new readers
//! out); a few exclusive keys that four holders each contend for (half of
//! them in fair mode). Every holder holds for a random time
//! (`LEASEHOLD_SOAK_HOLD_SECS`, the longest, default 200 s; the shortest a
//! tenth of it), releases, and acquires again; a holder whose token fires
//! acquires again after a short pause. Half the holders use each manager,
//! and both reach the server through one testkit `Proxy`.
//!
//! The faults, every `LEASEHOLD_SOAK_FAULT_EVERY_SECS` (default 180, the
//! first after half of it) in turn: the server paused with SIGSTOP for
//! half the ttl (keys keep expiring meanwhile), the server
//! killed and restarted from its append-only file (`appendfsync always`:
//! every key survives), and the clients cut off (the proxy blackholes)
//! for two ttls. The ttl is `LEASEHOLD_SOAK_TTL_MS` (default 4,000).
//!
//! The verdict (any failure exits non-zero):
//!
//! - **unexplained losses**: a token that fired (other than at shutdown)
//!   neither while a fault was active nor within one ttl after it healed
//!   (`LEASEHOLD_SOAK_EXPLAIN_MS` sets that window, to see the verdict
//!   bite with 0);
//! - **the soak's own record**, kept from each grant (the acquisition's
//!   return) until its token fired or its holder called release: no two
//!   believers of one server key (an exclusive lease, a permit, a share),
//!   no more believers of a semaphore than its limit, no writer beside
//!   anyone of its read-write lease; fencing tokens rise on every server
//!   key, and a grant's token is above that of every share of its key
//!   that ended before the acquisition began;
//! - **the server's state**, on a side connection that no fault cuts: a
//!   sweep reads every believed lease's value and `PTTL` (every 5 s, every
//!   second around faults); a lease believed from before the read until
//!   after it must be there, with its holder's fencing token and time left
//!   (else the token did not fire first). A script checks on the server
//!   that no read-write lease has a writer beside a reader;
//! - **no key left**: the namespace is empty once every lease is released
//!   and the fencing counters' retention (5 s here) has passed;
//! - **a bounded record**: once every holder stopped, the soak's own
//!   record keeps no belief and no key but those acquisitions take again
//!   (so that the heap figures below are the library's, not the record's).
//!
//! The figures: the smallest `PTTL` of a believed lease the sweeps saw, and
//! the `PTTL` left when a token fired with `Deadline` (read right after,
//! when the server was not paused: a lower bound of the time between the
//! token and the server's expiry), the client's RSS, the client's heap in
//! use (the bytes its allocator handed out and did not get back) and the
//! server's `used_memory` at the start (once the leases are first held), at
//! the end and their extremes and slope over the run.
//!
//! Under `cargo test` (no `--bench` argument) or `LEASEHOLD_BENCH_QUICK=1`
//! it runs 300 leases with a 1 s ttl for 5.5 s, one fault of each kind,
//! with the same verdict.
//!
//! A bench rather than an `#[ignore]`d test: it is one long run that
//! prints figures, as the other benches do, and its quick configuration
//! runs under `cargo test --all-targets` for free, where an ignored test
//! would never run until asked for.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use common::{Json, env_number, quick, status_bytes};
use leasehold::redis::RedisBackend;
use leasehold::{
    CancellationToken, Fair, LeaseKey, LeaseManager, LeaseOptions, LossReason, PermitLimit,
};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};

/// The system allocator, counting the bytes in use: RSS alone cannot tell
/// memory the soak holds from memory the allocator keeps resident after a
/// storm of allocations has freed it.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

type BenchError = Box<dyn std::error::Error + Send + Sync>;
type BenchResult<T = ()> = Result<T, BenchError>;

/// The namespace of the soak's keys.
const NAMESPACE: &str = "soak";
/// Read-write leases: "a few", whatever the number of leases.
const RW_LEASES: usize = 10;
/// Holders per contended exclusive key.
const CONTENDERS: usize = 4;
/// Keys per sweep script call: a few milliseconds of the server's time.
const SWEEP_CHUNK: usize = 500;
/// Violations described in the summary (all are counted).
const DESCRIBED: usize = 20;

/// Reads each key's value and `PTTL` at once (a missing value as "").
const SWEEP_SOURCE: &str = "local r = {} for _, k in ipairs(KEYS) do r[#r + 1] = redis.call('GET', k) or '' r[#r + 1] = redis.call('PTTL', k) end return r";

/// Counts the readers present beside a writer of a read-write lease:
/// KEYS[1] is `P:write`, KEYS[2] `P:readers`, ARGV[1] the readers' prefix.
const RW_SOURCE: &str = "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end local n = 0 for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do n = n + redis.call('EXISTS', ARGV[1] .. id) end return n";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A duration in seconds (fractions allowed) from the environment.
fn env_secs(name: &str, default: f64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The run's settings.
struct Config {
    quick: bool,
    leases: usize,
    run: Duration,
    ttl: Duration,
    fault_every: Duration,
    pause: Duration,
    cut: Duration,
    explain: Duration,
    hold_max: Duration,
    retention: Duration,
    sweep_every: Duration,
    sweep_every_faulty: Duration,
    sample_every: Duration,
    seed: u64,
}

impl Config {
    fn from_env() -> Self {
        let quick = quick();
        let ttl = Duration::from_millis(if quick {
            1000
        } else {
            env_number("LEASEHOLD_SOAK_TTL_MS", 4000)
        });
        let explain = std::env::var("LEASEHOLD_SOAK_EXPLAIN_MS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map_or(ttl, Duration::from_millis);
        let seed = env_number("LEASEHOLD_SOAK_SEED", fastrand::u64(..));
        if quick {
            Self {
                quick,
                leases: 300,
                run: Duration::from_millis(5500),
                ttl,
                fault_every: Duration::from_millis(1200),
                pause: ttl / 2,
                cut: ttl * 2,
                explain,
                hold_max: Duration::from_secs(3),
                retention: Duration::from_secs(1),
                sweep_every: Duration::from_millis(250),
                sweep_every_faulty: Duration::from_millis(100),
                sample_every: Duration::from_millis(250),
                seed,
            }
        } else {
            Self {
                quick,
                leases: usize::try_from(env_number("LEASEHOLD_SOAK_LEASES", 10_000))
                    .unwrap_or(10_000)
                    .max(1000),
                run: env_secs("LEASEHOLD_SOAK_SECS", 3600.0),
                ttl,
                fault_every: env_secs("LEASEHOLD_SOAK_FAULT_EVERY_SECS", 180.0),
                pause: ttl / 2,
                cut: ttl * 2,
                explain,
                hold_max: env_secs("LEASEHOLD_SOAK_HOLD_SECS", 200.0),
                retention: Duration::from_secs(5),
                sweep_every: Duration::from_secs(5),
                sweep_every_faulty: Duration::from_secs(1),
                sample_every: Duration::from_secs(10),
                seed,
            }
        }
    }

    fn hold_min(&self) -> Duration {
        self.hold_max / 10
    }
}

/// What one holder takes, over and over.
#[derive(Clone, Copy, Debug)]
enum Role {
    /// An exclusive lease on a key of its own, renamed at each acquisition.
    Unique {
        fair: bool,
    },
    /// One of the exclusive keys several holders contend for.
    Contended {
        key: usize,
        fair: bool,
    },
    Permit {
        semaphore: usize,
    },
    Reader {
        rw: usize,
    },
    Writer {
        rw: usize,
    },
}

/// The holders, and how many leases are held when no writer is in.
fn roles(leases: usize) -> (Vec<Role>, usize) {
    let contended_keys = (leases / 200).max(1);
    let (semaphores, limit) = semaphores(leases);
    let limit = limit as usize;
    let readers = (leases / 50).max(2);
    let unique = leases - contended_keys - semaphores * limit - RW_LEASES * readers;
    let mut roles = Vec::new();
    for i in 0..unique {
        roles.push(Role::Unique { fair: i % 10 == 0 });
    }
    for key in 0..contended_keys {
        for _ in 0..CONTENDERS {
            roles.push(Role::Contended {
                key,
                fair: key % 2 == 0,
            });
        }
    }
    for semaphore in 0..semaphores {
        // A few more holders than permits, so some wait.
        for _ in 0..limit + (limit / 20).max(1) {
            roles.push(Role::Permit { semaphore });
        }
    }
    for rw in 0..RW_LEASES {
        for _ in 0..readers {
            roles.push(Role::Reader { rw });
        }
        roles.push(Role::Writer { rw });
    }
    // Interleave the kinds, so both managers get some of each.
    fastrand::Rng::with_seed(7).shuffle(&mut roles);
    (roles, leases)
}

/// The server keys that the holders' acquisitions take again and again,
/// which the soak's record keeps: the contended keys, the permits' slots
/// (`limit` per semaphore) and the read-write leases' writer keys. Every
/// other key is one acquisition's own and leaves the record with its
/// belief.
fn shared_keys(roles: &[Role], limit: u32) -> usize {
    /// One shared server key, named by what it belongs to.
    #[derive(PartialEq, Eq, Hash)]
    enum SharedKey {
        Contended(usize),
        PermitSlot { semaphore: usize, slot: u32 },
        Writer(usize),
    }
    let mut keys = std::collections::HashSet::new();
    for role in roles {
        match *role {
            Role::Contended { key, .. } => {
                keys.insert(SharedKey::Contended(key));
            }
            Role::Permit { semaphore } => {
                keys.extend((0..limit).map(|slot| SharedKey::PermitSlot { semaphore, slot }));
            }
            Role::Writer { rw } => {
                keys.insert(SharedKey::Writer(rw));
            }
            Role::Unique { .. } | Role::Reader { .. } => {}
        }
    }
    keys.len()
}

/// A tenth of the leases are permits, of semaphores of at most
/// `PermitLimit::MAX` (100): how many semaphores, and their limit.
fn semaphores(leases: usize) -> (usize, u32) {
    let permits = (leases / 10).max(2);
    let limit = (permits / 5).clamp(2, PermitLimit::MAX as usize);
    (
        permits / limit,
        u32::try_from(limit).unwrap_or(PermitLimit::MAX),
    )
}

// ---------------------------------------------------------------- checker

/// What a group of server keys allows at once.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GroupKind {
    Exclusive,
    Semaphore(u32),
    ReadWrite,
}

/// A lease its holder believes in: from the acquisition's return until
/// its token fired or its holder called release.
struct Belief {
    group: Arc<str>,
    key: Arc<str>,
    token: u64,
    writer: bool,
    fired: CancellationToken,
}

impl Belief {
    /// Whether the holder still believes. A fired token ends the belief at
    /// once, not when its holder's task gets to run.
    fn live(&self) -> bool {
        !self.fired.is_cancelled()
    }
}

struct Group {
    ids: Vec<u64>,
    /// The highest token of a belief of this group that has ended.
    max_ended: u64,
    /// Kept when empty (semaphores, read-write and contended keys).
    keep: bool,
}

struct KeyState {
    ids: Vec<u64>,
    max_token: u64,
    /// Kept when empty: a key that later acquisitions take again (not a
    /// key of one acquisition's own, as an exclusive lease renamed at each
    /// acquisition or a reader's share, named by its holder).
    keep: bool,
}

#[derive(Default)]
struct CheckerState {
    next: u64,
    active: HashMap<u64, Belief>,
    groups: HashMap<Arc<str>, Group>,
    keys: HashMap<Arc<str>, KeyState>,
    overlaps: u64,
    excesses: u64,
    rw_conflicts: u64,
    token_order: u64,
    most_permits: u32,
    most_readers: u32,
    writer_holds: u64,
    described: Vec<String>,
}

impl CheckerState {
    fn violation(&mut self, what: String) {
        if self.described.len() < DESCRIBED {
            self.described.push(what);
        }
    }

    fn live_in(&self, ids: &[u64]) -> impl Iterator<Item = &Belief> {
        ids.iter()
            .filter_map(|id| self.active.get(id))
            .filter(|b| b.live())
    }
}

/// The soak's own record of who believes what, judged at every grant.
#[derive(Default)]
struct Checker(Mutex<CheckerState>);

/// One grant, as the checker is told of it.
struct GrantInfo {
    group: Arc<str>,
    kind: GroupKind,
    /// The group, and its server key unless it is a reader's share, are
    /// kept when empty (see [`Group::keep`] and [`KeyState::keep`]).
    keep: bool,
    key: Arc<str>,
    token: u64,
    writer: bool,
    fired: CancellationToken,
    /// The group's highest ended token when the acquisition began.
    floor: u64,
}

impl Checker {
    fn floor(&self, group: &str) -> u64 {
        lock(&self.0).groups.get(group).map_or(0, |g| g.max_ended)
    }

    fn grant(&self, g: GrantInfo) -> u64 {
        let mut s = lock(&self.0);
        let s = &mut *s;
        let earlier = s
            .keys
            .get(&g.key)
            .map(|key| (s.live_in(&key.ids).next().is_some(), key.max_token));
        if let Some((held, max_token)) = earlier {
            if held {
                s.overlaps += 1;
                let what = format!("two holders of {} at once (token {})", g.key, g.token);
                s.violation(what);
            }
            if g.token <= max_token {
                s.token_order += 1;
                let what = format!(
                    "{}: token {} not above the key's earlier {max_token}",
                    g.key, g.token
                );
                s.violation(what);
            }
        }
        if g.token <= g.floor {
            s.token_order += 1;
            let what = format!(
                "{}: token {} not above {} of a share that ended before the acquisition began",
                g.key, g.token, g.floor
            );
            s.violation(what);
        }
        let group = s.groups.entry(g.group.clone()).or_insert(Group {
            ids: Vec::new(),
            max_ended: 0,
            keep: g.keep,
        });
        let ids = group.ids.clone();
        let live: Vec<bool> = s.live_in(&ids).map(|b| b.writer).collect();
        match g.kind {
            GroupKind::Semaphore(limit) => {
                let holders = u32::try_from(live.len() + 1).unwrap_or(u32::MAX);
                s.most_permits = s.most_permits.max(holders);
                if holders > limit {
                    s.excesses += 1;
                    let what =
                        format!("{holders} holders of semaphore {} (limit {limit})", g.group);
                    s.violation(what);
                }
            }
            GroupKind::ReadWrite => {
                if g.writer {
                    s.writer_holds += 1;
                }
                if (g.writer && !live.is_empty()) || live.iter().any(|w| *w) {
                    s.rw_conflicts += 1;
                    let what = format!(
                        "a writer beside another holder of {} ({} others, new one a writer: {})",
                        g.group,
                        live.len(),
                        g.writer
                    );
                    s.violation(what);
                }
                if !g.writer {
                    let readers = u32::try_from(live.len() + 1).unwrap_or(u32::MAX);
                    s.most_readers = s.most_readers.max(readers);
                }
            }
            GroupKind::Exclusive => {}
        }
        s.next += 1;
        let id = s.next;
        if let Some(group) = s.groups.get_mut(&g.group) {
            group.ids.push(id);
        }
        // A reader's share is a key of its own, named by its holder: kept,
        // one would stay in the record for every share ever taken.
        let reader = g.kind == GroupKind::ReadWrite && !g.writer;
        let key = s.keys.entry(g.key.clone()).or_insert(KeyState {
            ids: Vec::new(),
            max_token: 0,
            keep: g.keep && !reader,
        });
        key.ids.push(id);
        key.max_token = key.max_token.max(g.token);
        s.active.insert(
            id,
            Belief {
                group: g.group,
                key: g.key,
                token: g.token,
                writer: g.writer,
                fired: g.fired,
            },
        );
        id
    }

    /// The belief ends: its token fired, or its holder calls release.
    fn end(&self, id: u64) {
        let mut s = lock(&self.0);
        let Some(belief) = s.active.remove(&id) else {
            return;
        };
        if let Some(group) = s.groups.get_mut(&belief.group) {
            group.ids.retain(|i| *i != id);
            group.max_ended = group.max_ended.max(belief.token);
            if group.ids.is_empty() && !group.keep {
                s.groups.remove(&belief.group);
            }
        }
        if let Some(key) = s.keys.get_mut(&belief.key) {
            key.ids.retain(|i| *i != id);
            if key.ids.is_empty() && !key.keep {
                s.keys.remove(&belief.key);
            }
        }
    }

    /// Whether the belief `id` is still held (not ended, token not fired).
    fn believed(&self, id: u64) -> bool {
        lock(&self.0).active.get(&id).is_some_and(Belief::live)
    }

    /// Every live belief: its id, server key and token.
    fn snapshot(&self) -> Vec<(u64, Arc<str>, u64)> {
        lock(&self.0)
            .active
            .iter()
            .filter(|(_, b)| b.live())
            .map(|(id, b)| (*id, b.key.clone(), b.token))
            .collect()
    }
}

// ---------------------------------------------------------------- faults

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum FaultKind {
    Pause,
    Restart,
    Cut,
}

struct Window {
    kind: FaultKind,
    start: Instant,
    healed: Option<Instant>,
}

#[derive(Default)]
struct Faults(Mutex<Vec<Window>>);

impl Faults {
    fn begin(&self, kind: FaultKind) {
        lock(&self.0).push(Window {
            kind,
            start: Instant::now(),
            healed: None,
        });
    }

    fn heal(&self) {
        if let Some(w) = lock(&self.0).last_mut() {
            w.healed = Some(Instant::now());
        }
    }

    /// The fault that explains a token firing at `at`: active then, or
    /// healed at most `window` before.
    fn explains(&self, at: Instant, window: Duration) -> Option<FaultKind> {
        lock(&self.0)
            .iter()
            .rev()
            .find(|w| w.start <= at && w.healed.is_none_or(|h| at <= h + window))
            .map(|w| w.kind)
    }

    fn paused(&self) -> bool {
        lock(&self.0)
            .last()
            .is_some_and(|w| w.kind == FaultKind::Pause && w.healed.is_none())
    }

    /// A fault is active or healed within `window`: sweep more often.
    fn near(&self, window: Duration) -> bool {
        lock(&self.0)
            .last()
            .is_some_and(|w| w.healed.is_none_or(|h| h.elapsed() <= window))
    }

    fn count(&self, kind: FaultKind) -> u64 {
        lock(&self.0).iter().filter(|w| w.kind == kind).count() as u64
    }
}

// ---------------------------------------------------------------- tallies

#[derive(Default)]
struct Tally {
    held: AtomicI64,
    acquired: AtomicU64,
    released: AtomicU64,
    release_failed: AtomicU64,
    acquire_failed: AtomicU64,
    /// Acquisitions that had not returned well past their wait.
    acquire_hung: AtomicU64,
    lost_explained: AtomicU64,
    lost_unexplained: AtomicU64,
    lost_deadline: AtomicU64,
    lost_lost: AtomicU64,
    unexplained: Mutex<Vec<String>>,
    /// Sweeps: runs, leases judged, leases the server did not hold for
    /// their believing holder, the smallest `PTTL` of a judged lease.
    sweeps: AtomicU64,
    swept: AtomicU64,
    unheld: AtomicU64,
    unheld_described: Mutex<Vec<String>>,
    min_pttl_ms: AtomicI64,
    rw_server_conflicts: AtomicU64,
    /// Probes right after a `Deadline`: how many, the smallest `PTTL`
    /// left (ms) and how many found the key already gone.
    probes: AtomicU64,
    probe_min_ms: AtomicI64,
    probe_gone: AtomicU64,
    /// Keys of the namespace before each kill, and after its restart.
    restart_keys: Mutex<Vec<(u64, u64)>>,
}

// ---------------------------------------------------------------- the run

struct Ctx {
    config: Config,
    checker: Checker,
    faults: Faults,
    tally: Tally,
    stop: CancellationToken,
    side: ConnectionManager,
    sweep: redis::Script,
    probes: tokio::sync::Semaphore,
    limit: u32,
    permits: PermitLimit,
}

/// The options each role acquires with.
struct Options {
    unique: LeaseOptions,
    unique_fair: LeaseOptions,
    contended: LeaseOptions,
    contended_fair: LeaseOptions,
    shared: LeaseOptions,
    writer: LeaseOptions,
}

impl Options {
    fn new(config: &Config) -> BenchResult<Self> {
        let ttl = config.ttl;
        let with = |wait: Duration, fair: bool| {
            let mut b = LeaseOptions::builder().ttl(ttl).wait(wait);
            if fair {
                b = b.fair(Fair::default());
            }
            b.build()
        };
        Ok(Self {
            unique: with(ttl, false)?,
            unique_fair: with(ttl, true)?,
            contended: with(ttl * 3, false)?,
            contended_fair: with(ttl * 3, true)?,
            shared: with(ttl * 3, false)?,
            writer: with(config.hold_max / 4 + ttl * 2, false)?,
        })
    }

    fn of(&self, role: Role) -> &LeaseOptions {
        match role {
            Role::Unique { fair: false } => &self.unique,
            Role::Unique { fair: true } => &self.unique_fair,
            Role::Contended { fair: false, .. } => &self.contended,
            Role::Contended { fair: true, .. } => &self.contended_fair,
            Role::Permit { .. } | Role::Reader { .. } => &self.shared,
            Role::Writer { .. } => &self.writer,
        }
    }
}

fn between(rng: &mut fastrand::Rng, low: Duration, high: Duration) -> Duration {
    let span = high.saturating_sub(low).as_millis().max(1);
    low + Duration::from_millis(u64::try_from(rng.u128(..span)).unwrap_or(0))
}

/// Sleeps, or returns `false` at once when the soak stops.
async fn nap(ctx: &Ctx, d: Duration) -> bool {
    tokio::select! {
        () = ctx.stop.cancelled() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// One holder: acquire, hold, release (or lose), again, until the stop.
async fn holder(
    ctx: Arc<Ctx>,
    manager: LeaseManager<RedisBackend>,
    options: Arc<Options>,
    slot: usize,
    role: Role,
) {
    let config = &ctx.config;
    let mut rng = fastrand::Rng::with_seed(config.seed ^ slot as u64);
    let mut generation = 0u64;
    let mut first = true;
    let layout = manager.backend().layout().clone();
    let (limit, permits) = (ctx.limit, ctx.permits);
    while !ctx.stop.is_cancelled() {
        if let Role::Writer { .. } = role {
            // A writer comes back every so often, and keeps new readers
            // out while it waits.
            if !nap(
                &ctx,
                between(&mut rng, config.hold_max / 4, config.hold_max / 2),
            )
            .await
            {
                break;
            }
        }
        generation += 1;
        let (name, group, kind, keep) = match role {
            Role::Unique { .. } => {
                let name = format!("ex:{slot}:{generation}");
                (name, None, GroupKind::Exclusive, false)
            }
            Role::Contended { key, .. } => (format!("cx:{key}"), None, GroupKind::Exclusive, true),
            Role::Permit { semaphore } => (
                format!("sem:{semaphore}"),
                Some(format!("sem:{semaphore}")),
                GroupKind::Semaphore(limit),
                true,
            ),
            Role::Reader { rw } | Role::Writer { rw } => (
                format!("rw:{rw}"),
                Some(format!("rw:{rw}")),
                GroupKind::ReadWrite,
                true,
            ),
        };
        let opts = options.of(role);
        let floor_group: Arc<str> = Arc::from(group.clone().unwrap_or_else(|| name.clone()));
        let floor = ctx.checker.floor(&floor_group);
        // Every wait has a bound: the acquisition's own, plus retries'
        // operation timeouts and slack for a loaded machine.
        let bound = opts.wait().unwrap_or_default() + Duration::from_secs(15);
        let acquisition = async {
            match role {
                Role::Unique { .. } | Role::Contended { .. } => manager.acquire(&name, opts).await,
                Role::Permit { .. } => manager.acquire_permit(&name, permits, opts).await,
                Role::Reader { .. } => manager.acquire_read(&name, opts).await,
                Role::Writer { .. } => manager.acquire_write(&name, opts).await,
            }
        };
        let lease = tokio::select! {
            () = ctx.stop.cancelled() => break,
            result = tokio::time::timeout(bound, acquisition) => match result {
                Ok(Ok(lease)) => lease,
                Ok(Err(_)) => {
                    ctx.tally.acquire_failed.fetch_add(1, Ordering::Relaxed);
                    if !nap(&ctx, between(&mut rng, Duration::ZERO, config.ttl / 2)).await {
                        break;
                    }
                    continue;
                }
                Err(_) => {
                    ctx.tally.acquire_hung.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
        };
        let token = lease.token();
        let server_key: Arc<str> = Arc::from(layout.lease(&lease.server_key()));
        let fencing = lease.fencing_token().get();
        let id = ctx.checker.grant(GrantInfo {
            group: floor_group,
            kind,
            keep,
            key: server_key.clone(),
            token: fencing,
            writer: matches!(role, Role::Writer { .. }),
            fired: token.clone(),
            floor,
        });
        ctx.tally.acquired.fetch_add(1, Ordering::Relaxed);
        ctx.tally.held.fetch_add(1, Ordering::Relaxed);
        let hold = match role {
            Role::Writer { .. } => between(&mut rng, config.ttl / 2, config.ttl * 3 / 2),
            Role::Reader { .. } => between(&mut rng, config.hold_min() / 4, config.hold_max / 4),
            // The first holds are long, so that every lease is held at once
            // before the churn thins them.
            _ if first => between(&mut rng, config.hold_max / 2, config.hold_max),
            _ => between(&mut rng, config.hold_min(), config.hold_max),
        };
        first = false;
        let fired = tokio::select! {
            biased;
            () = token.cancelled() => true,
            () = tokio::time::sleep(hold) => false,
            () = ctx.stop.cancelled() => false,
        };
        ctx.tally.held.fetch_sub(1, Ordering::Relaxed);
        ctx.checker.end(id);
        if fired {
            let at = Instant::now();
            let reason = lease.loss_reason().unwrap_or(LossReason::Lost);
            if reason != LossReason::Shutdown {
                lost(&ctx, reason, at, &server_key, fencing).await;
            }
            // The watchdog releases what may be left once the handle goes.
            drop(lease);
            if !nap(&ctx, between(&mut rng, Duration::ZERO, config.ttl)).await {
                break;
            }
        } else {
            let bound = Duration::from_secs(10);
            match tokio::time::timeout(bound, lease.release()).await {
                Ok(Ok(_)) => ctx.tally.released.fetch_add(1, Ordering::Relaxed),
                _ => ctx.tally.release_failed.fetch_add(1, Ordering::Relaxed),
            };
        }
    }
}

/// A token fired: explained by a fault or not, and, for a `Deadline`
/// while the server runs, how much time the server still gave the lease.
async fn lost(ctx: &Ctx, reason: LossReason, at: Instant, key: &str, token: u64) {
    let tally = &ctx.tally;
    match reason {
        LossReason::Deadline => tally.lost_deadline.fetch_add(1, Ordering::Relaxed),
        _ => tally.lost_lost.fetch_add(1, Ordering::Relaxed),
    };
    if ctx.faults.explains(at, ctx.config.explain).is_some() {
        tally.lost_explained.fetch_add(1, Ordering::Relaxed);
    } else {
        tally.lost_unexplained.fetch_add(1, Ordering::Relaxed);
        let mut described = lock(&tally.unexplained);
        if described.len() < DESCRIBED {
            described.push(format!("{key} (token {token}): {reason:?}"));
        }
    }
    if reason != LossReason::Deadline || ctx.faults.paused() {
        return;
    }
    // A bounded number of probes at once: a cut fires every token within
    // a renew interval.
    let Ok(_permit) = ctx.probes.try_acquire() else {
        return;
    };
    let mut side = ctx.side.clone();
    let invocation = ctx.sweep.key(key);
    let read = invocation.invoke_async::<Vec<redis::Value>>(&mut side);
    if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), read).await
        && let Some((value, pttl)) = value_and_pttl(&reply, 0)
    {
        tally.probes.fetch_add(1, Ordering::Relaxed);
        if pttl > 0 && held_token(&value) == Some(token) {
            tally.probe_min_ms.fetch_min(pttl, Ordering::Relaxed);
        } else {
            tally.probe_gone.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn value_and_pttl(reply: &[redis::Value], i: usize) -> Option<(String, i64)> {
    let value = match reply.get(2 * i)? {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let pttl = match reply.get(2 * i + 1)? {
        redis::Value::Int(n) => *n,
        _ => return None,
    };
    Some((value, pttl))
}

/// The fencing token in a lease's value, `<holder hex>:<token>:<label>`.
fn held_token(value: &str) -> Option<u64> {
    value.split(':').nth(1)?.parse().ok()
}

/// Reads every believed lease on the side connection: one believed from
/// before the read until after it must be on the server with its holder's
/// token and time left.
async fn sweep(ctx: &Ctx, side: &mut ConnectionManager, rw_prefixes: &[String]) -> BenchResult {
    let tally = &ctx.tally;
    let snapshot = ctx.checker.snapshot();
    for chunk in snapshot.chunks(SWEEP_CHUNK) {
        let mut invocation = ctx.sweep.prepare_invoke();
        for (_, key, _) in chunk {
            invocation.key(&**key);
        }
        let reply: Vec<redis::Value> =
            tokio::time::timeout(Duration::from_secs(15), invocation.invoke_async(side)).await??;
        for (i, (id, key, token)) in chunk.iter().enumerate() {
            if !ctx.checker.believed(*id) {
                continue;
            }
            let Some((value, pttl)) = value_and_pttl(&reply, i) else {
                continue;
            };
            tally.swept.fetch_add(1, Ordering::Relaxed);
            if pttl > 0 && held_token(&value) == Some(*token) {
                tally.min_pttl_ms.fetch_min(pttl, Ordering::Relaxed);
            } else {
                tally.unheld.fetch_add(1, Ordering::Relaxed);
                let mut described = lock(&tally.unheld_described);
                if described.len() < DESCRIBED {
                    described.push(format!(
                        "{key}: believed with token {token}, the server has {value:?} with PTTL {pttl}"
                    ));
                }
            }
        }
    }
    let rw = redis::Script::new(RW_SOURCE);
    for prefix in rw_prefixes {
        let readers: i64 = tokio::time::timeout(
            Duration::from_secs(15),
            rw.key(format!("{prefix}:write"))
                .key(format!("{prefix}:readers"))
                .arg(format!("{prefix}:read:"))
                .invoke_async(side),
        )
        .await??;
        if readers > 0 {
            tally.rw_server_conflicts.fetch_add(1, Ordering::Relaxed);
        }
    }
    tally.sweeps.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn sweeper(ctx: Arc<Ctx>, mut side: ConnectionManager, rw_prefixes: Vec<String>) {
    while !ctx.stop.is_cancelled() {
        let every = if ctx.faults.near(ctx.config.ttl) {
            ctx.config.sweep_every_faulty
        } else {
            ctx.config.sweep_every
        };
        if !nap(&ctx, every).await {
            break;
        }
        // A sweep cut short (a restart drops the side connection) judges
        // what it read; the next one starts over.
        let _ = sweep(&ctx, &mut side, &rw_prefixes).await;
    }
}

/// One sample of memory: seconds since the start, client RSS, the bytes
/// the client's allocator has handed out and not had back, server
/// `used_memory`, leases held.
#[derive(Clone, Copy)]
struct Sample {
    at: f64,
    rss: u64,
    heap: u64,
    used: u64,
    held: i64,
}

async fn used_memory(side: &mut ConnectionManager) -> Option<u64> {
    let info: String = tokio::time::timeout(
        Duration::from_secs(10),
        redis::cmd("INFO").arg("memory").query_async(side),
    )
    .await
    .ok()?
    .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

async fn sample(ctx: &Ctx, side: &mut ConnectionManager, start: Instant) -> Option<Sample> {
    Some(Sample {
        at: start.elapsed().as_secs_f64(),
        rss: status_bytes("VmRSS")?,
        heap: u64::try_from(ALLOCATOR.allocated()).unwrap_or(u64::MAX),
        used: used_memory(side).await?,
        held: ctx.tally.held.load(Ordering::Relaxed),
    })
}

async fn namespace_keys(side: &mut ConnectionManager) -> BenchResult<u64> {
    let keys: Vec<String> = tokio::time::timeout(
        Duration::from_secs(10),
        redis::cmd("KEYS")
            .arg(format!("{NAMESPACE}:*"))
            .query_async(side),
    )
    .await??;
    Ok(keys.len() as u64)
}

/// Injects the faults in turn until the run's end, finishing the one in
/// progress.
async fn injector(
    ctx: Arc<Ctx>,
    server: Arc<Mutex<RedisServer>>,
    proxy: Arc<Proxy>,
    start: Instant,
    end: Instant,
) -> BenchResult {
    let config = &ctx.config;
    let kinds = [FaultKind::Pause, FaultKind::Restart, FaultKind::Cut];
    for n in 0u32.. {
        let at = start + config.fault_every / 2 + config.fault_every * n;
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let kind = kinds[n as usize % kinds.len()];
        let mut side = ctx.side.clone();
        match kind {
            FaultKind::Pause => {
                ctx.faults.begin(kind);
                let s = Arc::clone(&server);
                tokio::task::spawn_blocking(move || lock(&s).pause()).await??;
                tokio::time::sleep(config.pause).await;
                let s = Arc::clone(&server);
                tokio::task::spawn_blocking(move || lock(&s).resume()).await??;
            }
            FaultKind::Restart => {
                let before = namespace_keys(&mut side).await.unwrap_or(0);
                ctx.faults.begin(kind);
                let s = Arc::clone(&server);
                tokio::task::spawn_blocking(move || lock(&s).restart()).await??;
                // The side connection's first command after the restart
                // may fail on the old connection; it reconnects.
                let mut after = 0;
                for _ in 0..20 {
                    if let Ok(n) = namespace_keys(&mut side).await {
                        after = n;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                lock(&ctx.tally.restart_keys).push((before, after));
            }
            FaultKind::Cut => {
                ctx.faults.begin(kind);
                proxy.set_mode(ProxyMode::Blackhole);
                tokio::time::sleep(config.cut).await;
                proxy.set_mode(ProxyMode::Pass);
            }
        }
        ctx.faults.heal();
    }
    Ok(())
}

/// The samples of the run's second half: a slope over them tells a creep
/// (memory still growing once the run settled) from a step early on
/// (buffers and caches filled by the first faults).
fn second_half(points: &[(f64, f64)]) -> &[(f64, f64)] {
    &points[points.len() / 2..]
}

/// Least-squares slope of `y` over `x`, per hour of `x` in seconds.
fn slope_per_hour(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return f64::NAN;
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    num / den * 3600.0
}

fn main() -> BenchResult {
    let config = Config::from_env();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(run(config));
    runtime.shutdown_timeout(Duration::from_secs(5));
    result
}

async fn run(config: Config) -> BenchResult {
    let server = RedisServer::builder().appendonly(true).start()?;
    let version = common::server_version(&server);
    let proxy = Arc::new(Proxy::start(server.addr()).await?);
    let side_config = ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(2)));
    let side =
        ConnectionManager::new_with_config(redis::Client::open(server.url())?, side_config).await?;
    let server = Arc::new(Mutex::new(server));
    let mut managers = Vec::new();
    for _ in 0..2 {
        let backend = RedisBackend::builder(proxy.url())
            .namespace(NAMESPACE)
            .fence_retention(config.retention)
            .connect()
            .await?;
        managers.push(LeaseManager::new(backend)?);
    }
    let layout = managers[0].backend().layout().clone();
    let rw_prefixes: Vec<String> = (0..RW_LEASES)
        .map(|rw| LeaseKey::new(format!("rw:{rw}")).map(|k| layout.lease(&k)))
        .collect::<Result<_, _>>()?;
    let (roles, target) = roles(config.leases);
    let options = Arc::new(Options::new(&config)?);
    let ctx = Arc::new(Ctx {
        limit: semaphores(config.leases).1,
        permits: PermitLimit::new(semaphores(config.leases).1)?,
        config,
        checker: Checker::default(),
        faults: Faults::default(),
        tally: Tally {
            min_pttl_ms: AtomicI64::new(i64::MAX),
            probe_min_ms: AtomicI64::new(i64::MAX),
            ..Tally::default()
        },
        stop: CancellationToken::new(),
        side: side.clone(),
        sweep: redis::Script::new(SWEEP_SOURCE),
        probes: tokio::sync::Semaphore::new(64),
    });
    let config = &ctx.config;
    let began = Instant::now();
    let mut holders = Vec::with_capacity(roles.len());
    for (slot, role) in roles.iter().enumerate() {
        let manager = managers[slot % managers.len()].clone();
        holders.push(tokio::spawn(holder(
            Arc::clone(&ctx),
            manager,
            Arc::clone(&options),
            slot,
            *role,
        )));
    }
    // The start: every lease held at once (writers aside), or as many as
    // were after a minute.
    let limit = if config.quick { 20 } else { 120 };
    let target = i64::try_from(target)?;
    while ctx.tally.held.load(Ordering::Relaxed) < target
        && began.elapsed() < Duration::from_secs(limit)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_held = began.elapsed();
    let start = Instant::now();
    let mut sampler_side = side.clone();
    let first = sample(&ctx, &mut sampler_side, start)
        .await
        .ok_or("no first memory sample")?;
    let end = start + config.run;
    let sweeper = tokio::spawn(sweeper(Arc::clone(&ctx), side.clone(), rw_prefixes));
    let injector = tokio::spawn(injector(
        Arc::clone(&ctx),
        Arc::clone(&server),
        Arc::clone(&proxy),
        start,
        end,
    ));
    let mut samples = vec![first];
    while Instant::now() < end {
        tokio::time::sleep(config.sample_every.min(end - Instant::now())).await;
        if let Some(s) = sample(&ctx, &mut sampler_side, start).await {
            samples.push(s);
        }
    }
    injector.await??;
    // The end's figures, with every lease still held.
    if let Some(s) = sample(&ctx, &mut sampler_side, start).await {
        samples.push(s);
    }
    let last = *samples.last().ok_or("no samples")?;
    ctx.stop.cancel();
    let stopping = Duration::from_secs(30) + config.hold_max / 4 + config.ttl * 2;
    for task in holders {
        tokio::time::timeout(stopping, task).await??;
    }
    sweeper.await?;
    for manager in &managers {
        tokio::time::timeout(Duration::from_secs(30), manager.shutdown()).await?;
    }
    // Every key goes: leases at their release, counters after the
    // retention, queues and intents after their ttls.
    let released = Instant::now();
    let bound = config.retention + config.ttl * 3 + Duration::from_secs(10);
    let mut keys_left = namespace_keys(&mut sampler_side).await?;
    while keys_left > 0 && released.elapsed() < bound {
        tokio::time::sleep(Duration::from_millis(100)).await;
        keys_left = namespace_keys(&mut sampler_side).await?;
    }
    let keys_gone_after = released.elapsed();

    let t = &ctx.tally;
    let (overlaps, excesses, rw_conflicts, token_order, most_permits, most_readers, writer_holds) = {
        let s = lock(&ctx.checker.0);
        (
            s.overlaps,
            s.excesses,
            s.rw_conflicts,
            s.token_order,
            s.most_permits,
            s.most_readers,
            s.writer_holds,
        )
    };
    // The soak's own record is bounded too, or its growth would pass for
    // the library's in the heap figures: with every holder gone it keeps
    // no belief and no key but the shared ones.
    let (record_beliefs, record_keys) = {
        let s = lock(&ctx.checker.0);
        (s.active.len() as u64, s.keys.len() as u64)
    };
    let record_bound = shared_keys(&roles, ctx.limit) as u64;
    let record_overgrown = record_beliefs > 0 || record_keys > record_bound;
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let min_or_nan = |a: &AtomicI64| {
        let v = a.load(Ordering::Relaxed);
        if v == i64::MAX { f64::NAN } else { v as f64 }
    };
    let rss: Vec<(f64, f64)> = samples.iter().map(|s| (s.at, s.rss as f64)).collect();
    let heap: Vec<(f64, f64)> = samples.iter().map(|s| (s.at, s.heap as f64)).collect();
    let used: Vec<(f64, f64)> = samples.iter().map(|s| (s.at, s.used as f64)).collect();
    let extreme = |v: &[(f64, f64)], max: bool| {
        v.iter()
            .map(|p| p.1)
            .fold(if max { f64::MIN } else { f64::MAX }, |a, b| {
                if max { a.max(b) } else { a.min(b) }
            })
    };
    let held_min = samples.iter().map(|s| s.held).min().unwrap_or(0);
    let restarts = lock(&t.restart_keys).clone();
    let restart_kept = restarts
        .iter()
        .map(|(b, a)| if *b == 0 { 1.0 } else { *a as f64 / *b as f64 })
        .fold(f64::NAN, f64::min);
    let unheld = load(&t.unheld);
    let rw_server = load(&t.rw_server_conflicts);
    let unexplained = load(&t.lost_unexplained);
    let line = Json::new()
        .str("bench", "soak")
        .str("quick", if config.quick { "yes" } else { "no" })
        .int("seed", config.seed)
        .int("leases", config.leases as u64)
        .num("secs", config.run.as_secs_f64())
        .num("ttl_ms", ms(config.ttl))
        .num("fault_every_secs", config.fault_every.as_secs_f64())
        .num("pause_ms", ms(config.pause))
        .num("cut_ms", ms(config.cut))
        .num("explain_ms", ms(config.explain))
        .int("faults_pause", ctx.faults.count(FaultKind::Pause))
        .int("faults_restart", ctx.faults.count(FaultKind::Restart))
        .int("faults_cut", ctx.faults.count(FaultKind::Cut))
        .num("restart_keys_kept_min_ratio", restart_kept)
        .num("first_held_secs", first_held.as_secs_f64())
        .int("held_at_start", u64::try_from(first.held).unwrap_or(0))
        .int("held_at_end", u64::try_from(last.held).unwrap_or(0))
        .int("held_min_sampled", u64::try_from(held_min).unwrap_or(0))
        .int("acquired", load(&t.acquired))
        .int("released", load(&t.released))
        .int("release_failed", load(&t.release_failed))
        .int("acquire_failed", load(&t.acquire_failed))
        .int("acquire_hung", load(&t.acquire_hung))
        .int("lost_explained", load(&t.lost_explained))
        .int("lost_unexplained", unexplained)
        .int("lost_deadline", load(&t.lost_deadline))
        .int("lost_lost", load(&t.lost_lost))
        .int("overlaps", overlaps)
        .int("permit_excesses", excesses)
        .int("permit_limit", u64::from(ctx.limit))
        .int("most_permits", u64::from(most_permits))
        .int("rw_conflicts", rw_conflicts)
        .int("rw_conflicts_server", rw_server)
        .int("most_readers", u64::from(most_readers))
        .int("writer_holds", writer_holds)
        .int("token_order_violations", token_order)
        .int("sweeps", load(&t.sweeps))
        .int("swept", load(&t.swept))
        .int("unheld_while_believed", unheld)
        .num("min_pttl_believed_ms", min_or_nan(&t.min_pttl_ms))
        .int("deadline_probes", load(&t.probes))
        .num("deadline_probe_min_pttl_ms", min_or_nan(&t.probe_min_ms))
        .int("deadline_probe_gone", load(&t.probe_gone))
        .int("rss_start", first.rss)
        .int("rss_end", last.rss)
        .num("rss_min", extreme(&rss, false))
        .num("rss_max", extreme(&rss, true))
        .num("rss_slope_per_hour", slope_per_hour(&rss))
        .num(
            "rss_slope_second_half_per_hour",
            slope_per_hour(second_half(&rss)),
        )
        .int("heap_start", first.heap)
        .int("heap_end", last.heap)
        .num("heap_min", extreme(&heap, false))
        .num("heap_max", extreme(&heap, true))
        .num("heap_slope_per_hour", slope_per_hour(&heap))
        .num(
            "heap_slope_second_half_per_hour",
            slope_per_hour(second_half(&heap)),
        )
        .int("used_memory_start", first.used)
        .int("used_memory_end", last.used)
        .num("used_memory_min", extreme(&used, false))
        .num("used_memory_max", extreme(&used, true))
        .num("used_memory_slope_per_hour", slope_per_hour(&used))
        .num(
            "used_memory_slope_second_half_per_hour",
            slope_per_hour(second_half(&used)),
        )
        .int("samples", samples.len() as u64)
        .int("record_beliefs_at_end", record_beliefs)
        .int("record_keys_at_end", record_keys)
        .int("record_keys_bound", record_bound)
        .int("keys_at_end", keys_left)
        .num("keys_gone_after_secs", keys_gone_after.as_secs_f64())
        .str("redis", &version)
        .str("cpus", &common::cpus_allowed())
        .line();
    println!("{line}");

    let mib = |b: f64| b / (1024.0 * 1024.0);
    eprintln!(
        "soak: {} leases ({} held at the start) for {:.0} s, ttl {} ms; faults: {} pauses of {} ms, {} restarts (keys kept: {:.3} at worst), {} cuts of {} ms",
        config.leases,
        first.held,
        config.run.as_secs_f64(),
        config.ttl.as_millis(),
        ctx.faults.count(FaultKind::Pause),
        config.pause.as_millis(),
        ctx.faults.count(FaultKind::Restart),
        restart_kept,
        ctx.faults.count(FaultKind::Cut),
        config.cut.as_millis(),
    );
    eprintln!(
        "  {} acquisitions, {} releases ({} failed), {} acquisitions failed (waits run out, faults)",
        load(&t.acquired),
        load(&t.released),
        load(&t.release_failed),
        load(&t.acquire_failed),
    );
    eprintln!(
        "  leases lost: {} explained by a fault, {} not ({} Deadline, {} Lost)",
        load(&t.lost_explained),
        unexplained,
        load(&t.lost_deadline),
        load(&t.lost_lost),
    );
    eprintln!(
        "  the soak's record: {overlaps} overlaps, {excesses} permits over the limit (most {most_permits} of {}), {rw_conflicts} writers beside another holder ({writer_holds} writer holds, most readers {most_readers}), {token_order} tokens out of order",
        ctx.limit
    );
    eprintln!(
        "  the server: {} sweeps judged {} leases, {unheld} not held for their believing holder, {rw_server} writers beside a reader; smallest PTTL of a believed lease {:.0} ms; after a Deadline {:.0} ms at least ({} probes, {} found the key gone)",
        load(&t.sweeps),
        load(&t.swept),
        min_or_nan(&t.min_pttl_ms),
        min_or_nan(&t.probe_min_ms),
        load(&t.probes),
        load(&t.probe_gone),
    );
    eprintln!(
        "  client RSS {:.1} MiB at the start, {:.1} at the end ({:.1} to {:.1}, {:+.2} MiB/h, {:+.2} MiB/h over the second half); Redis used_memory {:.1} MiB, {:.1} ({:.1} to {:.1}, {:+.2} MiB/h, {:+.2} over the second half)",
        mib(first.rss as f64),
        mib(last.rss as f64),
        mib(extreme(&rss, false)),
        mib(extreme(&rss, true)),
        mib(slope_per_hour(&rss)),
        mib(slope_per_hour(second_half(&rss))),
        mib(first.used as f64),
        mib(last.used as f64),
        mib(extreme(&used, false)),
        mib(extreme(&used, true)),
        mib(slope_per_hour(&used)),
        mib(slope_per_hour(second_half(&used))),
    );
    eprintln!(
        "  client heap in use {:.1} MiB at the start, {:.1} at the end ({:.1} to {:.1}, {:+.2} MiB/h, {:+.2} MiB/h over the second half)",
        mib(first.heap as f64),
        mib(last.heap as f64),
        mib(extreme(&heap, false)),
        mib(extreme(&heap, true)),
        mib(slope_per_hour(&heap)),
        mib(slope_per_hour(second_half(&heap))),
    );
    // The shape over the run, a point a minute (every sample in quick
    // mode): a step with the faults' storms reads differently from a creep.
    let every = (samples.len() / 60).max(1);
    let shape: Vec<String> = samples
        .iter()
        .step_by(every)
        .map(|s| {
            format!(
                "{:.0}s {:.1}/{:.1}/{:.1}",
                s.at,
                mib(s.rss as f64),
                mib(s.heap as f64),
                mib(s.used as f64)
            )
        })
        .collect();
    eprintln!(
        "  memory over the run (client RSS / heap in use / Redis used_memory, MiB): {}",
        shape.join(", ")
    );
    eprintln!(
        "  keys of the namespace at the end: {keys_left} ({:.1} s after the releases); the soak's own record: {record_beliefs} beliefs and {record_keys} keys left (at most {record_bound}, the shared keys)",
        keys_gone_after.as_secs_f64()
    );
    for what in lock(&ctx.checker.0).described.iter() {
        eprintln!("  violation: {what}");
    }
    for what in lock(&t.unheld_described).iter() {
        eprintln!("  not held while believed: {what}");
    }
    for what in lock(&t.unexplained).iter() {
        eprintln!("  unexplained loss: {what}");
    }
    drop(proxy);
    let violations =
        unexplained + overlaps + excesses + rw_conflicts + rw_server + token_order + unheld;
    if violations > 0 || keys_left > 0 {
        return Err(format!(
            "soak: correctness violation: {unexplained} unexplained losses, {overlaps} overlaps, {excesses} permit excesses, {rw_conflicts}+{rw_server} read-write conflicts, {token_order} tokens out of order, {unheld} leases not held while believed, {keys_left} keys left"
        )
        .into());
    }
    if record_overgrown {
        return Err(format!(
            "soak: its own record grew: {record_beliefs} beliefs and {record_keys} keys left once every holder stopped (at most 0 and {record_bound})"
        )
        .into());
    }
    Ok(())
}
