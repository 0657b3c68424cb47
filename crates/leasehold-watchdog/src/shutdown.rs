//! The signals a graceful shutdown waits for
//! ([`LeaseManager::shutdown_on_signal`](crate::LeaseManager::shutdown_on_signal)):
//! SIGTERM, what a service manager (Kubernetes, systemd, Docker) sends to
//! stop a process, and SIGINT, Ctrl-C in a terminal; Ctrl-C alone on
//! systems without Unix signals. (Under `--cfg loom`, whose tokio has no
//! signal module, none ever comes.)

use std::io;

/// Handlers installed for the shutdown signals, and their deliveries.
pub(crate) struct Signals {
    #[cfg(all(unix, not(loom)))]
    terminate: tokio::signal::unix::Signal,
    #[cfg(all(unix, not(loom)))]
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers now: a signal that comes after this returns
    /// is delivered to [`next`](Self::next), even if it is not waiting yet.
    pub(crate) fn install() -> io::Result<Self> {
        #[cfg(all(unix, not(loom)))]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                terminate: signal(SignalKind::terminate())?,
                interrupt: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(any(not(unix), loom))]
        {
            Ok(Self {})
        }
    }

    /// Waits for the next shutdown signal, and names it.
    pub(crate) async fn next(&mut self) -> &'static str {
        #[cfg(all(unix, not(loom)))]
        {
            // `None`: the runtime's signal driver is gone, and with it any
            // signal to come.
            tokio::select! {
                Some(()) = self.terminate.recv() => "SIGTERM",
                Some(()) = self.interrupt.recv() => "SIGINT",
                else => std::future::pending().await,
            }
        }
        #[cfg(all(not(unix), not(loom)))]
        {
            match tokio::signal::ctrl_c().await {
                Ok(()) => "Ctrl-C",
                Err(_) => std::future::pending().await,
            }
        }
        // Under loom (the model checks of the handle-versus-watchdog races)
        // tokio has no signal module: no signal ever comes.
        #[cfg(loom)]
        {
            std::future::pending().await
        }
    }
}
