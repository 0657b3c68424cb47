//! `MemoryBackend`, the oracle of every paused-clock test, runs the
//! conformance suite the Redis topologies run (on real time: the suite's
//! ttls are a few hundred milliseconds). From a root test rather than from
//! leasehold-core's own tests, so that the testkit is not a dev-dependency
//! of the crate it depends on.

use leasehold::MemoryBackend;
use leasehold_testkit::conformance::{Area, ConformanceError, Rule, Suite};

#[tokio::test]
async fn memory_keeps_the_core_and_every_area_it_has() -> Result<(), ConformanceError> {
    let backend = MemoryBackend::new();
    let checked = Suite::new(backend.clone(), "memory")
        .run(&[
            Area::ReleaseNotices,
            Area::Handover,
            Area::MinimumHold,
            Area::Permits,
            Area::ReadWrite,
            Area::FairQueue,
        ])
        .await?;
    assert_eq!(checked.len(), Rule::CORE.len() + 5, "{checked:?}");
    // The change feed needs a second client of the same store, as another
    // process sees it.
    Suite::new(backend.clone(), "memory")
        .change_feed(&backend.client())
        .await
}
