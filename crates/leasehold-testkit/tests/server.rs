//! Integration tests that run real `redis-server` processes.

use std::error::Error;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use leasehold_testkit::{RedisServer, TestkitError, free_port};

type TestResult = Result<(), Box<dyn Error>>;

#[test]
fn start_set_get() -> TestResult {
    let server = RedisServer::start()?;
    assert_ne!(server.port(), 6379);
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert!(server.pid().is_some());

    assert_eq!(server.cli(&["SET", "k", "v"])?, "OK");
    assert_eq!(server.cli(&["GET", "k"])?, "v");
    assert_eq!(server.cli(&["GET", "missing"])?, "(nil)");
    assert_eq!(server.cli(&["INCR", "n"])?, "1");
    assert_eq!(server.cli(&["RPUSH", "list", "a", "b c", ""])?, "3");
    assert_eq!(server.cli(&["LRANGE", "list", "0", "-1"])?, "a\nb c\n");
    assert_eq!(
        server.cli(&["LRANGE", "nothing", "0", "-1"])?,
        "(empty array)"
    );
    match server.cli(&["INCR", "list"]) {
        Err(TestkitError::Reply(message)) => assert!(message.starts_with("WRONGTYPE"), "{message}"),
        other => panic!("expected a WRONGTYPE reply, got {other:?}"),
    }
    // No persistence by default.
    assert_eq!(server.cli(&["CONFIG", "GET", "save"])?, "save\n");
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendonly"])?,
        "appendonly\nno"
    );
    // DEBUG is enabled for local connections.
    assert_eq!(server.cli(&["DEBUG", "SLEEP", "0"])?, "OK");
    Ok(())
}

#[test]
fn pause_times_out_and_resume_answers() -> TestResult {
    let mut server = RedisServer::start()?;
    server.pause()?;
    assert!(server.is_paused());

    // A raw TCP connect still succeeds, but the read times out.
    let mut raw = TcpStream::connect(server.addr())?;
    raw.set_read_timeout(Some(Duration::from_millis(200)))?;
    raw.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut buf = [0u8; 16];
    let err = raw
        .read(&mut buf)
        .err()
        .ok_or("read succeeded on a paused server")?;
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );

    let started = Instant::now();
    match server.cli_with_timeout(&["PING"], Duration::from_millis(200)) {
        Err(TestkitError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(200));

    server.resume()?;
    assert!(!server.is_paused());
    assert_eq!(server.cli(&["PING"])?, "PONG");
    // The queued PING on the raw connection is answered late.
    raw.set_read_timeout(Some(Duration::from_secs(5)))?;
    let n = raw.read(&mut buf)?;
    assert_eq!(&buf[..n], b"+PONG\r\n");
    Ok(())
}

#[test]
fn kill_and_restart_gives_an_empty_server_on_the_same_port() -> TestResult {
    let mut server = RedisServer::start()?;
    let port = server.port();
    let old_pid = server.pid().ok_or("no pid")?;
    assert_eq!(server.cli(&["SET", "k", "v"])?, "OK");

    server.kill()?;
    assert_eq!(server.pid(), None);
    assert!(server.cli(&["PING"]).is_err());
    assert!(matches!(server.pause(), Err(TestkitError::NotRunning)));
    server.kill()?; // idempotent

    server.restart()?;
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(old_pid));
    assert_eq!(server.cli(&["DBSIZE"])?, "0");
    assert_eq!(server.cli(&["GET", "k"])?, "(nil)");

    // Restart also works on a running server.
    server.restart()?;
    assert_eq!(server.port(), port);
    assert_eq!(server.cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn stop_then_restart() -> TestResult {
    let mut server = RedisServer::start()?;
    server.pause()?;
    server.stop()?; // resumes first, so SIGTERM is delivered
    assert_eq!(server.pid(), None);
    assert!(!server.is_paused());
    server.stop()?; // idempotent
    server.restart()?;
    assert_eq!(server.cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn appendonly_keeps_keys_and_ttls_across_kill_and_restart() -> TestResult {
    let mut server = RedisServer::builder().appendonly(true).start()?;
    assert_eq!(
        server.cli(&["CONFIG", "GET", "appendfsync"])?,
        "appendfsync\nalways"
    );
    assert_eq!(
        server.cli(&["SET", "lease", "holder-1", "EX", "100"])?,
        "OK"
    );
    assert_eq!(server.cli(&["SET", "forever", "x"])?, "OK");

    server.kill()?;
    server.restart()?;

    assert_eq!(server.cli(&["GET", "lease"])?, "holder-1");
    assert_eq!(server.cli(&["GET", "forever"])?, "x");
    let ttl: i64 = server.cli(&["TTL", "lease"])?.parse()?;
    assert!((90..=100).contains(&ttl), "ttl {ttl}");
    assert_eq!(server.cli(&["TTL", "forever"])?, "-1");
    Ok(())
}

#[test]
fn requirepass_argument_is_used_by_cli() -> TestResult {
    let server = RedisServer::builder()
        .arg("--requirepass")
        .arg("secret")
        .start()?;
    assert_eq!(server.cli(&["SET", "k", "v"])?, "OK");
    assert_eq!(server.cli(&["GET", "k"])?, "v");

    // Without AUTH the server refuses.
    let mut raw = TcpStream::connect(server.addr())?;
    raw.set_read_timeout(Some(Duration::from_secs(5)))?;
    raw.write_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")?;
    let mut buf = [0u8; 64];
    let n = raw.read(&mut buf)?;
    assert!(
        buf[..n].starts_with(b"-NOAUTH"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    Ok(())
}

#[test]
fn fixed_port_is_kept_and_not_retried() -> TestResult {
    let port = free_port()?;
    let mut server = RedisServer::builder().port(port).start()?;
    assert_eq!(server.port(), port);
    server.kill()?;
    server.restart()?;
    assert_eq!(server.port(), port);

    match RedisServer::builder().port(port).start() {
        Err(TestkitError::PortInUse {
            port: p,
            attempts: 1,
            log_tail,
        }) => {
            assert_eq!(p, port);
            assert!(log_tail.contains("Address already in use"), "{log_tail}");
        }
        other => panic!("expected PortInUse, got {other:?}"),
    }
    // The first server is unaffected.
    assert_eq!(server.cli(&["PING"])?, "PONG");
    Ok(())
}

#[test]
fn a_bad_argument_reports_the_log() -> TestResult {
    match RedisServer::builder()
        .arg("--no-such-option")
        .arg("1")
        .start()
    {
        // redis-server reports bad config on stderr (which is discarded) and
        // exits 1 before writing its log file, so the error shows the command.
        Err(err @ TestkitError::Exited { .. }) => {
            let message = err.to_string();
            assert!(message.contains("--no-such-option 1"), "{message}");
            assert!(message.contains("--save ''"), "{message}");
            Ok(())
        }
        other => panic!("expected Exited, got {other:?}"),
    }
}

#[test]
fn drop_kills_the_process_and_removes_the_dir() -> TestResult {
    let mut server = RedisServer::start()?;
    let dir = server.dir().to_path_buf();
    let pid = server.pid().ok_or("no pid")?;
    assert!(dir.is_dir());
    assert!(server.log_path().is_file());
    server.pause()?;
    drop(server);
    assert!(!dir.exists());
    // The process is gone and reaped: no zombie left under our pid.
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    Ok(())
}

#[test]
fn many_servers_in_parallel_get_distinct_ports() -> TestResult {
    let handles: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(RedisServer::start))
        .collect();
    let mut servers = Vec::new();
    for handle in handles {
        servers.push(leasehold_testkit::join_within(
            handle,
            std::time::Duration::from_secs(30),
        )??);
    }
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for server in &servers {
        assert_eq!(server.cli(&["PING"])?, "PONG");
    }
    Ok(())
}

#[tokio::test]
async fn usable_inside_tokio_test() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut server = RedisServer::start()?;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await?;
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").await?;
    let mut buf = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf)).await??;
    assert_eq!(&buf, b"+PONG\r\n");

    server.kill()?;
    server.restart()?;
    assert_eq!(server.cli(&["PING"])?, "PONG");
    Ok(())
}
