//! `MemoryBackend`, the oracle of every paused-clock test, runs the
//! conformance suite the Redis topologies run (on real time: the suite's
//! ttls are a few hundred milliseconds). From a root test rather than from
//! leasehold-core's own tests, so that the testkit is not a dev-dependency
//! of the crate it depends on.
//!
//! Seen to fail: each mechanism below was broken once in `MemoryBackend`
//! (crates/leasehold-core/src/memory.rs), every check of the suite run on
//! its own, then restored. The rules that went red, with the suite's words:
//!
//! | broken | red |
//! |---|---|
//! | release skips its owner check | release-owner-checked: a stranger's release of a held lease was answered Released, not NotHeld; expiry-frees |
//! | tokens do not increase (`*counter = 1`) | tokens-increase: token 1 after a release follows token Some(FencingToken(1)); release-to, handover, minimum-hold, permits, read-write, fair-queue, change-feed |
//! | renew skips its owner check | renew-owner-checked: a stranger's renewal was answered Renewed, not Lost; renew-many-in-order, expiry-frees |
//! | re-acquire draws a new token | reacquire-refreshes: a re-acquire changed the token from 1 to 1001 |
//! | re-acquire keeps the old ttl | reacquire-refreshes: re-acquired for Ttl(20s), the lease has Some(9.99s) left: not refreshed |
//! | a refusal without the holder's token | refuses-with-holder-info: refused with token None, the holder's is 1; and ten more |
//! | renew_many answers in reverse order | renew-many-in-order: outcome 2 (of …:many-x:…) is Renewed, expected Lost |
//! | inspect refreshes the lease | inspect: inspect refreshed the lease: 10s left, then Some(10s); reacquire-refreshes, renew-owner-checked |
//! | a release announces nothing | release-notices: no release notice within 5s; release-to, handover |
//! | an expired lease is never dropped | expiry-frees: still held 5.009s after its ttl ran out; tokens-increase, minimum-hold, change-feed |
//! | the grant's `sent_at` 1 s late | grants-free-key: the grant's sent_at is not when the request was sent; expiry-frees |
//! | `release_to` by a stranger hands over | release-to: a stranger's release_to was answered HandedOver(..) |
//! | `release_to` never hands over | handover: not handed over with only our own watch listening: Released |
//! | the minimum hold ignored | minimum-hold: a held key …:minimum:… was granted to someone else, with token 2 |
//! | one permit over the limit | permits: a third permit of 2 was granted: {…:permits:…}:permit:2 |
//! | readers ignore a waiting writer's intent | read-write: a new reader got past a waiting writer |
//! | the fair queue ignores its order | fair-queue: a waiter overtook the head |
//! | the change feed reports nothing | change-feed: the lease taken by another client was not reported within 5s |
//!
//! The differential test (tests/conformance_differential.rs) went red on
//! the same kind of break, with a shrunk sequence: a stranger's release
//! (memory Released, redis NotHeld after one acquire), tokens (a handover's
//! token ranked 0 against 1), renewal owner check, ttl refresh, minimum
//! hold, permit limit, writer preference, fair order and the lock-delay
//! (a grant kept for its ttl alone: 32 s left against the server's 37 s).

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
