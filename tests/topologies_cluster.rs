//! Leases on a real Redis Cluster started by the testkit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, RenewOutcome,
    RenewRequest,
};
use leasehold::redis::redis::aio::MultiplexedConnection;
use leasehold::redis::redis::cluster::ClusterClient;
use leasehold::redis::{KeyLayout, RedisBackend, Topology};
use leasehold::{LeaseKey, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::{RedisCluster, RedisServer};

#[path = "common/held.rs"]
mod held;
#[path = "common/notice.rs"]
mod notice;

use held::{held_and_renewed, held_on};

type TestResult = Result<(), Box<dyn std::error::Error>>;

async fn backend(cluster: &RedisCluster) -> Result<RedisBackend, leasehold::redis::ConnectError> {
    RedisBackend::builder(cluster.url())
        .op_timeout(Duration::from_millis(500))
        .connect()
        .await
}

fn ttl(text: &str) -> Ttl {
    Ttl::parse(text).expect("valid ttl")
}

/// `cmdstat_evalsha:calls=N` of one node (0 when it ran none).
fn evalsha_calls(node: &RedisServer) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(node.command_calls("evalsha")?)
}

async fn acquire(backend: &RedisBackend, key: &LeaseKey, holder: HolderId) -> TestResult {
    match backend
        .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl("10s")))
        .await?
    {
        AcquireOutcome::Acquired(_) => Ok(()),
        AcquireOutcome::Held(info) => Err(format!("{key} is held: {info:?}").into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_are_batched_one_script_call_per_slot_on_the_node_of_the_slot() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    println!("3-master cluster set up in {:?}", cluster.setup_time());
    let backend = backend(&cluster).await?;
    assert_eq!(backend.topology(), Topology::Cluster);
    let layout = KeyLayout::default();
    // 60 keys spread over the slots, and 20 that share one hash tag.
    let mut keys: Vec<LeaseKey> = (0..60)
        .map(|i| LeaseKey::new(format!("job-{i}")))
        .collect::<Result<_, _>>()?;
    for i in 0..20 {
        keys.push(LeaseKey::new(format!("batch:{{7}}:{i}"))?);
    }
    let holder = HolderId::generate()?;
    for key in &keys {
        acquire(&backend, key, holder).await?;
    }
    let requests: Vec<RenewRequest> = keys
        .iter()
        .map(|k| RenewRequest::new(k.clone(), holder, ttl("10s")))
        .collect();
    // Warm up: every node loads the renew script (a NOSCRIPT round trip).
    backend.renew_many(&requests).await;

    let mut groups_per_node: BTreeMap<usize, BTreeSet<u16>> = BTreeMap::new();
    for key in &keys {
        let slot = cluster.keyslot(&layout.lease(key))?;
        groups_per_node
            .entry(cluster.master_of_slot(slot)?)
            .or_default()
            .insert(slot);
    }
    assert_eq!(groups_per_node.len(), 3, "the keys span every master");
    for node in cluster.nodes() {
        node.cli(&["CONFIG", "RESETSTAT"])?;
    }
    let outcomes = backend.renew_many(&requests).await;
    assert_eq!(outcomes.len(), requests.len());
    for (key, outcome) in keys.iter().zip(&outcomes) {
        assert!(
            matches!(outcome, Ok(RenewOutcome::Renewed)),
            "{key}: {outcome:?}"
        );
    }
    let mut total_groups = 0;
    for (node, slots) in &groups_per_node {
        let calls = evalsha_calls(&cluster.nodes()[*node])?;
        println!(
            "node {node}: {} slot groups, {calls} EVALSHA calls",
            slots.len()
        );
        assert_eq!(
            calls,
            slots.len() as u64,
            "one script call per slot group on node {node}"
        );
        total_groups += slots.len();
    }
    assert!(
        total_groups < keys.len(),
        "the 20 hash-tagged leases went as one call"
    );

    // Outcomes stay in request order when some leases are lost.
    let stranger = HolderId::generate()?;
    let mut mixed = requests.clone();
    mixed[3] = RenewRequest::new(keys[3].clone(), stranger, ttl("10s"));
    mixed[70] = RenewRequest::new(keys[70].clone(), stranger, ttl("10s"));
    let outcomes = backend.renew_many(&mixed).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        let want = if i == 3 || i == 70 {
            RenewOutcome::Lost
        } else {
            RenewOutcome::Renewed
        };
        assert_eq!(outcome.as_ref().ok(), Some(&want), "request {i}");
    }
    Ok(())
}

/// Side connections to the nodes that serve `stored`'s slots now, and
/// which connection serves each key.
async fn connect_to_masters(
    cluster: &RedisCluster,
    stored: &[String],
) -> Result<(BTreeMap<usize, MultiplexedConnection>, Vec<usize>), Box<dyn std::error::Error>> {
    let mut conns = BTreeMap::new();
    let mut placement = Vec::new();
    for key in stored {
        let node = cluster.master_of_slot(cluster.keyslot(key)?)?;
        if let std::collections::btree_map::Entry::Vacant(entry) = conns.entry(node) {
            let client = leasehold::redis::redis::Client::open(cluster.nodes()[node].url())?;
            entry.insert(client.get_multiplexed_async_connection().await?);
        }
        placement.push(node);
    }
    Ok((conns, placement))
}

/// A manual failover (`CLUSTER FAILOVER`, where the replica catches up
/// before it takes over) loses no lease: judged by the new master, every
/// lease is still there with its holder's value and keeps being renewed
/// there, and no holder is told of a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_during_renewals_keeps_every_lease() -> TestResult {
    let cluster = RedisCluster::start(3, 1)?;
    println!(
        "3-master, 3-replica cluster set up in {:?}",
        cluster.setup_time()
    );
    let manager = LeaseManager::new(backend(&cluster).await?)?;
    // A ttl well beyond the failover and the renewals watched after it, so
    // that a lease the new master does not renew is still there, not
    // renewed, when the test looks.
    let renew_interval = Duration::from_millis(667);
    let options = LeaseOptions::builder()
        .ttl(ttl("6s"))
        .renew_interval(renew_interval)
        .build()?;
    let mut leases = Vec::new();
    for i in 0..30 {
        leases.push(manager.acquire(format!("failover-{i}"), &options).await?);
    }
    let layout = KeyLayout::default();
    let stored: Vec<String> = leases.iter().map(|l| layout.lease(l.key())).collect();
    // Let every lease renew once before the failover (the renewal count
    // has no signal to wait on).
    let until = tokio::time::Instant::now() + 3 * renew_interval;
    while leases.iter().any(|l| l.renewals() < 1) {
        assert!(
            tokio::time::Instant::now() < until,
            "some lease did not renew within three renew intervals"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // What each holder wrote, as the masters serving the leases hold it.
    let (mut conns, placement) = connect_to_masters(&cluster, &stored).await?;
    let mut written = Vec::new();
    for (key, node) in stored.iter().zip(&placement) {
        let conn = conns.get_mut(node).ok_or("no connection to the node")?;
        written.push(held_on(conn, key).await?.0.ok_or("a lease is missing")?);
    }
    let slot = cluster.keyslot(&stored[0])?;
    let old_master = cluster.master_of_slot(slot)?;
    let replica = cluster.replica_of(old_master)?;
    let moved = placement.iter().filter(|n| **n == old_master).count();
    let failover = tokio::task::spawn_blocking({
        let started = std::time::Instant::now();
        move || {
            cluster
                .failover(replica)
                .map(|()| (cluster, started.elapsed()))
        }
    });
    let (cluster, took) = tokio::time::timeout(Duration::from_secs(30), failover)
        .await
        .map_err(|_| "the failover did not settle within 30 s")???;
    println!(
        "CLUSTER FAILOVER of node {replica} settled in {took:?}; {moved} leases moved with it"
    );
    assert_eq!(
        cluster.master_of_slot(slot)?,
        replica,
        "the replica serves the slot now"
    );

    // Judged by the masters serving the slots now (the promoted replica
    // for `moved` of them): every lease is there with its holder's value,
    // and its PTTL rises again within a few renew intervals — only a
    // renewal reaching that master can raise it.
    let (mut conns, placement) = connect_to_masters(&cluster, &stored).await?;
    assert_eq!(
        placement.iter().filter(|n| **n == replica).count(),
        moved,
        "the promoted replica serves the leases of its old master"
    );
    held_and_renewed(
        &mut conns,
        &placement,
        &stored,
        &written,
        &leases,
        "failover",
        3 * renew_interval,
    )
    .await?;
    println!(
        "after the failover: all {} leases held and renewed on their masters",
        leases.len()
    );
    // New acquisitions work on the new topology.
    let fresh = manager.acquire("after-failover", &options).await?;
    assert!(fresh.fencing_token().get() > 0);
    drop(cluster);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_tagged_lease_sits_in_the_slot_of_the_data_it_guards() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    let backend = backend(&cluster).await?;
    let key = LeaseKey::new("order:{42}")?;
    let layout = KeyLayout::default();
    let data_slot = cluster.keyslot("order:{42}:items")?;
    assert_eq!(cluster.keyslot(&layout.lease(&key))?, data_slot);
    assert_eq!(cluster.keyslot(&layout.fence(&key))?, data_slot);
    let holder = HolderId::generate()?;
    acquire(&backend, &key, holder).await?;
    // One script may read the lease and write the data it guards: no CROSSSLOT.
    let client = ClusterClient::new(vec![format!(
        "redis://127.0.0.1:{}",
        cluster.nodes()[0].port()
    )])?;
    let mut conn = client.get_async_connection().await?;
    let guarded: String = leasehold::redis::redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('SET', KEYS[2], ARGV[1]) return 'written' end return 'refused'",
    )
    .key(layout.lease(&key))
    .key("order:{42}:items")
    .arg("3 widgets")
    .invoke_async(&mut conn)
    .await?;
    assert_eq!(guarded, "written");
    let owner = cluster.master_of_slot(data_slot)?;
    assert_eq!(
        cluster.nodes()[owner].cli(&["GET", "order:{42}:items"])?,
        "3 widgets"
    );
    assert_eq!(
        backend
            .renew(&RenewRequest::new(key.clone(), holder, ttl("10s")))
            .await?,
        RenewOutcome::Renewed
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_too_few_replicas_acknowledge_fails_and_gives_the_lease_back() -> TestResult {
    let cluster = RedisCluster::start(3, 1)?;
    // One replica per master can acknowledge: given time, it does. (A
    // fresh replica on a loaded machine has answered WAIT after 200 ms; what
    // this test is about is the request that can never be met, below.)
    let acked = RedisBackend::builder(cluster.url())
        .op_timeout(Duration::from_secs(3))
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect()
        .await?;
    let key = LeaseKey::new("acked")?;
    let holder = HolderId::generate()?;
    acquire(&acked, &key, holder).await?;
    assert_eq!(
        acked
            .renew(&RenewRequest::new(key.clone(), holder, ttl("10s")))
            .await?,
        RenewOutcome::Renewed
    );

    // Each master has one replica: asking for two can never be met.
    let greedy = RedisBackend::builder(cluster.url())
        .op_timeout(Duration::from_millis(500))
        .wait_for_replicas(2, Duration::from_millis(50))
        .connect()
        .await?;
    let other = LeaseKey::new("unacked")?;
    let err = greedy
        .try_acquire(&AcquireRequest::new(
            other.clone(),
            HolderId::generate()?,
            ttl("10s"),
        ))
        .await
        .err()
        .ok_or("an acquisition without enough replicas succeeded")?;
    println!("{err}");
    assert!(
        matches!(err, BackendError::Server { .. }) && err.is_transient(),
        "{err:?}"
    );
    assert_eq!(
        greedy.inspect(&other).await?,
        None,
        "the unacknowledged lease was given back"
    );
    let renewal = greedy
        .renew(&RenewRequest::new(key.clone(), holder, ttl("10s")))
        .await;
    assert!(
        renewal.is_err(),
        "an unacknowledged renewal is unknown, not {renewal:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_hands_its_acknowledged_leases_to_its_replica() -> TestResult {
    let mut cluster = RedisCluster::start(3, 1)?;
    // Every acquisition and renewal waits for the one replica of its slot.
    let backend = RedisBackend::builder(cluster.url())
        .op_timeout(Duration::from_millis(500))
        .wait_for_replicas(1, Duration::from_millis(300))
        .connect()
        .await?;
    let manager = LeaseManager::new(backend)?;
    // A lease is acquired only once its replica acknowledged it. On a
    // loaded machine a fresh replica may answer a WAIT late: the manager
    // gives that lease back and, with a wait, tries again.
    let options = LeaseOptions::builder()
        .ttl(ttl("10s"))
        .renew_interval(Duration::from_millis(300))
        .wait(Duration::from_secs(10))
        .build()?;
    let mut leases = Vec::new();
    for i in 0..24 {
        leases.push(manager.acquire(format!("killed-{i}"), &options).await?);
    }
    let slot = cluster.keyslot(&KeyLayout::default().lease(&LeaseKey::new("killed-0")?))?;
    let victim = cluster.master_of_slot(slot)?;
    let replica = cluster.replica_of(victim)?;
    cluster.node_mut(victim).kill()?;
    let killed_at = tokio::time::Instant::now();
    let took = tokio::task::block_in_place(|| cluster.wait_until_healthy(Duration::from_secs(15)))?;
    println!("SIGKILL of a cluster master: its replica took over after {took:?}");
    assert_eq!(cluster.master_of_slot(slot)?, replica);
    // The promoted replica has no replica of its own, so WAIT 1 cannot be
    // met and renewals there stay unknown until the old master comes back
    // (it rejoins as a replica, from its nodes.conf).
    cluster.node_mut(victim).restart()?;
    let rejoined =
        tokio::task::block_in_place(|| cluster.wait_until_healthy(Duration::from_secs(15)))?;
    println!("the old master rejoined as a replica after {rejoined:?}");
    let counts: Vec<u32> = leases.iter().map(leasehold::Lease::renewals).collect();
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until
        && leases
            .iter()
            .zip(&counts)
            .any(|(l, n)| l.loss_reason().is_none() && l.renewals() < n + 2)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(
            lease.loss_reason(),
            None,
            "killed-{i}: an acknowledged lease was lost"
        );
        assert!(
            lease.renewals() >= counts[i] + 2,
            "killed-{i} stopped renewing without a signal"
        );
        let info = manager
            .backend()
            .inspect(lease.key())
            .await?
            .ok_or_else(|| format!("killed-{i} is gone from the server"))?;
        assert_eq!(
            info.fencing_token,
            Some(lease.fencing_token()),
            "killed-{i}"
        );
    }
    println!(
        "all {} leases renewing again {:?} after the kill",
        leases.len(),
        killed_at.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_elsewhere_through_sharded_pub_sub() -> TestResult {
    let cluster = RedisCluster::start(3, 0)?;
    // Two backends, as two processes would have: only the server's notice
    // can tell the waiter of the other's release.
    let holder = LeaseManager::new(backend(&cluster).await?)?;
    let waiter = LeaseManager::new(backend(&cluster).await?)?;
    let options = notice::options();
    // Keys in different slots, so on different masters.
    let keys = ["notice-a", "notice-b", "notice-c"];
    let mut slots = BTreeSet::new();
    for key in keys {
        slots.insert(cluster.keyslot(&KeyLayout::default().lease(&LeaseKey::new(key)?))?);
    }
    assert_eq!(slots.len(), keys.len(), "the keys share a slot");
    for key in keys {
        let lease = holder.acquire(key, &options).await?;
        let channel = KeyLayout::default().released(&LeaseKey::new(key)?);
        let waiting = notice::spawn_waiter(&waiter, key, &options);
        // Until the waiter has subscribed on the node of the key's slot.
        notice::release_wakes(key, lease, waiting, || {
            let mut subscribers = 0;
            for node in cluster.nodes() {
                let reply = node.cli(&["PUBSUB", "SHARDNUMSUB", &channel])?;
                subscribers += reply
                    .lines()
                    .nth(1)
                    .and_then(|n| n.trim().parse::<u32>().ok())
                    .unwrap_or(0);
            }
            Ok::<_, leasehold_testkit::TestkitError>(subscribers > 0)
        })
        .await?;
    }
    Ok(())
}
