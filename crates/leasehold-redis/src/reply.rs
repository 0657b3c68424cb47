//! Turning script replies into outcomes, and Redis errors into [`BackendError`]s.
//!
//! Nothing here panics: a reply of a shape the scripts never produce becomes
//! [`BackendError::UnexpectedReply`] with a short description of the shape
//! (never of the contents, which may hold another holder's id).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, Completion, Decision, FencingToken, Grant,
    HandoverOutcome, JobCounts, JobName, JobRecord, LeaseInfo, LeaseKey, ReleaseReport,
    RenewOutcome, RerunReply, RerunRequest, RunInfo, RunRecord, RunState, RwInfo, TickAnswer,
    TickReason, TickReply, TickRequest, TickState, WriteIntent,
};
use redis::{ErrorKind, RedisError, RetryMethod, Value};
use tokio::time::Instant;

/// Why an operation produced no outcome, before it is tied to a lease key.
///
/// One failure of a batched call becomes the error of every request in it.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// No reply within the operation timeout.
    Timeout(Duration),
    /// The client or the server reported an error.
    Redis(Arc<RedisError>),
    /// The reply had a shape the script never produces.
    Unexpected(String),
    /// Fewer replicas than asked for acknowledged the write.
    NotAcknowledged(String),
}

impl Failure {
    /// Classifies a Redis error; `op_timeout` is reported for timeouts.
    pub(crate) fn from_redis(err: RedisError, op_timeout: Duration) -> Self {
        if err.is_timeout() {
            Self::Timeout(op_timeout)
        } else {
            Self::Redis(Arc::new(err))
        }
    }

    /// The [`BackendError`] of operation `op` on `key`.
    pub(crate) fn for_key(&self, op: &'static str, key: &LeaseKey) -> BackendError {
        self.for_name(op, key.as_str())
    }

    /// The [`BackendError`] of operation `op` on what `key` names: a lease
    /// key, or for an operation on no one lease (a scan of every job's
    /// record) the pattern it read.
    pub(crate) fn for_name(&self, op: &'static str, key: &str) -> BackendError {
        let key = key.to_owned();
        match self {
            Self::Timeout(after) => BackendError::Timeout {
                op,
                key,
                after: *after,
            },
            Self::Unexpected(detail) => BackendError::UnexpectedReply {
                op,
                key,
                detail: detail.clone(),
            },
            Self::Redis(err) => redis_error(op, key, err),
            Self::NotAcknowledged(detail) => BackendError::Server {
                op,
                key,
                detail: detail.clone(),
                // Replicas catch up or come back: a later call may succeed.
                transient: true,
            },
        }
    }
}

/// Maps a Redis error by its kind, code and retry method (never its text).
fn redis_error(op: &'static str, key: String, err: &Arc<RedisError>) -> BackendError {
    if err.code() == Some("WRONGTYPE") {
        return BackendError::WrongType { key };
    }
    if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
        return BackendError::Unavailable {
            op,
            key,
            source: err.clone(),
        };
    }
    match err.kind() {
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => BackendError::UnexpectedReply {
            op,
            key,
            detail: err.to_string(),
        },
        ErrorKind::Server(_) | ErrorKind::Extension | ErrorKind::AuthenticationFailed => {
            let code = err.code().unwrap_or("AUTH");
            let detail = match err.detail() {
                Some(detail) => format!("{code} {detail}"),
                None => code.to_owned(),
            };
            BackendError::Server {
                op,
                key,
                detail,
                transient: is_transient(err),
            }
        }
        // Client-side failures (TLS setup, a closed connection, …): the
        // request did not get through.
        _ => BackendError::Unavailable {
            op,
            key,
            source: err.clone(),
        },
    }
}

/// Whether a server error may go away by itself (failover, loading, a busy script).
fn is_transient(err: &RedisError) -> bool {
    // BUSY (a long-running script) and NOREPLICAS (min-replicas-to-write not
    // met) are codes the client library does not classify.
    // CROSSSLOT comes only from a batch across slots sent to a cluster
    // behind one address: the backend batches by slot from then on, so
    // the same requests go through when tried again.
    if matches!(err.code(), Some("BUSY" | "NOREPLICAS" | "CROSSSLOT")) {
        return true;
    }
    !matches!(err.retry_method(), RetryMethod::NoRetry)
}

/// A short description of a reply's shape, for error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Nil => "nil".to_owned(),
        Value::Int(i) => format!("integer {i}"),
        Value::BulkString(b) => format!("a string of {} bytes", b.len()),
        Value::SimpleString(_) | Value::VerbatimString { .. } => "a status string".to_owned(),
        Value::Okay => "OK".to_owned(),
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Map(items) => format!("a map of {} entries", items.len()),
        Value::Set(items) => format!("a set of {} items", items.len()),
        Value::Double(_) => "a double".to_owned(),
        Value::Boolean(b) => format!("boolean {b}"),
        Value::ServerError(e) => format!("an error reply ({})", e.code()),
        _ => "a reply of another RESP type".to_owned(),
    }
}

fn unexpected(expected: &str, got: &Value) -> Failure {
    Failure::Unexpected(format!("expected {expected}, got {}", describe(got)))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// A reply of field-value pairs, as `HELLO` and `SENTINEL MASTER` send
/// them: flat in RESP2, a map in RESP3.
pub(crate) struct Fields<'a>(Vec<(&'a Value, &'a Value)>);

impl<'a> Fields<'a> {
    /// The pairs of `reply`; `None` when it is neither shape.
    pub(crate) fn of(reply: &'a Value) -> Option<Self> {
        match plain(reply) {
            Value::Map(pairs) => Some(Fields(pairs.iter().map(|(k, v)| (k, v)).collect())),
            Value::Array(items) => Some(Fields(
                items
                    .chunks_exact(2)
                    .map(|pair| (&pair[0], &pair[1]))
                    .collect(),
            )),
            _ => None,
        }
    }

    /// The value of field `name`, when it is text.
    pub(crate) fn get(&self, name: &str) -> Option<&'a str> {
        let text = |value: &'a Value| match value {
            Value::VerbatimString { text, .. } => Some(text.as_str()),
            other => bytes(other).and_then(|b| std::str::from_utf8(b).ok()),
        };
        self.0
            .iter()
            .find_map(|&(k, v)| (text(k)? == name).then(|| text(v)).flatten())
    }
}

/// Unwraps RESP3 attributes, which may decorate any reply.
fn plain(value: &Value) -> &Value {
    match value {
        Value::Attribute { data, .. } => plain(data),
        other => other,
    }
}

fn token(value: &Value) -> Result<FencingToken, Failure> {
    bytes(value)
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.parse::<u64>().ok())
        .map(FencingToken)
        .ok_or_else(|| unexpected("a fencing token in decimal", value))
}

/// The ttl left from a PTTL reply: `None` for -1 (no expiry).
fn ttl_left(value: &Value) -> Result<Option<Duration>, Failure> {
    match int(value) {
        Some(ms) if ms >= 0 => Ok(Some(Duration::from_millis(ms.unsigned_abs()))),
        Some(-1) => Ok(None),
        _ => Err(unexpected("a PTTL of -1 or more", value)),
    }
}

/// Reads a stored lease value `<holder hex>:<token>:<label>` as others may
/// see it: the holder id is dropped. A value in another format (written by
/// something other than leasehold) has no token and no label.
pub(crate) fn lease_info(stored: &[u8], ttl_left: Option<Duration>) -> LeaseInfo {
    let mut info = LeaseInfo::default();
    info.ttl_left = ttl_left;
    if let Some((token, label)) = parse_stored(stored) {
        info.fencing_token = Some(token);
        info.label = (!label.is_empty()).then(|| label.to_owned());
    }
    info
}

fn parse_stored(stored: &[u8]) -> Option<(FencingToken, &str)> {
    let text = std::str::from_utf8(stored).ok()?;
    let (holder, rest) = (text.get(..32)?, text.get(32..)?);
    if !holder.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let (token, label) = rest.strip_prefix(':')?.split_once(':')?;
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((FencingToken(token.parse().ok()?), label))
}

/// The reply of `acquire.lua`: `token` or `{0, value, pttl}` (or `{1, token}`,
/// as `read.lua` and `write.lua` grant).
pub(crate) fn acquired(
    request: &AcquireRequest,
    sent_at: Instant,
    reply: &Value,
) -> Result<AcquireOutcome, Failure> {
    const SHAPE: &str = "token, {1, token} or {0, value, pttl}";
    let items = match plain(reply) {
        // acquire.lua's grant: the token alone.
        Value::BulkString(_) => {
            return Ok(AcquireOutcome::Acquired(Grant::new(
                request.key.clone(),
                request.holder,
                token(plain(reply))?,
                request.ttl,
                sent_at,
            )));
        }
        Value::Array(items) => items,
        _ => return Err(unexpected(SHAPE, reply)),
    };
    match (items.first().map(plain).and_then(int), items.as_slice()) {
        (Some(1), [_, token_reply]) => Ok(AcquireOutcome::Acquired(Grant::new(
            request.key.clone(),
            request.holder,
            token(plain(token_reply))?,
            request.ttl,
            sent_at,
        ))),
        (Some(0), [_, value, pttl]) => {
            let stored =
                bytes(plain(value)).ok_or_else(|| unexpected("the holder's value", value))?;
            Ok(AcquireOutcome::Held(lease_info(
                stored,
                ttl_left(plain(pttl))?,
            )))
        }
        _ => Err(unexpected(SHAPE, reply)),
    }
}

/// The reply of `read.lua` or `write.lua` for `request`, whose key is the
/// reader's or writer's key: as [`acquired`], or `{2, label, pttl}` when a
/// waiting writer's intent refuses a reader (it holds nothing, so no token).
pub(crate) fn shared(
    request: &AcquireRequest,
    sent_at: Instant,
    reply: &Value,
) -> Result<AcquireOutcome, Failure> {
    const SHAPE: &str = "{1, token}, {0, value, pttl} or {2, label, pttl}";
    if let Value::Array(items) = plain(reply)
        && let (Some(2), [_, label, pttl]) = (items.first().map(plain).and_then(int), &items[..])
    {
        let label = bytes(plain(label))
            .and_then(|b| std::str::from_utf8(b).ok())
            .ok_or_else(|| unexpected("a waiting writer's label", label))?;
        let mut info = LeaseInfo::default();
        info.label = (!label.is_empty()).then(|| label.to_owned());
        info.ttl_left = ttl_left(plain(pttl))?;
        return Ok(AcquireOutcome::Held(info));
    }
    acquired(request, sent_at, reply).map_err(|_| unexpected(SHAPE, reply))
}

/// What `permit.lua` answered.
#[derive(Debug)]
pub(crate) enum Permitted {
    /// A permit was granted, or all are held.
    Outcome(AcquireOutcome),
    /// Permits are held under this other limit.
    Mismatch(u32),
    /// The semaphore is stored with this larger limit: ask again, sending
    /// the keys of as many permits.
    Check(u32),
}

/// The reply of `permit.lua` to a call that sent `sent` permit keys:
/// `{1, token, index}`, `{0, value, pttl}`, `{-1, held}` or `{-2, held}`.
pub(crate) fn permitted(
    request: &AcquireRequest,
    sent: u32,
    sent_at: Instant,
    reply: &Value,
) -> Result<Permitted, Failure> {
    const SHAPE: &str = "{1, token, index}, {0, value, pttl}, {-1, limit} or {-2, limit}";
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(SHAPE, reply));
    };
    let limit = |value: &Value| {
        bytes(plain(value))
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse::<u32>().ok())
            .filter(|&n| n >= 1)
            .ok_or_else(|| unexpected("a permit limit in decimal", value))
    };
    match (items.first().map(plain).and_then(int), items.as_slice()) {
        (Some(1), [_, token_reply, index]) => {
            let index = int(plain(index))
                .and_then(|i| u32::try_from(i).ok())
                .filter(|&i| i < sent)
                .ok_or_else(|| unexpected("the index of a permit sent", index))?;
            let key = request
                .key
                .permit(index)
                .map_err(|_| unexpected("the index of a permit sent", reply))?;
            Ok(Permitted::Outcome(AcquireOutcome::Acquired(Grant::new(
                key,
                request.holder,
                token(plain(token_reply))?,
                request.ttl,
                sent_at,
            ))))
        }
        (Some(0), [_, value, pttl]) => {
            let stored =
                bytes(plain(value)).ok_or_else(|| unexpected("the holder's value", value))?;
            Ok(Permitted::Outcome(AcquireOutcome::Held(lease_info(
                stored,
                ttl_left(plain(pttl))?,
            ))))
        }
        (Some(-1), [_, held]) => Ok(Permitted::Mismatch(limit(held)?)),
        (Some(-2), [_, held]) => Ok(Permitted::Check(limit(held)?)),
        _ => Err(unexpected(SHAPE, reply)),
    }
}

/// The reply of `renew.lua` for `count` requests: the positions (from 1,
/// ascending) of the leases lost; every other lease was renewed.
pub(crate) fn renewed(count: usize, reply: &Value) -> Result<Vec<RenewOutcome>, Failure> {
    let expected = || format!("the ascending positions (1 to {count}) of the leases lost");
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(&expected(), reply));
    };
    let mut outcomes = vec![RenewOutcome::Renewed; count];
    let mut last = 0;
    for item in items {
        // Past the last one, so at least 1: `i - 1` cannot wrap.
        let position = int(plain(item))
            .and_then(|i| usize::try_from(i).ok())
            .filter(|&i| i > last);
        match position.and_then(|i| Some((i, outcomes.get_mut(i - 1)?))) {
            Some((i, outcome)) => {
                *outcome = RenewOutcome::Lost;
                last = i;
            }
            None => return Err(unexpected(&expected(), item)),
        }
    }
    Ok(outcomes)
}

/// The reply of `release.lua`: 0 (not ours), 1 (released), or 2 (released,
/// and a waiter elsewhere heard the notice).
pub(crate) fn release_report(reply: &Value) -> Result<ReleaseReport, Failure> {
    match int(plain(reply)) {
        Some(2) => Ok(ReleaseReport::Released { heard: true }),
        Some(1) => Ok(ReleaseReport::Released { heard: false }),
        Some(0) => Ok(ReleaseReport::NotHeld),
        _ => Err(unexpected("2, 1 or 0", reply)),
    }
}

/// The reply of `handover.lua`: 0, 1, or `{2, token}` (a grant to `next`).
pub(crate) fn handed_over(
    next: &AcquireRequest,
    sent_at: Instant,
    reply: &Value,
) -> Result<HandoverOutcome, Failure> {
    const SHAPE: &str = "0, 1 or {2, token}";
    match plain(reply) {
        Value::Array(items) => match (items.first().map(plain).and_then(int), items.as_slice()) {
            (Some(2), [_, token_reply]) => Ok(HandoverOutcome::HandedOver(Grant::new(
                next.key.clone(),
                next.holder,
                token(plain(token_reply))?,
                next.ttl,
                sent_at,
            ))),
            _ => Err(unexpected(SHAPE, reply)),
        },
        value => match int(value) {
            Some(1) => Ok(HandoverOutcome::Released),
            Some(0) => Ok(HandoverOutcome::NotHeld),
            _ => Err(unexpected(SHAPE, reply)),
        },
    }
}

/// The reply of `inspect.lua`: `{value, pttl}` or `{nil, -2}`.
pub(crate) fn inspected(reply: &Value) -> Result<Option<LeaseInfo>, Failure> {
    const SHAPE: &str = "{value, pttl} or {nil, -2}";
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(SHAPE, reply));
    };
    let [value, pttl] = items.as_slice() else {
        return Err(unexpected(SHAPE, reply));
    };
    match plain(value) {
        Value::Nil | Value::Boolean(false) => Ok(None),
        value => {
            let stored = bytes(value).ok_or_else(|| unexpected("the holder's value", value))?;
            Ok(Some(lease_info(stored, ttl_left(plain(pttl))?)))
        }
    }
}

/// The reply of `inspect_rw.lua`: `{writer, pttl, intent label, pttl,
/// reader, pttl, ...}`, a missing writer or intent being nil with -2.
pub(crate) fn inspected_rw(reply: &Value) -> Result<RwInfo, Failure> {
    const SHAPE: &str = "{writer, pttl, intent, pttl, reader, pttl, ...}";
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(SHAPE, reply));
    };
    if items.len() < 4 || items.len() % 2 != 0 {
        return Err(unexpected(SHAPE, reply));
    }
    let mut info = RwInfo::default();
    info.writer = inspected(&Value::Array(items[..2].to_vec()))?;
    info.waiting_writer = match plain(&items[2]) {
        Value::Nil | Value::Boolean(false) => None,
        label => {
            let label = bytes(label).ok_or_else(|| unexpected("the intent's label", label))?;
            let mut intent = WriteIntent::default();
            intent.label = (!label.is_empty()).then(|| String::from_utf8_lossy(label).into_owned());
            intent.ttl_left = ttl_left(plain(&items[3]))?;
            Some(intent)
        }
    };
    for pair in items[4..].chunks_exact(2) {
        if let Some(reader) = inspected(&Value::Array(pair.to_vec()))? {
            info.readers.push(reader);
        }
    }
    info.readers.sort_by_key(|r| r.fencing_token);
    Ok(info)
}

/// A decimal number the scripts send: an integer reply, or a string of
/// digits (a tick or a time kept in a record).
fn number(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        other => bytes(other)
            .and_then(|b| std::str::from_utf8(b).ok())
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|s| s.parse().ok()),
    }
}

/// A string the scripts send, as text.
fn text(value: &Value) -> Option<&str> {
    bytes(value).and_then(|b| std::str::from_utf8(b).ok())
}

/// A label kept beside a run: `None` when empty.
fn label(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// The run named by a tick, a token and a label as the job scripts send
/// them: `None` when the token is empty (no run).
fn run_info(
    tick: &Value,
    token_reply: &Value,
    label_reply: &Value,
) -> Result<Option<RunInfo>, Failure> {
    let token_text =
        text(plain(token_reply)).ok_or_else(|| unexpected("a run's token", token_reply))?;
    if token_text.is_empty() {
        return Ok(None);
    }
    let tick = number(plain(tick)).ok_or_else(|| unexpected("a run's tick in decimal", tick))?;
    let label_text =
        text(plain(label_reply)).ok_or_else(|| unexpected("a run's label", label_reply))?;
    Ok(Some(RunInfo::new(
        tick,
        token(plain(token_reply))?,
        label(label_text),
    )))
}

/// The server's clock and the kind of a job script's reply
/// `{now, kind, ...}`, and the rest of it.
fn job_reply<'a>(reply: &'a Value, shape: &str) -> Result<(u64, &'a [Value]), Failure> {
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(shape, reply));
    };
    match items.split_first() {
        Some((now, rest)) => match number(plain(now)) {
            Some(now) => Ok((now, rest)),
            None => Err(unexpected(shape, reply)),
        },
        None => Err(unexpected(shape, reply)),
    }
}

/// The reply of `tick.lua` to `request`, sent at `sent_at`: `{now, kind,
/// ...}` as the script documents it.
pub(crate) fn ticked(
    request: &TickRequest,
    sent_at: Instant,
    reply: &Value,
) -> Result<TickAnswer, Failure> {
    const SHAPE: &str =
        "{now, 'due'|'ahead'|'conflict'|'decided'|'missed'|'overlap'|'granted', ...}";
    let (now, rest) = job_reply(reply, SHAPE)?;
    let Some((kind, rest)) = rest.split_first() else {
        return Err(unexpected(SHAPE, reply));
    };
    let millis = |value: &Value| {
        number(plain(value))
            .map(Duration::from_millis)
            .ok_or_else(|| unexpected("milliseconds", value))
    };
    let tick_reply = match (text(plain(kind)).unwrap_or(""), rest) {
        ("due", [wait]) => TickReply::Due {
            wait: millis(wait)?,
        },
        ("ahead", [ahead]) => TickReply::ClockAhead {
            ahead: millis(ahead)?,
        },
        ("conflict", [fingerprint]) => TickReply::Conflict {
            fingerprint: text(plain(fingerprint))
                .ok_or_else(|| unexpected("the record's fingerprint", fingerprint))?
                .to_owned(),
        },
        ("decided", [tick, state, why, run_tick, run_token, run_label]) => {
            TickReply::Decided(Decision::new(
                number(plain(tick)).ok_or_else(|| unexpected("a decided tick", tick))?,
                text(plain(state))
                    .and_then(TickState::parse)
                    .ok_or_else(|| unexpected("a tick's state", state))?,
                text(plain(why))
                    .and_then(TickReason::parse)
                    .ok_or_else(|| unexpected("a tick's reason", why))?,
                run_info(run_tick, run_token, run_label)?,
            ))
        }
        ("missed", []) => TickReply::Missed,
        ("overlap", [run_tick, run_token, run_label]) => TickReply::Overlap {
            running: run_info(run_tick, run_token, run_label)?
                .ok_or_else(|| unexpected("the running run's token", run_token))?,
        },
        ("granted", [token_reply, why]) => TickReply::Granted {
            grant: Grant::new(
                request.job.run_key(),
                request.run.holder,
                token(plain(token_reply))?,
                request.run.ttl,
                sent_at,
            ),
            reason: text(plain(why))
                .and_then(TickReason::parse)
                .ok_or_else(|| unexpected("a start's reason", why))?,
        },
        _ => return Err(unexpected(SHAPE, reply)),
    };
    Ok(TickAnswer::new(now, tick_reply))
}

/// The reply of `tick_complete.lua`: `{now, 1}`, `{now, 0, tick, token,
/// label}` or `{now, 0}`.
pub(crate) fn completion(reply: &Value) -> Result<Completion, Failure> {
    const SHAPE: &str = "{now, 1}, {now, 0, tick, token, label} or {now, 0}";
    let (now, rest) = job_reply(reply, SHAPE)?;
    match (rest.first().map(plain).and_then(int), rest) {
        (Some(1), [_]) => Ok(Completion::Completed { server_time: now }),
        (Some(0), [_]) => Ok(Completion::Refused { current: None }),
        (Some(0), [_, tick, token_reply, label_reply]) => Ok(Completion::Refused {
            current: run_info(tick, token_reply, label_reply)?,
        }),
        _ => Err(unexpected(SHAPE, reply)),
    }
}

/// The reply of `tick_rerun.lua` to `request`, sent at `sent_at`:
/// `{now, 'settled'}`, `{now, 'held', pttl}`, `{now, 'abandoned', tick}` or
/// `{now, 'granted', tick, token}`.
pub(crate) fn rerun(
    request: &RerunRequest,
    sent_at: Instant,
    reply: &Value,
) -> Result<RerunReply, Failure> {
    const SHAPE: &str = "{now, 'settled'|'held'|'abandoned'|'granted', ...}";
    let (_now, rest) = job_reply(reply, SHAPE)?;
    let Some((kind, rest)) = rest.split_first() else {
        return Err(unexpected(SHAPE, reply));
    };
    let tick_of = |value: &Value| number(plain(value)).ok_or_else(|| unexpected("a tick", value));
    match (text(plain(kind)).unwrap_or(""), rest) {
        ("settled", []) => Ok(RerunReply::Settled),
        ("held", [pttl]) => Ok(RerunReply::StillHeld {
            ttl_left: ttl_left(plain(pttl))?,
        }),
        ("abandoned", [tick]) => Ok(RerunReply::Abandoned {
            tick: tick_of(tick)?,
        }),
        ("granted", [tick, token_reply]) => Ok(RerunReply::Granted {
            tick: tick_of(tick)?,
            grant: Grant::new(
                request.job.run_key(),
                request.run.holder,
                token(plain(token_reply))?,
                request.run.ttl,
                sent_at,
            ),
        }),
        _ => Err(unexpected(SHAPE, reply)),
    }
}

/// The reply of `tick_record.lua` for `job`: `{now, lease, pttl, field,
/// value, ...}`, `None` without fields (no record). A run recorded as
/// running whose lease is gone (or holds another token) is reported
/// abandoned; its ttl left is the lease's while it holds it.
pub(crate) fn job_record(job: &JobName, reply: &Value) -> Result<Option<JobRecord>, Failure> {
    const SHAPE: &str = "{now, lease, pttl, field, value, ...}";
    let (now, rest) = job_reply(reply, SHAPE)?;
    let [lease, pttl, fields @ ..] = rest else {
        return Err(unexpected(SHAPE, reply));
    };
    if fields.is_empty() {
        return Ok(None);
    }
    if fields.len() % 2 != 0 {
        return Err(unexpected("a record's fields and values in pairs", reply));
    }
    let mut map = std::collections::HashMap::with_capacity(fields.len() / 2);
    for pair in fields.chunks_exact(2) {
        let field = text(plain(&pair[0])).ok_or_else(|| unexpected("a field's name", &pair[0]))?;
        let value = text(plain(&pair[1])).ok_or_else(|| unexpected("a field's value", &pair[1]))?;
        map.insert(field, value);
    }
    let missing =
        |field: &str| Failure::Unexpected(format!("the job's record has no valid {field:?}"));
    let get = |field: &'static str| map.get(field).copied().ok_or_else(|| missing(field));
    let num = |field: &'static str| {
        map.get(field)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| missing(field))
    };
    let count = |field: &'static str| {
        map.get(field)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fingerprint = get("fingerprint")?.to_owned();
    let decided_run = match map.get("decided_token").copied() {
        None | Some("") => None,
        Some(token_text) => Some(RunInfo::new(
            num("decided_run_tick")?,
            FencingToken(token_text.parse().map_err(|_| missing("decided_token"))?),
            map.get("decided_label").and_then(|l| label(l)),
        )),
    };
    let decided = Decision::new(
        num("decided")?,
        TickState::parse(get("decided_state")?).ok_or_else(|| missing("decided_state"))?,
        TickReason::parse(get("decided_reason")?).ok_or_else(|| missing("decided_reason"))?,
        decided_run,
    );
    let stored = match plain(lease) {
        Value::Nil | Value::Boolean(false) => None,
        value => Some(bytes(value).ok_or_else(|| unexpected("the run lease's value", value))?),
    };
    let held = stored.and_then(parse_stored).map(|(token, _)| token);
    let run = match map.get("run_token").copied() {
        None | Some("") => None,
        Some(token_text) => {
            let run_token = FencingToken(token_text.parse().map_err(|_| missing("run_token"))?);
            let mut state =
                RunState::parse(get("run_state")?).ok_or_else(|| missing("run_state"))?;
            let holds = held == Some(run_token);
            if state == RunState::Running && !holds {
                state = RunState::Abandoned;
            }
            let ttl = if holds { ttl_left(plain(pttl))? } else { None };
            let ended_at = match map.get("run_ended") {
                Some(v) => Some(v.parse().map_err(|_| missing("run_ended"))?),
                None => None,
            };
            Some(RunRecord::new(
                RunInfo::new(
                    num("run_tick")?,
                    run_token,
                    map.get("run_label").and_then(|l| label(l)),
                ),
                state,
                TickReason::parse(get("run_reason")?).ok_or_else(|| missing("run_reason"))?,
                num("run_started")?,
                ended_at,
                ttl,
            ))
        }
    };
    let mut counts = JobCounts::default();
    counts.started = count("started");
    counts.completed = count("completed");
    counts.missed = count("missed");
    counts.skipped = count("skipped");
    counts.abandoned = count("abandoned");
    counts.reruns = count("reruns");
    Ok(Some(JobRecord::new(
        job.clone(),
        fingerprint,
        decided,
        run,
        counts,
        num("last_seen")?,
        now,
    )))
}

/// The reply of `DEL`: the number of keys deleted.
pub(crate) fn deleted(reply: &Value) -> Result<bool, Failure> {
    match int(plain(reply)) {
        Some(n) if n >= 0 => Ok(n > 0),
        _ => Err(unexpected("the number of deleted keys", reply)),
    }
}

/// What `fenced_write.lua` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FenceAnswer {
    /// `{1, token}`: the fence is at the writer's token.
    Done,
    /// `{0, newer}`: the resource has seen `newer`; nothing written.
    Newer(FencingToken),
    /// `{-1, lease}`: the fence compares the tokens of another lease key.
    OtherLease(String),
}

/// The reply of `fenced_write.lua`: `{1, token}`, `{0, newer}` or
/// `{-1, lease}`.
pub(crate) fn fenced(reply: &Value) -> Result<FenceAnswer, Failure> {
    const SHAPE: &str = "{1, token}, {0, newer token} or {-1, lease key}";
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(SHAPE, reply));
    };
    let [done, detail] = items.as_slice() else {
        return Err(unexpected(SHAPE, reply));
    };
    match int(plain(done)) {
        Some(1) => token(plain(detail)).map(|_| FenceAnswer::Done),
        Some(0) => token(plain(detail)).map(FenceAnswer::Newer),
        Some(-1) => text(plain(detail))
            .map(|lease| FenceAnswer::OtherLease(lease.to_owned()))
            .ok_or_else(|| unexpected("the fence's lease key", detail)),
        _ => Err(unexpected(SHAPE, reply)),
    }
}

/// A fenced resource as `fence_read.lua` read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FenceRead {
    /// The lease key whose tokens the fence compares.
    pub(crate) lease: String,
    /// The fence: the highest token written or sealed.
    pub(crate) token: FencingToken,
    /// The value, absent while the resource is only sealed.
    pub(crate) value: Option<Vec<u8>>,
    /// The resource's time to live, `None` for no expiry.
    pub(crate) ttl_left: Option<Duration>,
}

/// The reply of `fence_read.lua`: `{lease, token, value or nil, pttl}`, or
/// `{}` for no resource.
pub(crate) fn fence_read(reply: &Value) -> Result<Option<FenceRead>, Failure> {
    const SHAPE: &str = "{lease, token, value, pttl} or {}";
    let Value::Array(items) = plain(reply) else {
        return Err(unexpected(SHAPE, reply));
    };
    let [lease, fence, value, pttl] = items.as_slice() else {
        return if items.is_empty() {
            Ok(None)
        } else {
            Err(unexpected(SHAPE, reply))
        };
    };
    let lease = text(plain(lease)).ok_or_else(|| unexpected("the fence's lease key", lease))?;
    let value = match plain(value) {
        Value::Nil | Value::Boolean(false) => None,
        stored => Some(
            bytes(stored)
                .ok_or_else(|| unexpected("the resource's value", stored))?
                .to_vec(),
        ),
    };
    Ok(Some(FenceRead {
        lease: lease.to_owned(),
        token: token(plain(fence))?,
        value,
        ttl_left: ttl_left(plain(pttl))?,
    }))
}

/// The replies of a batch call: an array of `count` entries, each a
/// reply of its own or `{-1, message}`, an error (say, WRONGTYPE) for
/// its lease only.
pub(crate) fn batch(
    count: usize,
    reply: Value,
    op_timeout: Duration,
) -> Result<Vec<Result<Value, Failure>>, Failure> {
    let reply = match reply {
        Value::Attribute { data, .. } => *data,
        other => other,
    };
    match reply {
        Value::Array(items) if items.len() == count => Ok(items
            .into_iter()
            .map(|item| batch_entry(item, op_timeout))
            .collect()),
        Value::Array(items) => Err(Failure::Unexpected(format!(
            "expected an array of {count} replies, got an array of {} items",
            items.len()
        ))),
        _ => Err(Failure::Unexpected(format!(
            "expected an array of {count} replies, got another reply"
        ))),
    }
}

/// One entry of a batch reply: `{-1, message}` is the error reply the
/// script would have answered for this lease alone, rebuilt as the
/// server would have sent it, so that it is told apart by its code as
/// any other.
fn batch_entry(item: Value, op_timeout: Duration) -> Result<Value, Failure> {
    let Value::Array(parts) = &item else {
        return Ok(item);
    };
    let (Some(Value::Int(-1)), Some(Value::BulkString(message)), 2) =
        (parts.first(), parts.get(1), parts.len())
    else {
        return Ok(item);
    };
    // Redis 7 sends the message with the leading '-', Redis 6 without;
    // a line break would end the reply early.
    let message = message.strip_prefix(b"-").unwrap_or(message);
    let mut wire = Vec::with_capacity(message.len() + 3);
    wire.push(b'-');
    wire.extend(
        message
            .iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    wire.extend_from_slice(b"\r\n");
    let err = match redis::parse_redis_value(&wire).and_then(Value::extract_error) {
        Err(err) => err,
        Ok(_) => {
            return Err(Failure::Unexpected(
                "a batch entry's error did not read as an error".to_owned(),
            ));
        }
    };
    Err(Failure::from_redis(err, op_timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::{HolderId, Ttl};

    #[test]
    fn fenced_replies_are_read_and_odd_ones_refused() {
        let pair = |n: i64, s: &str| Value::Array(vec![Value::Int(n), bulk(s)]);
        assert_eq!(fenced(&pair(1, "7")).ok(), Some(FenceAnswer::Done));
        assert_eq!(
            fenced(&pair(0, "18446744073709551615")).ok(),
            Some(FenceAnswer::Newer(FencingToken(u64::MAX)))
        );
        assert_eq!(
            fenced(&pair(-1, "order:{42}")).ok(),
            Some(FenceAnswer::OtherLease("order:{42}".to_owned()))
        );
        for odd in [
            pair(2, "7"),
            pair(0, "x"),
            Value::Array(vec![Value::Int(1)]),
            Value::Int(1),
        ] {
            assert!(fenced(&odd).is_err(), "{odd:?}");
        }
        assert_eq!(fence_read(&Value::Array(vec![])).ok(), Some(None));
        let read = fence_read(&Value::Array(vec![
            bulk("jobs"),
            bulk("9"),
            Value::Nil,
            Value::Int(-1),
        ]));
        assert_eq!(
            read.ok().flatten(),
            Some(FenceRead {
                lease: "jobs".to_owned(),
                token: FencingToken(9),
                value: None,
                ttl_left: None,
            })
        );
        let read = fence_read(&Value::Array(vec![
            bulk("jobs"),
            bulk("9"),
            bulk("v"),
            Value::Int(1500),
        ]));
        assert_eq!(
            read.ok().flatten().map(|r| (r.value, r.ttl_left)),
            Some((Some(b"v".to_vec()), Some(Duration::from_millis(1500))))
        );
        assert!(fence_read(&Value::Array(vec![bulk("jobs"), bulk("9")])).is_err());
    }

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    const HOLDER: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_read_write_lease_is_read_without_its_holders() -> TestResult {
        let reply = Value::Array(vec![
            Value::Nil,
            Value::Int(-2),
            bulk("w"),
            Value::Int(2000),
            bulk(&format!("{HOLDER}:9:b")),
            Value::Int(900),
            bulk(&format!("{HOLDER}:4:")),
            Value::Int(1500),
        ]);
        let info = inspected_rw(&reply).map_err(|f| format!("{f:?}"))?;
        assert_eq!(info.writer, None);
        let intent = info.waiting_writer.ok_or("no intent")?;
        assert_eq!(intent.label.as_deref(), Some("w"));
        assert_eq!(intent.ttl_left, Some(Duration::from_millis(2000)));
        let readers: Vec<_> = info
            .readers
            .iter()
            .map(|r| (r.fencing_token, r.label.clone(), r.ttl_left))
            .collect();
        assert_eq!(
            readers,
            [
                (
                    Some(FencingToken(4)),
                    None,
                    Some(Duration::from_millis(1500))
                ),
                (
                    Some(FencingToken(9)),
                    Some("b".to_owned()),
                    Some(Duration::from_millis(900))
                ),
            ]
        );
        // A reader without its pttl is not a reply the script sends.
        assert!(inspected_rw(&Value::Array(vec![Value::Nil, Value::Int(-2), Value::Nil])).is_err());
        Ok(())
    }

    #[test]
    fn stored_values_are_read_without_the_holder() {
        let info = lease_info(
            format!("{HOLDER}:42:pod-7").as_bytes(),
            Some(Duration::from_millis(900)),
        );
        assert_eq!(info.fencing_token, Some(FencingToken(42)));
        assert_eq!(info.label.as_deref(), Some("pod-7"));
        assert_eq!(info.ttl_left, Some(Duration::from_millis(900)));
        assert!(!format!("{info:?}").contains(HOLDER));

        let with_colons = lease_info(format!("{HOLDER}:7:host:8080").as_bytes(), None);
        assert_eq!(with_colons.label.as_deref(), Some("host:8080"));
        assert_eq!(with_colons.fencing_token, Some(FencingToken(7)));

        let no_label = lease_info(format!("{HOLDER}:7:").as_bytes(), None);
        assert_eq!(
            (no_label.label, no_label.fencing_token),
            (None, Some(FencingToken(7)))
        );

        for foreign in [
            "locked".as_bytes(),
            b"",
            format!("{HOLDER}:x:label").as_bytes(),
            format!("{HOLDER}:7").as_bytes(),
            format!("{HOLDER}:99999999999999999999999:l").as_bytes(),
            format!("{}:7:l", "z".repeat(32)).as_bytes(),
            "ü".repeat(20).as_bytes(),
            &[0xff, 0xfe, 0x00],
        ] {
            let info = lease_info(foreign, None);
            assert_eq!(
                (info.label, info.fencing_token),
                (None, None),
                "{foreign:?}"
            );
        }
    }

    #[test]
    fn acquire_replies() -> TestResult {
        let request = AcquireRequest::new(
            LeaseKey::new("k")?,
            HolderId::generate()?,
            Ttl::parse("1s")?,
        );
        let now = Instant::now();
        // The token alone (acquire.lua), or with a 1 in front (read.lua,
        // write.lua).
        for reply in [
            bulk("1700000000000001"),
            Value::Array(vec![Value::Int(1), bulk("1700000000000001")]),
        ] {
            let ok = acquired(&request, now, &reply);
            assert!(
                matches!(ok, Ok(AcquireOutcome::Acquired(g)) if g.fencing_token == FencingToken(1_700_000_000_000_001)),
                "{reply:?}"
            );
        }
        let held = acquired(
            &request,
            now,
            &Value::Array(vec![
                Value::Int(0),
                bulk(&format!("{HOLDER}:5:")),
                Value::Int(250),
            ]),
        );
        assert!(matches!(held, Ok(AcquireOutcome::Held(ref i))
            if i.fencing_token == Some(FencingToken(5)) && i.ttl_left == Some(Duration::from_millis(250))));
        for bad in [
            Value::Nil,
            Value::Int(1),
            bulk("-3"),
            bulk("twelve"),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), bulk("-3")]),
            Value::Array(vec![Value::Int(1), Value::Int(3)]),
            Value::Array(vec![Value::Int(2), bulk("3")]),
            Value::Array(vec![Value::Int(0), Value::Nil, Value::Int(3)]),
            Value::Array(vec![Value::Int(0), bulk("v"), Value::Int(-2)]),
            Value::Array(vec![Value::Int(0), bulk("v"), bulk("3")]),
        ] {
            assert!(
                matches!(acquired(&request, now, &bad), Err(Failure::Unexpected(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }

    #[test]
    fn renew_release_inspect_replies() {
        assert!(matches!(
            renewed(3, &Value::Array(vec![Value::Int(2)])).as_deref(),
            Ok([
                RenewOutcome::Renewed,
                RenewOutcome::Lost,
                RenewOutcome::Renewed
            ])
        ));
        assert!(matches!(
            renewed(2, &Value::Array(vec![])).as_deref(),
            Ok([RenewOutcome::Renewed, RenewOutcome::Renewed])
        ));
        assert!(matches!(
            renewed(2, &Value::Array(vec![Value::Int(1), Value::Int(2)])).as_deref(),
            Ok([RenewOutcome::Lost, RenewOutcome::Lost])
        ));
        // Out of range, repeated or descending positions, and other shapes.
        for bad in [
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Int(3)]),
            Value::Array(vec![Value::Int(-1)]),
            Value::Array(vec![Value::Int(1), Value::Int(1)]),
            Value::Array(vec![Value::Int(2), Value::Int(1)]),
            Value::Array(vec![Value::Okay]),
            Value::Okay,
        ] {
            assert!(renewed(2, &bad).is_err(), "{bad:?}");
        }

        assert!(matches!(
            release_report(&Value::Int(2)),
            Ok(ReleaseReport::Released { heard: true })
        ));
        assert!(matches!(
            release_report(&Value::Int(1)),
            Ok(ReleaseReport::Released { heard: false })
        ));
        assert!(matches!(
            release_report(&Value::Int(0)),
            Ok(ReleaseReport::NotHeld)
        ));
        assert!(release_report(&Value::Int(3)).is_err());
        assert!(release_report(&bulk("1")).is_err());

        assert!(matches!(
            inspected(&Value::Array(vec![Value::Nil, Value::Int(-2)])),
            Ok(None)
        ));
        let foreign = inspected(&Value::Array(vec![bulk("x"), Value::Int(-1)]));
        assert!(matches!(foreign, Ok(Some(ref i)) if *i == LeaseInfo::default()));
        assert!(inspected(&Value::Array(vec![bulk("x")])).is_err());
        assert!(inspected(&Value::Array(vec![Value::Int(3), Value::Int(5)])).is_err());

        assert!(matches!(deleted(&Value::Int(1)), Ok(true)));
        assert!(matches!(deleted(&Value::Int(0)), Ok(false)));
        assert!(deleted(&Value::Nil).is_err());
    }

    #[test]
    fn descriptions_never_show_contents() {
        let secret = format!("{HOLDER}:1:");
        let Err(Failure::Unexpected(detail)) = release_report(&bulk(&secret)) else {
            panic!("a string is not a release reply");
        };
        assert!(!detail.contains(HOLDER), "{detail}");
    }

    /// Each reply shape is named for what it is (error messages say what
    /// came instead of what was expected), never by its contents.
    #[test]
    fn each_reply_shape_is_described() -> TestResult {
        let shapes = [
            (Value::Nil, "nil"),
            (Value::Int(7), "integer 7"),
            (Value::BulkString(vec![b'x'; 5]), "a string of 5 bytes"),
            (Value::SimpleString("x".into()), "a status string"),
            (
                Value::VerbatimString {
                    format: redis::VerbatimFormat::Text,
                    text: "x".into(),
                },
                "a status string",
            ),
            (Value::Okay, "OK"),
            (Value::Array(vec![Value::Nil; 3]), "an array of 3 items"),
            (
                Value::Map(vec![(Value::Nil, Value::Nil)]),
                "a map of 1 entries",
            ),
            (Value::Set(vec![Value::Nil; 2]), "a set of 2 items"),
            (Value::Double(1.5), "a double"),
            (Value::Boolean(true), "boolean true"),
        ];
        for (value, shown) in shapes {
            assert_eq!(describe(&value), shown, "{value:?}");
        }
        // An error reply inside a reply (a script's pcall, a pipeline's
        // item) is named by its code, never by its message.
        let error = redis::parse_redis_value(b"-WRONGTYPE secret message\r\n")
            .map_err(|e| format!("{e}"))?;
        assert_eq!(describe(&error), "an error reply (WRONGTYPE)");
        // A status reply reads as its text where a string is expected.
        assert_eq!(bytes(&Value::SimpleString("ab".into())), Some(&b"ab"[..]));
        Ok(())
    }

    /// A stored token is plain digits: one with a sign is no token.
    #[test]
    fn a_stored_token_with_a_sign_is_none() {
        assert_eq!(
            lease_info(format!("{HOLDER}:+5:").as_bytes(), None).fencing_token,
            None
        );
        assert_eq!(
            lease_info(format!("{HOLDER}:5:").as_bytes(), None).fencing_token,
            Some(FencingToken(5))
        );
    }

    /// A waiting writer's label is shown when it has one, and `None` when
    /// it is empty (the script sends "" for no label).
    #[test]
    fn a_waiting_writers_label_is_read_from_the_shared_reply() -> TestResult {
        let request = AcquireRequest::new(
            LeaseKey::new("k")?,
            HolderId::generate()?,
            Ttl::parse("1s")?,
        );
        let now = Instant::now();
        let label_of = |label: &str| match shared(
            &request,
            now,
            &Value::Array(vec![Value::Int(2), bulk(label), Value::Int(300)]),
        ) {
            Ok(AcquireOutcome::Held(info)) => Ok(info.label),
            other => Err(format!("{other:?}")),
        };
        assert_eq!(label_of("migration")?, Some("migration".to_owned()));
        assert_eq!(label_of("")?, None);
        Ok(())
    }

    /// A permit's index is one of the keys sent, 0 to `sent - 1`.
    #[test]
    fn a_permit_index_past_the_keys_sent_is_refused() -> TestResult {
        let request = AcquireRequest::new(
            LeaseKey::new("k")?,
            HolderId::generate()?,
            Ttl::parse("1s")?,
        );
        let now = Instant::now();
        let granted = |index: i64| {
            permitted(
                &request,
                3,
                now,
                &Value::Array(vec![Value::Int(1), bulk("17"), Value::Int(index)]),
            )
        };
        assert!(
            matches!(granted(2), Ok(Permitted::Outcome(AcquireOutcome::Acquired(ref g)))
                if g.fencing_token == FencingToken(17)),
            "{:?}",
            granted(2)
        );
        for past in [3, 4, -1] {
            assert!(
                matches!(granted(past), Err(Failure::Unexpected(_))),
                "{past}"
            );
        }
        Ok(())
    }

    #[test]
    fn handover_replies() -> TestResult {
        let next = AcquireRequest::new(
            LeaseKey::new("k")?,
            HolderId::generate()?,
            Ttl::parse("1s")?,
        );
        let now = Instant::now();
        let outcome = |reply: Value| handed_over(&next, now, &reply);
        assert!(matches!(
            outcome(Value::Int(1)),
            Ok(HandoverOutcome::Released)
        ));
        assert!(matches!(
            outcome(Value::Int(0)),
            Ok(HandoverOutcome::NotHeld)
        ));
        assert!(matches!(
            outcome(Value::Array(vec![Value::Int(2), bulk("9")])),
            Ok(HandoverOutcome::HandedOver(ref g)) if g.fencing_token == FencingToken(9)
        ));
        for bad in [
            Value::Int(2),
            Value::Int(-1),
            Value::Array(vec![Value::Int(1), bulk("9")]),
            Value::Array(vec![Value::Int(2)]),
        ] {
            assert!(
                matches!(outcome(bad.clone()), Err(Failure::Unexpected(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }

    /// `inspect_rw.lua` sends the writer's pair, the intent's pair and a
    /// pair per reader: fewer than four items, or an odd count, is not its
    /// reply (and is refused, not indexed past its end).
    #[test]
    fn a_short_or_odd_read_write_reply_is_refused() {
        let pairs = [Value::Nil, Value::Int(-2)];
        for len in [0, 1, 2, 3, 5, 7] {
            let reply = Value::Array(pairs.iter().cycle().take(len).cloned().collect());
            assert!(
                matches!(inspected_rw(&reply), Err(Failure::Unexpected(_))),
                "{len} items"
            );
        }
        let four = Value::Array(pairs.iter().cycle().take(4).cloned().collect());
        assert!(inspected_rw(&four).is_ok());
    }

    /// A number kept in a record is digits alone: no sign, not empty.
    #[test]
    fn a_kept_number_is_digits_alone() {
        assert_eq!(number(&bulk("42")), Some(42));
        assert_eq!(number(&Value::Int(42)), Some(42));
        for bad in ["+5", "", "-5", " 5", "5x"] {
            assert_eq!(number(&bulk(bad)), None, "{bad:?}");
        }
        assert_eq!(number(&Value::Int(-1)), None);
    }

    /// `tick_complete.lua` refuses with the record's current run, or
    /// with none when the record has no run (it ran out, or was removed).
    #[test]
    fn a_refused_completion_names_the_current_run_if_any() {
        assert!(matches!(
            completion(&Value::Array(vec![bulk("1700"), Value::Int(1)])),
            Ok(Completion::Completed { server_time: 1700 })
        ));
        assert!(matches!(
            completion(&Value::Array(vec![bulk("1700"), Value::Int(0)])),
            Ok(Completion::Refused { current: None })
        ));
        let refused = completion(&Value::Array(vec![
            bulk("1700"),
            Value::Int(0),
            bulk("12"),
            bulk("34"),
            bulk(""),
        ]));
        assert!(
            matches!(refused, Ok(Completion::Refused { current: Some(ref run) })
                if run.tick == 12 && run.fencing_token == FencingToken(34)),
            "{refused:?}"
        );
        for bad in [
            Value::Array(vec![bulk("1700"), Value::Int(2)]),
            Value::Array(vec![bulk("1700"), Value::Int(0), bulk("12")]),
            Value::Array(vec![bulk("1700")]),
        ] {
            assert!(completion(&bad).is_err(), "{bad:?}");
        }
    }

    /// `DEL` answers a count of keys: a negative one is no answer of its.
    #[test]
    fn a_negative_delete_count_is_refused() {
        assert!(matches!(deleted(&Value::Int(2)), Ok(true)));
        assert!(matches!(
            deleted(&Value::Int(-1)),
            Err(Failure::Unexpected(_))
        ));
    }

    #[test]
    fn errors_are_classified_by_kind_and_code() -> TestResult {
        let key = LeaseKey::new("k")?;
        let io = |kind| RedisError::from(std::io::Error::new(kind, "x"));
        let after = Duration::from_millis(200);

        assert!(matches!(
            Failure::from_redis(io(std::io::ErrorKind::TimedOut), after).for_key("renew", &key),
            BackendError::Timeout { after: a, .. } if a == after
        ));
        for kind in [
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::BrokenPipe,
        ] {
            let err = Failure::from_redis(io(kind), after).for_key("renew", &key);
            assert!(matches!(err, BackendError::Unavailable { .. }) && err.is_transient());
        }
        let server = |code: &str| {
            Failure::from_redis(
                redis::make_extension_error(code.to_owned(), Some("detail".to_owned())),
                after,
            )
            .for_key("acquire", &key)
        };
        assert!(matches!(
            server("WRONGTYPE"),
            BackendError::WrongType { .. }
        ));
        assert!(matches!(
            server("BUSY"),
            BackendError::Server {
                transient: true,
                ..
            }
        ));
        assert!(
            matches!(server("NOPE"), BackendError::Server { transient: false, ref detail, .. } if detail == "NOPE detail")
        );
        // A reply the client could not parse is an unexpected reply, not
        // a server out of reach.
        let parse = RedisError::from((ErrorKind::Parse, "bad reply"));
        assert!(matches!(
            Failure::from_redis(parse, after).for_key("renew", &key),
            BackendError::UnexpectedReply { .. }
        ));
        Ok(())
    }

    /// A batch reply is an array of exactly one entry per request; an entry
    /// `{-1, message}` is that request's own error reply, read by its code
    /// with or without the leading `-` (Redis 7, Redis 6) and kept whole
    /// when its message holds a line break.
    #[test]
    fn a_batch_reply_has_one_entry_per_request_each_its_own_error() {
        let bulk = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let error = |text: &str| Value::Array(vec![Value::Int(-1), bulk(text)]);
        let limit = Duration::from_secs(1);
        let code = |entry: &Result<Value, Failure>| match entry {
            Err(Failure::Redis(err)) => (
                err.code().map(str::to_owned),
                err.detail().map(str::to_owned),
            ),
            other => panic!("not an error reply: {other:?}"),
        };
        let reply = Value::Array(vec![
            Value::Int(1),
            error("-WRONGTYPE Operation against a key"),
            error("NOPERM no rights"),
            error("ERR two\r\nlines"),
            Value::Array(vec![Value::Int(-1), Value::Int(3)]),
        ]);
        let entries = batch(5, reply, limit).expect("five entries");
        assert!(matches!(entries[0], Ok(Value::Int(1))));
        assert_eq!(
            code(&entries[1]),
            (
                Some("WRONGTYPE".to_owned()),
                Some("Operation against a key".to_owned())
            )
        );
        assert_eq!(code(&entries[2]).0.as_deref(), Some("NOPERM"));
        assert_eq!(
            code(&entries[3]),
            (Some("ERR".to_owned()), Some("two  lines".to_owned()))
        );
        assert!(matches!(entries[4], Ok(Value::Array(_))), "not an error");

        let short = batch(3, Value::Array(vec![Value::Int(1)]), limit);
        assert!(
            matches!(&short, Err(Failure::Unexpected(m)) if m.contains("an array of 1 items")),
            "{short:?}"
        );
        let other = batch(1, Value::Int(1), limit);
        assert!(
            matches!(&other, Err(Failure::Unexpected(m)) if m.contains("another reply")),
            "{other:?}"
        );
        let wrapped = Value::Attribute {
            data: Box::new(Value::Array(vec![Value::Int(0)])),
            attributes: Vec::new(),
        };
        assert!(matches!(
            batch(1, wrapped, limit).as_deref(),
            Ok([Ok(Value::Int(0))])
        ));
    }
}
