//! Fenced writes (`Fence`) against real servers, judged by the server's own
//! state read on a side connection (`HGETALL`, `PTTL`, `CLUSTER KEYSLOT`
//! of the resource's key), never by the library's reply alone: a stale
//! holder's write is refused and leaves the newer holder's value in place,
//! a seal refuses it before the newer holder writes, tokens of another
//! lease key are never compared, and a holder paused by SIGSTOP (a real
//! process) is refused when it resumes.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{TestResult, acquire, holder, key, ttl};
use leasehold_core::{BackendError, FencingToken, Grant, LeaseBackend, LeaseKey};
use leasehold_redis::redis::{self, AsyncCommands};
use leasehold_redis::{Fence, FencedWrite, KeyLayout, RedisBackend};
use leasehold_testkit::{RedisCluster, RedisServer};
use tokio::time::{Instant, sleep, timeout};

/// The longest any wait of these tests may take.
const PATIENCE: Duration = Duration::from_secs(10);

type Side = redis::aio::MultiplexedConnection;

async fn side(url: &str) -> redis::RedisResult<Side> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

async fn connect(url: String) -> Result<RedisBackend, Box<dyn std::error::Error>> {
    Ok(timeout(PATIENCE, RedisBackend::connect(url)).await??)
}

/// The Redis key of `resource` guarded by `lease` (default namespace).
fn stored_at(lease: &LeaseKey, resource: &str) -> String {
    KeyLayout::default().fenced(lease, resource)
}

/// The resource's hash as the server holds it: `token`, `lease`, `value`.
async fn on_server(
    side: &mut Side,
    lease: &LeaseKey,
    resource: &str,
) -> redis::RedisResult<HashMap<String, String>> {
    side.hgetall(stored_at(lease, resource)).await
}

/// Asserts the server holds `value` (None: no value field) under `token`
/// for `resource`, fenced by `lease`.
async fn assert_stored(
    side: &mut Side,
    lease: &LeaseKey,
    resource: &str,
    value: Option<&str>,
    token: FencingToken,
) -> TestResult {
    let hash = on_server(side, lease, resource).await?;
    assert_eq!(
        hash.get("value").map(String::as_str),
        value,
        "value of {resource}: {hash:?}"
    );
    assert_eq!(
        hash.get("token"),
        Some(&token.0.to_string()),
        "fence of {resource}: {hash:?}"
    );
    assert_eq!(
        hash.get("lease").map(String::as_str),
        Some(lease.as_str()),
        "lease key of {resource}: {hash:?}"
    );
    Ok(())
}

/// A takeover: `key`'s lease is deleted under its holder (as its expiry
/// would), and a new holder acquires it, with a higher token.
async fn take_over(
    backend: &RedisBackend,
    key: &LeaseKey,
    old: &Grant,
) -> Result<Grant, Box<dyn std::error::Error>> {
    assert!(backend.force_release(key).await?, "{key} was held");
    let new = acquire(backend, key, holder(), ttl("30s")).await?;
    assert!(new.fencing_token > old.fencing_token);
    Ok(new)
}

#[tokio::test]
async fn a_stale_holders_write_is_refused_and_the_newer_value_stays() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("reports:nightly");
    let fence = backend.fence(&lease);

    let a = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    assert_eq!(
        fence.write("summary", a.fencing_token, "from A").await?,
        FencedWrite::Written
    );
    assert_stored(
        &mut side,
        &lease,
        "summary",
        Some("from A"),
        a.fencing_token,
    )
    .await?;

    let b = take_over(&backend, &lease, &a).await?;
    assert_eq!(
        fence.write("summary", b.fencing_token, "from B").await?,
        FencedWrite::Written
    );
    // A does not know it lost the lease, and writes late.
    assert_eq!(
        fence
            .write("summary", a.fencing_token, "late from A")
            .await?,
        FencedWrite::Refused {
            newer: b.fencing_token
        }
    );
    assert_stored(
        &mut side,
        &lease,
        "summary",
        Some("from B"),
        b.fencing_token,
    )
    .await?;
    // The resource is the user's: it has no expiry.
    let pttl: i64 = side.pttl(stored_at(&lease, "summary")).await?;
    assert_eq!(pttl, -1);
    // read() agrees with the server.
    let read = fence.read("summary").await?.ok_or("summary is stored")?;
    assert_eq!(read.value.as_deref(), Some(&b"from B"[..]));
    assert_eq!((read.token, read.ttl_left), (b.fencing_token, None));
    assert!(fence.read("never-written").await?.is_none());
    Ok(())
}

#[tokio::test]
async fn a_seal_refuses_the_old_holder_before_the_new_one_writes() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("import");
    let fence = backend.fence(&lease);

    let a = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    assert_eq!(
        fence.write("chunk:1", a.fencing_token, "A's chunk").await?,
        FencedWrite::Written
    );
    let b = take_over(&backend, &lease, &a).await?;
    // B seals before any work: a resource A wrote, and one nobody wrote.
    for resource in ["chunk:1", "chunk:2"] {
        assert_eq!(
            fence.seal(resource, b.fencing_token).await?,
            FencedWrite::Written
        );
    }
    assert_stored(
        &mut side,
        &lease,
        "chunk:1",
        Some("A's chunk"),
        b.fencing_token,
    )
    .await?;
    assert_stored(&mut side, &lease, "chunk:2", None, b.fencing_token).await?;

    for resource in ["chunk:1", "chunk:2"] {
        assert_eq!(
            fence.write(resource, a.fencing_token, "A, late").await?,
            FencedWrite::Refused {
                newer: b.fencing_token
            },
            "{resource}"
        );
        // A's seal with its old token is refused too.
        assert_eq!(
            fence.seal(resource, a.fencing_token).await?,
            FencedWrite::Refused {
                newer: b.fencing_token
            }
        );
    }
    // The seal wrote no value: A's earlier one is still there, and the
    // resource nobody wrote still has none.
    assert_stored(
        &mut side,
        &lease,
        "chunk:1",
        Some("A's chunk"),
        b.fencing_token,
    )
    .await?;
    assert_stored(&mut side, &lease, "chunk:2", None, b.fencing_token).await?;
    let sealed = fence.read("chunk:2").await?.ok_or("chunk:2 is sealed")?;
    assert_eq!((sealed.value, sealed.token), (None, b.fencing_token));
    Ok(())
}

#[tokio::test]
async fn the_same_token_writes_again() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("rewrite");
    let fence = backend.fence(&lease);
    let a = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    for value in ["first", "second"] {
        assert_eq!(
            fence.write("state", a.fencing_token, value).await?,
            FencedWrite::Written
        );
        assert_stored(&mut side, &lease, "state", Some(value), a.fencing_token).await?;
    }
    // A seal at the same token changes nothing.
    assert_eq!(
        fence.seal("state", a.fencing_token).await?,
        FencedWrite::Written
    );
    assert_stored(&mut side, &lease, "state", Some("second"), a.fencing_token).await?;
    Ok(())
}

/// Tokens compare as whole numbers: by their number of digits first (9 is
/// below 10, though "9" is above "10" as text), and exactly above 2^53,
/// where Lua's numbers cannot tell 2^60 from 2^60 + 1.
#[tokio::test]
async fn tokens_compare_as_exact_numbers() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("numbers");
    let fence = backend.fence(&lease);
    let written = |t| (FencingToken(t), FencedWrite::Written);
    let refused = |t, newer| {
        (
            FencingToken(t),
            FencedWrite::Refused {
                newer: FencingToken(newer),
            },
        )
    };
    let big = 1_u64 << 60;
    for (token, outcome) in [
        written(9),
        written(10),
        refused(9, 10),
        written(big + 1),
        refused(big, big + 1),
        written(u64::MAX),
        refused(u64::MAX - 1, u64::MAX),
    ] {
        assert_eq!(
            fence.write("n", token, token.0.to_string()).await?,
            outcome,
            "{token}"
        );
    }
    assert_stored(
        &mut side,
        &lease,
        "n",
        Some(&u64::MAX.to_string()),
        FencingToken(u64::MAX),
    )
    .await?;
    Ok(())
}

/// A resource is named within its lease key's hash tag. Two lease keys
/// with one tag name one resource: the fence records the lease key whose
/// tokens it holds, and the other's write (or read) is an error, never a
/// comparison of unrelated tokens. Lease keys with different tags have
/// resources of their own, and a lower token of one is not refused for
/// the other's higher.
#[tokio::test]
async fn tokens_of_another_lease_key_are_not_compared() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;

    // One tag: `order:{42}` fenced `total` first.
    let (order, invoice) = (key("order:{42}"), key("invoice:{42}"));
    assert_eq!(stored_at(&order, "total"), stored_at(&invoice, "total"));
    let by_invoice = acquire(&backend, &invoice, holder(), ttl("30s")).await?;
    let by_order = acquire(&backend, &order, holder(), ttl("30s")).await?;
    assert_eq!(
        backend
            .fence(&order)
            .write("total", by_order.fencing_token, "99")
            .await?,
        FencedWrite::Written
    );
    let other = backend.fence(&invoice);
    for result in [
        other.write("total", by_invoice.fencing_token, "1").await,
        other.seal("total", FencingToken(u64::MAX)).await,
    ] {
        match result {
            Err(BackendError::Server {
                key,
                detail,
                transient: false,
                ..
            }) => {
                assert_eq!(key, "invoice:{42}");
                assert!(
                    detail.contains("fenced by lease key \"order:{42}\""),
                    "{detail}"
                );
            }
            other => panic!("another lease key's write was not refused: {other:?}"),
        }
    }
    assert!(matches!(
        other.read("total").await,
        Err(BackendError::Server { .. })
    ));
    assert_stored(
        &mut side,
        &order,
        "total",
        Some("99"),
        by_order.fencing_token,
    )
    .await?;

    // Different tags: two resources, each with its own fence. `audits`'s
    // token is the lower (acquired first), and is not refused.
    let (audits, reports) = (key("audits"), key("reports"));
    let early = acquire(&backend, &audits, holder(), ttl("30s")).await?;
    let late = acquire(&backend, &reports, holder(), ttl("30s")).await?;
    assert!(early.fencing_token < late.fencing_token);
    assert_eq!(
        backend
            .fence(&reports)
            .write("total", late.fencing_token, "reports")
            .await?,
        FencedWrite::Written
    );
    assert_eq!(
        backend
            .fence(&audits)
            .write("total", early.fencing_token, "audits")
            .await?,
        FencedWrite::Written
    );
    assert_stored(
        &mut side,
        &reports,
        "total",
        Some("reports"),
        late.fencing_token,
    )
    .await?;
    assert_stored(
        &mut side,
        &audits,
        "total",
        Some("audits"),
        early.fencing_token,
    )
    .await?;

    // A permit's fence is its semaphore's: its tokens are the semaphore's.
    let jobs = key("jobs:{7}");
    let permit = jobs.permit(1)?;
    assert_eq!(backend.fence(&permit).lease_key(), &jobs);
    assert_eq!(stored_at(&permit, "x"), stored_at(&jobs, "x"));
    Ok(())
}

/// A holder that stops between taking its token and writing (a GC pause,
/// a VM migration): its lease expires on the server, another holder takes
/// over and writes, and the paused holder's write is refused when it goes
/// on. In process: the pause is the holder not running.
#[tokio::test]
async fn a_paused_holder_is_refused_after_its_lease_expired() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("paused");
    let fence = backend.fence(&lease);

    let a = acquire(&backend, &lease, holder(), ttl("200ms")).await?;
    assert_eq!(
        fence.write("out", a.fencing_token, "A before").await?,
        FencedWrite::Written
    );
    // A pauses; the server expires its lease by itself.
    gone_on_server(&mut side, &lease).await?;
    let b = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    assert!(b.fencing_token > a.fencing_token);
    assert_eq!(
        fence.write("out", b.fencing_token, "B").await?,
        FencedWrite::Written
    );
    // A resumes and writes, as if it still held the lease.
    assert_eq!(
        fence.write("out", a.fencing_token, "A after").await?,
        FencedWrite::Refused {
            newer: b.fencing_token
        }
    );
    assert_stored(&mut side, &lease, "out", Some("B"), b.fencing_token).await?;
    Ok(())
}

/// Waits until the lease `key` is gone from the server (its expiry).
async fn gone_on_server(side: &mut Side, key: &LeaseKey) -> TestResult {
    let stored = KeyLayout::default().lease(key);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let exists: bool = side.exists(&stored).await?;
        if !exists {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{stored} did not expire").into());
        }
        sleep(Duration::from_millis(20)).await;
    }
}

/// The environment that makes [`paused_holder_child`] a holder.
const CHILD_URL: &str = "LEASEHOLD_FENCE_CHILD_URL";
/// The lease key the child holds.
const CHILD_KEY: &str = "LEASEHOLD_FENCE_CHILD_KEY";
/// What starts each line the child reports on.
const CHILD_SAYS: &str = "fence-child:";

/// Not a test of its own: the holder process of
/// [`a_holder_stopped_by_sigstop_is_refused_when_it_resumes`], run as a
/// child of it (it returns at once without [`CHILD_URL`]). It takes the
/// lease for 300 ms, says its token, then writes its value every 20 ms
/// (never renewing) and says each outcome, until a write is refused.
#[tokio::test]
async fn paused_holder_child() -> TestResult {
    let (Ok(url), Ok(name)) = (std::env::var(CHILD_URL), std::env::var(CHILD_KEY)) else {
        return Ok(());
    };
    let backend = connect(url).await?;
    let lease = key(&name);
    let fence = backend.fence(&lease);
    let grant = acquire(&backend, &lease, holder(), ttl("300ms")).await?;
    println!("{CHILD_SAYS} token {}", grant.fencing_token);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = 0_u32;
    while Instant::now() < deadline {
        i += 1;
        match fence
            .write("out", grant.fencing_token, format!("A {i}"))
            .await
        {
            Ok(FencedWrite::Written) => println!("{CHILD_SAYS} written {i}"),
            Ok(FencedWrite::Refused { newer }) => {
                println!("{CHILD_SAYS} refused {newer}");
                return Ok(());
            }
            Err(e) => println!("{CHILD_SAYS} error {e}"),
        }
        sleep(Duration::from_millis(20)).await;
    }
    Err("never refused".into())
}

/// What the child reported, a line at a time.
struct ChildLines(mpsc::Receiver<String>);

impl ChildLines {
    /// The next line of the child's starting with `word`, skipping others.
    fn next(&self, word: &str) -> Result<String, Box<dyn std::error::Error>> {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = self
                .0
                .recv_timeout(left)
                .map_err(|_| format!("the child never said {word:?}"))?;
            if let Some(rest) = line
                .strip_prefix(CHILD_SAYS)
                .and_then(|l| l.trim().strip_prefix(word))
            {
                return Ok(rest.trim().to_owned());
            }
        }
    }
}

/// `kill -<signal> <pid>`.
fn signal(signal: &str, pid: u32) -> TestResult {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    assert!(status.success(), "kill -{signal} {pid}");
    Ok(())
}

/// A real holder process, stopped by SIGSTOP while it holds the lease and
/// writes under it, resumed by SIGCONT after its lease expired and another
/// node took over and wrote: its next write is refused, and the server
/// keeps the new holder's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_stopped_by_sigstop_is_refused_when_it_resumes() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("stopped");
    let mut child = Command::new(std::env::current_exe()?)
        .args(["--exact", "paused_holder_child", "--nocapture"])
        .env(CHILD_URL, server.url())
        .env(CHILD_KEY, lease.as_str())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().ok_or("no stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let lines = ChildLines(rx);
    let verdict = async {
        let (a, first) = tokio::task::block_in_place(|| {
            let a = FencingToken(lines.next("token")?.parse()?);
            // Stopped while it holds the lease and writes under it.
            let first = lines.next("written")?;
            signal("STOP", pid)?;
            Ok::<_, Box<dyn std::error::Error>>((a, first))
        })?;
        eprintln!("child holds token {a}, wrote {first}, stopped");
        gone_on_server(&mut side, &lease).await?;
        let b = acquire(&backend, &lease, holder(), ttl("30s")).await?;
        assert!(b.fencing_token > a);
        assert_eq!(
            backend
                .fence(&lease)
                .write("out", b.fencing_token, "B")
                .await?,
            FencedWrite::Written
        );
        // Whatever A wrote before it stopped is gone under B's value.
        assert_stored(&mut side, &lease, "out", Some("B"), b.fencing_token).await?;
        signal("CONT", pid)?;
        let newer = tokio::task::block_in_place(|| lines.next("refused"))?;
        assert_eq!(newer, b.fencing_token.to_string());
        assert_stored(&mut side, &lease, "out", Some("B"), b.fencing_token).await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    }
    .await;
    // Never leave the child stopped or running.
    let _ = signal("CONT", pid);
    if verdict.is_err() {
        let _ = child.kill();
    }
    let status = tokio::task::block_in_place(|| child.wait())?;
    verdict?;
    assert!(status.success(), "the child holder failed: {status}");
    Ok(())
}

#[tokio::test]
async fn expiry_is_the_users_choice() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("expiring");
    let a = acquire(&backend, &lease, holder(), ttl("30s")).await?;
    let hour = Duration::from_secs(3600);
    let expiring = backend.fence(&lease).expire_after(hour);
    let pttl = |side: &mut Side, resource: &str| {
        let key = stored_at(&lease, resource);
        let mut side = side.clone();
        async move { side.pttl::<_, i64>(key).await }
    };
    // A write with an expiry sets it; one without makes the resource live
    // until deleted (as SET does).
    assert_eq!(
        expiring.write("r", a.fencing_token, "v").await?,
        FencedWrite::Written
    );
    let left = pttl(&mut side, "r").await?;
    assert!(left > 3_590_000 && left <= 3_600_000, "{left}");
    // A read shows no more than the expiry, and no less than the server
    // has left just after it.
    let read = expiring.read("r").await?.ok_or("r is stored")?;
    let shown = read.ttl_left.ok_or("no ttl shown")?;
    let left = u64::try_from(pttl(&mut side, "r").await?)?;
    assert!(
        Duration::from_millis(left) <= shown && shown <= hour,
        "a read shows {shown:?} left; the server had {left} ms left just after it"
    );
    assert_eq!(
        backend
            .fence(&lease)
            .write("r", a.fencing_token, "v2")
            .await?,
        FencedWrite::Written
    );
    assert_eq!(pttl(&mut side, "r").await?, -1);
    // A seal gives its expiry to a resource it creates, and leaves an
    // existing resource's as it is.
    assert_eq!(
        expiring.seal("new", a.fencing_token).await?,
        FencedWrite::Written
    );
    assert!(pttl(&mut side, "new").await? > 3_590_000);
    assert_eq!(
        expiring.seal("r", a.fencing_token).await?,
        FencedWrite::Written
    );
    assert_eq!(pttl(&mut side, "r").await?, -1);
    // The value expires with its fence: nothing is left behind.
    let short = backend
        .fence(&lease)
        .expire_after(Duration::from_millis(100));
    assert_eq!(
        short.write("brief", a.fencing_token, "v").await?,
        FencedWrite::Written
    );
    sleep(Duration::from_millis(300)).await;
    let exists: bool = side.exists(stored_at(&lease, "brief")).await?;
    assert!(!exists);
    Ok(())
}

#[tokio::test]
async fn bad_requests_get_typed_errors() -> TestResult {
    let server = RedisServer::start()?;
    let backend = connect(server.url()).await?;
    let mut side = side(&server.url()).await?;
    let lease = key("typed");
    let fence = backend.fence(&lease);
    let token = FencingToken(1);
    let long = "r".repeat(Fence::MAX_RESOURCE_LEN + 1);
    for (resource, says) in [
        ("", "must not be empty"),
        ("a\nb", "control characters"),
        ("tab\there", "control characters"),
        (long.as_str(), "at most 512 bytes"),
    ] {
        for result in [
            fence.write(resource, token, "v").await,
            fence.seal(resource, token).await,
        ] {
            match result {
                Err(BackendError::InvalidRequest { key, reason, .. }) => {
                    assert_eq!(key, "typed");
                    assert!(reason.contains(says), "{reason}");
                }
                other => panic!("{resource:?} accepted: {other:?}"),
            }
        }
        assert!(matches!(
            fence.read(resource).await,
            Err(BackendError::InvalidRequest { .. })
        ));
        assert!(fence.key(resource).is_err());
    }
    let longest = "r".repeat(Fence::MAX_RESOURCE_LEN);
    assert_eq!(
        fence.write(&longest, token, "v").await?,
        FencedWrite::Written
    );
    for expiry in [Duration::ZERO, Fence::MAX_EXPIRY + Duration::from_secs(1)] {
        assert!(matches!(
            fence
                .clone()
                .expire_after(expiry)
                .write("x", token, "v")
                .await,
            Err(BackendError::InvalidRequest { .. })
        ));
    }
    // Nothing was sent for the refused ones: only the longest name is stored.
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut side).await?;
    assert_eq!(size, 1);
    // The longest expiry itself is taken: 100 years, kept by the server.
    assert_eq!(
        fence
            .clone()
            .expire_after(Fence::MAX_EXPIRY)
            .write("century", token, "v")
            .await?,
        FencedWrite::Written
    );
    let left: i64 = redis::cmd("PTTL")
        .arg(fence.key("century")?)
        .query_async(&mut side)
        .await?;
    // The documented longest: 100 years of 365 days.
    let century: i64 = 100 * 365 * 86_400 * 1_000;
    assert!(
        (century - 60_000..=century).contains(&left),
        "a 100-year expiry left {left} ms"
    );

    // A key of another type at the resource: WRONGTYPE, naming that key.
    let taken = fence.key("taken")?;
    let () = side.set(&taken, "not a hash").await?;
    for result in [
        fence.write("taken", token, "v").await,
        fence.seal("taken", token).await,
    ] {
        match result {
            Err(BackendError::WrongType { key }) => assert_eq!(key, taken),
            other => panic!("WRONGTYPE expected: {other:?}"),
        }
    }
    assert!(matches!(
        fence.read("taken").await,
        Err(BackendError::WrongType { .. })
    ));
    let kept: String = side.get(&taken).await?;
    assert_eq!(kept, "not a hash");
    // A fence that is not a token is refused, and left alone.
    let odd = fence.key("odd")?;
    let () = side
        .hset_multiple(&odd, &[("token", "12x"), ("lease", "typed")])
        .await?;
    assert!(matches!(
        fence.write("odd", token, "v").await,
        Err(BackendError::Server {
            transient: false,
            ..
        })
    ));
    let value: Option<String> = side.hget(&odd, "value").await?;
    assert_eq!(value, None);
    Ok(())
}

/// On a cluster the resource sits in its lease's slot (the server's own
/// `CLUSTER KEYSLOT`), and a stale write is refused there as anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_resource_sits_in_its_leases_slot() -> TestResult {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3, 0))?;
    let backend = connect(cluster.url()).await?;
    let layout = KeyLayout::default();
    let mut masters = std::collections::BTreeSet::new();
    for name in [
        "order:{42}",
        "reports:nightly",
        "a}b",
        "x{}y",
        "jobs:{7}:permit:2",
    ] {
        let lease = key(name);
        let resource = stored_at(&lease, "chunk:7");
        let slot = cluster.keyslot(&layout.lease(&lease))?;
        assert_eq!(cluster.keyslot(&resource)?, slot, "{name}");
        assert_eq!(cluster.keyslot(&layout.fence(&lease))?, slot, "{name}");
        masters.insert(cluster.master_of_slot(slot)?);

        let a = acquire(&backend, &lease, holder(), ttl("30s")).await?;
        let fence = backend.fence(&lease);
        assert_eq!(
            fence.write("chunk:7", a.fencing_token, "A").await?,
            FencedWrite::Written
        );
        let b = take_over(&backend, &lease, &a).await?;
        assert_eq!(
            fence.seal("chunk:7", b.fencing_token).await?,
            FencedWrite::Written
        );
        assert_eq!(
            fence.write("chunk:7", a.fencing_token, "A late").await?,
            FencedWrite::Refused {
                newer: b.fencing_token
            }
        );
        let master = &cluster.nodes()[cluster.master_of_slot(slot)?];
        let fields = master.cli(&["HGETALL", &resource])?;
        let fields: Vec<&str> = fields.lines().collect();
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|pair| pair.first() == Some(&name))
                .and_then(|pair| pair.get(1).copied())
        };
        assert_eq!(field("value"), Some("A"), "{name}: {fields:?}");
        let token = b.fencing_token.to_string();
        assert_eq!(field("token"), Some(token.as_str()), "{name}: {fields:?}");
        assert_eq!(
            field("lease"),
            Some(fence.lease_key().as_str()),
            "{name}: {fields:?}"
        );
        backend.release(&lease, &b.holder).await?;
    }
    eprintln!("resources on masters {masters:?}");
    Ok(())
}

/// Under `wait_for_replicas` a fenced write waits for its replicas as a
/// grant does: one that too few acknowledged is an error, transient, whose
/// outcome is unknown (here the master has it, and a failover could lose
/// it with its fence).
#[tokio::test]
async fn an_unacknowledged_fenced_write_is_an_error() -> TestResult {
    let master = RedisServer::start()?;
    let backend = RedisBackend::builder(master.url())
        .wait_for_replicas(1, Duration::from_millis(100))
        .connect()
        .await?;
    let lease = key("acked");
    let err = backend
        .fence(&lease)
        .write("r", FencingToken(5), "v")
        .await
        .err()
        .ok_or("written although no replica exists")?;
    assert!(
        matches!(err, BackendError::Server { .. }) && err.is_transient(),
        "{err:?}"
    );
    assert!(err.to_string().contains("replica"), "{err}");
    assert_eq!(
        master.cli(&["HGET", &stored_at(&lease, "r"), "value"])?,
        "v"
    );
    Ok(())
}
