//! Model check of the races between a lease's handle and the watchdog.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p leasehold-watchdog --lib --release loom`.
//!
//! [`Record`] is the real code, on loom's atomics. Around it, each loom
//! thread mirrors one side of `lease.rs` / `shared.rs` / `renewal.rs`, step
//! for step:
//!
//! - the *watchdog* applies renewal replies (`Shared::renewed`), ends the
//!   lease (`Watchdog::end`: the token is cancelled iff `end` returns true,
//!   and the hold time is recorded once per entry), shuts down
//!   (`stop_all`: close the command channel, drain it, end with `Shutdown`,
//!   release on the server), and handles the handle's commands (`Forget`,
//!   `Release`, `ReleaseOrphan`) in the order they were sent;
//! - the *handle* releases (`Lease::release`: claim, then release on the
//!   server and send `Forget`; or, if the watchdog ended the lease first,
//!   send `Release`), is dropped (send `Release`), or has its release future
//!   dropped in flight (the `OrphanGuard` sends `ReleaseOrphan`, then the
//!   `Forget` guard sends `Forget`, in that drop order);
//! - a *reader* looks at the lease as a holder would (`Lease::lost`,
//!   `valid_until`, `renewals`).
//!
//! `Forget` (and the registration) reach the real watchdog through its
//! registry, which it reads before each command, rather than through the
//! command channel as modelled here. The model's order is still faithful:
//! a handle sends `Forget` or `Release`, never both, and `ReleaseOrphan`
//! does not touch the entry, so reading a `Forget` ahead of the commands
//! sent before it changes no outcome.
//!
//! The cancellation token is not loom-aware, so it is modelled by an atomic
//! flag set with release ordering by whoever's `end` returned true: no real
//! token promises less.

// A poisoned lock or a panicked thread is a failure to report as such.
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use crate::loss::LossReason;
use crate::record::Record;

/// The validity (ns after the acquisition) of the acquisition and of each
/// renewal, in order: each renewal counts from a later send.
const VALIDITY: [u64; 3] = [1_000, 1_400, 1_800];

/// What reaches the watchdog from its side: replies, timers, shutdown.
#[derive(Clone, Copy, Debug)]
enum Event {
    /// A renewal reply `Renewed`, earning `VALIDITY[n]`.
    Renewed(usize),
    /// A reply `Lost`, a deadline, or the renewal cap.
    End(LossReason),
    Shutdown,
}

/// What the handle does with the lease.
#[derive(Clone, Copy, Debug)]
enum Handle {
    Release,
    Drop,
    /// `release()` whose future is dropped before the server answers.
    ReleaseAbandoned,
}

#[derive(Debug)]
enum Command {
    Forget,
    Release,
    ReleaseOrphan,
}

/// The lease as both sides see it, and what the checks count.
struct World {
    record: Record,
    /// The holder's cancellation token.
    token: AtomicBool,
    /// The watchdog's command channel: closed at shutdown, FIFO.
    commands: Mutex<Channel>,
    /// Signalled on every send, and when the handle is done.
    wake: Condvar,
    /// Hold times recorded (the lease's one "ended" metric).
    endings: AtomicUsize,
    /// Compare-and-deletes sent to the server for this holder.
    server_releases: AtomicUsize,
    /// The handle's claim succeeded.
    claimed: AtomicBool,
}

impl World {
    fn new() -> Self {
        Self {
            record: Record::new(VALIDITY[0]),
            token: AtomicBool::new(false),
            commands: Mutex::new(Channel::default()),
            wake: Condvar::new(),
            endings: AtomicUsize::new(0),
            server_releases: AtomicUsize::new(0),
            claimed: AtomicBool::new(false),
        }
    }

    /// `UnboundedSender::send`: fails once the watchdog closed the channel.
    fn send(&self, command: Command) -> bool {
        let mut channel = self.commands.lock().unwrap();
        if channel.closed {
            return false;
        }
        channel.queue.push_back(command);
        self.wake.notify_one();
        true
    }

    fn try_recv(&self) -> Option<Command> {
        self.commands.lock().unwrap().queue.pop_front()
    }

    /// The next command, waiting for one; `None` once the handle is done
    /// and every command it sent was taken.
    fn recv(&self) -> Option<Command> {
        let mut channel = self.commands.lock().unwrap();
        loop {
            if let Some(command) = channel.queue.pop_front() {
                return Some(command);
            }
            if channel.handle_done {
                return None;
            }
            channel = self.wake.wait(channel).unwrap();
        }
    }

    /// The handle will send nothing more (it was dropped or returned).
    fn handle_done(&self) {
        self.commands.lock().unwrap().handle_done = true;
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct Channel {
    closed: bool,
    queue: VecDeque<Command>,
    handle_done: bool,
}

/// The watchdog's entry for the lease.
struct Entry {
    /// Mirrors `Entry::ended`: the hold time is recorded once.
    ended: bool,
}

impl Entry {
    fn finish(&mut self, world: &World) {
        if !self.ended {
            self.ended = true;
            world.endings.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Watchdog {
    world: Arc<World>,
    entry: Option<Entry>,
    /// The reasons `end` was called with, in order.
    tried: Vec<LossReason>,
    /// The reason whose `end` returned true.
    won: Option<LossReason>,
}

impl Watchdog {
    /// `Watchdog::end`, without the metrics.
    fn end(&mut self, reason: LossReason) {
        let Some(entry) = self.entry.as_mut() else {
            return; // released or forgotten: no place of it fires any more
        };
        self.tried.push(reason);
        if self.world.record.end(reason) {
            entry.finish(&self.world);
            self.won = Some(reason);
            self.world.token.store(true, Ordering::Release);
        }
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Forget => self.entry = None,
            Command::Release => {
                if let Some(mut entry) = self.entry.take() {
                    entry.finish(&self.world);
                    self.world.server_releases.fetch_add(1, Ordering::Relaxed);
                }
            }
            Command::ReleaseOrphan => {
                self.world.server_releases.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn drain(&mut self) {
        while let Some(command) = self.world.try_recv() {
            self.on_command(command);
        }
    }

    /// Runs the events, handling commands between them as they come.
    fn run(&mut self, events: &[Event]) {
        for event in events {
            self.drain();
            match *event {
                Event::Renewed(n) => {
                    if self.entry.is_some() {
                        self.world.record.renewed(VALIDITY[n]);
                    }
                }
                Event::End(reason) => self.end(reason),
                Event::Shutdown => {
                    // Take what was sent before the shutdown; later sends fail.
                    self.world.commands.lock().unwrap().closed = true;
                    self.drain();
                    // stop_all
                    if self.entry.is_some() {
                        self.end(LossReason::Shutdown);
                        self.world.server_releases.fetch_add(1, Ordering::Relaxed);
                        self.entry = None;
                    }
                    return;
                }
            }
        }
        // Keep running until the handle has said its last word.
        while let Some(command) = self.world.recv() {
            self.on_command(command);
        }
    }
}

fn handle(world: &World, how: Handle) {
    match how {
        Handle::Drop => {
            let _ = world.send(Command::Release);
        }
        Handle::Release | Handle::ReleaseAbandoned => {
            if world.record.claim_release() {
                world.claimed.store(true, Ordering::Relaxed);
                // The handle records the hold time as "released".
                world.endings.fetch_add(1, Ordering::Relaxed);
                if matches!(how, Handle::Release) {
                    world.server_releases.fetch_add(1, Ordering::Relaxed);
                } else {
                    // Dropped in flight: `abandoned` drops before `_forget`.
                    let _ = world.send(Command::ReleaseOrphan);
                }
                let _ = world.send(Command::Forget);
            } else {
                // The watchdog ended it: the reason is there to read.
                assert!(world.record.loss().is_some(), "claim refused, no loss");
                // An error (manager stopped) is fine: shutdown released it.
                let _ = world.send(Command::Release);
            }
        }
    }
    world.handle_done();
}

/// A holder looking at its lease while the watchdog works.
fn reader(world: &World) {
    // `Lease::lost`: woken by the token, the reason is recorded.
    if world.token.load(Ordering::Acquire) {
        assert!(world.record.loss().is_some(), "token cancelled, no reason");
    }
    // A count comes with at least its renewal's validity...
    let count = world.record.renewals() as usize;
    let valid = world.record.valid_for_ns();
    let earned = VALIDITY.iter().position(|&v| v == valid);
    let Some(earned) = earned else {
        panic!("validity {valid} was never earned");
    };
    assert!(earned >= count, "{count} renewals but validity of {earned}");
    // ...and a validity with at most one renewal not yet counted.
    let valid = world.record.valid_for_ns();
    let count = world.record.renewals() as usize;
    let earned = VALIDITY
        .iter()
        .position(|&v| v == valid)
        .unwrap_or(usize::MAX);
    assert!(
        earned <= count + 1,
        "validity of {earned} with {count} renewals"
    );
}

fn check(how: Handle, events: &'static [Event], with_reader: bool) {
    let mut builder = loom::model::Builder::new();
    // Unbounded, the search takes hours; three preemptions take seconds
    // (four pass too, in about half a minute). `LOOM_MAX_PREEMPTIONS`
    // overrides.
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    // The interleavings explored, counted outside loom's world.
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let world = Arc::new(World::new());
        let watchdog = {
            let world = Arc::clone(&world);
            thread::spawn(move || {
                let mut watchdog = Watchdog {
                    world,
                    entry: Some(Entry { ended: false }),
                    tried: Vec::new(),
                    won: None,
                };
                watchdog.run(events);
                (watchdog.tried, watchdog.won, watchdog.entry.is_none())
            })
        };
        let holder = {
            let world = Arc::clone(&world);
            thread::spawn(move || handle(&world, how))
        };
        if with_reader {
            reader(&world);
        }
        holder.join().unwrap();
        let (tried, won, gone) = watchdog.join().unwrap();

        let loss = world.record.loss();
        let claimed = world.claimed.load(Ordering::Relaxed);
        // Exactly one ending: the hold time is recorded once, and the
        // record holds a claimed release or one loss reason, never both. A
        // dropped handle claims nothing: the watchdog releases it, unless
        // a loss came first.
        assert_eq!(
            world.endings.load(Ordering::Relaxed),
            1,
            "hold time recorded once"
        );
        assert!(!(claimed && loss.is_some()), "claimed and lost ({loss:?})");
        match how {
            Handle::Drop => assert!(!claimed),
            Handle::Release | Handle::ReleaseAbandoned => {
                assert!(claimed || loss.is_some(), "released with no ending");
            }
        }
        // The token fires iff a loss reason won, never after a claim.
        assert_eq!(world.token.load(Ordering::Relaxed), loss.is_some());
        assert_eq!(won, loss);
        // The first reason wins.
        if let Some(reason) = loss {
            assert_eq!(Some(&reason), tried.first(), "tried {tried:?}");
        }
        // Nothing is left behind: the server is asked to release the
        // lease, and the watchdog keeps no entry for it.
        assert!(
            world.server_releases.load(Ordering::Relaxed) >= 1,
            "never released"
        );
        assert!(gone, "the watchdog still keeps the lease");
    });
    let runs = runs.load(std::sync::atomic::Ordering::Relaxed);
    println!("{how:?} against {events:?}: {runs} interleavings");
}

const HANDLES: [Handle; 3] = [Handle::Release, Handle::Drop, Handle::ReleaseAbandoned];

/// A renewal reply, then `Lost`, racing the handle.
#[test]
fn loom_renewal_then_loss() {
    for how in HANDLES {
        check(
            how,
            &[Event::Renewed(1), Event::End(LossReason::Lost)],
            true,
        );
    }
}

/// Two renewals, then shutdown, racing the handle and a reader.
#[test]
fn loom_renewals_then_shutdown() {
    for how in HANDLES {
        check(
            how,
            &[Event::Renewed(1), Event::Renewed(2), Event::Shutdown],
            true,
        );
    }
}

/// A deadline, then shutdown: the first reason stays.
#[test]
fn loom_deadline_then_shutdown() {
    for how in HANDLES {
        check(
            how,
            &[Event::End(LossReason::Deadline), Event::Shutdown],
            false,
        );
    }
}

/// The renewal cap, then a late `Lost`: the first reason stays.
#[test]
fn loom_cap_then_lost() {
    for how in HANDLES {
        check(
            how,
            &[
                Event::End(LossReason::RenewalLimit),
                Event::End(LossReason::Lost),
            ],
            true,
        );
    }
}

/// Shutdown at once, racing a handle that may still be sending.
#[test]
fn loom_shutdown_races_the_handle() {
    for how in HANDLES {
        check(how, &[Event::Shutdown], true);
    }
}
