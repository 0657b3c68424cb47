//! The lease client both campaigns run (tests/campaign.rs and
//! tests/campaign_failover.rs): acquire a random key, make fenced writes
//! while the token is live, release, and record it all in the history.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, LossReason, clock_drift};
use leasehold_testkit::{FENCED_WRITE_SCRIPT, History, HoldEnd};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The campaigns' result type: clients run on their own tasks.
pub(crate) type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// What the clients count beside the history.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) deadline_margins: Vec<Duration>,
    pub(crate) losses: BTreeMap<&'static str, usize>,
}

/// One client's part in a campaign.
pub(crate) struct Client {
    pub(crate) name: String,
    pub(crate) manager: LeaseManager<RedisBackend>,
    pub(crate) options: LeaseOptions,
    pub(crate) keys: usize,
    pub(crate) history: History,
    pub(crate) tally: Arc<Mutex<Tally>>,
    pub(crate) resource: redis::aio::MultiplexedConnection,
    pub(crate) stop: CancellationToken,
    pub(crate) rng: fastrand::Rng,
}

/// Acquire → fenced writes while the token is live → release, until stopped.
pub(crate) async fn client(mut c: Client) -> TestResult {
    let script = redis::Script::new(FENCED_WRITE_SCRIPT);
    let ttl = c.options.ttl().get();
    let renew = c.options.renew_interval();
    while !c.stop.is_cancelled() {
        let k = c.rng.usize(..c.keys);
        let key = format!("key{k}");
        let acquired = tokio::select! {
            biased;
            () = c.stop.cancelled() => break,
            acquired = c.manager.acquire(&key, &c.options) => acquired,
        };
        let Ok(lease) = acquired else {
            // Held by another client, or the server is unreachable: the
            // acquire already waited; try again at once.
            continue;
        };
        let acquired_at = Instant::now();
        // Before any renewal, valid_until is counted from the acquisition's sending.
        let requested_at = lease.valid_until() - (ttl - clock_drift(ttl));
        let token = lease.fencing_token().get();
        let hold = c
            .history
            .acquired(&key, &c.name, token, requested_at, acquired_at);

        // Notes the moment the token fires, on its own task so that a
        // write in flight does not delay the note.
        let fired = lease.token();
        let done = CancellationToken::new();
        let watcher = tokio::spawn({
            let done = done.clone();
            async move {
                tokio::select! {
                    biased;
                    () = fired.cancelled() => Some(Instant::now()),
                    () = done.cancelled() => None,
                }
            }
        });

        for _ in 0..c.rng.u32(2..=6) {
            if lease.token().is_cancelled() {
                break;
            }
            let accepted: i64 = script
                .key(format!("res:{k}"))
                .key(format!("res:{k}:log"))
                .arg(token)
                .arg(&c.name)
                .invoke_async(&mut c.resource)
                .await?;
            if accepted == 0 {
                c.history.resource_refused();
            }
            let pause = Duration::from_millis(c.rng.u64(0..=millis(renew * 2)));
            let live = lease.token();
            tokio::select! {
                () = live.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let releasing_at = Instant::now();
        done.cancel();
        match watcher.await? {
            Some(fired_at) => {
                let reason = lease.loss_reason().unwrap_or(LossReason::Lost);
                c.history.ended(
                    hold,
                    HoldEnd::Cancelled(reason.as_str().to_owned()),
                    fired_at,
                );
                let mut tally = c.tally.lock().map_err(|_| "tally poisoned")?;
                *tally.losses.entry(reason.as_str()).or_default() += 1;
                if reason == LossReason::Deadline {
                    // The server keeps the lease at least ttl after the last
                    // successful request was sent: valid_until + drift.
                    let expiry = lease.valid_until() + clock_drift(ttl);
                    tally
                        .deadline_margins
                        .push(expiry.saturating_duration_since(fired_at));
                }
            }
            None => c.history.ended(hold, HoldEnd::Released, releasing_at),
        }
        // Failures are fine: the lease then expires on its own.
        let _ = lease.release().await;
    }
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
