//! Property tests: the key layout always keeps a lease and its fencing
//! counter in one Redis Cluster slot, the parsers never panic, and the
//! timing arithmetic never overflows and always stops the holder before
//! its lease's validity ends.

use std::time::Duration;

use leasehold::backend::{HolderId, clock_drift, parse_duration, valid_until};
use leasehold::redis::KeyLayout;
use leasehold::{LeaseKey, LeaseOptions, Ttl};
use proptest::prelude::*;
use tokio::time::Instant;

/// CRC16/XMODEM, the checksum Redis Cluster uses for key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The Redis Cluster slot of a key, with the hash-tag rule of the cluster
/// specification, written here independently of the code under test.
fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16(hashed) % 16384
}

/// Whether `key` has a hash tag: a non-empty text between its first `{`
/// and the next `}`.
fn tagged(key: &str) -> bool {
    key.find('{')
        .and_then(|open| key[open + 1..].find('}'))
        .is_some_and(|close| close > 0)
}

/// Keys with braces in interesting places, and arbitrary text.
fn key_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9:{}]{1,24}",
        "[^\\p{Cc}]{1,40}",
        any::<String>(),
        (".{0,8}", ".{0,8}", ".{0,8}").prop_map(|(a, b, c)| format!("{a}{{{b}}}{c}")),
    ]
}

fn namespace_text() -> impl Strategy<Value = String> {
    prop_oneof!["[a-zA-Z0-9:_-]{1,64}", any::<String>()]
}

#[test]
fn the_crc16_matches_the_cluster_specification() {
    // The test vector of the Redis Cluster specification.
    assert_eq!(crc16(b"123456789"), 0x31C3);
}

proptest! {
    // 256 cases each by default; PROPTEST_CASES=100000 for a long run.

    #[test]
    fn a_lease_and_its_fence_share_a_slot(key in key_text(), ns in namespace_text()) {
        let (Ok(key), Ok(layout)) = (LeaseKey::new(&key), KeyLayout::new(&ns)) else {
            return Ok(());
        };
        let (lease, fence) = (layout.lease(&key), layout.fence(&key));
        prop_assert_eq!(slot(&lease), slot(&fence), "{} / {}", lease, fence);
        prop_assert!(lease.starts_with(layout.namespace()));
        prop_assert_eq!(fence, format!("{lease}:fence"));
        // A key with its own tag lands in the slot of data with that tag;
        // one without is wrapped in braces, so it is tagged by itself up to
        // its first '}' (never empty: a key cannot start with '}').
        let tag = key.hash_tag().unwrap_or_else(|| {
            key.as_str().split('}').next().unwrap_or(key.as_str())
        });
        prop_assert!(!tag.is_empty());
        prop_assert_eq!(slot(&lease), crc16(tag.as_bytes()) % 16384);
    }

    #[test]
    fn no_lease_is_stored_where_another_keeps_its_counter(key in key_text(), ns in namespace_text()) {
        let Ok(layout) = KeyLayout::new(&ns) else {
            return Ok(());
        };
        // The one way a lease could land on a counter: its key is another
        // key with ":fence" appended.
        let (Ok(first), Ok(second)) = (LeaseKey::new(&key), LeaseKey::new(format!("{key}:fence"))) else {
            return Ok(());
        };
        prop_assert_ne!(layout.lease(&second), layout.fence(&first));
    }

    #[test]
    fn keys_are_accepted_exactly_by_the_documented_rules(key in key_text()) {
        let names_a_counter = tagged(&key) && key.ends_with(":fence");
        let valid = !key.is_empty()
            && key.len() <= LeaseKey::MAX_LEN
            && !key.chars().any(char::is_control)
            && !key.starts_with('}')
            && !names_a_counter;
        match LeaseKey::new(&key) {
            Ok(k) => {
                prop_assert!(valid);
                prop_assert_eq!(k.as_str(), key.as_str());
            }
            Err(e) => {
                prop_assert!(!valid, "{:?} refused: {}", key, e);
                prop_assert!(e.to_string().chars().count() < 300);
            }
        }
    }

    #[test]
    fn parsers_never_panic(s in any::<String>()) {
        let _ = parse_duration(&s);
        let _ = Ttl::parse(&s);
        let _ = HolderId::from_hex(&s);
        let _ = leasehold::redis::redact(&s);
    }

    #[test]
    fn holder_ids_round_trip(bytes in "[0-9a-fA-F]{32}") {
        let id = HolderId::from_hex(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(id.to_hex(), bytes.to_ascii_lowercase());
        let shown = format!("{id:?}{id}");
        prop_assert!(!shown.contains(&id.to_hex()));
    }

    #[test]
    fn every_ttl_in_range_is_valid_and_its_validity_is_shorter(
        ms in 100u64..=86_400_000,
        offset_s in 0u64..10_000_000,
    ) {
        let ttl = Ttl::new(Duration::from_millis(ms)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(ttl.as_millis(), ms);
        prop_assert_eq!(Ttl::parse(&ttl.to_string()), Ok(ttl));
        let sent = Instant::now() + Duration::from_secs(offset_s);
        let until = valid_until(sent, ttl);
        prop_assert!(until > sent);
        prop_assert!(until < sent + ttl.get());
        prop_assert_eq!(sent + ttl.get() - until, clock_drift(ttl.get()));
        // The default options fit every ttl.
        let options = LeaseOptions::with_ttl(ttl);
        prop_assert!(options.renew_interval() < options.deadline_after());
    }

    #[test]
    fn any_options_the_builder_accepts_stop_the_holder_in_time(
        ms in 100u64..=86_400_000,
        renew_ns in any::<u64>(),
        margin_ns in any::<u64>(),
        huge in any::<bool>(),
    ) {
        let ttl = Ttl::new(Duration::from_millis(ms)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Arbitrary durations, up to Duration::MAX.
        let d = |ns: u64| if huge { Duration::new(ns, 0) } else { Duration::from_nanos(ns % (ms * 2_000_000)) };
        let built = LeaseOptions::builder()
            .ttl(ttl)
            .renew_interval(d(renew_ns))
            .safety_margin(d(margin_ns))
            .build();
        let Ok(options) = built else { return Ok(()) };
        let sent = Instant::now();
        let deadline = sent + options.deadline_after();
        prop_assert!(!options.renew_interval().is_zero());
        prop_assert!(!options.safety_margin().is_zero());
        prop_assert!(options.renew_interval() < options.deadline_after());
        prop_assert!(deadline > sent);
        prop_assert!(deadline < valid_until(sent, ttl));
        prop_assert_eq!(valid_until(sent, ttl) - deadline, options.safety_margin());
    }
}
