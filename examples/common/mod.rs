//! What the examples share: where their Redis comes from.

use leasehold_testkit::RedisServer;
use tracing::info;

/// Where an example keeps its leases.
pub(crate) enum Store {
    /// A Redis server at this URL; the throwaway server, if one was started,
    /// lives as long as this value.
    Redis {
        /// The server's URL.
        url: String,
        /// The server the example started, stopped when dropped.
        _server: Option<Box<RedisServer>>,
    },
    /// No Redis could be had: the in-process `MemoryBackend`.
    Memory,
}

/// The Redis at `LEASEHOLD_REDIS_URL` if set; otherwise a throwaway
/// `redis-server` if one is installed; otherwise the in-process
/// `MemoryBackend`, saying so.
pub(crate) fn choose_store() -> Store {
    if let Ok(url) = std::env::var("LEASEHOLD_REDIS_URL") {
        return Store::Redis { url, _server: None };
    }
    match RedisServer::start() {
        Ok(server) => {
            info!("started a throwaway redis-server on port {}", server.port());
            Store::Redis {
                url: server.url(),
                _server: Some(Box::new(server)),
            }
        }
        Err(e) => {
            info!("no Redis available ({e}); running on the in-process MemoryBackend instead");
            Store::Memory
        }
    }
}

/// Logs to stderr, filtered by `RUST_LOG` or else by `default_filter`;
/// coloured only on a terminal, so that output sent to a file or a pipe
/// carries no escape codes.
pub(crate) fn init_tracing(default_filter: &str) {
    use std::io::IsTerminal as _;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_target(false)
        .init();
}
