//! Durations and ttls: never a panic; an accepted ttl is in range, a whole
//! number of milliseconds, and reads back from its own display.
#![no_main]

use leasehold_core::{Ttl, parse_duration};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let duration = parse_duration(text);
    match Ttl::parse(text) {
        Ok(ttl) => {
            assert_eq!(duration.ok(), Some(ttl.get()));
            assert!((Ttl::MIN..=Ttl::MAX).contains(&ttl.get()));
            assert_eq!(ttl.get().subsec_nanos() % 1_000_000, 0);
            assert_eq!(Ttl::parse(&ttl.to_string()).ok(), Some(ttl));
        }
        Err(error) => assert!(!error.to_string().is_empty()),
    }
});
