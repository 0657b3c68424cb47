//! A rolling restart of three replicas of a singleton, each a process of
//! its own (this binary re-run with `LEASEHOLD_ROLLING_REPLICA` set) with
//! its own manager and connection to one real `redis-server`, each running
//! an `Election` on one key with a 3 s ttl and
//! `LeaseManager::shutdown_on_signal` (the one call a service makes for
//! SIGTERM). Three times: SIGTERM the current leader, wait for its exit,
//! start a new replica and wait until it campaigns too.
//!
//! The witness is the server's own clock: a side connection in MONITOR
//! mode sees every command the lease scripts run on the key, with the
//! server's timestamp (`[0 lua] "DEL" "leasehold:{rolling}"` for a release,
//! `"SET" ... "PX"` for a grant, `"PEXPIREAT"` for a renewal). For each
//! restart it takes the release of the old leader and the next grant, and
//! checks:
//!
//! - the old leader released the key (a DEL after the SIGTERM), rather
//!   than leaving it to expire;
//! - the **leaderless gap** on the server, release to grant, is below
//!   [`GAP_BOUND`] (250 ms): the release publishes a notice that the
//!   waiting followers are subscribed to, so one of them asks again at
//!   once, one round trip: about a millisecond on an idle machine; the
//!   bound leaves room for a loaded 2-core machine that schedules the
//!   follower's wake late;
//! - from the SIGTERM to the grant (this host's clock, which is the
//!   server's: both read the same system clock) is below
//!   [`SIGNAL_BOUND`] (500 ms): the old leader's own stop too (the signal
//!   handler, every lease's token fired, the election's work returning,
//!   the release's round trip);
//! - the grant went to another replica, with a higher fencing token.
//!
//! Without the graceful release, a SIGTERM kills the leader and its lease
//! expires on the server: the gap is the rest of its ttl, up to 3 s. To see
//! that (the red check), run with `LEASEHOLD_ROLLING_NO_RELEASE=1`: the
//! replicas then do not call `shutdown_on_signal`, no DEL is seen, and the
//! SIGTERM-to-grant gaps are printed at 2-3 s before the checks fail.
//!
//! It takes about 2 s. Every wait has a timeout. Skipped on the second
//! (Valkey) pass of scripts/test.sh: the mechanism is the client's.
//!
//! ```sh
//! cargo test --test rolling_restart -- --nocapture
//! ```

use std::collections::HashMap;
use std::env;
use std::error::Error;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::redis::RedisBackend;
use leasehold::{CancellationToken, Election, LeaseManager, LeaseOptions, Ttl};
use leasehold_testkit::RedisServer;

type Result<T, E = Box<dyn Error>> = std::result::Result<T, E>;

/// Set in a replica: its label. The others follow.
const REPLICA: &str = "LEASEHOLD_ROLLING_REPLICA";
const URL: &str = "LEASEHOLD_ROLLING_URL";
/// The red check: replicas that leave SIGTERM to its default action.
const NO_RELEASE: &str = "LEASEHOLD_ROLLING_NO_RELEASE";

/// The election's key, and the lease's key on the server.
const KEY: &str = "rolling";
const SERVER_KEY: &str = "leasehold:{rolling}";
const CHANNEL: &str = "leasehold:{rolling}:released";
const TTL: &str = "3s";

/// The release-to-grant bound on the server (see the module comment).
const GAP_BOUND: Duration = Duration::from_millis(250);
/// The SIGTERM-to-grant bound (see the module comment).
const SIGNAL_BOUND: Duration = Duration::from_millis(500);
/// How many restarts, and replicas at a time.
const RESTARTS: usize = 3;
const REPLICAS: usize = 3;

fn main() -> ExitCode {
    let result = match env::var(REPLICA) {
        Ok(label) => replica(&label),
        Err(_) => rolling_restart(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("rolling_restart: {error}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------- replica

/// One replica: campaigns and leads until SIGTERM, then shuts down (with
/// the graceful release, unless told not to). Says what it does on stdout,
/// one line each; ends when its parent goes (stdin closed).
fn replica(label: &str) -> Result<()> {
    let url = env::var(URL)?;
    let graceful = env::var_os(NO_RELEASE).is_none();
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(3);
    });
    let say = |line: &str| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let manager = LeaseManager::new(RedisBackend::connect(url.as_str()).await?)?;
        let stop = if graceful {
            // The one call: SIGTERM and SIGINT release every lease.
            manager.shutdown_on_signal()?
        } else {
            CancellationToken::new()
        };
        let options = LeaseOptions::builder()
            .ttl(Ttl::parse(TTL)?)
            .name("rolling")
            .label(label)
            .build()?;
        let election = Election::new(manager.clone(), KEY, options)?;
        say("campaigning");
        election
            .run(stop, |work| async move {
                say(&format!("leading {}", work.fencing_token()));
                work.cancelled().await;
                say(&format!("stepping down: {:?}", work.loss_reason()));
            })
            .await?;
        manager.shutdown().await;
        say("stopped");
        Ok(())
    })
}

// ------------------------------------------------------------------ test

/// A line a replica printed, and when it was read.
struct Said {
    label: String,
    line: String,
}

struct Replica {
    label: String,
    child: Child,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_replica(label: &str, url: &str, said: &Sender<Said>) -> Result<Replica> {
    let mut command = Command::new(env::current_exe()?);
    command
        .env(REPLICA, label)
        .env(URL, url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if env::var_os(NO_RELEASE).is_some() {
        command.env(NO_RELEASE, "1");
    }
    let mut child = command.spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (said, label_owned) = (said.clone(), label.to_owned());
    std::thread::spawn(move || {
        for line in BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
        {
            let _ = said.send(Said {
                label: label_owned.clone(),
                line,
            });
        }
    });
    Ok(Replica {
        label: label.to_owned(),
        child,
    })
}

/// Waits for a replica's line starting with `prefix` (from `label` if
/// given), up to `limit`; other lines are printed and skipped.
fn wait_for(
    said: &Receiver<Said>,
    label: Option<&str>,
    prefix: &str,
    limit: Duration,
) -> Result<Said> {
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = said
            .recv_timeout(left)
            .map_err(|_| format!("no {prefix:?} from {label:?} within {limit:?}"))?;
        println!("  {}: {}", next.label, next.line);
        if next.line.starts_with(prefix) && label.is_none_or(|l| l == next.label) {
            return Ok(next);
        }
    }
}

/// Waits until `n` connections listen for the key's release notices: the
/// followers, each waiting for the leader's release.
fn until_listening(server: &RedisServer, n: usize, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let reply = server.cli(&["PUBSUB", "NUMSUB", CHANNEL])?;
        let listening: usize = reply
            .lines()
            .nth(1)
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        if listening >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{listening} of {n} followers listening after {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every line of a MONITOR session on a side connection, as it comes.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stream: TcpStream,
}

impl Monitor {
    fn start(server: &RedisServer) -> Result<Self> {
        let mut stream = TcpStream::connect(server.addr())?;
        stream.write_all(b"MONITOR\r\n")?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut ok = String::new();
        reader.read_line(&mut ok)?;
        if ok.trim_end() != "+OK" {
            return Err(format!("MONITOR answered {ok:?}").into());
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let kept = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in reader.lines().map_while(std::result::Result::ok) {
                kept.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(line);
            }
        });
        Ok(Self { lines, stream })
    }

    fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Microseconds since 1970, on the system clock (the server's too).
fn micros(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// What a script did to the lease's key, as MONITOR showed it.
#[derive(Debug, Clone)]
enum Op {
    /// Granted: the value's label and fencing token.
    Set {
        label: String,
        token: u64,
    },
    Renew,
    Delete,
}

/// The lease's key's operations, with the server's timestamps (µs).
fn key_ops(lines: &[String]) -> Vec<(i64, Op)> {
    let mut ops = Vec::new();
    for line in lines {
        // +1796168802.523852 [0 lua] "SET" "leasehold:{k}" "<value>" "PX" "3000"
        let line = line.trim_start_matches('+');
        let Some((stamp, rest)) = line.split_once(' ') else {
            continue;
        };
        let Some((secs, frac)) = stamp.split_once('.') else {
            continue;
        };
        let (Ok(secs), Ok(frac)) = (secs.parse::<i64>(), frac.parse::<i64>()) else {
            continue;
        };
        let at = secs * 1_000_000 + frac;
        let Some((_, args)) = rest.split_once("] ") else {
            continue;
        };
        let args: Vec<&str> = args.trim_matches('"').split("\" \"").collect();
        if args.get(1) != Some(&SERVER_KEY) {
            continue;
        }
        let op = match args[0].to_ascii_uppercase().as_str() {
            "SET" => {
                // <holder>:<token>:<label>
                let mut value = args.get(2).unwrap_or(&"").splitn(3, ':');
                let _holder = value.next();
                let token = value.next().and_then(|t| t.parse().ok()).unwrap_or(0);
                let label = value.next().unwrap_or_default().to_owned();
                Op::Set { label, token }
            }
            "PEXPIRE" | "PEXPIREAT" => Op::Renew,
            "DEL" => Op::Delete,
            _ => continue,
        };
        ops.push((at, op));
    }
    ops
}

/// One leader change, as the server saw it.
#[derive(Debug)]
struct Handover {
    from: String,
    to: String,
    tokens: (u64, u64),
    /// The old leader's release after the SIGTERM (µs), if it released.
    released_at: Option<i64>,
    /// SIGTERM to the release (the old leader's stop), release to grant
    /// (the gap on the server), SIGTERM to grant.
    stop: Option<Duration>,
    gap: Option<Duration>,
    signal_to_grant: Duration,
}

fn us(n: i64) -> Duration {
    Duration::from_micros(u64::try_from(n.max(0)).unwrap_or(0))
}

fn rolling_restart() -> Result<()> {
    if leasehold_testkit::skip_on_second_pass("rolling_restart") {
        return Ok(());
    }
    let started = Instant::now();
    let red = env::var_os(NO_RELEASE).is_some();
    let server = RedisServer::start()?;
    let monitor = Monitor::start(&server)?;
    let url = server.url();
    let (tell, said) = channel();

    let mut replicas: HashMap<String, Replica> = HashMap::new();
    for n in 1..=REPLICAS {
        let label = format!("replica-{n}");
        replicas.insert(label.clone(), start_replica(&label, &url, &tell)?);
    }
    let mut leader = wait_for(&said, None, "leading", Duration::from_secs(10))?.label;
    until_listening(&server, REPLICAS - 1, Duration::from_secs(10))?;

    // (old leader, when it was sent SIGTERM)
    let mut signalled: Vec<(String, SystemTime)> = Vec::new();
    for restart in 1..=RESTARTS {
        println!("restart {restart}: SIGTERM to the leader, {leader}");
        let mut old = replicas.remove(&leader).ok_or("no such replica")?;
        let sent = SystemTime::now();
        let killed = Command::new("kill")
            .args(["-TERM", &old.child.id().to_string()])
            .status()?;
        assert!(killed.success(), "kill -TERM failed");
        signalled.push((leader.clone(), sent));
        // Its exit: at once with the graceful shutdown (0), killed by the
        // signal without it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = old.child.try_wait()? {
                break status;
            }
            assert!(Instant::now() < deadline, "{} did not exit", old.label);
            std::thread::sleep(Duration::from_millis(5));
        };
        println!("  {} exited: {status}", old.label);
        if !red {
            assert!(status.success(), "{} exited with {status}", old.label);
        }
        drop(old);
        leader = wait_for(&said, None, "leading", Duration::from_secs(10))?.label;
        // A new replica in its place, campaigning before the next restart.
        let label = format!("replica-{}", REPLICAS + restart);
        replicas.insert(label.clone(), start_replica(&label, &url, &tell)?);
        wait_for(&said, Some(&label), "campaigning", Duration::from_secs(10))?;
        until_listening(&server, REPLICAS - 1, Duration::from_secs(10))?;
    }
    let restarts_took = started.elapsed();
    // The server has run every command the restarts made; what follows
    // (the last replicas' shutdown) is not measured.
    let lines = monitor.lines();
    drop(monitor);
    for (_, mut replica) in replicas.drain() {
        let _ = Command::new("kill")
            .args(["-TERM", &replica.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while replica.child.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // Each grant after the first is a handover; the old leader's release,
    // if any, is the last DEL before it.
    let ops = key_ops(&lines);
    let grants: Vec<(i64, String, u64)> = ops
        .iter()
        .filter_map(|(at, op)| match op {
            Op::Set { label, token } => Some((*at, label.clone(), *token)),
            _ => None,
        })
        .collect();
    assert_eq!(
        grants.len(),
        RESTARTS + 1,
        "grants seen by MONITOR: {grants:?}"
    );
    let mut handovers = Vec::new();
    for (i, (old, sent)) in signalled.iter().enumerate() {
        let (granted_at, ref to, token) = grants[i + 1];
        let (_, ref from, old_token) = grants[i];
        let sent = micros(*sent);
        let released_at = ops
            .iter()
            .filter(|(at, op)| matches!(op, Op::Delete) && *at >= sent && *at <= granted_at)
            .map(|(at, _)| *at)
            .next_back();
        assert_eq!(
            from,
            old,
            "the grant before restart {} was not the leader's",
            i + 1
        );
        handovers.push(Handover {
            from: from.clone(),
            to: to.clone(),
            tokens: (old_token, token),
            released_at,
            stop: released_at.map(|at| us(at - sent)),
            gap: released_at.map(|at| us(granted_at - at)),
            signal_to_grant: us(granted_at - sent),
        });
    }
    println!(
        "restart  from       to         release (SIGTERM to DEL)  gap on the server (DEL to grant)  SIGTERM to grant"
    );
    for (i, h) in handovers.iter().enumerate() {
        println!(
            "{:<8} {:<10} {:<10} {:<25} {:<33} {:?}",
            i + 1,
            h.from,
            h.to,
            h.stop.map_or("none".to_owned(), |d| format!("{d:?}")),
            h.gap
                .map_or("none (expired)".to_owned(), |d| format!("{d:?}")),
            h.signal_to_grant,
        );
    }
    println!(
        "{RESTARTS} restarts in {restarts_took:.1?}, {:.1?} in all",
        started.elapsed()
    );

    for (i, h) in handovers.iter().enumerate() {
        let restart = i + 1;
        assert_ne!(
            h.to, h.from,
            "restart {restart}: the old leader was granted again"
        );
        assert!(
            h.tokens.1 > h.tokens.0,
            "restart {restart}: tokens {:?}",
            h.tokens
        );
        assert!(
            h.released_at.is_some(),
            "restart {restart}: {} did not release the lease (no DEL after the SIGTERM); \
             the next grant came {:?} after the SIGTERM",
            h.from,
            h.signal_to_grant
        );
        let gap = h.gap.unwrap_or(Duration::MAX);
        assert!(
            gap < GAP_BOUND,
            "restart {restart}: a leaderless gap of {gap:?} on the server, over {GAP_BOUND:?}"
        );
        assert!(
            h.signal_to_grant < SIGNAL_BOUND,
            "restart {restart}: {:?} from the SIGTERM to the next grant, over {SIGNAL_BOUND:?}",
            h.signal_to_grant
        );
    }
    println!("rolling_restart: ok");
    Ok(())
}
