//! Requests of one kind that are in flight together go out as one call.
//!
//! A [`Coalescer`] keeps one *lane* per connection (per cluster slot on a
//! cluster, since one script may only touch keys of one slot). A request
//! that finds its lane idle is sent at once, alone: a lone acquisition is
//! never held back to wait for company. A request that finds a call of its
//! kind in flight on its lane waits; when that call's reply is in, the
//! requests that waited meanwhile (at most `cap`) go out together as the
//! lane's next call, and each caller gets its own outcome. So the server
//! runs one script and writes one reply for many requests. A lane has at
//! most `calls` calls in flight (see [`Coalescer::calls_in_flight`]): with
//! one, a request that arrives just after a call went out waits for that
//! call's whole round trip before its own starts; with two, the client and
//! the server work at the same time, as a pipeline does.
//!
//! No task is spawned: each call is sent by the future of one of its own
//! callers, the *driver* (the lone caller, or the first of a batch). When
//! its reply is in, the driver hands every other caller its outcome and
//! hands the lane to the first waiting caller, which drives the next batch;
//! then it returns its own outcome.
//!
//! Dropping futures is safe at every point:
//! - a waiting caller whose future is dropped takes its request out of the
//!   lane: it is never sent;
//! - a caller dropped after it was picked to drive passes the lane on;
//! - a driver dropped while its call is out (its caller gave up) leaves
//!   the call's effect unknown for every request in it, as a dropped single
//!   call does: the others get [`Abandoned::Unknown`].

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::cluster_routing::Slot;
use tokio::sync::oneshot;

/// A lane: the cluster slot of its requests' leases, `None` off a cluster
/// (one connection, one lane).
pub(crate) type Lane = Option<Slot>;

/// Why a request got no outcome of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    /// It waited longer than the bound for its turn: it was not sent.
    NotSent,
    /// The call it went out in was dropped before its reply came: its
    /// effect is unknown.
    Unknown,
}

/// The lanes of one kind of request `R`, whose outcome is `O`.
pub(crate) struct Coalescer<R, O> {
    lanes: Mutex<Lanes<R, O>>,
    /// The most requests in one call.
    cap: usize,
    /// The most calls in flight on one lane.
    calls: usize,
}

struct Lanes<R, O> {
    /// Lanes with a call in flight; an idle lane has no entry.
    busy: HashMap<Lane, Busy<R, O>>,
    /// Names each waiting request, so that a dropped caller can find its own.
    next_id: u64,
}

/// A lane with calls in flight.
struct Busy<R, O> {
    /// Calls in flight (or about to be sent by a caller picked to drive).
    calls: usize,
    /// Requests waiting for a call of their own.
    queue: VecDeque<Waiting<R, O>>,
}

struct Waiting<R, O> {
    id: u64,
    request: R,
    turn: oneshot::Sender<Turn<R, O>>,
}

/// A request put in its lane's queue: its id, and where its turn comes.
type Queued<R, O> = (u64, oneshot::Receiver<Turn<R, O>>);

/// What a waiting caller is told.
enum Turn<R, O> {
    /// Its outcome.
    Done(O),
    /// Its turn to send: its own request, then these.
    Drive(R, Vec<Waiting<R, O>>),
}

impl<R, O> Coalescer<R, O> {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            lanes: Mutex::new(Lanes {
                busy: HashMap::new(),
                next_id: 0,
            }),
            cap: cap.max(1),
            calls: 1,
        }
    }

    /// Lets each lane have up to `calls` calls in flight (at least one).
    pub(crate) fn calls_in_flight(mut self, calls: usize) -> Self {
        self.calls = calls.max(1);
        self
    }

    fn lanes(&self) -> MutexGuard<'_, Lanes<R, O>> {
        // Every update leaves the lanes whole; a panic elsewhere cannot tear them.
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `request` on `lane`, alone if the lane is idle, else with the
    /// requests that wait with it once the call in flight is done. `send`
    /// makes one call for a batch (this request first) and returns one
    /// outcome per request, in order; it is run at most once, and only when
    /// this caller drives. A caller that waits longer than `patience` for
    /// its turn gives up unsent.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the request is sent takes it out of the
    /// lane; after, its effect is unknown, as for a single call.
    pub(crate) async fn run<F>(
        &self,
        lane: Lane,
        request: R,
        patience: Duration,
        send: F,
    ) -> Result<O, Abandoned>
    where
        F: AsyncFnOnce(Vec<R>) -> Vec<O>,
    {
        // Boxed, here and below: a driver's state (the call's future: the
        // script, the connection's request, the op timeout) is most of a
        // caller's, and only a driver needs it. Unboxed, every caller
        // waiting in a lane, and every future that awaits one, would be as
        // large as a driver. (What `enqueue` and `wait` return is taken
        // apart in `let` statements, so that none of it is kept across the
        // awaits that follow.)
        let (id, rx) = match self.enqueue(lane, request) {
            Ok(waiting) => waiting,
            // The lane had room: sent at once, alone.
            Err(request) => return Box::pin(self.drive(lane, request, Vec::new(), send)).await,
        };
        let turn = self.wait(lane, id, rx, patience).await?;
        let (own, others) = match turn {
            Turn::Done(outcome) => return Ok(outcome),
            Turn::Drive(own, others) => (own, others),
        };
        Box::pin(self.drive(lane, own, others, send)).await
    }

    /// Puts `request` in `lane`'s queue (`Ok`: its id and where its turn
    /// comes), or gives it back when the lane has room for a call (`Err`:
    /// the caller sends it at once, alone).
    fn enqueue(&self, lane: Lane, request: R) -> Result<Queued<R, O>, R> {
        let mut lanes = self.lanes();
        let Lanes { busy, next_id } = &mut *lanes;
        match busy.get_mut(&lane) {
            None => {
                busy.insert(
                    lane,
                    Busy {
                        calls: 1,
                        queue: VecDeque::new(),
                    },
                );
                Err(request)
            }
            // Room for another call: this one goes at once, alone.
            Some(lane) if lane.calls < self.calls => {
                lane.calls += 1;
                Err(request)
            }
            Some(Busy { queue, .. }) => {
                let (tx, rx) = oneshot::channel();
                let id = *next_id;
                *next_id += 1;
                queue.push_back(Waiting {
                    id,
                    request,
                    turn: tx,
                });
                Ok((id, rx))
            }
        }
    }

    /// Waits for an outcome or a turn to drive. Holds only the waiter and
    /// its timer, so that a caller waiting in a lane stays small.
    async fn wait(
        &self,
        lane: Lane,
        id: u64,
        rx: oneshot::Receiver<Turn<R, O>>,
        patience: Duration,
    ) -> Result<Turn<R, O>, Abandoned> {
        let mut waiter = Waiter {
            coalescer: self,
            lane,
            id,
            rx: Some(rx),
        };
        // `if let`, not `match`: the timeout's result is dropped before the
        // second wait, instead of being kept across it.
        let turn = if let Ok(turn) = tokio::time::timeout(patience, waiter.turn()).await {
            turn
        } else if waiter.withdraw() {
            // Not picked yet: leave unsent.
            return Err(Abandoned::NotSent);
        } else {
            // Picked meanwhile: the call it is in is bounded, so wait for it.
            waiter.turn().await
        };
        // The turn is taken: dropping the waiter now must not look for it.
        waiter.rx = None;
        // `None`: the batch's driver was dropped with the call out.
        turn.ok_or(Abandoned::Unknown)
    }

    /// Sends `own` with `others` as one call, hands out the outcomes and
    /// the lane, and returns `own`'s outcome.
    async fn drive<F>(
        &self,
        lane: Lane,
        own: R,
        others: Vec<Waiting<R, O>>,
        send: F,
    ) -> Result<O, Abandoned>
    where
        F: AsyncFnOnce(Vec<R>) -> Vec<O>,
    {
        // Until the outcomes are handed out, a drop passes the lane on (and
        // drops the others' senders: their outcome is unknown).
        let mut driver = Driver {
            coalescer: self,
            lane,
            armed: true,
        };
        let mut turns = Vec::with_capacity(others.len());
        let mut requests = Vec::with_capacity(others.len() + 1);
        requests.push(own);
        for waiting in others {
            requests.push(waiting.request);
            turns.push(waiting.turn);
        }
        let count = requests.len();
        let mut outcomes = send(requests).await.into_iter();
        debug_assert_eq!(outcomes.len(), count);
        let own = outcomes.next();
        for (turn, outcome) in turns.into_iter().zip(outcomes) {
            // A caller that is gone has nothing to be told.
            let _ = turn.send(Turn::Done(outcome));
        }
        driver.armed = false;
        self.hand_on(lane);
        // `send` returns one outcome per request; a short reply would be a
        // bug here, and leaves the missing ones unknown rather than panic.
        own.ok_or(Abandoned::Unknown)
    }

    /// Gives the call that ended the lane's place to the first waiting
    /// caller with the others that wait (up to the cap), or frees it (the
    /// lane is idle when no call is left).
    fn hand_on(&self, lane: Lane) {
        let mut lanes = self.lanes();
        self.hand_on_locked(&mut lanes, lane, Vec::new());
    }

    /// As [`hand_on`](Self::hand_on), starting with `batch` (requests
    /// already taken out of the lane) when it is not empty.
    fn hand_on_locked(&self, lanes: &mut Lanes<R, O>, lane: Lane, mut batch: Vec<Waiting<R, O>>) {
        loop {
            if batch.is_empty() {
                let Some(busy) = lanes.busy.get_mut(&lane) else {
                    return;
                };
                if busy.queue.is_empty() {
                    busy.calls = busy.calls.saturating_sub(1);
                    if busy.calls == 0 {
                        lanes.busy.remove(&lane);
                    }
                    return;
                }
                let take = busy.queue.len().min(self.cap);
                batch = busy.queue.drain(..take).collect();
            }
            // Sent under the lock: a waiter being dropped takes the lock
            // before it looks for its turn, so it finds this one.
            let first = batch.remove(0);
            match first.turn.send(Turn::Drive(first.request, batch)) {
                Ok(()) => return,
                // Its caller is gone: the next one drives instead.
                Err(Turn::Drive(_, back)) => batch = back,
                Err(Turn::Done(_)) => return,
            }
        }
    }
}

/// A caller waiting on its lane.
struct Waiter<'a, R, O> {
    coalescer: &'a Coalescer<R, O>,
    lane: Lane,
    id: u64,
    rx: Option<oneshot::Receiver<Turn<R, O>>>,
}

impl<R, O> Waiter<'_, R, O> {
    /// The next turn; `None` when the batch's driver dropped its sender.
    async fn turn(&mut self) -> Option<Turn<R, O>> {
        match &mut self.rx {
            Some(rx) => rx.await.ok(),
            None => None,
        }
    }

    /// Takes the request out of its lane if it is still waiting there.
    fn withdraw(&mut self) -> bool {
        let mut lanes = self.coalescer.lanes();
        let Some(busy) = lanes.busy.get_mut(&self.lane) else {
            return false;
        };
        match busy.queue.iter().position(|w| w.id == self.id) {
            Some(at) => {
                busy.queue.remove(at);
                self.rx = None;
                true
            }
            None => false,
        }
    }
}

impl<R, O> Drop for Waiter<'_, R, O> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut lanes = self.coalescer.lanes();
        if let Some(busy) = lanes.busy.get_mut(&self.lane)
            && let Some(at) = busy.queue.iter().position(|w| w.id == self.id)
        {
            busy.queue.remove(at);
            return;
        }
        // Picked already. A turn to drive must not be lost with this
        // caller: the others of its batch are passed on.
        if let Ok(Turn::Drive(_, others)) = rx.try_recv() {
            self.coalescer.hand_on_locked(&mut lanes, self.lane, others);
        }
    }
}

/// Passes the lane on if the driver is dropped with its call out.
struct Driver<'a, R, O> {
    coalescer: &'a Coalescer<R, O>,
    lane: Lane,
    armed: bool,
}

impl<R, O> Drop for Driver<'_, R, O> {
    fn drop(&mut self) {
        if self.armed {
            self.coalescer.hand_on(self.lane);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use futures_util::FutureExt;
    use tokio::sync::Semaphore;

    use super::*;

    const PATIENCE: Duration = Duration::from_secs(60);

    /// What the calls sent, and a gate that holds each call until a permit
    /// is added.
    struct Calls {
        sent: Mutex<Vec<Vec<u32>>>,
        gate: Semaphore,
    }

    impl Calls {
        fn new() -> Self {
            Self {
                sent: Mutex::new(Vec::new()),
                gate: Semaphore::new(0),
            }
        }

        fn sent(&self) -> Vec<Vec<u32>> {
            self.sent.lock().unwrap().clone()
        }
    }

    /// One call: logs its batch, waits at the gate, answers ten times each request.
    fn call(calls: &Calls) -> impl AsyncFnOnce(Vec<u32>) -> Vec<u32> + '_ {
        async move |batch: Vec<u32>| {
            calls.sent.lock().unwrap().push(batch.clone());
            calls.gate.acquire().await.unwrap().forget();
            batch.into_iter().map(|x| x * 10).collect()
        }
    }

    #[tokio::test]
    async fn a_lone_request_goes_alone_and_the_others_go_together_up_to_the_cap() {
        let (coalescer, calls) = (Coalescer::new(2), Calls::new());
        let mut runs: Vec<_> = (0..5)
            .map(|i| Box::pin(coalescer.run(None, i, PATIENCE, call(&calls))))
            .collect();
        for run in &mut runs {
            assert!(run.now_or_never().is_none());
        }
        // Only the first went out, alone; the others wait for its reply.
        assert_eq!(calls.sent(), [vec![0]]);
        calls.gate.add_permits(10);
        let outcomes = futures_util::future::join_all(runs).await;
        assert_eq!(outcomes, [Ok(0), Ok(10), Ok(20), Ok(30), Ok(40)]);
        assert_eq!(calls.sent(), [vec![0], vec![1, 2], vec![3, 4]]);
        // The lane is idle again: the next one goes at once, alone.
        let next = Box::pin(coalescer.run(None, 5, PATIENCE, call(&calls)));
        assert_eq!(next.now_or_never(), Some(Ok(50)));
        assert_eq!(calls.sent().last(), Some(&vec![5]));
    }

    #[tokio::test]
    async fn with_two_calls_in_flight_the_second_goes_at_once_and_the_rest_together() {
        let (coalescer, calls) = (Coalescer::new(8).calls_in_flight(2), Calls::new());
        let mut runs: Vec<_> = (0..5)
            .map(|i| Box::pin(coalescer.run(None, i, PATIENCE, call(&calls))))
            .collect();
        for run in &mut runs {
            assert!(run.now_or_never().is_none());
        }
        // Two calls out, each alone; the others wait for one of them.
        assert_eq!(calls.sent(), [vec![0], vec![1]]);
        calls.gate.add_permits(10);
        let outcomes = futures_util::future::join_all(runs).await;
        assert_eq!(outcomes, [Ok(0), Ok(10), Ok(20), Ok(30), Ok(40)]);
        assert_eq!(calls.sent(), [vec![0], vec![1], vec![2, 3, 4]]);
        // Idle again: two more go at once, each alone.
        let (a, b) = (
            Box::pin(coalescer.run(None, 5, PATIENCE, call(&calls))),
            Box::pin(coalescer.run(None, 6, PATIENCE, call(&calls))),
        );
        assert_eq!(futures_util::future::join(a, b).await, (Ok(50), Ok(60)));
        assert_eq!(calls.sent()[3..], [vec![5], vec![6]]);
    }

    #[tokio::test]
    async fn a_call_that_ends_with_another_still_out_keeps_the_lane_at_its_cap() {
        let (coalescer, calls) = (Coalescer::new(8).calls_in_flight(2), Calls::new());
        let mut first = Box::pin(coalescer.run(None, 0, PATIENCE, call(&calls)));
        let mut second = Box::pin(coalescer.run(None, 1, PATIENCE, call(&calls)));
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        assert_eq!(calls.sent(), [vec![0], vec![1]]);
        // The first call ends, nothing waiting: one call is still out.
        calls.gate.add_permits(1);
        assert_eq!(first.await, Ok(0));
        let mut third = Box::pin(coalescer.run(None, 2, PATIENCE, call(&calls)));
        let mut fourth = Box::pin(coalescer.run(None, 3, PATIENCE, call(&calls)));
        assert!((&mut third).now_or_never().is_none());
        assert!((&mut fourth).now_or_never().is_none());
        // The third makes two calls out again; the fourth waits.
        assert_eq!(calls.sent(), [vec![0], vec![1], vec![2]]);
        calls.gate.add_permits(10);
        assert_eq!(second.await, Ok(10));
        assert_eq!(third.await, Ok(20));
        assert_eq!(fourth.await, Ok(30));
    }

    /// A waiter whose patience runs out after it was picked into a batch
    /// waits for that batch's call: its request is out, so it is not
    /// reported as never sent.
    #[tokio::test(start_paused = true)]
    async fn a_waiter_picked_into_a_batch_is_not_reported_unsent_when_its_patience_ends() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let short = Duration::from_millis(50);
        let mut first = Box::pin(coalescer.run(None, 0, PATIENCE, call(&calls)));
        assert!((&mut first).now_or_never().is_none());
        let mut second = Box::pin(coalescer.run(None, 1, short, call(&calls)));
        let mut third = Box::pin(coalescer.run(None, 2, short, call(&calls)));
        assert!((&mut second).now_or_never().is_none());
        assert!((&mut third).now_or_never().is_none());
        // The first call ends; the second drives the batch [1, 2], held
        // at the gate.
        calls.gate.add_permits(1);
        assert_eq!(first.await, Ok(0));
        assert!((&mut second).now_or_never().is_none());
        assert_eq!(calls.sent(), [vec![0], vec![1, 2]]);
        // The third's patience ends while its batch is out.
        tokio::time::advance(short + Duration::from_millis(10)).await;
        assert!(
            (&mut third).now_or_never().is_none(),
            "a request in a call out was reported as never sent"
        );
        calls.gate.add_permits(10);
        assert_eq!(second.await, Ok(10));
        assert_eq!(third.await, Ok(20));
    }

    #[tokio::test]
    async fn lanes_do_not_wait_for_each_other() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let (a, b) = (Some(Slot::for_key("a")), Some(Slot::for_key("b")));
        let mut first = Box::pin(coalescer.run(a, 1, PATIENCE, call(&calls)));
        let mut second = Box::pin(coalescer.run(b, 2, PATIENCE, call(&calls)));
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        // Each went out at once, alone, though the other is still out.
        assert_eq!(calls.sent(), [vec![1], vec![2]]);
        calls.gate.add_permits(2);
        assert_eq!((first.await, second.await), (Ok(10), Ok(20)));
    }

    #[tokio::test]
    async fn a_waiting_request_whose_caller_is_gone_is_never_sent() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let mut runs: Vec<_> = (0..4)
            .map(|i| Box::pin(coalescer.run(None, i, PATIENCE, call(&calls))))
            .collect();
        for run in &mut runs {
            assert!(run.now_or_never().is_none());
        }
        // The middle one of the three waiting is gone.
        drop(runs.remove(2));
        calls.gate.add_permits(10);
        let outcomes = futures_util::future::join_all(runs).await;
        assert_eq!(outcomes, [Ok(0), Ok(10), Ok(30)]);
        assert_eq!(calls.sent(), [vec![0], vec![1, 3]]);
    }

    #[tokio::test]
    async fn a_caller_gone_when_picked_to_send_passes_its_turn_on() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let mut runs: Vec<_> = (0..3)
            .map(|i| Box::pin(coalescer.run(None, i, PATIENCE, call(&calls))))
            .collect();
        for run in &mut runs {
            assert!(run.now_or_never().is_none());
        }
        calls.gate.add_permits(1);
        let last = runs.pop().unwrap();
        let picked = runs.pop().unwrap();
        // The first call's reply: the second caller is picked to send the
        // next batch, and is gone before it could.
        assert_eq!(runs.pop().unwrap().await, Ok(0));
        drop(picked);
        calls.gate.add_permits(10);
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), last).await,
            Ok(Ok(20))
        );
        assert_eq!(calls.sent(), [vec![0], vec![2]]);
    }

    #[tokio::test]
    async fn a_call_dropped_while_out_leaves_its_batch_unknown_and_frees_the_lane() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let mut runs: Vec<_> = (0..4)
            .map(|i| Box::pin(coalescer.run(None, i, PATIENCE, call(&calls))))
            .collect();
        for run in &mut runs {
            assert!(run.now_or_never().is_none());
        }
        calls.gate.add_permits(1);
        let mut rest = runs.split_off(1);
        assert_eq!(runs.pop().unwrap().await, Ok(0));
        // The second caller sends the batch of the three, then is gone
        // with the call out.
        assert!((&mut rest[0]).now_or_never().is_none());
        assert_eq!(calls.sent(), [vec![0], vec![1, 2, 3]]);
        drop(rest.remove(0));
        for run in rest {
            let outcome = tokio::time::timeout(Duration::from_secs(10), run).await;
            assert_eq!(outcome, Ok(Err(Abandoned::Unknown)));
        }
        // The lane is free: the next request goes at once.
        calls.gate.add_permits(1);
        let next = coalescer.run(None, 4, PATIENCE, call(&calls));
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(10), next).await,
            Ok(Ok(40))
        );
        assert_eq!(calls.sent().last(), Some(&vec![4]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_waits_too_long_gives_up_unsent() {
        let (coalescer, calls) = (Coalescer::new(8), Calls::new());
        let mut first = Box::pin(coalescer.run(None, 0, PATIENCE, call(&calls)));
        assert!((&mut first).now_or_never().is_none());
        let started = tokio::time::Instant::now();
        let waited = coalescer
            .run(None, 1, Duration::from_secs(1), call(&calls))
            .await;
        assert_eq!(waited, Err(Abandoned::NotSent));
        // It gave up at its patience (the paused clock jumps to the timer),
        // not at some later bound.
        let gave_up_after = started.elapsed();
        assert!(
            gave_up_after >= Duration::from_secs(1) && gave_up_after < Duration::from_secs(2),
            "gave up after {gave_up_after:?}"
        );
        calls.gate.add_permits(10);
        assert_eq!(first.await, Ok(0));
        assert_eq!(calls.sent(), [vec![0]]);
    }

    /// A caller's future does not carry the call's state: only a driver
    /// needs it, and it is boxed there. (With the call's future inline,
    /// every caller waiting in a lane would be as large as the call.)
    #[tokio::test]
    async fn a_caller_does_not_carry_the_calls_state() {
        let coalescer = Coalescer::<u32, u32>::new(4);
        // A call whose future keeps 4 KiB across its await.
        let heavy = async |batch: Vec<u32>| {
            let scratch = [1u8; 4096];
            tokio::task::yield_now().await;
            batch
                .iter()
                .map(|x| x + u32::from(scratch[4095]))
                .collect::<Vec<_>>()
        };
        let run = coalescer.run(None, 1, PATIENCE, heavy);
        let size = std::mem::size_of_val(&run);
        assert!(size < 1024, "a caller's future is {size} bytes");
        assert_eq!(run.await, Ok(2));
    }
}
