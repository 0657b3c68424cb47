//! The holder's handle on a lease.

use std::fmt;
use std::sync::Arc;

use leasehold_core::{FencingToken, HolderId, LeaseKey, ReleaseOutcome, Ttl};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, debug, debug_span, info_span};

use crate::LeaseError;
use crate::bounds::Progress;
use crate::home::{Home, OrphanGuard};
use crate::loss::LossReason;
use crate::renewal::{Command, Registry};
use crate::shared::Shared;

/// A held lease.
///
/// The watchdog renews it in the background until it is released. Watch
/// [`token`](Self::token): it is cancelled, with a [`LossReason`], before the
/// lease can be taken by anyone else. Pass
/// [`fencing_token`](Self::fencing_token) to the stores you write to.
///
/// Dropping a `Lease` releases it in the background; prefer
/// [`release`](Self::release) to learn the outcome.
#[must_use = "dropping a Lease releases it at once"]
pub struct Lease {
    shared: Arc<Shared>,
    id: u64,
    holder: HolderId,
    /// `None` once released: dropping it then does nothing.
    home: Option<Arc<Home>>,
}

impl Lease {
    /// The state the handle shares with the watchdog.
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub(crate) fn new(shared: Arc<Shared>, id: u64, holder: HolderId, home: Arc<Home>) -> Self {
        Self {
            shared,
            id,
            holder,
            home: Some(home),
        }
    }

    /// The key given to the call that acquired the lease: the lease's key
    /// for [`acquire`](crate::LeaseManager::acquire), the semaphore's for
    /// [`acquire_permit`](crate::LeaseManager::acquire_permit), the
    /// read-write lease's for
    /// [`acquire_read`](crate::LeaseManager::acquire_read) and
    /// [`acquire_write`](crate::LeaseManager::acquire_write). The key the
    /// lease holds on the server is [`server_key`](Self::server_key).
    #[must_use]
    pub fn key(&self) -> &LeaseKey {
        &self.shared.key
    }

    /// The key the lease holds on the server: [`key`](Self::key) for an
    /// exclusive lease, the permit key (`{key}:permit:<i>`) for a permit,
    /// the reader's key (`{key}:read:<holder>`) or the writer's
    /// (`{key}:write`) for a share of a read-write lease (see
    /// [`LeaseKey::permit`], [`LeaseKey::reader_key`] and
    /// [`LeaseKey::writer_key`]). For inspecting the server; the lease
    /// itself is renewed and released through the handle.
    ///
    /// ```
    /// use leasehold_core::{MemoryBackend, PermitLimit};
    /// use leasehold_watchdog::LeaseManager;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let permit = manager.acquire_permit("exports", PermitLimit::new(4)?, &Default::default()).await?;
    /// assert_eq!(permit.key().as_str(), "exports");
    /// assert_eq!(permit.server_key().as_str(), "{exports}:permit:0");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn server_key(&self) -> LeaseKey {
        self.shared.server_key(&self.holder)
    }

    /// The lease's name in metrics and logs.
    #[must_use]
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// The span of the lease's whole life: `lease`, at the `INFO` level,
    /// with the lease's `key`, `name`, `kind`, `holder` (abbreviated, as
    /// holder ids are everywhere in logs) and `fencing_token`. It opens when
    /// the lease is acquired, as a child of the span the acquisition was
    /// called in, and closes when the handle is released or dropped and
    /// the work instrumented with it is done; the watchdog's warning of a
    /// loss is inside it.
    ///
    /// [`with_lease`](crate::LeaseManager::with_lease), an
    /// [election](crate::Election::run)'s term and a
    /// [tick](crate::LeaseManager::run_tick)'s run run their work inside
    /// it; for a lease you hold yourself, instrument the work with it:
    ///
    /// ```
    /// use leasehold_core::MemoryBackend;
    /// use leasehold_watchdog::{LeaseManager, LeaseOptions};
    /// use tracing::Instrument;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let manager = LeaseManager::new(MemoryBackend::new())?;
    /// let lease = manager.acquire("reports:nightly", &LeaseOptions::default()).await?;
    /// async { tracing::info!("writing the report") } // logged inside `lease`
    ///     .instrument(lease.span())
    ///     .await;
    /// lease.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Without a subscriber that wants it, it is
    /// [`Span::none()`](tracing::Span::none) and costs nothing.
    #[must_use]
    pub fn span(&self) -> Span {
        self.shared.span()
    }

    /// Opens the lease's span (see [`span`](Self::span)), as a child of the
    /// current span: called where the lease was acquired, outside the
    /// acquisition's own span.
    pub(crate) fn open_span(&self) {
        // Nothing to build when nothing is logged at this level.
        if !tracing::level_enabled!(tracing::Level::INFO) {
            return;
        }
        self.shared.set_span(info_span!(
            "lease",
            key = %self.shared.key,
            name = %self.shared.name(),
            kind = self.shared.series.kind.as_str(),
            holder = %self.holder,
            fencing_token = %self.shared.fencing_token,
        ));
    }

    /// The fencing token of this acquisition: strictly greater than that of
    /// every earlier acquisition of the key.
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.shared.fencing_token
    }

    /// The lease's ttl.
    #[must_use]
    pub fn ttl(&self) -> Ttl {
        self.shared.ttl()
    }

    /// A token cancelled when the lease ends for any reason other than
    /// [`release`](Self::release). Each call returns a new child of the
    /// lease's own token: cancelling it yourself affects neither the lease
    /// nor the tokens of other calls.
    #[must_use]
    pub fn token(&self) -> CancellationToken {
        // A child made on demand rather than one kept in the handle: a
        // manager may hold a million leases, and a token node is ~130 bytes.
        self.shared.token.child_token()
    }

    /// The handle through which the holder reports progress, for a lease
    /// bound to it by
    /// [`LeaseOptionsBuilder::progress_window`](crate::LeaseOptionsBuilder::progress_window)
    /// (see [`Progress`]). Clone it into every task of the job. Without a
    /// window, its reports are ignored.
    #[must_use]
    pub fn progress(&self) -> Progress {
        Progress::new(self.shared.bounds.clone())
    }

    /// Until when, on this process's monotonic clock, the lease is certainly
    /// held, as of the last successful renewal.
    #[must_use]
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// How many times the watchdog has renewed the lease.
    #[must_use]
    pub fn renewals(&self) -> u32 {
        self.shared.renewals()
    }

    /// Why the lease ended, once its token has been cancelled.
    #[must_use]
    pub fn loss_reason(&self) -> Option<LossReason> {
        self.shared.loss()
    }

    /// Waits until the lease ends and says why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits on the token.
    pub async fn lost(&self) -> LossReason {
        self.shared.token.cancelled().await;
        // `end` records the reason before cancelling the token.
        self.shared.loss().unwrap_or(LossReason::Lost)
    }

    /// Stops renewing and frees the lease on the server (compare-and-delete),
    /// so a waiter can take it at once. A lease acquired with a minimum hold
    /// ([`LeaseOptionsBuilder::hold_at_least`](crate::LeaseOptionsBuilder::hold_at_least))
    /// released before it has run out stays taken on the server until then;
    /// the release still returns at once, with
    /// [`ReleaseOutcome::Released`].
    ///
    /// # Errors
    ///
    /// [`LeaseError::Backend`] when the server could not be reached (the
    /// lease then expires by itself within its ttl), and
    /// [`LeaseError::ManagerStopped`] after the manager has shut down (which
    /// released every lease).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the release still happens in the background.
    pub async fn release(mut self) -> Result<ReleaseOutcome, LeaseError> {
        let Some(home) = self.home.take() else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        if !self.shared.claim_release() {
            // The watchdog ended the lease (lost, capped, past its deadline,
            // or shut down) and keeps its entry until the handle lets go:
            // it releases what may be left.
            let (reply, answer) = oneshot::channel();
            home.commands
                .send(Command::Release {
                    id: self.id,
                    reply: Some(reply),
                })
                .map_err(|_| LeaseError::ManagerStopped)?;
            return answer.await.map_err(|_| LeaseError::ManagerStopped)?;
        }
        // Ours to release, here. The watchdog is told to forget the lease
        // once the release is over (or dropped), not before: waking its task
        // first would put it ahead of the release's own round trip. A
        // renewal meanwhile finds the lease gone (or handed over) and is
        // ignored, as the release is claimed. If the watchdog is gone, the
        // lease is still ours on the server and is released all the same.
        let _forget = Forget {
            registry: &home.registry,
            id: self.id,
        };
        crate::metrics::ended(
            &self.shared.series,
            crate::metrics::RELEASED,
            self.shared.acquired_at.elapsed(),
        );
        let key = &self.shared.server_key(&self.holder);
        // A release future dropped in flight hands the release to the
        // watchdog, as a dropped handle does.
        let mut abandoned = OrphanGuard {
            commands: &home.commands,
            key,
            holder: self.holder,
            armed: true,
            permits: None,
            share: None,
        };
        // Inside the lease's span when it has one. Not even looked for
        // when nothing is logged at this level (the usual release, in a
        // process without a debug subscriber, pays one atomic load).
        let span = if tracing::level_enabled!(tracing::Level::DEBUG) {
            self.shared
                .span()
                .in_scope(|| debug_span!("release", key = %key, name = %self.shared.name()))
        } else {
            Span::none()
        };
        let outcome = home
            .release(key, &self.holder, self.shared.fair())
            .instrument(span)
            .await;
        abandoned.armed = false;
        if let Err(error) = &outcome {
            debug!(%key, %error, "release failed; the lease expires by itself");
        }
        outcome.map_err(LeaseError::from)
    }
}

impl Lease {
    /// Takes the lease's end on the caller, as [`release`](Self::release)
    /// does, for an end the caller sends itself: a tick's completion,
    /// which releases the lease in the same atomic operation. The watchdog
    /// stops renewing at once and forgets the lease when the returned
    /// [`Ending`] is dropped; an `Ending` dropped before
    /// [`Ending::done`] (the end failed or its future was dropped) hands a
    /// plain release to the watchdog. `None` when the watchdog had ended
    /// the lease already: the handle is then dropped, which lets the
    /// watchdog release what may be left.
    pub(crate) fn take_end(mut self) -> Option<Ending> {
        let home = self.home.take()?;
        if !self.shared.claim_release() {
            let _ = home.commands.send(Command::Release {
                id: self.id,
                reply: None,
            });
            return None;
        }
        crate::metrics::ended(
            &self.shared.series,
            crate::metrics::RELEASED,
            self.shared.acquired_at.elapsed(),
        );
        Some(Ending {
            key: self.shared.server_key(&self.holder),
            holder: self.holder,
            id: self.id,
            home,
            armed: true,
        })
    }
}

/// A lease whose end the caller took (see [`Lease::take_end`]).
pub(crate) struct Ending {
    home: Arc<Home>,
    id: u64,
    key: LeaseKey,
    holder: HolderId,
    armed: bool,
}

impl Ending {
    /// The caller's end reached the server: nothing is left to release.
    pub(crate) fn done(mut self) {
        self.armed = false;
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.home.commands.send(Command::ReleaseOrphan {
                key: self.key.clone(),
                holder: self.holder,
            });
        }
        self.home.registry.forget(self.id);
    }
}

/// Tells the watchdog to forget a lease whose release the handle ran,
/// when dropped: after the release, whether it finished or was abandoned.
struct Forget<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.registry.forget(self.id);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Released (this runs at the end of `release` too) or dropped: the
        // lease's span closes once the work instrumented with it is done.
        // Without a subscriber at this level there is none to close (one
        // kept by a subscriber gone since closes with the shared state).
        if tracing::level_enabled!(tracing::Level::INFO) {
            self.shared.close_span();
        }
        if let Some(home) = self.home.take() {
            // Never blocks: the watchdog does the release. If it is gone the
            // manager has shut down and released everything already.
            let _ = home.commands.send(Command::Release {
                id: self.id,
                reply: None,
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.shared.key)
            .field("name", self.shared.name())
            .field("fencing_token", &self.shared.fencing_token)
            .field("ttl", &self.shared.ttl())
            .field("renewals", &self.renewals())
            .field("loss", &self.loss_reason())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, PoisonError};
    use std::time::Duration;

    use leasehold_core::MemoryBackend;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Instrument, Metadata, Subscriber, info, info_span};

    use crate::{Election, Every, LeaseError, LeaseManager, LeaseOptions, LossReason, TickJob};

    /// A span as the test subscriber saw it.
    #[derive(Debug, Default)]
    struct SpanSeen {
        name: &'static str,
        parent: Option<u64>,
        fields: HashMap<String, String>,
        refs: usize,
        closed: bool,
    }

    #[derive(Debug, Default)]
    struct Seen {
        spans: HashMap<u64, SpanSeen>,
        /// The spans entered on this (the only) thread, innermost last.
        stack: Vec<u64>,
        /// Each event's message and the span it was in.
        events: Vec<(String, Option<u64>)>,
    }

    impl Seen {
        fn ids(&self, name: &str) -> Vec<u64> {
            let mut ids: Vec<u64> = self
                .spans
                .iter()
                .filter(|(_, s)| s.name == name)
                .map(|(id, _)| *id)
                .collect();
            ids.sort_unstable();
            ids
        }

        /// The span of the event whose message starts with `message`.
        fn span_of(&self, message: &str) -> Option<u64> {
            self.events
                .iter()
                .find(|(m, _)| m.starts_with(message))
                .unwrap_or_else(|| panic!("no event {message:?} in {:?}", self.events))
                .1
        }

        /// Whether `span` is `ancestor` or inside it.
        fn within(&self, mut span: Option<u64>, ancestor: u64) -> bool {
            while let Some(id) = span {
                if id == ancestor {
                    return true;
                }
                span = self.spans.get(&id).and_then(|s| s.parent);
            }
            false
        }
    }

    struct Fields<'a>(&'a mut HashMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    /// A subscriber that keeps every span (with its parent, fields and
    /// whether it closed) and every event's span.
    #[derive(Clone, Default)]
    struct Spans(Arc<Mutex<Seen>>);

    impl Spans {
        fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl Subscriber for Spans {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, attributes: &Attributes<'_>) -> Id {
            let mut seen = self.seen();
            let id = seen.spans.len() as u64 + 1;
            let parent = if let Some(parent) = attributes.parent() {
                Some(parent.into_u64())
            } else if attributes.is_contextual() {
                seen.stack.last().copied()
            } else {
                None
            };
            let mut span = SpanSeen {
                name: attributes.metadata().name(),
                parent,
                refs: 1,
                ..SpanSeen::default()
            };
            attributes.record(&mut Fields(&mut span.fields));
            seen.spans.insert(id, span);
            Id::from_u64(id)
        }
        fn record(&self, span: &Id, values: &Record<'_>) {
            if let Some(span) = self.seen().spans.get_mut(&span.into_u64()) {
                values.record(&mut Fields(&mut span.fields));
            }
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, event: &Event<'_>) {
            let mut fields = HashMap::new();
            event.record(&mut Fields(&mut fields));
            let mut seen = self.seen();
            let span = if let Some(parent) = event.parent() {
                Some(parent.into_u64())
            } else if event.is_contextual() {
                seen.stack.last().copied()
            } else {
                None
            };
            let message = fields.remove("message").unwrap_or_default();
            seen.events.push((message, span));
        }
        fn enter(&self, span: &Id) {
            self.seen().stack.push(span.into_u64());
        }
        fn exit(&self, span: &Id) {
            let mut seen = self.seen();
            if let Some(at) = seen.stack.iter().rposition(|id| *id == span.into_u64()) {
                seen.stack.remove(at);
            }
        }
        fn clone_span(&self, span: &Id) -> Id {
            if let Some(seen) = self.seen().spans.get_mut(&span.into_u64()) {
                seen.refs += 1;
            }
            span.clone()
        }
        fn try_close(&self, span: Id) -> bool {
            let mut seen = self.seen();
            let Some(seen) = seen.spans.get_mut(&span.into_u64()) else {
                return false;
            };
            seen.refs -= 1;
            seen.closed = seen.refs == 0;
            seen.closed
        }
    }

    /// The lease span: opened at the acquisition as a child of the
    /// caller's span, with the lease's key, name, holder and fencing
    /// token; the work of `with_lease`, of an election's term and of a
    /// tick's run logs inside it (the term inside its `lead` span, a child
    /// of it); the watchdog's warning of a loss is inside it; it is closed
    /// once the handle is released or dropped, and only then.
    #[tokio::test(flavor = "current_thread")]
    async fn the_work_runs_inside_the_lease_span() -> Result<(), Box<dyn std::error::Error>> {
        let spans = Spans::default();
        // With a single dispatcher registered, tracing asks only the
        // current thread's for a callsite's interest: a callsite first hit
        // by another test of this binary (a thread without a subscriber)
        // would be cached as never wanted, here too. A second dispatcher,
        // kept for the test's length, makes every callsite ask them all.
        let _second = tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default());
        let _subscriber = tracing::subscriber::set_default(spans.clone());
        let backend = MemoryBackend::new();
        let manager = LeaseManager::new(backend.clone())?;
        let options = LeaseOptions::builder()
            .ttl(Duration::from_secs(3))
            .name("spanned")
            .build()?;

        // with_lease, called inside a span of the caller's.
        let job = info_span!("job");
        let job_id = job.id().ok_or("the job span is disabled")?.into_u64();
        let token = manager
            .with_lease("reports:spanned", &options, |work| async move {
                info!("working");
                tokio::task::yield_now().await;
                info!("still working");
                work.fencing_token()
            })
            .instrument(job)
            .await?;
        {
            let seen = spans.seen();
            let leases = seen.ids("lease");
            assert_eq!(leases.len(), 1, "{:?}", seen.spans);
            let lease = &seen.spans[&leases[0]];
            assert_eq!(lease.parent, Some(job_id), "not the caller's child");
            assert_eq!(lease.fields["key"], "reports:spanned");
            assert_eq!(lease.fields["name"], "spanned");
            assert_eq!(lease.fields["kind"], "exclusive");
            assert_eq!(lease.fields["fencing_token"], token.to_string());
            assert!(lease.fields.contains_key("holder"));
            for message in ["working", "still working"] {
                assert!(seen.events.iter().any(|(m, _)| m == message), "{message}");
                assert_eq!(seen.span_of(message), Some(leases[0]), "{message}");
            }
            assert!(lease.closed, "the span outlived the lease: {lease:?}");
        }

        // A lease held by hand: open while held, its loss warned inside
        // it, closed when the handle goes.
        let lease = manager.acquire("reports:lost", &options).await?;
        let id = lease.span().id().ok_or("no lease span")?.into_u64();
        assert!(backend.vanish(lease.key()));
        let reason = tokio::time::timeout(Duration::from_secs(5), lease.lost()).await?;
        assert_eq!(reason, LossReason::Lost);
        {
            let seen = spans.seen();
            assert_eq!(seen.span_of("lease ended: "), Some(id));
            assert!(!seen.spans[&id].closed, "closed while the handle lives");
        }
        drop(lease);
        assert!(spans.seen().spans[&id].closed, "not closed with its handle");

        // An election's term: inside `lead`, inside the lease span.
        let election = Election::new(manager.clone(), "spanned:leader", options.clone())?;
        let stop = tokio_util::sync::CancellationToken::new();
        let stop_after_term = stop.clone();
        tokio::time::timeout(
            Duration::from_secs(5),
            election.run(stop, |work| {
                let stop = stop_after_term.clone();
                async move {
                    info!("leading");
                    stop.cancel();
                    work.cancelled().await;
                }
            }),
        )
        .await??;
        {
            let seen = spans.seen();
            let lease = *seen.ids("lease").last().ok_or("no lease span")?;
            let lead = seen.span_of("leading");
            assert_ne!(lead, Some(lease), "not in the lead span");
            assert!(
                seen.within(lead, lease),
                "the term is not inside the lease span"
            );
            assert!(seen.spans[&lease].closed, "the term's span outlived it");
        }

        // A tick's run.
        let job = TickJob::builder("spanned-report", Every::new(Duration::from_secs(60))?)
            .lease(LeaseOptions::builder().name("spanned-report"))
            .build()?;
        let tick = job.tick_to_ask(backend.wall_clock()).ok_or("no tick")?;
        let ran = manager
            .run_tick(&job, tick, |_| async { info!("ticking") })
            .await?;
        assert!(ran.ran(), "{ran:?}");
        {
            let seen = spans.seen();
            let lease = *seen.ids("lease").last().ok_or("no lease span")?;
            assert_eq!(seen.spans[&lease].fields["name"], "spanned-report");
            assert_eq!(seen.span_of("ticking"), Some(lease));
            assert!(seen.spans[&lease].closed, "the run's span outlived it");
        }
        manager.shutdown().await;
        // After the shutdown, a lease is refused (no span is left open).
        let refused = manager.acquire("reports:late", &options).await;
        assert!(matches!(refused, Err(LeaseError::ManagerStopped)));
        Ok(())
    }
}
