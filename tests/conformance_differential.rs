//! `MemoryBackend` against a real server: random sequences of operations
//! (acquire with and without a minimum hold or a lock-delay, renew, renew_many, release,
//! release_to, inspect, permits, read and write holds, a withdrawn intent,
//! fair-queue places, leaving and releasing) by a few holders on a few keys
//! run on a fresh `MemoryBackend` and on `RedisBackend` side by side, and
//! every outcome must match kind for kind: the key granted, Held with the
//! holder's label and time left, Renewed/Lost, Released/NotHeld, what
//! inspect shows, which error.
//!
//! Fencing tokens are compared by order within their counter (the first,
//! second, ... distinct token a counter gave in the run), since the memory
//! backend counts from 1 and the server from a floor taken from its clock.
//! Times left are compared to within a second. The ttls (30-90 s) are far
//! above a run's length, so nothing expires within one and timing does not
//! matter. The memory backend is the oracle of every paused-clock test:
//! this is what ties it to the server's scripts.
//!
//! A second arm lets time pass ([`Scale::TIMED`]): every duration is a
//! whole number of 150 ms units plus half a unit (ttls, the minimum hold,
//! the lock-delay), and an operation may wait one to three units. Each
//! operation then runs a whole number of units (plus the few milliseconds
//! the operations take) after the case began, and every expiry falls half
//! a unit away from it: leases, permits, readers, minimum holds and
//! lock-delays expire within runs, on both backends at the same step.

// The operation strategy (one `prop_oneof!` of thirteen arms) is a deep
// type; clippy walks it past the default limit.
#![recursion_limit = "256"]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, FairBackend, FairOutcome, HandoverBackend,
    HandoverOutcome, HolderId, LeaseBackend, PermitBackend, ReadWriteBackend, RenewOutcome,
    RenewRequest,
};
use leasehold::redis::RedisBackend;
use leasehold::{
    LeaseInfo, LeaseKey, LockDelay, MemoryBackend, PermitLimit, PlaceTtl, ReleaseOutcome, Ttl,
};
use leasehold_testkit::RedisServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const HOLDERS: usize = 3;
/// Plain leases 0 and 1, taken by `try_acquire` (a minimum hold on 0
/// only) and handed over by `release_to`; lease 2 is taken through its
/// fair queue only. Mixed, the backends diverge (see the ignored tests at
/// the end); renewals, releases and inspects reach all three.
const KEYS: usize = 3;
const FAIR: usize = 2;
const TTLS: [u64; 3] = [30, 60, 90];

/// The durations of one arm, in units of `unit`.
#[derive(Debug, Clone, Copy)]
struct Scale {
    unit: Duration,
    /// The ttl choices, in units.
    ttls: [u64; 3],
    /// How many units apart two holders' ttls are.
    holder_step: u64,
    /// Whether every duration has half a unit added.
    half: bool,
    /// The minimum hold some acquisitions carry, in units: above every ttl.
    minimum_hold: u64,
    /// The lock-delay some acquisitions and renewals carry, in units.
    lock_delay: u64,
    /// How far apart two times left may be.
    tolerance: Duration,
    /// Whether operations may wait.
    waits: bool,
}

impl Scale {
    /// Nothing expires within a run.
    const UNTIMED: Self = Self {
        unit: Duration::from_secs(1),
        ttls: TTLS,
        holder_step: 1,
        half: false,
        minimum_hold: 120,
        lock_delay: 5,
        tolerance: Duration::from_secs(1),
        waits: false,
    };
    /// Things expire within a run, half a unit away from any operation.
    const TIMED: Self = Self {
        unit: Duration::from_millis(150),
        ttls: [1, 2, 3],
        holder_step: 4,
        half: true,
        minimum_hold: 12,
        lock_delay: 2,
        tolerance: Duration::from_millis(60),
        waits: true,
    };

    fn of(&self, units: u64) -> Duration {
        let whole = self.unit * u32::try_from(units).expect("few units");
        if self.half {
            whole + self.unit / 2
        } else {
            whole
        }
    }

    fn minimum_hold(&self) -> Duration {
        self.of(self.minimum_hold)
    }

    fn lock_delay(&self) -> LockDelay {
        LockDelay::new(self.of(self.lock_delay)).expect("a valid lock-delay")
    }

    /// The ttl choice `ttl` of `holder`: `holder_step` units apart for any
    /// two holders, so that two holds never expire in the same millisecond
    /// and "the reader that frees first" is one reader on both backends.
    fn ttl(&self, holder: usize, ttl: usize) -> Ttl {
        let units = self.ttls[ttl] + self.holder_step * u64::try_from(holder).expect("few holders");
        Ttl::new(self.of(units)).expect("valid ttl")
    }
}

std::thread_local! {
    /// The tolerance of [`Left`]'s comparison in this thread's arm.
    static TOLERANCE: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::from_secs(1)) };
}

/// The fair queue's place ttl: the longest, far above a run.
fn place_ttl() -> PlaceTtl {
    PlaceTtl::new(PlaceTtl::MAX).expect("the longest place ttl is valid")
}

/// A lease a renewal, release or inspect names.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// A plain lease.
    Plain(usize),
    /// A permit of the semaphore.
    Permit(u32),
    /// The read-write lease's writer.
    Writer,
    /// The read-write lease's reader `holder`.
    Reader(usize),
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        holder: usize,
        key: usize,
        ttl: usize,
        /// With the scale's minimum hold.
        held: bool,
        /// With the scale's lock-delay.
        delayed: bool,
    },
    AcquireFair {
        holder: usize,
        key: usize,
        ttl: usize,
    },
    LeaveFair {
        holder: usize,
        key: usize,
    },
    ReleaseFair {
        holder: usize,
        key: usize,
    },
    AcquirePermit {
        holder: usize,
        limit: u32,
        ttl: usize,
    },
    AcquireRead {
        holder: usize,
        ttl: usize,
    },
    AcquireWrite {
        holder: usize,
        ttl: usize,
    },
    WithdrawIntent {
        holder: usize,
    },
    Renew {
        holder: usize,
        target: Target,
        ttl: usize,
        /// With the scale's lock-delay.
        delayed: bool,
    },
    RenewMany(Vec<(usize, Target)>),
    Release {
        holder: usize,
        target: Target,
    },
    ReleaseTo {
        holder: usize,
        key: usize,
        next: usize,
    },
    Inspect(Target),
    /// Waits this many units of the scale.
    Wait(u64),
}

fn target() -> impl Strategy<Value = Target> {
    prop_oneof![
        3 => (0..KEYS).prop_map(Target::Plain),
        1 => (0..2u32).prop_map(Target::Permit),
        1 => Just(Target::Writer),
        1 => (0..HOLDERS).prop_map(Target::Reader),
    ]
}

fn op(scale: Scale) -> impl Strategy<Value = Op> {
    let (h, t) = (0..HOLDERS, 0..TTLS.len());
    // proptest refuses a weight of 0: without waits, a rare no-op.
    let (waits, longest): (u32, u64) = if scale.waits { (3, 3) } else { (1, 0) };
    prop_oneof![
        waits => (longest.min(1)..=longest).prop_map(Op::Wait),
        4 => (h.clone(), 0..FAIR, t.clone(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.2))
            .prop_map(|(holder, key, ttl, held, delayed)| Op::Acquire { holder, key, ttl, held: held && key == 0, delayed }),
        2 => (h.clone(), t.clone()).prop_map(|(holder, ttl)| Op::AcquireFair { holder, key: FAIR, ttl }),
        1 => h.clone().prop_map(|holder| Op::LeaveFair { holder, key: FAIR }),
        1 => h.clone().prop_map(|holder| Op::ReleaseFair { holder, key: FAIR }),
        1 => (h.clone(), 1..=2u32, t.clone()).prop_map(|(holder, limit, ttl)| Op::AcquirePermit { holder, limit, ttl }),
        1 => (h.clone(), t.clone()).prop_map(|(holder, ttl)| Op::AcquireRead { holder, ttl }),
        1 => (h.clone(), t.clone()).prop_map(|(holder, ttl)| Op::AcquireWrite { holder, ttl }),
        1 => h.clone().prop_map(|holder| Op::WithdrawIntent { holder }),
        3 => (h.clone(), target(), t, proptest::bool::weighted(0.2))
            .prop_map(|(holder, target, ttl, delayed)| Op::Renew { holder, target, ttl, delayed }),
        1 => proptest::collection::vec((h.clone(), target()), 0..5).prop_map(Op::RenewMany),
        3 => (h.clone(), target()).prop_map(|(holder, target)| Op::Release { holder, target }),
        1 => (h.clone(), 0..FAIR, h).prop_map(|(holder, key, next)| Op::ReleaseTo { holder, key, next }),
        2 => target().prop_map(Op::Inspect),
    ]
}

/// A fencing token as seen in one backend's run: its counter and value;
/// [`normalize`] turns the value into its rank within the counter.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    counter: String,
    value: u64,
}

/// A time left, equal to another within the arm's tolerance (the two
/// backends run each operation a few milliseconds apart).
#[derive(Clone, Copy)]
struct Left(Option<Duration>);

impl PartialEq for Left {
    fn eq(&self, other: &Self) -> bool {
        match (self.0, other.0) {
            (Some(a), Some(b)) => a.abs_diff(b) <= TOLERANCE.get(),
            (a, b) => a == b,
        }
    }
}

impl fmt::Debug for Left {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(left) => write!(f, "{}ms", left.as_millis()),
            None => f.write_str("none"),
        }
    }
}

/// What one operation's outcome was, in terms both backends share.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Acquired {
        key: String,
        token: Token,
    },
    Held {
        token: Option<Token>,
        label: Option<String>,
        left: Left,
    },
    FairAcquired {
        token: Token,
        queued: u32,
    },
    Waiting {
        ahead: u32,
        queued: u32,
        holder: Option<Box<Seen>>,
    },
    Left,
    Renewed,
    Lost,
    Released,
    NotHeld,
    HandedOver {
        token: Token,
    },
    Free,
    Bool(bool),
    Error(&'static str),
}

fn error_kind(error: &BackendError) -> &'static str {
    match error {
        BackendError::PermitLimitMismatch { .. } => "permit limit mismatch",
        BackendError::Unsupported { .. } => "unsupported",
        _ => "other",
    }
}

/// One case's world: its holders and keys, the same on both backends.
struct World {
    scale: Scale,
    holders: Vec<HolderId>,
    plain: Vec<LeaseKey>,
    semaphore: LeaseKey,
    doc: LeaseKey,
}

impl World {
    fn new(prefix: &str, scale: Scale) -> Result<Self, leasehold::InputError> {
        Ok(Self {
            scale,
            holders: (0..HOLDERS)
                .map(|_| HolderId::generate())
                .collect::<Result<_, _>>()?,
            plain: (0..KEYS)
                .map(|k| LeaseKey::new(format!("{prefix}:k{k}")))
                .collect::<Result<_, _>>()?,
            semaphore: LeaseKey::new(format!("{prefix}:sem"))?,
            doc: LeaseKey::new(format!("{prefix}:doc"))?,
        })
    }

    fn key(&self, target: Target) -> Result<LeaseKey, leasehold::InputError> {
        match target {
            Target::Plain(k) => Ok(self.plain[k].clone()),
            Target::Permit(i) => self.semaphore.permit(i),
            Target::Writer => self.doc.writer_key(),
            Target::Reader(h) => self.doc.reader_key(&self.holders[h]),
        }
    }

    fn request(&self, key: &LeaseKey, holder: usize, ttl: usize) -> AcquireRequest {
        AcquireRequest::new(
            key.clone(),
            self.holders[holder],
            self.scale.ttl(holder, ttl),
        )
        .with_label(format!("h{holder}"))
        .expect("valid label")
    }

    fn token(counter: &LeaseKey, token: leasehold::FencingToken) -> Token {
        Token {
            counter: counter.as_str().to_owned(),
            value: token.get(),
        }
    }

    fn acquired(&self, counter: &LeaseKey, outcome: Result<AcquireOutcome, BackendError>) -> Seen {
        match outcome {
            Ok(AcquireOutcome::Acquired(grant)) => Seen::Acquired {
                key: grant.key.as_str().to_owned(),
                token: Self::token(counter, grant.fencing_token),
            },
            Ok(AcquireOutcome::Held(info)) => Self::held(counter, &info),
            Err(error) => Seen::Error(error_kind(&error)),
        }
    }

    fn held(counter: &LeaseKey, info: &LeaseInfo) -> Seen {
        Seen::Held {
            token: info.fencing_token.map(|t| Self::token(counter, t)),
            label: info.label.clone(),
            left: Left(info.ttl_left),
        }
    }

    /// Runs `ops` on `backend`, and says what each did.
    async fn run(
        &self,
        backend: &(impl LeaseBackend + PermitBackend + ReadWriteBackend + FairBackend + HandoverBackend),
        ops: &[Op],
    ) -> Result<Vec<Seen>, TestCaseError> {
        let mut seen = Vec::with_capacity(ops.len());
        let fail = |e: leasehold::InputError| TestCaseError::fail(e.to_string());
        for op in ops {
            seen.push(match op {
                Op::Acquire {
                    holder,
                    key,
                    ttl,
                    held,
                    delayed,
                } => {
                    let key = &self.plain[*key];
                    let mut request = self.request(key, *holder, *ttl);
                    if *held {
                        request = request
                            .with_hold_at_least(self.scale.minimum_hold())
                            .map_err(fail)?;
                    }
                    if *delayed {
                        request = request.with_lock_delay(self.scale.lock_delay());
                    }
                    let outcome = backend.try_acquire(&request).await;
                    self.acquired(key, outcome)
                }
                Op::AcquireFair { holder, key, ttl } => {
                    let key = &self.plain[*key];
                    let request = self.request(key, *holder, *ttl);
                    match backend.try_acquire_fair(&request, place_ttl(), None).await {
                        Ok(FairOutcome::Acquired { grant, queued }) => Seen::FairAcquired {
                            token: Self::token(key, grant.fencing_token),
                            queued,
                        },
                        Ok(FairOutcome::Waiting(place)) => Seen::Waiting {
                            ahead: place.ahead,
                            queued: place.queued,
                            holder: place.holder.map(|info| Box::new(Self::held(key, &info))),
                        },
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::LeaveFair { holder, key } => {
                    match backend
                        .leave_fair_queue(&self.plain[*key], &self.holders[*holder])
                        .await
                    {
                        Ok(()) => Seen::Left,
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::ReleaseFair { holder, key } => {
                    match backend
                        .release_fair(&self.plain[*key], &self.holders[*holder])
                        .await
                    {
                        Ok(ReleaseOutcome::Released) => Seen::Released,
                        Ok(ReleaseOutcome::NotHeld) => Seen::NotHeld,
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::AcquirePermit { holder, limit, ttl } => {
                    let request = self.request(&self.semaphore, *holder, *ttl);
                    let limit = PermitLimit::new(*limit).map_err(fail)?;
                    let outcome = backend.try_acquire_permit(&request, limit).await;
                    self.acquired(&self.semaphore, outcome)
                }
                Op::AcquireRead { holder, ttl } => {
                    let outcome = backend
                        .try_acquire_read(&self.request(&self.doc, *holder, *ttl))
                        .await;
                    self.acquired(&self.doc, outcome)
                }
                Op::AcquireWrite { holder, ttl } => {
                    let outcome = backend
                        .try_acquire_write(&self.request(&self.doc, *holder, *ttl))
                        .await;
                    self.acquired(&self.doc, outcome)
                }
                Op::WithdrawIntent { holder } => {
                    match backend
                        .withdraw_write_intent(&self.doc, &self.holders[*holder])
                        .await
                    {
                        Ok(withdrawn) => Seen::Bool(withdrawn),
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::Renew {
                    holder,
                    target,
                    ttl: t,
                    delayed,
                } => {
                    let key = self.key(*target).map_err(fail)?;
                    let mut request =
                        RenewRequest::new(key, self.holders[*holder], self.scale.ttl(*holder, *t));
                    if *delayed {
                        request = request.with_lock_delay(self.scale.lock_delay());
                    }
                    renewed(backend.renew(&request).await)
                }
                Op::RenewMany(batch) => {
                    let mut requests = Vec::with_capacity(batch.len());
                    for (holder, target) in batch {
                        let key = self.key(*target).map_err(fail)?;
                        requests.push(RenewRequest::new(
                            key,
                            self.holders[*holder],
                            self.scale.ttl(*holder, 1),
                        ));
                    }
                    let outcomes = backend.renew_many(&requests).await;
                    if outcomes.len() != requests.len() {
                        return Err(TestCaseError::fail(format!(
                            "{} renewals, {} outcomes",
                            requests.len(),
                            outcomes.len()
                        )));
                    }
                    seen.extend(outcomes.into_iter().map(renewed));
                    continue;
                }
                Op::Release { holder, target } => {
                    let key = self.key(*target).map_err(fail)?;
                    match backend
                        .release(&key, &self.holders[*holder])
                        .await
                        .map(ReleaseOutcome::from)
                    {
                        Ok(ReleaseOutcome::Released) => Seen::Released,
                        Ok(ReleaseOutcome::NotHeld) => Seen::NotHeld,
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::ReleaseTo { holder, key, next } => {
                    let key = &self.plain[*key];
                    let offered = self.request(key, *next, 1);
                    match backend
                        .release_to(key, &self.holders[*holder], &offered)
                        .await
                    {
                        Ok(HandoverOutcome::HandedOver(grant)) => Seen::HandedOver {
                            token: Self::token(key, grant.fencing_token),
                        },
                        Ok(HandoverOutcome::Released) => Seen::Released,
                        Ok(HandoverOutcome::NotHeld) => Seen::NotHeld,
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
                Op::Wait(units) => {
                    let units = u32::try_from(*units).expect("few units");
                    if units > 0 {
                        tokio::time::sleep(self.scale.unit * units).await;
                    }
                    continue;
                }
                Op::Inspect(target) => {
                    let key = self.key(*target).map_err(fail)?;
                    let counter = key.counted_as();
                    match backend.inspect(&key).await {
                        Ok(None) => Seen::Free,
                        Ok(Some(info)) => Self::held(&counter, &info),
                        Err(error) => Seen::Error(error_kind(&error)),
                    }
                }
            });
        }
        Ok(seen)
    }
}

fn renewed(outcome: Result<RenewOutcome, BackendError>) -> Seen {
    match outcome {
        Ok(RenewOutcome::Renewed) => Seen::Renewed,
        Ok(RenewOutcome::Lost) => Seen::Lost,
        Err(error) => Seen::Error(error_kind(&error)),
    }
}

fn token_of(seen: &mut Seen) -> Option<&mut Token> {
    match seen {
        Seen::Acquired { token, .. }
        | Seen::HandedOver { token }
        | Seen::FairAcquired { token, .. } => Some(token),
        Seen::Held { token, .. } => token.as_mut(),
        Seen::Waiting {
            holder: Some(held), ..
        } => token_of(held),
        _ => None,
    }
}

/// Each token's value replaced by its rank among the distinct values its
/// counter gave in the run: equal tokens stay equal, order is kept.
fn normalize(seen: &mut [Seen]) {
    let mut values: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for s in seen.iter_mut() {
        if let Some(token) = token_of(s) {
            values
                .entry(token.counter.clone())
                .or_default()
                .insert(token.value);
        }
    }
    for s in seen.iter_mut() {
        if let Some(token) = token_of(s) {
            let rank = values[&token.counter].range(..token.value).count();
            token.value = u64::try_from(rank).expect("few tokens");
        }
    }
}

#[test]
fn memory_backend_and_redis_agree_outcome_for_outcome() -> TestResult {
    agree(Scale::UNTIMED, 256, 40)
}

/// The arm where time passes: leases, permits, readers, minimum holds and
/// lock-delays expire within a run, on both backends alike.
#[test]
fn memory_backend_and_redis_agree_as_time_passes() -> TestResult {
    agree(Scale::TIMED, 12, 24)
}

/// Runs `cases` random sequences of up to `ops` operations at `scale` on
/// both backends, and compares them outcome for outcome.
fn agree(scale: Scale, cases: u32, ops: usize) -> TestResult {
    TOLERANCE.set(scale.tolerance);
    let server = RedisServer::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let redis = runtime.block_on(
        RedisBackend::builder(server.url())
            .op_timeout(Duration::from_secs(2))
            .connect(),
    )?;
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    let started = std::time::Instant::now();
    let result = runner.run(&proptest::collection::vec(op(scale), 1..ops), |ops| {
        case.set(case.get() + 1);
        let world = World::new(&format!("diff:{}", case.get()), scale).map_err(|e| TestCaseError::fail(e.to_string()))?;
        runtime.block_on(async {
            let memory = MemoryBackend::new();
            let mut expected = world.run(&memory, &ops).await?;
            let mut actual = world.run(&redis, &ops).await?;
            normalize(&mut expected);
            normalize(&mut actual);
            if let Some(at) = expected.iter().zip(&actual).position(|(m, r)| m != r) {
                return Err(TestCaseError::fail(format!(
                    "outcome {at} differs: memory {:?}, redis {:?}\nmemory: {expected:?}\nredis:  {actual:?}",
                    expected[at], actual[at]
                )));
            }
            prop_assert_eq!(expected.len(), actual.len());
            Ok(())
        })
    });
    println!(
        "{} cases (with shrinking) in {:?}",
        case.get(),
        started.elapsed()
    );
    result.map_err(|failure| failure.to_string().into())
}

/// Found by the test above: `release` of a lease under its minimum hold
/// keeps it taken until the minimum runs out, on both backends, and so does
/// `MemoryBackend::release_fair` (the trait's default: "frees the lease as
/// release does"); the Redis backend's `release_fair` (release_fair.lua)
/// frees it at once, ignoring `P:held-until`. Unreachable through the
/// manager today (fair acquisitions refuse a minimum hold, and only fair
/// leases are released this way), but the backends disagree; ignored until
/// release_fair.lua keeps the hold (or the contract says it need not).
#[tokio::test]
#[ignore = "release_fair.lua ignores the minimum hold that release keeps"]
async fn release_fair_keeps_a_minimum_hold_as_release_does() -> TestResult {
    let server = RedisServer::start()?;
    let redis = RedisBackend::builder(server.url()).connect().await?;
    let world = World::new("held-fair", Scale::UNTIMED)?;
    let ops = [
        Op::Acquire {
            holder: 0,
            key: 0,
            ttl: 0,
            held: true,
            delayed: false,
        },
        Op::ReleaseFair { holder: 0, key: 0 },
        Op::Inspect(Target::Plain(0)),
    ];
    let memory = world
        .run(&MemoryBackend::new(), &ops)
        .await
        .map_err(|e| e.to_string())?;
    let server = world.run(&redis, &ops).await.map_err(|e| e.to_string())?;
    assert!(matches!(memory[2], Seen::Held { .. }), "{memory:?}");
    assert!(matches!(server[2], Seen::Held { .. }), "{server:?}");
    Ok(())
}

/// Found by the test above: a waiter with a place in a fair queue that
/// gets the lease another way (a plain acquisition, a `release_to`) and
/// then asks through the queue again is refreshed by both backends, and
/// both drop the holder's place (fair.lua: "keep no place, the grant left
/// it"), answering `queued` 0. `MemoryBackend` used to keep the place,
/// counted in `queued` and ahead of later waiters until it expired.
#[tokio::test]
async fn a_fair_refresh_leaves_the_holders_place_on_both() -> TestResult {
    let server = RedisServer::start()?;
    let redis = RedisBackend::builder(server.url()).connect().await?;
    let world = World::new("fair-refresh", Scale::UNTIMED)?;
    let ops = [
        Op::Acquire {
            holder: 1,
            key: 0,
            ttl: 0,
            held: false,
            delayed: false,
        },
        Op::AcquireFair {
            holder: 0,
            key: 0,
            ttl: 0,
        },
        Op::Release {
            holder: 1,
            target: Target::Plain(0),
        },
        Op::Acquire {
            holder: 0,
            key: 0,
            ttl: 0,
            held: false,
            delayed: false,
        },
        Op::AcquireFair {
            holder: 0,
            key: 0,
            ttl: 0,
        },
    ];
    let mut memory = world
        .run(&MemoryBackend::new(), &ops)
        .await
        .map_err(|e| e.to_string())?;
    let mut server = world.run(&redis, &ops).await.map_err(|e| e.to_string())?;
    normalize(&mut memory);
    normalize(&mut server);
    assert_eq!(memory, server);
    Ok(())
}
