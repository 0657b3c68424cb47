//! A throwaway Redis Cluster: N masters, optionally with replicas, created
//! with `redis-cli --cluster create`.

use std::net::{Ipv4Addr, TcpListener};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use crate::{RedisServer, TestkitError, redis_cli_binary};

/// The cluster bus listens on the data port plus this.
const BUS_OFFSET: u16 = 10_000;
/// Data ports are picked from here; with the bus offset they stay below the
/// kernel's ephemeral range (32768 and up), so no client socket takes them.
const PORT_RANGE: std::ops::Range<u16> = 12_000..20_000;
/// How many port bases are tried before giving up.
const PORT_ATTEMPTS: usize = 10;
/// How long the cluster may take to agree on its slots and link its replicas.
/// How long `redis-cli --cluster create` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How often cluster state is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long a failover may take.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);

/// A running Redis Cluster on 127.0.0.1; dropping it kills every node.
///
/// ```no_run
/// # fn main() -> Result<(), leasehold_testkit::TestkitError> {
/// let cluster = leasehold_testkit::RedisCluster::start(3, 1)?;
/// println!("set up in {:?}; connect to {}", cluster.setup_time(), cluster.url());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    replicas_per_master: usize,
    setup_time: Duration,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each,
    /// creates the cluster, and returns once every node reports
    /// `cluster_state:ok` with every slot served, knows every other node,
    /// and every replica's link to its master is up.
    ///
    /// Ports are a random run of consecutive ports in 12000..20000 whose
    /// bus ports (+10000) are free too; a run that another process takes
    /// meanwhile is given up and another one is tried.
    ///
    /// # Errors
    ///
    /// [`TestkitError::CliNotInstalled`] without `redis-cli`,
    /// [`TestkitError::NotInstalled`] without `redis-server`,
    /// [`TestkitError::ClusterCreate`] when `redis-cli` fails,
    /// [`TestkitError::TopologyNotReady`] when the cluster does not settle
    /// within 30 s, and the errors of [`RedisServer::start`].
    pub fn start(masters: usize, replicas_per_master: usize) -> Result<Self, TestkitError> {
        let started = Instant::now();
        let cli = redis_cli_binary()?;
        let count = masters * (1 + replicas_per_master);
        if masters < 3 {
            return Err(TestkitError::TopologyNotReady {
                topology: "cluster",
                after: Duration::ZERO,
                detail: "redis-cli needs at least 3 masters to create a cluster".to_owned(),
            });
        }
        let nodes = start_nodes(count)?;
        let mut create = Command::new(cli);
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        create
            .arg("--cluster-replicas")
            .arg(replicas_per_master.to_string())
            .arg("--cluster-yes");
        // Bounded: a node that never answers must fail the test, not hang
        // it (the cluster's creation takes about 2 s here).
        let output = crate::output_within(&mut create, CREATE_TIMEOUT)?;
        if !output.status.success() {
            let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&output.stderr));
            return Err(TestkitError::ClusterCreate {
                status: output.status,
                output: text,
            });
        }
        let cluster = Self {
            nodes,
            replicas_per_master,
            setup_time: Duration::ZERO,
        };
        cluster.wait_healthy(READY_TIMEOUT)?;
        Ok(Self {
            setup_time: started.elapsed(),
            ..cluster
        })
    }

    /// Starts a cluster of one master that serves every slot (`CLUSTER
    /// ADDSLOTSRANGE 0 16383`) and returns once it reports
    /// `cluster_state:ok`. Reached by its node's plain `redis://` URL
    /// (`nodes()[0].url()`), it answers like one server but refuses a
    /// script or command whose keys hash to different slots (`CROSSSLOT`),
    /// as the single address of a managed cluster or a cluster proxy does.
    ///
    /// # Errors
    ///
    /// [`TestkitError::TopologyNotReady`] when it does not settle within
    /// 30 s, and the errors of [`RedisServer::start`] and
    /// [`RedisServer::cli`].
    pub fn one_node() -> Result<Self, TestkitError> {
        let started = Instant::now();
        let nodes = start_nodes(1)?;
        nodes[0].cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])?;
        let cluster = Self {
            nodes,
            replicas_per_master: 0,
            setup_time: Duration::ZERO,
        };
        cluster.wait_healthy(READY_TIMEOUT)?;
        Ok(Self {
            setup_time: started.elapsed(),
            ..cluster
        })
    }

    /// How long [`start`](Self::start) took, from spawning the first node
    /// to a healthy cluster.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// Every node, masters and replicas, in the order they were created.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// One node, to pause, kill or restart it.
    ///
    /// # Panics
    ///
    /// When `index` is not below the number of nodes.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// A `redis+cluster://` URL listing every node as a seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// The indices of the nodes that are masters now.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`].
    pub fn masters(&self) -> Result<Vec<usize>, TestkitError> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if role(node)? == "master" {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// The index of the master that serves `slot` now.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`]; [`TestkitError::Protocol`] when no master
    /// claims the slot.
    pub fn master_of_slot(&self, slot: u16) -> Result<usize, TestkitError> {
        let nodes = self.any_node()?.cli(&["CLUSTER", "NODES"])?;
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if (lo..=hi).contains(&slot))
            });
            if serves {
                let port = node_port(fields[1]);
                if let Some(i) = self.nodes.iter().position(|n| Some(n.port()) == port) {
                    return Ok(i);
                }
            }
        }
        Err(TestkitError::Protocol(format!(
            "no master serves slot {slot}"
        )))
    }

    /// The index of a replica of the master at `master`.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`]; [`TestkitError::Protocol`] when it has none.
    pub fn replica_of(&self, master: usize) -> Result<usize, TestkitError> {
        let id = self.nodes[master].cli(&["CLUSTER", "MYID"])?;
        for (i, node) in self.nodes.iter().enumerate() {
            let info = node.cli(&["CLUSTER", "NODES"])?;
            let myself = info.lines().find(|l| l.contains("myself"));
            if myself.is_some_and(|l| l.split_whitespace().nth(3) == Some(id.as_str())) {
                return Ok(i);
            }
        }
        Err(TestkitError::Protocol(format!(
            "node {master} has no replica"
        )))
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`].
    pub fn keyslot(&self, key: &str) -> Result<u16, TestkitError> {
        let slot = self.any_node()?.cli(&["CLUSTER", "KEYSLOT", key])?;
        slot.parse()
            .map_err(|_| TestkitError::Protocol(format!("CLUSTER KEYSLOT answered {slot:?}")))
    }

    /// Promotes the replica at `replica` with `CLUSTER FAILOVER` (a manual,
    /// coordinated failover) and waits until it is a master, the cluster is
    /// healthy again and its old master has linked to it as a replica.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::cli`]; [`TestkitError::TopologyNotReady`] when the
    /// failover does not complete within 15 s.
    pub fn failover(&self, replica: usize) -> Result<(), TestkitError> {
        self.nodes[replica].cli(&["CLUSTER", "FAILOVER"])?;
        let started = Instant::now();
        while role(&self.nodes[replica])? != "master" {
            if started.elapsed() > FAILOVER_TIMEOUT {
                return Err(TestkitError::TopologyNotReady {
                    topology: "cluster",
                    after: started.elapsed(),
                    detail: format!("node {replica} did not become a master"),
                });
            }
            thread::sleep(POLL_INTERVAL);
        }
        self.wait_healthy(FAILOVER_TIMEOUT)
    }

    /// Waits until every running, unpaused node reports `cluster_state:ok`
    /// with every slot served and every node known, and (when all nodes run)
    /// every replica's link is up: after killing a master, this is when its
    /// replica has taken over.
    ///
    /// # Errors
    ///
    /// [`TestkitError::TopologyNotReady`] when that does not happen within `timeout`.
    pub fn wait_until_healthy(&self, timeout: Duration) -> Result<Duration, TestkitError> {
        let started = Instant::now();
        self.wait_healthy(timeout)?;
        Ok(started.elapsed())
    }

    fn any_node(&self) -> Result<&RedisServer, TestkitError> {
        self.nodes
            .iter()
            .find(|n| n.pid().is_some() && !n.is_paused())
            .ok_or(TestkitError::NotRunning)
    }

    /// Waits until every running node reports a healthy cluster that knows
    /// every node, and every replica's link is up.
    fn wait_healthy(&self, timeout: Duration) -> Result<(), TestkitError> {
        let total = self.nodes.len();
        crate::sentinel::wait_until(timeout, "cluster", || self.health(total))
    }

    /// `None` when healthy, else what is not yet.
    fn health(&self, total: usize) -> Result<Option<String>, TestkitError> {
        let mut replicas = 0;
        for node in &self.nodes {
            if node.pid().is_none() || node.is_paused() {
                continue;
            }
            let info = node.cli(&["CLUSTER", "INFO"])?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(name))
                    .unwrap_or("")
                    .to_owned()
            };
            if field("cluster_state:") != "ok"
                || field("cluster_slots_ok:") != "16384"
                || field("cluster_known_nodes:") != total.to_string()
            {
                return Ok(Some(format!(
                    "node {} reports state {:?}, {} slots ok, {} known nodes",
                    node.port(),
                    field("cluster_state:"),
                    field("cluster_slots_ok:"),
                    field("cluster_known_nodes:")
                )));
            }
            let replication = node.cli(&["INFO", "replication"])?;
            if replication.contains("role:slave") {
                replicas += 1;
                if !replication.contains("master_link_status:up") {
                    return Ok(Some(format!(
                        "replica {} has no link to its master",
                        node.port()
                    )));
                }
            }
        }
        let running = self.nodes.iter().filter(|n| n.pid().is_some()).count();
        if running == total && replicas != total - total / (1 + self.replicas_per_master) {
            return Ok(Some(format!("{replicas} replicas so far")));
        }
        Ok(None)
    }
}

/// The role of a node: `master` or `slave`.
fn role(node: &RedisServer) -> Result<String, TestkitError> {
    let info = node.cli(&["INFO", "replication"])?;
    Ok(info
        .lines()
        .find_map(|l| l.trim().strip_prefix("role:"))
        .unwrap_or("")
        .to_owned())
}

/// The data port of a `CLUSTER NODES` address field, `ip:port@busport`.
fn node_port(field: &str) -> Option<u16> {
    let addr = field.split('@').next()?;
    addr.rsplit_once(':')?.1.parse().ok()
}

/// Whether a port can be bound on 127.0.0.1 now.
fn is_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// Starts `count` cluster-enabled nodes on consecutive ports whose bus
/// ports are free too, trying another base when one is taken meanwhile.
fn start_nodes(count: usize) -> Result<Vec<RedisServer>, TestkitError> {
    let span = u16::try_from(count).unwrap_or(u16::MAX);
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let base = fastrand::u16(PORT_RANGE.start..PORT_RANGE.end - span);
        let ports: Vec<u16> = (base..base + span).collect();
        if !ports.iter().all(|&p| is_free(p) && is_free(p + BUS_OFFSET)) {
            continue;
        }
        let mut nodes = Vec::with_capacity(count);
        let mut taken = false;
        for &port in &ports {
            match cluster_node(port) {
                Ok(node) => nodes.push(node),
                Err(err @ (TestkitError::PortInUse { .. } | TestkitError::Exited { .. })) => {
                    // Another test took a port (or its bus port) between the
                    // check and the start: try another base.
                    last = Some(err);
                    taken = true;
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        if !taken {
            return Ok(nodes);
        }
    }
    Err(last.unwrap_or(TestkitError::PortInUse {
        port: PORT_RANGE.start,
        attempts: PORT_ATTEMPTS,
        log_tail: String::new(),
    }))
}

fn cluster_node(port: u16) -> Result<RedisServer, TestkitError> {
    RedisServer::builder()
        .port(port)
        .arg("--cluster-enabled")
        .arg("yes")
        .arg("--cluster-config-file")
        .arg("nodes.conf")
        // Quick failure detection; the default of 15 s would stall failover tests.
        .arg("--cluster-node-timeout")
        .arg("1000")
        // Without it replicas wait ~5 s before their first sync.
        .arg("--repl-diskless-sync-delay")
        .arg("0")
        .start()
}
