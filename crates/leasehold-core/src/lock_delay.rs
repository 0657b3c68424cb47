//! The validated lock-delay: how long a key stays taken after its holder
//! vanished.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{InputError, Ttl};

/// How long the server keeps a lease's key taken after the lease ended
/// *without* a release: its holder crashed, paused or was cut off.
///
/// A lease with a lock-delay is stored with an expiry of ttl + lock-delay,
/// at the grant and at every renewal, while its holder's validity, deadline
/// and safety margin still count from the ttl alone. So when renewals stop,
/// the holder's token fires before the ttl runs out, and the key stays
/// taken for the lock-delay after that: a stale holder whose downstream
/// store cannot check fencing tokens gets that long to notice and stop
/// before anyone else is granted the key. A clean release frees the key at
/// once. The delay is enforced by the server's expiry, not by the next
/// client's goodwill. (Chubby and Consul call this a lock-delay.)
///
/// A `LockDelay` lies between zero (the default: no delay) and
/// [`LockDelay::MAX`] (1 hour) and is a whole number of milliseconds, the
/// unit Redis stores; with a [`Ttl`] of at most a day, ttl + lock-delay
/// never overflows.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::LockDelay;
/// let delay: LockDelay = "15s".parse()?;
/// assert_eq!(delay.get(), Duration::from_secs(15));
/// assert!("2h".parse::<LockDelay>().is_err());
/// assert_eq!(LockDelay::default(), LockDelay::ZERO);
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockDelay(
    /// Milliseconds: at most 3 600 000, so four bytes suffice, which keeps
    /// per-lease state small.
    u32,
);

impl LockDelay {
    /// No lock-delay: the key is free as soon as the ttl runs out.
    pub const ZERO: LockDelay = LockDelay(0);
    /// The longest lock-delay accepted: 1 hour. A longer one would keep a
    /// key taken for longer than any stale holder needs to stop, after a
    /// crash no one can end early.
    pub const MAX: Duration = Duration::from_secs(60 * 60);

    /// Validates a duration as a lock-delay.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidLockDelay`] when the duration is above
    /// [`LockDelay::MAX`] or not a whole number of milliseconds.
    pub fn new(duration: Duration) -> Result<Self, InputError> {
        let refuse = |reason: String| InputError::InvalidLockDelay {
            value: humantime::format_duration(duration).to_string(),
            reason,
        };
        if duration > Self::MAX {
            return Err(refuse(format!(
                "a lock-delay may be at most {}: it keeps the key taken after a crash, and no one can end it early",
                humantime::format_duration(Self::MAX)
            )));
        }
        if !duration.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(refuse(
                "a lock-delay must be a whole number of milliseconds, the unit Redis stores"
                    .to_owned(),
            ));
        }
        // At most 3 600 000 ms (checked above): fits a u32.
        let millis = u32::try_from(duration.as_millis()).unwrap_or(u32::MAX);
        Ok(Self(millis))
    }

    /// Parses a humantime string (`"10s"`, `"500ms"`, `"0s"`) as a lock-delay.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidDuration`] when the string is not a duration, and
    /// [`InputError::InvalidLockDelay`] when it is one outside the accepted range.
    pub fn parse(s: &str) -> Result<Self, InputError> {
        Self::new(crate::parse_duration(s)?)
    }

    /// The lock-delay as a duration.
    #[must_use]
    pub fn get(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }

    /// Whether there is no delay.
    #[must_use]
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The server-side expiry of a lease with this lock-delay and `ttl`:
    /// ttl + lock-delay, in milliseconds, as sent to Redis.
    #[must_use]
    pub fn expiry_millis(self, ttl: Ttl) -> u64 {
        // At most 86 400 000 + 3 600 000: far inside a u64.
        ttl.as_millis() + u64::from(self.0)
    }
}

impl FromStr for LockDelay {
    type Err = InputError;
    fn from_str(s: &str) -> Result<Self, InputError> {
        Self::parse(s)
    }
}

impl TryFrom<Duration> for LockDelay {
    type Error = InputError;
    fn try_from(d: Duration) -> Result<Self, InputError> {
        Self::new(d)
    }
}

impl From<LockDelay> for Duration {
    fn from(d: LockDelay) -> Duration {
        d.get()
    }
}

impl fmt::Display for LockDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.get()))
    }
}

impl fmt::Debug for LockDelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockDelay({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_zero_to_an_hour_in_whole_milliseconds() {
        assert_eq!(LockDelay::parse("0s"), Ok(LockDelay::ZERO));
        assert_eq!(
            LockDelay::parse("1h").map(LockDelay::get),
            Ok(LockDelay::MAX)
        );
        for bad in ["1h 1ms", "2days"] {
            assert!(
                matches!(
                    LockDelay::parse(bad),
                    Err(InputError::InvalidLockDelay { .. })
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            LockDelay::new(Duration::from_micros(1_500)),
            Err(InputError::InvalidLockDelay { .. })
        ));
        // Far beyond a u32 of milliseconds: refused, not wrapped.
        assert!(matches!(
            LockDelay::new(Duration::from_secs(u64::MAX)),
            Err(InputError::InvalidLockDelay { .. })
        ));
        assert!(matches!(
            LockDelay::parse("later"),
            Err(InputError::InvalidDuration { .. })
        ));
    }

    /// What Redis is sent: ttl + lock-delay at both ends of both ranges.
    #[test]
    fn the_expiry_adds_the_delay_to_the_ttl() -> Result<(), InputError> {
        let ttl = Ttl::parse("1s")?;
        assert_eq!(LockDelay::ZERO.expiry_millis(ttl), 1_000);
        assert_eq!(LockDelay::parse("2s")?.expiry_millis(ttl), 3_000);
        let longest = LockDelay::new(LockDelay::MAX)?;
        assert_eq!(
            longest.expiry_millis(Ttl::new(Ttl::MAX)?),
            86_400_000 + 3_600_000
        );
        assert_eq!(longest.to_string(), "1h");
        assert_eq!(format!("{:?}", LockDelay::ZERO), "LockDelay(0s)");
        Ok(())
    }
}
