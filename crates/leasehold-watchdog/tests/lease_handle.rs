//! What a `Lease` handle reports about itself, on `MemoryBackend` and
//! tokio's paused clock.

use std::time::Duration;

use leasehold_core::{LeaseBackend, LeaseKey, MemoryBackend, Ttl};
use leasehold_watchdog::{LeaseManager, LeaseOptions, LossReason};
use tokio::time::timeout;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test(start_paused = true)]
async fn a_lease_names_itself_and_its_label_is_stored_beside_it() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::builder()
        .ttl(Ttl::parse("3s")?)
        .name("nightly-report")
        .label("worker-3")
        .build()?;
    let lease = manager.acquire("job-7", &options).await?;
    assert_eq!(lease.name(), "nightly-report");
    assert_eq!(lease.key().as_str(), "job-7");
    // The server's own record of the lease: the token, and the label
    // stored beside it.
    let on_server = backend
        .inspect(&LeaseKey::new("job-7")?)
        .await?
        .ok_or("the lease is held")?;
    assert_eq!(on_server.fencing_token, Some(lease.fencing_token()));
    assert_eq!(on_server.label.as_deref(), Some("worker-3"));

    let debug = format!("{lease:?}");
    for part in ["job-7", "nightly-report", "renewals: 0", "loss: None", "3s"] {
        assert!(debug.contains(part), "{part:?} missing from {debug}");
    }
    Ok(())
}

/// Every reason has its metrics label and a sentence a user can read.
#[test]
fn loss_reasons_have_a_label_and_a_sentence() {
    let reasons = [
        (
            LossReason::Lost,
            "lost",
            "the server no longer has it for this holder (expired, deleted or taken over)",
        ),
        (
            LossReason::RenewalLimit,
            "renewal_limit",
            "the cap on renewals was reached",
        ),
        (
            LossReason::Deadline,
            "deadline",
            "renewals did not succeed in time, so it may expire",
        ),
        (
            LossReason::Shutdown,
            "shutdown",
            "the lease manager shut down",
        ),
    ];
    for (reason, label, sentence) in reasons {
        assert_eq!(reason.as_str(), label);
        assert_eq!(reason.to_string(), sentence);
    }
}

/// A lease that ends cancels the tokens handed out before, and reports its
/// reason in its debug output too.
#[tokio::test(start_paused = true)]
async fn an_ended_lease_shows_its_reason() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager
        .acquire("gone", &LeaseOptions::with_ttl(Ttl::parse("3s")?))
        .await?;
    let token = lease.token();
    assert!(backend.vanish(&LeaseKey::new("gone")?));
    let reason = timeout(Duration::from_secs(10), lease.lost()).await?;
    assert_eq!(reason, LossReason::Lost);
    // The holder's token, taken before the loss, fired with it.
    assert!(token.is_cancelled());
    assert!(format!("{lease:?}").contains("loss: Some(Lost)"));
    Ok(())
}
