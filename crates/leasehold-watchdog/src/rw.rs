//! Read-write leases through the manager: [`LeaseManager::acquire_read`]
//! takes a shared hold and [`LeaseManager::acquire_write`] the exclusive
//! hold of a read-write lease, each returned as an ordinary [`Lease`].
//!
//! A hold is a lease on its own share key (the reader's `{K}:read:<holder>`
//! or the writer's `{K}:write`, see [`LeaseKey::reader_key`] and
//! [`LeaseKey::writer_key`]): the watchdog renews it in the same batches as
//! any lease, and its token, loss reasons, renewal cap, release, drop and
//! shutdown are those of any lease. Its fencing token comes from the
//! lease's counter, so tokens strictly increase across readers and writers.
//!
//! Waiting is the exclusive wait with another attempt (`waiting.rs`), as
//! for permits: waiters queue in this manager under `K`, the head listens
//! on `K`'s release notices (every share's release is announced there),
//! and the wait, the jittered retries and the bound on waiters are the
//! same. One holder id serves every attempt of an acquisition, so the
//! intent a refused writer leaves (writer preference, see the design) is
//! its own and each retry refreshes it; a waiting writer retries at least
//! every third of its ttl
//! ([`intent_refresh`](crate::attempt::intent_refresh)), so its intent does
//! not lapse while it waits. A writer that gives up withdraws its intent
//! (`intent.rs`): when its wait ends without the lease, before the
//! error is returned; when its future is dropped, in the background. Both
//! are best effort (a compare-and-delete that fails leaves the intent to
//! expire, at most one ttl later).
//! Shares take no part in the local handover: a release never hands a
//! share to another waiter, nor a lease or permit to a share's waiter.

use leasehold_core::{LeaseBackend, LeaseKey};
use tracing::info_span;

use crate::attempt::Attempt;
use crate::{Lease, LeaseError, LeaseManager, LeaseOptions};

impl<B: LeaseBackend> LeaseManager<B> {
    /// Takes a shared (read) hold on the read-write lease `key`, waiting up
    /// to `options.wait()` while a writer holds it or waits for it (with no
    /// wait, tries once), and hands the hold to the watchdog.
    ///
    /// Readers hold together; a writer excludes them all. The returned
    /// [`Lease`] is the reader's share: [`Lease::key`] is `key`, and
    /// [`Lease::server_key`] the reader key it holds
    /// (`{key}:read:<holder>`); everything else is as for
    /// [`acquire`](Self::acquire), including the local FIFO queue (under
    /// `key`), the release notices (of `key`, where every share's release
    /// is announced) and the retries between them. A read-write lease `key`
    /// is another lock than the exclusive lease `key`: do not mix the two
    /// on one name.
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let options = LeaseOptions::default();
    /// let first = manager.acquire_read("catalog", &options).await?;
    /// let second = manager.acquire_read("catalog", &options).await?;
    /// assert!(first.fencing_token() < second.fencing_token());
    /// first.release().await?;
    /// second.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), and at once, without retrying:
    /// [`LeaseError::Backend`] with
    /// [`BackendError::Unsupported`](leasehold_core::BackendError::Unsupported)
    /// from a backend without read-write leases (Redlock), or when `key` is
    /// itself a share key. [`LeaseError::Invalid`] also when `key` leaves no
    /// room for its share keys.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue; if an attempt in flight may
    /// have taken the share on the server, the watchdog releases it in the
    /// background.
    pub async fn acquire_read(
        &self,
        key: impl AsRef<str>,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        self.acquire_share(key, options, Attempt::Read).await
    }

    /// Takes the exclusive (write) hold on the read-write lease `key`,
    /// waiting up to `options.wait()` while a writer or readers hold it
    /// (with no wait, tries once), and hands the hold to the watchdog.
    ///
    /// Writers are preferred: once refused, this writer's intent refuses
    /// new readers, so it waits only for the readers that held before it
    /// (every retry, at least each third of `options.ttl()`, keeps the
    /// intent alive). The returned [`Lease`] is the writer's share:
    /// [`Lease::key`] is `key`, and [`Lease::server_key`] the writer key it
    /// holds (`{key}:write`); everything else is as for
    /// [`acquire_read`](Self::acquire_read).
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let writer = manager.acquire_write("catalog", &LeaseOptions::default()).await?;
    /// assert_eq!(writer.key().as_str(), "catalog");
    /// assert_eq!(writer.server_key().as_str(), "{catalog}:write");
    /// writer.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_read`](Self::acquire_read). A writer whose wait runs
    /// out withdraws its intent before the error is returned, and one whose
    /// future is dropped withdraws it in the background, so new readers
    /// are not held back by a writer that no longer waits (if the server
    /// cannot be reached then, the intent expires by itself, at most
    /// `options.ttl()` after the last attempt).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_read`](Self::acquire_read).
    pub async fn acquire_write(
        &self,
        key: impl AsRef<str>,
        options: &LeaseOptions,
    ) -> Result<Lease, LeaseError> {
        self.acquire_share(key, options, Attempt::Write).await
    }

    async fn acquire_share(
        &self,
        key: impl AsRef<str>,
        options: &LeaseOptions,
        attempt: Attempt,
    ) -> Result<Lease, LeaseError> {
        let key = LeaseKey::new(key)?;
        // A key too long for its share keys is refused before anyone queues.
        key.writer_key()?;
        let role = match attempt {
            Attempt::Write => "write",
            _ => "read",
        };
        let span = info_span!("acquire_share", key = %key, role, name = %options.name());
        let kind = match attempt {
            Attempt::Write => crate::metrics::Kind::Write,
            _ => crate::metrics::Kind::Read,
        };
        self.acquire_measured(key, options, attempt, kind, span)
            .await
    }
}
