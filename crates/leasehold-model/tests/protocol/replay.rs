//! The model against the real scripts: action sequences of the model are
//! replayed against a real `redis-server` through
//! `leasehold_redis::RedisBackend` (`try_acquire`, `renew_many`, `release`:
//! the scripts and reply parsing the watchdog uses), and every answer and
//! the server's state after every step are compared with the model's.
//!
//! # Sequences
//!
//! The examples the check of the real protocol finds (a lease acquired,
//! renewed, expired and acquired again after a restart; a renewal answered
//! `Lost`; both clients in turn; two believers across a restart), then
//! random walks through the model from a fixed seed ([`WALKS`] of at most
//! [`WALK_STEPS`] actions, within looser bounds than the check's, [`WALK`]),
//! each action drawn at random among those the model allows (time passing
//! three times likelier than any other, [`TICK_WEIGHT`]). Only the
//! server's steps are replayed: a client's send or read changes nothing on
//! the server.
//!
//! # Time
//!
//! The replay never waits for a real ttl. One tick of the model is
//! [`PER_TICK`] (ten seconds) of a key's remaining life on the server, and
//! leases are asked for the model's ttl in those units (50 ticks: 500 s),
//! so nothing expires by the real clock while a sequence runs (about 15
//! milliseconds), and a stall of the test of up to five seconds still
//! rounds to the right tick. When the model's clock moves (a `Tick`, or
//! the time a `Restart` takes), the lease key's remaining life is
//! shortened by as many ticks on the server ([`SHIFT`]: `PEXPIRE` to its `PTTL` less
//! that; a key whose life runs out is deleted, as its expiry would). Only
//! the lease key: the fencing counter is kept for an hour
//! (`KeyLayout::DEFAULT_FENCE_RETENTION`) and the model never expires it.
//! A server clock that runs fast (`Serve(_, early)`) takes `early` ticks off
//! the key the script has just written. So the expiry each script sets (the
//! grant's `PX`, the renewal's `PEXPIRE`) is what decides when the key goes,
//! and the server's remaining life is compared with the model's; what is
//! not exercised is Redis's own expiry of keys (it deletes on time, and
//! loss_detection in the root crate measures it with real ttls).
//!
//! A restart that loses data is `FLUSHALL`: the key and the counter go,
//! the server's clock goes on, as it does across a real restart. The
//! script cache and the connections survive it, unlike a real restart,
//! whose reconnection and `NOSCRIPT` reloads leasehold-redis's fault tests
//! cover; replaying a restart as one keeps a sequence within milliseconds.
//!
//! Fencing tokens are the real ones, from the server's `TIME` and the
//! counter. Real time moves forward through a sequence as the model's does,
//! so each grant's token is compared by its order: whether it is above the
//! previous grant's, as the model says. A refusal shows the holder's token,
//! compared with the one that holder was granted.
//!
//! A mismatch fails the test and prints the sequence.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, FencingToken, HolderId, LeaseBackend, LeaseKey, ReleaseOutcome,
    RenewOutcome, RenewRequest, Ttl,
};
use leasehold_redis::RedisBackend;
use leasehold_redis::redis::{self, aio::MultiplexedConnection};
use leasehold_testkit::RedisServer;
use stateright::Model;

use super::{
    Action, Answer, Bounds, Fence, Phase, Protocol, REAL, Request, State, WITHIN_ALLOWANCE,
    real_examples,
};

/// A tick of the model as a key's remaining life on the server.
const PER_TICK: Duration = Duration::from_secs(10);

/// How many times likelier a walk lets time pass than it takes any other
/// action: uniform draws restart the server or release before most leases
/// can expire.
const TICK_WEIGHT: usize = 3;

/// Random walks: their number, length and seed.
const WALKS: u64 = 1_500;
const WALK_STEPS: usize = 120;
const SEED: u64 = 27;

/// The walks' bounds: more acquisitions, renewals and restarts than the
/// check's, on its grid.
const WALK: Bounds = Bounds {
    grid: 5,
    acquisitions: 4,
    renewals: 6,
    restarts: 2,
};

/// Time passes on the server for the lease key `KEYS[1]`: its remaining
/// life shortened by `ARGV[1]` ms, or the key deleted when that ends it.
/// Returns the remaining life, -2 when there is no key (any more).
const SHIFT: &str = r"
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  return left
end
left = left - tonumber(ARGV[1])
if left <= 0 then
  redis.call('DEL', KEYS[1])
  return -2
end
redis.call('PEXPIRE', KEYS[1], left)
return left
";

/// What the replay saw, for the report and for non-vacuity.
#[derive(Debug, Default)]
struct Seen {
    sequences: usize,
    server_steps: usize,
    answers: HashMap<Answer, usize>,
    /// Keys that the model's clock expired.
    expiries: usize,
    restarts: usize,
    /// Grants whose token the model and the server both put above the last.
    rising_grants: usize,
}

/// The server's state of the lease and its counter.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    /// The model's holder number and the key's remaining life in ticks.
    lease: Option<(u8, u16)>,
    counter: bool,
}

/// One replay against one server.
struct Replay {
    model: Protocol,
    backend: RedisBackend,
    conn: MultiplexedConnection,
    shift: redis::Script,
    key: LeaseKey,
    lease_key: String,
    fence_key: String,
    ttl: Ttl,
    seen: Seen,
}

/// The holder ids of the model's holder numbers: this plus the number.
const HOLDER_BASE: u128 = 0x1ea5_e000;

/// The holder id of the model's holder number `holder`.
fn holder_id(holder: u8) -> HolderId {
    HolderId::from_hex(&format!("{:032x}", HOLDER_BASE + u128::from(holder)))
        .expect("32 hex digits")
}

/// The model's holder number of a stored lease value (`holder:token:label`),
/// 0 for a holder the model never had.
fn holder_number(value: &str) -> u8 {
    value
        .get(..32)
        .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        .and_then(|id| id.checked_sub(HOLDER_BASE))
        .and_then(|n| u8::try_from(n).ok())
        .filter(|&n| n > 0 && value.as_bytes().get(32) == Some(&b':'))
        .unwrap_or(0)
}

/// `ticks` ticks of a key's life on the server, in ms.
fn ms(ticks: u16) -> u64 {
    u64::from(ticks) * u64::try_from(PER_TICK.as_millis()).expect("a short tick")
}

impl Replay {
    async fn new(server: &RedisServer) -> Self {
        // The walks' bounds; the check's examples replay in this model
        // too: bounds only limit which actions are offered, and the grid
        // (the one thing that shapes a step) is the same.
        let model = Protocol::new(REAL, WALK, WITHIN_ALLOWANCE);
        let backend = RedisBackend::connect(server.url())
            .await
            .expect("connects to the test server");
        let conn = redis::Client::open(server.url())
            .expect("a valid url")
            .get_multiplexed_async_connection()
            .await
            .expect("connects to the test server");
        let key = LeaseKey::new("model").expect("a valid key");
        let ttl = Ttl::new(PER_TICK * u32::from(model.ttl)).expect("a valid ttl");
        Self {
            lease_key: backend.layout().lease(&key),
            fence_key: backend.layout().fence(&key),
            model,
            backend,
            conn,
            shift: redis::Script::new(SHIFT),
            key,
            ttl,
            seen: Seen::default(),
        }
    }

    /// Replays one sequence from an empty server; panics at a mismatch.
    async fn run(&mut self, source: &str, actions: &[Action]) {
        self.flush().await;
        let mut state = self.model.init_states().remove(0);
        // The token each holder was granted, and the last one granted.
        let mut granted: HashMap<u8, FencingToken> = HashMap::new();
        let mut last: Option<FencingToken> = None;
        for (step, &action) in actions.iter().enumerate() {
            let next = self
                .model
                .next_state(&state, action)
                .expect("every action has a next state");
            let fail = |what: String| -> ! {
                panic!(
                    "the real scripts disagree with the model at step {step} ({action:?}) \
                     of {source}: {what}\n  model before: {state:?}\n  model after: {next:?}\n  \
                     sequence: {actions:?}"
                )
            };
            match action {
                Action::Tick | Action::Restart => {
                    let ticks = Protocol::step(&state);
                    self.pass(ticks).await;
                    if state.lease.is_some_and(|lease| lease.left <= ticks) {
                        self.seen.expiries += 1;
                    }
                    if action == Action::Restart {
                        self.flush().await;
                        self.seen.restarts += 1;
                    }
                }
                Action::Serve(client, early) => {
                    let Some(request) = state.clients[client].request else {
                        fail("the model serves no request".to_owned());
                    };
                    let mut served = state.clone();
                    let Some(expected) = self.model.serve(&mut served, client, early) else {
                        fail("the model gives no answer".to_owned());
                    };
                    let answer = match request {
                        Request::Acquire { holder, .. } => {
                            let request =
                                AcquireRequest::new(self.key.clone(), holder_id(holder), self.ttl);
                            match self.backend.try_acquire(&request).await {
                                Ok(AcquireOutcome::Acquired(grant)) => {
                                    let rises = last.is_none_or(|t| grant.fencing_token > t);
                                    let model_rises = model_rises(&state, &next);
                                    if rises != model_rises {
                                        fail(format!(
                                            "token {} after {last:?}: above it {rises}, \
                                             in the model {model_rises}",
                                            grant.fencing_token
                                        ));
                                    }
                                    self.seen.rising_grants += usize::from(rises);
                                    granted.insert(holder, grant.fencing_token);
                                    last = Some(grant.fencing_token);
                                    Answer::Granted
                                }
                                Ok(AcquireOutcome::Held(info)) => {
                                    let shown = state
                                        .lease
                                        .and_then(|lease| granted.get(&lease.holder).copied());
                                    if info.fencing_token != shown {
                                        fail(format!(
                                            "refused showing token {:?}, the holder's is {shown:?}",
                                            info.fencing_token
                                        ));
                                    }
                                    Answer::Refused
                                }
                                Err(error) => fail(format!("acquire failed: {error}")),
                            }
                        }
                        Request::Renew { holder, .. } => {
                            let request =
                                RenewRequest::new(self.key.clone(), holder_id(holder), self.ttl);
                            let outcome = self.backend.renew_many(&[request]).await.pop();
                            match outcome {
                                Some(Ok(RenewOutcome::Renewed)) => Answer::Renewed,
                                Some(Ok(RenewOutcome::Lost)) => Answer::Lost,
                                other => fail(format!("renew answered {other:?}")),
                            }
                        }
                        Request::Release { holder } => {
                            match self
                                .backend
                                .release(&self.key, &holder_id(holder))
                                .await
                                .map(ReleaseOutcome::from)
                            {
                                Ok(ReleaseOutcome::Released) => Answer::Released,
                                Ok(ReleaseOutcome::NotHeld) => Answer::NotHeld,
                                Err(error) => fail(format!("release failed: {error}")),
                            }
                        }
                    };
                    if answer != expected {
                        fail(format!(
                            "the server answered {answer:?}, the model {expected:?}"
                        ));
                    }
                    *self.seen.answers.entry(answer).or_default() += 1;
                    // A fast server clock: the key just written lives
                    // `early` ticks less on the clients' clock.
                    if early > 0 && matches!(answer, Answer::Granted | Answer::Renewed) {
                        self.pass(early).await;
                    }
                }
                // A client's send or read: nothing on the server.
                Action::Acquire(_) | Action::Renew(_) | Action::Release(_) | Action::Deliver(_) => {
                    state = next;
                    continue;
                }
            }
            self.seen.server_steps += 1;
            let observed = self.observe().await;
            let expected = Observed {
                lease: next.lease.map(|lease| (lease.holder, lease.left)),
                counter: next.counter.is_some(),
            };
            if observed != expected {
                fail(format!(
                    "the server holds {observed:?}, the model {expected:?}"
                ));
            }
            state = next;
        }
        self.seen.sequences += 1;
    }

    async fn flush(&mut self) {
        redis::cmd("FLUSHALL")
            .arg("SYNC")
            .query_async::<()>(&mut self.conn)
            .await
            .expect("FLUSHALL");
    }

    /// `ticks` ticks pass for the lease key.
    async fn pass(&mut self, ticks: u16) {
        self.shift
            .key(&self.lease_key)
            .arg(ms(ticks))
            .invoke_async::<i64>(&mut self.conn)
            .await
            .expect("the shift script");
    }

    /// The lease (holder, remaining life rounded to ticks) and whether the
    /// counter exists. A key left by another holder than the model's, or
    /// with no expiry, shows as an impossible holder or life (0).
    async fn observe(&mut self) -> Observed {
        let (value, pttl, counter): (Option<String>, i64, bool) = redis::pipe()
            .cmd("GET")
            .arg(&self.lease_key)
            .cmd("PTTL")
            .arg(&self.lease_key)
            .cmd("EXISTS")
            .arg(&self.fence_key)
            .query_async(&mut self.conn)
            .await
            .expect("GET, PTTL, EXISTS");
        let lease = value.map(|value| {
            let holder = holder_number(&value);
            // The key's life in ticks, rounded up: a few ms of real time
            // have passed since the script wrote it.
            let tick = i64::try_from(PER_TICK.as_millis()).expect("a short tick");
            let left = if pttl > 0 {
                u16::try_from((pttl + tick / 2) / tick).unwrap_or(u16::MAX)
            } else {
                0
            };
            (holder, left)
        });
        Observed { lease, counter }
    }
}

/// Whether the model's grant from `before` to `after` put its token above
/// the last one granted (or is the first).
fn model_rises(before: &State, after: &State) -> bool {
    let token: Fence = after.last_token.expect("a grant leaves a token");
    before.last_token.is_none_or(|last| token.above(last))
}

/// A random walk through the model: at most `steps` actions, each drawn
/// among those allowed (see [`TICK_WEIGHT`]), ending early once only time can pass
/// and nothing is left for it to change.
fn walk(model: &Protocol, rng: &mut fastrand::Rng, steps: usize) -> Vec<Action> {
    let mut state = model.init_states().remove(0);
    let mut path = Vec::new();
    let mut actions = Vec::new();
    for _ in 0..steps {
        actions.clear();
        model.actions(&state, &mut actions);
        let quiet = state.lease.is_none()
            && state
                .clients
                .iter()
                .all(|c| c.phase == Phase::Idle && c.request.is_none() && c.reply.is_none());
        if quiet && actions == [Action::Tick] {
            break;
        }
        // `Tick` is always first: it weighs TICK_WEIGHT, every other action 1.
        let drawn = rng.usize(..actions.len() + TICK_WEIGHT - 1);
        let action = actions[drawn.saturating_sub(TICK_WEIGHT - 1)];
        state = model
            .next_state(&state, action)
            .expect("every action has a next state");
        path.push(action);
    }
    path
}

#[test]
fn the_real_scripts_answer_as_the_model_does() {
    let started = std::time::Instant::now();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let server = RedisServer::start().expect("starts redis-server");
    let mut replay = runtime.block_on(Replay::new(&server));

    // The walks first: the check of the real protocol may still be
    // running in another test.
    let mut rng = fastrand::Rng::with_seed(SEED);
    let mut distinct = HashSet::new();
    for n in 0..WALKS {
        let actions = walk(&replay.model, &mut rng, WALK_STEPS);
        if distinct.insert(actions.clone()) {
            runtime.block_on(replay.run(&format!("walk {n} (seed {SEED})"), &actions));
        }
    }
    for (name, actions) in real_examples() {
        runtime.block_on(replay.run(&format!("the example of `{name}`"), actions));
    }

    let seen = &replay.seen;
    println!(
        "replay: {} sequences ({} distinct walks of {WALKS}, {} examples), {} server steps, \
         answers {:?}, {} expiries, {} restarts, {} rising grants, {:.1?}",
        seen.sequences,
        distinct.len(),
        real_examples().len(),
        seen.server_steps,
        seen.answers,
        seen.expiries,
        seen.restarts,
        seen.rising_grants,
        started.elapsed(),
    );
    // Not vacuous: every answer, expiries, and restarts were replayed.
    for answer in [
        Answer::Granted,
        Answer::Refused,
        Answer::Renewed,
        Answer::Lost,
        Answer::Released,
        Answer::NotHeld,
    ] {
        assert!(
            seen.answers.get(&answer).is_some_and(|&n| n >= 100),
            "too few {answer:?} answers replayed: {seen:?}"
        );
    }
    assert!(seen.expiries >= 500 && seen.restarts >= 500, "{seen:?}");
}
