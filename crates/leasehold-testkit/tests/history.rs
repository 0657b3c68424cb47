//! The history checker on hand-made histories, including ones it must flag,
//! and the fenced-resource script on a real server.

use std::error::Error;
use std::time::Duration;

use leasehold_testkit::{FENCED_WRITE_SCRIPT, History, HoldEnd, RedisServer};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A hold of `key` by `holder` with `token`, requested and acquired at
/// `from` ms and ended at `to` ms (if given) after `t0`.
fn hold(h: &History, t0: Instant, key: &str, holder: &str, token: u64, from: u64, to: Option<u64>) {
    let id = h.acquired(key, holder, token, t0 + ms(from), t0 + ms(from));
    if let Some(to) = to {
        h.ended(id, HoldEnd::Released, t0 + ms(to));
    }
}

#[test]
fn a_sequential_history_is_clean() {
    let (h, t0) = (History::new(), Instant::now());
    hold(&h, t0, "k", "a", 1, 0, Some(100));
    hold(&h, t0, "k", "b", 2, 100, Some(200)); // starts exactly when a ended
    hold(&h, t0, "other", "c", 1, 50, Some(150)); // another key may overlap
    h.resource_accepted("k", "a", 1);
    h.resource_accepted("k", "a", 1); // equal tokens are accepted
    h.resource_accepted("k", "b", 2);
    h.resource_refused();
    let report = h.check();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, 3);
    assert_eq!(report.accepted_writes, 3);
    assert_eq!(report.refused_writes, 1);
    assert_eq!(report.worst_overlap(), None);
}

#[test]
fn overlapping_beliefs_are_flagged_with_their_duration() {
    let (h, t0) = (History::new(), Instant::now());
    hold(&h, t0, "k", "a", 1, 0, Some(300));
    hold(&h, t0, "k", "b", 2, 200, Some(500));
    hold(&h, t0, "k", "c", 3, 250, Some(260)); // inside both
    let report = h.check();
    let found: Vec<(&str, &str, Duration)> = report
        .overlaps
        .iter()
        .map(|o| {
            (
                o.earlier.holder.as_str(),
                o.later.holder.as_str(),
                o.duration,
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![("a", "b", ms(100)), ("a", "c", ms(10)), ("b", "c", ms(10))]
    );
    assert_eq!(report.worst_overlap(), Some(ms(100)));
    assert!(report.token_violations.is_empty());
    assert!(!report.is_clean());
}

#[test]
fn a_hold_never_ended_overlaps_everything_after_it() {
    let (h, t0) = (History::new(), Instant::now());
    hold(&h, t0, "k", "a", 1, 0, None);
    hold(&h, t0, "k", "b", 2, 10_000, Some(10_001));
    let report = h.check_at(t0 + ms(20_000));
    assert_eq!(report.overlaps.len(), 1);
    assert_eq!(report.overlaps[0].duration, ms(1));
}

#[test]
fn tokens_that_do_not_rise_after_a_completed_acquisition_are_flagged() {
    let (h, t0) = (History::new(), Instant::now());
    hold(&h, t0, "k", "a", 10, 0, Some(100));
    hold(&h, t0, "k", "b", 9, 200, Some(300)); // requested after a: must exceed 10
    let report = h.check();
    assert_eq!(report.token_violations.len(), 1);
    assert_eq!(report.token_violations[0].before.holder, "a");
    assert_eq!(report.token_violations[0].after.holder, "b");
}

#[test]
fn concurrent_acquisitions_may_complete_out_of_token_order_but_never_share_a_token() {
    // b was requested before a's grant arrived: the server may have run b
    // first, so a lower token for b is no violation.
    let (h, t0) = (History::new(), Instant::now());
    let a = h.acquired("k", "a", 10, t0, t0 + ms(50));
    h.ended(a, HoldEnd::Cancelled("lost".into()), t0 + ms(60));
    let b = h.acquired("k", "b", 9, t0 + ms(40), t0 + ms(70));
    h.ended(b, HoldEnd::Released, t0 + ms(80));
    assert!(h.check().token_violations.is_empty());

    let (h, t0) = (History::new(), Instant::now());
    let a = h.acquired("k", "a", 7, t0, t0 + ms(50));
    h.ended(a, HoldEnd::Released, t0 + ms(60));
    let b = h.acquired("k", "b", 7, t0 + ms(40), t0 + ms(70));
    h.ended(b, HoldEnd::Released, t0 + ms(80));
    let report = h.check();
    assert_eq!(report.token_violations.len(), 1, "{report:?}");
}

#[test]
fn the_first_end_of_a_hold_counts() {
    let (h, t0) = (History::new(), Instant::now());
    let a = h.acquired("k", "a", 1, t0, t0);
    h.ended(a, HoldEnd::Cancelled("deadline".into()), t0 + ms(10));
    h.ended(a, HoldEnd::Released, t0 + ms(500));
    hold(&h, t0, "k", "b", 2, 20, Some(30));
    assert!(h.check().is_clean());
    assert_eq!(
        h.holds()[0].ended,
        Some((t0 + ms(10), HoldEnd::Cancelled("deadline".into())))
    );
}

#[test]
fn a_resource_accepting_a_lower_token_after_a_higher_one_is_flagged() {
    let h = History::new();
    h.resource_accepted("k", "a", 10);
    h.resource_accepted("k", "b", 12);
    h.resource_accepted("k", "a", 10); // stale
    h.resource_accepted("j", "c", 1); // another key has its own order
    let report = h.check();
    assert_eq!(report.stale_writes.len(), 1);
    let stale = &report.stale_writes[0];
    assert_eq!(
        (stale.holder.as_str(), stale.token, stale.highest_before),
        ("a", 10, 12)
    );
    assert!(
        report.to_string().contains("1 stale writes accepted"),
        "{report}"
    );
}

#[test]
fn the_fenced_write_script_refuses_lower_tokens() -> Result<(), Box<dyn Error>> {
    let server = RedisServer::start()?;
    let write = |token: &str, who: &str| {
        server.cli(&[
            "EVAL",
            FENCED_WRITE_SCRIPT,
            "2",
            "res",
            "res:log",
            token,
            who,
        ])
    };
    assert_eq!(write("5", "a")?, "1");
    assert_eq!(write("5", "a")?, "1");
    assert_eq!(write("1700000000000001", "b")?, "1");
    assert_eq!(write("5", "a")?, "0");
    assert_eq!(write("1700000000000000", "c")?, "0");
    assert_eq!(server.cli(&["GET", "res"])?, "1700000000000001");
    assert_eq!(
        server.cli(&["LRANGE", "res:log", "0", "-1"])?,
        "5:a\n5:a\n1700000000000001:b"
    );
    Ok(())
}
