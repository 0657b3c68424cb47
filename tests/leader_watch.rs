//! Watching who leads an election on a real server, judged by the
//! server's own record (`MONITOR` on a side connection, `PEXPIRETIME`),
//! never by the library's numbers.
//!
//! - **Every change, in the server's order**: three candidates, each with
//!   a manager (and so connections) of its own, lead in turn and step down
//!   (release) [`TERMS`] times, and one term ends with the lease deleted
//!   behind its holder's back. Every candidate's watch and a manager that
//!   never campaigns must see every leader the server granted, in the
//!   order it granted them (the fencing tokens in its `SET`s), each grant
//!   and each release within [`BOUND`] of the server running it.
//! - **A leader cut off**: the leader reaches the server through the
//!   testkit proxy, which is switched to blackhole. The other observers
//!   must report it gone no later than [`EXPIRY_SLACK`] after the expiry
//!   the server holds for its key (`PEXPIRETIME`, read after the cut; the
//!   `MONITOR` record shows no renewal after it). The server runs its
//!   expiry cycle once a second (`hz 1`): the observers must not wait for
//!   the server to report the expiry.
//!
//! Both bounds are two-sided: an observer that reports a leader, or its
//! end, more than [`EARLY`] before the server's own record fails too.
//!
//! Instants are wall clock ([`SystemTime`]): the server stamps `MONITOR`
//! lines with the same clock on this machine. Each test prints its
//! latencies: `cargo test --test leader_watch -- --nocapture`.

#[path = "common/server_clock.rs"]
#[allow(dead_code)] // this file uses part of it
mod server_clock;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::redis::RedisBackend;
use leasehold::redis::redis;
use leasehold::{CancellationToken, Election, Leader, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use server_clock::{Executed, Monitor, ms_after};
use tokio::sync::watch;
use tokio::time::{sleep, timeout};

type Error = Box<dyn std::error::Error + Send + Sync>;
type TestResult = Result<(), Error>;

/// How many terms the first test runs.
const TERMS: usize = 8;
/// How soon after the server ran a grant or a release every observer must
/// have seen it: a push (tracking or a release notice) and one read, on a
/// healthy server, with slack for two shared cores.
const BOUND: Duration = Duration::from_millis(50);
/// How soon after the server's expiry of a cut-off leader's key every
/// observer must report it gone: the fallback timer runs 2 ms past the
/// ttl read, then one read.
const EXPIRY_SLACK: Duration = Duration::from_millis(25);
/// How early an observer's record may come before the server's own: the
/// server's expiry is whole milliseconds (`PEXPIRETIME`) and it frees the
/// key only once its clock is past it, and a `MONITOR` line is stamped
/// when the command starts, so an honest observer is never more than the
/// rounding, 1 ms, before it. Earlier means it reported what had not yet
/// happened on the server.
const EARLY: f64 = 1.0;
/// The election's key, and where the server keeps it.
const KEY: &str = "scheduler";
const STORED: &str = "leasehold:{scheduler}";

/// What an observer saw: when (wall clock), and the leader's fencing token.
type Seen = Arc<Mutex<Vec<(SystemTime, Option<u64>)>>>;

/// Records every value `leader` takes, starting with the current one.
fn record(mut leader: watch::Receiver<Option<Leader>>) -> Seen {
    let token_of = |leader: &Option<Leader>| {
        leader
            .as_ref()
            .and_then(|l| l.fencing_token.map(|t| t.get()))
    };
    // The first value is read here, when the watch is made, not when the
    // recording task first runs: on a loaded machine that may be after the
    // first grant, and the watch's state before it would go unrecorded.
    let first = token_of(&leader.borrow_and_update());
    let seen: Seen = Arc::new(Mutex::new(vec![(SystemTime::now(), first)]));
    let out = Arc::clone(&seen);
    tokio::spawn(async move {
        while leader.changed().await.is_ok() {
            let token = token_of(&leader.borrow_and_update());
            let at = SystemTime::now();
            out.lock().expect("not poisoned").push((at, token));
        }
    });
    seen
}

fn seen_now(seen: &Seen) -> Vec<(SystemTime, Option<u64>)> {
    seen.lock().expect("not poisoned").clone()
}

/// Waits until `seen` shows `wanted` as its last value.
async fn until_seen(seen: &Seen, what: &str, wanted: impl Fn(Option<u64>) -> bool) -> TestResult {
    timeout(Duration::from_secs(10), async {
        while !seen_now(seen).last().is_some_and(|(_, t)| wanted(*t)) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .map_err(|_| format!("{what}: not seen within 10 s: {:?}", seen_now(seen)))?;
    Ok(())
}

async fn manager(url: String) -> Result<LeaseManager<RedisBackend>, Error> {
    let backend = RedisBackend::builder(url)
        .op_timeout(Duration::from_millis(200))
        .connect()
        .await?;
    Ok(LeaseManager::new(backend)?)
}

fn options(label: &str) -> Result<LeaseOptions, Error> {
    Ok(LeaseOptions::builder()
        .ttl(Ttl::parse("2s")?)
        .label(label)
        .build()?)
}

/// The fencing token in a stored lease value `<holder>:<token>:<label>`.
fn stored_token(value: &str) -> Option<u64> {
    value.split(':').nth(1)?.parse().ok()
}

/// The grants of the election's key the server ran, in its order: when,
/// and the fencing token.
fn grants(seen: &[Executed]) -> Vec<(SystemTime, u64)> {
    seen.iter()
        .filter(|e| e.by_script && e.sets(STORED))
        .filter_map(|e| Some((e.at, stored_token(e.args.get(2)?)?)))
        .collect()
}

/// When the server deleted the election's key (a release or a `DEL`).
fn deletions(seen: &[Executed]) -> Vec<SystemTime> {
    seen.iter()
        .filter(|e| {
            e.args
                .first()
                .is_some_and(|c| c.eq_ignore_ascii_case("DEL"))
                && e.args.get(1).is_some_and(|k| k == STORED)
        })
        .map(|e| e.at)
        .collect()
}

/// Median and worst of `figures` (milliseconds).
fn summary(figures: &mut [f64]) -> (f64, f64) {
    figures.sort_by(f64::total_cmp);
    (
        figures.get(figures.len() / 2).copied().unwrap_or(f64::NAN),
        figures.last().copied().unwrap_or(f64::NAN),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_observer_sees_every_leader_in_the_servers_order() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::start()?;
    let monitor = Monitor::start(server.addr()).await?;
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;

    let observer = manager(server.url()).await?;
    let mut watched = vec![(
        "observer".to_owned(),
        record(observer.watch_leader(KEY).await?),
    )];
    let mut elections = Vec::new();
    for i in 0..3 {
        let name = format!("candidate-{i}");
        let election = Election::new(manager(server.url()).await?, KEY, options(&name)?)?
            .pause(Duration::from_millis(100));
        watched.push((name, record(election.watch_leader().await?)));
        elections.push(Arc::new(election));
    }

    // Each term: lead 200 ms, then step down; the term before the last is
    // deleted on the server behind its holder's back instead.
    let terms = Arc::new(Mutex::new(0_usize));
    let stop = CancellationToken::new();
    // The fencing token of the term to delete, once it starts.
    let (delete, mut to_delete) = watch::channel(None::<u64>);
    let delete = Arc::new(delete);
    let mut runs = Vec::new();
    for election in &elections {
        let (election, terms, stop, delete) = (
            Arc::clone(election),
            Arc::clone(&terms),
            stop.clone(),
            Arc::clone(&delete),
        );
        runs.push(tokio::spawn(async move {
            election
                .run(stop.clone(), |work| {
                    let (token, fencing_token) = (work.token().clone(), work.fencing_token());
                    let (terms, stop, delete) =
                        (Arc::clone(&terms), stop.clone(), Arc::clone(&delete));
                    async move {
                        let term = {
                            let mut terms = terms.lock().expect("not poisoned");
                            *terms += 1;
                            *terms
                        };
                        if term == TERMS - 1 {
                            delete.send_replace(Some(fencing_token.get()));
                            // Lead until the watchdog learns of the deletion.
                            token.cancelled().await;
                        } else {
                            tokio::select! {
                                () = token.cancelled() => {}
                                () = sleep(Duration::from_millis(200)) => {}
                            }
                        }
                        if term == TERMS {
                            stop.cancel();
                        }
                    }
                })
                .await
        }));
    }
    let doomed = timeout(Duration::from_secs(30), to_delete.wait_for(Option::is_some))
        .await
        .map_err(|_| "the term to delete never came")??
        .ok_or("no token")?;
    // Deleted once every observer saw it: a term gone before an observer
    // could read it may rightly never show.
    for (name, seen) in &watched {
        until_seen(seen, name, |t| t == Some(doomed)).await?;
    }
    let _: i64 = redis::cmd("DEL").arg(STORED).query_async(&mut side).await?;
    for run in runs {
        timeout(Duration::from_secs(30), run)
            .await??
            .map_err(|e| e.to_string())?;
    }
    // The last step-down, seen by all, before the server's record is read.
    for (name, seen) in &watched {
        until_seen(seen, name, |t| t.is_none()).await?;
    }
    monitor.sync().await?;
    let executed = monitor.seen();
    let granted = grants(&executed);
    let deleted = deletions(&executed);
    assert_eq!(granted.len(), TERMS, "the server's grants: {granted:?}");
    assert!(
        granted.windows(2).all(|w| w[0].1 < w[1].1),
        "the server granted tokens out of order: {granted:?}"
    );
    assert_eq!(deleted.len(), TERMS, "the server's deletions: {deleted:?}");

    let (mut to_grant, mut to_end) = (Vec::new(), Vec::new());
    for (name, seen) in &watched {
        let seen = seen_now(seen);
        assert_eq!(seen[0].1, None, "{name}: a leader before the first grant");
        // Each term seen: its token, when it was seen, and when the next
        // value replaced it.
        let terms: Vec<(u64, SystemTime, Option<SystemTime>)> = seen
            .iter()
            .enumerate()
            .filter_map(|(i, (at, token))| {
                token.map(|token| (token, *at, seen.get(i + 1).map(|(next, _)| *next)))
            })
            .collect();
        assert_eq!(
            terms.iter().map(|t| t.0).collect::<Vec<_>>(),
            granted.iter().map(|g| g.1).collect::<Vec<_>>(),
            "{name} saw other leaders than the server granted, or in another order"
        );
        for (((token, start, end), (granted_at, _)), deleted_at) in
            terms.iter().zip(&granted).zip(&deleted)
        {
            let late = ms_after(*start, *granted_at);
            to_grant.push(late);
            assert!(
                (-EARLY..=BOUND.as_secs_f64() * 1e3).contains(&late),
                "{name} saw term {token} {late:.1} ms after the server granted it"
            );
            let end = end.ok_or_else(|| format!("{name}: term {token} never ended"))?;
            let late = ms_after(end, *deleted_at);
            to_end.push(late);
            assert!(
                (-EARLY..=BOUND.as_secs_f64() * 1e3).contains(&late),
                "{name} saw term {token} end {late:.1} ms after the server deleted it"
            );
        }
    }
    let (grant_median, grant_worst) = summary(&mut to_grant);
    let (end_median, end_worst) = summary(&mut to_end);
    println!(
        "leader seen after the server's grant: median {grant_median:.2} ms, worst {grant_worst:.2} ms; \
         gone after its deletion: median {end_median:.2} ms, worst {end_worst:.2} ms \
         ({} observations each)",
        to_grant.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_is_reported_gone_by_its_expiry_on_the_server() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let server = RedisServer::builder().arg("--hz").arg("1").start()?;
    let monitor = Monitor::start(server.addr()).await?;
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let link = Proxy::start(server.addr()).await?;

    let cut_off = Election::new(manager(link.url()).await?, KEY, options("cut-off")?)?;
    let others = [
        Election::new(manager(server.url()).await?, KEY, options("candidate-1")?)?,
        Election::new(manager(server.url()).await?, KEY, options("candidate-2")?)?,
    ];
    let observer = manager(server.url()).await?;
    let watched = [
        ("observer", record(observer.watch_leader(KEY).await?)),
        ("candidate-1", record(others[0].watch_leader().await?)),
        ("candidate-2", record(others[1].watch_leader().await?)),
    ];
    let lease = cut_off.campaign().await?;
    let token = lease.fencing_token().get();
    for (name, seen) in &watched {
        until_seen(seen, name, |t| t == Some(token)).await?;
    }
    // Let a renewal or two pass, so that the observers follow a renewed
    // lease (each renewal is reported to them, and they read it again).
    sleep(Duration::from_millis(1500)).await;

    link.set_mode(ProxyMode::Blackhole);
    let cut_at = SystemTime::now();
    let expiry_ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(STORED)
        .query_async(&mut side)
        .await?;
    let expiry = UNIX_EPOCH + Duration::from_millis(u64::try_from(expiry_ms)?);
    for (name, seen) in &watched {
        until_seen(seen, name, |t| t != Some(token)).await?;
    }
    // The server's record: the expiry read was the last one set (no
    // renewal reached the server after it).
    monitor.sync().await?;
    let last = monitor
        .last_ttl_set(STORED, SystemTime::now())
        .ok_or("the server never set the lease's ttl")?;
    // A renewal's PEXPIREAT names the expiry; a grant's SET … PX counts
    // its 2 s from when it ran.
    let set_by_last = match last.absolute_expiry() {
        Some(named) => ms_after(expiry, named),
        None => ms_after(expiry, last.at) - 2000.0,
    };
    assert!(
        set_by_last.abs() < 2.0,
        "the expiry read ({expiry:?}, after the cut at {cut_at:?}) is not the one the server's last ttl-setting command gave: {last:?}"
    );
    let mut lateness = Vec::new();
    for (name, seen) in &watched {
        let seen = seen_now(seen);
        let gone = seen
            .iter()
            .skip_while(|(_, t)| *t != Some(token))
            .find(|(_, t)| *t != Some(token))
            .ok_or_else(|| format!("{name} never saw the cut-off leader go"))?;
        let late = ms_after(gone.0, expiry);
        lateness.push(late);
        assert!(
            (-EARLY..=EXPIRY_SLACK.as_secs_f64() * 1e3).contains(&late),
            "{name} reported the cut-off leader gone {late:.1} ms after the server's expiry"
        );
    }
    assert!(
        !cut_off.is_leader(),
        "the cut-off leader still says it leads"
    );

    // A new leader, seen by everyone, as the server granted it.
    let new = others[0].campaign().await?;
    for (name, seen) in &watched {
        until_seen(seen, name, |t| t == Some(new.fencing_token().get())).await?;
    }
    monitor.sync().await?;
    let granted = grants(&monitor.seen());
    assert_eq!(
        granted.iter().map(|g| g.1).collect::<Vec<_>>(),
        [token, new.fencing_token().get()],
        "the server's grants"
    );
    let (median, worst) = summary(&mut lateness);
    println!(
        "cut-off leader reported gone after the server's expiry: median {median:.2} ms, worst {worst:.2} ms"
    );
    drop(lease);
    Ok(())
}
