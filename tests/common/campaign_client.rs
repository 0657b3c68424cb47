//! What both campaigns (tests/campaign.rs and tests/campaign_failover.rs)
//! share: their seeds and settings, the lease client they run (acquire a
//! random key, a permit of a random semaphore, or a share of a random
//! read-write lease; write while the token is live (a reader only holds);
//! release, and record it all in the history), the witnesses of the
//! servers, and the end of a run with the checks every campaign makes.
//! Each campaign keeps its own faults and its own verdict on overlaps.
//!
//! Every write a client attempts goes, in one transaction on a healthy
//! resource server, to an unfenced store (a plain list) and to a fenced one
//! (`FENCED_WRITE_SCRIPT`), with the resource server's `TIME`; a permit's
//! writes go to the stores of its permit key, which it holds exclusively,
//! and a writer's to those of its read-write lease's writer key.
//! The verdict on stale writes comes from those attempts, the lease
//! server's grants (as its MONITOR feed shows them) and the unfenced
//! store's order: none of them is shaped by the fenced store.

#![allow(
    dead_code,
    reason = "each campaign uses a part: the failover one reads no append-only file and makes no counting run"
)]

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::backend::LeaseBackend;
use leasehold::redis::RedisBackend;
use leasehold::{LeaseKey, LeaseManager, LeaseOptions, LossReason, PermitLimit, Ttl};
use leasehold_testkit::{
    FENCED_WRITE_SCRIPT, Fault, FaultPlan, History, HoldEnd, PlanShape, RedisServer, Report,
    ServerTime, Share, WriteAttempt,
};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

/// The campaigns' error type: clients run on their own tasks.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The campaigns' result type.
pub(crate) type TestResult = Result<(), BoxError>;

/// The longest a client task, a manager's shutdown or a release may take
/// at the end of a run: far above the ttls, so only a hang reaches it.
const END_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one look at a lease on a side connection may take.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// How often a side connection looks at a lease after its token fired,
/// until the lease is gone.
const PROBE_EVERY: Duration = Duration::from_millis(5);

/// A connection to the lease server that no fault of a client touches:
/// what it reads is the server's state, whatever the client believes.
#[derive(Clone)]
pub(crate) enum Side {
    /// Straight to a standalone server: `GET` and `PTTL` of the lease's
    /// key, in one transaction; reconnects after a restart.
    Direct(redis::aio::ConnectionManager),
    /// A backend of its own, straight to a Cluster or Sentinel deployment,
    /// read with `inspect` (the same `GET` and `PTTL`, routed).
    Backend(RedisBackend),
}

impl Side {
    /// A side connection straight to a standalone server.
    pub(crate) async fn direct(server: &RedisServer) -> Result<Self, BoxError> {
        let client = redis::Client::open(server.url())?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(PROBE_TIMEOUT))
            .set_connection_timeout(Some(PROBE_TIMEOUT));
        Ok(Self::Direct(
            redis::aio::ConnectionManager::new_with_config(client, config).await?,
        ))
    }

    /// The fencing token and remaining ttl of `key`'s lease on the server,
    /// or `None` when there is none.
    async fn look(&mut self, key: &str) -> Result<Option<(Option<u64>, Duration)>, BoxError> {
        match self {
            Self::Direct(conn) => {
                let stored = stored(key);
                let (value, pttl): (Option<String>, i64) = redis::pipe()
                    .atomic()
                    .cmd("GET")
                    .arg(&stored)
                    .cmd("PTTL")
                    .arg(&stored)
                    .query_async(conn)
                    .await?;
                Ok(value.map(|v| {
                    let token = v.split(':').nth(1).and_then(|t| t.parse().ok());
                    let left = Duration::from_millis(u64::try_from(pttl).unwrap_or(0));
                    (token, left)
                }))
            }
            Self::Backend(backend) => {
                let info = backend.inspect(&LeaseKey::new(key)?).await?;
                Ok(info.map(|i| {
                    (
                        i.fencing_token.map(|t| t.get()),
                        i.ttl_left.unwrap_or_default(),
                    )
                }))
            }
        }
    }
}

fn env_u64(name: &str) -> Result<Option<u64>, BoxError> {
    match std::env::var(name) {
        Ok(v) => {
            Ok(Some(v.trim().parse().map_err(|e| {
                format!("{name}={v:?} is not a number: {e}")
            })?))
        }
        Err(_) => Ok(None),
    }
}

/// The Redis key (default namespace) of the lease `key`: `{K}` for a key
/// `K` without a hash tag, the key itself for one with a tag (a permit key,
/// `{S}:permit:<i>`).
fn stored(key: &str) -> String {
    if key.contains('{') {
        format!("leasehold:{key}")
    } else {
        format!("leasehold:{{{key}}}")
    }
}

/// The seeds to run: `LEASEHOLD_CAMPAIGN_SEEDS` (comma-separated) or
/// `LEASEHOLD_CAMPAIGN_SEED` (one), else `fixed` and one fresh seed from
/// the clock, so that every run also tries something new.
pub(crate) fn seeds(fixed: &[u64]) -> Result<Vec<u64>, BoxError> {
    if let Ok(list) = std::env::var("LEASEHOLD_CAMPAIGN_SEEDS") {
        return list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .map_err(|e| format!("LEASEHOLD_CAMPAIGN_SEEDS={list:?}: {e}").into())
            })
            .collect();
    }
    if let Some(seed) = env_u64("LEASEHOLD_CAMPAIGN_SEED")? {
        return Ok(vec![seed]);
    }
    let fresh = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_secs());
    let mut all = fixed.to_vec();
    all.push(fresh);
    Ok(all)
}

/// A campaign run's size and lease settings: `LEASEHOLD_CAMPAIGN_SECS`,
/// `_CLIENTS` (default 4) and `_KEYS`, or the campaign's own defaults.
pub(crate) struct Settings {
    pub(crate) run_for: Duration,
    pub(crate) seed: u64,
    pub(crate) clients: usize,
    /// Lease keys, or for a counting campaign semaphores.
    pub(crate) keys: usize,
    pub(crate) ttl: Duration,
    /// Every take's; in a read-write run waiting [`RW_WAIT_TTLS`] ttls.
    pub(crate) options: LeaseOptions,
    /// `Some` for a counting campaign: clients take a permit of semaphore
    /// `sem<k>` with this limit instead of the lease `key<k>`.
    pub(crate) permits: Option<PermitLimit>,
    /// A read-write campaign: clients take a share of the read-write lease
    /// `rw<k>` instead, one take in [`WRITER_ONE_IN`] as its writer.
    pub(crate) rw: bool,
}

/// In a read-write campaign, one take in this many is a writer's.
pub(crate) const WRITER_ONE_IN: u32 = 3;

/// How many ttls every take of a read-write run waits (a ttl elsewhere).
/// A writer waits for every reader of its lease to leave, and readers hold
/// for several renew intervals: with a wait of one ttl most writers gave
/// up on a loaded machine (two writer holds in a run). A reader waits out the writers
/// before it: with a wait of one ttl, readers that gave up took again, a
/// third of them as writers, whose intents kept the next readers out, so
/// that writers followed writers (16 writer holds and never two readers
/// at once in a run). Waiting as long as writers, readers blocked by a
/// writer come in together once it is done.
pub(crate) const RW_WAIT_TTLS: u32 = 3;

/// A campaign client's options: `ttl`, waiting at most `wait`.
fn campaign_options(ttl: Duration, wait: Duration) -> Result<LeaseOptions, BoxError> {
    Ok(LeaseOptions::builder()
        .ttl(Ttl::new(ttl)?)
        .wait(wait)
        .name("campaign")
        .build()?)
}

impl Settings {
    pub(crate) fn from_env(
        seed: u64,
        ttl: Duration,
        secs: u64,
        keys: u64,
    ) -> Result<Self, BoxError> {
        Ok(Self {
            run_for: Duration::from_secs(env_u64("LEASEHOLD_CAMPAIGN_SECS")?.unwrap_or(secs)),
            seed,
            clients: usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_CLIENTS")?.unwrap_or(4))?.max(1),
            keys: usize::try_from(env_u64("LEASEHOLD_CAMPAIGN_KEYS")?.unwrap_or(keys))?.max(1),
            ttl,
            options: campaign_options(ttl, ttl)?,
            permits: None,
            rw: false,
        })
    }

    /// Makes the run a counting one: each client takes a permit of a
    /// semaphore with `limit` permits; `clients` unless
    /// `LEASEHOLD_CAMPAIGN_CLIENTS` says otherwise.
    pub(crate) fn counting(mut self, limit: u32, clients: usize) -> Result<Self, BoxError> {
        self.permits = Some(PermitLimit::new(limit)?);
        if env_u64("LEASEHOLD_CAMPAIGN_CLIENTS")?.is_none() {
            self.clients = clients;
        }
        Ok(self)
    }

    /// Makes the run a read-write one: each client takes a share of a
    /// read-write lease; `clients` unless `LEASEHOLD_CAMPAIGN_CLIENTS` says
    /// otherwise.
    pub(crate) fn read_write(mut self, clients: usize) -> Result<Self, BoxError> {
        self.rw = true;
        self.options = campaign_options(self.ttl, self.ttl * RW_WAIT_TTLS)?;
        if env_u64("LEASEHOLD_CAMPAIGN_CLIENTS")?.is_none() {
            self.clients = clients;
        }
        Ok(self)
    }

    pub(crate) fn renew_interval(&self) -> Duration {
        self.options.renew_interval()
    }

    /// The faults `draw` plans for this campaign.
    pub(crate) fn plan(&self, draw: fn(u64, PlanShape) -> FaultPlan) -> FaultPlan {
        draw(
            self.seed,
            PlanShape {
                run_for: self.run_for,
                clients: self.clients,
                ttl: self.ttl,
                renew_interval: self.renew_interval(),
            },
        )
    }
}

/// The lease keys of `keys` keys, of `keys` semaphores' permits, or of
/// `keys` read-write leases' writers (readers do not write).
fn store_keys(keys: usize, permits: Option<PermitLimit>, rw: bool) -> Vec<String> {
    (0..keys)
        .flat_map(|k| match permits {
            _ if rw => vec![format!("{{rw{k}}}:write")],
            None => vec![format!("key{k}")],
            Some(limit) => (0..limit.get())
                .map(|i| format!("{{sem{k}}}:permit:{i}"))
                .collect(),
        })
        .collect()
}

/// A fault as it happened: when it began and when it was healed.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub(crate) fault: Fault,
    pub(crate) began: Instant,
    pub(crate) healed: Instant,
    /// The same two moments on the host's wall clock ([`wall_us`]).
    pub(crate) began_us: u64,
    pub(crate) healed_us: u64,
}

impl Applied {
    /// Declares a fault that lost data to the history, on the terms on
    /// which the campaigns excuse an overlap after it: a new holder
    /// granted within a ttl of the healing, the old holder believing at
    /// most `believed` (a renew interval plus scheduling) after that, and
    /// its last write reaching the resource within [`RACE_WINDOW`] more.
    pub(crate) fn declare_loss(&self, history: &History, ttl: Duration, believed: Duration) {
        if self.fault.loses_data() {
            history.data_lost(self.began_us, self.healed_us, ttl, believed + RACE_WINDOW);
        }
    }
}

/// The check-then-write window: how long after its writer checked its
/// token a write may reach the resource and still count as the race
/// docs/design.md names ("a process paused between checking its token and
/// writing"). The flight is one pipelined MULTI/TIME/RPUSH/EVALSHA/EXEC on a
/// multiplexed loopback connection to a healthy server (well under a
/// millisecond) plus however long the client's task and the connection's
/// driver wait for one of the test's two worker threads, which run every
/// client, watcher, probe and proxy of three seeds side by side. Measured
/// longest flight per seed over 40 runs (4 full campaigns, with other
/// cargo builds on the 2 cores): 0.16–188 ms, median about 8 ms; the
/// window is that worst flight with a third again of headroom: 250 ms.
///
/// It is longer than the margin plus the drift allowance (100 + 12 ms at
/// the campaign's 1 s ttl). With the token firing that long before the
/// key can expire, a write checked before the firing meets a higher grant
/// only after a flight longer than that, the stall fencing exists for, and
/// that is what the window excuses. A token firing late could also hide
/// behind the window: the margin verdict (every token fired by deadline at
/// least the margin plus the drift allowance, less 25 ms, before the
/// server's expiry) fails that case on its own, and
/// `a_cut_off_holder_that_keeps_writing_makes_no_stale_write` judges a
/// cut-off writer with no window at all.
pub(crate) const RACE_WINDOW: Duration = Duration::from_millis(250);

/// Microseconds since the Unix epoch on this host's clock: the clock the
/// servers' `TIME` and MONITOR timestamps read.
pub(crate) fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A witness of a standalone lease server: its MONITOR feed, read on a
/// connection no fault touches (no proxy), records every grant and
/// renewal the server applied, with the server's own timestamps, into the
/// history. A restart ends the feed; [`Witness::attach`] again before any
/// client can reach the new server. A witness started with
/// [`Witness::start_reconnecting`] opens its feed again by itself the
/// moment the server cuts it (a sentinel reconfiguring the node ends its
/// normal clients, MONITOR feeds among them), and records each cut.
pub(crate) struct Witness {
    history: History,
    addr: SocketAddr,
    /// The end marker's receiver, while a feed runs.
    session: Option<mpsc::Receiver<()>>,
    /// The feed's current connection (its thread replaces it when it
    /// reconnects by itself).
    current: Arc<Mutex<Option<TcpStream>>>,
    /// Every grant this server's feed showed, in its order.
    grants: Arc<Mutex<Vec<Granted>>>,
    /// The server's moment (µs) of the latest grant its feed showed.
    latest: Arc<tokio::sync::watch::Sender<u64>>,
    reconnect: bool,
    /// Whether the feed is open now.
    live: Arc<AtomicBool>,
    /// Which feed thread is current: an older one neither records nor
    /// reconnects once it ends.
    generation: Arc<AtomicU64>,
    /// The cuts the feed reopened by itself, in order.
    cuts: Arc<Mutex<Vec<Cut>>>,
}

/// A cut in a reconnecting witness's feed: when it ended and when it was
/// open again (host clock, µs since the Unix epoch), and the clients that
/// may have sent a lease command meanwhile, unseen.
#[derive(Debug, Clone)]
pub(crate) struct Cut {
    pub(crate) at_us: u64,
    /// `None` when the server did not answer again within 5 s.
    pub(crate) back_us: Option<u64>,
    /// `CLIENT LIST` lines of clients that connected before the feed was
    /// open again and whose last command writes leases.
    pub(crate) unseen: Vec<String>,
}

/// A grant a witness saw its server make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Granted {
    /// The lease, named as the clients name it.
    pub(crate) key: String,
    pub(crate) token: u64,
    /// When the server made it (its clock, µs since the Unix epoch), at
    /// the latest.
    pub(crate) at_us: u64,
}

/// What marks the end of a MONITOR session, sent by [`Witness::finish`].
const WITNESS_END: &str = "leasehold-witness-end";

/// The commands by which clients grant, renew or free leases: a client
/// whose last command is one of them may have written one.
const LEASE_WRITES: &[&str] = &["evalsha", "eval", "set", "pexpire", "pexpireat", "del"];

/// Opens a MONITOR feed on `addr`; returns once the server has confirmed
/// it (every later command is seen), with the feed connection's client id.
fn open_feed(addr: SocketAddr) -> Result<(TcpStream, BufReader<TcpStream>, u64), BoxError> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    (&stream).write_all(b"CLIENT ID\r\nMONITOR\r\n")?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut id = String::new();
    reader.read_line(&mut id)?;
    let id: u64 = id
        .trim_end()
        .strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("CLIENT ID answered {id:?}"))?;
    let mut ok = String::new();
    reader.read_line(&mut ok)?;
    if ok.trim_end() != "+OK" {
        return Err(format!("MONITOR answered {ok:?}").into());
    }
    stream.set_read_timeout(None)?;
    Ok((stream, reader, id))
}

/// The normal clients of `addr` with an id below `feed_id` (connected
/// before that feed was open) whose last command writes leases.
fn lease_writers_before(addr: SocketAddr, feed_id: u64) -> Result<Vec<String>, BoxError> {
    let mut side = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    side.set_read_timeout(Some(Duration::from_secs(5)))?;
    side.write_all(b"CLIENT LIST TYPE normal\r\n")?;
    let mut reader = BufReader::new(side);
    let mut header = String::new();
    reader.read_line(&mut header)?;
    let len: usize = header
        .trim_end()
        .strip_prefix('$')
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("CLIENT LIST answered {header:?}"))?;
    let mut body = vec![0; len + 2];
    reader.read_exact(&mut body)?;
    let list = String::from_utf8_lossy(&body);
    let field = |line: &str, name: &str| -> Option<String> {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_owned)
    };
    Ok(list
        .lines()
        .filter(|line| {
            let id = field(line, "id").and_then(|i| i.parse::<u64>().ok());
            let cmd = field(line, "cmd").unwrap_or_default();
            id.is_some_and(|id| id < feed_id) && LEASE_WRITES.contains(&cmd.as_str())
        })
        .map(str::to_owned)
        .collect())
}

impl Witness {
    /// Starts watching the server at `addr`.
    pub(crate) fn start(addr: SocketAddr, history: &History) -> Result<Self, BoxError> {
        Self::started(addr, history, false)
    }

    /// Starts watching the server at `addr`, opening the feed again at
    /// once whenever the server cuts it.
    pub(crate) fn start_reconnecting(
        addr: SocketAddr,
        history: &History,
    ) -> Result<Self, BoxError> {
        Self::started(addr, history, true)
    }

    fn started(addr: SocketAddr, history: &History, reconnect: bool) -> Result<Self, BoxError> {
        let mut witness = Self {
            history: history.clone(),
            addr,
            session: None,
            current: Arc::default(),
            grants: Arc::default(),
            latest: Arc::new(tokio::sync::watch::Sender::new(0)),
            reconnect,
            live: Arc::default(),
            generation: Arc::default(),
            cuts: Arc::default(),
        };
        witness.attach()?;
        Ok(witness)
    }

    /// (Re)opens the MONITOR feed, once the server answers; returns when the
    /// server has confirmed it, so that every later command is seen. A
    /// reconnecting witness whose feed is open (it reopened it by itself)
    /// keeps it.
    pub(crate) fn attach(&mut self) -> TestResult {
        if self.reconnect && self.live.load(Ordering::SeqCst) {
            return Ok(());
        }
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if let Ok(mut current) = self.current.lock()
            && let Some(old) = current.take()
        {
            let _ = old.shutdown(Shutdown::Both);
        }
        let (stream, mut reader, _) = open_feed(self.addr)?;
        if let Ok(mut current) = self.current.lock() {
            *current = Some(stream.try_clone()?);
        }
        self.live.store(true, Ordering::SeqCst);
        let history = self.history.clone();
        let (grants, latest) = (Arc::clone(&self.grants), Arc::clone(&self.latest));
        let (live, current, cuts) = (
            Arc::clone(&self.live),
            Arc::clone(&self.current),
            Arc::clone(&self.cuts),
        );
        let generations = Arc::clone(&self.generation);
        let (reconnect, addr) = (self.reconnect, self.addr);
        let (ended, on_end) = mpsc::channel();
        std::thread::spawn(move || {
            let mut script_at = 0;
            loop {
                for line in (&mut reader).lines() {
                    let Ok(line) = line else { break };
                    if line.contains(WITNESS_END) {
                        let _ = ended.send(());
                        return;
                    }
                    if let Some(granted) = record_monitor_line(&line, &mut script_at, &history) {
                        latest.send_replace(granted.at_us);
                        if let Ok(mut grants) = grants.lock() {
                            grants.push(granted);
                        }
                    }
                }
                // The feed ended without its marker: the server cut it.
                if generations.load(Ordering::SeqCst) != generation {
                    return; // replaced by a later attach
                }
                live.store(false, Ordering::SeqCst);
                if !reconnect {
                    return;
                }
                let at_us = wall_us();
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                let reopened = loop {
                    match open_feed(addr) {
                        Ok(feed) => break Some(feed),
                        Err(_) if std::time::Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(_) => break None,
                    }
                };
                let Some((stream, next, id)) = reopened else {
                    if let Ok(mut cuts) = cuts.lock() {
                        cuts.push(Cut {
                            at_us,
                            back_us: None,
                            unseen: Vec::new(),
                        });
                    }
                    return;
                };
                let back_us = wall_us();
                live.store(true, Ordering::SeqCst);
                let unseen = lease_writers_before(addr, id)
                    .unwrap_or_else(|e| vec![format!("CLIENT LIST failed: {e}")]);
                if let Ok(mut cuts) = cuts.lock() {
                    cuts.push(Cut {
                        at_us,
                        back_us: Some(back_us),
                        unseen,
                    });
                }
                if let (Ok(mut current), Ok(clone)) = (current.lock(), stream.try_clone()) {
                    *current = Some(clone);
                }
                reader = next;
                script_at = 0;
            }
        });
        self.session = Some(on_end);
        Ok(())
    }

    /// The cuts this witness's feed reopened by itself since `from_us`
    /// (host clock, µs since the Unix epoch).
    pub(crate) fn cuts_since(&self, from_us: u64) -> Vec<Cut> {
        self.cuts.lock().map_or_else(
            |_| Vec::new(),
            |cuts| {
                cuts.iter()
                    .filter(|c| c.at_us >= from_us)
                    .cloned()
                    .collect()
            },
        )
    }

    /// The grants this server's feed showed from `from_us` to `to_us` (its
    /// clock, µs since the Unix epoch).
    pub(crate) fn grants_between(&self, from_us: u64, to_us: u64) -> Vec<Granted> {
        self.grants.lock().map_or_else(
            |_| Vec::new(),
            |grants| {
                grants
                    .iter()
                    .filter(|g| (from_us..=to_us).contains(&g.at_us))
                    .cloned()
                    .collect()
            },
        )
    }

    /// Waits, at most `limit`, until the feed has shown a grant the server
    /// made at `from_us` or later; says whether it did.
    pub(crate) async fn granted_since(&self, from_us: u64, limit: Duration) -> bool {
        let mut latest = self.latest.subscribe();
        timeout(limit, latest.wait_for(|&at| at >= from_us))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    /// Records the lease expiries a killed server's append-only files show
    /// and the feed missed ([`record_aof_expiries`]); returns how many.
    pub(crate) fn complete_from_aof(
        &self,
        server_dir: &std::path::Path,
        ttl: Duration,
    ) -> Result<usize, BoxError> {
        record_aof_expiries(server_dir, &self.history, ttl)
    }

    /// Sends the end marker on a connection of its own and waits until the
    /// feed has shown it: every command before it has been recorded.
    pub(crate) fn finish(mut self) -> TestResult {
        let Some(on_end) = self.session.take() else {
            return Ok(());
        };
        // Ended on purpose: no reconnection.
        self.generation.fetch_add(1, Ordering::SeqCst);
        let mut side = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))?;
        side.set_read_timeout(Some(Duration::from_secs(5)))?;
        side.write_all(format!("ECHO {WITNESS_END}\r\n").as_bytes())?;
        let mut reply = [0u8; 64];
        let _ = side.read(&mut reply)?;
        let seen = on_end.recv_timeout(Duration::from_secs(10));
        if let Ok(mut current) = self.current.lock()
            && let Some(stream) = current.take()
        {
            let _ = stream.shutdown(Shutdown::Both);
        }
        seen.map_err(|_| "the MONITOR feed never showed its end marker".into())
    }
}

/// Records a grant (`SET <lease> <holder>:<token>:<label> PX <ttl>`) or a
/// renewal (`PEXPIRE <lease> <ttl>`) run by a leasehold script, between the
/// moment its script started and the write's own line. The script's line
/// is fed before it runs, so the write counts from no earlier than that;
/// a command a script calls is fed after it ran, and counts from the
/// server's clock as it ran (Redis 7) or as the script's call began, a
/// moment before the script's line (Valkey 8), so the write's own line is
/// the latest moment it could count from.
/// A lease is named as the clients name it: `K` for `leasehold:{K}`, the
/// permit key `{S}:permit:<i>` for `leasehold:{S}:permit:<i>`.
/// Returns the grant, if the line is one.
fn record_monitor_line(line: &str, script_at: &mut u64, history: &History) -> Option<Granted> {
    let line = line.strip_prefix('+')?;
    let (ts, rest) = line.split_once(' ')?;
    let (secs, frac) = ts.split_once('.')?;
    let (Ok(secs), Ok(frac)) = (secs.parse::<u64>(), frac.parse::<u64>()) else {
        return None;
    };
    let at_us = secs * 1_000_000 + frac;
    let (who, args) = rest.split_once("] ")?;
    if !who.ends_with(" lua") {
        *script_at = at_us;
        return None;
    }
    let args: Vec<&str> = args.split(' ').map(|a| a.trim_matches('"')).collect();
    let key = lease_name;
    let ms = |a: &str| a.parse().ok().map(Duration::from_millis);
    match args.as_slice() {
        [cmd, lease, value, px, ttl]
            if cmd.eq_ignore_ascii_case("SET") && px.eq_ignore_ascii_case("PX") =>
        {
            let token = value.split(':').nth(1).and_then(|t| t.parse().ok());
            if let (Some(key), Some(token), Some(ttl)) = (key(lease), token, ms(ttl)) {
                let at = ServerTime::between(*script_at, at_us);
                history.granted(key.clone(), token, at, ttl);
                return Some(Granted { key, token, at_us });
            }
        }
        [cmd, lease, ttl] if cmd.eq_ignore_ascii_case("PEXPIRE") => {
            if let (Some(key), Some(ttl)) = (key(lease), ms(ttl)) {
                history.extended(key, ServerTime::between(*script_at, at_us), ttl);
            }
        }
        // A renewal names the instant itself: recorded as the ttl that the
        // history counts from the write's earliest moment, in whole
        // milliseconds, to reach it.
        [cmd, lease, expiry] if cmd.eq_ignore_ascii_case("PEXPIREAT") => {
            if let (Some(key), Ok(expiry_ms)) = (key(lease), expiry.parse::<u64>()) {
                let counted_from_ms = *script_at / 1_000;
                let ttl = Duration::from_millis(expiry_ms.saturating_sub(counted_from_ms));
                history.extended(key, ServerTime::between(*script_at, at_us), ttl);
            }
        }
        _ => {}
    }
    None
}

/// The lease a Redis key stores, named as the clients name it: `K` for
/// `leasehold:{K}`, the permit key `{S}:permit:<i>` for
/// `leasehold:{S}:permit:<i>`; `None` for any other key.
fn lease_name(redis_key: &str) -> Option<String> {
    let k = redis_key.strip_prefix("leasehold:")?;
    k.starts_with('{').then(|| {
        k.strip_prefix('{')
            .and_then(|k| k.strip_suffix('}'))
            .filter(|k| !k.contains('}'))
            .unwrap_or(k)
            .to_owned()
    })
}

/// Completes the MONITOR witness's record from the append-only files of a
/// server just killed with SIGKILL, and returns how many leases it
/// corrected. A killed server can have answered a write whose MONITOR line
/// it never sent: it writes its clients' output one connection after
/// another, and the kill can fall between the reply and the feed (seen
/// with a plain `SET` loop on Redis 7.0 and Valkey 8: a few kills in 20
/// left a reply out of the feed, its key in the AOF). The holder then
/// counts its validity from a renewal the witness never saw, and its token
/// seems to fire a renew interval after the server's expiry. With
/// `appendfsync always` the server appends every write to its AOF before
/// it answers, with the absolute expiry it set (`PXAT`, `PEXPIREAT`): for
/// each lease the AOF ends with, an expiry later than the witness's latest
/// is recorded as the extension the witness missed, and a token the
/// witness never saw granted as the grant it missed. The feed loses only
/// its last lines, so these come after every write it recorded, in the
/// order the server made them.
pub(crate) fn record_aof_expiries(
    server_dir: &std::path::Path,
    history: &History,
    ttl: Duration,
) -> Result<usize, BoxError> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(server_dir.join("appendonlydir"))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        // appendonly.aof.<sequence>.incr.aof, applied in sequence order.
        if let Some(seq) = name
            .strip_suffix(".incr.aof")
            .and_then(|n| n.rsplit('.').next())
            .and_then(|n| n.parse::<u64>().ok())
        {
            files.push((seq, path));
        }
    }
    files.sort();
    // Each lease's current token and absolute expiry (ms), as the AOF
    // leaves them.
    let mut leases: BTreeMap<String, (Option<u64>, u64)> = BTreeMap::new();
    for (_, path) in files {
        let bytes = std::fs::read(&path)?;
        for command in aof_commands(&bytes) {
            let args: Vec<&str> = command.iter().map(String::as_str).collect();
            match args.as_slice() {
                [cmd, redis_key, value, pxat, at]
                    if cmd.eq_ignore_ascii_case("SET") && pxat.eq_ignore_ascii_case("PXAT") =>
                {
                    if let (Some(lease), Ok(at)) = (lease_name(redis_key), at.parse()) {
                        let token = value.split(':').nth(1).and_then(|t| t.parse().ok());
                        leases.insert(lease, (token, at));
                    }
                }
                [cmd, redis_key, at] if cmd.eq_ignore_ascii_case("PEXPIREAT") => {
                    if let (Some(lease), Ok(at)) = (lease_name(redis_key), at.parse())
                        && let Some(current) = leases.get_mut(&lease)
                    {
                        current.1 = at;
                    }
                }
                [cmd, redis_keys @ ..]
                    if cmd.eq_ignore_ascii_case("DEL") || cmd.eq_ignore_ascii_case("UNLINK") =>
                {
                    for redis_key in redis_keys {
                        if let Some(lease) = lease_name(redis_key) {
                            leases.remove(&lease);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let ttl_us = u64::try_from(ttl.as_micros())?;
    // In the order the server wrote them (every write sets one ttl from
    // its moment): the feed lost a tail of its lines, so these come after
    // every write it showed.
    let mut missed: Vec<(u64, String, u64)> = leases
        .into_iter()
        .filter_map(|(lease, (token, expiry_ms))| Some((expiry_ms * 1_000, lease, token?)))
        .collect();
    missed.sort();
    let mut corrected = 0;
    for (expiry_us, lease, token) in missed {
        // The write that gave this expiry, one ttl before it.
        let at = ServerTime::between(expiry_us - ttl_us, expiry_us - ttl_us);
        match history.server_expiry_latest(&lease, token) {
            Some(latest) if latest >= expiry_us => continue,
            Some(_) => history.extended(lease, at, ttl),
            None => history.granted(lease, token, at, ttl),
        }
        corrected += 1;
    }
    Ok(corrected)
}

/// The commands of an AOF file (RESP arrays of bulk strings), up to the
/// first one it cannot read (a write cut short by the kill).
fn aof_commands(bytes: &[u8]) -> Vec<Vec<String>> {
    fn line<'a>(bytes: &'a [u8], at: &mut usize) -> Option<&'a [u8]> {
        let rest = bytes.get(*at..)?;
        let end = rest.windows(2).position(|w| w == b"\r\n")?;
        *at += end + 2;
        Some(&rest[..end])
    }
    fn number(line: &[u8], prefix: u8) -> Option<usize> {
        let (&first, digits) = line.split_first()?;
        (first == prefix).then_some(())?;
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
    let mut commands = Vec::new();
    let mut at = 0;
    'commands: while at < bytes.len() {
        let Some(count) = line(bytes, &mut at).and_then(|l| number(l, b'*')) else {
            break;
        };
        let mut args = Vec::with_capacity(count);
        for _ in 0..count {
            let Some(len) = line(bytes, &mut at).and_then(|l| number(l, b'$')) else {
                break 'commands;
            };
            let Some(arg) = bytes.get(at..at + len) else {
                break 'commands;
            };
            args.push(String::from_utf8_lossy(arg).into_owned());
            at += len + 2;
        }
        commands.push(args);
    }
    commands
}

/// A campaign's clients, running.
pub(crate) struct Clients {
    pub(crate) started: Instant,
    history: History,
    tally: Arc<Mutex<Tally>>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<TestResult>>,
    probes: Probes,
    permits: Option<PermitLimit>,
    rw: bool,
}

/// The side connections' looks still running after their client moved on.
type Probes = Arc<Mutex<Vec<JoinHandle<()>>>>;

impl Clients {
    /// Starts one client per manager, writing to `resource`, recording into
    /// `history`; `side` reads the lease server on connections of its own
    /// (no proxy, no fault of one client) when a token fires.
    pub(crate) async fn start(
        settings: &Settings,
        managers: &[LeaseManager<RedisBackend>],
        resource: &RedisServer,
        history: &History,
        side: Side,
    ) -> Result<Self, BoxError> {
        let tally = Arc::new(Mutex::new(Tally::default()));
        history.race_window(RACE_WINDOW);
        let stop = CancellationToken::new();
        let probes = Probes::default();
        let mut tasks = Vec::new();
        let mut stores = Vec::new();
        for _ in managers {
            stores.push(Resource::connect(resource).await?);
        }
        let started = Instant::now();
        for (i, (manager, store)) in managers.iter().zip(stores).enumerate() {
            tasks.push(tokio::spawn(client(Client {
                name: format!("c{i}"),
                manager: manager.clone(),
                options: settings.options.clone(),
                keys: settings.keys,
                permits: settings.permits,
                rw: settings.rw,
                history: history.clone(),
                tally: Arc::clone(&tally),
                resource: store,
                side: side.clone(),
                probes: Arc::clone(&probes),
                stop: stop.clone(),
                rng: fastrand::Rng::with_seed(settings.seed.wrapping_add(i as u64 + 1)),
            })));
        }
        Ok(Self {
            started,
            history: history.clone(),
            tally,
            stop,
            tasks,
            probes,
            permits: settings.permits,
            rw: settings.rw,
        })
    }

    /// Stops the clients and shuts the managers down, waits until the
    /// witnesses have recorded everything the servers did, adds what
    /// the two stores of each of the `keys` keys (or semaphores' permit
    /// keys) hold to the history, and checks it.
    pub(crate) async fn finish(
        self,
        managers: &[LeaseManager<RedisBackend>],
        resource: &RedisServer,
        keys: usize,
        witnesses: Vec<Witness>,
    ) -> Result<(Report, Tally), BoxError> {
        self.stop.cancel();
        for task in self.tasks {
            timeout(END_TIMEOUT, task)
                .await
                .map_err(|_| "a client did not stop within 30 s")???;
        }
        for manager in managers {
            timeout(END_TIMEOUT, manager.shutdown())
                .await
                .map_err(|_| "a manager did not shut down within 30 s")?;
        }
        let probes = std::mem::take(&mut *self.probes.lock().map_err(|_| "probes poisoned")?);
        for probe in probes {
            timeout(END_TIMEOUT, probe)
                .await
                .map_err(|_| "a side connection's probe did not end")??;
        }
        for witness in witnesses {
            tokio::task::block_in_place(|| witness.finish())?;
        }
        read_stores(
            &self.history,
            resource,
            &store_keys(keys, self.permits, self.rw),
        )
        .await?;
        let report = self.history.check();
        let tally = std::mem::take(&mut *self.tally.lock().map_err(|_| "tally poisoned")?);
        Ok((report, tally))
    }
}

/// Adds what both stores of each of `keys` hold to the history.
pub(crate) async fn read_stores(
    history: &History,
    resource: &RedisServer,
    keys: &[String],
) -> TestResult {
    let mut conn = redis::Client::open(resource.url())?
        .get_multiplexed_async_connection()
        .await?;
    for key in keys {
        let unfenced: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("res:{key}:unfenced"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let log: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("res:{key}:log"))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        let fenced = log
            .iter()
            .map(|e| e.split_once(':').map(|(_, id)| id.to_owned()))
            .collect::<Option<Vec<_>>>()
            .ok_or("malformed fenced store entry")?;
        history.stores(key.clone(), unfenced, fenced);
    }
    Ok(())
}

/// The two stores on the resource server, written in one transaction.
#[derive(Clone)]
pub(crate) struct Resource {
    pub(crate) conn: redis::aio::MultiplexedConnection,
    /// The SHA1 of `FENCED_WRITE_SCRIPT`, loaded on the resource server.
    pub(crate) sha: String,
}

impl Resource {
    /// Connects to the resource server and loads the fenced script.
    pub(crate) async fn connect(server: &RedisServer) -> Result<Self, BoxError> {
        let mut conn = redis::Client::open(server.url())?
            .get_multiplexed_async_connection()
            .await?;
        let sha = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(FENCED_WRITE_SCRIPT)
            .query_async(&mut conn)
            .await?;
        Ok(Self { conn, sha })
    }

    /// Writes `id` for the lease `key` with `token` to both stores and
    /// records the attempt; `checked_us` is when the writer checked its
    /// token (read with [`wall_us`] right after the check), `after_fire`
    /// what the check said. Returns whether the fenced store accepted it.
    pub(crate) async fn write(
        &mut self,
        history: &History,
        key: &str,
        holder: &str,
        id: String,
        token: u64,
        (checked_us, after_fire): (u64, bool),
    ) -> Result<bool, BoxError> {
        let ((secs, micros), _len, accepted): ((u64, u64), i64, i64) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .cmd("RPUSH")
            .arg(format!("res:{key}:unfenced"))
            .arg(&id)
            .cmd("EVALSHA")
            .arg(&self.sha)
            .arg(2)
            .arg(format!("res:{key}"))
            .arg(format!("res:{key}:log"))
            .arg(token)
            .arg(&id)
            .query_async(&mut self.conn)
            .await?;
        history.attempted(WriteAttempt {
            id,
            key: key.to_owned(),
            holder: holder.to_owned(),
            token,
            at_us: secs * 1_000_000 + micros,
            checked_us,
            after_fire,
        });
        Ok(accepted == 1)
    }
}

/// What every campaign asserts, whatever its faults: enough leases to
/// judge; the harness sane (every write in the unfenced store, no stale
/// write accepted by the fenced store once it had seen a higher token, no
/// write after its writer's token fired: its own script and checks make
/// these hold, so they prove nothing of leasehold); no stale write that
/// neither a declared data loss nor the check-then-write race excuses; and
/// tokens in order, as the holders saw them and as the server granted them
/// (when a witness recorded its grants).
pub(crate) fn assert_sound(report: &Report, seed: u64) {
    assert!(
        report.holds >= 10,
        "seed {seed}: too few leases to judge anything: {report}"
    );
    let writes = &report.writes;
    assert!(
        writes.unrecorded.is_empty(),
        "seed {seed}: harness sanity: writes missing from the unfenced store: {:?}",
        writes.unrecorded
    );
    assert!(
        writes.stale_fenced().is_empty(),
        "seed {seed}: harness sanity: stale writes accepted by the fenced store must be 0: {:#?}",
        writes.stale_fenced()
    );
    assert!(
        writes.after_fire.is_empty(),
        "seed {seed}: harness sanity: writes made after the writer's own token fired must be 0: {:#?}",
        writes.after_fire
    );
    // The verdict that depends on the library: a write that reached the
    // resource after the server had granted a higher token.
    assert!(
        writes.stale_unexcused().is_empty(),
        "seed {seed}: stale writes (a token below one the server had already granted) that neither a data loss nor the check-then-write race excuses must be 0: {:#?}",
        writes.stale_unexcused()
    );
    // The server's own record first: it is the stronger witness.
    assert!(
        report.grant_order.is_empty(),
        "seed {seed}: the server granted tokens not above ones it had granted before on the same key or semaphore: {:?}",
        report.grant_order
    );
    assert!(
        report.token_violations.is_empty(),
        "seed {seed}: fencing tokens did not increase: {:?}",
        report.token_violations
    );
}

/// A lease whose token fired, as its holder saw it.
#[derive(Debug, Clone)]
pub(crate) struct Fired {
    pub(crate) key: String,
    pub(crate) token: u64,
    pub(crate) reason: LossReason,
    pub(crate) acquired_at: Instant,
    pub(crate) at: Instant,
    /// The same moment on the host's wall clock, in µs since the epoch.
    pub(crate) at_us: u64,
    /// What a side connection saw of the lease right after.
    pub(crate) probe: Probe,
}

impl Fired {
    /// Names the lease in reports.
    pub(crate) fn lease(&self) -> String {
        format!("{} token {}", self.key, self.token)
    }

    /// How long after the firing a server-clock moment (µs since the
    /// epoch) came, in µs: negative when before.
    pub(crate) fn until(&self, server_us: u64) -> i64 {
        i64::try_from(server_us).unwrap_or(i64::MAX) - i64::try_from(self.at_us).unwrap_or(i64::MAX)
    }
}

/// A look at a lease on a side connection right after its token fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Still there with the holder's token: the server keeps it at least
    /// this long after the token fired (the probe's sending plus the PTTL
    /// the server answered).
    Present(Duration),
    /// Gone (or someone else's), answered this long after the token fired.
    Gone(Duration),
    /// No answer within the probe's timeout.
    Unanswered,
}

/// What the clients count beside the history.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) fired: Vec<Fired>,
    pub(crate) losses: BTreeMap<&'static str, usize>,
    /// For each lease whose token fired (by key and token): the latest
    /// moment the server was seen to keep it, after the firing (a side
    /// connection's sending plus the PTTL the server answered, the largest
    /// over its looks until the lease was gone); `None` if never seen.
    pub(crate) seen_kept: BTreeMap<(String, u64), Option<Duration>>,
}

impl Tally {
    /// The tokens fired by deadline.
    pub(crate) fn deadlines(&self) -> impl Iterator<Item = &Fired> {
        self.fired
            .iter()
            .filter(|f| f.reason == LossReason::Deadline)
    }
}

/// The server-judged margins of the fired tokens that `judged` selects,
/// whatever reason the library gave (a deadline it mislabelled as a loss
/// is judged all the same): the server's expiry of the lease (its last
/// grant or renewal, as the MONITOR feed showed it, plus the ttl) minus
/// the moment the token fired, in µs; negative when the token fired too
/// late. A lease with no recorded grant is returned as `None`.
pub(crate) fn server_margins<'a>(
    history: &History,
    tally: &'a Tally,
    judged: impl Fn(&Fired) -> bool,
) -> Vec<(&'a Fired, Option<i64>)> {
    tally
        .fired
        .iter()
        .filter(|f| judged(f))
        .map(|f| {
            let margin = history.server_expiry(&f.key, f.token).map(|e| f.until(e));
            (f, margin)
        })
        .collect()
}

/// One client's part in a campaign.
struct Client {
    name: String,
    manager: LeaseManager<RedisBackend>,
    options: LeaseOptions,
    keys: usize,
    permits: Option<PermitLimit>,
    rw: bool,
    history: History,
    tally: Arc<Mutex<Tally>>,
    resource: Resource,
    side: Side,
    probes: Probes,
    stop: CancellationToken,
    rng: fastrand::Rng,
}

/// Acquire → writes while the token is live → release, until stopped.
async fn client(mut c: Client) -> TestResult {
    let ttl = c.options.ttl().get();
    let renew = c.options.renew_interval();
    let mut writes = 0u64;
    while !c.stop.is_cancelled() {
        let k = c.rng.usize(..c.keys);
        let semaphore = format!("sem{k}");
        let rw = format!("rw{k}");
        // In a read-write run, the share this take asks for.
        let share = c.rw.then(|| {
            if c.rng.u32(..WRITER_ONE_IN) == 0 {
                Share::Writer
            } else {
                Share::Reader
            }
        });
        let called_at = Instant::now();
        let acquired = tokio::select! {
            biased;
            () = c.stop.cancelled() => break,
            acquired = async {
                match (share, c.permits) {
                    (Some(Share::Writer), _) => c.manager.acquire_write(&rw, &c.options).await,
                    (Some(_), _) => c.manager.acquire_read(&rw, &c.options).await,
                    (None, None) => c.manager.acquire(format!("key{k}"), &c.options).await,
                    (None, Some(limit)) => {
                        c.manager.acquire_permit(&semaphore, limit, &c.options).await
                    }
                }
            } => acquired,
        };
        let Ok(lease) = acquired else {
            // Held by another client, or the server is unreachable: the
            // acquire already waited; try again at once.
            continue;
        };
        let acquired_at = Instant::now();
        // The lease key, or the permit key won.
        let key = lease.server_key().as_str().to_owned();
        // Before any renewal, valid_until is counted from the acquisition's
        // sending: only used to order holds, never to judge a margin. A
        // permit's is not when it was granted: a retry after an attempt of
        // unknown outcome is answered with the permit that attempt took,
        // and its token, while other holders may have taken the
        // semaphore's other permits, with higher tokens, in between (seen
        // in seed 22 after a reset). So a permit counts as requested when
        // its acquisition began. (A lease cannot be granted to another
        // holder in between: the first attempt's grant holds it.) A share
        // likewise: its token comes from the counter of the whole
        // read-write lease, which other shares advance in between.
        let requested_at = match (share, c.permits) {
            (None, None) => lease.valid_until() - (ttl - leasehold::backend::clock_drift(ttl)),
            _ => called_at,
        };
        let token = lease.fencing_token().get();
        let hold = match (share, c.permits) {
            (Some(share), _) => c.history.acquired_share(
                &rw,
                share,
                &key,
                &c.name,
                token,
                requested_at,
                acquired_at,
            ),
            (None, None) => c
                .history
                .acquired(&key, &c.name, token, requested_at, acquired_at),
            (None, Some(_)) => c.history.acquired_permit(
                &semaphore,
                &key,
                &c.name,
                token,
                requested_at,
                acquired_at,
            ),
        };

        // Notes the moment the token fires and looks at the lease on a side
        // connection at once, on its own task so that a write in flight
        // does not delay either; then keeps looking, on a task of its own,
        // until the lease is gone. Bounded: a hold never outlives the wait.
        let fired = lease.token();
        let done = CancellationToken::new();
        let watcher = tokio::spawn({
            let done = done.clone();
            let mut side = c.side.clone();
            let key = key.clone();
            let tally = Arc::clone(&c.tally);
            let probes = Arc::clone(&c.probes);
            async move {
                let at = tokio::select! {
                    biased;
                    () = fired.cancelled() => (Instant::now(), wall_us()),
                    () = done.cancelled() => return None,
                    () = tokio::time::sleep(END_TIMEOUT) => return None,
                };
                // A connection dropped by a restart fails its first request
                // and reconnects: look again until answered, within the timeout.
                let first = timeout(PROBE_TIMEOUT, async {
                    loop {
                        let sent = Instant::now();
                        match side.look(&key).await {
                            Ok(seen) => break (sent, seen),
                            Err(_) => tokio::time::sleep(PROBE_EVERY).await,
                        }
                    }
                })
                .await;
                let probe = match first {
                    Ok((sent, Some((Some(t), left)))) if t == token => {
                        Probe::Present(sent + left - at.0)
                    }
                    Ok(_) => Probe::Gone(Instant::now() - at.0),
                    Err(_) => Probe::Unanswered,
                };
                let until_gone = tokio::spawn(async move {
                    let mut kept = None::<Duration>;
                    while at.0.elapsed() < ttl * 2 {
                        let sent = Instant::now();
                        match timeout(PROBE_TIMEOUT, side.look(&key)).await {
                            Ok(Ok(Some((Some(t), left)))) if t == token => {
                                let until = sent + left - at.0;
                                kept = Some(kept.map_or(until, |k| k.max(until)));
                            }
                            Ok(Ok(_)) => break,
                            Ok(Err(_)) | Err(_) => {}
                        }
                        tokio::time::sleep(PROBE_EVERY).await;
                    }
                    if let Ok(mut tally) = tally.lock() {
                        tally.seen_kept.insert((key, token), kept);
                    }
                });
                if let Ok(mut probes) = probes.lock() {
                    probes.push(until_gone);
                }
                Some((at, probe))
            }
        });

        for _ in 0..c.rng.u32(2..=6) {
            let after_fire = lease.token().is_cancelled();
            // Read after the check: a grant between the check and this
            // reading is not taken for the race.
            let checked_us = wall_us();
            if after_fire {
                break;
            }
            // A reader only holds: the writers' stores judge the writes.
            if share != Some(Share::Reader) {
                writes += 1;
                let id = format!("{}/{writes}", c.name);
                c.resource
                    .write(
                        &c.history,
                        &key,
                        &c.name,
                        id,
                        token,
                        (checked_us, after_fire),
                    )
                    .await?;
            }
            let pause = Duration::from_millis(c.rng.u64(0..=millis(renew * 2)));
            let live = lease.token();
            tokio::select! {
                () = live.cancelled() => break,
                () = tokio::time::sleep(pause) => {}
            }
        }
        let releasing_at = Instant::now();
        done.cancel();
        match timeout(END_TIMEOUT, watcher)
            .await
            .map_err(|_| "the watcher of a token did not end")??
        {
            Some(((fired_at, fired_us), probe)) => {
                let reason = lease.loss_reason().unwrap_or(LossReason::Lost);
                c.history.ended(
                    hold,
                    HoldEnd::Cancelled(reason.as_str().to_owned()),
                    fired_at,
                );
                let mut tally = c.tally.lock().map_err(|_| "tally poisoned")?;
                *tally.losses.entry(reason.as_str()).or_default() += 1;
                tally.fired.push(Fired {
                    key: key.clone(),
                    token,
                    reason,
                    acquired_at,
                    at: fired_at,
                    at_us: fired_us,
                    probe,
                });
            }
            None => c.history.ended(hold, HoldEnd::Released, releasing_at),
        }
        // Failures are fine: the lease then expires on its own.
        let _ = timeout(END_TIMEOUT, lease.release()).await;
    }
    Ok(())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
