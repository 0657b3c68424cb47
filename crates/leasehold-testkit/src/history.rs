//! Recording what lease holders believed and wrote, what the server
//! granted, and judging it.
//!
//! Clients of a test record, on the test process's one monotonic clock,
//! every hold (when they asked for a lease, when they got it, when they
//! stopped believing they had it) and every write they *attempted* (with
//! the resource server's clock at the write, and whether the writer's own
//! token had fired). Every attempt goes to two stores on a healthy server,
//! in one transaction: an **unfenced** one, a plain list that keeps every
//! write in the order it arrived, and a **fenced** one, guarded by
//! [`FENCED_WRITE_SCRIPT`], which accepts a write only if its fencing token
//! is at least the highest it has accepted. A witness of the lease server
//! (its MONITOR feed) records the grants and renewals it applied, with its
//! own timestamps. [`History::check`] then reports, in the manner of a
//! Jepsen checker:
//!
//! - **overlaps**: two holds of one key that both holders believed in at
//!   the same moment, with how long both did (for a counting lease, two
//!   holds of one *permit key*);
//! - **excesses**: for a counting lease (a semaphore, recorded with
//!   [`History::acquired_permit`]), the intervals in which more of its
//!   holders believed at once than its limit, declared with
//!   [`History::semaphore`], allows;
//! - **read-write conflicts**: for a read-write lease (holds recorded with
//!   [`History::acquired_share`]), a writer's hold believed in at the same
//!   moment as another writer's or any reader's hold of the same lease;
//!   readers may share;
//! - **token violations**: an acquisition that began after another one of
//!   the same key had completed, yet got a fencing token that is not
//!   greater (or two holds that got the same token); for a semaphore, the
//!   order is the semaphore's, across all its permit keys, since they share
//!   one fencing counter; for a read-write lease, across its readers and
//!   writers;
//! - **grant order**: a new token the lease server granted (as its witness
//!   recorded it, in the server's order) that is not greater than one it
//!   had granted before for the same key, or semaphore: judged from the
//!   server's own record, whatever the holders saw;
//! - **stale writes**: attempts whose token was lower than one the lease
//!   server had already granted when the write reached the resource (or
//!   than one that had reached the resource before it); the verdict comes
//!   from the attempts, the server's grants and the unfenced store's
//!   order, none of which the fenced store shapes. A stale write fails
//!   the run unless it is excused: by a data loss the test declared with
//!   [`History::data_lost`] (a restart that lost the lease, on the terms
//!   the overlap verdict excuses one), or by the check-then-write race
//!   docs/design.md names (the higher token was granted after the writer
//!   last checked its token, and the write reached the resource within
//!   the window declared with [`History::race_window`]).
//!
//! Two more counts are **harness sanity**, not guarantees of the library:
//! stale writes the fenced store accepted after it had seen a higher token
//! (its script refuses them by construction), and writes attempted after
//! the writer's own token fired (the writer checks its token before each
//! write). They fail [`Report::is_clean`] too, as a broken harness would
//! make every other verdict meaningless, but they prove nothing of leasehold.
//!
//! ```
//! use leasehold_testkit::{HoldEnd, History, WriteAttempt};
//! use tokio::time::{Duration, Instant};
//!
//! let history = History::new();
//! let t0 = Instant::now();
//! let a = history.acquired("job", "a", 10, t0, t0);
//! history.ended(a, HoldEnd::Released, t0 + Duration::from_secs(1));
//! let b = history.acquired("job", "b", 11, t0 + Duration::from_secs(2), t0 + Duration::from_secs(2));
//! history.ended(b, HoldEnd::Released, t0 + Duration::from_secs(3));
//! history.granted("job", 10, 1_000, Duration::from_secs(1));
//! history.granted("job", 11, 3_000, Duration::from_secs(1));
//! for (id, holder, token, at_us) in [("a1", "a", 10, 2_000), ("b1", "b", 11, 4_000)] {
//!     history.attempted(WriteAttempt {
//!         id: id.into(), key: "job".into(), holder: holder.into(), token, at_us,
//!         checked_us: at_us - 100, after_fire: false,
//!     });
//! }
//! history.stores("job", vec!["a1".into(), "b1".into()], vec!["a1".into(), "b1".into()]);
//! assert!(history.check().is_clean());
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A Lua script for a fenced resource: a write is accepted only if its
/// fencing token is at least the highest the resource has accepted.
///
/// - `KEYS[1]`: the highest token accepted so far (a decimal string);
/// - `KEYS[2]`: a list the script appends `"<token>:<write>"` to for every
///   accepted write, in the order they were accepted: the store's data,
///   read back for [`History::stores`];
/// - `ARGV[1]`: the writer's fencing token; `ARGV[2]`: a name for the write.
///
/// Returns 1 when the write is accepted, 0 when it is refused as stale.
/// Tokens are compared as numbers; leasehold's tokens stay below 2^53, so
/// Lua's doubles hold them exactly.
pub const FENCED_WRITE_SCRIPT: &str = r"
local highest = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < highest then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1] .. ':' .. ARGV[2])
return 1
";

/// How a hold ended in its holder's view.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HoldEnd {
    /// The holder's token was cancelled (the lease was lost); the text says why.
    Cancelled(String),
    /// The holder released the lease (it stopped believing when it started
    /// the release).
    Released,
}

/// One hold of a lease, as its holder saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The lease key (for a permit, its permit key).
    pub key: String,
    /// The semaphore `key` is a permit of, for a hold recorded with
    /// [`History::acquired_permit`].
    pub semaphore: Option<String>,
    /// A name for the holder (a client name or a short holder id).
    pub holder: String,
    /// The fencing token the holder got.
    pub token: u64,
    /// When the acquisition was requested: no later than the sending of
    /// the attempt whose grant the holder got. (A retry may be answered
    /// with the grant an earlier attempt of the same acquisition took: then
    /// no later than that attempt's sending.) The token order is judged
    /// from it.
    pub requested_at: Instant,
    /// When the holder learnt it held the lease.
    pub acquired_at: Instant,
    /// When the holder stopped believing it held the lease, and how; `None`
    /// while it still does.
    pub ended: Option<(Instant, HoldEnd)>,
}

impl Hold {
    /// When the holder stopped believing, or `now` if it still does.
    fn end_or(&self, now: Instant) -> Instant {
        self.ended.as_ref().map_or(now, |(at, _)| *at)
    }
}

/// A hold's index in a [`History`], returned by [`History::acquired`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HoldId(usize);

/// Which share of a read-write lease a hold is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Share {
    /// A shared holder: readers may hold together.
    Reader,
    /// The exclusive holder: no other writer and no reader beside it.
    Writer,
}

/// Two holders believed they held one key at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The lease key.
    pub key: String,
    /// The hold that began first.
    pub earlier: Hold,
    /// The hold that began while the earlier one was still believed in.
    pub later: Hold,
    /// How long both were believed in: from the later acquisition to the
    /// first of the two ends.
    pub duration: Duration,
}

/// More holders of one semaphore believed at once than its limit allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excess {
    /// The semaphore.
    pub semaphore: String,
    /// Its limit, as declared with [`History::semaphore`] (0 when it never
    /// was: then every hold is an excess).
    pub limit: usize,
    /// The most holders that believed at once during the excess.
    pub most: usize,
    /// The holds believed in when that many were.
    pub holders: Vec<Hold>,
    /// When the count first went above the limit.
    pub from: Instant,
    /// How long it stayed above.
    pub duration: Duration,
}

impl Excess {
    /// How many holders more than the limit believed at once, at most.
    #[must_use]
    pub fn over(&self) -> usize {
        self.most.saturating_sub(self.limit)
    }
}

/// A fencing token that did not increase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenViolation {
    /// The lease key, or for permits their semaphore.
    pub key: String,
    /// The hold whose acquisition completed first.
    pub before: Hold,
    /// A hold requested after `before` was acquired (or one with the same
    /// token), whose token is not greater.
    pub after: Hold,
}

/// The lease server granted a token that is not greater than one it had
/// granted before on the same fencing counter (a key's, or a semaphore's,
/// shared by its permit keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantOrder {
    /// The key, or for permits their semaphore.
    pub counter: String,
    /// The key (or permit key) of the grant.
    pub key: String,
    /// Its token.
    pub token: u64,
    /// When the server granted it (its clock, µs since the Unix epoch).
    pub at_us: u64,
    /// The highest token the server had granted on the counter before.
    pub highest_before: u64,
    /// The key (or permit key) that token was granted on.
    pub highest_key: String,
}

/// One write a holder attempted, as its writer recorded it, whatever
/// either store made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteAttempt {
    /// A name unique in the run, which both stores record.
    pub id: String,
    /// The lease key that guards the write.
    pub key: String,
    /// The writer.
    pub holder: String,
    /// The writer's fencing token.
    pub token: u64,
    /// When the write reached the resource, on the resource server's clock
    /// (its `TIME`, read in the write's own transaction), in µs since the
    /// Unix epoch: the same clock as the lease server's on one host.
    pub at_us: u64,
    /// When the writer last checked that its token had not fired before
    /// it sent the write, on the host's wall clock (the clock of `at_us`),
    /// in µs since the Unix epoch. `at_us - checked_us` is the write's
    /// flight: the window of the check-then-write race.
    pub checked_us: u64,
    /// Whether the writer's own token had fired when it made the attempt.
    pub after_fire: bool,
}

impl WriteAttempt {
    /// From the writer's check of its token to the write reaching the
    /// resource: the window in which a token can fire unnoticed.
    #[must_use]
    pub fn flight(&self) -> Duration {
        Duration::from_micros(self.at_us.saturating_sub(self.checked_us))
    }
}

/// Why a stale write does not fail the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Excuse {
    /// The lease server lost the writer's lease in the data loss declared
    /// with [`History::data_lost`] (its index among the declarations).
    DataLost(usize),
    /// The check-then-write race: the higher token was granted after the
    /// writer last checked its own token, and the write reached the
    /// resource within the race window of that check.
    Race,
}

/// A restart of the lease server that lost data, as a test declared it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DataLoss {
    /// When it began and when it healed, on the server's clock (µs since
    /// the Unix epoch).
    from_us: u64,
    to_us: u64,
    /// How long after it healed a new holder's grant still counts as
    /// caused by it.
    grants_within: Duration,
    /// How long after the later of that grant and the healing the old
    /// holder's write may still reach the resource.
    believed_for: Duration,
}

/// An attempt whose token was already stale when it reached the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// The attempt.
    pub attempt: WriteAttempt,
    /// The highest token the lease server had granted before the write
    /// reached the resource, when higher than the write's.
    pub granted_before: Option<u64>,
    /// The highest token among the writes that reached the resource before
    /// it (the unfenced store's order), when higher than the write's.
    pub stored_before: Option<u64>,
    /// Whether the unfenced store holds the write.
    pub unfenced_accepted: bool,
    /// Whether the fenced store holds the write.
    pub fenced_accepted: bool,
    /// When the server first granted a token above the write's, on its
    /// clock (µs since the Unix epoch), if the record has that grant.
    pub higher_granted_us: Option<u64>,
    /// Why the write does not fail the run; `None` when it does.
    pub excuse: Option<Excuse>,
}

impl StaleWrite {
    /// The fenced store accepted the write although a higher token had
    /// reached it first: fencing failed. (A write that reaches it between
    /// the server's grant of a higher token and the new holder's first
    /// write is one no store can refuse: it has not seen that token yet.)
    #[must_use]
    pub fn fencing_failed(&self) -> bool {
        self.fenced_accepted && self.stored_before.is_some()
    }
}

/// The verdict on the writes: judged from the attempts, the lease server's
/// grants and the unfenced store's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Writes {
    /// How many writes were attempted.
    pub attempted: usize,
    /// How many attempts the fenced store does not hold.
    pub fenced_refused: usize,
    /// Attempts with a token lower than one already granted (or stored).
    pub stale: Vec<StaleWrite>,
    /// Attempts made after the writer's own token had fired.
    pub after_fire: Vec<WriteAttempt>,
    /// Attempts the unfenced store does not hold: each should reach it.
    pub unrecorded: Vec<String>,
    /// Every attempt's flight, in the order attempted.
    pub flights: Vec<Duration>,
}

impl Writes {
    /// The stale writes nothing excuses: each one a failure of the library
    /// (or of the test's declarations).
    #[must_use]
    pub fn stale_unexcused(&self) -> Vec<&StaleWrite> {
        self.stale.iter().filter(|w| w.excuse.is_none()).collect()
    }

    /// How many stale writes a declared data loss excuses.
    #[must_use]
    pub fn stale_after_data_loss(&self) -> usize {
        self.stale
            .iter()
            .filter(|w| matches!(w.excuse, Some(Excuse::DataLost(_))))
            .count()
    }

    /// How many stale writes the check-then-write race excuses.
    #[must_use]
    pub fn stale_raced(&self) -> usize {
        self.stale
            .iter()
            .filter(|w| w.excuse == Some(Excuse::Race))
            .count()
    }

    /// The longest flight (check to arrival) of any attempt: the measured
    /// width of the check-then-write window.
    #[must_use]
    pub fn longest_flight(&self) -> Duration {
        self.flights.iter().copied().max().unwrap_or_default()
    }

    /// The harness is sane: the fenced store refused every stale write
    /// once it had seen a higher token (its script does, by construction),
    /// no write was made after its writer's token fired (the writer checks
    /// first), and every attempt reached the unfenced store. Not a
    /// guarantee of the library: a harness that fails it judges nothing.
    #[must_use]
    pub fn harness_sane(&self) -> bool {
        self.stale_fenced().is_empty() && self.after_fire.is_empty() && self.unrecorded.is_empty()
    }

    /// How many stale writes the unfenced store accepted.
    #[must_use]
    pub fn stale_unfenced(&self) -> usize {
        self.stale.iter().filter(|w| w.unfenced_accepted).count()
    }

    /// The stale writes the fenced store accepted after it had seen a
    /// higher token: each one a failure of fencing.
    #[must_use]
    pub fn stale_fenced(&self) -> Vec<&StaleWrite> {
        self.stale.iter().filter(|w| w.fencing_failed()).collect()
    }

    /// How many stale writes the fenced store accepted before any higher
    /// token had reached it (the new holder had not written yet).
    #[must_use]
    pub fn stale_fenced_unseen(&self) -> usize {
        self.stale
            .iter()
            .filter(|w| w.fenced_accepted && w.stored_before.is_none())
            .count()
    }
}

impl fmt::Display for Writes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes attempted (longest flight from check to resource {:?}); {} stale attempted: {} unexcused, {} after a data loss, {} in the check-then-write race; {} accepted by the unfenced store; harness sanity: {} refused by fencing, stale writes accepted {} by the fenced store after it had seen a higher token ({} before it had), {} after the writer's token fired, {} missing from the unfenced store",
            self.attempted,
            self.longest_flight(),
            self.stale.len(),
            self.stale_unexcused().len(),
            self.stale_after_data_loss(),
            self.stale_raced(),
            self.stale_unfenced(),
            self.fenced_refused,
            self.stale_fenced().len(),
            self.stale_fenced_unseen(),
            self.after_fire.len(),
            self.unrecorded.len(),
        )
    }
}

/// The verdict on a [`History`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// How many holds were recorded.
    pub holds: usize,
    /// Overlapping holds, in the order the later hold began.
    pub overlaps: Vec<Overlap>,
    /// Semaphores' excesses over their limits, in the order they began.
    pub excesses: Vec<Excess>,
    /// Read-write leases' writers believed in beside another holder of
    /// the same lease (a writer, or a reader), in the order the later
    /// hold began; each names the read-write lease as its `key`.
    pub rw_conflicts: Vec<Overlap>,
    /// Fencing tokens that did not increase.
    pub token_violations: Vec<TokenViolation>,
    /// New tokens the lease server granted out of order, in its order.
    pub grant_order: Vec<GrantOrder>,
    /// The writes attempted, and what the two stores made of them.
    pub writes: Writes,
}

impl Report {
    /// No overlap, no excess over a semaphore's limit, no writer beside
    /// another holder of a read-write lease, no token violation, no grant
    /// out of order, no stale write that nothing excuses, and a sane
    /// harness ([`Writes::harness_sane`]).
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.guarantees_hold() && self.writes.harness_sane()
    }

    /// The verdicts that depend on the library: no overlap, no excess, no
    /// writer beside another holder, no token violation, no grant out of
    /// order, no stale write that nothing excuses.
    #[must_use]
    pub fn guarantees_hold(&self) -> bool {
        self.overlaps.is_empty()
            && self.excesses.is_empty()
            && self.rw_conflicts.is_empty()
            && self.token_violations.is_empty()
            && self.grant_order.is_empty()
            && self.writes.stale_unexcused().is_empty()
    }

    /// The longest overlap, if any.
    #[must_use]
    pub fn worst_overlap(&self) -> Option<Duration> {
        self.overlaps.iter().map(|o| o.duration).max()
    }

    /// The worst excess over a semaphore's limit, if any: the most holders
    /// over the limit, then the longest.
    #[must_use]
    pub fn worst_excess(&self) -> Option<&Excess> {
        self.excesses.iter().max_by_key(|e| (e.over(), e.duration))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds; {} overlaps (worst {:?}), ",
            self.holds,
            self.overlaps.len(),
            self.worst_overlap().unwrap_or_default(),
        )?;
        if !self.excesses.is_empty() {
            write!(
                f,
                "{} excesses over a semaphore's limit",
                self.excesses.len()
            )?;
            if let Some(e) = self.worst_excess() {
                write!(
                    f,
                    " (worst: {} holders of {} for {:?})",
                    e.most, e.limit, e.duration
                )?;
            }
            write!(f, ", ")?;
        }
        if !self.rw_conflicts.is_empty() {
            write!(
                f,
                "{} writers beside another holder (worst {:?}), ",
                self.rw_conflicts.len(),
                self.rw_conflicts
                    .iter()
                    .map(|c| c.duration)
                    .max()
                    .unwrap_or_default()
            )?;
        }
        write!(
            f,
            "{} token violations, {} grants out of order; {}",
            self.token_violations.len(),
            self.grant_order.len(),
            self.writes,
        )
    }
}

/// A shared, thread-safe record of holds, write attempts, the stores'
/// contents and the lease server's grants; clones share it.
#[derive(Debug, Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Record>>,
}

#[derive(Debug, Default)]
struct Record {
    holds: Vec<Hold>,
    /// The declared limit of each semaphore.
    limits: HashMap<String, usize>,
    /// For each hold of a read-write lease (by index in `holds`): the
    /// lease, and whether the hold is its writer's.
    shares: HashMap<usize, (String, Share)>,
    attempts: Vec<WriteAttempt>,
    /// The lease server's writes of each lease, in its order.
    server: BTreeMap<String, Vec<ServerWrite>>,
    /// Per key, the ids of the writes the unfenced store holds, in order.
    unfenced: BTreeMap<String, Vec<String>>,
    /// Per key, the ids of the writes the fenced store holds.
    fenced: BTreeMap<String, Vec<String>>,
    /// How many server writes were recorded.
    server_seq: usize,
    /// Data losses the test declared.
    losses: Vec<DataLoss>,
    /// The check-then-write window the test declared.
    race_window: Duration,
    /// The server writes come from several servers' feeds (a failover
    /// deployment): ordered by the clock they share, not by arrival.
    several_feeds: bool,
}

/// When the lease server applied a write, on its clock (µs since the Unix
/// epoch), as closely as a witness can tell: the write counts its ttl from
/// a moment between `earliest_us` (rounded down to its millisecond, as the
/// server counts) and `latest_us`. A plain `u64` is an exact moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerTime {
    /// The earliest moment the write could count its ttl from.
    pub earliest_us: u64,
    /// The latest moment the write could count its ttl from.
    pub latest_us: u64,
}

impl ServerTime {
    /// A write the server applied somewhere between the two moments.
    #[must_use]
    pub fn between(earliest_us: u64, latest_us: u64) -> Self {
        Self {
            earliest_us,
            latest_us,
        }
    }
}

impl From<u64> for ServerTime {
    fn from(at_us: u64) -> Self {
        Self::between(at_us, at_us)
    }
}

/// A write of a lease the lease server applied: a grant (or a same-holder
/// refresh) with its token, or an extension of the lease granted last.
#[derive(Debug, Clone, Copy)]
struct ServerWrite {
    token: Option<u64>,
    /// The earliest moment the write could count from.
    at_us: u64,
    /// The latest: its expiry is no later than this plus `ttl`.
    by_us: u64,
    ttl: Duration,
    /// Its place among all the server's writes recorded, of every key.
    seq: usize,
}

impl History {
    /// An empty history.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn record(&self) -> MutexGuard<'_, Record> {
        // Every update is a single push or field store: a poisoned lock
        // still holds a consistent record.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that `holder` got `key` with `token`: its request was sent at
    /// `requested_at` and the grant reached it at `acquired_at`.
    pub fn acquired(
        &self,
        key: impl Into<String>,
        holder: impl Into<String>,
        token: u64,
        requested_at: Instant,
        acquired_at: Instant,
    ) -> HoldId {
        self.push(Hold {
            key: key.into(),
            semaphore: None,
            holder: holder.into(),
            token,
            requested_at,
            acquired_at,
            ended: None,
        })
    }

    /// Declares that `semaphore` has `limit` permits: at most that many of
    /// its holders may believe at once. Declare the limit the test expects,
    /// not one read from the code under test. A semaphore never declared is
    /// judged against a limit of 0, so a forgotten declaration fails.
    pub fn semaphore(&self, semaphore: impl Into<String>, limit: usize) {
        self.record().limits.insert(semaphore.into(), limit);
    }

    /// Records that `holder` got the permit key `key` of `semaphore` with
    /// `token`: its request was sent at `requested_at` and the grant reached
    /// it at `acquired_at`.
    pub fn acquired_permit(
        &self,
        semaphore: impl Into<String>,
        key: impl Into<String>,
        holder: impl Into<String>,
        token: u64,
        requested_at: Instant,
        acquired_at: Instant,
    ) -> HoldId {
        self.push(Hold {
            key: key.into(),
            semaphore: Some(semaphore.into()),
            holder: holder.into(),
            token,
            requested_at,
            acquired_at,
            ended: None,
        })
    }

    /// Records that `holder` got a `share` of the read-write lease `rw` on
    /// the key `key` (its reader's or writer's key) with `token`: its
    /// request was sent at `requested_at` and the grant reached it at
    /// `acquired_at`. Its token is ordered with those of every share of
    /// `rw`, which share one fencing counter.
    #[allow(clippy::too_many_arguments)]
    pub fn acquired_share(
        &self,
        rw: impl Into<String>,
        share: Share,
        key: impl Into<String>,
        holder: impl Into<String>,
        token: u64,
        requested_at: Instant,
        acquired_at: Instant,
    ) -> HoldId {
        let id = self.push(Hold {
            key: key.into(),
            semaphore: None,
            holder: holder.into(),
            token,
            requested_at,
            acquired_at,
            ended: None,
        });
        self.record().shares.insert(id.0, (rw.into(), share));
        id
    }

    fn push(&self, hold: Hold) -> HoldId {
        let mut record = self.record();
        record.holds.push(hold);
        HoldId(record.holds.len() - 1)
    }

    /// Records that the holder of `hold` stopped believing it held the
    /// lease at `at`. Only the first end counts.
    pub fn ended(&self, hold: HoldId, end: HoldEnd, at: Instant) {
        if let Some(h) = self.record().holds.get_mut(hold.0)
            && h.ended.is_none()
        {
            h.ended = Some((at, end));
        }
    }

    /// Records a write attempt.
    pub fn attempted(&self, attempt: WriteAttempt) {
        self.record().attempts.push(attempt);
    }

    /// Declares that the lease server lost data (a restart without its
    /// keys, a failover to a replica that lacked them) between `from_us`
    /// and `to_us` on its clock (µs since the Unix epoch). A stale write
    /// is excused by it when the writer's token was granted before `to_us`,
    /// a higher token was first granted from `from_us` to `grants_within`
    /// after `to_us`, and the write reached the resource no later than
    /// `believed_for` after the later of that grant and `to_us`: the terms
    /// on which a test excuses an overlap after such a loss, plus the
    /// write's flight. Declare the bounds the test derives, not ones read
    /// from the code under test.
    pub fn data_lost(
        &self,
        from_us: u64,
        to_us: u64,
        grants_within: Duration,
        believed_for: Duration,
    ) {
        self.record().losses.push(DataLoss {
            from_us,
            to_us,
            grants_within,
            believed_for,
        });
    }

    /// Declares the check-then-write window: a stale write whose higher
    /// token was granted after its writer last checked its own token, and
    /// which reached the resource within `window` of that check, is the
    /// race docs/design.md names, not a failure. Zero (the default)
    /// excuses none.
    pub fn race_window(&self, window: Duration) {
        self.record().race_window = window;
    }

    /// Records that the lease server stored `key`'s lease with `token` for
    /// `ttl` at `at` (its clock): a grant, or a refresh by the same holder.
    /// Record them in the server's order.
    pub fn granted(
        &self,
        key: impl Into<String>,
        token: u64,
        at: impl Into<ServerTime>,
        ttl: Duration,
    ) {
        self.server_write(key.into(), Some(token), at.into(), ttl);
    }

    /// Declares that the server writes are recorded from several servers'
    /// feeds (the nodes of a deployment that fails over), read on threads
    /// of their own: one feed can be read later than another, so their
    /// order is the host clock all the servers read (each write at its
    /// earliest moment; one feed's order for writes at the same moment),
    /// not the order they were recorded in. A single server's record keeps
    /// its own order, which survives a clock that steps back.
    pub fn several_feeds(&self) {
        self.record().several_feeds = true;
    }

    fn server_write(&self, key: String, token: Option<u64>, at: ServerTime, ttl: Duration) {
        let mut record = self.record();
        let seq = record.server_seq;
        record.server_seq += 1;
        let several = record.several_feeds;
        let writes = record.server.entry(key).or_default();
        let write = ServerWrite {
            token,
            at_us: at.earliest_us,
            by_us: at.latest_us.max(at.earliest_us),
            ttl,
            seq,
        };
        // In the servers' order: after every write recorded at or before
        // its moment.
        let place = if several {
            writes.partition_point(|w| w.at_us <= write.at_us)
        } else {
            writes.len()
        };
        writes.insert(place, write);
    }

    /// Records that the lease server extended `key`'s lease (the one it
    /// stored last) by `ttl` at `at`.
    pub fn extended(&self, key: impl Into<String>, at: impl Into<ServerTime>, ttl: Duration) {
        self.server_write(key.into(), None, at.into(), ttl);
    }

    /// The earliest moment (server clock, µs since the Unix epoch) the
    /// lease server could expire `key`'s lease with `token`: its last
    /// recorded grant or extension, at the earliest, plus that write's
    /// ttl. The server keeps expiries in whole milliseconds counted from
    /// its clock's millisecond, so the moment is rounded down to one.
    /// `None` when no grant of that token was recorded.
    #[must_use]
    pub fn server_expiry(&self, key: &str, token: u64) -> Option<u64> {
        self.last_write(key, token)
            .map(|w| w.at_us / 1_000 * 1_000 + micros(w.ttl))
    }

    /// The latest moment (server clock, µs since the Unix epoch) the lease
    /// server could keep `key`'s lease with `token`, as far as the recorded
    /// writes go: its last recorded grant or extension, at the latest, plus
    /// that write's ttl. A lease seen on the server after this was written
    /// again by something the record missed. `None` when no grant of that
    /// token was recorded.
    #[must_use]
    pub fn server_expiry_latest(&self, key: &str, token: u64) -> Option<u64> {
        self.last_write(key, token).map(|w| w.by_us + micros(w.ttl))
    }

    /// Whether the lease server recorded a write (a grant or an extension)
    /// of `key`'s lease with `token` from `from_us` to `to_us` (server
    /// clock, µs since the Unix epoch): a write a failover may have lost.
    #[must_use]
    pub fn written_between(&self, key: &str, token: u64, from_us: u64, to_us: u64) -> bool {
        let record = self.record();
        let Some(writes) = record.server.get(key) else {
            return false;
        };
        let mut current = None;
        writes.iter().any(|w| {
            if w.token.is_some() {
                current = w.token;
            }
            current == Some(token) && w.by_us >= from_us && w.at_us <= to_us
        })
    }

    /// The last recorded write of `key`'s lease while it held `token`.
    fn last_write(&self, key: &str, token: u64) -> Option<ServerWrite> {
        let record = self.record();
        let mut current = None;
        let mut last = None;
        for w in record.server.get(key)? {
            if w.token.is_some() {
                current = w.token;
            }
            if current == Some(token) {
                last = Some(*w);
            }
        }
        last
    }

    /// Records what the two stores hold for `key`: the ids of the writes
    /// in the unfenced store, in its order, and those in the fenced store.
    pub fn stores(&self, key: impl Into<String>, unfenced: Vec<String>, fenced: Vec<String>) {
        let key = key.into();
        let mut record = self.record();
        record.unfenced.insert(key.clone(), unfenced);
        record.fenced.insert(key, fenced);
    }

    /// Every hold recorded so far.
    #[must_use]
    pub fn holds(&self) -> Vec<Hold> {
        self.record().holds.clone()
    }

    /// Judges the history; holds not ended yet count as believed in until now.
    #[must_use]
    pub fn check(&self) -> Report {
        self.check_at(Instant::now())
    }

    /// Judges the history as of `now`: holds not ended yet count as
    /// believed in until then.
    #[must_use]
    pub fn check_at(&self, now: Instant) -> Report {
        let record = self.record();
        let mut by_key: HashMap<&str, Vec<&Hold>> = HashMap::new();
        // Tokens are ordered per fencing counter: a semaphore's, shared by
        // its permit keys, or a key's own.
        let mut by_counter: HashMap<&str, Vec<&Hold>> = HashMap::new();
        let mut by_semaphore: HashMap<&str, Vec<&Hold>> = HashMap::new();
        let mut by_rw: HashMap<&str, Vec<(&Hold, Share)>> = HashMap::new();
        for (i, hold) in record.holds.iter().enumerate() {
            by_key.entry(&hold.key).or_default().push(hold);
            let share = record.shares.get(&i);
            let counter = share
                .map(|(rw, _)| rw.as_str())
                .or(hold.semaphore.as_deref())
                .unwrap_or(&hold.key);
            by_counter.entry(counter).or_default().push(hold);
            if let Some(semaphore) = &hold.semaphore {
                by_semaphore.entry(semaphore).or_default().push(hold);
            }
            if let Some((rw, share)) = share {
                by_rw.entry(rw).or_default().push((hold, *share));
            }
        }
        let mut report = Report {
            holds: record.holds.len(),
            writes: writes(&record),
            ..Report::default()
        };
        for (key, mut holds) in by_key {
            holds.sort_by_key(|h| h.acquired_at);
            overlaps(key, &holds, now, &mut report.overlaps);
        }
        for (counter, holds) in by_counter {
            token_order(counter, &holds, &mut report.token_violations);
        }
        for (semaphore, holds) in by_semaphore {
            let limit = record.limits.get(semaphore).copied().unwrap_or(0);
            excesses(semaphore, limit, &holds, now, &mut report.excesses);
        }
        for (rw, mut shares) in by_rw {
            shares.sort_by_key(|(h, _)| h.acquired_at);
            rw_conflicts(rw, &shares, now, &mut report.rw_conflicts);
        }
        report.grant_order = grant_order(&record);
        report.overlaps.sort_by_key(|o| o.later.acquired_at);
        report.rw_conflicts.sort_by_key(|o| o.later.acquired_at);
        report.excesses.sort_by_key(|e| e.from);
        report
    }
}

/// Judges every attempt by the grants before it and the writes that
/// reached the resource before it, then looks it up in both stores.
fn writes(record: &Record) -> Writes {
    let fenced: HashSet<&str> = record
        .fenced
        .values()
        .flatten()
        .map(String::as_str)
        .collect();
    let by_id: HashMap<&str, &WriteAttempt> =
        record.attempts.iter().map(|a| (a.id.as_str(), a)).collect();
    // The highest token stored before each write, in the unfenced store's
    // order (which is the fenced store's: both are written in one
    // transaction).
    let mut stored_before: HashMap<&str, u64> = HashMap::new();
    for ids in record.unfenced.values() {
        let mut highest = None::<u64>;
        for id in ids {
            let Some(a) = by_id.get(id.as_str()) else {
                continue;
            };
            if let Some(high) = highest.filter(|h| *h > a.token) {
                stored_before.insert(id, high);
            }
            highest = highest.max(Some(a.token));
        }
    }
    let unfenced: HashSet<&str> = record
        .unfenced
        .values()
        .flatten()
        .map(String::as_str)
        .collect();
    let mut out = Writes {
        attempted: record.attempts.len(),
        flights: record.attempts.iter().map(WriteAttempt::flight).collect(),
        ..Writes::default()
    };
    for a in &record.attempts {
        let grants = || record.server.get(&a.key).into_iter().flatten();
        let granted_before = grants()
            .filter(|w| w.at_us < a.at_us)
            .filter_map(|w| w.token)
            .filter(|t| *t > a.token)
            .max();
        let stored = stored_before.get(a.id.as_str()).copied();
        if granted_before.is_some() || stored.is_some() {
            // The first grant of a token above the write's, at the
            // earliest moment the server could have made it.
            let higher_granted_us = grants()
                .filter(|w| w.token.is_some_and(|t| t > a.token))
                .map(|w| w.at_us)
                .min();
            let own_granted_us = grants()
                .filter(|w| w.token == Some(a.token))
                .map(|w| w.at_us)
                .min();
            // Without a witness of the grants (a failover campaign), the
            // resource's record stands in: the first write of a higher
            // token that reached it before this one, and the writer's own
            // first write. Each came after its grant, so they place the
            // grants no earlier than they were; the race, which needs the
            // grant itself, is then never excused.
            let first_stored = |pick: &dyn Fn(&WriteAttempt) -> bool| {
                record
                    .attempts
                    .iter()
                    .filter(|w| w.key == a.key && pick(w))
                    .map(|w| w.at_us)
                    .min()
            };
            let lost_grant = higher_granted_us
                .or_else(|| first_stored(&|w| w.token > a.token && w.at_us < a.at_us));
            let own = own_granted_us.or_else(|| first_stored(&|w| w.token == a.token));
            let lost = lost_grant.and_then(|g| {
                record.losses.iter().position(|l| {
                    own.is_some_and(|own| own < l.to_us)
                        && g >= l.from_us
                        && g <= l.to_us + micros(l.grants_within)
                        && a.at_us <= g.max(l.to_us) + micros(l.believed_for)
                })
            });
            let raced = higher_granted_us
                .is_some_and(|g| g > a.checked_us && a.flight() <= record.race_window);
            let excuse = lost.map(Excuse::DataLost).or(raced.then_some(Excuse::Race));
            out.stale.push(StaleWrite {
                attempt: a.clone(),
                granted_before,
                stored_before: stored,
                unfenced_accepted: unfenced.contains(a.id.as_str()),
                fenced_accepted: fenced.contains(a.id.as_str()),
                higher_granted_us,
                excuse,
            });
        }
        if a.after_fire {
            out.after_fire.push(a.clone());
        }
        if !fenced.contains(a.id.as_str()) {
            out.fenced_refused += 1;
        }
        if !unfenced.contains(a.id.as_str()) {
            out.unrecorded.push(a.id.clone());
        }
    }
    out
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Pairs of shares of the read-write lease `rw` (sorted by acquisition)
/// believed in at the same time, one of them a writer's: readers may
/// share, a writer may not. An end at the instant of a start does not
/// overlap it, as in [`overlaps`].
fn rw_conflicts(rw: &str, shares: &[(&Hold, Share)], now: Instant, out: &mut Vec<Overlap>) {
    for (i, (earlier, first)) in shares.iter().enumerate() {
        let earlier_end = earlier.end_or(now);
        for (later, second) in &shares[i + 1..] {
            if later.acquired_at >= earlier_end {
                break; // sorted by start: no later hold starts inside this one
            }
            if *first == Share::Reader && *second == Share::Reader {
                continue;
            }
            let end = earlier_end.min(later.end_or(now));
            out.push(Overlap {
                key: rw.to_owned(),
                earlier: (*earlier).clone(),
                later: (*later).clone(),
                duration: end.saturating_duration_since(later.acquired_at),
            });
        }
    }
}

/// Pairs of holds (sorted by acquisition) believed in at the same time.
fn overlaps(key: &str, holds: &[&Hold], now: Instant, out: &mut Vec<Overlap>) {
    for (i, earlier) in holds.iter().enumerate() {
        let earlier_end = earlier.end_or(now);
        for later in &holds[i + 1..] {
            if later.acquired_at >= earlier_end {
                break; // sorted by start: no later hold starts inside this one
            }
            let end = earlier_end.min(later.end_or(now));
            out.push(Overlap {
                key: key.to_owned(),
                earlier: (*earlier).clone(),
                later: (*later).clone(),
                duration: end.saturating_duration_since(later.acquired_at),
            });
        }
    }
}

/// Every new token the server granted (a grant whose token differs from
/// the one the key held before: a same-holder refresh keeps its token),
/// in the server's order, must exceed every token granted before on the
/// same counter. A permit key counts with the semaphore its holds name.
fn grant_order(record: &Record) -> Vec<GrantOrder> {
    let semaphores: HashMap<&str, &str> = record
        .holds
        .iter()
        .enumerate()
        .filter_map(|(i, h)| {
            let counter = record.shares.get(&i).map(|(rw, _)| rw.as_str());
            Some((h.key.as_str(), counter.or(h.semaphore.as_deref())?))
        })
        .collect();
    let mut writes: Vec<(&str, &ServerWrite)> = record
        .server
        .iter()
        .flat_map(|(key, ws)| ws.iter().map(move |w| (key.as_str(), w)))
        .collect();
    if record.several_feeds {
        writes.sort_by_key(|(_, w)| (w.at_us, w.seq));
    } else {
        writes.sort_by_key(|(_, w)| w.seq);
    }
    let mut current: HashMap<&str, u64> = HashMap::new();
    let mut highest: HashMap<&str, (u64, &str)> = HashMap::new();
    let mut out = Vec::new();
    for (key, w) in writes {
        let Some(token) = w.token else { continue };
        if current.insert(key, token) == Some(token) {
            continue; // a refresh by the same holder
        }
        let counter = semaphores.get(key).copied().unwrap_or(key);
        match highest.get(counter) {
            Some(&(high, high_key)) if high >= token => out.push(GrantOrder {
                counter: counter.to_owned(),
                key: key.to_owned(),
                token,
                at_us: w.at_us,
                highest_before: high,
                highest_key: high_key.to_owned(),
            }),
            _ => {
                highest.insert(counter, (token, key));
            }
        }
    }
    out
}

/// The intervals in which more than `limit` of a semaphore's holds were
/// believed in at once: a sweep over the starts and ends of belief, an end
/// counted before a start at the same instant (as [`overlaps`] does).
fn excesses(semaphore: &str, limit: usize, holds: &[&Hold], now: Instant, out: &mut Vec<Excess>) {
    // (when, 0 for an end and 1 for a start, which hold); a hold believed
    // for no time at all is never counted.
    let mut events: Vec<(Instant, u8, usize)> = Vec::new();
    for (i, h) in holds.iter().enumerate() {
        let end = h.end_or(now);
        if end > h.acquired_at {
            events.push((h.acquired_at, 1, i));
            events.push((end, 0, i));
        }
    }
    events.sort_unstable();
    let mut live: Vec<usize> = Vec::new();
    let mut open: Option<Excess> = None;
    for (at, kind, i) in events {
        if kind == 0 {
            live.retain(|j| *j != i);
        } else {
            live.push(i);
        }
        let believed = || live.iter().map(|j| holds[*j].clone()).collect();
        if live.len() > limit {
            match &mut open {
                Some(e) if live.len() > e.most => {
                    e.most = live.len();
                    e.holders = believed();
                }
                Some(_) => {}
                None => {
                    open = Some(Excess {
                        semaphore: semaphore.to_owned(),
                        limit,
                        most: live.len(),
                        holders: believed(),
                        from: at,
                        duration: Duration::ZERO,
                    });
                }
            }
        } else if let Some(mut e) = open.take() {
            e.duration = at.saturating_duration_since(e.from);
            out.push(e);
        }
    }
}

/// An acquisition requested after another completed must get a greater
/// token; no two acquisitions may share one.
fn token_order(key: &str, holds: &[&Hold], out: &mut Vec<TokenViolation>) {
    for before in holds {
        for after in holds {
            if std::ptr::eq(*before, *after) {
                continue;
            }
            let causal = after.requested_at > before.acquired_at && after.token <= before.token;
            // Count a shared token once, from the earlier acquisition.
            let shared = after.token == before.token && after.acquired_at >= before.acquired_at;
            if causal || (shared && after.requested_at <= before.acquired_at) {
                out.push(TokenViolation {
                    key: key.to_owned(),
                    before: (*before).clone(),
                    after: (*after).clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A share of `rw` believed from `from` to `to` ms after `t0`.
    fn share(h: &History, t0: Instant, share: Share, holder: &str, token: u64, from: u64, to: u64) {
        let key = match share {
            Share::Writer => "{rw}:write".to_owned(),
            Share::Reader => format!("{{rw}}:read:{holder}"),
        };
        let at = t0 + Duration::from_millis(from);
        let id = h.acquired_share("rw", share, key, holder, token, at, at);
        h.ended(id, HoldEnd::Released, t0 + Duration::from_millis(to));
    }

    #[test]
    fn readers_share_and_a_writer_after_them_is_clean() {
        let (h, t0) = (History::new(), Instant::now());
        share(&h, t0, Share::Reader, "a", 1, 0, 100);
        share(&h, t0, Share::Reader, "b", 2, 50, 150);
        // Starts at the instant the last reader ends: no overlap.
        share(&h, t0, Share::Writer, "w", 3, 150, 200);
        share(&h, t0, Share::Reader, "c", 4, 200, 300);
        let report = h.check_at(t0 + Duration::from_secs(1));
        assert!(report.is_clean(), "{report}");
    }

    #[test]
    fn a_writer_beside_a_reader_or_a_writer_is_a_conflict_with_its_duration() {
        let (h, t0) = (History::new(), Instant::now());
        share(&h, t0, Share::Reader, "a", 1, 0, 100);
        share(&h, t0, Share::Writer, "w", 2, 60, 200);
        share(&h, t0, Share::Writer, "v", 3, 180, 300);
        let report = h.check_at(t0 + Duration::from_secs(1));
        let seen: Vec<_> = report
            .rw_conflicts
            .iter()
            .map(|c| {
                (
                    c.key.as_str(),
                    c.earlier.holder.as_str(),
                    c.later.holder.as_str(),
                    c.duration,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("rw", "a", "w", Duration::from_millis(40)),
                ("rw", "w", "v", Duration::from_millis(20)),
            ]
        );
        assert!(!report.is_clean());
        // The two writers share the writer key: an overlap of it as well.
        assert_eq!(report.overlaps.len(), 1, "{report}");
    }

    /// A write by `holder` with `token` on "k" that reached the resource
    /// at `at_us`, its token checked `flight_us` before.
    fn write(h: &History, id: &str, token: u64, at_us: u64, flight_us: u64) {
        h.attempted(WriteAttempt {
            id: id.into(),
            key: "k".into(),
            holder: id.into(),
            token,
            at_us,
            checked_us: at_us - flight_us,
            after_fire: false,
        });
    }

    /// 10 granted at 0, 12 granted at 500 ms; one write of 10 at
    /// `at_us`, its token checked `flight_us` before.
    fn stale_write(at_us: u64, flight_us: u64) -> History {
        let h = History::new();
        h.granted("k", 10, 0, Duration::from_secs(1));
        h.granted("k", 12, 500_000, Duration::from_secs(1));
        write(&h, "a", 10, at_us, flight_us);
        h.stores("k", vec!["a".into()], vec!["a".into()]);
        h
    }

    #[test]
    fn a_stale_write_nothing_excuses_fails_the_run() {
        let report = stale_write(520_000, 1_000).check();
        assert_eq!(report.writes.stale_unexcused().len(), 1, "{report}");
        assert!(report.writes.harness_sane(), "{report}");
        assert!(!report.guarantees_hold());
        assert!(!report.is_clean());
    }

    #[test]
    fn the_race_excuses_only_a_write_checked_before_the_grant_and_within_the_window() {
        // Checked at 499 ms, before 12's grant, arriving 21 ms later.
        let h = stale_write(520_000, 21_000);
        h.race_window(Duration::from_millis(21));
        assert_eq!(h.check().writes.stale_raced(), 1);
        assert!(h.check().is_clean(), "{}", h.check());
        // The same flight beyond the window: a failure.
        h.race_window(Duration::from_millis(20));
        assert!(!h.check().is_clean());
        // Checked after 12 was granted: no race, whatever the window.
        let h = stale_write(520_000, 19_000);
        h.race_window(Duration::from_secs(1));
        assert!(!h.check().is_clean(), "{}", h.check());
    }

    #[test]
    fn a_data_loss_excuses_a_stale_write_only_on_its_terms() {
        let excused = |from_us, to_us, at_us| {
            let h = stale_write(at_us, 1_000);
            h.data_lost(
                from_us,
                to_us,
                Duration::from_millis(100),
                Duration::from_millis(50),
            );
            h.check().writes.stale_after_data_loss() == 1 && h.check().is_clean()
        };
        assert!(excused(450_000, 480_000, 530_000));
        // The write came more than 50 ms after the new grant.
        assert!(!excused(450_000, 480_000, 551_000));
        // The new grant came more than 100 ms after the loss healed.
        assert!(!excused(350_000, 380_000, 530_000));
        // The new grant came before the loss began.
        assert!(!excused(510_000, 515_000, 530_000));
        // The writer's own token was granted after the loss healed.
        let h = History::new();
        h.granted("k", 10, 490_000, Duration::from_secs(1));
        h.granted("k", 12, 500_000, Duration::from_secs(1));
        write(&h, "a", 10, 520_000, 1_000);
        h.stores("k", vec!["a".into()], vec!["a".into()]);
        h.data_lost(
            450_000,
            480_000,
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        assert!(!h.check().is_clean());
    }

    #[test]
    fn tokens_are_ordered_across_readers_and_writers_of_one_lease() {
        let (h, t0) = (History::new(), Instant::now());
        share(&h, t0, Share::Writer, "w", 5, 0, 100);
        // Requested after the writer's grant, with a lower token.
        share(&h, t0, Share::Reader, "a", 4, 150, 200);
        let report = h.check_at(t0 + Duration::from_secs(1));
        assert_eq!(report.token_violations.len(), 1, "{report}");
        assert_eq!(report.token_violations[0].key, "rw");
    }

    #[test]
    fn grants_from_several_feeds_are_ordered_by_the_servers_clock() {
        // The old master's grant (token 10, at 1 000 µs) is read after the
        // new master's (token 20, at 2 000 µs): in arrival order it would
        // be a token below one granted before.
        let late_feed = |several: bool| {
            let h = History::new();
            if several {
                h.several_feeds();
            }
            h.granted("k", 20, 2_000, Duration::from_secs(1));
            h.granted("k", 10, 1_000, Duration::from_secs(1));
            h.check().grant_order
        };
        assert_eq!(late_feed(false).len(), 1, "one server: its own order");
        assert_eq!(late_feed(true), [], "several: the clock's order");
        // A token really granted below one before it is still found.
        let h = History::new();
        h.several_feeds();
        h.granted("k", 20, 1_000, Duration::from_secs(1));
        h.granted("k", 10, 2_000, Duration::from_secs(1));
        let order = h.check().grant_order;
        assert_eq!(
            order
                .iter()
                .map(|o| (o.token, o.highest_before))
                .collect::<Vec<_>>(),
            [(10, 20)]
        );
        // The latest expiry follows the clock's order too.
        let h = History::new();
        h.several_feeds();
        h.granted("k", 10, 1_000, Duration::from_secs(1));
        h.extended("k", 3_000, Duration::from_secs(1));
        h.extended("k", 2_000, Duration::from_secs(1));
        assert_eq!(h.server_expiry_latest("k", 10), Some(1_003_000));
    }
}
