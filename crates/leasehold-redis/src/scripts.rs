//! The Lua scripts, one per atomic operation, and how their calls are built.
//!
//! Each script is built once (its SHA-1 computed once) into a static and
//! called with `EVALSHA`; the connection loads it and retries when the
//! server answers `NOSCRIPT` (after a restart, a failover or `SCRIPT
//! FLUSH`), on the node that answered, so that a down node elsewhere in a
//! cluster does not fail the load. The calls here only name keys and
//! arguments, so every topology can send them over its own connection.

use std::sync::LazyLock;

use leasehold_core::{AcquireRequest, LeaseKey, RenewRequest};
use redis::{Cmd, Script};

/// A script's source and its SHA-1, computed once.
pub(crate) struct Lua {
    source: &'static str,
    script: Script,
}

impl Lua {
    fn new(source: &'static str) -> Self {
        Self {
            source,
            script: Script::new(source),
        }
    }

    /// The SHA-1 that `EVALSHA` names the script by.
    pub(crate) fn get_hash(&self) -> &str {
        self.script.get_hash()
    }
}

/// One script call: the script, its KEYS and its ARGV.
pub(crate) struct Call {
    script: &'static Lua,
    keys: Vec<String>,
    args: Vec<String>,
}

impl Call {
    fn new(script: &'static Lua) -> Self {
        Self {
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    fn key(&mut self, key: String) -> &mut Self {
        self.keys.push(key);
        self
    }

    fn arg(&mut self, arg: impl ToString) -> &mut Self {
        self.args.push(arg.to_string());
        self
    }

    /// The first key: in a cluster, the call goes to the node of its slot.
    pub(crate) fn first_key(&self) -> &str {
        self.keys.first().map_or("", String::as_str)
    }

    /// `EVALSHA sha numkeys KEYS… ARGV…`.
    pub(crate) fn evalsha(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// `SCRIPT LOAD source`, for a server that answered `NOSCRIPT`.
    pub(crate) fn load(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.script.source);
        cmd
    }
}

use crate::layout::KeyLayout;

/// Takes a free lease or refreshes our own; see `scripts/acquire.lua`.
pub(crate) static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/acquire.lua")));

/// Compare-and-pexpire for a batch of leases; see `scripts/renew.lua`.
pub(crate) static RENEW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/renew.lua")));

/// Compare-and-delete; see `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/release.lua")));

/// Compare-and-delete, then a grant to a local waiter; see `scripts/handover.lua`.
pub(crate) static HANDOVER: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/handover.lua")));

/// Reads a lease; see `scripts/inspect.lua`.
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/inspect.lua")));

/// The most renewals sent in one script call: bounds how long one call keeps
/// the (single-threaded) server busy and how large one request grows.
pub(crate) const RENEW_BATCH: usize = 1000;

/// `acquire.lua` for `request`.
pub(crate) fn acquire(layout: &KeyLayout, request: &AcquireRequest) -> Call {
    let mut call = Call::new(&ACQUIRE);
    call.key(layout.lease(&request.key))
        .key(layout.fence(&request.key))
        .arg(request.holder.to_hex())
        .arg(request.ttl.as_millis())
        .arg(request.label.as_deref().unwrap_or(""));
    call
}

/// `renew.lua` for a batch of at most [`RENEW_BATCH`] requests.
pub(crate) fn renew(layout: &KeyLayout, requests: &[RenewRequest]) -> Call {
    let mut call = Call::new(&RENEW);
    for request in requests {
        call.key(layout.lease(&request.key))
            .arg(request.holder.to_hex())
            .arg(request.ttl.as_millis());
    }
    call
}

/// `release.lua` for `key` and `holder_hex`.
///
/// With `notify`, the release is announced on `P:released`, with `SPUBLISH`
/// when `sharded` (a cluster) and `PUBLISH` otherwise, for waiters
/// subscribed to it; without, nothing is published.
pub(crate) fn release(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder_hex: &str,
    notify: bool,
    sharded: bool,
) -> Call {
    let mut call = Call::new(&RELEASE);
    call.key(layout.lease(key))
        .arg(holder_hex)
        .arg(if notify {
            layout.released(key)
        } else {
            String::new()
        })
        .arg(if sharded { "SPUBLISH" } else { "PUBLISH" });
    call
}

/// `handover.lua`: release `key` for `holder_hex` and grant it to `next`
/// unless the channel has more than `own` subscribers; `sharded` picks
/// `SHARDNUMSUB`/`SPUBLISH` (a cluster) over `NUMSUB`/`PUBLISH`.
pub(crate) fn handover(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder_hex: &str,
    own: u8,
    sharded: bool,
    next: &AcquireRequest,
) -> Call {
    let mut call = Call::new(&HANDOVER);
    let (count, publish) = if sharded {
        ("SHARDNUMSUB", "SPUBLISH")
    } else {
        ("NUMSUB", "PUBLISH")
    };
    call.key(layout.lease(key))
        .key(layout.fence(key))
        .arg(holder_hex)
        .arg(layout.released(key))
        .arg(own)
        .arg(count)
        .arg(publish)
        .arg(next.holder.to_hex())
        .arg(next.ttl.as_millis())
        .arg(next.label.as_deref().unwrap_or(""));
    call
}

/// `inspect.lua` for `key`.
pub(crate) fn inspect(layout: &KeyLayout, key: &LeaseKey) -> Call {
    let mut call = Call::new(&INSPECT);
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
            ("handover", include_str!("scripts/handover.lua")),
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
            HANDOVER.get_hash(),
        ];
        for (i, a) in hashes.iter().enumerate() {
            assert_eq!(a.len(), 40);
            assert!(hashes[i + 1..].iter().all(|b| a != b));
        }
    }
}
