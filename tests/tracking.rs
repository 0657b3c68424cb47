//! Client tracking with the watchdog: leases stolen before their first
//! renewal, and a server whose tracking table is too small for the held
//! leases.

use std::time::Duration;

use leasehold::redis::{KeyLayout, RedisBackend, Topology};
use leasehold::{LeaseManager, LeaseOptions, LossReason, Ttl};
use leasehold_testkit::{RedisServer, SentinelSet};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One test of this file at a time: the storm of the full tracking table
/// keeps both cores busy, and the other tests time how soon a holder hears
/// of a theft.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether the server's renewal connection has tracking on (`t` among
/// its `CLIENT LIST` flags).
fn renewals_tracked(server: &RedisServer) -> Result<bool, Box<dyn std::error::Error>> {
    let list = server.cli(&["CLIENT", "LIST"])?;
    let line = list
        .lines()
        .find(|l| l.contains("name=leasehold-renew"))
        .ok_or("no renewal connection")?;
    let flags = line
        .split(' ')
        .find_map(|f| f.strip_prefix("flags="))
        .ok_or("no flags")?;
    Ok(flags.contains('t'))
}

/// Past `tracking-table-max-keys` the server evicts tracked keys and
/// reports each as changed; the renewal each report causes tracks the key
/// again and evicts another, without end. The backend must see the storm,
/// turn tracking off and keep every lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tracking_table_turns_tracking_off_and_every_lease_is_kept() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    const LEASES: usize = 3000;
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::builder()
        .arg("--tracking-table-max-keys")
        .arg("100")
        .start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    assert!(backend.tracks_lease_changes());
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let mut leases = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        leases.push(manager.acquire(&format!("many:{i}"), &options).await?);
    }
    // The first renewals (1 s after each acquisition) overflow the table.
    // No signal exists for the server-side state: poll it, bounded.
    let bound = Instant::now() + Duration::from_secs(30);
    while backend.tracks_lease_changes() || renewals_tracked(&server)? {
        assert!(
            Instant::now() < bound,
            "tracking still on after 30 s (backend: {}, server: {})",
            backend.tracks_lease_changes(),
            renewals_tracked(&server)?
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Two more ttls: every lease is renewed without tracking.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let lost: Vec<_> = leases
        .iter()
        .filter_map(|l| l.loss_reason().map(|r| (l.key().clone(), r)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} leases lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(leases.iter().all(|l| l.renewals() >= 2));
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// The number of keys in the server's tracking table (`INFO stats`).
fn tracked_keys(server: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    let stats = server.cli(&["INFO", "stats"])?;
    let value = stats
        .lines()
        .find_map(|l| l.strip_prefix("tracking_total_keys:"))
        .ok_or("no tracking_total_keys in INFO stats")?;
    Ok(value.trim().parse()?)
}

/// A renewal writes each lease (which drops its tracking) and must track
/// the whole batch again: after every lease was renewed, the server's own
/// tracking table holds every held lease, and nothing else (the fencing
/// counters are not tracked). Redis 7.0 tracks every key a script call
/// names on any read, Valkey only the keys the read names: both must end
/// with the whole batch tracked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_renewed_lease_stays_tracked() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    const LEASES: usize = 50;
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    assert!(backend.tracks_lease_changes());
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::with_ttl(Ttl::parse("3s")?);
    let mut leases = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        leases.push(manager.acquire(&format!("tracked:{i}"), &options).await?);
    }
    assert_eq!(tracked_keys(&server)?, LEASES as u64, "after the grants");
    // The renewal count has no signal to wait on: poll it, bounded.
    let bound = Instant::now() + Duration::from_secs(10);
    while leases.iter().any(|l| l.renewals() < 1) {
        assert!(Instant::now() < bound, "not every lease renewed in 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(backend.tracks_lease_changes());
    assert_eq!(tracked_keys(&server)?, LEASES as u64, "after the renewals");
    assert!(leases.iter().all(|l| l.loss_reason().is_none()));
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// How soon a holder must learn that its lease was overwritten or deleted,
/// from just before the command that did it was sent.
const NOTICE_BOUND: Duration = Duration::from_millis(50);
/// How long a test waits for a loss before calling it missed: far above
/// the bound, far below the first renewal (10 s in).
const MISSED: Duration = Duration::from_secs(2);
/// Leases stolen per test, each at its own random moment.
const RUNS: usize = 8;

/// How a lease is taken from its holder behind its back.
#[derive(Debug, Clone, Copy)]
enum Theft {
    /// `SET` by another client.
    Overwrite,
    /// `DEL` by another client.
    Delete,
}

/// Acquires [`RUNS`] leases with a 30 s ttl (renewed every 10 s) and takes
/// each from its holder, from a side connection to `master`, at a random
/// moment of its first renew interval: overwritten or deleted, in turn.
/// Returns, per theft, the time from just before the command was sent to
/// the holder's token firing.
///
/// The side command is the witness: `SET … GET` and `GETDEL` answer with
/// the value they replaced, which must be the holder's lease (its fencing
/// token), so the lease was still there, and still the holder's, when the
/// server took it away. Without tracking from the grant on, the holder
/// would learn of it at its first renewal, up to 10 s later.
async fn steal_in_first_interval(
    manager: &LeaseManager<RedisBackend>,
    master: &str,
    prefix: &str,
) -> Result<Vec<(Theft, Duration)>, Box<dyn std::error::Error>> {
    let options = LeaseOptions::with_ttl(Ttl::parse("30s")?);
    let interval = options.renew_interval();
    let side = redis::Client::open(master)?
        .get_multiplexed_async_connection()
        .await?;
    let mut runs = Vec::with_capacity(RUNS);
    for i in 0..RUNS {
        let theft = if i % 2 == 0 {
            Theft::Overwrite
        } else {
            Theft::Delete
        };
        let (manager, options, mut side) = (manager.clone(), options.clone(), side.clone());
        let name = format!("{prefix}:stolen:{i}");
        runs.push(tokio::spawn(async move {
            let lease = manager.acquire(&name, &options).await?;
            let offset = interval.mul_f64(fastrand::f64());
            tokio::time::sleep(offset).await;
            let redis_key = KeyLayout::default().lease(lease.key());
            assert_eq!(lease.loss_reason(), None, "{name} lost before the theft");
            let sent = Instant::now();
            let replaced: Option<String> = match theft {
                Theft::Overwrite => {
                    redis::cmd("SET")
                        .arg(&redis_key)
                        .arg("thief")
                        .arg("GET")
                        .query_async(&mut side)
                        .await?
                }
                Theft::Delete => {
                    redis::cmd("GETDEL")
                        .arg(&redis_key)
                        .query_async(&mut side)
                        .await?
                }
            };
            let token = format!(":{}:", lease.fencing_token().0);
            assert!(
                replaced.as_deref().is_some_and(|v| v.contains(&token)),
                "{name}: the {theft:?} replaced {replaced:?}, not the holder's lease"
            );
            let reason = tokio::time::timeout(MISSED, lease.lost())
                .await
                .map_err(|_| {
                    format!(
                        "{name}: {theft:?} {offset:?} after the grant not noticed within {MISSED:?}"
                    )
                })?;
            let noticed = sent.elapsed();
            assert_eq!(reason, LossReason::Lost, "{name}");
            println!("{name}: {theft:?} {offset:?} after the grant, noticed after {noticed:?}");
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((theft, noticed))
        }));
    }
    let mut noticed = Vec::with_capacity(RUNS);
    for run in runs {
        noticed.push(run.await?.map_err(|e| e.to_string())?);
    }
    Ok(noticed)
}

/// Prints the median and the worst time to notice, per kind of theft, and
/// checks every one against [`NOTICE_BOUND`].
fn check_noticed(topology: &str, noticed: &[(Theft, Duration)]) -> TestResult {
    for kind in [Theft::Overwrite, Theft::Delete] {
        let mut times: Vec<Duration> = noticed
            .iter()
            .filter(|(t, _)| std::mem::discriminant(t) == std::mem::discriminant(&kind))
            .map(|&(_, d)| d)
            .collect();
        times.sort();
        let (median, worst) = (times[times.len() / 2], times[times.len() - 1]);
        println!(
            "{topology}: {kind:?} noticed after {median:?} (median), {worst:?} (worst) over {} runs",
            times.len()
        );
        // The row of docs/reliability.md's table (scripts/reliability.sh).
        println!(
            "| {topology} | {kind:?} | {} | {:.1} ms | {:.1} ms |",
            times.len(),
            median.as_secs_f64() * 1e3,
            worst.as_secs_f64() * 1e3
        );
        assert!(
            worst <= NOTICE_BOUND,
            "{topology}: a {kind:?} in the first renew interval was noticed after {worst:?}, over {NOTICE_BOUND:?}: {noticed:?}"
        );
    }
    Ok(())
}

/// A lease is tracked from the script that grants it: an overwrite or a
/// delete at any moment of its first renew interval is noticed at once,
/// not at its first renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_stolen_before_its_first_renewal_is_noticed_at_once() -> TestResult {
    let _serial = leasehold_testkit::serial().await;
    let _alone = ONE_AT_A_TIME.lock().await;
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    assert!(backend.tracks_lease_changes());
    let manager = LeaseManager::new(backend)?;
    let noticed = steal_in_first_interval(&manager, &server.url(), "standalone").await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    check_noticed("standalone", &noticed)
}

/// The same behind Sentinel, where acquisitions and renewals share the
/// connection to the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_lease_stolen_before_its_first_renewal_is_noticed_at_once() -> TestResult
{
    let _serial = leasehold_testkit::serial().await;
    let _alone = ONE_AT_A_TIME.lock().await;
    let set = SentinelSet::start()?;
    let backend = RedisBackend::connect(set.url()).await?;
    assert_eq!(backend.topology(), Topology::Sentinel);
    assert!(backend.tracks_lease_changes());
    let manager = LeaseManager::new(backend)?;
    let noticed = steal_in_first_interval(&manager, &set.master().url(), "sentinel").await?;
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    check_noticed("sentinel", &noticed)
}
