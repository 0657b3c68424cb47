//! How one lease is kept: its renew interval, safety margin, renewal cap
//! and lock-delay, fixed at acquisition ([`Timing`]).

use std::time::Duration;

use leasehold_core::LockDelay;

/// How one lease is kept, fixed at acquisition. Durations are kept in
/// nanoseconds (a day is 8.6e13, far inside a u64) rather than as
/// `Duration`s, which saves 16 bytes for each of a million leases.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    renew_interval_ns: u64,
    safety_margin_ns: u64,
    /// The cap on renewals, `u32::MAX` for none (as `Entry::renewals_left`
    /// counts): an `Option` would not leave room for the lock-delay within
    /// the same 24 bytes.
    renewals_cap: u32,
    /// Sent with every renewal: the server keeps the key for ttl + this.
    pub(crate) lock_delay: LockDelay,
}

impl Timing {
    pub(crate) fn new(
        renew_interval: Duration,
        safety_margin: Duration,
        max_renewals: Option<u32>,
    ) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Self {
            renew_interval_ns: ns(renew_interval),
            safety_margin_ns: ns(safety_margin),
            renewals_cap: max_renewals.unwrap_or(u32::MAX),
            lock_delay: LockDelay::ZERO,
        }
    }

    /// This timing for a lease with a lock-delay. The delay lengthens the
    /// key's expiry on the server, never the holder's validity or deadline.
    pub(crate) fn with_lock_delay(mut self, lock_delay: LockDelay) -> Self {
        self.lock_delay = lock_delay;
        self
    }

    /// The cap on renewals, `u32::MAX` for none.
    pub(crate) fn renewals_cap(&self) -> u32 {
        self.renewals_cap
    }

    pub(crate) fn renew_interval_ns(&self) -> u64 {
        self.renew_interval_ns
    }

    pub(crate) fn renew_interval(&self) -> Duration {
        Duration::from_nanos(self.renew_interval_ns)
    }

    pub(crate) fn safety_margin(&self) -> Duration {
        Duration::from_nanos(self.safety_margin_ns)
    }

    /// After the `failures`-th failed renewal in a row, try again this much
    /// later (bounded by the deadline): 5 ms, 20 ms, 80 ms, then 320 ms for
    /// every later retry, each at most a quarter of the renew interval. The first retry comes almost at once because the
    /// commonest failure is a connection that broke (a restart, a failover),
    /// and the client reconnects on it: waiting longer would only delay
    /// learning whether the lease survived.
    pub(crate) fn retry_delay(&self, failures: u8) -> Duration {
        let quick = Duration::from_millis(5) * 4u32.pow(u32::from(failures.min(3)));
        quick
            .min(self.renew_interval() / 4)
            .max(Duration::from_millis(1))
    }
}
