//! Duration parsing and the clock-drift allowance.

use std::time::Duration;

use crate::Error;

/// Parses a humantime duration such as `"30s"`, `"1m 30s"` or `"250ms"`.
///
/// # Errors
///
/// [`Error::InvalidDuration`] naming the string and what is wrong with it.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold_core::parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
/// assert!(leasehold_core::parse_duration("thirty seconds").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, Error> {
    humantime::parse_duration(s.trim()).map_err(|e| Error::InvalidDuration {
        value: crate::error::excerpt(s),
        reason: e.to_string(),
    })
}

/// The clock-drift allowance subtracted from a lease's validity: 1% of the
/// ttl plus 2 ms, as in the Redlock algorithm.
///
/// It covers the server's clock running faster than ours and the time
/// between the server setting the expiry and our receiving the reply.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold_core::clock_drift(Duration::from_secs(30)), Duration::from_millis(302));
/// ```
#[must_use]
pub fn clock_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}
