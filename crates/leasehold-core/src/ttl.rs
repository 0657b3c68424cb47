//! The validated lease duration.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::InputError;

/// How long a lease lives on the server unless renewed.
///
/// A `Ttl` lies between [`Ttl::MIN`] (100 ms) and [`Ttl::MAX`] (24 hours) and
/// is a whole number of milliseconds, because that is what Redis stores
/// (`PX`). The floor leaves room for a renewal round trip within a third of
/// the ttl; the ceiling bounds how long a crashed holder can block others.
/// Work that takes longer than a day keeps its lease through renewals.
///
/// ```
/// use leasehold_core::Ttl;
/// let ttl: Ttl = "1m 30s".parse()?;
/// assert_eq!(ttl.as_millis(), 90_000);
/// assert!("50ms".parse::<Ttl>().is_err());
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// The shortest ttl accepted: 100 ms.
    pub const MIN: Duration = Duration::from_millis(100);
    /// The longest ttl accepted: 24 hours.
    pub const MAX: Duration = Duration::from_secs(24 * 60 * 60);
    /// 30 seconds: the default ttl, as in Redisson's lock watchdog.
    pub const DEFAULT: Ttl = Ttl(Duration::from_secs(30));

    /// Validates a duration as a ttl.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidTtl`] when the duration is below [`Ttl::MIN`], above
    /// [`Ttl::MAX`], or not a whole number of milliseconds.
    pub fn new(duration: Duration) -> Result<Self, InputError> {
        let refuse = |reason: String| InputError::InvalidTtl {
            value: humantime::format_duration(duration).to_string(),
            reason,
        };
        if duration < Self::MIN {
            return Err(refuse(format!(
                "a lease must live at least {} so that it can be renewed in time",
                humantime::format_duration(Self::MIN)
            )));
        }
        if duration > Self::MAX {
            return Err(refuse(format!(
                "a lease may live at most {}; keep longer work alive through renewals",
                humantime::format_duration(Self::MAX)
            )));
        }
        if !duration.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(refuse(
                "a ttl must be a whole number of milliseconds, the unit Redis stores".to_owned(),
            ));
        }
        Ok(Self(duration))
    }

    /// Parses a humantime string (`"30s"`, `"1m 30s"`) as a ttl.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidDuration`] when the string is not a duration, and
    /// [`InputError::InvalidTtl`] when it is one outside the accepted range.
    pub fn parse(s: &str) -> Result<Self, InputError> {
        Self::new(crate::parse_duration(s)?)
    }

    /// The ttl as a duration.
    #[must_use]
    pub fn get(self) -> Duration {
        self.0
    }

    /// The ttl in milliseconds, as sent to Redis.
    #[must_use]
    pub fn as_millis(self) -> u64 {
        // At most 86_400_000: the ceiling guarantees this fits.
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl FromStr for Ttl {
    type Err = InputError;
    fn from_str(s: &str) -> Result<Self, InputError> {
        Self::parse(s)
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = InputError;
    fn try_from(d: Duration) -> Result<Self, InputError> {
        Self::new(d)
    }
}

impl From<Ttl> for Duration {
    fn from(t: Ttl) -> Duration {
        t.0
    }
}

impl fmt::Display for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ttl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_range_and_refuses_outside_it() {
        assert_eq!(Ttl::parse("100ms").map(Ttl::get), Ok(Ttl::MIN));
        assert_eq!(Ttl::parse("24h").map(Ttl::get), Ok(Ttl::MAX));
        for bad in ["0s", "99ms", "24h 1ms", "2days"] {
            assert!(
                matches!(Ttl::parse(bad), Err(InputError::InvalidTtl { .. })),
                "{bad}"
            );
        }
        assert!(matches!(
            Ttl::parse("soon"),
            Err(InputError::InvalidDuration { .. })
        ));
        assert!(matches!(
            Ttl::new(Duration::from_micros(1_000_500)),
            Err(InputError::InvalidTtl { .. })
        ));
    }

    #[test]
    fn displays_the_humantime_way() {
        assert_eq!(
            Ttl::parse("90s").map(|t| t.to_string()),
            Ok("1m 30s".to_owned())
        );
    }

    /// What Redis is sent, and the conversions back to a duration.
    #[test]
    fn converts_to_milliseconds_and_back() {
        let ttl = Ttl::parse("1m 30s").expect("valid ttl");
        assert_eq!(ttl.as_millis(), 90_000);
        assert_eq!(Ttl::DEFAULT.as_millis(), 30_000);
        assert_eq!(Duration::from(ttl), Duration::from_secs(90));
        assert_eq!(
            Ttl::try_from(Duration::from_millis(250)).map(Ttl::get),
            Ok(Duration::from_millis(250))
        );
        assert_eq!(format!("{ttl:?}"), "Ttl(1m 30s)");
    }
}
