//! Jittered exponential backoff between acquisition attempts.

use std::time::Duration;

/// How long to wait between attempts to acquire a held lease.
///
/// The n-th wait is drawn uniformly from the upper half of
/// `min(max, initial × 2ⁿ)`, so contending processes spread out instead of
/// retrying in lockstep. The wait is also cut short to when the current
/// holder's lease would expire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
}

impl Default for Backoff {
    /// 25 ms doubling up to 500 ms.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(25),
            max: Duration::from_millis(500),
        }
    }
}

impl Backoff {
    /// A backoff from `initial` doubling up to `max`; `max` is raised to
    /// `initial` if it is smaller, and `initial` to 1 ms if it is zero.
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        let initial = initial.max(Duration::from_millis(1));
        Self {
            initial,
            max: max.max(initial),
        }
    }

    /// A fixed interval with no growth and no jitter, as polling lock
    /// libraries use (for comparisons).
    #[must_use]
    pub fn fixed(interval: Duration) -> Self {
        Self::new(interval, interval)
    }

    /// The first wait.
    #[must_use]
    pub fn initial(&self) -> Duration {
        self.initial
    }

    /// The longest wait.
    #[must_use]
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The wait before attempt `attempt + 1` (attempt 0 is the first retry).
    #[must_use]
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self
            .initial
            .checked_mul(1u32 << attempt.min(20))
            .map_or(self.max, |d| d.min(self.max));
        if self.initial == self.max {
            return ceiling;
        }
        upper_half(ceiling)
    }
}

/// A duration drawn uniformly from the upper half of `d`: spread out, never
/// zero, never more than `d`.
pub(crate) fn upper_half(d: Duration) -> Duration {
    let half = d / 2;
    half + half.mul_f64(fastrand::f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_cap_with_jitter_in_the_upper_half() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_millis(100));
        for attempt in 0..40 {
            let ceiling = Duration::from_millis(10 * (1 << attempt.min(4))).min(b.max());
            let d = b.delay(attempt);
            assert!(d >= ceiling / 2 && d <= ceiling, "attempt {attempt}: {d:?}");
        }
        assert_eq!(
            Backoff::fixed(Duration::from_millis(7)).delay(9),
            Duration::from_millis(7)
        );
    }

    /// `new` raises a zero start to 1 ms and a cap below the start to it.
    #[test]
    fn new_keeps_the_bounds_in_order() {
        let ms = Duration::from_millis;
        let b = Backoff::new(ms(10), ms(100));
        assert_eq!((b.initial(), b.max()), (ms(10), ms(100)));
        let zero = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!((zero.initial(), zero.max()), (ms(1), ms(1)));
        let inverted = Backoff::new(ms(50), ms(20));
        assert_eq!((inverted.initial(), inverted.max()), (ms(50), ms(50)));
        assert_eq!(inverted.delay(3), ms(50));
    }
}
