//! Security on real servers: unguessable holder ids, ACL users with only the
//! commands leasehold needs, passwords, TLS with a throwaway CA, and no
//! secret in any `Debug`, `Display`, log line or error.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backend::{
    AcquireRequest, HandoverBackend, HandoverOutcome, HolderId, LeaseBackend, RenewOutcome,
    RenewRequest, WatchPolicy,
};
use leasehold::redis::{ConnectError, KeyLayout, RedisBackend, redis};
use leasehold::{
    LeaseError, LeaseKey, LeaseManager, LeaseOptions, LossReason, ReleaseOutcome, Ttl,
};
use leasehold_testkit::{RedisServer, free_port};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `future`'s output, or a failure naming `what` when it has not come
/// within `limit`, so that a broken mechanism fails the test instead of
/// hanging it.
async fn within<T>(limit: Duration, what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {limit:?}"))
}

const ADMIN_PASSWORD: &str = "admin-pw-5f2a9c";
const USER_PASSWORD: &str = "leaser-pw-77e1b4";

/// The ACL of a user that can do everything leasehold does, and nothing else.
const LEASER_ACL: &[&str] = &[
    "on",
    ">leaser-pw-77e1b4",
    "resetkeys",
    "~leasehold:*",
    "resetchannels",
    "&leasehold:*",
    "-@all",
    "+get",
    "+set",
    "+pexpire",
    "+pttl",
    "+del",
    "+time",
    "+evalsha",
    "+eval",
    "+script",
    "+publish",
    "+subscribe",
    "+unsubscribe",
];

fn options() -> LeaseOptions {
    LeaseOptions::builder()
        .ttl(Ttl::parse("600ms").expect("valid ttl"))
        .build()
        .expect("valid options")
}

#[test]
fn holder_ids_are_128_random_bits_and_never_shown_in_full() -> TestResult {
    const N: usize = 20_000;
    let mut seen = HashSet::with_capacity(N);
    let mut ones = [0u32; 128];
    for _ in 0..N {
        let id = HolderId::generate()?;
        let hex = id.to_hex();
        assert_eq!(hex.len(), 32);
        assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert!(seen.insert(hex.clone()), "a holder id repeated");
        let shown = format!("{id} {id:?}");
        assert!(!shown.contains(&hex), "{shown}");
        assert!(shown.contains(&id.short()));
        for (i, c) in hex.chars().enumerate() {
            let nibble = c.to_digit(16).ok_or("not hex")?;
            for bit in 0..4 {
                ones[i * 4 + bit] += (nibble >> bit) & 1;
            }
        }
    }
    // Every one of the 128 bits is set about half the time: no fixed
    // bits, no counter. (50% ± 5%; a fair bit strays that far in 1e-40.)
    for (bit, count) in ones.iter().enumerate() {
        let share = f64::from(*count) / N as f64;
        assert!((0.45..0.55).contains(&share), "bit {bit} set in {share:.3}");
    }
    Ok(())
}

fn acl_server() -> Result<RedisServer, Box<dyn std::error::Error>> {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg(ADMIN_PASSWORD)
        .start()?;
    let mut setuser = vec!["ACL", "SETUSER", "leaser"];
    setuser.extend_from_slice(LEASER_ACL);
    assert_eq!(server.cli(&setuser)?, "OK");
    Ok(server)
}

/// A backend signed in as the confined user, and its URL.
async fn connect_as_leaser(
    server: &RedisServer,
) -> Result<(String, RedisBackend), Box<dyn std::error::Error>> {
    let url = format!("redis://leaser:{USER_PASSWORD}@{}", server.addr());
    let backend = RedisBackend::builder(&url)
        .op_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    Ok((url, backend))
}

#[tokio::test]
async fn an_acl_user_with_only_the_needed_commands_runs_every_operation() -> TestResult {
    let server = acl_server()?;
    let (url, backend) = connect_as_leaser(&server).await?;
    let manager = LeaseManager::new(backend.clone())?;
    let lease = manager.acquire("acl-job", &options()).await?;
    // Two renewals take 400 ms; the deadline only bounds a watchdog that stopped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while lease.renewals() < 2 {
        assert_eq!(lease.loss_reason(), None);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was not renewed twice within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let info = backend
        .inspect(&LeaseKey::new("acl-job")?)
        .await?
        .ok_or("lease missing")?;
    assert_eq!(info.fencing_token, Some(lease.fencing_token()));
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    // Scripts forgotten by the server are loaded again with the user's rights.
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"])?, "OK");
    let again = manager.acquire("acl-job", &options()).await?;
    assert_eq!(again.release().await?, ReleaseOutcome::Released);
    // The user really is confined: other keys and commands are refused.
    let mut conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let refused: redis::RedisResult<String> = redis::cmd("GET")
        .arg("other:key")
        .query_async(&mut conn)
        .await;
    assert!(refused.is_err());
    let refused: redis::RedisResult<String> = redis::cmd("FLUSHALL").query_async(&mut conn).await;
    assert!(refused.is_err());
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// The server's clock (`TIME`), in milliseconds since 1970.
fn server_ms(server: &RedisServer) -> Result<i64, Box<dyn std::error::Error>> {
    let time = server.cli(&["TIME"])?;
    let mut parts = time.split_whitespace();
    let (Some(secs), Some(micros)) = (parts.next(), parts.next()) else {
        return Err(format!("TIME answered {time:?}").into());
    };
    Ok(secs.parse::<i64>()? * 1_000 + micros.parse::<i64>()? / 1_000)
}

#[tokio::test]
async fn without_pexpireat_rights_a_renewal_still_writes_the_ttl_asked_for() -> TestResult {
    // The user may not send PEXPIREAT (not in the ACL above): the renewal
    // script falls back to PEXPIRE for the rest of its batch. Each lease's
    // expiry, read by the server's own PEXPIRETIME, must be the renewal's
    // ttl after the call, not some part of it, in a batch that shares one
    // ttl and in one with a ttl per lease.
    let server = acl_server()?;
    let (_, backend) = connect_as_leaser(&server).await?;
    let holder = HolderId::generate()?;
    let keys = ["acl-renew-a", "acl-renew-b", "acl-renew-c"]
        .into_iter()
        .map(LeaseKey::new)
        .collect::<Result<Vec<_>, _>>()?;
    for key in &keys {
        backend
            .try_acquire(&AcquireRequest::new(key.clone(), holder, Ttl::parse("5s")?))
            .await?;
    }
    for ttls in [["40s", "40s", "40s"], ["30s", "50s", "20s"]] {
        let requests = keys
            .iter()
            .zip(ttls)
            .map(|(key, ttl)| Ok(RenewRequest::new(key.clone(), holder, Ttl::parse(ttl)?)))
            .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
        let before = server_ms(&server)?;
        let outcomes = backend.renew_many(&requests).await;
        let after = server_ms(&server)?;
        for ((request, outcome), ttl) in requests.iter().zip(outcomes).zip(ttls) {
            assert!(
                matches!(outcome?, RenewOutcome::Renewed),
                "{} not renewed",
                request.key
            );
            let stored = KeyLayout::default().lease(&request.key);
            let end: i64 = server.cli(&["PEXPIRETIME", &stored])?.parse()?;
            let ms = i64::try_from(request.ttl.get().as_millis())?;
            assert!(
                (before + ms..=after + ms + 1).contains(&end),
                "renewed for {ttl} by a user without PEXPIREAT, {stored} ends {} ms after the call began by the server's clock",
                end - before
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn without_pubsub_rights_a_handover_releases_and_announces() -> TestResult {
    // The user may subscribe (waiters wake on notices) but may not ask how
    // many listen (no PUBSUB): a release must then not hand over, and must
    // not fail either.
    let server = acl_server()?;
    let (_, backend) = connect_as_leaser(&server).await?;
    let key = LeaseKey::new("acl-handover")?;
    let ttl = Ttl::parse("10s")?;
    let holder = HolderId::generate()?;
    backend
        .try_acquire(&AcquireRequest::new(key.clone(), holder, ttl))
        .await?;
    let mut watch = backend.watch_releases(&key, WatchPolicy::Counted).await?;
    let next = AcquireRequest::new(key.clone(), HolderId::generate()?, ttl);
    assert_eq!(
        backend.release_to(&key, &holder, &next).await?,
        HandoverOutcome::Released
    );
    tokio::time::timeout(Duration::from_secs(5), watch.released()).await?;
    assert_eq!(backend.inspect(&key).await?, None);
    Ok(())
}

#[tokio::test]
async fn wrong_passwords_and_missing_rights_are_errors_that_hide_the_password() -> TestResult {
    let server = acl_server()?;
    // A wrong password fails the connection.
    let wrong = format!("redis://leaser:not-{USER_PASSWORD}@{}", server.addr());
    match RedisBackend::builder(&wrong)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
    {
        Err(e @ ConnectError::Connect { .. }) => {
            let shown = format!("{e} | {e:?}");
            assert!(!shown.contains(USER_PASSWORD), "{shown}");
        }
        other => return Err(format!("expected a Connect error, got {other:?}").into()),
    }
    // A user without rights on leasehold's keys connects, but every
    // operation is refused by the server, without showing the password.
    let mut setuser = vec!["ACL", "SETUSER", "outsider"];
    setuser.extend_from_slice(LEASER_ACL);
    setuser[2] = "outsider";
    let acl: Vec<&str> = setuser
        .into_iter()
        .map(|a| if a == "~leasehold:*" { "~other:*" } else { a })
        .collect();
    assert_eq!(server.cli(&acl)?, "OK");
    let outsider = format!("redis://outsider:{USER_PASSWORD}@{}", server.addr());
    let backend = RedisBackend::connect(&outsider).await?;
    let shown = format!("{backend:?}");
    assert!(!shown.contains(USER_PASSWORD), "{shown}");
    let manager = LeaseManager::new(backend)?;
    match manager.acquire("job", &options()).await {
        Err(LeaseError::Backend(e)) => {
            let shown = format!("{e} | {e:?}");
            assert!(
                shown.contains("NOPERM") || shown.contains("no permissions"),
                "{shown}"
            );
            assert!(!shown.contains(USER_PASSWORD), "{shown}");
        }
        other => return Err(format!("expected a refused acquire, got {other:?}").into()),
    }
    Ok(())
}

/// Writes a throwaway CA and a server certificate for localhost and
/// 127.0.0.1 signed by it into `dir`, with the openssl command.
fn make_certificates(dir: &Path) -> TestResult {
    let run = |args: &[&str]| -> TestResult {
        // A certificate takes openssl milliseconds; 30 s only stops a hang.
        let out = leasehold_testkit::output_within(
            Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdin(Stdio::null()),
            Duration::from_secs(30),
        )?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into())
        }
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "1"];
    ca.extend_from_slice(&ec);
    ca.extend_from_slice(&[
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=leasehold test CA",
    ]);
    run(&ca)?;
    let mut csr = vec!["req", "-nodes"];
    csr.extend_from_slice(&ec);
    csr.extend_from_slice(&[
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    run(&csr)?;
    std::fs::File::create(dir.join("san.ext"))?
        .write_all(b"subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")?;
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "san.ext",
        "-out",
        "server.crt",
    ])?;
    Ok(())
}

#[tokio::test]
async fn tls_with_a_private_ca_works_and_an_untrusted_certificate_is_refused() -> TestResult {
    let certs = tempfile::tempdir()?;
    make_certificates(certs.path())?;
    let file = |name: &str| certs.path().join(name).to_string_lossy().into_owned();
    let tls_port = free_port()?;
    let server = RedisServer::builder()
        .arg("--tls-port")
        .arg(tls_port.to_string())
        .arg("--tls-cert-file")
        .arg(file("server.crt"))
        .arg("--tls-key-file")
        .arg(file("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(file("ca.crt"))
        .arg("--tls-auth-clients")
        .arg("no")
        .arg("--requirepass")
        .arg(ADMIN_PASSWORD)
        .start()?;
    let url = format!("rediss://:{ADMIN_PASSWORD}@localhost:{tls_port}");

    // The system's roots do not know the throwaway CA: refused.
    match RedisBackend::builder(&url)
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await
    {
        Err(e @ ConnectError::Connect { .. }) => {
            let shown = format!("{e} | {e:?}");
            assert!(!shown.contains(ADMIN_PASSWORD), "{shown}");
        }
        other => return Err(format!("an untrusted certificate was accepted: {other:?}").into()),
    }

    // With the CA given, leases work over TLS (the server stays up for it).
    let client = redis::Client::build_with_tls(
        url.as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(certs.path().join("ca.crt"))?),
        },
    )?;
    let backend = RedisBackend::builder_for_client(client)
        .op_timeout(Duration::from_millis(500))
        .connect()
        .await?;
    let shown = format!("{backend:?}");
    assert!(!shown.contains(ADMIN_PASSWORD), "{shown}");
    let manager = LeaseManager::new(backend)?;
    let lease = manager.acquire("tls-job", &options()).await?;
    // Two renewals take 400 ms; the deadline only bounds a watchdog that stopped.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while lease.renewals() < 2 {
        assert_eq!(lease.loss_reason(), None);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was not renewed twice within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The lease is on this server, and its TLS port speaks nothing but
    // TLS, so it went over TLS.
    assert_ne!(server.cli(&["GET", "leasehold:{tls-job}"])?, "(nil)");
    assert_eq!(lease.release().await?, ReleaseOutcome::Released);
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    Ok(())
}

/// A tracing writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn no_secret_appears_in_logs_debug_or_errors() -> TestResult {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .finish();
    // current_thread: the watchdog task runs on this thread, under this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = acl_server()?;
    let url = format!("redis://leaser:{USER_PASSWORD}@{}", server.addr());
    let mut shown = Vec::new();
    let backend = RedisBackend::builder(&url)
        .op_timeout(Duration::from_millis(300))
        .connect()
        .await?;
    shown.push(format!("{backend:?}"));
    let manager = LeaseManager::new(backend)?;
    shown.push(format!("{manager:?}"));
    let lease = manager.acquire("secret-job", &options()).await?;
    shown.push(format!("{lease:?}"));
    let stored = server.cli(&["GET", "leasehold:{secret-job}"])?;
    let holder_hex = stored.split(':').next().ok_or("no holder")?.to_owned();
    assert_eq!(holder_hex.len(), 32);
    // A renewal or two, then the lease is taken away: a loss is logged.
    tokio::time::sleep(Duration::from_millis(450)).await;
    server.cli(&["DEL", "leasehold:{secret-job}"])?;
    assert_eq!(
        within(
            Duration::from_secs(5),
            "the deleted lease's token",
            lease.lost()
        )
        .await,
        LossReason::Lost
    );
    shown.push(format!("{:?}", lease.release().await));
    // Errors: a held lease, a wrong password, a bad URL.
    let other = RedisBackend::connect(&url).await?;
    let busy = LeaseManager::new(other)?;
    let _held = manager.acquire("busy", &options()).await?;
    shown.push(format!("{:?}", busy.acquire("busy", &options()).await));
    let wrong = format!("redis://leaser:{USER_PASSWORD}x@{}", server.addr());
    let bad = RedisBackend::builder(&wrong)
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .err()
        .ok_or("a wrong password connected")?;
    shown.push(format!("{bad} {bad:?}"));
    let invalid = RedisBackend::connect(format!("redis://leaser:{USER_PASSWORD}@:0"))
        .await
        .err()
        .ok_or("a bad URL connected")?;
    shown.push(format!("{invalid} {invalid:?}"));
    tokio::time::timeout(std::time::Duration::from_secs(10), manager.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;
    tokio::time::timeout(std::time::Duration::from_secs(10), busy.shutdown())
        .await
        .map_err(|_| "a manager's shutdown did not end within 10 s")?;

    let logs = String::from_utf8(captured.0.lock().map_err(|_| "poisoned")?.clone())?;
    assert!(
        logs.contains("lease ended"),
        "the loss was not logged:\n{logs}"
    );
    shown.push(logs);
    for text in &shown {
        for secret in [USER_PASSWORD, ADMIN_PASSWORD, holder_hex.as_str()] {
            assert!(!text.contains(secret), "a secret leaked into:\n{text}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn what_others_can_see_of_a_holder_does_not_let_them_renew_or_release() -> TestResult {
    use leasehold::backend::{AcquireOutcome, AcquireRequest, RenewOutcome, RenewRequest};
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let key = LeaseKey::new("guarded")?;
    let ttl = Ttl::parse("10s")?;
    let owner = HolderId::generate()?;
    let AcquireOutcome::Acquired(grant) = backend
        .try_acquire(&AcquireRequest::new(key.clone(), owner, ttl).with_label("pod-1")?)
        .await?
    else {
        return Err("a free key must be acquired".into());
    };
    // Others see the label, the token and the ttl, and logs show the
    // holder's first 8 hex digits. Forge holders from all of that.
    let public = backend.inspect(&key).await?.ok_or("lease missing")?;
    assert_eq!(public.fencing_token, Some(grant.fencing_token));
    let short = owner.short();
    let forged = [
        HolderId::from_hex(&format!("{short}{}", "0".repeat(24)))?,
        HolderId::from_hex(&format!("{short}{}", "f".repeat(24)))?,
        HolderId::from_hex(&format!("{:032x}", grant.fencing_token.get()))?,
        HolderId::generate()?,
    ];
    for intruder in forged {
        assert_eq!(
            backend
                .renew(&RenewRequest::new(key.clone(), intruder, ttl))
                .await?,
            RenewOutcome::Lost
        );
        assert_eq!(
            backend.release(&key, &intruder).await?.outcome(),
            ReleaseOutcome::NotHeld
        );
        assert!(matches!(
            backend
                .try_acquire(&AcquireRequest::new(key.clone(), intruder, ttl))
                .await?,
            AcquireOutcome::Held(_)
        ));
    }
    let still = backend
        .inspect(&key)
        .await?
        .ok_or("an intruder removed the lease")?;
    assert_eq!(still.fencing_token, Some(grant.fencing_token));
    assert_eq!(
        backend.release(&key, &owner).await?.outcome(),
        ReleaseOutcome::Released
    );
    Ok(())
}
