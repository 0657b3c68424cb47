//! A throwaway Sentinel set: one master, one replica, three sentinels.

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::{RedisServer, TestkitError};

/// The name the sentinels monitor the master by.
pub const MASTER_NAME: &str = "mymaster";
/// How long the set may take to form.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a failover may take after the master dies.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(20);
/// How often state is polled.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A master, its replica and three sentinels (quorum 2) on 127.0.0.1;
/// dropping it kills them all.
///
/// The sentinels declare a master down after 1 s without an answer, so a
/// killed master is replaced in about 2–3 s.
///
/// ```no_run
/// # fn main() -> Result<(), leasehold_testkit::TestkitError> {
/// let mut set = leasehold_testkit::SentinelSet::start()?;
/// println!("set up in {:?}; connect to {}", set.setup_time(), set.url());
/// set.kill_master()?;
/// set.wait_for_failover()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SentinelSet {
    /// `[master, replica]` as started; after a failover the roles swap.
    data: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
    master: usize,
    setup_time: Duration,
    _configs: TempDir,
}

impl SentinelSet {
    /// Starts the master, then its replica (waiting for its link), then the
    /// sentinels (waiting until each knows the replica and the two other
    /// sentinels, so that a failover can be authorised at once).
    ///
    /// # Errors
    ///
    /// [`TestkitError::TopologyNotReady`] when the set does not form within
    /// 20 s, and the errors of [`RedisServer::start`].
    pub fn start() -> Result<Self, TestkitError> {
        Self::start_with_down_after(Duration::from_millis(1000))
    }

    /// [`start`](Self::start) with the sentinels' `down-after-milliseconds`
    /// set to `down_after`. Back-to-back failovers need more than 1 s: with
    /// 1000 ms the sentinels sometimes fail a just-promoted master over
    /// again about a second later; 1500 ms showed none.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_down_after(down_after: Duration) -> Result<Self, TestkitError> {
        Self::start_with_replica_args(down_after, &[])
    }

    /// As [`start_with_down_after`](Self::start_with_down_after), with
    /// `args` added to the replica's command line: for example
    /// `["--rename-command", "PEXPIRE", ""]` for a replica that, once
    /// promoted, lacks a command the master has.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_replica_args(
        down_after: Duration,
        args: &[&str],
    ) -> Result<Self, TestkitError> {
        let mut replica = RedisServer::builder();
        for arg in args {
            replica = replica.arg(*arg);
        }
        Self::start_with_builders(
            down_after,
            RedisServer::builder(),
            replica,
            RedisServer::builder,
        )
    }

    /// As [`start_with_down_after`](Self::start_with_down_after), with
    /// the master, the replica and each sentinel started from the builders
    /// given: for example servers under libfaketime
    /// ([`faketime_server`](crate::faketime_server)), whose clocks a test
    /// moves. The replica's `--replicaof` and the sentinels' configuration
    /// are added here.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_builders(
        down_after: Duration,
        master: crate::ServerBuilder,
        replica: crate::ServerBuilder,
        mut sentinel: impl FnMut() -> crate::ServerBuilder,
    ) -> Result<Self, TestkitError> {
        let started = Instant::now();
        let master = data_node(master)?;
        let replica = replica
            .arg("--replicaof")
            .arg("127.0.0.1")
            .arg(master.port().to_string());
        let replica = data_node(replica)?;
        wait_until(READY_TIMEOUT, "sentinel set", || {
            let info = replica.cli(&["INFO", "replication"])?;
            Ok((!info.contains("master_link_status:up"))
                .then(|| "the replica has not linked to the master".to_owned()))
        })?;
        let configs = tempfile::Builder::new()
            .prefix("leasehold-sentinel-")
            .tempdir()?;
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let path = configs.path().join(format!("sentinel-{i}.conf"));
            fs::write(
                &path,
                format!(
                    "sentinel monitor {MASTER_NAME} 127.0.0.1 {} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    master.port(),
                    down_after.as_millis()
                ),
            )?;
            sentinels.push(sentinel().config_file(path).arg("--sentinel").start()?);
        }
        let set = Self {
            data: vec![master, replica],
            sentinels,
            master: 0,
            setup_time: Duration::ZERO,
            _configs: configs,
        };
        wait_until(READY_TIMEOUT, "sentinel set", || {
            for sentinel in &set.sentinels {
                let info = sentinel.cli(&["INFO", "sentinel"])?;
                if !info.contains("status=ok")
                    || !info.contains("slaves=1")
                    || !info.contains("sentinels=3")
                {
                    return Ok(Some(format!(
                        "sentinel {} reports {info:?}",
                        sentinel.port()
                    )));
                }
            }
            Ok(None)
        })?;
        Ok(Self {
            setup_time: started.elapsed(),
            ..set
        })
    }

    /// How long [`start`](Self::start) took.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// A `redis+sentinel://` URL listing the three sentinels and the master name.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The data node that is master now (as far as this set has seen).
    pub fn master(&self) -> &RedisServer {
        &self.data[self.master]
    }

    /// The data node that is the replica now (as far as this set has seen).
    pub fn replica(&self) -> &RedisServer {
        &self.data[1 - self.master]
    }

    /// The replica, to pause or resume it.
    pub fn replica_mut(&mut self) -> &mut RedisServer {
        &mut self.data[1 - self.master]
    }

    /// The three sentinels.
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// Kills the master with SIGKILL.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::kill`].
    pub fn kill_master(&mut self) -> Result<(), TestkitError> {
        self.data[self.master].kill()
    }

    /// Waits until a majority of the sentinels names the replica as the
    /// master and the replica says it is one, then takes it as the master.
    /// Returns how long that took.
    ///
    /// # Errors
    ///
    /// [`TestkitError::TopologyNotReady`] after 20 s.
    pub fn wait_for_failover(&mut self) -> Result<Duration, TestkitError> {
        let started = Instant::now();
        let candidate = 1 - self.master;
        let port = self.data[candidate].port().to_string();
        wait_until(FAILOVER_TIMEOUT, "sentinel set", || {
            let mut agree = 0;
            for sentinel in &self.sentinels {
                let addr = sentinel
                    .cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
                    .unwrap_or_default();
                if addr.lines().nth(1) == Some(port.as_str()) {
                    agree += 1;
                }
            }
            let role = self.data[candidate].cli(&["ROLE"])?;
            Ok((agree < 2 || !role.starts_with("master")).then(|| {
                format!(
                    "{agree} sentinel(s) name the replica as master; its role is {:?}",
                    role.lines().next()
                )
            }))
        })?;
        self.master = candidate;
        Ok(started.elapsed())
    }
}

impl SentinelSet {
    /// After a failover, restarts the old master (killed before it) empty
    /// (a replica's full sync leaves a `dump.rdb` that a restart would
    /// load, so it is removed first), and waits until the sentinels have
    /// made it a replica of the new master and its link is up, so that the
    /// set can fail over again.
    ///
    /// # Errors
    ///
    /// As [`RedisServer::restart`]; [`TestkitError::TopologyNotReady`]
    /// when the link is not up within 20 s.
    pub fn restart_old_master(&mut self) -> Result<Duration, TestkitError> {
        let started = Instant::now();
        let old = 1 - self.master;
        let dump = self.data[old].dir().join("dump.rdb");
        if dump.exists() {
            fs::remove_file(dump)?;
        }
        self.data[old].restart()?;
        let master_port = format!("master_port:{}", self.data[self.master].port());
        let replica = &self.data[old];
        wait_until(FAILOVER_TIMEOUT, "sentinel set", || {
            let info = replica.cli(&["INFO", "replication"])?;
            Ok(
                (!info.contains("master_link_status:up") || !info.contains(&master_port))
                    .then(|| "the old master has not linked to the new one".to_owned()),
            )
        })?;
        Ok(started.elapsed())
    }
}

fn data_node(builder: crate::ServerBuilder) -> Result<RedisServer, TestkitError> {
    builder.arg("--repl-diskless-sync-delay").arg("0").start()
}

/// Polls `check` (which returns what is not ready yet, or `None`) until it
/// passes or `timeout` runs out.
pub(crate) fn wait_until(
    timeout: Duration,
    topology: &'static str,
    mut check: impl FnMut() -> Result<Option<String>, TestkitError>,
) -> Result<(), TestkitError> {
    let started = Instant::now();
    loop {
        let detail = match check() {
            Ok(None) => return Ok(()),
            Ok(Some(detail)) => detail,
            Err(err) => err.to_string(),
        };
        if started.elapsed() > timeout {
            return Err(TestkitError::TopologyNotReady {
                topology,
                after: started.elapsed(),
                detail,
            });
        }
        thread::sleep(POLL_INTERVAL);
    }
}
