//! The backend contract as a suite any [`LeaseBackend`] can run.
//!
//! Every backend, leasehold's own
//! ([`MemoryBackend`](leasehold_core::MemoryBackend), the Redis backends)
//! and a third party's, must keep the same contract (docs/design.md, "The
//! backend contract"). A [`Suite`] checks it against a live backend, on keys
//! of its own under a prefix, and says which [`Rule`] was broken when one
//! is: the checks are judged from the backend's own answers (its
//! [`inspect`](LeaseBackend::inspect) and the outcomes of later calls), so
//! a backend that changes something it said it did not change is caught.
//!
//! - [`Suite::core`] checks what every backend must do: each rule of
//!   [`Rule::CORE`], also reachable one by one ([`Suite::grants_free_key`],
//!   [`Suite::refuses_with_holder_info`], ...).
//! - The optional areas, for a backend that has them, are functions of
//!   their own: [`Suite::permits`], [`Suite::read_write`],
//!   [`Suite::fair_queue`], [`Suite::fair_handover`], [`Suite::handover`],
//!   [`Suite::minimum_hold`] and [`Suite::change_feed`] (which needs a
//!   second client of the same store).
//! - [`Suite::run`] runs the core and the areas it is given, and returns
//!   the rules it checked.
//!
//! Real time runs: the ttls the checks wait out are short (300 ms by
//! default, see [`Suite::short_ttl`]) and every wait is bounded (see
//! [`Suite::patience`] and [`Suite::expiry_slack`]); the core takes about
//! a second. Keys carry a random
//! nonce, so that runs on one server do not meet; each check releases what
//! it took, and what it leaves expires within [`Suite::long_ttl`].
//!
//! A third-party backend runs it from a test of its own (here
//! `MemoryBackend` stands in for it):
//!
//! ```no_run
//! use leasehold::MemoryBackend as MyBackend;
//! use leasehold_testkit::conformance::{Area, ConformanceError, Rule, Suite};
//!
//! #[tokio::test]
//! async fn my_backend_keeps_the_contract() -> Result<(), ConformanceError> {
//!     let backend = MyBackend::new(); // connected to a store of its own
//!     // The core, then the optional areas the backend has.
//!     let checked = Suite::new(backend.clone(), "my-backend")
//!         .run(&[Area::ReleaseNotices, Area::Permits, Area::ReadWrite])
//!         .await?;
//!     assert!(checked.contains(&Rule::TokensIncrease));
//!     // One rule alone, and the change feed, which needs a second client
//!     // of the same store (a second connection, as another process).
//!     let suite = Suite::new(backend.clone(), "my-backend");
//!     suite.release_owner_checked().await?;
//!     suite.change_feed(&backend.client()).await
//! }
//! ```
//!
//! A broken rule reads, for example:
//!
//! ```text
//! release-owner-checked: a stranger's release of a held lease was answered Released, not NotHeld
//! ```
//!
//! A backend needs no more than the trait's required methods to run the
//! core (the repository's tests/conformance_bites.rs runs it on one of five
//! methods, and on the same backend with one flaw each, to show every rule
//! can fail). Every backend call of the suite goes through the thin
//! functions of the private `call` module, so that a change of the trait's
//! shape is made in one place.

use std::fmt;
use std::time::Duration;

use leasehold_core::{
    AcquireOutcome, AcquireRequest, BackendError, FairOutcome, FencingToken, Grant,
    HandoverOutcome, HolderId, LeaseBackend, LeaseChange, LeaseInfo, LeaseKey, PermitLimit,
    PlaceTtl, ReleaseOutcome, RenewOutcome, RenewRequest, Ttl, clock_drift,
};
use tokio::time::Instant;

/// A rule of the backend contract, as the suite names it when it is broken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rule {
    /// A free key is granted, to the holder that asked, with the ttl it
    /// asked for, valid until the request was sent + ttl − drift.
    GrantsFreeKey,
    /// A held key is refused to anyone else, with the holder's fencing
    /// token, label and time left.
    RefusesWithHolderInfo,
    /// The holder acquiring its lease again gets it, with the same fencing
    /// token, and its ttl refreshed.
    ReacquireRefreshes,
    /// Fencing tokens of a key strictly increase across holders: after a
    /// release and after an expiry.
    TokensIncrease,
    /// A renewal renews the holder's lease only: a stranger's renewal, or
    /// one of a free key, is `Lost` and changes nothing.
    RenewOwnerChecked,
    /// A release frees the holder's lease only: a stranger's is `NotHeld`
    /// and changes nothing; a second release is `NotHeld`.
    ReleaseOwnerChecked,
    /// `renew_many` answers one outcome per request, in the order asked.
    RenewManyInOrder,
    /// `inspect` says `None` for a free key and the holder's token, label
    /// and time left for a held one, without changing it.
    Inspect,
    /// A watch of a backend that has release notices wakes on a release.
    ReleaseNotices,
    /// A lease its holder neither renews nor releases stays held until its
    /// ttl and is free soon after it.
    ExpiryFrees,
    /// `release_to` either hands the lease to the offered request (a new
    /// holder with a higher token) or only releases it; never when the
    /// lease is not the caller's.
    ReleaseTo,
    /// A backend with handover hands the lease over when only the caller's
    /// own watch listens.
    Handover,
    /// A release under a minimum hold keeps the lease, with its token,
    /// until the minimum, and frees it then.
    MinimumHold,
    /// Permits: up to the limit, on permit keys of the semaphore, with
    /// rising tokens from the semaphore's counter; the limit is checked.
    Permits,
    /// Read-write leases: readers share, a writer holds alone and, while
    /// it waits, keeps new readers out (writer preference).
    ReadWrite,
    /// Fair queue: the lease goes to the head of the queue, in arrival
    /// order; a waiter that leaves is skipped.
    FairQueue,
    /// The change feed reports a change made by another client to a lease
    /// this backend renews.
    ChangeFeed,
    /// A fair holder's release hands the lease to the queue's head that
    /// asked for a handover, and tells its watch the new token.
    FairHandover,
}

impl Rule {
    /// The rules [`Suite::core`] checks, in the order it checks them.
    pub const CORE: [Rule; 11] = [
        Rule::GrantsFreeKey,
        Rule::RefusesWithHolderInfo,
        Rule::ReacquireRefreshes,
        Rule::Inspect,
        Rule::RenewOwnerChecked,
        Rule::ReleaseOwnerChecked,
        Rule::RenewManyInOrder,
        Rule::TokensIncrease,
        Rule::ReleaseNotices,
        Rule::ReleaseTo,
        Rule::ExpiryFrees,
    ];

    /// A short, stable name (`release-owner-checked`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Rule::GrantsFreeKey => "grants-free-key",
            Rule::RefusesWithHolderInfo => "refuses-with-holder-info",
            Rule::ReacquireRefreshes => "reacquire-refreshes",
            Rule::TokensIncrease => "tokens-increase",
            Rule::RenewOwnerChecked => "renew-owner-checked",
            Rule::ReleaseOwnerChecked => "release-owner-checked",
            Rule::RenewManyInOrder => "renew-many-in-order",
            Rule::Inspect => "inspect",
            Rule::ReleaseNotices => "release-notices",
            Rule::ExpiryFrees => "expiry-frees",
            Rule::ReleaseTo => "release-to",
            Rule::Handover => "handover",
            Rule::MinimumHold => "minimum-hold",
            Rule::Permits => "permits",
            Rule::ReadWrite => "read-write",
            Rule::FairQueue => "fair-queue",
            Rule::ChangeFeed => "change-feed",
            Rule::FairHandover => "fair-handover",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a conformance check failed.
///
/// Its `Debug` form is its message, so that a test returning it prints the
/// broken rule and what the backend did.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The backend answered, and the answer breaks `rule`.
    #[error("{rule}: {detail}")]
    Violated {
        /// The rule broken.
        rule: Rule,
        /// What the backend did, against what the rule asks.
        detail: String,
    },
    /// A backend call failed (a transport error, or an error where the
    /// contract asks for an outcome) while checking `rule`.
    #[error("{rule}: {op} failed: {source}")]
    Backend {
        /// The rule being checked.
        rule: Rule,
        /// The backend call.
        op: &'static str,
        /// Its error.
        source: BackendError,
    },
    /// The suite could not build its inputs (a prefix too long for a key,
    /// no entropy for a holder id, a short ttl out of range).
    #[error("the conformance suite could not build its inputs: {0}")]
    Setup(#[from] leasehold_core::InputError),
}

impl fmt::Debug for ConformanceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl ConformanceError {
    /// The rule being checked, unless the suite failed before asking.
    #[must_use]
    pub fn rule(&self) -> Option<Rule> {
        match self {
            ConformanceError::Violated { rule, .. } | ConformanceError::Backend { rule, .. } => {
                Some(*rule)
            }
            ConformanceError::Setup(_) => None,
        }
    }
}

/// An optional part of the contract, for [`Suite::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Area {
    /// The backend has release notices: a watch must be supported and wake
    /// on a release ([`Rule::ReleaseNotices`] then fails on an unsupported
    /// watch instead of passing it by).
    ReleaseNotices,
    /// [`Suite::handover`].
    Handover,
    /// [`Suite::minimum_hold`].
    MinimumHold,
    /// [`Suite::permits`].
    Permits,
    /// [`Suite::read_write`].
    ReadWrite,
    /// [`Suite::fair_queue`].
    FairQueue,
    /// [`Suite::fair_handover`].
    FairHandover,
}

/// The conformance suite, bound to one backend and a key prefix.
#[derive(Debug, Clone)]
pub struct Suite<B> {
    backend: B,
    prefix: String,
    short_ttl: Ttl,
    long_ttl: Ttl,
    patience: Duration,
    expiry_slack: Duration,
    notices: Option<bool>,
    handover: Option<bool>,
}

type Checked<T = ()> = Result<T, ConformanceError>;

fn violated(rule: Rule, detail: impl Into<String>) -> ConformanceError {
    ConformanceError::Violated {
        rule,
        detail: detail.into(),
    }
}

fn ensure(rule: Rule, holds: bool, detail: impl FnOnce() -> String) -> Checked {
    if holds {
        Ok(())
    } else {
        Err(violated(rule, detail()))
    }
}

/// The backend calls of the suite, one thin function each, mapping errors
/// to the rule being checked. The only place the suite names a trait
/// method.
mod call {
    use super::{Checked, ConformanceError, Rule};
    use std::time::Duration;

    use leasehold_core::{
        AcquireOutcome, AcquireRequest, BackendError, ChangeBackend, ChangeWatch, FairBackend,
        FairOutcome, HandoverBackend, HandoverOutcome, HandoverWatch, HolderId, LeaseBackend,
        LeaseInfo, LeaseKey, PermitBackend, PermitLimit, PlaceTtl, ReadWriteBackend,
        ReleaseOutcome, ReleaseWatch, RenewOutcome, RenewRequest, WatchPolicy,
    };

    fn failed(rule: Rule, op: &'static str) -> impl FnOnce(BackendError) -> ConformanceError {
        move |source| ConformanceError::Backend { rule, op, source }
    }

    pub(super) async fn acquire<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        request: &AcquireRequest,
    ) -> Checked<AcquireOutcome> {
        backend
            .try_acquire(request)
            .await
            .map_err(failed(rule, "try_acquire"))
    }

    pub(super) async fn renew<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        request: &RenewRequest,
    ) -> Checked<RenewOutcome> {
        backend.renew(request).await.map_err(failed(rule, "renew"))
    }

    /// Every outcome, errors kept in place: the order is what is checked.
    pub(super) async fn renew_many<B: LeaseBackend>(
        backend: &B,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        backend.renew_many(requests).await
    }

    pub(super) async fn release<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Checked<ReleaseOutcome> {
        backend
            .release(key, holder)
            .await
            .map(ReleaseOutcome::from)
            .map_err(failed(rule, "release"))
    }

    pub(super) async fn release_to<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
        next: &AcquireRequest,
    ) -> Checked<HandoverOutcome> {
        // Without the capability a handover is a plain release, as the
        // manager makes it: the rule then checks that nothing is handed.
        match backend.handover() {
            Some(handover) => handover.release_to(key, holder, next).await,
            None => backend
                .release(key, holder)
                .await
                .map(|report| match report.outcome() {
                    ReleaseOutcome::Released => HandoverOutcome::Released,
                    _ => HandoverOutcome::NotHeld,
                }),
        }
        .map_err(failed(rule, "release_to"))
    }

    pub(super) async fn inspect<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
    ) -> Checked<Option<LeaseInfo>> {
        backend.inspect(key).await.map_err(failed(rule, "inspect"))
    }

    pub(super) async fn watch_releases<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
    ) -> Checked<ReleaseWatch> {
        backend
            .watch_releases(key, WatchPolicy::Counted)
            .await
            .map_err(failed(rule, "watch_releases"))
    }

    pub(super) async fn watch_changes<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
    ) -> Checked<ChangeWatch> {
        match backend.changes() {
            Some(changes) => changes.watch_changes().await,
            None => Ok(ChangeWatch::unsupported()),
        }
        .map_err(failed(rule, "watch_changes"))
    }

    /// The raw result: a limit mismatch is an error the rule expects.
    pub(super) async fn acquire_permit<B: LeaseBackend>(
        backend: &B,
        request: &AcquireRequest,
        limit: PermitLimit,
    ) -> Result<AcquireOutcome, BackendError> {
        match backend.permits() {
            Some(permits) => permits.try_acquire_permit(request, limit).await,
            None => Err(BackendError::no_permits(&request.key)),
        }
    }

    pub(super) async fn acquire_read<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        request: &AcquireRequest,
    ) -> Checked<AcquireOutcome> {
        match backend.read_write() {
            Some(rw) => rw.try_acquire_read(request).await,
            None => Err(BackendError::no_read_write("acquire_read", &request.key)),
        }
        .map_err(failed(rule, "try_acquire_read"))
    }

    pub(super) async fn acquire_write<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        request: &AcquireRequest,
    ) -> Checked<AcquireOutcome> {
        match backend.read_write() {
            Some(rw) => rw.try_acquire_write(request).await,
            None => Err(BackendError::no_read_write("acquire_write", &request.key)),
        }
        .map_err(failed(rule, "try_acquire_write"))
    }

    pub(super) async fn withdraw_write_intent<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Checked<bool> {
        match backend.read_write() {
            Some(rw) => rw.withdraw_write_intent(key, holder).await,
            None => Err(BackendError::no_read_write("withdraw_write_intent", key)),
        }
        .map_err(failed(rule, "withdraw_write_intent"))
    }

    pub(super) async fn acquire_fair<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        request: &AcquireRequest,
        place_ttl: PlaceTtl,
        handover: Option<Duration>,
    ) -> Checked<FairOutcome> {
        match backend.fair() {
            Some(fair) => fair.try_acquire_fair(request, place_ttl, handover).await,
            None => Err(BackendError::no_fair_queue(&request.key)),
        }
        .map_err(failed(rule, "try_acquire_fair"))
    }

    pub(super) async fn release_fair<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Checked<ReleaseOutcome> {
        match backend.fair() {
            Some(fair) => fair.release_fair(key, holder).await,
            None => Err(BackendError::no_fair_queue(key)),
        }
        .map_err(failed(rule, "release_fair"))
    }

    pub(super) async fn watch_handover<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Checked<HandoverWatch> {
        match backend.fair() {
            Some(fair) => fair.watch_handover(key, holder).await,
            None => Err(BackendError::no_fair_queue(key)),
        }
        .map_err(failed(rule, "watch_handover"))
    }

    pub(super) async fn leave_fair_queue<B: LeaseBackend>(
        backend: &B,
        rule: Rule,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Checked {
        match backend.fair() {
            Some(fair) => fair.leave_fair_queue(key, holder).await,
            None => Err(BackendError::no_fair_queue(key)),
        }
        .map_err(failed(rule, "leave_fair_queue"))
    }
}

impl<B: LeaseBackend> Suite<B> {
    /// A suite for `backend`, on keys under `prefix` (plus a random nonce).
    /// A prefix with a hash tag (`"cluster:{tagged}"`) keeps every key of
    /// the suite in one Redis Cluster slot.
    pub fn new(backend: B, prefix: impl Into<String>) -> Self {
        Self {
            backend,
            prefix: format!("{}:{:08x}", prefix.into(), fastrand::u32(..)),
            short_ttl: Ttl::new(Duration::from_millis(300)).expect("300 ms is a valid ttl"),
            long_ttl: Ttl::new(Duration::from_secs(10)).expect("10 s is a valid ttl"),
            patience: Duration::from_secs(5),
            expiry_slack: Duration::from_millis(100),
            notices: None,
            handover: None,
        }
    }

    /// The ttl of the leases the suite lets expire (default 300 ms); the
    /// expiry checks wait about this long.
    #[must_use]
    pub fn short_ttl(mut self, ttl: Ttl) -> Self {
        self.short_ttl = ttl;
        self
    }

    /// The ttl of every other lease (default 10 s): longer than any check
    /// runs, so that nothing expires under a check by accident.
    #[must_use]
    pub fn long_ttl(mut self, ttl: Ttl) -> Self {
        self.long_ttl = ttl;
        self
    }

    /// How long the suite waits for something the backend should do soon
    /// (a release notice, a change report, a handover) before it calls the
    /// rule broken (default 5 s). An expired key has a tighter bound, see
    /// [`expiry_slack`](Self::expiry_slack).
    #[must_use]
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// How late after its ttl (or minimum hold) a lease may still be
    /// refused to a stranger (default 100 ms): an acquisition sent later
    /// than the latest moment the lease could have been meant to end, plus
    /// this, must be granted. Redis and `MemoryBackend` free a key within
    /// a millisecond of its expiry.
    #[must_use]
    pub fn expiry_slack(mut self, slack: Duration) -> Self {
        self.expiry_slack = slack;
        self
    }

    /// Whether the backend has release notices: `Some(true)` makes an
    /// unsupported watch a broken [`Rule::ReleaseNotices`], `Some(false)`
    /// a supported one; `None` (the default) judges a supported watch by
    /// whether it wakes and lets an unsupported one be.
    #[must_use]
    pub fn expect_notices(mut self, notices: Option<bool>) -> Self {
        self.notices = notices;
        self
    }

    /// Whether the backend hands a lease over in
    /// [`release_to`](leasehold_core::HandoverBackend::release_to): `Some(false)` makes a
    /// handover a broken [`Rule::ReleaseTo`] (a backend that must only
    /// release, as Redlock), `Some(true)` a mere release when only the
    /// caller's own watch listens (as [`Area::Handover`] does); `None`, the
    /// default, accepts either and checks what was done.
    #[must_use]
    pub fn expect_handover(mut self, handover: Option<bool>) -> Self {
        self.handover = handover;
        self
    }

    /// The backend under test.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// A fresh key of the suite's own.
    fn key(&self, name: &str) -> Checked<LeaseKey> {
        Ok(LeaseKey::new(format!(
            "{}:{name}:{:06x}",
            self.prefix,
            fastrand::u32(..1 << 24)
        ))?)
    }

    fn request(&self, key: &LeaseKey, holder: HolderId) -> AcquireRequest {
        AcquireRequest::new(key.clone(), holder, self.long_ttl)
    }

    async fn grant(&self, rule: Rule, request: &AcquireRequest) -> Checked<Grant> {
        match call::acquire(&self.backend, rule, request).await? {
            AcquireOutcome::Acquired(grant) => Ok(grant),
            AcquireOutcome::Held(info) => Err(violated(
                rule,
                format!(
                    "a free key {} was refused, as held by {info:?}",
                    request.key
                ),
            )),
        }
    }

    async fn refused(&self, rule: Rule, request: &AcquireRequest) -> Checked<LeaseInfo> {
        match call::acquire(&self.backend, rule, request).await? {
            AcquireOutcome::Held(info) => Ok(info),
            AcquireOutcome::Acquired(grant) => Err(violated(
                rule,
                format!(
                    "a held key {} was granted to someone else, with token {}",
                    request.key, grant.fencing_token
                ),
            )),
        }
    }

    async fn held(&self, rule: Rule, key: &LeaseKey) -> Checked<LeaseInfo> {
        call::inspect(&self.backend, rule, key)
            .await?
            .ok_or_else(|| violated(rule, format!("the held lease {key} inspects as free")))
    }

    async fn free(&self, rule: Rule, key: &LeaseKey, when: &str) -> Checked {
        match call::inspect(&self.backend, rule, key).await? {
            None => Ok(()),
            Some(info) => Err(violated(
                rule,
                format!("{key} {when} still inspects as held: {info:?}"),
            )),
        }
    }

    async fn release_own(&self, rule: Rule, key: &LeaseKey, holder: &HolderId) -> Checked {
        let outcome = call::release(&self.backend, rule, key, holder).await?;
        ensure(rule, outcome == ReleaseOutcome::Released, || {
            format!("the holder's release of {key} was answered {outcome:?}, not Released")
        })
    }

    /// Runs [`core`](Self::core) and then each of `areas` (see [`Area`]),
    /// and returns the rules it checked.
    ///
    /// # Errors
    ///
    /// The first broken rule, or the first backend call that failed.
    pub async fn run(&self, areas: &[Area]) -> Checked<Vec<Rule>> {
        let mut suite = self.clone();
        if areas.contains(&Area::ReleaseNotices) {
            suite.notices = Some(true);
        }
        if areas.contains(&Area::Handover) {
            suite.handover = Some(true);
        }
        let mut checked = suite.core().await?;
        for area in areas {
            match area {
                Area::ReleaseNotices => {}
                Area::Handover => {
                    suite.handover().await?;
                    checked.push(Rule::Handover);
                }
                Area::MinimumHold => {
                    suite.minimum_hold().await?;
                    checked.push(Rule::MinimumHold);
                }
                Area::Permits => {
                    suite.permits().await?;
                    checked.push(Rule::Permits);
                }
                Area::ReadWrite => {
                    suite.read_write().await?;
                    checked.push(Rule::ReadWrite);
                }
                Area::FairQueue => {
                    suite.fair_queue().await?;
                    checked.push(Rule::FairQueue);
                }
                Area::FairHandover => {
                    suite.fair_handover().await?;
                    checked.push(Rule::FairHandover);
                }
            }
        }
        Ok(checked)
    }

    /// Every rule of [`Rule::CORE`], in that order; returns them.
    ///
    /// # Errors
    ///
    /// The first broken rule, or the first backend call that failed.
    pub async fn core(&self) -> Checked<Vec<Rule>> {
        self.grants_free_key().await?;
        self.refuses_with_holder_info().await?;
        self.reacquire_refreshes().await?;
        self.inspect().await?;
        self.renew_owner_checked().await?;
        self.release_owner_checked().await?;
        self.renew_many_in_order().await?;
        self.tokens_increase().await?;
        self.release_notices().await?;
        self.release_to().await?;
        self.expiry_frees().await?;
        Ok(Rule::CORE.to_vec())
    }

    /// [`Rule::GrantsFreeKey`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn grants_free_key(&self) -> Checked {
        const RULE: Rule = Rule::GrantsFreeKey;
        let key = self.key("grant")?;
        let me = HolderId::generate()?;
        let request = self.request(&key, me);
        let before = Instant::now();
        let grant = self.grant(RULE, &request).await?;
        let after = Instant::now();
        ensure(
            RULE,
            grant.key == key && grant.holder == me && grant.ttl == self.long_ttl,
            || format!("the grant names another lease than asked: {grant:?}"),
        )?;
        ensure(
            RULE,
            grant.sent_at >= before && grant.sent_at <= after,
            || "the grant's sent_at is not when the request was sent".to_owned(),
        )?;
        let ttl = self.long_ttl.get();
        ensure(
            RULE,
            grant.valid_until == grant.sent_at + ttl - clock_drift(ttl),
            || {
                format!(
                    "valid_until is sent_at + {:?}, not the ttl less the drift allowance ({:?})",
                    grant.valid_until - grant.sent_at,
                    ttl - clock_drift(ttl)
                )
            },
        )?;
        self.release_own(RULE, &key, &me).await
    }

    /// [`Rule::RefusesWithHolderInfo`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn refuses_with_holder_info(&self) -> Checked {
        const RULE: Rule = Rule::RefusesWithHolderInfo;
        let key = self.key("refuse")?;
        let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
        let grant = self
            .grant(
                RULE,
                &self.request(&key, me).with_label("conformance-holder")?,
            )
            .await?;
        let info = self.refused(RULE, &self.request(&key, stranger)).await?;
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token),
            || {
                format!(
                    "refused with token {:?}, the holder's is {}",
                    info.fencing_token, grant.fencing_token
                )
            },
        )?;
        ensure(
            RULE,
            info.label.as_deref() == Some("conformance-holder"),
            || format!("refused with label {:?}, not the holder's", info.label),
        )?;
        ensure(
            RULE,
            info.ttl_left
                .is_some_and(|left| left <= self.long_ttl.get() && !left.is_zero()),
            || {
                format!(
                    "refused with {:?} left on a lease of {:?}",
                    info.ttl_left,
                    self.long_ttl.get()
                )
            },
        )?;
        self.release_own(RULE, &key, &me).await
    }

    /// [`Rule::ReacquireRefreshes`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn reacquire_refreshes(&self) -> Checked {
        const RULE: Rule = Rule::ReacquireRefreshes;
        let key = self.key("reacquire")?;
        let me = HolderId::generate()?;
        let first = self.grant(RULE, &self.request(&key, me)).await?;
        let longer = Ttl::new(self.long_ttl.get() * 2)?;
        let again = match call::acquire(
            &self.backend,
            RULE,
            &AcquireRequest::new(key.clone(), me, longer),
        )
        .await?
        {
            AcquireOutcome::Acquired(grant) => grant,
            AcquireOutcome::Held(info) => {
                return Err(violated(
                    RULE,
                    format!("the holder was refused its own lease: {info:?}"),
                ));
            }
        };
        ensure(RULE, again.fencing_token == first.fencing_token, || {
            format!(
                "a re-acquire changed the token from {} to {}",
                first.fencing_token, again.fencing_token
            )
        })?;
        ensure(RULE, again.ttl == longer, || {
            format!("the refreshed grant says ttl {:?}", again.ttl)
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.ttl_left.is_some_and(|left| left > self.long_ttl.get()),
            || {
                format!(
                    "re-acquired for {longer:?}, the lease has {:?} left: not refreshed",
                    info.ttl_left
                )
            },
        )?;
        self.release_own(RULE, &key, &me).await
    }

    /// [`Rule::Inspect`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn inspect(&self) -> Checked {
        const RULE: Rule = Rule::Inspect;
        let key = self.key("inspect")?;
        let me = HolderId::generate()?;
        self.free(RULE, &key, "never acquired").await?;
        let grant = self
            .grant(RULE, &self.request(&key, me).with_label("inspected")?)
            .await?;
        let first = self.held(RULE, &key).await?;
        ensure(
            RULE,
            first.fencing_token == Some(grant.fencing_token)
                && first.label.as_deref() == Some("inspected"),
            || {
                format!(
                    "inspect shows {first:?}, the holder has token {}",
                    grant.fencing_token
                )
            },
        )?;
        let left = first
            .ttl_left
            .filter(|left| *left <= self.long_ttl.get() && !left.is_zero())
            .ok_or_else(|| violated(RULE, format!("inspect shows {first:?} left")))?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let second = self.held(RULE, &key).await?;
        ensure(
            RULE,
            second.ttl_left.is_some_and(|later| later < left),
            || {
                format!(
                    "inspect refreshed the lease: {left:?} left, then {:?}",
                    second.ttl_left
                )
            },
        )?;
        self.release_own(RULE, &key, &me).await?;
        self.free(RULE, &key, "after its release").await
    }

    /// [`Rule::RenewOwnerChecked`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn renew_owner_checked(&self) -> Checked {
        const RULE: Rule = Rule::RenewOwnerChecked;
        let key = self.key("renew")?;
        let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
        let longer = Ttl::new(self.long_ttl.get() * 2)?;
        let free = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), me, longer),
        )
        .await?;
        ensure(RULE, free == RenewOutcome::Lost, || {
            format!("the renewal of a free key was answered {free:?}")
        })?;
        self.free(RULE, &key, "after a renewal of it free").await?;
        let grant = self.grant(RULE, &self.request(&key, me)).await?;
        let theirs = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), stranger, longer),
        )
        .await?;
        ensure(RULE, theirs == RenewOutcome::Lost, || {
            format!("a stranger's renewal was answered {theirs:?}, not Lost")
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token)
                && info
                    .ttl_left
                    .is_some_and(|left| left <= self.long_ttl.get()),
            || format!("a stranger's renewal changed the lease: {info:?}"),
        )?;
        let mine = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), me, longer),
        )
        .await?;
        ensure(RULE, mine == RenewOutcome::Renewed, || {
            format!("the holder's renewal was answered {mine:?}")
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token)
                && info.ttl_left.is_some_and(|left| left > self.long_ttl.get()),
            || format!("renewed for {longer:?}, the lease shows {info:?}"),
        )?;
        self.release_own(RULE, &key, &me).await?;
        let after = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), me, longer),
        )
        .await?;
        ensure(RULE, after == RenewOutcome::Lost, || {
            format!("a renewal after the release was answered {after:?}")
        })?;
        self.free(RULE, &key, "renewed after its release").await
    }

    /// [`Rule::ReleaseOwnerChecked`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn release_owner_checked(&self) -> Checked {
        const RULE: Rule = Rule::ReleaseOwnerChecked;
        let key = self.key("release")?;
        let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
        let free = call::release(&self.backend, RULE, &key, &me).await?;
        ensure(RULE, free == ReleaseOutcome::NotHeld, || {
            format!("the release of a free key was answered {free:?}")
        })?;
        let grant = self.grant(RULE, &self.request(&key, me)).await?;
        let theirs = call::release(&self.backend, RULE, &key, &stranger).await?;
        ensure(RULE, theirs == ReleaseOutcome::NotHeld, || {
            format!("a stranger's release of a held lease was answered {theirs:?}, not NotHeld")
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token),
            || format!("a stranger's release changed the lease: {info:?}"),
        )?;
        self.refused(RULE, &self.request(&key, stranger)).await?;
        self.release_own(RULE, &key, &me).await?;
        self.free(RULE, &key, "after its release").await?;
        let again = call::release(&self.backend, RULE, &key, &me).await?;
        ensure(RULE, again == ReleaseOutcome::NotHeld, || {
            format!("a second release was answered {again:?}")
        })
    }

    /// [`Rule::RenewManyInOrder`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn renew_many_in_order(&self) -> Checked {
        const RULE: Rule = Rule::RenewManyInOrder;
        let (a, b, never) = (
            self.key("many-a")?,
            self.key("many-b")?,
            self.key("many-x")?,
        );
        let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
        let ttl = self.long_ttl;
        let none = call::renew_many(&self.backend, &[]).await;
        ensure(RULE, none.is_empty(), || {
            format!("an empty batch got {} outcomes", none.len())
        })?;
        self.grant(RULE, &self.request(&a, me)).await?;
        self.grant(RULE, &self.request(&b, stranger)).await?;
        let asked = [
            (RenewRequest::new(a.clone(), me, ttl), RenewOutcome::Renewed),
            (
                RenewRequest::new(a.clone(), stranger, ttl),
                RenewOutcome::Lost,
            ),
            (
                RenewRequest::new(never.clone(), me, ttl),
                RenewOutcome::Lost,
            ),
            (
                RenewRequest::new(b.clone(), stranger, ttl),
                RenewOutcome::Renewed,
            ),
            (RenewRequest::new(b.clone(), me, ttl), RenewOutcome::Lost),
            (RenewRequest::new(a.clone(), me, ttl), RenewOutcome::Renewed),
        ];
        let requests: Vec<RenewRequest> = asked.iter().map(|(r, _)| r.clone()).collect();
        let outcomes = call::renew_many(&self.backend, &requests).await;
        ensure(RULE, outcomes.len() == requests.len(), || {
            format!(
                "{} renewals got {} outcomes",
                requests.len(),
                outcomes.len()
            )
        })?;
        for (at, ((request, expected), outcome)) in asked.iter().zip(outcomes).enumerate() {
            match outcome {
                Ok(outcome) if outcome == *expected => {}
                Ok(outcome) => {
                    return Err(violated(
                        RULE,
                        format!(
                            "outcome {at} (of {}) is {outcome:?}, expected {expected:?}",
                            request.key
                        ),
                    ));
                }
                Err(source) => {
                    return Err(ConformanceError::Backend {
                        rule: RULE,
                        op: "renew_many",
                        source,
                    });
                }
            }
        }
        self.free(RULE, &never, "renewed by a batch while free")
            .await?;
        self.release_own(RULE, &a, &me).await?;
        self.release_own(RULE, &b, &stranger).await
    }

    /// [`Rule::TokensIncrease`]: across holders after a release and after
    /// an expiry (of a [`short_ttl`](Self::short_ttl) lease).
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn tokens_increase(&self) -> Checked {
        const RULE: Rule = Rule::TokensIncrease;
        let key = self.key("tokens")?;
        let mut last: Option<FencingToken> = None;
        let mut rising = |grant: &Grant, after: &str| {
            let token = grant.fencing_token;
            let fine = last.is_none_or(|last| token > last);
            let detail = format!("token {token} {after} follows token {last:?}");
            last = Some(token);
            ensure(RULE, fine, || detail)
        };
        for _ in 0..3 {
            let holder = HolderId::generate()?;
            let grant = self.grant(RULE, &self.request(&key, holder)).await?;
            rising(&grant, "after a release")?;
            self.release_own(RULE, &key, &holder).await?;
        }
        let holder = HolderId::generate()?;
        let short = AcquireRequest::new(key.clone(), holder, self.short_ttl);
        let grant = self.grant(RULE, &short).await?;
        let granted = Instant::now();
        rising(&grant, "after a release")?;
        let next = HolderId::generate()?;
        let ttl = self.short_ttl.get();
        let grant = self
            .after_expiry(RULE, &key, (grant.sent_at + ttl, granted + ttl), next)
            .await?;
        rising(&grant, "after an expiry")?;
        self.release_own(RULE, &key, &next).await
    }

    /// Acquires `key` for `holder` once it has expired: from `earliest`
    /// (before which the backend cannot have let it expire) on, every
    /// 10 ms, until granted. A refusal of a request sent later than
    /// `latest` (after which it must have expired) + the suite's
    /// [`expiry_slack`](Self::expiry_slack) breaks `rule`: judged by when
    /// each request was sent, so a slow process is not blamed on the
    /// backend.
    async fn after_expiry(
        &self,
        rule: Rule,
        key: &LeaseKey,
        (earliest, latest): (Instant, Instant),
        holder: HolderId,
    ) -> Checked<Grant> {
        tokio::time::sleep_until(earliest).await;
        let request = self.request(key, holder);
        let deadline = latest + self.expiry_slack;
        loop {
            let sent = Instant::now();
            match call::acquire(&self.backend, rule, &request).await? {
                AcquireOutcome::Acquired(grant) => return Ok(grant),
                AcquireOutcome::Held(info) if sent >= deadline => {
                    return Err(violated(
                        rule,
                        format!(
                            "still held {:?} after it had to expire (slack {:?}): {info:?}",
                            sent.saturating_duration_since(latest),
                            self.expiry_slack
                        ),
                    ));
                }
                AcquireOutcome::Held(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// [`Rule::ReleaseNotices`]: a supported watch wakes on a release,
    /// within the suite's patience (see [`expect_notices`](Self::expect_notices)).
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn release_notices(&self) -> Checked {
        const RULE: Rule = Rule::ReleaseNotices;
        let key = self.key("notice")?;
        let me = HolderId::generate()?;
        self.grant(RULE, &self.request(&key, me)).await?;
        let mut watch = call::watch_releases(&self.backend, RULE, &key).await?;
        let supported = watch.is_supported();
        if let Some(expected) = self.notices {
            ensure(RULE, supported == expected, || {
                format!(
                    "the backend should have release notices: {expected}, its watch is supported: {supported}"
                )
            })?;
        }
        self.release_own(RULE, &key, &me).await?;
        if supported {
            tokio::time::timeout(self.patience, watch.released())
                .await
                .map_err(|_| {
                    violated(
                        RULE,
                        format!("no release notice within {:?}", self.patience),
                    )
                })?;
        } else {
            let quiet = tokio::time::timeout(Duration::from_millis(50), watch.released()).await;
            ensure(RULE, quiet.is_err(), || {
                "an unsupported watch fired".to_owned()
            })?;
        }
        Ok(())
    }

    /// [`Rule::ReleaseTo`]: `release_to` hands over or only releases, and
    /// does neither for a lease not the caller's.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn release_to(&self) -> Checked {
        const RULE: Rule = Rule::ReleaseTo;
        let key = self.key("release-to")?;
        let (me, next, stranger) = (
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
        );
        let offered = self.request(&key, next);
        let free = call::release_to(&self.backend, RULE, &key, &me, &offered).await?;
        ensure(RULE, free == HandoverOutcome::NotHeld, || {
            format!("release_to of a free key was answered {free:?}")
        })?;
        self.free(RULE, &key, "after release_to of it free").await?;
        let grant = self.grant(RULE, &self.request(&key, me)).await?;
        let theirs = call::release_to(&self.backend, RULE, &key, &stranger, &offered).await?;
        ensure(RULE, theirs == HandoverOutcome::NotHeld, || {
            format!("a stranger's release_to was answered {theirs:?}")
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token),
            || format!("a stranger's release_to changed the lease: {info:?}"),
        )?;
        let mut watch = call::watch_releases(&self.backend, RULE, &key).await?;
        let outcome = call::release_to(&self.backend, RULE, &key, &me, &offered).await?;
        if let Some(handover) = self.handover {
            let handed = matches!(outcome, HandoverOutcome::HandedOver(_));
            ensure(RULE, handed == handover, || {
                format!(
                    "the backend should hand over: {handover}, with only our own watch listening it answered {outcome:?}"
                )
            })?;
        }
        match outcome {
            HandoverOutcome::HandedOver(given) => {
                self.handed_over_to(RULE, &key, next, &grant, &given)
                    .await?;
            }
            HandoverOutcome::Released => self.free(RULE, &key, "released by release_to").await?,
            HandoverOutcome::NotHeld => {
                return Err(violated(
                    RULE,
                    "the holder's release_to was answered NotHeld",
                ));
            }
        }
        if watch.is_supported() {
            tokio::time::timeout(self.patience, watch.released())
                .await
                .map_err(|_| {
                    violated(
                        RULE,
                        format!("no release notice within {:?}", self.patience),
                    )
                })?;
        }
        let again = call::release_to(&self.backend, RULE, &key, &me, &offered).await?;
        ensure(RULE, again == HandoverOutcome::NotHeld, || {
            format!("a second release_to was answered {again:?}")
        })
    }

    /// The lease handed to `next` is `next`'s, with a higher token, and
    /// behaves as any lease: renewed and released by `next`.
    async fn handed_over_to(
        &self,
        rule: Rule,
        key: &LeaseKey,
        next: HolderId,
        before: &Grant,
        given: &Grant,
    ) -> Checked {
        ensure(rule, given.holder == next && given.key == *key, || {
            format!("handed over to someone else than offered: {given:?}")
        })?;
        ensure(rule, given.fencing_token > before.fencing_token, || {
            format!(
                "handed over with token {}, after {}",
                given.fencing_token, before.fencing_token
            )
        })?;
        let info = self.held(rule, key).await?;
        ensure(
            rule,
            info.fencing_token == Some(given.fencing_token),
            || format!("the handed-over lease shows {info:?}"),
        )?;
        let renewed = call::renew(
            &self.backend,
            rule,
            &RenewRequest::new(key.clone(), next, self.long_ttl),
        )
        .await?;
        ensure(rule, renewed == RenewOutcome::Renewed, || {
            format!("the new holder's renewal was answered {renewed:?}")
        })?;
        self.release_own(rule, key, &next).await?;
        self.free(rule, key, "released by the new holder").await
    }

    /// [`Rule::ExpiryFrees`]: still held a tenth of its ttl before the ttl
    /// ends, free at the ttl (within the suite's
    /// [`expiry_slack`](Self::expiry_slack)), and the old holder's renewal
    /// and release then say so. Both sides are bounded: a backend that
    /// frees a lease at 0.9 × its ttl fails as surely as one that keeps it
    /// past the ttl.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn expiry_frees(&self) -> Checked {
        const RULE: Rule = Rule::ExpiryFrees;
        let (me, next) = (HolderId::generate()?, HolderId::generate()?);
        let ttl = self.short_ttl;
        // The probe is sent a tenth of the ttl before the earliest instant
        // the lease may end: the backend received the grant's request no
        // earlier than it was sent, so its ttl runs at least until
        // `sent_at + ttl`.
        let probe = ttl.get() - ttl.get() / 10;
        let mut attempt = 0;
        let (key, grant, granted) = loop {
            attempt += 1;
            let key = self.key("expiry")?;
            let grant = self
                .grant(RULE, &AcquireRequest::new(key.clone(), me, ttl))
                .await?;
            let granted = Instant::now();
            tokio::time::sleep_until(grant.sent_at + probe).await;
            match call::acquire(&self.backend, RULE, &self.request(&key, next)).await? {
                AcquireOutcome::Held(info) => {
                    ensure(
                        RULE,
                        info.fencing_token == Some(grant.fencing_token),
                        || {
                            format!(
                                "{probe:?} into a ttl of {:?} the lease shows {info:?}",
                                ttl.get()
                            )
                        },
                    )?;
                    break (key, grant, granted);
                }
                // Answered before the ttl could have run out: broken.
                // Answered later (this process stalled for a tenth of the
                // ttl), the check cannot judge: it starts again, and a
                // fifth such answer is taken as broken.
                AcquireOutcome::Acquired(early)
                    if Instant::now() < grant.sent_at + ttl.get() || attempt >= 5 =>
                {
                    return Err(violated(
                        RULE,
                        format!(
                            "granted to someone else {:?} into a ttl of {:?}",
                            early.sent_at.saturating_duration_since(grant.sent_at),
                            ttl.get()
                        ),
                    ));
                }
                AcquireOutcome::Acquired(_) => self.release_own(RULE, &key, &next).await?,
            }
        };
        let expires = (grant.sent_at + ttl.get(), granted + ttl.get());
        let taken = self.after_expiry(RULE, &key, expires, next).await?;
        let renewed = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), me, ttl),
        )
        .await?;
        ensure(RULE, renewed == RenewOutcome::Lost, || {
            format!("the expired holder's renewal was answered {renewed:?}")
        })?;
        let released = call::release(&self.backend, RULE, &key, &me).await?;
        ensure(RULE, released == ReleaseOutcome::NotHeld, || {
            format!("the expired holder's release was answered {released:?}")
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(
            RULE,
            info.fencing_token == Some(taken.fencing_token),
            || format!("the expired holder's calls changed the new lease: {info:?}"),
        )?;
        self.release_own(RULE, &key, &next).await
    }

    /// [`Rule::Handover`]: with only the caller's own watch listening,
    /// `release_to` hands the lease over, and the watch hears the new
    /// holder's release.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn handover(&self) -> Checked {
        const RULE: Rule = Rule::Handover;
        let key = self.key("handover")?;
        let (me, next) = (HolderId::generate()?, HolderId::generate()?);
        let grant = self.grant(RULE, &self.request(&key, me)).await?;
        let mut watch = call::watch_releases(&self.backend, RULE, &key).await?;
        let outcome =
            call::release_to(&self.backend, RULE, &key, &me, &self.request(&key, next)).await?;
        let HandoverOutcome::HandedOver(given) = outcome else {
            return Err(violated(
                RULE,
                format!("not handed over with only our own watch listening: {outcome:?}"),
            ));
        };
        self.handed_over_to(RULE, &key, next, &grant, &given)
            .await?;
        if watch.is_supported() {
            tokio::time::timeout(self.patience, watch.released())
                .await
                .map_err(|_| violated(RULE, "no notice of the new holder's release"))?;
        }
        Ok(())
    }

    /// [`Rule::MinimumHold`]: released at once, a lease acquired with a
    /// minimum hold of 3 × [`short_ttl`](Self::short_ttl) stays taken,
    /// still the holder's (same token), for about the minimum, as a
    /// stranger is told; after it, it is free.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn minimum_hold(&self) -> Checked {
        const RULE: Rule = Rule::MinimumHold;
        let minimum = self.short_ttl.get() * 3;
        let key = self.key("minimum")?;
        let (me, stranger) = (HolderId::generate()?, HolderId::generate()?);
        let mine = self.request(&key, me).with_hold_at_least(minimum)?;
        let grant = self.grant(RULE, &mine).await?;
        let released = Instant::now();
        self.release_own(RULE, &key, &me).await?;
        let info = self.refused(RULE, &self.request(&key, stranger)).await?;
        let told = Instant::now();
        ensure(
            RULE,
            info.fencing_token == Some(grant.fencing_token),
            || format!("kept under its minimum, the lease shows {info:?}"),
        )?;
        let left = info
            .ttl_left
            .ok_or_else(|| violated(RULE, "no ttl on a lease kept for its minimum"))?;
        ensure(RULE, left <= minimum && left > minimum / 2, || {
            format!("kept for {left:?} more, not about the {minimum:?} minimum")
        })?;
        let taken = self
            .after_expiry(RULE, &key, (released + left, told + left), stranger)
            .await?;
        ensure(RULE, taken.fencing_token > grant.fencing_token, || {
            format!(
                "token {} after the minimum follows {}",
                taken.fencing_token, grant.fencing_token
            )
        })?;
        self.release_own(RULE, &key, &stranger).await
    }

    /// [`Rule::Permits`], with a limit of 2.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn permits(&self) -> Checked {
        const RULE: Rule = Rule::Permits;
        let semaphore = self.key("permits")?;
        let limit = PermitLimit::new(2)?;
        let (a, b, c) = (
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
        );
        let permit = async |holder: HolderId, limit: PermitLimit| {
            call::acquire_permit(&self.backend, &self.request(&semaphore, holder), limit)
                .await
                .map_err(|source| ConformanceError::Backend {
                    rule: RULE,
                    op: "try_acquire_permit",
                    source,
                })
        };
        let granted = |outcome: AcquireOutcome, who: &str| match outcome {
            AcquireOutcome::Acquired(grant) => Ok(grant),
            AcquireOutcome::Held(info) => Err(violated(
                RULE,
                format!("{who} was refused a permit: {info:?}"),
            )),
        };
        let first = granted(permit(a, limit).await?, "the first holder")?;
        let second = granted(permit(b, limit).await?, "the second holder")?;
        for grant in [&first, &second] {
            ensure(
                RULE,
                grant.key.permit_of().is_some_and(|(of, _)| of == semaphore),
                || format!("granted {}, not a permit key of {semaphore}", grant.key),
            )?;
        }
        ensure(RULE, first.key != second.key, || {
            format!("two holders got one permit, {}", first.key)
        })?;
        ensure(RULE, second.fencing_token > first.fencing_token, || {
            format!(
                "the second permit's token {} follows {}",
                second.fencing_token, first.fencing_token
            )
        })?;
        let again = granted(permit(a, limit).await?, "the first holder, again")?;
        ensure(
            RULE,
            again.key == first.key && again.fencing_token == first.fencing_token,
            || format!("a holder's second ask moved it: {again:?}"),
        )?;
        match permit(c, limit).await? {
            AcquireOutcome::Held(info) => ensure(
                RULE,
                info.fencing_token
                    .is_some_and(|t| t == first.fencing_token || t == second.fencing_token),
                || format!("refused a third permit with {info:?}, not a holder's"),
            )?,
            AcquireOutcome::Acquired(grant) => {
                return Err(violated(
                    RULE,
                    format!("a third permit of 2 was granted: {}", grant.key),
                ));
            }
        }
        let mismatch = call::acquire_permit(
            &self.backend,
            &self.request(&semaphore, c),
            PermitLimit::new(3)?,
        )
        .await;
        ensure(
            RULE,
            matches!(mismatch, Err(BackendError::PermitLimitMismatch { .. })),
            || format!("a permit under another limit while held under 2: {mismatch:?}"),
        )?;
        self.release_own(RULE, &first.key, &a).await?;
        let third = granted(permit(c, limit).await?, "a holder after a release")?;
        ensure(RULE, third.fencing_token > second.fencing_token, || {
            format!(
                "the third permit's token {} follows {}",
                third.fencing_token, second.fencing_token
            )
        })?;
        self.release_own(RULE, &second.key, &b).await?;
        self.release_own(RULE, &third.key, &c).await
    }

    /// [`Rule::ReadWrite`].
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn read_write(&self) -> Checked {
        const RULE: Rule = Rule::ReadWrite;
        let doc = self.key("rw")?;
        let (r1, r2, r3, w) = (
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
        );
        let read = async |holder| -> Checked<Result<Grant, LeaseInfo>> {
            Ok(
                match call::acquire_read(&self.backend, RULE, &self.request(&doc, holder)).await? {
                    AcquireOutcome::Acquired(grant) => Ok(grant),
                    AcquireOutcome::Held(info) => Err(info),
                },
            )
        };
        let write = async |holder| -> Checked<Result<Grant, LeaseInfo>> {
            Ok(
                match call::acquire_write(&self.backend, RULE, &self.request(&doc, holder)).await? {
                    AcquireOutcome::Acquired(grant) => Ok(grant),
                    AcquireOutcome::Held(info) => Err(info),
                },
            )
        };
        let one = read(r1)
            .await?
            .map_err(|info| violated(RULE, format!("a first reader was refused: {info:?}")))?;
        let two = read(r2)
            .await?
            .map_err(|info| violated(RULE, format!("a second reader was refused: {info:?}")))?;
        ensure(
            RULE,
            one.key == doc.reader_key(&r1)? && two.key == doc.reader_key(&r2)?,
            || {
                format!(
                    "readers got {} and {}, not their reader keys",
                    one.key, two.key
                )
            },
        )?;
        ensure(RULE, two.fencing_token > one.fencing_token, || {
            format!(
                "the second reader's token {} follows {}",
                two.fencing_token, one.fencing_token
            )
        })?;
        if let Ok(grant) = write(w).await? {
            return Err(violated(
                RULE,
                format!("a writer was granted beside two readers: {}", grant.key),
            ));
        }
        if let Ok(grant) = read(r3).await? {
            return Err(violated(
                RULE,
                format!("a new reader got past a waiting writer: {}", grant.key),
            ));
        }
        self.release_own(RULE, &one.key, &r1).await?;
        self.release_own(RULE, &two.key, &r2).await?;
        let writer = write(w).await?.map_err(|info| {
            violated(RULE, format!("a writer was refused a free lease: {info:?}"))
        })?;
        ensure(RULE, writer.key == doc.writer_key()?, || {
            format!("the writer got {}, not the writer key", writer.key)
        })?;
        ensure(RULE, writer.fencing_token > two.fencing_token, || {
            format!(
                "the writer's token {} follows the readers' {}",
                writer.fencing_token, two.fencing_token
            )
        })?;
        match read(r3).await? {
            Ok(grant) => {
                return Err(violated(
                    RULE,
                    format!("a reader was granted beside the writer: {}", grant.key),
                ));
            }
            Err(info) => ensure(
                RULE,
                info.fencing_token == Some(writer.fencing_token),
                || format!("a reader was refused with {info:?}, not the writer's lease"),
            )?,
        }
        // A second writer waits behind the first, and withdraws its intent.
        let other = HolderId::generate()?;
        if let Ok(grant) = write(other).await? {
            return Err(violated(
                RULE,
                format!("a second writer was granted: {}", grant.key),
            ));
        }
        let withdrawn = call::withdraw_write_intent(&self.backend, RULE, &doc, &other).await?;
        ensure(RULE, withdrawn, || {
            "the waiting writer's intent was not there to withdraw".to_owned()
        })?;
        self.release_own(RULE, &writer.key, &w).await?;
        let after = read(r3)
            .await?
            .map_err(|info| violated(RULE, format!("a reader after the writer left: {info:?}")))?;
        ensure(RULE, after.fencing_token > writer.fencing_token, || {
            format!(
                "a reader's token {} follows the writer's {}",
                after.fencing_token, writer.fencing_token
            )
        })?;
        self.release_own(RULE, &after.key, &r3).await
    }

    /// [`Rule::FairQueue`]: places in arrival order, the lease to the head
    /// once free, a waiter that left skipped.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core).
    pub async fn fair_queue(&self) -> Checked {
        const RULE: Rule = Rule::FairQueue;
        let key = self.key("fair")?;
        let place_ttl = PlaceTtl::new(self.patience.max(PlaceTtl::MIN).min(PlaceTtl::MAX))?;
        let (holder, first, second, third) = (
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
            HolderId::generate()?,
        );
        let fair = async |who: HolderId| {
            call::acquire_fair(
                &self.backend,
                RULE,
                &self.request(&key, who),
                place_ttl,
                None,
            )
            .await
        };
        let FairOutcome::Acquired { grant, .. } = fair(holder).await? else {
            return Err(violated(
                RULE,
                "a free key with an empty queue was not granted",
            ));
        };
        for (who, ahead) in [(first, 0), (second, 1), (third, 2)] {
            match fair(who).await? {
                FairOutcome::Waiting(place) => ensure(
                    RULE,
                    place.ahead == ahead
                        && place
                            .holder
                            .as_ref()
                            .is_some_and(|h| h.fencing_token == Some(grant.fencing_token)),
                    || format!("waiter {ahead} got {place:?}"),
                )?,
                FairOutcome::Acquired { grant, .. } => {
                    return Err(violated(
                        RULE,
                        format!("a held lease was granted to a waiter: {}", grant.key),
                    ));
                }
            }
        }
        call::leave_fair_queue(&self.backend, RULE, &key, &first).await?;
        let released = call::release_fair(&self.backend, RULE, &key, &holder).await?;
        ensure(RULE, released == ReleaseOutcome::Released, || {
            format!("the fair holder's release was answered {released:?}")
        })?;
        // The waiter that left is skipped: the third is behind the second.
        match fair(third).await? {
            FairOutcome::Waiting(place) => ensure(RULE, place.ahead == 1, || {
                format!("the third waiter, behind one, got {place:?}")
            })?,
            FairOutcome::Acquired { grant, .. } => {
                return Err(violated(
                    RULE,
                    format!("a waiter overtook the head: {}", grant.key),
                ));
            }
        }
        let FairOutcome::Acquired { grant: given, .. } = fair(second).await? else {
            return Err(violated(
                RULE,
                "the head of the queue was refused a free lease",
            ));
        };
        ensure(RULE, given.fencing_token > grant.fencing_token, || {
            format!(
                "the head's token {} follows {}",
                given.fencing_token, grant.fencing_token
            )
        })?;
        let released = call::release_fair(&self.backend, RULE, &key, &second).await?;
        ensure(RULE, released == ReleaseOutcome::Released, || {
            format!("the head's release was answered {released:?}")
        })?;
        match fair(third).await? {
            FairOutcome::Acquired { grant, .. } => {
                self.release_own(RULE, &key, &grant.holder).await
            }
            FairOutcome::Waiting(place) => Err(violated(
                RULE,
                format!("the last waiter, alone, was refused a free lease: {place:?}"),
            )),
        }
    }

    /// [`Rule::FairHandover`]: a waiter at the head of the fair queue that
    /// asked for a handover (and watches for it) is granted the lease by
    /// the fair holder's release, in the same operation: its watch tells
    /// the new token, higher than the holder's, the lease shows it, and the
    /// waiter renews and releases it as its own without asking again.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core); an unsupported handover watch breaks the
    /// rule too.
    pub async fn fair_handover(&self) -> Checked {
        const RULE: Rule = Rule::FairHandover;
        let key = self.key("fair-handover")?;
        let place_ttl = PlaceTtl::new(self.patience.max(PlaceTtl::MIN).min(PlaceTtl::MAX))?;
        let (holder, waiter) = (HolderId::generate()?, HolderId::generate()?);
        let FairOutcome::Acquired { grant, .. } = call::acquire_fair(
            &self.backend,
            RULE,
            &self.request(&key, holder),
            place_ttl,
            None,
        )
        .await?
        else {
            return Err(violated(
                RULE,
                "a free key with an empty queue was not granted",
            ));
        };
        let mut watch = call::watch_handover(&self.backend, RULE, &key, &waiter).await?;
        ensure(RULE, watch.is_supported(), || {
            "the handover watch is unsupported".to_owned()
        })?;
        let waiting = call::acquire_fair(
            &self.backend,
            RULE,
            &self.request(&key, waiter),
            place_ttl,
            Some(self.long_ttl.get()),
        )
        .await?;
        ensure(
            RULE,
            matches!(&waiting, FairOutcome::Waiting(place) if place.ahead == 0),
            || format!("the only waiter behind a holder got {waiting:?}"),
        )?;
        let released = call::release_fair(&self.backend, RULE, &key, &holder).await?;
        ensure(RULE, released == ReleaseOutcome::Released, || {
            format!("the fair holder's release was answered {released:?}")
        })?;
        let token = tokio::time::timeout(self.patience, watch.handed_over())
            .await
            .map_err(|_| {
                violated(
                    RULE,
                    format!("no handover announced within {:?}", self.patience),
                )
            })?;
        ensure(RULE, token > grant.fencing_token, || {
            format!(
                "handed over with token {token}, after {}",
                grant.fencing_token
            )
        })?;
        let info = self.held(RULE, &key).await?;
        ensure(RULE, info.fencing_token == Some(token), || {
            format!("the handed-over lease shows {info:?}, the watch said token {token}")
        })?;
        let renewed = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), waiter, self.long_ttl),
        )
        .await?;
        ensure(RULE, renewed == RenewOutcome::Renewed, || {
            format!("the waiter's renewal of the lease handed to it was answered {renewed:?}")
        })?;
        let released = call::release_fair(&self.backend, RULE, &key, &waiter).await?;
        ensure(RULE, released == ReleaseOutcome::Released, || {
            format!("the new holder's release was answered {released:?}")
        })?;
        self.free(RULE, &key, "released by the new holder").await
    }

    /// [`Rule::ChangeFeed`]: a lease this backend acquired and renewed
    /// (for [`short_ttl`](Self::short_ttl)), then let expire and taken by `other` (a second client of the same
    /// store, as another process sees it: `MemoryBackend::client`, a second
    /// connection to the same server), is reported as changed, within the
    /// suite's patience.
    ///
    /// # Errors
    ///
    /// As [`core`](Self::core); an unsupported watch breaks the rule too.
    pub async fn change_feed(&self, other: &B) -> Checked {
        const RULE: Rule = Rule::ChangeFeed;
        let key = self.key("changes")?;
        let (me, them) = (HolderId::generate()?, HolderId::generate()?);
        let mut watch = call::watch_changes(&self.backend, RULE).await?;
        ensure(RULE, watch.is_supported(), || {
            "the change watch is unsupported".to_owned()
        })?;
        // Granted for long, renewed for short: the renewal cannot come too
        // late, however slow this process, and the lease expires soon.
        let ttl = self.short_ttl;
        let grant = self.grant(RULE, &self.request(&key, me)).await?;
        let renewed = call::renew(
            &self.backend,
            RULE,
            &RenewRequest::new(key.clone(), me, ttl),
        )
        .await?;
        ensure(RULE, renewed == RenewOutcome::Renewed, || {
            format!("the holder's renewal was answered {renewed:?}")
        })?;
        // What the backend reported of its own doing is no news.
        while watch.try_next().is_some() {}
        let renewed_at = Instant::now();
        tokio::time::sleep_until(renewed_at + ttl.get() + Duration::from_millis(5)).await;
        let request = self.request(&key, them);
        let deadline = Instant::now() + self.patience;
        let theirs = loop {
            match call::acquire(other, RULE, &request).await? {
                AcquireOutcome::Acquired(theirs) => break theirs,
                AcquireOutcome::Held(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                AcquireOutcome::Held(info) => {
                    return Err(violated(
                        RULE,
                        format!("the expired lease stayed held: {info:?}"),
                    ));
                }
            }
        };
        ensure(RULE, theirs.fencing_token > grant.fencing_token, || {
            "the other client's grant has a lower token".to_owned()
        })?;
        let heard = tokio::time::timeout(self.patience, async {
            loop {
                match watch.next().await {
                    Some(LeaseChange::Changed(changed)) if changed == key => return true,
                    Some(LeaseChange::All) => return true,
                    Some(_) => {}
                    None => return false,
                }
            }
        })
        .await;
        ensure(RULE, heard == Ok(true), || {
            format!(
                "the lease taken by another client was not reported within {:?} ({heard:?})",
                self.patience
            )
        })?;
        let released = call::release(other, RULE, &key, &them).await?;
        ensure(RULE, released == ReleaseOutcome::Released, || {
            format!("the other client's release was answered {released:?}")
        })
    }
}
