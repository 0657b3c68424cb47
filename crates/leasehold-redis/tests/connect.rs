//! Setting up a backend: URLs, passwords, unreachable servers, servers
//! that lack what the library needs.

mod common;

use std::time::Duration;

use leasehold_redis::{ConnectError, Missing, RedisBackend, RedlockBackend, Topology};
use leasehold_testkit::{Proxy, ProxyMode, RedisCluster, RedisServer, SentinelSet, free_port};
use tokio::time::Instant;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[tokio::test]
async fn bad_urls_are_invalid_and_never_show_the_password() {
    for url in [
        "http://x",
        "redis://:pw-hunter2@",
        "not a url",
        "redis://:pw-hunter2@127.0.0.1:65536",
        "redis://:pw-hunter2@127.0.0.1:99999999",
        "redis://127.0.0.1:6379/not-a-db",
    ] {
        let err = RedisBackend::connect(url).await.expect_err(url);
        assert!(
            matches!(err, ConnectError::InvalidUrl { .. }),
            "{url}: {err:?}"
        );
        let shown = format!("{err} | {err:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!url.contains("hunter2") || shown.contains("***"), "{shown}");
    }
}

#[tokio::test]
async fn a_closed_port_is_a_connect_error_within_the_connect_timeout() -> TestResult {
    let port = free_port()?;
    let url = format!("redis://:pw-hunter2@127.0.0.1:{port}");
    let timeout = Duration::from_millis(800);
    let started = Instant::now();
    let err = RedisBackend::builder(url)
        .connect_timeout(timeout)
        .connect()
        .await
        .expect_err("nothing listens");
    assert!(
        started.elapsed() < timeout + Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&err, ConnectError::Connect { url_redacted, .. } if url_redacted.contains(":***@")),
        "{err:?}"
    );
    let shown = format!("{err} | {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    Ok(())
}

#[tokio::test]
async fn a_wrong_password_is_a_connect_error_that_does_not_show_it() -> TestResult {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("right-secret")
        .start()?;
    let url = format!("redis://:wrong-hunter2@127.0.0.1:{}", server.port());
    let err = RedisBackend::builder(url)
        .connect_timeout(Duration::from_millis(800))
        .connect()
        .await
        .expect_err("wrong password");
    assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
    let mut shown = format!("{err} | {err:?}");
    let mut cause = std::error::Error::source(&err);
    while let Some(c) = cause {
        shown.push_str(&format!(" | {c}"));
        cause = c.source();
    }
    assert!(
        !shown.contains("hunter2") && !shown.contains("right-secret"),
        "{shown}"
    );
    Ok(())
}

#[tokio::test]
async fn a_hand_built_client_is_accepted() -> TestResult {
    let server = RedisServer::start()?;
    let client = leasehold_redis::redis::Client::open(server.url())?;
    let backend = RedisBackend::builder_for_client(client)
        .namespace("custom")
        .connect()
        .await?;
    assert_eq!(backend.namespace(), "custom");
    assert!(format!("{backend:?}").contains(&format!("127.0.0.1:{}", server.port())));
    Ok(())
}

/// The name and version `INFO server` shows, read on a connection of the
/// testkit's own: Valkey adds `server_name:valkey` and `valkey_version`
/// (its `redis_version` is the Redis version it is compatible with).
fn info_server(server: &RedisServer) -> Result<(String, String), Box<dyn std::error::Error>> {
    let info = server.cli(&["INFO", "server"])?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    };
    let name = field("server_name").unwrap_or_else(|| "redis".to_owned());
    let version = field(&format!("{name}_version")).ok_or("no version in INFO server")?;
    Ok((name, version))
}

/// A server started from a configuration file that removes `command`.
fn server_without(command: &str) -> Result<RedisServer, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let conf = dir.path().join("renamed.conf");
    std::fs::write(&conf, format!("rename-command {command} \"\"\n"))?;
    // The server reads the file once, at start.
    Ok(RedisServer::builder().config_file(conf).start()?)
}

/// A server without `PEXPIRE` (renamed away in its configuration) would
/// fail every renewal with a script error; it is refused at connect, and
/// the error names the server, its version and the command.
#[tokio::test]
async fn a_server_without_a_command_the_scripts_call_is_refused_at_connect() -> TestResult {
    let server = server_without("PEXPIRE")?;
    let (name, version) = info_server(&server)?;
    // The witness that the command is gone: the server itself refuses it.
    assert!(server.cli(&["PEXPIRE", "k", "1000"]).is_err());
    let err = RedisBackend::connect(server.url())
        .await
        .expect_err("PEXPIRE is missing");
    match &err {
        ConnectError::UnsupportedServer {
            server: shown,
            missing: Missing::Command(command),
            ..
        } => {
            assert_eq!(command, "PEXPIRE");
            assert_eq!(shown, &format!("{name} {version}"));
        }
        other => panic!("expected UnsupportedServer, got {other:?}"),
    }
    let message = err.to_string();
    for part in [name.as_str(), version.as_str(), "PEXPIRE"] {
        assert!(message.contains(part), "{part} not in: {message}");
    }
    // Redlock checks every master: one without the command refuses all.
    let good = [RedisServer::start()?, RedisServer::start()?];
    let err = RedlockBackend::builder([good[0].url(), good[1].url(), server.url()])
        .connect()
        .await
        .expect_err("one master lacks PEXPIRE");
    assert!(
        matches!(&err, ConnectError::UnsupportedServer { missing: Missing::Command(c), .. } if c == "PEXPIRE"),
        "{err:?}"
    );
    Ok(())
}

/// `err` refuses a server as one before Redis 6.0.
fn assert_refused_as_before_6(err: &ConnectError) {
    assert!(
        matches!(
            err,
            ConnectError::UnsupportedServer {
                missing: Missing::Version {
                    needed: "Redis 6.0",
                    ..
                },
                ..
            }
        ),
        "{err:?}"
    );
}

/// A server without `HELLO` (renamed away: so is every Redis before 6.0)
/// refuses the renewal connection's RESP3, which leaves tracking off; the
/// server is then refused by name as one before Redis 6.0, not reported
/// as a connection that failed.
#[tokio::test]
async fn a_server_without_hello_is_refused_as_one_before_redis_6() -> TestResult {
    let server = server_without("HELLO")?;
    // The witness: the server itself refuses HELLO.
    assert!(server.cli(&["HELLO"]).is_err());
    let err = RedisBackend::connect(server.url())
        .await
        .expect_err("no HELLO");
    assert_refused_as_before_6(&err);
    assert!(err.to_string().contains("without HELLO"), "{err}");
    Ok(())
}

/// Behind Sentinel the renewal connection is opened first: a master
/// without `HELLO` refuses its RESP3, tracking is left off, and the
/// master is then refused by name as one before Redis 6.0 rather than
/// reported as a connection that failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_sentinel_a_master_without_hello_is_refused_as_one_before_redis_6() -> TestResult {
    let set = tokio::task::block_in_place(|| {
        SentinelSet::start_with_builders(
            Duration::from_millis(1000),
            RedisServer::builder()
                .arg("--rename-command")
                .arg("HELLO")
                .arg(""),
            RedisServer::builder(),
            RedisServer::builder,
        )
    })?;
    assert!(set.master().cli(&["HELLO"]).is_err());
    let err = RedisBackend::connect(set.url())
        .await
        .expect_err("the master has no HELLO");
    assert_refused_as_before_6(&err);
    Ok(())
}

/// Every topology reads the name and version of the server it connects to
/// and accepts the servers this suite runs on (Redis 7.0, Valkey 8.0); the
/// reading matches `INFO server` on a side connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_topology_reads_the_server_and_accepts_it() -> TestResult {
    let server = RedisServer::start()?;
    let backend = RedisBackend::connect(server.url()).await?;
    let expected = info_server(&server)?;
    let read = backend.server_info().ok_or("standalone: no server info")?;
    assert_eq!((read.name(), read.version()), (&*expected.0, &*expected.1));

    let set = SentinelSet::start()?;
    let backend = RedisBackend::connect(set.url()).await?;
    assert_eq!(backend.topology(), Topology::Sentinel);
    let expected = info_server(set.master())?;
    let read = backend.server_info().ok_or("sentinel: no server info")?;
    assert_eq!((read.name(), read.version()), (&*expected.0, &*expected.1));
    drop(set);

    let cluster = RedisCluster::start(3, 0)?;
    let backend = RedisBackend::connect(cluster.url()).await?;
    assert_eq!(backend.topology(), Topology::Cluster);
    let expected = info_server(&cluster.nodes()[0])?;
    let read = backend.server_info().ok_or("cluster: no server info")?;
    assert_eq!((read.name(), read.version()), (&*expected.0, &*expected.1));
    Ok(())
}

/// A master the sentinels promote after connect is checked as the first
/// one was: the replica lacks `PEXPIRE` (renamed away on its command
/// line), and once it is the master the backend's next call is refused
/// with an error that names it, its version and the command, rather than
/// granting a lease that no renewal could keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_master_without_a_command_is_refused_by_name() -> TestResult {
    use leasehold_core::{
        AcquireOutcome, AcquireRequest, BackendError, LeaseBackend, ReleaseOutcome,
    };

    let mut set = tokio::task::block_in_place(|| {
        SentinelSet::start_with_replica_args(
            Duration::from_millis(1000),
            &["--rename-command", "PEXPIRE", ""],
        )
    })?;
    // The witness that the replica lacks it: the server itself refuses it.
    assert!(set.replica().cli(&["PEXPIRE", "k", "1000"]).is_err());
    let backend = RedisBackend::connect(set.url()).await?;
    let (key, ttl) = (common::key("promoted"), common::ttl("30s"));
    let first = AcquireRequest::new(key.clone(), common::holder(), ttl);
    // The first master has every command: a lease is granted and given back.
    assert!(matches!(
        backend.try_acquire(&first).await?,
        AcquireOutcome::Acquired(_)
    ));
    assert_eq!(
        backend.release(&key, &first.holder).await?.outcome(),
        ReleaseOutcome::Released
    );

    tokio::task::block_in_place(|| -> Result<(), leasehold_testkit::TestkitError> {
        set.kill_master()?;
        set.wait_for_failover()?;
        Ok(())
    })?;
    let (name, version) = info_server(set.master())?;
    let request = AcquireRequest::new(key.clone(), common::holder(), ttl);
    // Calls on the dead master's connection fail as unavailable until the
    // backend asks the sentinels again; bounded.
    let deadline = Instant::now() + Duration::from_secs(20);
    let detail = loop {
        match backend.try_acquire(&request).await {
            Ok(outcome) => panic!("a master without PEXPIRE answered {outcome:?}"),
            Err(BackendError::Server {
                detail, transient, ..
            }) if detail.starts_with("UNSUPPORTED") => {
                assert!(!transient, "{detail}");
                break detail;
            }
            Err(other) if other.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("expected the promoted master refused, got {other:?}"),
        }
    };
    for part in [name.as_str(), version.as_str(), "PEXPIRE"] {
        assert!(detail.contains(part), "{part} not in: {detail}");
    }
    // No lease was written on the refused master.
    let exists = set.master().cli(&["EXISTS", &common::storage_key(&key)])?;
    assert_eq!(exists.trim(), "0");
    Ok(())
}

/// A server that cannot answer the version probe in time is not accepted
/// unchecked: every chunk through the proxy is 200 ms late, so the
/// connection is made within its 5 s, but the probe's reply comes 400 ms
/// after it was sent, past the 150 ms a call may take.
#[tokio::test]
async fn a_server_whose_version_probe_times_out_is_not_accepted_unchecked() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(200)));
    let connected = tokio::time::timeout(
        Duration::from_secs(30),
        RedisBackend::builder(proxy.url())
            .connect_timeout(Duration::from_secs(5))
            .op_timeout(Duration::from_millis(150))
            .connect(),
    )
    .await?;
    assert!(
        matches!(&connected, Err(ConnectError::Connect { source, .. }) if source.is_timeout()),
        "{connected:?}"
    );
    Ok(())
}
