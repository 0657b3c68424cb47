//! Lease keys and namespaces: never a panic; an accepted key keeps its
//! lease and fencing counter under one hash tag in every namespace, and no
//! other accepted key is stored at its counter.
#![no_main]

use leasehold_core::LeaseKey;
use leasehold_redis::KeyLayout;
use libfuzzer_sys::fuzz_target;

/// The text Redis Cluster hashes for `key`.
fn hashed(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}').filter(|&c| c > 0).map(|c| &rest[..c])
        })
        .unwrap_or(key)
}

fuzz_target!(|input: (&str, &str)| {
    let (key, namespace) = input;
    let Ok(key) = LeaseKey::new(key) else { return };
    assert!(!key.as_str().is_empty() && key.as_str().len() <= LeaseKey::MAX_LEN);
    if let Some(tag) = key.hash_tag() {
        assert!(!tag.is_empty() && key.as_str().contains(tag));
    }
    let Ok(layout) = KeyLayout::new(namespace) else { return };
    let (lease, fence) = (layout.lease(&key), layout.fence(&key));
    assert_eq!(hashed(&lease), hashed(&fence), "{lease} / {fence}");
    // No accepted key is stored where this one keeps its counter.
    if let Ok(next) = LeaseKey::new(format!("{}:fence", key.as_str())) {
        assert_ne!(layout.lease(&next), fence, "{next}");
    }
});
