//! Recording what lease holders believed, and judging it.
//!
//! Clients of a test record, on the test process's one monotonic clock,
//! every hold (when they asked for a lease, when they got it, when they
//! stopped believing they had it) and every write they sent to a *fenced
//! resource*: a Redis key guarded by [`FENCED_WRITE_SCRIPT`], which accepts a
//! write only if its fencing token is at least the highest it has seen.
//! [`History::check`] then reports, in the manner of a Jepsen checker:
//!
//! - **overlaps**: two holds of one key that both holders believed in at
//!   the same moment, with how long both did;
//! - **token violations**: an acquisition that began after another one of
//!   the same key had completed, yet got a fencing token that is not
//!   greater (or two holds that got the same token);
//! - **stale writes**: writes the fenced resource accepted, in the order it
//!   accepted them, with a token lower than one it had already accepted.
//!
//! ```
//! use leasehold_testkit::{HoldEnd, History};
//! use tokio::time::{Duration, Instant};
//!
//! let history = History::new();
//! let t0 = Instant::now();
//! let a = history.acquired("job", "a", 10, t0, t0);
//! history.ended(a, HoldEnd::Released, t0 + Duration::from_secs(1));
//! let b = history.acquired("job", "b", 11, t0 + Duration::from_secs(2), t0 + Duration::from_secs(2));
//! history.ended(b, HoldEnd::Released, t0 + Duration::from_secs(3));
//! history.resource_accepted("job", "a", 10);
//! history.resource_accepted("job", "b", 11);
//! assert!(history.check().is_clean());
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// A Lua script for a fenced resource: a write is accepted only if its
/// fencing token is at least the highest the resource has accepted.
///
/// - `KEYS[1]`: the highest token accepted so far (a decimal string);
/// - `KEYS[2]`: a list the script appends `"<token>:<holder>"` to for every
///   accepted write, in the order they were accepted (the resource's own
///   history, for [`History::resource_accepted`]);
/// - `ARGV[1]`: the writer's fencing token; `ARGV[2]`: a name for the writer.
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
    /// The lease key.
    pub key: String,
    /// A name for the holder (a client name or a short holder id).
    pub holder: String,
    /// The fencing token the holder got.
    pub token: u64,
    /// When the acquisition that succeeded was sent.
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

/// A fencing token that did not increase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenViolation {
    /// The lease key.
    pub key: String,
    /// The hold whose acquisition completed first.
    pub before: Hold,
    /// A hold requested after `before` was acquired (or one with the same
    /// token), whose token is not greater.
    pub after: Hold,
}

/// A write the fenced resource accepted from a stale holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// The lease key.
    pub key: String,
    /// The stale writer.
    pub holder: String,
    /// Its token.
    pub token: u64,
    /// The higher token the resource had already accepted.
    pub highest_before: u64,
}

/// The verdict on a [`History`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// How many holds were recorded.
    pub holds: usize,
    /// How many writes the fenced resource accepted.
    pub accepted_writes: usize,
    /// How many writes the fenced resource refused.
    pub refused_writes: usize,
    /// Overlapping holds, in the order the later hold began.
    pub overlaps: Vec<Overlap>,
    /// Fencing tokens that did not increase.
    pub token_violations: Vec<TokenViolation>,
    /// Stale writes the resource accepted.
    pub stale_writes: Vec<StaleWrite>,
}

impl Report {
    /// No overlap, no token violation, no stale write.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.overlaps.is_empty() && self.token_violations.is_empty() && self.stale_writes.is_empty()
    }

    /// The longest overlap, if any.
    #[must_use]
    pub fn worst_overlap(&self) -> Option<Duration> {
        self.overlaps.iter().map(|o| o.duration).max()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds, {} writes accepted, {} refused as stale; {} overlaps (worst {:?}), {} token violations, {} stale writes accepted",
            self.holds,
            self.accepted_writes,
            self.refused_writes,
            self.overlaps.len(),
            self.worst_overlap().unwrap_or_default(),
            self.token_violations.len(),
            self.stale_writes.len(),
        )
    }
}

/// A shared, thread-safe record of holds and fenced writes; clones share it.
#[derive(Debug, Clone, Default)]
pub struct History {
    inner: Arc<Mutex<Record>>,
}

#[derive(Debug, Default)]
struct Record {
    holds: Vec<Hold>,
    refused: usize,
    /// Accepted writes per key, in the resource's order.
    accepted: BTreeMap<String, Vec<(u64, String)>>,
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
        let mut record = self.record();
        record.holds.push(Hold {
            key: key.into(),
            holder: holder.into(),
            token,
            requested_at,
            acquired_at,
            ended: None,
        });
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

    /// Records a write the fenced resource refused.
    pub fn resource_refused(&self) {
        self.record().refused += 1;
    }

    /// Records a write the fenced resource accepted, in the order the
    /// resource accepted them (read back from its log, or recorded under a
    /// lock that spans the write).
    pub fn resource_accepted(&self, key: impl Into<String>, holder: impl Into<String>, token: u64) {
        self.record()
            .accepted
            .entry(key.into())
            .or_default()
            .push((token, holder.into()));
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
        for hold in &record.holds {
            by_key.entry(&hold.key).or_default().push(hold);
        }
        let mut report = Report {
            holds: record.holds.len(),
            accepted_writes: record.accepted.values().map(Vec::len).sum(),
            refused_writes: record.refused,
            ..Report::default()
        };
        for (key, mut holds) in by_key {
            holds.sort_by_key(|h| h.acquired_at);
            overlaps(key, &holds, now, &mut report.overlaps);
            token_order(key, &holds, &mut report.token_violations);
        }
        report.overlaps.sort_by_key(|o| o.later.acquired_at);
        for (key, writes) in &record.accepted {
            let mut highest: Option<u64> = None;
            for (token, holder) in writes {
                if let Some(high) = highest.filter(|high| token < high) {
                    report.stale_writes.push(StaleWrite {
                        key: key.clone(),
                        holder: holder.clone(),
                        token: *token,
                        highest_before: high,
                    });
                }
                highest = highest.max(Some(*token));
            }
        }
        report
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
