//! One test at a time, for the suites whose verdicts compare a measured
//! time with a bound: `cargo test` runs a binary's tests on as many
//! threads as there are cores, and on a 2-core machine two such tests side
//! by side (each with its servers, clients and watchdogs) measure each
//! other's scheduling as much as the mechanism under test.

use tokio::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::const_new(());

/// Waits until no other test of this binary holds the guard, and returns
/// it: a test that holds it for its whole run has this binary's share of
/// the machine to itself. Every test runs on a runtime of its own; the
/// guard is one for the whole process, and a test that panics while
/// holding it releases it as it unwinds.
///
/// # Example
///
/// ```
/// #[tokio::test]
/// async fn a_timing_bound() {
///     let _serial = leasehold_testkit::serial().await;
///     // ... start a server, measure, assert the bound ...
/// }
/// ```
#[must_use = "the test runs alone only while the guard lives"]
pub async fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// [`serial`] for a test that is not async (a `#[test]` driving processes
/// with `std`): blocks its thread until no other test of this binary holds
/// the guard.
///
/// # Panics
///
/// When called from inside an async runtime: use [`serial`] there.
#[must_use = "the test runs alone only while the guard lives"]
pub fn serial_blocking() -> MutexGuard<'static, ()> {
    SERIAL.blocking_lock()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// How long a test thread may take before the test fails instead of
    /// hanging (each finishes in milliseconds).
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

    /// Each thread is a test with a runtime of its own, as under `cargo test`.
    fn on_runtime_of_its_own(
        test: impl Future<Output = ()> + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime")
                .block_on(test);
        })
    }

    #[test]
    fn guarded_sections_never_overlap() {
        static INSIDE: AtomicUsize = AtomicUsize::new(0);
        let tests: Vec<_> = (0..4)
            .map(|_| {
                on_runtime_of_its_own(async {
                    for _ in 0..20 {
                        let _serial = serial().await;
                        assert_eq!(INSIDE.fetch_add(1, Ordering::SeqCst), 0, "two at once");
                        tokio::time::sleep(std::time::Duration::from_micros(200)).await;
                        INSIDE.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in tests {
            assert!(
                crate::join_within(t, LIMIT).is_ok(),
                "a guarded section saw another"
            );
        }
    }

    #[test]
    fn a_test_that_panics_while_holding_it_does_not_stop_the_next() {
        let failing = on_runtime_of_its_own(async {
            let _serial = serial().await;
            panic!("a failing test");
        });
        assert!(crate::join_within(failing, LIMIT).is_err());
        let next = on_runtime_of_its_own(async {
            let _serial = tokio::time::timeout(std::time::Duration::from_secs(5), serial())
                .await
                .expect("the guard was released by the unwinding");
        });
        assert!(crate::join_within(next, LIMIT).is_ok());
    }
}
