//! How long the command has to stop, and the lease timing that makes room
//! for it.
//!
//! The watchdog fires a lease's token at the end of its certain validity
//! less the safety margin, both when the renewal cap is reached and when
//! renewals kept failing. `run` then sends SIGTERM, waits the grace, sends
//! SIGKILL and waits for the job to die. All of that must end before the
//! server can expire the lease, so the margin `run` asks for is at least
//! the grace plus [`KILL_ALLOWANCE`]:
//!
//! ```text
//! last renewal sent          token fires       SIGKILL      server expiry
//! |--------------------------|-----------------|-------------|---|
//!                            |<---- grace ---->|<-allowance->|   |
//!                            |<-------- safety margin ------>|   |
//!                                                 clock drift|<->|
//! ```
//!
//! A grace that does not fit the ttl is cut, and `run` says so: the
//! margin may take at most [`MAX_MARGIN_SHARE`] of the lease's usable
//! validity, so that renewals still have room to be retried before the
//! deadline. The renew interval is shortened, when the margin is large, to
//! leave at least two renewals before it.

use std::time::Duration;

use leasehold_core::{Ttl, clock_drift};

/// How long a SIGKILLed job may take to be seen dead: the kernel delivers
/// SIGKILL at once, but each process dies only when it is next scheduled,
/// and `run` learns of it from SIGCHLD. A job that takes longer is in
/// uninterruptible sleep (a hung disk or network file system), which no
/// signal can end.
pub(crate) const KILL_ALLOWANCE: Duration = Duration::from_millis(250);

/// The largest share of a lease's usable validity (ttl less the clock-drift
/// allowance) that the safety margin may take, as numerator and denominator.
pub(crate) const MAX_MARGIN_SHARE: (u32, u32) = (2, 3);

/// The lease timing `run` uses, and the grace that fits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fit {
    /// How long before the end of certain validity the token fires: at
    /// least `grace + KILL_ALLOWANCE`.
    pub(crate) safety_margin: Duration,
    /// How often the lease is renewed.
    pub(crate) renew_interval: Duration,
    /// The grace after SIGTERM, cut when the one asked for does not fit.
    pub(crate) grace: Duration,
    /// The grace asked for, when it was cut.
    pub(crate) cut_from: Option<Duration>,
}

impl Fit {
    /// Fits `grace` into a `ttl` lease whose configured safety margin is
    /// `margin` (`None` for the default, a tenth of the ttl).
    ///
    /// # Errors
    ///
    /// A message for the user when the ttl is too short to leave even
    /// [`KILL_ALLOWANCE`] between the token and the expiry.
    pub(crate) fn new(ttl: Ttl, margin: Option<Duration>, grace: Duration) -> Result<Self, String> {
        let ttl_d = ttl.get();
        let usable = ttl_d.saturating_sub(clock_drift(ttl_d));
        let (num, den) = MAX_MARGIN_SHARE;
        let max_margin = usable * num / den;
        if max_margin <= KILL_ALLOWANCE {
            return Err(format!(
                "a {ttl} lease is too short for run: the command must be killed before the \
                 lease can expire, which needs {} and at most {num}/{den} of the lease; use a \
                 ttl of at least 400ms",
                humantime::format_duration(KILL_ALLOWANCE),
            ));
        }
        let max_grace = whole_ms(max_margin - KILL_ALLOWANCE);
        let (grace, cut_from) = if grace > max_grace {
            (max_grace, Some(grace))
        } else {
            (grace, None)
        };
        let safety_margin = margin.unwrap_or(ttl_d / 10).max(grace + KILL_ALLOWANCE);
        // At least two renewals before the deadline, so that one failed
        // renewal is retried before the command is stopped. A configured
        // margin that leaves no validity keeps the usual interval, so that
        // the options' own check names the margin.
        let before_deadline = usable.saturating_sub(safety_margin);
        let renew_interval = if before_deadline.is_zero() {
            ttl_d / 3
        } else {
            (ttl_d / 3).min(before_deadline / 2)
        };
        Ok(Self {
            safety_margin,
            renew_interval,
            grace,
            cut_from,
        })
    }

    /// Why the grace was cut, for stderr; `None` when it was not.
    pub(crate) fn cut_message(&self, ttl: Ttl) -> Option<String> {
        let asked = self.cut_from?;
        let (num, den) = MAX_MARGIN_SHARE;
        Some(format!(
            "--grace {} is cut to {}: the command must be dead before the {ttl} lease can \
             expire, and stopping it (the grace, then {} to kill it) may take at most \
             {num}/{den} of the lease; use a longer --ttl for a longer grace",
            humantime::format_duration(asked),
            humantime::format_duration(self.grace),
            humantime::format_duration(KILL_ALLOWANCE),
        ))
    }
}

/// `d` cut to whole milliseconds, as durations are shown.
pub(crate) fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ttl(s: &str) -> Ttl {
        Ttl::parse(s).expect("a valid ttl")
    }

    #[test]
    fn the_margin_makes_room_for_the_grace_and_the_kill() -> Result<(), String> {
        // The defaults: 30 s lease, 10 s grace.
        let fit = Fit::new(ttl("30s"), None, Duration::from_secs(10))?;
        assert_eq!(fit.grace, Duration::from_secs(10));
        assert_eq!(fit.cut_from, None);
        assert_eq!(fit.safety_margin, Duration::from_secs(10) + KILL_ALLOWANCE);
        // ttl − drift − margin = 30 − 0.302 − 10.25 = 19.448 s, halved.
        assert_eq!(fit.renew_interval, Duration::from_millis(9724));
        // A short grace keeps the default margin and interval.
        let fit = Fit::new(ttl("30s"), None, Duration::from_secs(1))?;
        assert_eq!(fit.safety_margin, Duration::from_secs(3));
        assert_eq!(fit.renew_interval, Duration::from_secs(10));
        // A larger configured margin is kept.
        let fit = Fit::new(
            ttl("30s"),
            Some(Duration::from_secs(12)),
            Duration::from_secs(1),
        )?;
        assert_eq!(fit.safety_margin, Duration::from_secs(12));
        Ok(())
    }

    #[test]
    fn a_grace_too_long_for_the_ttl_is_cut_and_said_so() -> Result<(), String> {
        let fit = Fit::new(ttl("3s"), None, Duration::from_secs(10))?;
        // (3 s − 32 ms) × 2/3 = 1.978(6) s of margin, less the kill allowance.
        assert_eq!(fit.grace, Duration::from_millis(1728));
        assert_eq!(
            fit.safety_margin,
            Duration::from_millis(1728) + KILL_ALLOWANCE
        );
        assert!(fit.renew_interval > Duration::ZERO);
        assert!(fit.renew_interval * 2 <= Duration::from_millis(2968) - fit.safety_margin);
        let message = fit.cut_message(ttl("3s")).ok_or("no message")?;
        assert!(
            message.contains("--grace 10s is cut to 1s 728ms") && message.contains("--ttl"),
            "{message}"
        );
        Ok(())
    }

    #[test]
    fn a_ttl_with_no_room_to_kill_is_refused() {
        let error = Fit::new(ttl("300ms"), None, Duration::ZERO).unwrap_err();
        assert!(error.contains("too short"), "{error}");
        assert!(Fit::new(ttl("500ms"), None, Duration::ZERO).is_ok());
    }
}
