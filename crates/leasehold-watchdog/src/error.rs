//! Why a lease could not be acquired, kept or released.

use std::time::Duration;

use leasehold_core::{BackendError, LeaseInfo};

use crate::LossReason;

/// The error of every fallible operation of the watchdog crate.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A key, ttl, label or duration was refused.
    #[error(transparent)]
    Invalid(#[from] leasehold_core::InputError),
    /// The lease options do not fit together.
    #[error("invalid lease options: {reason}")]
    InvalidOptions {
        /// What does not fit, with the values involved.
        reason: String,
    },
    /// An option was given for a kind of lease it means nothing to (fair
    /// mode or a minimum hold for a permit or a share of a read-write
    /// lease): refused before the backend is asked, rather than ignored.
    #[error(
        "{option} does not apply to {kind} ({key:?}): {reason}; acquire it with options without {option}"
    )]
    NotApplicable {
        /// The key given to the acquisition.
        key: String,
        /// The option, as the builder names it (`"fair"`, `"hold_at_least"`).
        option: &'static str,
        /// The kind of lease asked for: `"a permit"`, `"a read share"` or
        /// `"a write share"`.
        kind: &'static str,
        /// Why the option means nothing to that kind.
        reason: &'static str,
    },
    /// Another holder kept the lease for the whole wait.
    #[error("lease {key:?} is held by {}; gave up after waiting {}", holder_text(.holder), humantime::format_duration(round_ms(*.waited)))]
    NotAcquired {
        /// The lease key.
        key: String,
        /// How long `acquire` waited.
        waited: Duration,
        /// What is known of the holder.
        holder: LeaseInfo,
    },
    /// Too many tasks of this manager already wait for the lease.
    #[error(
        "lease {key:?} already has {waiters} waiters in this process, the manager's bound; retry later or raise LeaseManagerBuilder::max_waiters"
    )]
    Busy {
        /// The lease key.
        key: String,
        /// How many were waiting.
        waiters: usize,
    },
    /// The backend failed; its message names the operation and the key.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The manager was shut down, so it no longer acquires or releases.
    #[error("the lease manager has shut down; create a new one to acquire leases")]
    ManagerStopped,
    /// A manager was created outside a tokio runtime.
    #[error(
        "a LeaseManager needs a tokio runtime: create it inside #[tokio::main] or Runtime::block_on"
    )]
    NoRuntime,
    /// A job run once per tick ([`TickJob`](crate::TickJob)) was given a
    /// name or a tick it cannot use.
    #[error("job {job:?}: {reason}")]
    InvalidTick {
        /// The job's name.
        job: String,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A lease guarding a running future ended before the future did.
    #[error("lease {key:?} ended while its work was running: {reason}")]
    LeaseEnded {
        /// The lease key.
        key: String,
        /// Why the lease ended.
        reason: LossReason,
    },
}

fn holder_text(info: &LeaseInfo) -> String {
    if *info == LeaseInfo::default() {
        return "another holder".to_owned();
    }
    let who = info
        .label
        .as_deref()
        .map_or_else(|| "another holder".to_owned(), |l| format!("{l:?}"));
    match info.ttl_left {
        Some(left) => format!(
            "{who} for another {}",
            humantime::format_duration(round_ms(left))
        ),
        None => format!("{who} with no expiry"),
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait is measured to the nanosecond, but shown as a person would
    /// say it: to the millisecond.
    #[test]
    fn a_refused_wait_is_shown_to_the_millisecond() {
        let error = LeaseError::NotAcquired {
            key: "k".to_owned(),
            waited: Duration::new(1, 2_086_620),
            holder: LeaseInfo::default(),
        };
        assert_eq!(
            error.to_string(),
            "lease \"k\" is held by another holder; gave up after waiting 1s 2ms"
        );
    }
}
