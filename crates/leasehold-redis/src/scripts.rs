//! The Lua scripts, one per atomic operation, and how their calls are built.
//!
//! Each script is built once (its SHA-1 computed once) into a static and
//! called with `EVALSHA`; [`redis::ScriptInvocation::invoke_async`] loads it
//! and retries when the server answers `NOSCRIPT` (after a restart, a
//! failover or `SCRIPT FLUSH`). The calls here only name keys and
//! arguments, so every topology can send them over its own connection.

use std::sync::LazyLock;

use leasehold_core::{AcquireRequest, LeaseKey, RenewRequest};
use redis::{Script, ScriptInvocation};

use crate::layout::KeyLayout;

/// Takes a free lease or refreshes our own; see `scripts/acquire.lua`.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/acquire.lua")));

/// Compare-and-pexpire for a batch of leases; see `scripts/renew.lua`.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/renew.lua")));

/// Compare-and-delete; see `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/release.lua")));

/// Reads a lease; see `scripts/inspect.lua`.
pub(crate) static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("scripts/inspect.lua")));

/// The most renewals sent in one script call: bounds how long one call keeps
/// the (single-threaded) server busy and how large one request grows.
pub(crate) const RENEW_BATCH: usize = 1000;

/// `acquire.lua` for `request`.
pub(crate) fn acquire(layout: &KeyLayout, request: &AcquireRequest) -> ScriptInvocation<'static> {
    let mut call = ACQUIRE.prepare_invoke();
    call.key(layout.lease(&request.key))
        .key(layout.fence(&request.key))
        .arg(request.holder.to_hex())
        .arg(request.ttl.as_millis())
        .arg(request.label.as_deref().unwrap_or(""));
    call
}

/// `renew.lua` for a batch of at most [`RENEW_BATCH`] requests.
pub(crate) fn renew(layout: &KeyLayout, requests: &[RenewRequest]) -> ScriptInvocation<'static> {
    let mut call = RENEW.prepare_invoke();
    for request in requests {
        call.key(layout.lease(&request.key))
            .arg(request.holder.to_hex())
            .arg(request.ttl.as_millis());
    }
    call
}

/// `release.lua` for `key` and `holder_hex`.
///
/// The release is announced on `P:released` with `PUBLISH`, or `SPUBLISH`
/// when `sharded` (Redis Cluster: the notice stays on the lease's shard).
pub(crate) fn release(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder_hex: &str,
    sharded: bool,
) -> ScriptInvocation<'static> {
    let mut call = RELEASE.prepare_invoke();
    call.key(layout.lease(key))
        .arg(holder_hex)
        .arg(layout.released(key))
        .arg(if sharded { "SPUBLISH" } else { "PUBLISH" });
    call
}

/// `inspect.lua` for `key`.
pub(crate) fn inspect(layout: &KeyLayout, key: &LeaseKey) -> ScriptInvocation<'static> {
    let mut call = INSPECT.prepare_invoke();
    call.key(layout.lease(key));
    call
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_names_its_keys_and_arguments() {
        for (name, source) in [
            ("acquire", include_str!("scripts/acquire.lua")),
            ("renew", include_str!("scripts/renew.lua")),
            ("release", include_str!("scripts/release.lua")),
            ("inspect", include_str!("scripts/inspect.lua")),
        ] {
            assert!(source.starts_with(&format!("-- {name}.lua:")), "{name}");
            assert!(source.contains("-- KEYS["), "{name} names its KEYS");
            assert!(source.contains("ARGV"), "{name} names its ARGV");
        }
    }

    #[test]
    fn scripts_have_distinct_hashes() {
        let hashes = [
            ACQUIRE.get_hash(),
            RENEW.get_hash(),
            RELEASE.get_hash(),
            INSPECT.get_hash(),
        ];
        for (i, a) in hashes.iter().enumerate() {
            assert_eq!(a.len(), 40);
            assert!(hashes[i + 1..].iter().all(|b| a != b));
        }
    }
}
