//! The TCP proxy in front of a real `redis-server`: every mode, switched
//! while connections are open.

use std::error::Error;
use std::time::Duration;

use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

type TestResult = Result<(), Box<dyn Error>>;

const PONG: &[u8] = b"+PONG\r\n";

/// Sends an inline `PING` and reads the reply, waiting at most `limit`.
async fn ping(conn: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Box<dyn Error>> {
    conn.write_all(b"PING\r\n").await?;
    read_reply(conn, limit).await
}

async fn read_reply(conn: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Box<dyn Error>> {
    let mut reply = vec![0u8; PONG.len()];
    timeout(limit, conn.read_exact(&mut reply)).await??;
    Ok(reply)
}

#[tokio::test]
async fn pass_and_delay_apply_to_open_connections() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    assert_eq!(proxy.upstream(), server.addr());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}", proxy.port()));
    let mut conn = TcpStream::connect(proxy.addr()).await?;
    let started = Instant::now();
    assert_eq!(ping(&mut conn, Duration::from_secs(2)).await?, PONG);
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(proxy.open_connections(), 1);

    // The same connection is now delayed in both directions.
    let delay = Duration::from_millis(150);
    proxy.set_mode(ProxyMode::Delay(delay));
    let started = Instant::now();
    assert_eq!(ping(&mut conn, Duration::from_secs(2)).await?, PONG);
    let took = started.elapsed();
    assert!(took >= 2 * delay, "a delayed round trip took only {took:?}");
    assert!(took < 2 * delay + Duration::from_millis(300), "{took:?}");

    proxy.set_mode(ProxyMode::Pass);
    let started = Instant::now();
    assert_eq!(ping(&mut conn, Duration::from_secs(2)).await?, PONG);
    assert!(started.elapsed() < Duration::from_millis(100));
    Ok(())
}

#[tokio::test]
async fn a_blackhole_answers_nothing_and_delivers_late_after_healing() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(ping(&mut open, Duration::from_secs(2)).await?, PONG);

    proxy.set_mode(ProxyMode::Blackhole);
    assert!(
        ping(&mut open, Duration::from_millis(300)).await.is_err(),
        "a blackholed connection answered"
    );
    // New connections are accepted, and not answered either.
    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    assert!(ping(&mut fresh, Duration::from_millis(300)).await.is_err());

    // Healing delivers what was held: the late reply to the old request.
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(read_reply(&mut open, Duration::from_secs(2)).await?, PONG);
    assert_eq!(read_reply(&mut fresh, Duration::from_secs(2)).await?, PONG);
    Ok(())
}

#[tokio::test]
async fn reset_cuts_open_connections_and_refuses_new_ones() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let mut open = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(ping(&mut open, Duration::from_secs(2)).await?, PONG);

    proxy.set_mode(ProxyMode::Reset);
    // The open connection ends: EOF or a reset, never a reply.
    let mut buf = [0u8; 16];
    match timeout(Duration::from_secs(2), open.read(&mut buf)).await? {
        Ok(0) | Err(_) => {}
        Ok(n) => return Err(format!("read {n} bytes from a cut connection").into()),
    }
    // A new connection is cut before it can be used.
    let mut fresh = TcpStream::connect(proxy.addr()).await?;
    let outcome = async {
        fresh.write_all(b"PING\r\n").await?;
        fresh.read(&mut buf).await
    };
    match timeout(Duration::from_secs(2), outcome).await? {
        Ok(0) | Err(_) => {}
        Ok(n) => return Err(format!("read {n} bytes while resetting").into()),
    }
    // Back to normal for new connections.
    proxy.set_mode(ProxyMode::Pass);
    let mut after = TcpStream::connect(proxy.addr()).await?;
    assert_eq!(ping(&mut after, Duration::from_secs(2)).await?, PONG);
    Ok(())
}

#[tokio::test]
async fn dropping_the_proxy_closes_its_connections() -> TestResult {
    let server = RedisServer::start()?;
    let proxy = Proxy::start(server.addr()).await?;
    let addr = proxy.addr();
    let mut open = TcpStream::connect(addr).await?;
    assert_eq!(ping(&mut open, Duration::from_secs(2)).await?, PONG);
    drop(proxy);
    let mut buf = [0u8; 16];
    match timeout(Duration::from_secs(2), open.read(&mut buf)).await? {
        Ok(0) | Err(_) => {}
        Ok(n) => return Err(format!("read {n} bytes after the proxy was dropped").into()),
    }
    assert!(TcpStream::connect(addr).await.is_err(), "still listening");
    Ok(())
}
