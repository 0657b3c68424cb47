//! An exhaustive model check of the lease protocol with stateright.
//!
//! Run with `cargo test -p leasehold-model --test protocol -- --nocapture`
//! (each check prints its state count and time; `--ignored` adds the check
//! at every tick).
//!
//! # The model
//!
//! Two clients and one Redis server, one key, on a discrete clock of
//! [`TICK`] (4 ms). The clients' clock is the model's clock; the server
//! runs each lease script as one atomic step:
//!
//! - *acquire*: `SET key holder NX PX ttl`, then the fencing token: one past
//!   the counter, lifted to a floor taken from the server's `TIME` in µs
//!   (`grant.lua`);
//! - *renew*: compare-and-pexpire (`renew.lua`);
//! - *release*: compare-and-delete (`release.lua`);
//! - *expiry*: a key is gone at its expiry instant;
//! - *restart*: the server loses the key and the fencing counter (no
//!   persistence); its clock goes on, and it answers again a tick later at
//!   the earliest.
//!
//! The server's clock may run fast: each expiry it sets may come up to
//! `clock_drift(ttl)` early on the clients' clock (the bound leasehold
//! assumes), plus a drift beyond that bound, a parameter of the model
//! ([`DriftBeyond`]: zero for the real protocol). Every request and every
//! reply may wait in the network, and a client may leave any step for
//! later: that is a client pause (GC, SIGSTOP, a slow scheduler), explored
//! at every length. A holder renews whenever it
//! likes (the watchdog renews at a third of the ttl, earlier than the
//! model's latest), one request at a time, and may release at any time (it
//! stops believing, then sends the compare-and-delete).
//!
//! The client side uses leasehold's own numbers and code: a 200 ms ttl and
//! the default options, and the deadline as the watchdog computes it
//! ([`production_deadlines`]: the grant's `valid_until` from `Grant::new`
//! after an acquisition, leasehold-core's `valid_until` after a renewal,
//! less the safety margin; ttl − `clock_drift` − margin = 176 ms = 44
//! ticks, as `LeaseOptions::deadline_after` documents), counted from the
//! *send* of the last successful request. The token fires at that deadline
//! (the watchdog's timer), or at once for a success read after it. Every
//! duration is a whole number of ticks (checked), so nothing is rounded.
//!
//! Times are kept relative to now (ticks left, ticks since), so states
//! that differ only in when they happened are one state and the space is
//! finite without a horizon; fencing tokens are kept as what their order
//! depends on ([`Fence`]).
//!
//! # Properties
//!
//! - `mutual exclusion among believers` (always): no two clients hold the
//!   lease with tokens that have not fired and grants from the same server
//!   life. Across a restart that lost the key, a second holder can get in
//!   before the first can know (the `sometimes` property below shows it):
//!   that is what fencing is for, and docs/reliability.md says so;
//! - `fencing tokens strictly increase` (always): each grant's token is
//!   above every earlier one, across restarts;
//! - non-vacuity (sometimes): a lease is acquired, renewed, expires on the
//!   server, the server restarts and the lease is acquired again; a renewal
//!   is answered `Lost`; both clients hold the lease in turn; two believers
//!   straddle a restart.
//!
//! Each mechanism is then removed ([`Mechanism`]) and the checker must find
//! a counterexample: without the drift allowance and the safety margin, a
//! fast server clock expires the key while its holder still believes; with
//! the deadline counted from the reply instead of the send, a slow reply
//! does the same; without the time floor, a restart repeats a token.
//!
//! Drift alone: with every mechanism kept, a server clock fast by more than
//! the allowance and the margin together (24 ms beyond the 4 ms allowance
//! at this ttl, one tick past the 20 ms margin) breaks exclusion; 20 ms
//! beyond it, the margin's worth, does not (a key may then expire at the
//! very instant its token fires). Removing the drift allowance alone
//! breaks nothing while the server's clock stays within it (the 20 ms
//! margin covers the 4 ms), as predicted; but then drift the real
//! protocol covers (20 ms beyond the allowance) breaks exclusion.
//!
//! # Against the real scripts
//!
//! The server side of this model is written by hand after the scripts; the
//! replay ([`replay`], `tests/protocol/replay.rs`) ties it to them: the
//! examples the check finds and 1,500 random walks through the model (a
//! fixed seed) are replayed against a real `redis-server` through
//! `leasehold_redis::RedisBackend`, and every answer (granted, refused,
//! renewed, lost, released, not held), the order of the fencing tokens, and
//! the lease key's holder and remaining life after each step must be the
//! model's. Time is replayed without waiting: a tick is ten seconds of the
//! key's life, taken off it with `PEXPIRE`; a restart is `FLUSHALL`.
//!
//! # Bounds and abstractions
//!
//! Bounds ([`CI`]): 2 clients, 2 acquisitions, 2 renewals, 1 restart, and
//! clients and server acting on a 20 ms grid plus the exact instants at
//! which keys expire and tokens fire (those instants are where exclusion
//! can break). [`EVERY_TICK`] drops the grid (every 4 ms) with 1 renewal.
//! Abstracted away: replication and failover (one server), the races
//! between a handle and the watchdog inside a client (checked with loom in
//! leasehold-watchdog), a server clock that steps back (the floor assumes
//! it does not), the counter's retention (an hour by default: the model's
//! counter never expires), idempotent re-acquisition, local handover and
//! the release notices.

#[path = "protocol/replay.rs"]
mod replay;

use std::sync::OnceLock;
use std::time::Duration;

use leasehold_core::{FencingToken, Grant, HolderId, LeaseKey, Ttl, clock_drift, valid_until};
use leasehold_watchdog::LeaseOptions;
use stateright::{Checker, HasDiscoveries, Model, Property};
use tokio::time::Instant;

/// The model's clock step.
const TICK: Duration = Duration::from_millis(4);

const CLIENTS: usize = 2;

/// How far the checker looks.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    /// Clients and the server act on a grid of this many ticks, and at the
    /// exact instants keys expire and tokens fire.
    grid: u16,
    acquisitions: u8,
    renewals: u8,
    restarts: u8,
}

/// What CI runs: a 20 ms grid (a tenth of the ttl), 2 acquisitions, 2
/// renewals, 1 restart.
const CI: Bounds = Bounds {
    grid: 5,
    acquisitions: 2,
    renewals: 2,
    restarts: 1,
};

/// Every tick (4 ms), with one renewal fewer: about 20 million states.
const EVERY_TICK: Bounds = Bounds {
    grid: 1,
    acquisitions: 2,
    renewals: 1,
    restarts: 1,
};

/// The mechanisms that keep the properties; the real protocol has them all.
#[derive(Clone, Copy, Debug)]
struct Mechanism {
    /// The client's deadline leaves room for the clock-drift allowance
    /// (`clock_drift`): without it, the deadline is that much later.
    drift_allowance: bool,
    /// The client's deadline leaves room for the safety margin: without
    /// it, the deadline is that much later.
    safety_margin: bool,
    /// The deadline counts from the request's send, not its reply.
    count_from_send: bool,
    /// The fencing token is floored at the server's clock.
    time_floor: bool,
}

const REAL: Mechanism = Mechanism {
    drift_allowance: true,
    safety_margin: true,
    count_from_send: true,
    time_floor: true,
};

/// How much faster than leasehold allows for the server's clock may run:
/// each expiry the server sets may come early on the clients' clock by up
/// to `clock_drift(ttl)` (the allowance) plus this. Zero is the bound
/// leasehold assumes; more is a server that breaks it.
type DriftBeyond = Duration;

/// The server's clock within the allowance.
const WITHIN_ALLOWANCE: DriftBeyond = Duration::ZERO;

/// The protocol with its numbers, in ticks.
struct Protocol {
    mechanism: Mechanism,
    bounds: Bounds,
    ttl: u16,
    /// How early the server's fast clock may expire a key: the drift
    /// allowance plus the drift beyond it.
    server_drift: u16,
    /// From an acquisition's send to its token's deadline.
    deadline_after_grant: u16,
    /// From a successful renewal's send to its token's deadline.
    deadline_after_renewal: u16,
}

fn ticks(d: Duration) -> u16 {
    assert!(
        d.as_nanos().is_multiple_of(TICK.as_nanos()),
        "{d:?} is not a whole number of {TICK:?} ticks"
    );
    u16::try_from(d.as_nanos() / TICK.as_nanos()).expect("a short duration")
}

/// The model's ttl, and the options the watchdog keeps its leases with.
fn ttl_and_options() -> (Ttl, LeaseOptions) {
    let ttl = Ttl::new(Duration::from_millis(200)).expect("a valid ttl");
    let options = LeaseOptions::builder()
        .ttl(ttl)
        .build()
        .expect("valid options");
    (ttl, options)
}

/// How long after a request's send its token's deadline comes, as the
/// watchdog computes it (crates/leasehold-watchdog/src/renewal.rs): the
/// grant's `valid_until` (built by the backend with `Grant::new`, from the
/// acquisition's send) or, after a renewal, `valid_until(sent_at, ttl)`,
/// less the lease's safety margin (`LeaseOptions::safety_margin`, which
/// the watchdog keeps as the lease's timing). Both are leasehold-core's
/// `valid_until`: the send, plus the ttl, less `clock_drift`.
fn production_deadlines(ttl: Ttl, options: &LeaseOptions) -> (Duration, Duration) {
    let sent_at = Instant::now();
    let holder = HolderId::from_hex(&"1".repeat(32)).expect("a valid holder id");
    let key = LeaseKey::new("model").expect("a valid key");
    let grant = Grant::new(key, holder, FencingToken(1), ttl, sent_at);
    let after_grant = grant.valid_until - options.safety_margin();
    let after_renewal = valid_until(sent_at, ttl) - options.safety_margin();
    (after_grant - sent_at, after_renewal - sent_at)
}

impl Protocol {
    fn new(mechanism: Mechanism, bounds: Bounds, beyond: DriftBeyond) -> Self {
        let (ttl, options) = ttl_and_options();
        let drift = clock_drift(ttl.get());
        // A mechanism removed moves the deadline later by what it took off.
        let removed = |mut deadline: Duration| {
            if !mechanism.drift_allowance {
                deadline += drift;
            }
            if !mechanism.safety_margin {
                deadline += options.safety_margin();
            }
            ticks(deadline)
        };
        let (after_grant, after_renewal) = production_deadlines(ttl, &options);
        Self {
            mechanism,
            bounds,
            ttl: ticks(ttl.get()),
            server_drift: ticks(drift + beyond),
            deadline_after_grant: removed(after_grant),
            deadline_after_renewal: removed(after_renewal),
        }
    }

    /// The longest deadline: ages past it all mean the same.
    fn deadline_cap(&self) -> u16 {
        self.deadline_after_grant.max(self.deadline_after_renewal)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Request {
    /// `age`: ticks since the client sent it.
    Acquire {
        holder: u8,
        age: u16,
    },
    Renew {
        holder: u8,
        age: u16,
    },
    Release {
        holder: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Reply {
    /// `age`: ticks since the client sent the request.
    /// `life`: the server's restarts before the grant.
    Acquired {
        holder: u8,
        age: u16,
        life: u8,
    },
    Held,
    Renewed {
        holder: u8,
        age: u16,
    },
    Lost {
        holder: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Acquiring,
    /// Holds the lease, and its token has not fired: it fires in `left`
    /// ticks.
    /// `life`: the server's restarts before the grant.
    Holding {
        holder: u8,
        left: u16,
        life: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// Its request in the network, not yet run by the server.
    request: Option<Request>,
    /// The server's reply in the network, not yet read.
    reply: Option<Reply>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    holder: u8,
    /// Ticks until the server expires it.
    left: u16,
}

/// A fencing token, as it compares with the others. With the time floor a
/// token is the server's clock in µs at its grant plus a step (one past
/// the counter when the counter was ahead of the clock): a token of an
/// earlier tick is below every token of a later one, since a tick is
/// 4000 µs and no tick sees that many grants. Without the floor it is the
/// counter alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Fence {
    /// Granted at an earlier tick (with the time floor).
    older: bool,
    step: u8,
}

impl Fence {
    fn above(self, other: Fence) -> bool {
        (other.older && !self.older) || self.step > other.step
    }
}

/// How far the non-vacuity story got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Story {
    Start,
    Acquired,
    Renewed,
    Expired,
    Restarted,
    Reacquired,
}

/// Times are kept relative to now (ticks left, ticks since), so that states
/// that differ only in when they happened are one state, and the state
/// space is finite without a horizon.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// Ticks to the next point of the clients' grid.
    to_grid: u16,
    lease: Option<Lease>,
    counter: Option<Fence>,
    restarts: u8,
    clients: [Client; CLIENTS],
    /// Holder ids handed out: one per acquisition attempt.
    acquisitions: u8,
    renewals: u8,
    /// History: the last fencing token granted, and whether every grant
    /// was above the one before.
    last_token: Option<Fence>,
    tokens_rise: bool,
    story: Story,
    lost_reply: bool,
    /// Clients that held the lease at some point.
    held_by: [bool; CLIENTS],
}

/// What the server answered a request, in the terms the replay compares
/// with the real scripts' replies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    Granted,
    Refused,
    Renewed,
    Lost,
    Released,
    NotHeld,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    Acquire(usize),
    Renew(usize),
    Release(usize),
    /// The server runs the client's request; its clock may shorten the ttl
    /// by the given ticks.
    Serve(usize, u16),
    Deliver(usize),
    Restart,
}

impl Protocol {
    /// The server runs the client's request (if any): returns its answer.
    fn serve(&self, state: &mut State, client: usize, early: u16) -> Option<Answer> {
        let request = state.clients[client].request.take()?;
        let left = self.ttl - early;
        let (reply, answer) = match request {
            Request::Acquire { holder, age } => {
                if state.lease.is_some() {
                    (Some(Reply::Held), Answer::Refused)
                } else {
                    // grant.lua: the floor from TIME, or one past a counter
                    // that is ahead of it (granted within this tick).
                    let token = match (state.counter, self.mechanism.time_floor) {
                        (Some(c), true) if !c.older => Fence {
                            older: false,
                            step: c.step + 1,
                        },
                        (_, true) => Fence {
                            older: false,
                            step: 0,
                        },
                        (c, false) => Fence {
                            older: false,
                            step: c.map_or(1, |c| c.step + 1),
                        },
                    };
                    state.counter = Some(token);
                    state.tokens_rise &= state.last_token.is_none_or(|last| token.above(last));
                    state.last_token = Some(token);
                    state.lease = Some(Lease { holder, left });
                    let reply = Reply::Acquired {
                        holder,
                        age,
                        life: state.restarts,
                    };
                    (Some(reply), Answer::Granted)
                }
            }
            Request::Renew { holder, age } => match &mut state.lease {
                Some(lease) if lease.holder == holder => {
                    lease.left = left;
                    (Some(Reply::Renewed { holder, age }), Answer::Renewed)
                }
                _ => (Some(Reply::Lost { holder }), Answer::Lost),
            },
            // The holder does not wait for the release's reply.
            Request::Release { holder } => {
                if state.lease.is_some_and(|lease| lease.holder == holder) {
                    state.lease = None;
                    (None, Answer::Released)
                } else {
                    (None, Answer::NotHeld)
                }
            }
        };
        state.clients[client].reply = reply;
        Some(answer)
    }

    /// The holder's phase after a success whose request was sent `age`
    /// ticks ago: its token fires `deadline_after` after the send (or
    /// after now, with that mechanism removed), at once if that is past.
    fn holding(&self, holder: u8, age: u16, life: u8, deadline_after: u16) -> Phase {
        let since = if self.mechanism.count_from_send {
            age
        } else {
            0
        };
        match deadline_after.checked_sub(since) {
            Some(left) if left > 0 => Phase::Holding { holder, left, life },
            _ => Phase::Idle,
        }
    }

    fn deliver(&self, state: &mut State, client: usize) {
        let Some(reply) = state.clients[client].reply.take() else {
            return;
        };
        let phase = state.clients[client].phase;
        let next = match (reply, phase) {
            (Reply::Acquired { holder, age, life }, Phase::Acquiring) => {
                state.held_by[client] = true;
                if state.story == Story::Start {
                    state.story = Story::Acquired;
                } else if state.story == Story::Restarted {
                    state.story = Story::Reacquired;
                }
                self.holding(holder, age, life, self.deadline_after_grant)
            }
            (Reply::Held, Phase::Acquiring) => Phase::Idle,
            (
                Reply::Renewed { holder, age },
                Phase::Holding {
                    holder: h, life, ..
                },
            ) if h == holder => {
                if state.story == Story::Acquired {
                    state.story = Story::Renewed;
                }
                self.holding(holder, age, life, self.deadline_after_renewal)
            }
            (Reply::Lost { holder }, Phase::Holding { holder: h, .. }) if h == holder => {
                state.lost_reply = true;
                Phase::Idle
            }
            // A reply for a lease whose token fired already: nothing to do.
            (_, phase) => phase,
        };
        state.clients[client].phase = next;
    }

    /// How many ticks [`advance`](Self::advance) moves the clock by: to
    /// the next point of the grid, key expiry or token deadline.
    fn step(state: &State) -> u16 {
        let mut step = state.to_grid;
        if let Some(lease) = state.lease {
            step = step.min(lease.left);
        }
        for client in &state.clients {
            if let Phase::Holding { left, .. } = client.phase {
                step = step.min(left);
            }
        }
        step
    }

    /// Time passes up to the next instant at which anything can happen:
    /// the next point of the clients' grid, or the exact instant a key
    /// expires or a token fires, whichever comes first. Keys expire, tokens
    /// fire at their deadline, and everything in the network gets older.
    fn advance(&self, state: &mut State) {
        let step = Self::step(state);
        state.to_grid -= step;
        if state.to_grid == 0 {
            state.to_grid = self.bounds.grid;
        }
        if let Some(lease) = &mut state.lease {
            lease.left -= step;
            if lease.left == 0 {
                state.lease = None;
                if state.story == Story::Renewed {
                    state.story = Story::Expired;
                }
            }
        }
        // Ages past the deadline all mean the same: the token fires at once.
        let cap = self.deadline_cap();
        let older = |age: &mut u16| *age = (*age + step).min(cap);
        for client in &mut state.clients {
            // The watchdog's timer: the token fires at its deadline.
            if let Phase::Holding { left, .. } = &mut client.phase {
                *left -= step;
                if *left == 0 {
                    client.phase = Phase::Idle;
                }
            }
            if let Some(Request::Acquire { age, .. } | Request::Renew { age, .. }) =
                &mut client.request
            {
                older(age);
            }
            if let Some(Reply::Acquired { age, .. } | Reply::Renewed { age, .. }) =
                &mut client.reply
            {
                older(age);
            }
        }
        if self.mechanism.time_floor {
            for fence in [&mut state.counter, &mut state.last_token]
                .into_iter()
                .flatten()
            {
                fence.older = true;
            }
        }
    }
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let idle = Client {
            phase: Phase::Idle,
            request: None,
            reply: None,
        };
        vec![State {
            to_grid: self.bounds.grid,
            lease: None,
            counter: None,
            restarts: 0,
            clients: [idle; CLIENTS],
            acquisitions: 0,
            renewals: 0,
            last_token: None,
            tokens_rise: true,
            story: Story::Start,
            lost_reply: false,
            held_by: [false; CLIENTS],
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        actions.push(Action::Tick);
        if state.restarts < self.bounds.restarts {
            actions.push(Action::Restart);
        }
        for (i, client) in state.clients.iter().enumerate() {
            if client.request.is_some() {
                actions.push(Action::Serve(i, 0));
                if self.server_drift > 0 {
                    actions.push(Action::Serve(i, self.server_drift));
                }
            }
            if client.reply.is_some() {
                actions.push(Action::Deliver(i));
            }
            // One request at a time, as the handle and watchdog send them.
            if client.request.is_some() || client.reply.is_some() {
                continue;
            }
            match client.phase {
                Phase::Idle if state.acquisitions < self.bounds.acquisitions => {
                    actions.push(Action::Acquire(i));
                }
                Phase::Holding { .. } => {
                    if state.renewals < self.bounds.renewals {
                        actions.push(Action::Renew(i));
                    }
                    actions.push(Action::Release(i));
                }
                _ => {}
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => self.advance(&mut state),
            Action::Restart => {
                // A restart takes time: the server's clock is past every
                // token of the previous tick when it answers again.
                self.advance(&mut state);
                state.lease = None;
                state.counter = None;
                state.restarts += 1;
                if state.story == Story::Expired {
                    state.story = Story::Restarted;
                }
            }
            Action::Acquire(i) => {
                state.acquisitions += 1;
                let client = &mut state.clients[i];
                client.phase = Phase::Acquiring;
                client.request = Some(Request::Acquire {
                    holder: state.acquisitions,
                    age: 0,
                });
            }
            Action::Renew(i) => {
                state.renewals += 1;
                let client = &mut state.clients[i];
                if let Phase::Holding { holder, .. } = client.phase {
                    client.request = Some(Request::Renew { holder, age: 0 });
                }
            }
            Action::Release(i) => {
                // The holder stops its work, then asks the server to delete.
                let client = &mut state.clients[i];
                if let Phase::Holding { holder, .. } = client.phase {
                    client.phase = Phase::Idle;
                    client.request = Some(Request::Release { holder });
                }
            }
            Action::Serve(i, early) => {
                self.serve(&mut state, i, early);
            }
            Action::Deliver(i) => self.deliver(&mut state, i),
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("mutual exclusion among believers", |_, state: &State| {
                let lives = believers(state);
                lives.len() <= 1 || lives.windows(2).all(|w| w[0] != w[1])
            }),
            Property::always("fencing tokens strictly increase", |_, state: &State| {
                state.tokens_rise
            }),
            Property::sometimes(
                "acquired, renewed, expired, restarted, acquired again",
                |_, state: &State| state.story == Story::Reacquired,
            ),
            Property::sometimes("a renewal answered Lost", |_, state: &State| {
                state.lost_reply
            }),
            Property::sometimes("both clients held the lease", |_, state: &State| {
                state.held_by.iter().all(|&held| held)
            }),
            // Why the exclusion is per server life: a restart that loses
            // the key lets a second holder in before the first can know.
            Property::sometimes("two believers across a restart", |_, state: &State| {
                believers(state).len() > 1
            }),
        ]
    }
}

/// The server lives (restarts before the grant) of the clients that hold
/// the lease and whose token has not fired.
fn believers(state: &State) -> Vec<u8> {
    state
        .clients
        .iter()
        .filter_map(|c| match c.phase {
            Phase::Holding { life, .. } => Some(life),
            _ => None,
        })
        .collect()
}

/// Runs the checker on two threads, to completion or (`first_failure`)
/// until a property fails, and prints its figures.
fn check(
    mechanism: Mechanism,
    bounds: Bounds,
    beyond: DriftBeyond,
    first_failure: bool,
) -> impl Checker<Protocol> {
    let started = std::time::Instant::now();
    let mut builder = Protocol::new(mechanism, bounds, beyond)
        .checker()
        .threads(2);
    if first_failure {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "{mechanism:?}, {bounds:?}, server drift {beyond:?} beyond the allowance: \
         {} states ({} unique), depth {}, {:.1?}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed(),
    );
    checker
}

/// The `sometimes` properties: each must have an example.
const EXAMPLES: [&str; 4] = [
    "acquired, renewed, expired, restarted, acquired again",
    "a renewal answered Lost",
    "both clients held the lease",
    "two believers across a restart",
];

/// The check of the real protocol at the CI bounds, run once for the tests
/// that need it; returns its examples' paths, which the replay replays.
fn real_examples() -> &'static [(&'static str, Vec<Action>)] {
    static EXAMPLE_PATHS: OnceLock<Vec<(&'static str, Vec<Action>)>> = OnceLock::new();
    EXAMPLE_PATHS.get_or_init(|| keeps_its_guarantees(REAL, CI, WITHIN_ALLOWANCE))
}

#[test]
fn the_protocol_keeps_its_guarantees() {
    real_examples();
}

/// The same at every tick: 20 million states, three to five minutes on two
/// cores.
#[test]
#[ignore = "takes minutes: run with --ignored"]
fn the_protocol_keeps_its_guarantees_at_every_tick() {
    keeps_its_guarantees(REAL, EVERY_TICK, WITHIN_ALLOWANCE);
}

/// Checks every property and returns the examples' paths.
fn keeps_its_guarantees(
    mechanism: Mechanism,
    bounds: Bounds,
    beyond: DriftBeyond,
) -> Vec<(&'static str, Vec<Action>)> {
    let checker = check(mechanism, bounds, beyond, false);
    // Every `always` holds in every state; every `sometimes` has an example.
    checker.assert_properties();
    EXAMPLES
        .into_iter()
        .map(|name| {
            let actions = checker.assert_any_discovery(name).into_actions();
            println!("{name}: {actions:?}");
            (name, actions)
        })
        .collect()
}

/// Whether a control (a mechanism removed, or the server's clock beyond
/// the allowance) skips itself: on CI's second pass (Valkey,
/// `LEASEHOLD_SECOND_PASS=1`), since it never talks to a server and ran on
/// the first. The check of the real protocol and the replay run on both
/// passes: the replay runs the scripts on that pass's server.
fn control_skipped(control: &str) -> bool {
    leasehold_testkit::skip_on_second_pass(control)
}

/// Prints a counterexample and checks that it is one.
fn counterexample(mechanism: Mechanism, beyond: DriftBeyond, property: &'static str) {
    if control_skipped(&format!("{mechanism:?}, {beyond:?} beyond the allowance")) {
        return;
    }
    let checker = check(mechanism, CI, beyond, true);
    let path = checker.assert_any_discovery(property);
    println!("{property}, counterexample: {:?}", path.last_state());
    println!("  actions: {:?}", path.into_actions());
}

/// The model's token fires where the watchdog's does: 176 ms (44 ticks)
/// after the send of an acquisition or a renewal, which is also what
/// `LeaseOptions::deadline_after` documents.
#[test]
fn the_model_times_tokens_as_the_watchdog_does() {
    let (ttl, options) = ttl_and_options();
    let model = Protocol::new(REAL, CI, WITHIN_ALLOWANCE);
    let documented = ticks(options.deadline_after());
    assert_eq!(
        (model.deadline_after_grant, model.deadline_after_renewal),
        (documented, documented)
    );
    assert_eq!(documented, 44);
    assert_eq!(
        (model.ttl, model.server_drift),
        (ticks(ttl.get()), ticks(clock_drift(ttl.get())))
    );
}

/// The safety margin of the model's lease (20 ms, 5 ticks).
fn margin() -> Duration {
    ttl_and_options().1.safety_margin()
}

#[test]
fn without_drift_allowance_and_margin_two_clients_believe() {
    counterexample(
        Mechanism {
            drift_allowance: false,
            safety_margin: false,
            ..REAL
        },
        WITHIN_ALLOWANCE,
        "mutual exclusion among believers",
    );
}

/// Drift alone, every mechanism kept: a server clock that runs fast by
/// more than the allowance and the margin together expires the key while
/// its holder still believes.
#[test]
fn drift_beyond_the_allowance_and_the_margin_breaks_exclusion() {
    counterexample(REAL, margin() + TICK, "mutual exclusion among believers");
}

/// The bound is exact: drift beyond the allowance by up to the margin is
/// covered (a key may expire at the very instant its token fires).
#[test]
fn the_margin_covers_drift_up_to_itself_beyond_the_allowance() {
    if control_skipped("the_margin_covers_drift_up_to_itself_beyond_the_allowance") {
        return;
    }
    keeps_its_guarantees(REAL, CI, margin());
}

/// Prediction: at this ttl the 20 ms margin alone covers the 4 ms drift
/// the allowance is for, so removing the allowance alone, with the server's
/// clock within it, breaks nothing.
#[test]
fn without_the_drift_allowance_the_margin_covers_drift_within_it() {
    if control_skipped("without_the_drift_allowance_the_margin_covers_drift_within_it") {
        return;
    }
    keeps_its_guarantees(
        Mechanism {
            drift_allowance: false,
            ..REAL
        },
        CI,
        WITHIN_ALLOWANCE,
    );
}

/// ... but the allowance is not redundant: the drift that the real
/// protocol covers (the allowance plus the margin) breaks exclusion
/// without it.
#[test]
fn without_the_drift_allowance_drift_up_to_the_margin_breaks_exclusion() {
    counterexample(
        Mechanism {
            drift_allowance: false,
            ..REAL
        },
        margin(),
        "mutual exclusion among believers",
    );
}

#[test]
fn counting_from_the_reply_lets_two_clients_believe() {
    counterexample(
        Mechanism {
            count_from_send: false,
            ..REAL
        },
        WITHIN_ALLOWANCE,
        "mutual exclusion among believers",
    );
}

#[test]
fn without_the_time_floor_a_restart_repeats_tokens() {
    counterexample(
        Mechanism {
            time_floor: false,
            ..REAL
        },
        WITHIN_ALLOWANCE,
        "fencing tokens strictly increase",
    );
}
