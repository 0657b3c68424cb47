//! Duration parsing and the clock-drift allowance.

use std::time::Duration;

use crate::InputError;

/// Parses a humantime duration such as `"30s"`, `"1m 30s"` or `"250ms"`.
///
/// # Errors
///
/// [`InputError::InvalidDuration`] naming the string and what is wrong with it.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold_core::parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
/// assert!(leasehold_core::parse_duration("thirty seconds").is_err());
/// ```
pub fn parse_duration(s: &str) -> Result<Duration, InputError> {
    humantime::parse_duration(s.trim()).map_err(|e| InputError::InvalidDuration {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// 1% of the ttl plus 2 ms, at the ends of the accepted range and at the
    /// default: the figures the Redlock algorithm gives.
    #[test]
    fn drift_is_one_percent_plus_two_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(clock_drift(ms(100)), ms(3));
        assert_eq!(clock_drift(ms(3_000)), ms(32));
        assert_eq!(clock_drift(ms(30_000)), ms(302));
        assert_eq!(clock_drift(Duration::from_secs(86_400)), ms(864_002));
        // A ttl that is not a multiple of 100 ms keeps its fraction.
        assert_eq!(clock_drift(ms(150)), Duration::from_micros(3_500));
    }

    #[test]
    fn durations_parse_the_humantime_way_and_name_what_is_wrong() {
        assert_eq!(parse_duration(" 250ms "), Ok(Duration::from_millis(250)));
        match parse_duration("thirty seconds") {
            Err(InputError::InvalidDuration { value, reason }) => {
                assert_eq!(value, "thirty seconds");
                assert!(!reason.is_empty());
            }
            other => panic!("expected InvalidDuration, got {other:?}"),
        }
    }
}
