//! Client tracking under load, with the watchdog: a server whose tracking
//! table is too small for the held leases.

use std::time::Duration;

use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::RedisServer;
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

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
    const LEASES: usize = 3000;
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
    manager.shutdown().await;
    Ok(())
}
