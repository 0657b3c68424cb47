//! The tries that turn client tracking on for the connection a tracked
//! write or read goes over, and the failure they report when they run out.

use std::future::Future;
use std::io;
use std::sync::Arc;

use redis::RedisError;

use crate::reply::Failure;

/// How many times a tracked write tries to settle its connection. Each try
/// that fails leaves the connection to be looked up again (Sentinel), so the
/// second try goes over a connection of its own.
pub(super) const TRIES: u32 = 2;

/// Runs `attempt` until `settled` holds, at most `tries` times.
///
/// # Errors
///
/// The last try's failure, when it failed. When it went through and the
/// connection still changed under it (a reconnection reported after the
/// prelude was sent), [`unsettled`]: an unavailable connection, which a
/// caller tries again, never a timeout that no wait produced.
pub(super) async fn settle<F, Fut>(
    tries: u32,
    settled: impl Fn() -> bool,
    mut attempt: F,
) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), Failure>>,
{
    let mut last = None;
    for _ in 0..tries {
        last = attempt().await.err();
        if settled() {
            return Ok(());
        }
    }
    Err(last.unwrap_or_else(unsettled))
}

/// The failure of tries that each went through while the connection kept
/// changing: transient, reported as an unavailable server.
fn unsettled() -> Failure {
    Failure::Redis(Arc::new(RedisError::from(io::Error::new(
        io::ErrorKind::ConnectionReset,
        "the connection to the server changed again while client tracking was being turned on for it; try again",
    ))))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use leasehold_core::{BackendError, LeaseKey};

    use super::*;

    fn key() -> LeaseKey {
        LeaseKey::new("settle").expect("a valid key")
    }

    /// Runs `settle` over a script of try outcomes (`settled` after each).
    async fn run(script: &[(Result<(), Failure>, bool)]) -> (Result<(), Failure>, usize) {
        let done = Cell::new(0);
        let settled = Cell::new(false);
        let outcome = settle(
            TRIES,
            || settled.get(),
            || {
                let (result, after) = script[done.get()].clone();
                done.set(done.get() + 1);
                settled.set(after);
                async move { result }
            },
        )
        .await;
        (outcome, done.get())
    }

    #[tokio::test]
    async fn a_settled_connection_ends_the_tries() {
        let (outcome, tries) = run(&[(Ok(()), true)]).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(tries, 1);
        let timeout = Failure::Timeout(Duration::from_secs(2));
        let (outcome, tries) = run(&[(Err(timeout), false), (Ok(()), true)]).await;
        assert!(outcome.is_ok(), "{outcome:?}");
        assert_eq!(tries, 2);
    }

    #[tokio::test]
    async fn tries_that_went_through_unsettled_are_no_timeout() {
        let (outcome, tries) = run(&[(Ok(()), false), (Ok(()), false)]).await;
        assert_eq!(tries, 2);
        let Err(failure) = outcome else {
            panic!("an unsettled connection must fail the call");
        };
        let error = failure.for_key("inspect", &key());
        assert!(
            matches!(error, BackendError::Unavailable { .. }),
            "{error:?}"
        );
        assert!(error.is_transient());
        let cause = std::error::Error::source(&error).map(ToString::to_string);
        assert!(
            cause
                .as_deref()
                .is_some_and(|c| c.contains("changed again")),
            "{cause:?}"
        );
        // A timeout early on is not the failure of a later try that went
        // through.
        let timeout = Failure::Timeout(Duration::from_secs(2));
        let (outcome, _) = run(&[(Err(timeout), false), (Ok(()), false)]).await;
        let error = outcome.expect_err("unsettled").for_key("inspect", &key());
        assert!(
            matches!(error, BackendError::Unavailable { .. }),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn the_last_failure_is_reported() {
        let timeout = Failure::Timeout(Duration::from_millis(100));
        let (outcome, tries) = run(&[(Ok(()), false), (Err(timeout), false)]).await;
        assert_eq!(tries, 2);
        let error = outcome.expect_err("unsettled").for_key("inspect", &key());
        assert!(
            matches!(error, BackendError::Timeout { after, .. } if after == Duration::from_millis(100)),
            "{error:?}"
        );
    }
}
