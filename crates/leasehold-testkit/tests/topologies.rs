//! The testkit's topologies come up healthy, and say how long that took.

use leasehold_testkit::{RedisCluster, SentinelSet, TestkitError, independent_masters};

#[test]
fn a_cluster_of_three_masters_serves_every_slot() -> Result<(), TestkitError> {
    let cluster = RedisCluster::start(3, 0)?;
    println!("3-master cluster set up in {:?}", cluster.setup_time());
    assert_eq!(cluster.masters()?.len(), 3);
    let slot = cluster.keyslot("{job42}:lease")?;
    assert_eq!(slot, cluster.keyslot("{job42}:fence")?);
    let owner = cluster.master_of_slot(slot)?;
    assert_eq!(
        cluster.nodes()[owner].cli(&["SET", "{job42}:lease", "x"])?,
        "OK"
    );
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    for node in cluster.nodes() {
        assert!(
            node.port() <= 22_767,
            "bus port {} would be ephemeral",
            node.port()
        );
    }
    Ok(())
}

#[test]
fn a_sentinel_set_knows_its_replica_and_peers() -> Result<(), TestkitError> {
    let set = SentinelSet::start()?;
    println!("sentinel set set up in {:?}", set.setup_time());
    let addr = set.sentinels()[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])?;
    assert_eq!(
        addr.lines().nth(1),
        Some(set.master().port().to_string().as_str())
    );
    assert!(
        set.replica()
            .cli(&["INFO", "replication"])?
            .contains("master_link_status:up")
    );
    Ok(())
}

#[test]
fn independent_masters_do_not_share_data() -> Result<(), TestkitError> {
    let masters = independent_masters(3)?;
    assert_eq!(masters[0].cli(&["SET", "k", "v"])?, "OK");
    assert_eq!(masters[1].cli(&["GET", "k"])?, "(nil)");
    assert_eq!(masters[2].cli(&["ROLE"])?.lines().next(), Some("master"));
    Ok(())
}
