//! Holder ids: never a panic; only 32 hex digits are accepted, and they
//! read back in lowercase.
#![no_main]

use leasehold_core::HolderId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    match HolderId::from_hex(text) {
        Ok(id) => {
            assert!(text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()));
            assert_eq!(id.to_hex(), text.to_ascii_lowercase());
            assert!(!format!("{id:?} {id}").contains(&id.to_hex()));
        }
        Err(_) => assert!(text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit())),
    }
});
