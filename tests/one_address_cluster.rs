//! A Redis Cluster behind one address: a cluster of one master that serves
//! every slot, reached with a plain `redis://` URL. It answers like one
//! server but refuses a script whose keys hash to different slots
//! (`CROSSSLOT`), as the single address of a managed cluster or a cluster
//! proxy does. Judged by the server's own record: its keys, and its
//! `INFO commandstats` and `INFO errorstats`.

#[path = "common/holders.rs"]
#[allow(dead_code)]
mod holders;

use std::collections::HashMap;
use std::time::Duration;

use futures_util::future::try_join_all;
use leasehold::redis::RedisBackend;
use leasehold::redis::redis::{self, AsyncCommands};
use leasehold::{Lease, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::{RedisCluster, RedisServer};

use holders::{Error, within};

type TestResult = Result<(), Error>;

/// A counter of `INFO <section>`, such as `cmdstat_evalsha` / `calls`.
fn stat(server: &RedisServer, section: &str, line: &str, field: &str) -> Result<u64, Error> {
    Ok(server.info_counter(section, line, field)?)
}

fn evalsha_calls(server: &RedisServer) -> Result<u64, Error> {
    stat(server, "commandstats", "cmdstat_evalsha", "calls")
}

fn crossslot_refusals(server: &RedisServer) -> Result<u64, Error> {
    stat(server, "errorstats", "errorstat_CROSSSLOT", "count")
}

fn options(ttl: &str) -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse(ttl).expect("valid ttl"))
        .build()
        .expect("valid options")
}

/// The fencing token stored in a lease's value, `<holder>:<token>:<label>`.
fn stored_token(value: &str) -> Option<u64> {
    value.split(':').nth(1)?.parse().ok()
}

/// 10,000 leases over 100 hash tags (so 100 slots) held for a minute with
/// a 6 s ttl: none is lost (every key is still on the server with the
/// token its holder was given), and every batch stays in one slot: no
/// `CROSSSLOT` refusal, acquisitions and releases sent in far fewer calls
/// than leases, renewals in about one call per slot per round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_live_through_a_minute_on_a_cluster_behind_one_address() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    const TAGS: usize = 100;
    const PER_TAG: usize = 100;
    const HOLD: Duration = Duration::from_secs(60);
    if leasehold_testkit::skip_on_second_pass("ten_thousand_leases_live_through_a_minute") {
        return Ok(());
    }
    let cluster = RedisCluster::one_node()?;
    let server = &cluster.nodes()[0];
    let url = server.url();
    assert!(url.starts_with("redis://"), "one plain address: {url}");
    let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
    let options = options("6s");

    let before = evalsha_calls(server)?;
    let keys: Vec<String> = (0..TAGS)
        .flat_map(|t| (0..PER_TAG).map(move |j| format!("{{tenant-{t}}}:job-{j}")))
        .collect();
    let leases: Vec<Lease> = within(
        Duration::from_secs(60),
        "10,000 acquisitions",
        try_join_all(keys.iter().map(|k| manager.acquire(k, &options))),
    )
    .await?;
    let acquire_calls = evalsha_calls(server)? - before;
    assert!(
        acquire_calls <= (TAGS * PER_TAG / 4) as u64,
        "acquisitions in flight together are batched per slot: {acquire_calls} calls for {} leases",
        TAGS * PER_TAG
    );

    let start = evalsha_calls(server)?;
    tokio::time::sleep(HOLD).await;
    let renew_calls = evalsha_calls(server)? - start;
    // Renewed every 2 s (a third of the ttl), at most 1/16 of an interval
    // early: at least 28 and at most 33 rounds in a minute, 10,000 lease
    // renewals each. A round's leases fall due in a few buckets (they were
    // acquired over some time), each bucket a call per slot: far fewer
    // calls than leases, never one per lease.
    let renewals = (33 * TAGS * PER_TAG) as u64;
    assert!(
        renew_calls * 10 <= renewals,
        "renewals are batched per slot: {renew_calls} calls in a minute for {} leases over {TAGS} slots",
        TAGS * PER_TAG
    );
    assert!(
        renew_calls >= (25 * TAGS) as u64,
        "every slot was renewed every round: only {renew_calls} calls"
    );

    // None lost: each key still holds its holder's token on the server.
    let mut side = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let mut lost = Vec::new();
    for (key, lease) in keys.iter().zip(&leases) {
        let value: Option<String> = side.get(format!("leasehold:{key}")).await?;
        if value.as_deref().and_then(stored_token) != Some(lease.fencing_token().0)
            || lease.loss_reason().is_some()
        {
            lost.push((key.clone(), value, lease.loss_reason()));
        }
    }
    assert!(
        lost.is_empty(),
        "{} leases lost, first: {:?}",
        lost.len(),
        lost.first()
    );

    let start = evalsha_calls(server)?;
    try_join_all(leases.into_iter().map(Lease::release)).await?;
    let release_calls = evalsha_calls(server)? - start;
    assert!(
        release_calls <= (TAGS * PER_TAG / 4) as u64,
        "releases in flight together are batched per slot: {release_calls} calls"
    );
    // One EXISTS per tag: the side connection must not cross slots either.
    let mut left = 0u64;
    for tag in keys.chunks(PER_TAG) {
        let stored: Vec<String> = tag.iter().map(|k| format!("leasehold:{k}")).collect();
        left += side.exists::<_, u64>(stored).await?;
    }
    assert_eq!(left, 0, "every lease released");
    assert_eq!(crossslot_refusals(server)?, 0, "no batch crossed slots");
    println!(
        "one address: {acquire_calls} acquisition calls, {renew_calls} renewal calls in {HOLD:?}, {release_calls} release calls for {} leases",
        TAGS * PER_TAG
    );
    Ok(())
}

/// A server that does not say it is a cluster node (here an ACL denies
/// `INFO`, as some proxies do): its first refusal of a batch across slots
/// turns batching by slot on, and the refused renewals are retried within
/// milliseconds, so no lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crossslot_refusal_turns_batching_by_slot_on() -> TestResult {
    // Timing-bound: one test of this binary at a time.
    let _serial = leasehold_testkit::serial().await;
    let cluster = RedisCluster::one_node()?;
    let server = &cluster.nodes()[0];
    server.cli(&[
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all", "-info",
    ])?;
    let url = server.url().replace("redis://", "redis://app:secret@");
    let manager = LeaseManager::new(RedisBackend::connect(url).await?)?;
    let options = options("1s");
    // Acquired one at a time, so that only renewals (whose due times the
    // watchdog shares) meet in one batch.
    let mut leases = Vec::new();
    for i in 0..50 {
        leases.push(manager.acquire(format!("job-{i}"), &options).await?);
    }
    let slots: HashMap<u16, usize> = leases
        .iter()
        .map(|l| {
            (
                cluster
                    .keyslot(&format!("leasehold:{{{}}}", l.key()))
                    .unwrap_or(0),
                1,
            )
        })
        .collect();
    assert!(slots.len() > 1, "the leases span several slots");
    within(Duration::from_secs(5), "a refused batch", async {
        while crossslot_refusals(server)? == 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok::<_, Error>(())
    })
    .await?;
    // Three more renewal rounds: every lease is kept.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refusals = crossslot_refusals(server)?;
    assert!(
        refusals <= 2,
        "batching by slot after the first refusal: {refusals} refusals"
    );
    for lease in &leases {
        assert!(
            lease.loss_reason().is_none(),
            "{} lost: {:?}",
            lease.key(),
            lease.loss_reason()
        );
        assert_eq!(
            server.cli(&["EXISTS", &format!("leasehold:{{{}}}", lease.key())])?,
            "1",
            "{} on the server",
            lease.key()
        );
    }
    try_join_all(leases.into_iter().map(Lease::release)).await?;
    Ok(())
}
