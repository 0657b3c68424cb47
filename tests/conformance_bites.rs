//! The conformance suite bites, for good: a backend of the few methods a
//! third-party backend starts from (`try_acquire`, `renew_many`, `release`,
//! `inspect`, `watch_releases`; everything else the trait's defaults),
//! kept in a `MemoryBackend`, passes the core; the same backend with one
//! flaw each (the flaws a real backend could have) fails the rule that
//! flaw breaks, named as such.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::backend::{
    AcquireOutcome, AcquireRequest, BackendError, HolderId, LeaseBackend, ReleaseReport,
    ReleaseWatch, RenewOutcome, RenewRequest, WatchPolicy,
};
use leasehold::{FencingToken, LeaseInfo, LeaseKey, MemoryBackend, Ttl};
use leasehold_testkit::conformance::{ConformanceError, Rule, Suite};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    None,
    /// A release by anyone frees the lease (no owner check).
    StrangerRelease,
    /// A renewal by anyone extends the lease (no owner check).
    StrangerRenew,
    /// Every grant has token 1.
    OneToken,
    /// The holder acquiring again draws a new token.
    NewTokenOnReacquire,
    /// A refusal says nothing of the holder.
    HeldWithoutInfo,
    /// `renew_many` answers in reverse order.
    RenewManyReversed,
    /// `inspect` always says free.
    InspectBlind,
    /// The release watch is supported but never fires.
    SilentRelease,
    /// Leases are kept twenty times as long as asked.
    NeverExpires,
    /// Leases are kept 250 ms longer than asked.
    LateExpiry,
    /// Leases are kept 0.85 of the ttl asked.
    EarlyExpiry,
    /// `valid_until` without the clock-drift allowance.
    NoDriftAllowance,
}

/// A third party's backend: a `MemoryBackend` behind the five methods,
/// with an optional flaw.
#[derive(Clone)]
struct Minimal {
    inner: MemoryBackend,
    flaw: Flaw,
    /// Who was last granted each key, so that a flaw can act for them.
    holders: Arc<Mutex<HashMap<LeaseKey, HolderId>>>,
    /// The notices of a silent release watch: never sent.
    silent: Arc<watch::Sender<u64>>,
}

impl Minimal {
    fn new(flaw: Flaw) -> Self {
        Self {
            inner: MemoryBackend::new(),
            flaw,
            holders: Arc::default(),
            silent: Arc::new(watch::Sender::new(0)),
        }
    }

    fn holder_of(&self, key: &LeaseKey) -> Option<HolderId> {
        self.holders
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied()
    }
}

impl LeaseBackend for Minimal {
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<AcquireOutcome, BackendError> {
        let mut asked = request.clone();
        match self.flaw {
            Flaw::NeverExpires => {
                asked.ttl = Ttl::new(request.ttl.get() * 20).expect("a valid ttl")
            }
            Flaw::LateExpiry => {
                asked.ttl =
                    Ttl::new(request.ttl.get() + Duration::from_millis(250)).expect("a valid ttl");
            }
            Flaw::EarlyExpiry => {
                asked.ttl = Ttl::new(request.ttl.get().mul_f64(0.85)).expect("a valid ttl");
            }
            _ => {}
        }
        let again = self.holder_of(&request.key) == Some(request.holder);
        Ok(match self.inner.try_acquire(&asked).await? {
            AcquireOutcome::Acquired(mut grant) => {
                self.holders
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(request.key.clone(), request.holder);
                grant.ttl = request.ttl;
                grant.valid_until = leasehold::backend::valid_until(grant.sent_at, request.ttl);
                match self.flaw {
                    Flaw::OneToken => grant.fencing_token = FencingToken(1),
                    Flaw::NewTokenOnReacquire if again => {
                        grant.fencing_token = FencingToken(grant.fencing_token.get() + 1000);
                    }
                    Flaw::NoDriftAllowance => grant.valid_until = grant.sent_at + request.ttl.get(),
                    _ => {}
                }
                AcquireOutcome::Acquired(grant)
            }
            AcquireOutcome::Held(mut info) => {
                match self.flaw {
                    Flaw::HeldWithoutInfo => info = LeaseInfo::default(),
                    Flaw::OneToken => info.fencing_token = Some(FencingToken(1)),
                    _ => {}
                }
                AcquireOutcome::Held(info)
            }
        })
    }

    async fn renew_many(
        &self,
        requests: &[RenewRequest],
    ) -> Vec<Result<RenewOutcome, BackendError>> {
        let mut outcomes = self.inner.renew_many(requests).await;
        if self.flaw == Flaw::StrangerRenew {
            for (request, outcome) in requests.iter().zip(outcomes.iter_mut()) {
                if let (Ok(RenewOutcome::Lost), Some(holder)) =
                    (&outcome, self.holder_of(&request.key))
                {
                    let mut theirs = request.clone();
                    theirs.holder = holder;
                    *outcome = self.inner.renew(&theirs).await;
                }
            }
        }
        if self.flaw == Flaw::RenewManyReversed {
            outcomes.reverse();
        }
        outcomes
    }

    async fn release(
        &self,
        key: &LeaseKey,
        holder: &HolderId,
    ) -> Result<ReleaseReport, BackendError> {
        let holder = match self.flaw {
            Flaw::StrangerRelease => self.holder_of(key).unwrap_or(*holder),
            _ => *holder,
        };
        self.inner.release(key, &holder).await
    }

    async fn inspect(&self, key: &LeaseKey) -> Result<Option<LeaseInfo>, BackendError> {
        let info = self.inner.inspect(key).await?;
        Ok(match self.flaw {
            Flaw::InspectBlind => None,
            Flaw::OneToken => info.map(|mut info| {
                info.fencing_token = Some(FencingToken(1));
                info
            }),
            _ => info,
        })
    }

    async fn watch_releases(
        &self,
        key: &LeaseKey,
        policy: WatchPolicy,
    ) -> Result<ReleaseWatch, BackendError> {
        match self.flaw {
            Flaw::SilentRelease => Ok(ReleaseWatch::new(self.silent.subscribe(), ())),
            _ => self.inner.watch_releases(key, policy).await,
        }
    }
}

fn suite(flaw: Flaw) -> Suite<Minimal> {
    // Bounded waits: a flawed backend fails within a second.
    Suite::new(Minimal::new(flaw), "bites").patience(Duration::from_secs(1))
}

#[tokio::test]
async fn a_backend_of_five_methods_keeps_the_core() -> Result<(), ConformanceError> {
    let checked = suite(Flaw::None).core().await?;
    assert_eq!(checked, Rule::CORE);
    Ok(())
}

/// Runs `check` on a backend with `flaw`, and says whether it failed with
/// `rule`, printing the message.
async fn red<F>(flaw: Flaw, rule: Rule, check: F) -> bool
where
    F: AsyncFnOnce(&Suite<Minimal>) -> Result<(), ConformanceError>,
{
    let outcome = check(&suite(flaw)).await;
    println!("{flaw:?}: {outcome:?}");
    matches!(&outcome, Err(error) if error.rule() == Some(rule))
}

#[tokio::test]
async fn each_flaw_breaks_its_rule() {
    let mut missed = Vec::new();
    macro_rules! expect {
        ($flaw:expr, $rule:expr, $check:ident) => {
            if !red($flaw, $rule, async |s: &Suite<Minimal>| s.$check().await).await {
                missed.push(($flaw, $rule));
            }
        };
    }
    expect!(
        Flaw::StrangerRelease,
        Rule::ReleaseOwnerChecked,
        release_owner_checked
    );
    expect!(Flaw::StrangerRelease, Rule::ReleaseTo, release_to);
    expect!(
        Flaw::StrangerRenew,
        Rule::RenewOwnerChecked,
        renew_owner_checked
    );
    expect!(
        Flaw::StrangerRenew,
        Rule::RenewManyInOrder,
        renew_many_in_order
    );
    expect!(Flaw::OneToken, Rule::TokensIncrease, tokens_increase);
    expect!(
        Flaw::NewTokenOnReacquire,
        Rule::ReacquireRefreshes,
        reacquire_refreshes
    );
    expect!(
        Flaw::HeldWithoutInfo,
        Rule::RefusesWithHolderInfo,
        refuses_with_holder_info
    );
    expect!(
        Flaw::RenewManyReversed,
        Rule::RenewManyInOrder,
        renew_many_in_order
    );
    expect!(Flaw::InspectBlind, Rule::Inspect, inspect);
    expect!(Flaw::SilentRelease, Rule::ReleaseNotices, release_notices);
    expect!(Flaw::NeverExpires, Rule::ExpiryFrees, expiry_frees);
    expect!(Flaw::LateExpiry, Rule::ExpiryFrees, expiry_frees);
    expect!(Flaw::LateExpiry, Rule::TokensIncrease, tokens_increase);
    expect!(Flaw::EarlyExpiry, Rule::ExpiryFrees, expiry_frees);
    expect!(Flaw::NoDriftAllowance, Rule::GrantsFreeKey, grants_free_key);
    assert!(missed.is_empty(), "flaws the suite missed: {missed:?}");
}

/// A backend without the optional areas is refused by them, as a broken
/// rule, not passed by: an area runs only where the backend claims it.
#[tokio::test]
async fn an_area_the_backend_lacks_fails() {
    let s = suite(Flaw::None);
    let permits = s.permits().await;
    assert!(
        matches!(
            &permits,
            Err(ConformanceError::Backend {
                rule: Rule::Permits,
                source: BackendError::Unsupported { .. },
                ..
            })
        ),
        "{permits:?}"
    );
    let notices = s
        .clone()
        .expect_notices(Some(false))
        .release_notices()
        .await;
    assert!(
        matches!(&notices, Err(e) if e.rule() == Some(Rule::ReleaseNotices)),
        "a supported watch where none was expected: {notices:?}"
    );
}
