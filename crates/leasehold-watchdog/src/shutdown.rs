//! The signals a graceful shutdown waits for
//! ([`LeaseManager::shutdown_on_signal`](crate::LeaseManager::shutdown_on_signal)):
//! SIGTERM, what a service manager (Kubernetes, systemd, Docker) sends to
//! stop a process, and SIGINT, Ctrl-C in a terminal; Ctrl-C alone on
//! systems without Unix signals.

use std::io;

/// Handlers installed for the shutdown signals, and their deliveries.
pub(crate) struct Signals {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers now: a signal that comes after this returns
    /// is delivered to [`next`](Self::next), even if it is not waiting yet.
    pub(crate) fn install() -> io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(Self {})
        }
    }

    /// Waits for the next shutdown signal, and names it.
    pub(crate) async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            // `None`: the runtime's signal driver is gone, and with it any
            // signal to come.
            tokio::select! {
                Some(()) = self.terminate.recv() => "SIGTERM",
                Some(()) = self.interrupt.recv() => "SIGINT",
                else => std::future::pending().await,
            }
        }
        #[cfg(not(unix))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                Err(_) => std::future::pending().await,
            }
        }
    }
}
