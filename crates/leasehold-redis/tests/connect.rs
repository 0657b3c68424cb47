//! Setting up a backend: URLs, passwords, unreachable servers.

use std::time::Duration;

use leasehold_redis::{Error, RedisBackend};
use leasehold_testkit::{RedisServer, free_port};
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
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
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
        matches!(&err, Error::Connect { url_redacted, .. } if url_redacted.contains(":***@")),
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
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
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
