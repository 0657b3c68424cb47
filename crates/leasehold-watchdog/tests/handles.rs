//! What a user writes and reads back through the public API, on
//! `MemoryBackend` and tokio's paused clock: the short acquisition, and
//! each kind's handle naming the key it was given. Witness: the backend's
//! own store (`inspect`), which the handle does not shape.

mod common;

use common::{TestResult, key};
use leasehold_core::{LeaseBackend, MemoryBackend, PermitLimit};
use leasehold_watchdog::{LeaseError, LeaseManager, LeaseOptions};

/// `try_acquire` is `acquire` with the default options: it takes a free
/// key for the default ttl, and refuses a held one at once.
#[tokio::test(start_paused = true)]
async fn try_acquire_takes_a_free_key_with_the_defaults_and_refuses_a_held_one() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.try_acquire("short:form").await?;
    let defaults = LeaseOptions::default();
    assert_eq!(lease.ttl(), defaults.ttl());
    assert_eq!(lease.name(), defaults.name());
    let stored = backend.inspect(&key("short:form")).await?;
    assert_eq!(
        stored.and_then(|info| info.fencing_token),
        Some(lease.fencing_token())
    );

    let other = LeaseManager::new(backend.clone())?;
    let started = tokio::time::Instant::now();
    let refused = other.try_acquire("short:form").await;
    assert!(
        matches!(refused, Err(LeaseError::NotAcquired { .. })),
        "{refused:?}"
    );
    assert!(started.elapsed().is_zero(), "try_acquire waited");
    lease.release().await?;
    assert_eq!(backend.inspect(&key("short:form")).await?, None);
    Ok(())
}

/// Every kind's handle answers `key()` with the key given to the call that
/// acquired it, and `server_key()` with the key it holds on the server (as
/// the backend shows it); releasing through the handle frees that key.
#[tokio::test(start_paused = true)]
async fn each_kind_of_handle_names_the_key_it_was_given() -> TestResult {
    let backend = MemoryBackend::new();
    let manager = LeaseManager::new(backend.clone())?;
    let options = LeaseOptions::default();
    let limit = PermitLimit::new(3)?;
    let fair = LeaseOptions::builder()
        .fair(leasehold_watchdog::Fair::default())
        .build()?;
    let handles = [
        ("exclusive", manager.acquire("orders", &options).await?),
        ("fair", manager.acquire("queue", &fair).await?),
        ("tagged", manager.acquire("{tag}:job", &options).await?),
        (
            "permit",
            manager.acquire_permit("exports", limit, &options).await?,
        ),
        (
            "tagged permit",
            manager.acquire_permit("{pool}", limit, &options).await?,
        ),
        ("read", manager.acquire_read("catalog", &options).await?),
        ("write", manager.acquire_write("ledger", &options).await?),
    ];
    let given = [
        "orders",
        "queue",
        "{tag}:job",
        "exports",
        "{pool}",
        "catalog",
        "ledger",
    ];
    let on_server = [
        "orders",
        "queue",
        "{tag}:job",
        "{exports}:permit:0",
        "{pool}:permit:0",
        "",
        "{ledger}:write",
    ];
    for (((kind, lease), given), server) in handles.into_iter().zip(given).zip(on_server) {
        assert_eq!(lease.key().as_str(), given, "{kind}");
        let server_key = lease.server_key();
        if kind == "read" {
            assert!(
                server_key.as_str().starts_with("{catalog}:read:"),
                "{kind}: {server_key}"
            );
        } else {
            assert_eq!(server_key.as_str(), server, "{kind}");
        }
        let stored = backend.inspect(&server_key).await?;
        assert_eq!(
            stored.and_then(|info| info.fencing_token),
            Some(lease.fencing_token()),
            "{kind}: {server_key} is not this lease on the server"
        );
        lease.release().await?;
        assert_eq!(
            backend.inspect(&server_key).await?,
            None,
            "{kind}: {server_key} is still taken after the release"
        );
    }
    Ok(())
}
