//! The history checker on hand-made histories, including ones it must flag,
//! and the fenced-resource script on a real server.

use std::error::Error;
use std::time::Duration;

use leasehold_testkit::{
    FENCED_WRITE_SCRIPT, History, HoldEnd, RedisServer, ServerTime, WriteAttempt,
};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Records an attempt `id` on `key` by `holder` with `token`, reaching the
/// resource at `at_us`.
fn attempt(h: &History, id: &str, key: &str, holder: &str, token: u64, at_us: u64) {
    h.attempted(WriteAttempt {
        id: id.into(),
        key: key.into(),
        holder: holder.into(),
        token,
        at_us,
        checked_us: at_us.saturating_sub(100),
        after_fire: false,
    });
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
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
    h.granted("k", 1, 0, ms(1000));
    h.granted("k", 2, 100_000, ms(1000));
    attempt(&h, "a1", "k", "a", 1, 10_000);
    attempt(&h, "a2", "k", "a", 1, 20_000); // equal tokens are not stale
    attempt(&h, "b1", "k", "b", 2, 110_000);
    h.stores("k", ids(&["a1", "a2", "b1"]), ids(&["a1", "a2", "b1"]));
    let report = h.check();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.holds, 3);
    assert_eq!(report.writes.attempted, 3);
    assert_eq!(report.writes.fenced_refused, 0);
    assert!(report.writes.stale.is_empty());
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
fn a_write_with_a_token_lower_than_one_granted_is_stale_in_both_stores() {
    let h = History::new();
    h.granted("k", 10, 0, ms(1000));
    h.granted("k", 12, 500_000, ms(1000)); // the server lost 10's lease and granted 12
    attempt(&h, "a1", "k", "a", 10, 100_000); // fine: 12 was not granted yet
    attempt(&h, "a2", "k", "a", 10, 510_000); // stale, before 12 reached the store
    attempt(&h, "b1", "k", "b", 12, 520_000);
    attempt(&h, "a3", "k", "a", 10, 530_000); // stale, after 12 reached the store
    attempt(&h, "c1", "j", "c", 1, 530_000); // another key has its own grants
    h.stores(
        "k",
        ids(&["a1", "a2", "b1", "a3"]),
        ids(&["a1", "a2", "b1"]),
    );
    h.stores("j", ids(&["c1"]), ids(&["c1"]));
    let w = h.check().writes;
    let stale: Vec<(&str, Option<u64>, Option<u64>)> = w
        .stale
        .iter()
        .map(|s| (s.attempt.id.as_str(), s.granted_before, s.stored_before))
        .collect();
    assert_eq!(
        stale,
        vec![("a2", Some(12), None), ("a3", Some(12), Some(12))]
    );
    assert_eq!(w.stale_unfenced(), 2);
    assert!(w.stale_fenced().is_empty(), "{w}");
    assert_eq!(w.stale_fenced_unseen(), 1);
    assert_eq!(w.fenced_refused, 1);
    // Stale writes fail the run unless something excuses them ...
    assert!(!h.check().is_clean());
    assert_eq!(w.stale_unexcused().len(), 2, "{w}");
    // ... here the data loss that took 10's lease (declared as a test
    // declares a restart: the new grant within a ttl of the healing, the
    // old holder's writes within 100 ms of that grant).
    h.data_lost(400_000, 450_000, ms(1000), ms(100));
    let w = h.check().writes;
    assert_eq!(w.stale_after_data_loss(), 2, "{w}");
    assert!(h.check().is_clean());
}

#[test]
fn a_fenced_store_that_takes_a_write_after_a_higher_token_is_flagged() {
    let h = History::new();
    attempt(&h, "b1", "k", "b", 12, 100);
    attempt(&h, "a1", "k", "a", 10, 200);
    // No grant recorded at all: the store's own order still shows a1 stale.
    h.stores("k", ids(&["b1", "a1"]), ids(&["b1", "a1"]));
    let report = h.check();
    let failed = report.writes.stale_fenced();
    assert_eq!(failed.len(), 1, "{report}");
    assert_eq!(failed[0].attempt.id, "a1");
    assert!(!report.is_clean());
    assert!(
        report
            .to_string()
            .contains("1 by the fenced store after it had seen a higher token"),
        "{report}"
    );
}

#[test]
fn writes_after_the_token_fired_and_writes_missing_from_the_unfenced_store_are_flagged() {
    let h = History::new();
    h.attempted(WriteAttempt {
        id: "a1".into(),
        key: "k".into(),
        holder: "a".into(),
        token: 1,
        at_us: 100,
        checked_us: 0,
        after_fire: true,
    });
    attempt(&h, "a2", "k", "a", 1, 200);
    h.stores("k", ids(&["a1"]), ids(&["a1"]));
    let w = h.check().writes;
    assert_eq!(w.after_fire.len(), 1);
    assert_eq!(w.after_fire[0].id, "a1");
    assert_eq!(w.unrecorded, ids(&["a2"]));
}

#[test]
fn the_server_expiry_is_the_last_write_of_that_lease_plus_its_ttl() {
    let h = History::new();
    h.granted("k", 5, 1_000, ms(1000));
    h.extended("k", 300_000, ms(1000));
    h.granted("k", 6, 2_000_000, ms(2000)); // a later holder
    h.extended("k", 2_500_000, ms(2000));
    assert_eq!(h.server_expiry("k", 5), Some(1_300_000));
    assert_eq!(h.server_expiry("k", 6), Some(4_500_000));
    assert_eq!(h.server_expiry("k", 7), None);
    assert_eq!(h.server_expiry("other", 5), None);
}

#[test]
fn a_write_known_within_a_span_bounds_the_expiry_on_both_sides() {
    let h = History::new();
    h.granted("k", 5, ServerTime::between(1_400, 1_900), ms(1000));
    // The server counts from its clock's whole millisecond: at the
    // earliest 1.000 ms; at the latest, from the end of the span.
    assert_eq!(h.server_expiry("k", 5), Some(1_001_000));
    assert_eq!(h.server_expiry_latest("k", 5), Some(1_001_900));
    h.extended("k", ServerTime::between(300_250, 300_800), ms(1000));
    assert_eq!(h.server_expiry("k", 5), Some(1_300_000));
    assert_eq!(h.server_expiry_latest("k", 5), Some(1_300_800));
    assert_eq!(h.server_expiry_latest("k", 6), None);
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

/// A hold of the permit `{sem}:permit:<i>` by `holder` with `token`,
/// requested and acquired at `from` ms and released at `to` ms after `t0`.
fn permit(h: &History, t0: Instant, i: u32, holder: &str, token: u64, from: u64, to: u64) {
    let id = h.acquired_permit(
        "sem",
        format!("{{sem}}:permit:{i}"),
        holder,
        token,
        t0 + ms(from),
        t0 + ms(from),
    );
    h.ended(id, HoldEnd::Released, t0 + ms(to));
}

#[test]
fn a_semaphore_held_up_to_its_limit_is_clean() {
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    permit(&h, t0, 0, "a", 1, 0, 300);
    permit(&h, t0, 1, "b", 2, 10, 200);
    permit(&h, t0, 2, "c", 3, 20, 400);
    permit(&h, t0, 1, "d", 4, 200, 500); // takes b's permit as b lets go
    permit(&h, t0, 0, "e", 5, 300, 600);
    let report = h.check();
    assert!(report.is_clean(), "{report}");
    assert!(report.excesses.is_empty());
    assert!(report.worst_excess().is_none());
    assert!(report.overlaps.is_empty());
}

#[test]
fn more_holders_than_the_limit_are_flagged_with_the_worst_excess_and_its_interval() {
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    permit(&h, t0, 0, "a", 1, 0, 300);
    permit(&h, t0, 1, "b", 2, 10, 300);
    permit(&h, t0, 2, "c", 3, 20, 300);
    permit(&h, t0, 3, "d", 4, 100, 150); // a fourth, from 100 to 150 ms
    permit(&h, t0, 4, "e", 5, 120, 130); // and a fifth, from 120 to 130 ms
    permit(&h, t0, 3, "f", 6, 200, 210); // a second excess, 10 ms
    let report = h.check();
    assert!(!report.is_clean());
    let found: Vec<(Duration, usize, Duration)> = report
        .excesses
        .iter()
        .map(|e| (e.from - t0, e.most, e.duration))
        .collect();
    assert_eq!(
        found,
        vec![(ms(100), 5, ms(50)), (ms(200), 4, ms(10))],
        "{report}"
    );
    let worst = report.worst_excess().expect("an excess");
    assert_eq!((worst.semaphore.as_str(), worst.limit), ("sem", 3));
    assert_eq!((worst.over(), worst.duration), (2, ms(50)));
    let mut holders: Vec<&str> = worst.holders.iter().map(|h| h.holder.as_str()).collect();
    holders.sort_unstable();
    assert_eq!(holders, ["a", "b", "c", "d", "e"]);
    assert!(
        report.overlaps.is_empty(),
        "distinct permit keys never overlap"
    );
    assert!(
        report
            .to_string()
            .contains("worst: 5 holders of 3 for 50ms"),
        "{report}"
    );
}

#[test]
fn a_semaphore_whose_limit_was_never_declared_is_judged_against_zero() {
    let (h, t0) = (History::new(), Instant::now());
    permit(&h, t0, 0, "a", 1, 0, 100);
    let report = h.check();
    assert_eq!(report.excesses.len(), 1, "{report}");
    assert_eq!(report.excesses[0].limit, 0);
}

#[test]
fn a_token_that_goes_down_across_permits_is_flagged_per_semaphore() {
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    permit(&h, t0, 0, "a", 10, 0, 100);
    permit(&h, t0, 1, "b", 9, 200, 300); // requested after a's grant: must exceed 10
    let report = h.check();
    assert_eq!(report.token_violations.len(), 1, "{report}");
    let v = &report.token_violations[0];
    assert_eq!(
        (
            v.key.as_str(),
            v.before.holder.as_str(),
            v.after.holder.as_str()
        ),
        ("sem", "a", "b")
    );
    assert!(report.excesses.is_empty() && report.overlaps.is_empty());

    // The same tokens on two semaphores are two counters: no violation.
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    h.semaphore("other", 3);
    permit(&h, t0, 0, "a", 10, 0, 100);
    let b = h.acquired_permit(
        "other",
        "{other}:permit:0",
        "b",
        9,
        t0 + ms(200),
        t0 + ms(200),
    );
    h.ended(b, HoldEnd::Released, t0 + ms(300));
    assert!(h.check().is_clean(), "{}", h.check());
}

#[test]
fn two_holders_of_one_permit_key_are_an_overlap_even_within_the_limit() {
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    permit(&h, t0, 0, "a", 1, 0, 300);
    permit(&h, t0, 0, "b", 2, 200, 400);
    let report = h.check();
    assert!(report.excesses.is_empty(), "two holders are within 3");
    assert_eq!(report.overlaps.len(), 1, "{report}");
    let o = &report.overlaps[0];
    assert_eq!(o.key, "{sem}:permit:0");
    assert_eq!(
        (
            o.earlier.holder.as_str(),
            o.later.holder.as_str(),
            o.duration
        ),
        ("a", "b", ms(100))
    );
    assert!(!report.is_clean());
}

#[test]
fn the_server_granting_a_lower_token_on_another_permit_of_the_semaphore_is_flagged() {
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    // The holds name the semaphore of each permit key.
    permit(&h, t0, 0, "a", 10, 0, 100);
    permit(&h, t0, 1, "b", 20, 0, 100);
    permit(&h, t0, 2, "c", 15, 0, 100);
    h.granted("{sem}:permit:0", 10, 1_000, ms(1000));
    h.granted("{sem}:permit:1", 20, 2_000, ms(1000));
    h.granted("{sem}:permit:0", 10, 2_500, ms(1000)); // a's refresh: same token
    h.extended("{sem}:permit:1", 2_600, ms(1000));
    h.granted("{sem}:permit:2", 15, 3_000, ms(1000)); // after 20: out of order
    let report = h.check();
    assert_eq!(report.grant_order.len(), 1, "{report}");
    let g = &report.grant_order[0];
    assert_eq!(
        (g.counter.as_str(), g.key.as_str(), g.token, g.at_us),
        ("sem", "{sem}:permit:2", 15, 3_000)
    );
    assert_eq!(
        (g.highest_before, g.highest_key.as_str()),
        (20, "{sem}:permit:1")
    );
    assert!(!report.is_clean());
    assert!(
        report.to_string().contains("1 grants out of order"),
        "{report}"
    );

    // In order, with refreshes and extensions between: clean.
    let (h, t0) = (History::new(), Instant::now());
    h.semaphore("sem", 3);
    permit(&h, t0, 0, "a", 10, 0, 100);
    permit(&h, t0, 1, "b", 20, 0, 100);
    h.granted("{sem}:permit:0", 10, 1_000, ms(1000));
    h.granted("{sem}:permit:1", 20, 2_000, ms(1000));
    h.granted("{sem}:permit:0", 10, 2_500, ms(1000));
    h.extended("{sem}:permit:0", 2_600, ms(1000));
    let report = h.check();
    assert!(report.is_clean(), "{report}");
}
