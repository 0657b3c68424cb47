//! Fair mode on Redis: the replies of `scripts/fair.lua`.
//!
//! The queue of a lease with prefix `P` (see [`KeyLayout`](crate::KeyLayout))
//! is two sorted sets in the lease's hash slot:
//!
//! | key             | holds                                                            |
//! |-----------------|------------------------------------------------------------------|
//! | `P:fair`        | the waiters' holder ids, scored by arrival (server microseconds) |
//! | `P:fair-places` | the same ids, scored by when each place expires (server milliseconds) |
//! | `P:fair-asks`   | a hash: id → `<call ms>:<handover ms>:<process>:<label>`, for waiters that asked for a handover |
//!
//! All three expire with the last place in them. One script call prunes
//! the expired places, takes or refreshes the caller's, and grants the
//! lease only when it is free and the caller's place is first; see
//! `fair.lua`. A lease taken in fair mode is released by
//! `release_fair.lua`, which hands it to the head in the same script when
//! the head asked for it: kept until the server time of the head's latest
//! call plus its handover ms, and announced on the release channel as
//! `<holder hex>:<token>`, which the head's process reads (`notices.rs`).

use leasehold_core::{AcquireOutcome, AcquireRequest, FairOutcome, FairPlace};
use redis::Value;
use tokio::time::Instant;

use crate::reply::{self, Failure};

/// The reply of `fair.lua` for `request`, sent at `sent_at`:
/// `{1, token, queued}`, `{0, value, pttl, ahead, queued}` or
/// `{2, ahead, queued}`.
pub(crate) fn outcome(
    request: &AcquireRequest,
    sent_at: Instant,
    value: &Value,
) -> Result<FairOutcome, Failure> {
    let unexpected = || {
        Failure::Unexpected(format!(
            "expected {{1, token, queued}}, {{0, value, pttl, ahead, queued}} or {{2, ahead, queued}}, got {value:?}"
        ))
    };
    let Value::Array(items) = value else {
        return Err(unexpected());
    };
    let count = |v: &Value| match v {
        Value::Int(n) => u32::try_from(*n).ok(),
        _ => None,
    };
    match items.as_slice() {
        [Value::Int(1), token, queued] => {
            let queued = count(queued).ok_or_else(unexpected)?;
            let granted = Value::Array(vec![Value::Int(1), token.clone()]);
            match reply::acquired(request, sent_at, &granted)? {
                AcquireOutcome::Acquired(grant) => Ok(FairOutcome::Acquired { grant, queued }),
                AcquireOutcome::Held(_) => Err(unexpected()),
            }
        }
        [Value::Int(0), stored, pttl, ahead, queued] => {
            let held = Value::Array(vec![Value::Int(0), stored.clone(), pttl.clone()]);
            let AcquireOutcome::Held(holder) = reply::acquired(request, sent_at, &held)? else {
                return Err(unexpected());
            };
            let mut place = FairPlace::default();
            place.ahead = count(ahead).ok_or_else(unexpected)?;
            place.queued = count(queued).ok_or_else(unexpected)?;
            place.holder = Some(holder);
            Ok(FairOutcome::Waiting(place))
        }
        [Value::Int(2), ahead, queued] => {
            let mut place = FairPlace::default();
            place.ahead = count(ahead).ok_or_else(unexpected)?;
            place.queued = count(queued).ok_or_else(unexpected)?;
            Ok(FairOutcome::Waiting(place))
        }
        _ => Err(unexpected()),
    }
}
