//! A TCP proxy that delays, blackholes or cuts the traffic between clients
//! and a server, switchable at runtime.
//!
//! There is no `tc netem` or toxiproxy on the machines leasehold is tested
//! on, so network faults come from here: point clients at
//! [`Proxy::url`] instead of the server, then change the [`ProxyMode`].

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::TestkitError;

/// What the proxy does with traffic. A new mode applies at once to every
/// connection, open or new.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ProxyMode {
    /// Forward everything as it comes.
    #[default]
    Pass,
    /// Forward every chunk this long after it was read, in order, in each
    /// direction (so a request and its reply take twice this longer).
    Delay(Duration),
    /// Accept connections and read from them, but forward nothing and
    /// answer nothing: a partition. What was read is held, in order, and
    /// delivered when the mode changes to [`Pass`](Self::Pass) or
    /// [`Delay`](Self::Delay), as TCP retransmissions would deliver it after
    /// the partition heals (late replies included).
    Blackhole,
    /// Cut every open connection with a reset (RST) now, and reset every new
    /// one as soon as it is accepted, until the mode changes.
    Reset,
}

/// A TCP proxy on a free port of 127.0.0.1 in front of one server.
///
/// It runs on the tokio runtime it was started on; dropping it stops it and
/// closes every connection.
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold_testkit::{Proxy, ProxyMode, RedisServer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let server = RedisServer::start()?;
/// let proxy = Proxy::start(server.addr()).await?;
/// // Clients connect to proxy.url() instead of server.url().
/// proxy.set_mode(ProxyMode::Delay(Duration::from_millis(800)));
/// proxy.set_mode(ProxyMode::Blackhole);
/// proxy.set_mode(ProxyMode::Reset);
/// proxy.set_mode(ProxyMode::Pass);
/// # Ok(()) }
/// ```
pub struct Proxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    open: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free port of 127.0.0.1, in
    /// [`ProxyMode::Pass`].
    ///
    /// # Errors
    ///
    /// [`TestkitError::Io`] if no port can be bound.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (as `tokio::spawn` does).
    pub async fn start(upstream: SocketAddr) -> Result<Self, TestkitError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let mode = watch::Sender::new(ProxyMode::Pass);
        let open = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream,
            mode.subscribe(),
            Arc::clone(&open),
        ));
        Ok(Self {
            addr,
            upstream,
            mode,
            open,
            task,
        })
    }

    /// The address clients connect to.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A connection URL through the proxy, `redis://127.0.0.1:PORT`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The address of the server behind the proxy.
    #[must_use]
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the mode; every connection follows at once.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    #[must_use]
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// How many client connections are open through the proxy.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every
        // connection task and so closes every socket.
        self.task.abort();
    }
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("mode", &self.mode())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: watch::Receiver<ProxyMode>,
    open: Arc<AtomicUsize>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else {
                    // Out of file descriptors or similar: keep serving the
                    // open connections and try again.
                    tokio::task::yield_now().await;
                    continue;
                };
                if *mode.borrow() == ProxyMode::Reset {
                    reset(&client);
                    continue;
                }
                let open = Arc::clone(&open);
                let mode = mode.clone();
                connections.spawn(async move {
                    open.fetch_add(1, Ordering::SeqCst);
                    connection(client, upstream, mode).await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Drops a socket with SO_LINGER 0, so the peer gets an RST.
fn reset(socket: &TcpStream) {
    // Without zero linger the close is an orderly FIN, which is still a cut.
    let _ = socket.set_zero_linger();
}

async fn connection(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<ProxyMode>) {
    let _ = client.set_nodelay(true);
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        direction(client_read, server_write, mode.clone()),
        direction(server_read, client_write, mode),
    );
}

/// Copies one direction of a connection, obeying the mode.
///
/// A reader hands chunks with the time they were read to a writer over a
/// channel, so that delays keep the order and a blackhole holds the data
/// without stopping the reading.
async fn direction(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mode: watch::Receiver<ProxyMode>,
) {
    let (chunks, mut pending) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut reader_mode = mode.clone();
    let reader = async move {
        // One read buffer, and each chunk copied out at its own size: a
        // blackhole holds every chunk read meanwhile, and a chunk that kept
        // the whole buffer would hold 16 KiB for a command of a few dozen
        // bytes (tens of MiB in a soak's cut, counted as the client's).
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            tokio::select! {
                biased;
                _ = reader_mode.wait_for(|m| *m == ProxyMode::Reset) => return,
                read = from.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                },
            }
        }
    };
    let mut writer_mode = mode;
    let writer = async move {
        loop {
            let next = tokio::select! {
                biased;
                _ = writer_mode.wait_for(|m| *m == ProxyMode::Reset) => None,
                next = pending.recv() => Some(next),
            };
            match next {
                // Reset: cut with an RST.
                None => {
                    reset(to.as_ref());
                    return;
                }
                // The reader saw EOF and everything read was delivered.
                Some(None) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Some(Some((read_at, chunk))) => {
                    if !deliverable(read_at, &mut writer_mode).await {
                        reset(to.as_ref());
                        return;
                    }
                    if to.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

/// Waits until a chunk read at `read_at` may go out under the current mode;
/// `false` when the connection is to be cut instead.
async fn deliverable(read_at: Instant, mode: &mut watch::Receiver<ProxyMode>) -> bool {
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Pass => return true,
            ProxyMode::Reset => return false,
            ProxyMode::Delay(delay) => {
                tokio::select! {
                    () = tokio::time::sleep_until(read_at + delay) => return true,
                    changed = mode.changed() => if changed.is_err() { return false },
                }
            }
            ProxyMode::Blackhole => {
                if mode.changed().await.is_err() {
                    return false;
                }
            }
        }
    }
}
