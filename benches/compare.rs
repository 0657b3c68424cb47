//! One build against another: the figures `scripts/compare.sh` prints side
//! by side. The script copies this file into a checkout of an earlier
//! commit and builds it there as well, so it uses only the public API that
//! every build it is meant for has (`LeaseManager::acquire`,
//! `Lease::release`, `Lease::token`, `RedisBackend::builder`, the testkit's
//! `RedisServer`), and nothing of `benches/common`.
//!
//! Each run measures one mode and prints one JSON line (the restart mode:
//! one per round); the script repeats the runs, alternating the builds, and
//! takes the medians. Modes (the first argument that is not a flag):
//!
//! - `cycle-sequential`: one task acquiring and releasing one key through
//!   `LeaseManager` on a current-thread runtime (the script pins it, and the
//!   server it starts, to one core with `taskset -c 0`);
//! - `cycle-64-current`, `cycle-64-multi`: 64 tasks on 64 keys, on a
//!   current-thread and on a two-worker multi-thread runtime;
//! - `processes`: 16 OS processes (this binary again), one manager and one
//!   worker each on one key, each hold 1 ms, checked by a witness counter
//!   on the server (a second holder fails the run);
//! - `restart`: a holder's server is killed (SIGKILL) and restarted empty on
//!   the same port; a contender on its own connection sends `SET NX PX`
//!   every millisecond from the moment of the kill. The server's `MONITOR`
//!   (attached over a unix socket before the restarted server opens its TCP
//!   port, so it sees every connection) gives the contender's grant and the
//!   instant the holder's renewal connection spoke to the restarted server
//!   first; the holder's thread records when its token fired.
//!
//! Settings: `LEASEHOLD_COMPARE_SECS` (seconds per cycle run, default 2;
//! per processes run, default 5), `LEASEHOLD_COMPARE_PROCESSES` (default
//! 16), `LEASEHOLD_COMPARE_ROUNDS` (restarts per restart run, default 3).
//! Without `--bench` (as `cargo test --all-targets` runs it), every mode
//! runs once in a tiny configuration, to show that it works.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::redis::RedisBackend;
use leasehold::{LeaseManager, LeaseOptions, ReleaseOutcome, Ttl};
use leasehold_testkit::RedisServer;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Result<T = (), E = BoxError> = std::result::Result<T, E>;

const MODES: &[&str] = &[
    "cycle-sequential",
    "cycle-64-current",
    "cycle-64-multi",
    "processes",
    "restart",
];

/// Tasks in the concurrent cycle modes.
const TASKS: usize = 64;
/// The processes mode's hold.
const HOLD: Duration = Duration::from_millis(1);
/// The restart mode's lease ttl: renewed every 667 ms.
const RESTART_TTL: &str = "2s";
/// How long the holder keeps its lease before the kill: past its first renewal.
const HELD_BEFORE_KILL: Duration = Duration::from_millis(1200);
/// The bound on every wait of the restart mode (a server start, a token, a grant).
const WAIT_LIMIT: Duration = Duration::from_secs(10);
const RESTART_KEY: &str = "compare-restart";

fn quick() -> bool {
    match std::env::var("LEASEHOLD_BENCH_QUICK") {
        Ok(v) => v != "0",
        Err(_) => !std::env::args().any(|a| a == "--bench"),
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

fn main() -> Result {
    if let Ok(index) = std::env::var("LEASEHOLD_COMPARE_CHILD") {
        return processes_child(&index);
    }
    let quick = quick();
    let mode = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    match mode.as_deref() {
        Some(mode) => run_mode(mode, quick),
        None if quick => MODES.iter().try_for_each(|mode| run_mode(mode, true)),
        None => Err(format!("name a mode: {}", MODES.join(", ")).into()),
    }
}

fn run_mode(mode: &str, quick: bool) -> Result {
    let secs = |default| Duration::from_secs(env_number("LEASEHOLD_COMPARE_SECS", default));
    match mode {
        "cycle-sequential" => cycle(mode, Runtime::Current, 1, secs(2), quick),
        "cycle-64-current" => cycle(mode, Runtime::Current, TASKS, secs(2), quick),
        "cycle-64-multi" => cycle(mode, Runtime::Multi, TASKS, secs(2), quick),
        "processes" => {
            let n = if quick {
                2
            } else {
                env_number("LEASEHOLD_COMPARE_PROCESSES", 16)
            };
            let length = if quick {
                Duration::from_millis(300)
            } else {
                secs(5)
            };
            processes(n, length)
        }
        "restart" => {
            let rounds = if quick {
                1
            } else {
                env_number("LEASEHOLD_COMPARE_ROUNDS", 3)
            };
            (0..rounds).try_for_each(restart_round)
        }
        other => Err(format!("unknown mode {other}; modes: {}", MODES.join(", ")).into()),
    }
}

#[derive(Clone, Copy)]
enum Runtime {
    Current,
    Multi,
}

impl Runtime {
    fn build(self) -> Result<tokio::runtime::Runtime> {
        Ok(match self {
            Self::Current => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
            Self::Multi => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?,
        })
    }
}

/// The median of some numbers.
fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `tasks` tasks, each acquiring and releasing its own key through one
/// manager for `length` (after a warm-up of a tenth of it).
fn cycle(mode: &str, runtime: Runtime, tasks: usize, length: Duration, quick: bool) -> Result {
    let server = RedisServer::start()?;
    let url = server.url();
    let stats = &server;
    let (cycles_per_sec, acquire_p50_us, cycles, before) =
        runtime.build()?.block_on(async move {
            let manager = LeaseManager::new(RedisBackend::builder(url).connect().await?)?;
            let options = LeaseOptions::with_ttl(Ttl::parse("30s")?);
            let run = |length: Duration, quick: bool| {
                let (manager, options) = (manager.clone(), options.clone());
                async move {
                    let end = Instant::now() + length;
                    let handles: Vec<_> = (0..tasks)
                        .map(|task| {
                            let (manager, options) = (manager.clone(), options.clone());
                            tokio::spawn(async move {
                                let key = format!("compare:cycle:{task}");
                                let mut acquire = Vec::new();
                                while if quick {
                                    acquire.len() < 20
                                } else {
                                    Instant::now() < end
                                } {
                                    let asked = Instant::now();
                                    let lease = manager.acquire(&key, &options).await?;
                                    acquire.push(asked.elapsed().as_secs_f64() * 1e6);
                                    if lease.loss_reason().is_some() {
                                        return Err::<_, BoxError>(
                                            format!("{key}: lost while held").into(),
                                        );
                                    }
                                    if lease.release().await? != ReleaseOutcome::Released {
                                        return Err(
                                            format!("{key}: the release found it gone").into()
                                        );
                                    }
                                }
                                Ok(acquire)
                            })
                        })
                        .collect();
                    let started = Instant::now();
                    let mut all = Vec::new();
                    for handle in handles {
                        all.extend(handle.await??);
                    }
                    let elapsed = started.elapsed().as_secs_f64();
                    let cycles = all.len();
                    Ok::<_, BoxError>((cycles as f64 / elapsed, median(&mut all), cycles))
                }
            };
            run(length / 10, quick).await?;
            // The server's own counts from here: how many script calls and how
            // much of its CPU the measured cycles took (a batch is one call).
            let before = ServerStats::read(stats)?;
            let (per_sec, p50, cycles) = run(length, quick).await?;
            manager.shutdown().await;
            Ok::<_, BoxError>((per_sec, p50, cycles, before))
        })?;
    let spent = ServerStats::read(&server)?.since(&before);
    let per_cycle = |x: f64| x / cycles.max(1) as f64;
    println!(
        "{{\"mode\":\"{mode}\",\"cycles_per_sec\":{cycles_per_sec:.0},\"acquire_p50_us\":{acquire_p50_us:.1},\"server_cpu_us_per_cycle\":{:.2},\"script_calls_per_cycle\":{:.3}}}",
        per_cycle(spent.cpu_us),
        per_cycle(spent.script_calls),
    );
    Ok(())
}

/// What the server reports of its own work: CPU (user + system) and
/// script calls (`EVALSHA`, `EVAL`) since it started.
struct ServerStats {
    cpu_us: f64,
    script_calls: f64,
}

impl ServerStats {
    fn read(server: &RedisServer) -> Result<Self> {
        let info = server.cli(&["INFO", "all"])?;
        let field = |line: &str, name: &str| -> Option<f64> {
            line.strip_prefix(name)?
                .strip_prefix(':')?
                .trim()
                .parse()
                .ok()
        };
        let mut stats = Self {
            cpu_us: 0.0,
            script_calls: 0.0,
        };
        for line in info.lines() {
            if let Some(s) = field(line, "used_cpu_user").or_else(|| field(line, "used_cpu_sys")) {
                stats.cpu_us += s * 1e6;
            }
            // cmdstat_evalsha:calls=N,usec=...
            if let Some(rest) = line
                .strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| line.strip_prefix("cmdstat_eval:calls="))
            {
                let calls = rest.split(',').next().unwrap_or("0");
                stats.script_calls += calls.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
        Ok(stats)
    }

    fn since(&self, earlier: &Self) -> Self {
        Self {
            cpu_us: self.cpu_us - earlier.cpu_us,
            script_calls: self.script_calls - earlier.script_calls,
        }
    }
}

fn epoch_ms() -> Result<u64> {
    Ok(u64::try_from(
        SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis(),
    )?)
}

/// 16 processes (this binary again) take turns on one key.
fn processes(n: u64, length: Duration) -> Result {
    let server = RedisServer::start()?;
    // Time for every process to start and connect before the common start.
    let start_at = epoch_ms()? + 1_500;
    let exe = std::env::current_exe()?;
    let children: Vec<Child> = (0..n)
        .map(|index| {
            Command::new(&exe)
                .env("LEASEHOLD_COMPARE_CHILD", index.to_string())
                .env("LEASEHOLD_COMPARE_URL", server.url())
                .env("LEASEHOLD_COMPARE_START_AT", start_at.to_string())
                .env(
                    "LEASEHOLD_COMPARE_LENGTH_MS",
                    length.as_millis().to_string(),
                )
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut counts = Vec::new();
    let mut waits = Vec::new();
    let mut failed = None;
    for mut child in children {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            stdout.read_to_string(&mut out)?;
        }
        let status = child.wait()?;
        if !status.success() {
            failed.get_or_insert(format!("a process failed: {status}"));
            continue;
        }
        let line = out
            .lines()
            .find_map(|l| l.strip_prefix("waits_us"))
            .ok_or("a process printed no record")?;
        let mine: Vec<f64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        counts.push(mine.len() as f64);
        waits.extend(mine);
    }
    if let Some(failed) = failed {
        return Err(failed.into());
    }
    waits.sort_by(f64::total_cmp);
    let p99 = waits
        .get(((waits.len().max(1) - 1) as f64 * 0.99).round() as usize)
        .copied()
        .unwrap_or(f64::NAN);
    let fewest = counts.iter().copied().fold(f64::INFINITY, f64::min);
    let most = counts.iter().copied().fold(0.0, f64::max);
    println!(
        "{{\"mode\":\"processes\",\"processes\":{n},\"per_second\":{:.0},\"wait_p50_ms\":{:.2},\"wait_p99_ms\":{:.2},\"fairness\":{:.2}}}",
        waits.len() as f64 / length.as_secs_f64(),
        median(&mut waits.clone()) / 1e3,
        p99 / 1e3,
        if most > 0.0 { fewest / most } else { 0.0 },
    );
    Ok(())
}

/// One process of the processes mode: one manager, one worker, one key.
fn processes_child(index: &str) -> Result {
    let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
    let url = var("LEASEHOLD_COMPARE_URL")?;
    let start_at: u64 = var("LEASEHOLD_COMPARE_START_AT")?.parse()?;
    let length = Duration::from_millis(var("LEASEHOLD_COMPARE_LENGTH_MS")?.parse()?);
    // What `#[tokio::main]` builds.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let waits = runtime.block_on(async {
        let mut witness = redis::Client::open(url.as_str())?
            .get_multiplexed_async_connection()
            .await?;
        let manager = LeaseManager::new(RedisBackend::builder(url.as_str()).connect().await?)?;
        let options = LeaseOptions::builder()
            .wait(Duration::from_secs(30))
            .build()?;
        let start = tokio::time::Instant::now()
            + Duration::from_millis(start_at.saturating_sub(epoch_ms()?));
        let end = start + length;
        tokio::time::sleep_until(start).await;
        let mut waits = Vec::new();
        while tokio::time::Instant::now() < end {
            let asked = Instant::now();
            let lease = manager.acquire("compare-processes", &options).await?;
            waits.push(asked.elapsed().as_micros());
            let holders: i64 = redis::cmd("INCR")
                .arg("compare-witness")
                .query_async(&mut witness)
                .await?;
            if holders != 1 {
                return Err::<_, BoxError>(format!("{holders} holders at once").into());
            }
            // A thread sleep, as work that waits on something else would.
            std::thread::sleep(HOLD);
            let _: i64 = redis::cmd("DECR")
                .arg("compare-witness")
                .query_async(&mut witness)
                .await?;
            if lease.loss_reason().is_some() {
                return Err("lost while held".into());
            }
            if lease.release().await? != ReleaseOutcome::Released {
                return Err("the release found the lease gone".into());
            }
        }
        manager.shutdown().await;
        Ok(waits)
    });
    match waits {
        Ok(waits) => {
            let list: Vec<String> = waits.iter().map(u128::to_string).collect();
            println!("waits_us {}", list.join(" "));
            Ok(())
        }
        Err(error) => {
            eprintln!("process {index}: {error}");
            std::process::exit(3);
        }
    }
}

/// A `redis-server` of the restart mode's own: a TCP port for the clients
/// and a unix socket for the bench.
struct Server {
    binary: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Server {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// Starts the server; with `listening` false, on the unix socket only.
    fn spawn(&mut self, listening: bool) -> Result {
        let port = if listening { self.port } else { 0 };
        let socket = self.socket();
        let child = Command::new(&self.binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--unixsocket",
                &socket.to_string_lossy(),
                "--unixsocketperm",
                "700",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", &self.dir.path().to_string_lossy()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let deadline = Instant::now() + WAIT_LIMIT;
        while command(&socket, &["PING"]).ok().as_deref() != Some("+PONG") {
            if Instant::now() >= deadline {
                return Err("the server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    fn kill(&mut self) -> Result {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// One command over the unix socket; the reply's first line, or for a bulk
/// string its content.
fn command(socket: &Path, args: &[&str]) -> Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(WAIT_LIMIT))?;
    stream.write_all(&encode(args))?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end().to_owned();
    if let Some(len) = line.strip_prefix('$') {
        let len: i64 = len.parse()?;
        if len < 0 {
            return Ok(String::new());
        }
        let mut body = vec![0; usize::try_from(len)? + 2];
        reader.read_exact(&mut body)?;
        body.truncate(body.len() - 2);
        return Ok(String::from_utf8_lossy(&body).into_owned());
    }
    Ok(line)
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n{arg}\r\n", arg.len()).into_bytes());
    }
    out
}

/// One command as the server's `MONITOR` printed it.
#[derive(Debug, Clone)]
struct Seen {
    at: SystemTime,
    /// The client's address, or `lua` for a command a script ran.
    client: String,
    args: Vec<String>,
}

/// Parses `1700000000.123456 [0 127.0.0.1:5555] "SET" "k" "v"`.
fn parse_monitor(line: &str) -> Option<Seen> {
    let (stamp, rest) = line.split_once(' ')?;
    let (secs, micros) = stamp.split_once('.')?;
    let at = UNIX_EPOCH
        + Duration::new(secs.parse().ok()?, 0)
        + Duration::from_micros(micros.parse().ok()?);
    let rest = rest.strip_prefix('[')?;
    let (inside, rest) = rest.split_once("] ")?;
    let client = inside.split_once(' ')?.1.to_owned();
    let mut args = Vec::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                    }
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some(other) => arg.push(other),
                    None => return None,
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some(Seen { at, client, args })
}

/// Records every command the server runs, from a unix-socket `MONITOR`.
struct Monitor {
    seen: Arc<Mutex<Vec<Seen>>>,
    socket: PathBuf,
}

impl Monitor {
    fn start(socket: &Path) -> Result<Self> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(WAIT_LIMIT))?;
        stream.write_all(&encode(&["MONITOR"]))?;
        let mut reader = BufReader::new(stream);
        let mut ok = String::new();
        reader.read_line(&mut ok)?;
        if ok.trim_end() != "+OK" {
            return Err(format!("MONITOR answered {ok:?}").into());
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&seen);
        std::thread::spawn(move || {
            // Ends when the server goes (the round's end kills it).
            for line in reader.lines().map_while(std::result::Result::ok) {
                if let Some(seen) = line.strip_prefix('+').and_then(parse_monitor) {
                    into.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(seen);
                }
            }
        });
        Ok(Self {
            seen,
            socket: socket.to_owned(),
        })
    }

    /// Everything seen up to a marker sent now.
    fn sync(&self) -> Result<Vec<Seen>> {
        let marker = format!("compare-sync-{}", fastrand::u64(..));
        command(&self.socket, &["ECHO", &marker])?;
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            {
                let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
                if seen.iter().any(|s| s.args.get(1) == Some(&marker)) {
                    return Ok(seen.clone());
                }
            }
            if Instant::now() >= deadline {
                return Err("the monitor never saw its marker".into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

fn ms(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// The holder: one lease on a manager of its own, on a runtime of its own
/// (what `#[tokio::main]` builds), reporting its grant and when its token
/// fired.
fn holder(url: String, acquired: mpsc::Sender<()>) -> Result<SystemTime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let manager = LeaseManager::new(RedisBackend::builder(url).connect().await?)?;
        let options = LeaseOptions::with_ttl(Ttl::parse(RESTART_TTL)?);
        let lease = manager.acquire(RESTART_KEY, &options).await?;
        let token = lease.token();
        acquired.send(())?;
        tokio::time::timeout(WAIT_LIMIT + HELD_BEFORE_KILL, token.cancelled())
            .await
            .map_err(|_| "the holder's token did not fire")?;
        let fired = SystemTime::now();
        drop(lease);
        let _ = tokio::time::timeout(WAIT_LIMIT, manager.shutdown()).await;
        Ok(fired)
    })
}

/// The contender: from the kill on, a new connection and `SET NX PX` every
/// millisecond until the key is its own; returns when the server said so.
fn contender(port: u16, key: String) -> Result<SystemTime> {
    let deadline = Instant::now() + WAIT_LIMIT;
    let set = encode(&["SET", &key, "contender", "NX", "PX", "2000"]);
    while Instant::now() < deadline {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            stream.set_read_timeout(Some(Duration::from_secs(1)))?;
            stream.set_nodelay(true)?;
            let mut reader = BufReader::new(stream.try_clone()?);
            loop {
                if stream.write_all(&set).is_err() {
                    break;
                }
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if line.trim_end() == "+OK" {
                    return Ok(SystemTime::now());
                }
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err("the contender never got the key".into())
}

/// One restart: the holder's token against the contender's grant and the
/// holder's own reconnection, as the restarted server saw them.
fn restart_round(round: u64) -> Result {
    let mut server = Server {
        binary: leasehold_testkit::redis_server_binary()?,
        dir: tempfile::tempdir()?,
        port: leasehold_testkit::free_port()?,
        child: None,
    };
    server.spawn(true)?;
    let url = format!("redis://127.0.0.1:{}", server.port);
    let (acquired_tx, acquired) = mpsc::channel();
    let holder = std::thread::spawn(move || holder(url, acquired_tx));
    acquired
        .recv_timeout(WAIT_LIMIT)
        .map_err(|_| "the holder did not acquire its lease")?;
    std::thread::sleep(HELD_BEFORE_KILL);
    let key = format!("leasehold:{{{RESTART_KEY}}}");
    let value = command(&server.socket(), &["GET", &key])?;
    let holder_id: String = value.chars().take(32).collect();
    if holder_id.len() != 32 {
        return Err(format!("the lease's value is not a holder id: {value:?}").into());
    }
    let killed = SystemTime::now();
    server.kill()?;
    let contender = {
        let (port, key) = (server.port, key.clone());
        std::thread::spawn(move || contender(port, key))
    };
    // Restarted on the socket alone; the monitor attaches before the port
    // opens, so no connection to the restarted server goes unseen.
    server.spawn(false)?;
    let monitor = Monitor::start(&server.socket())?;
    command(
        &server.socket(),
        &["CONFIG", "SET", "port", &server.port.to_string()],
    )?;
    let listening = SystemTime::now();
    // Bounded: a holder that never learns must fail the run, not hang it.
    let fired = join_within(holder, Duration::from_secs(30))??;
    join_within(contender, Duration::from_secs(30))??;
    let seen = monitor.sync()?;
    let granted = seen
        .iter()
        .find(|s| {
            s.args
                .first()
                .is_some_and(|c| c.eq_ignore_ascii_case("SET"))
                && s.args.get(2).is_some_and(|v| v == "contender")
        })
        .ok_or("the monitor never saw the contender's SET")?
        .at;
    // The holder's renewal connection: the one whose script call names its holder id.
    let renewal = seen
        .iter()
        .find(|s| s.client != "lua" && s.args.iter().any(|a| a.contains(&holder_id)))
        .ok_or("the monitor never saw the holder's renewal")?
        .client
        .clone();
    let on_renewal: Vec<&Seen> = seen.iter().filter(|s| s.client == renewal).collect();
    let reconnected = on_renewal
        .first()
        .map(|s| s.at)
        .ok_or("no command on the renewal connection")?;
    let steps: Vec<String> = on_renewal
        .iter()
        .take(12)
        .map(|s| {
            let name = s.args.iter().take(2).cloned().collect::<Vec<_>>().join(" ");
            format!(
                "{}@{:.2}",
                name.chars().take(24).collect::<String>(),
                ms(s.at, reconnected)
            )
        })
        .collect();
    println!(
        "{{\"mode\":\"restart\",\"round\":{round},\"listening_ms\":{:.1},\"contender_granted_ms\":{:.1},\"holder_reconnected_ms\":{:.1},\"token_fired_ms\":{:.1},\"fired_after_reconnection_ms\":{:.1},\"held_by_two_ms\":{:.1},\"holder_steps\":\"{}\"}}",
        ms(listening, killed),
        ms(granted, killed),
        ms(reconnected, killed),
        ms(fired, killed),
        ms(fired, reconnected),
        ms(fired, granted),
        steps.join(" | "),
    );
    Ok(())
}

/// `handle`'s result, or an error once `limit` has passed: a thread that
/// never ends fails the run instead of hanging it. (Written here, not
/// taken from the testkit, as the earlier builds' testkits lack it.)
fn join_within<T>(handle: std::thread::JoinHandle<T>, limit: Duration) -> Result<T> {
    let deadline = Instant::now() + limit;
    while !handle.is_finished() {
        if Instant::now() >= deadline {
            return Err(format!("a thread did not finish within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    handle.join().map_err(|_| "the thread panicked".into())
}
