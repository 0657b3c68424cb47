//! Every public constructor and parser, fed bad input: each gets the exact
//! error variant it documents, never a panic, and never echoes a password.

use std::time::Duration;

use leasehold::backend::{AcquireRequest, HolderId, parse_duration};
use leasehold::redis::{ConnectError, KeyLayout, RedisBackend};
use leasehold::{InputError, LeaseError, LeaseKey, LeaseOptions, Ttl};

/// The variant of a core error, by name.
fn core_variant(e: &InputError) -> &'static str {
    match e {
        InputError::InvalidKey { .. } => "InvalidKey",
        InputError::InvalidTtl { .. } => "InvalidTtl",
        InputError::InvalidDuration { .. } => "InvalidDuration",
        InputError::InvalidLabel { .. } => "InvalidLabel",
        InputError::InvalidHolderId => "InvalidHolderId",
        InputError::Entropy(_) => "Entropy",
        _ => "another variant",
    }
}

fn redis_variant(e: &ConnectError) -> String {
    match e {
        ConnectError::InvalidUrl { .. } => "InvalidUrl".to_owned(),
        ConnectError::InvalidConfig { field, .. } => format!("InvalidConfig({field})"),
        ConnectError::Connect { .. } => "Connect".to_owned(),
        _ => "another variant".to_owned(),
    }
}

fn outcome<T>(result: Result<T, InputError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(e) => core_variant(&e),
    }
}

#[test]
fn lease_keys() {
    let long = "k".repeat(LeaseKey::MAX_LEN);
    let too_long = "k".repeat(LeaseKey::MAX_LEN + 1);
    let table: &[(&str, &str)] = &[
        ("", "InvalidKey"),
        (&too_long, "InvalidKey"),
        ("line\nbreak", "InvalidKey"),
        ("tab\there", "InvalidKey"),
        ("nul\0", "InvalidKey"),
        ("del\u{7f}", "InvalidKey"),
        ("c1\u{85}control", "InvalidKey"),
        ("}starts-with-brace", "InvalidKey"),
        ("order:{42}:fence", "InvalidKey"),
        ("reports:fence", "ok"),
        ("a", "ok"),
        (&long, "ok"),
        ("ünïcode:{tag}", "ok"),
        ("{}", "ok"),
        ("with space", "ok"),
    ];
    for (input, expected) in table {
        assert_eq!(outcome(LeaseKey::new(input)), *expected, "{input:?}");
        assert_eq!(outcome(input.parse::<LeaseKey>()), *expected, "{input:?}");
        assert_eq!(outcome(LeaseKey::try_from(*input)), *expected, "{input:?}");
    }
    // A multi-byte key is measured in bytes, and the error cuts it safely.
    let wide = "é".repeat(257); // 514 bytes
    match LeaseKey::new(&wide) {
        Err(e @ InputError::InvalidKey { .. }) => assert!(e.to_string().len() < 300, "{e}"),
        other => panic!("expected InvalidKey, got {other:?}"),
    }
}

#[test]
fn durations_and_ttls() {
    let table: &[(&str, &str, &str)] = &[
        // input, parse_duration, Ttl::parse
        ("", "InvalidDuration", "InvalidDuration"),
        ("   ", "InvalidDuration", "InvalidDuration"),
        ("ten seconds", "InvalidDuration", "InvalidDuration"),
        ("5", "InvalidDuration", "InvalidDuration"),
        ("-1s", "InvalidDuration", "InvalidDuration"),
        ("1x", "InvalidDuration", "InvalidDuration"),
        (
            "99999999999999999999s",
            "InvalidDuration",
            "InvalidDuration",
        ),
        ("0s", "ok", "InvalidTtl"),
        ("99ms", "ok", "InvalidTtl"),
        ("24h 1ms", "ok", "InvalidTtl"),
        ("2days", "ok", "InvalidTtl"),
        ("1s 500us", "ok", "InvalidTtl"),
        ("100ms", "ok", "ok"),
        (" 30s ", "ok", "ok"),
        ("1m 30s", "ok", "ok"),
        ("24h", "ok", "ok"),
    ];
    for (input, duration, ttl) in table {
        assert_eq!(outcome(parse_duration(input)), *duration, "{input:?}");
        assert_eq!(outcome(Ttl::parse(input)), *ttl, "{input:?}");
        assert_eq!(outcome(input.parse::<Ttl>()), *ttl, "{input:?}");
    }
    for (d, expected) in [
        (Duration::ZERO, "InvalidTtl"),
        (Ttl::MIN - Duration::from_millis(1), "InvalidTtl"),
        (Ttl::MAX + Duration::from_millis(1), "InvalidTtl"),
        (Duration::MAX, "InvalidTtl"),
        (Duration::from_micros(1_000_500), "InvalidTtl"),
        (Duration::from_nanos(100_000_001), "InvalidTtl"),
        (Ttl::MIN, "ok"),
        (Ttl::MAX, "ok"),
    ] {
        assert_eq!(outcome(Ttl::new(d)), expected, "{d:?}");
        assert_eq!(outcome(Ttl::try_from(d)), expected, "{d:?}");
    }
}

#[test]
fn holder_ids() {
    let table: &[(&str, &str)] = &[
        ("", "InvalidHolderId"),
        (&"a".repeat(31), "InvalidHolderId"),
        (&"a".repeat(33), "InvalidHolderId"),
        (&"g".repeat(32), "InvalidHolderId"),
        (&"é".repeat(16), "InvalidHolderId"), // 32 bytes, not hex
        (&format!("{}+", "0".repeat(31)), "InvalidHolderId"),
        (&format!(" {}", "0".repeat(31)), "InvalidHolderId"),
        (&"0".repeat(32), "ok"),
        (&"aB".repeat(16), "ok"),
    ];
    for (input, expected) in table {
        assert_eq!(outcome(HolderId::from_hex(input)), *expected, "{input:?}");
    }
}

#[test]
fn labels() -> Result<(), InputError> {
    let request = || -> Result<AcquireRequest, InputError> {
        Ok(AcquireRequest::new(
            LeaseKey::new("k")?,
            HolderId::generate()?,
            Ttl::DEFAULT,
        ))
    };
    let table: &[(&str, &str)] = &[
        (&"l".repeat(257), "InvalidLabel"),
        ("line\nbreak", "InvalidLabel"),
        ("esc\u{1b}[31m", "InvalidLabel"),
        (&"l".repeat(256), "ok"),
        ("", "ok"),
        ("pod-7 (eu-west)", "ok"),
    ];
    for (input, expected) in table {
        assert_eq!(
            outcome(request()?.with_label(*input)),
            *expected,
            "{input:?}"
        );
    }
    Ok(())
}

#[test]
fn lease_options() -> Result<(), Box<dyn std::error::Error>> {
    let ttl = Ttl::parse("1s")?;
    let ms = Duration::from_millis;
    let table = [
        (
            LeaseOptions::builder()
                .ttl(ttl)
                .renew_interval(Duration::ZERO),
            false,
        ),
        (
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(Duration::ZERO),
            false,
        ),
        (
            LeaseOptions::builder().ttl(ttl).safety_margin(ms(1000)),
            false,
        ),
        (
            LeaseOptions::builder().ttl(ttl).safety_margin(ms(988)),
            false,
        ),
        (
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(Duration::MAX),
            false,
        ),
        (
            LeaseOptions::builder().ttl(ttl).renew_interval(ms(900)),
            false,
        ),
        (
            LeaseOptions::builder()
                .ttl(ttl)
                .renew_interval(Duration::MAX),
            false,
        ),
        (
            LeaseOptions::builder()
                .ttl(ttl)
                .safety_margin(ms(600))
                .renew_interval(ms(400)),
            false,
        ),
        (LeaseOptions::builder().ttl(ttl).renew_interval(ms(1)), true),
        (LeaseOptions::builder().ttl(ttl).safety_margin(ms(1)), true),
        (LeaseOptions::builder(), true),
        (LeaseOptions::builder().wait(Duration::MAX), true),
    ];
    for (i, (builder, ok)) in table.into_iter().enumerate() {
        match builder.build() {
            Ok(_) => assert!(ok, "row {i} was accepted"),
            Err(LeaseError::InvalidOptions { reason }) => {
                assert!(!ok, "row {i} was refused: {reason}");
                assert!(!reason.is_empty());
            }
            Err(other) => panic!("row {i}: expected InvalidOptions, got {other:?}"),
        }
    }
    Ok(())
}

#[test]
fn namespaces() {
    let table: &[(&str, &str)] = &[
        ("", "InvalidConfig(namespace)"),
        ("a{b", "InvalidConfig(namespace)"),
        ("a}b", "InvalidConfig(namespace)"),
        ("a b", "InvalidConfig(namespace)"),
        ("a\nb", "InvalidConfig(namespace)"),
        (
            &"n".repeat(KeyLayout::MAX_NAMESPACE_LEN + 1),
            "InvalidConfig(namespace)",
        ),
        (&"n".repeat(KeyLayout::MAX_NAMESPACE_LEN), "ok"),
        ("my-app:leases", "ok"),
    ];
    for (input, expected) in table {
        let got = KeyLayout::new(input).map_or_else(|e| redis_variant(&e), |_| "ok".to_owned());
        assert_eq!(got, *expected, "{input:?}");
    }
}

#[tokio::test]
async fn backend_urls_and_settings_are_refused_before_connecting() {
    // Port 1 on loopback is closed: any attempt to connect would be a
    // Connect error, so the variants below prove the check came first.
    let ms = Duration::from_millis;
    let cases: Vec<(leasehold::redis::RedisBackendBuilder, &str)> = vec![
        (RedisBackend::builder("http://127.0.0.1:1"), "InvalidUrl"),
        (RedisBackend::builder("not a url"), "InvalidUrl"),
        (RedisBackend::builder(""), "InvalidUrl"),
        (RedisBackend::builder("redis://"), "InvalidUrl"),
        (RedisBackend::builder("redis://:pw-hunter2@"), "InvalidUrl"),
        (
            RedisBackend::builder("redis://:pw-hunter2@127.0.0.1:99999"),
            "InvalidUrl",
        ),
        (RedisBackend::builder("redis://127.0.0.1:0"), "InvalidUrl"),
        (
            RedisBackend::builder("redis://127.0.0.1:1/not-a-db"),
            "InvalidUrl",
        ),
        (
            RedisBackend::builder("rediss://127.0.0.1:1/#insecure"),
            "InvalidUrl",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").op_timeout(Duration::ZERO),
            "InvalidConfig(op_timeout)",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").op_timeout(Duration::from_secs(601)),
            "InvalidConfig(op_timeout)",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").connect_timeout(Duration::MAX),
            "InvalidConfig(connect_timeout)",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").namespace("a{b}"),
            "InvalidConfig(namespace)",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").calls_in_flight(0),
            "InvalidConfig(calls_in_flight)",
        ),
        (
            RedisBackend::builder("redis://127.0.0.1:1").calls_in_flight(1025),
            "InvalidConfig(calls_in_flight)",
        ),
        (
            RedisBackend::builder("redis://:pw-hunter2@127.0.0.1:1").connect_timeout(ms(200)),
            "Connect",
        ),
    ];
    for (builder, expected) in cases {
        let shown_builder = format!("{builder:?}");
        assert!(!shown_builder.contains("hunter2"), "{shown_builder}");
        match builder.connect().await {
            Ok(_) => panic!("{shown_builder}: connected"),
            Err(e) => {
                assert_eq!(redis_variant(&e), expected, "{shown_builder}: {e}");
                let shown = format!("{e} | {e:?}");
                assert!(!shown.contains("hunter2"), "{shown}");
            }
        }
    }
}
