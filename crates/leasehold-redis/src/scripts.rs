//! The Lua scripts, one per atomic operation, and how their calls are built.
//!
//! Each script is built once (its SHA-1 computed once) into a static and
//! called with `EVALSHA`; when the server answers `NOSCRIPT` (after a
//! restart, a failover or `SCRIPT FLUSH`) the connection loads the call's
//! script, once for all the calls of that script that met it there
//! (`loads.rs`), on the node that answered, so that a down node elsewhere
//! in a cluster does not fail the load, and sends the call again. The calls here only name keys and
//! arguments, so every topology can send them over its own connection.
//!
//! Every `ttl` argument a script names is the key's expiry: the lease's ttl
//! plus its lock-delay (the ttl alone without one, so a lease without a
//! lock-delay sends exactly what it always did). The holder's validity is
//! computed from the ttl by the client and never reaches a script.

use std::sync::LazyLock;

use leasehold_core::{
    AcquireRequest, FencingToken, HolderId, JobName, LeaseKey, PermitLimit, RenewRequest,
    RerunRequest, TickRequest,
};
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

/// One script call, encoded once: `EVALSHA sha numkeys KEYS… ARGV…`.
///
/// Keys and arguments are written straight into the command's buffer (a
/// lease key from its parts, a holder id as hex on the stack, numbers by
/// `itoa`): a renewal batch of a thousand leases costs no allocation per
/// lease.
pub(crate) struct Call {
    cmd: Cmd,
    /// The script it runs: the one loaded again if the server forgot it.
    script: &'static Lua,
}

impl Call {
    fn new(script: &'static Lua, keys: usize) -> Self {
        Self::with_capacity(script, keys, 0, 0)
    }

    /// A call whose buffers are sized up front for `args` arguments of
    /// `bytes` bytes in all, so a large batch is not copied as it grows.
    fn with_capacity(script: &'static Lua, keys: usize, args: usize, bytes: usize) -> Self {
        let mut cmd = Cmd::with_capacity(3 + args, 64 + bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self { cmd, script }
    }

    /// The script the call runs.
    pub(crate) fn script(&self) -> &'static Lua {
        self.script
    }

    /// The first key: in a cluster, the call goes to the node of its slot.
    pub(crate) fn first_key(&self) -> &[u8] {
        // EVALSHA, the hash, the key count, then the keys.
        match self.cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => b"",
        }
    }

    /// `EVALSHA sha numkeys KEYS… ARGV…`.
    pub(crate) fn evalsha(&self) -> &Cmd {
        &self.cmd
    }
}

use crate::layout::KeyLayout;

/// Takes a free lease or refreshes our own; see `scripts/acquire.lua`,
/// which ends with the grant of `scripts/grant.lua`, sent in front of it.
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/acquire.lua")
    ))
});

/// Takes one of a semaphore's permits or refreshes our own; see
/// `scripts/permit.lua`, with `scripts/grant.lua` in front, as for
/// [`ACQUIRE`].
pub(crate) static PERMIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/permit.lua")
    ))
});

/// Takes or refreshes a reader's hold on a read-write lease; see
/// `scripts/read.lua`, with `scripts/grant.lua` in front, as for
/// [`ACQUIRE`].
pub(crate) static READ: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/read.lua")
    ))
});

/// Takes or refreshes the writer's hold on a read-write lease, or leaves
/// its intent; see `scripts/write.lua`, with `scripts/grant.lua` in front,
/// as for [`ACQUIRE`].
pub(crate) static WRITE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/write.lua")
    ))
});

/// [`ACQUIRE`] for a batch of leases in one slot; see
/// `scripts/acquire_many.lua`, with `scripts/grant.lua` in front.
pub(crate) static ACQUIRE_MANY: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/acquire_many.lua")
    ))
});

/// [`RELEASE`] for a batch of leases in one slot; see
/// `scripts/release_many.lua`.
pub(crate) static RELEASE_MANY: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/release_many.lua")));

/// Compare-and-pexpire for a batch of leases; see `scripts/renew.lua`.
pub(crate) static RENEW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/renew.lua")));

/// Compare-and-delete (or keep, under a minimum hold); see
/// `scripts/release.lua`.
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/release.lua")));

/// Compare-and-delete, then a grant to a local waiter; see
/// `scripts/handover.lua`, with `scripts/grant.lua` in front, as for
/// [`ACQUIRE`].
pub(crate) static HANDOVER: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/handover.lua")
    ))
});

/// Reads a lease; see `scripts/inspect.lua`.
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/inspect.lua")));

/// Withdraws a waiting writer's intent if it is still that writer's; see
/// `scripts/withdraw.lua`.
pub(crate) static WITHDRAW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/withdraw.lua")));

/// Reads a read-write lease's writer, readers and waiting writer at one
/// instant; see `scripts/inspect_rw.lua`.
pub(crate) static INSPECT_RW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/inspect_rw.lua")));

/// Decides a tick of a scheduled job on the server's clock and starts its
/// run; see `scripts/tick.lua`, with `scripts/grant.lua` in front, as for
/// [`ACQUIRE`].
pub(crate) static TICK: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/tick.lua")
    ))
});

/// Records a job's run as completed and releases its lease, fenced by its
/// token; see `scripts/tick_complete.lua`.
pub(crate) static TICK_COMPLETE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/tick_complete.lua")));

/// Settles a job's abandoned run, and re-runs its newest decided tick; see
/// `scripts/tick_rerun.lua`, with `scripts/grant.lua` in front, as for
/// [`ACQUIRE`].
pub(crate) static TICK_RERUN: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/tick_rerun.lua")
    ))
});

/// Reads a job's record and its run lease at one instant; see
/// `scripts/tick_record.lua`.
pub(crate) static TICK_RECORD: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/tick_record.lua")));

/// Writes a value under a fenced resource, or seals it, when the writer's
/// fencing token is at least the resource's fence; see
/// `scripts/fenced_write.lua`.
pub(crate) static FENCED_WRITE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/fenced_write.lua")));

/// Reads a fenced resource's value, fence and time to live; see
/// `scripts/fence_read.lua`.
pub(crate) static FENCE_READ: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/fence_read.lua")));

/// Every script, for loading them all on a server before the first call
/// (see `RedisBackendBuilder::connect`).
pub(crate) fn all() -> [&'static Lua; 21] {
    [
        &ACQUIRE,
        &ACQUIRE_MANY,
        &PERMIT,
        &READ,
        &WRITE,
        &RENEW,
        &RELEASE,
        &RELEASE_MANY,
        &HANDOVER,
        &INSPECT,
        &WITHDRAW,
        &INSPECT_RW,
        &FAIR,
        &FAIR_LEAVE,
        &RELEASE_FAIR,
        &TICK,
        &TICK_COMPLETE,
        &TICK_RERUN,
        &TICK_RECORD,
        &FENCED_WRITE,
        &FENCE_READ,
    ]
}

/// `SCRIPT LOAD` of `script`.
pub(crate) fn load(script: &Lua) -> Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(script.source);
    cmd
}

/// The most renewals sent in one script call: bounds how long one call keeps
/// the (single-threaded) server busy and how large one request grows.
pub(crate) const RENEW_BATCH: usize = 1000;

/// The most acquisitions, or releases, sent in one script call when they
/// are in flight together: a grant costs the server several times what a
/// renewal does, so a batch is kept shorter than [`RENEW_BATCH`] to bound
/// how long it keeps the server from a renewal.
pub(crate) const WRITE_BATCH: usize = 256;

/// The length of `key`'s Redis key (`P`): the namespace, braces, the key.
/// Its counter's and channel's (a permit's are its semaphore's) are no
/// longer, before their suffix.
fn lease_len(layout: &KeyLayout, key: &LeaseKey) -> usize {
    layout.namespace().len() + key.as_str().len() + 3
}

/// `acquire.lua` for `request`, sent over a connection that tracks (client
/// tracking on) when `tracked`: only there is a granted lease read again
/// after it is written, to track it.
pub(crate) fn acquire(layout: &KeyLayout, request: &AcquireRequest, tracked: bool) -> Call {
    acquire_many(layout, std::slice::from_ref(request), tracked)
}

/// `acquire_many.lua` for a batch of at most [`WRITE_BATCH`] requests, all
/// in one cluster slot; one request makes exactly the call of [`acquire`].
///
/// A request with a minimum hold goes alone (the backend never batches it):
/// `acquire.lua` marks its grant, `acquire_many.lua` has no room for the
/// mark. In a batch its minimum would be dropped, so none is sent there.
pub(crate) fn acquire_many(layout: &KeyLayout, requests: &[AcquireRequest], tracked: bool) -> Call {
    // Sized up front, so that the command is not copied as it grows: per
    // lease two keys, a holder id, a ttl (at most 20 digits), the label;
    // then the flag.
    let bytes: usize = requests
        .iter()
        .map(|r| {
            2 * lease_len(layout, &r.key)
                + ":fence".len()
                + 32
                + 20
                + r.label.as_deref().map_or(0, str::len)
        })
        .sum::<usize>()
        + 1;
    // One lease: acquire.lua itself, which sends exactly what it always did.
    let script = if requests.len() == 1 {
        &*ACQUIRE
    } else {
        &*ACQUIRE_MANY
    };
    let mut call = Call::with_capacity(script, 2 * requests.len(), 5 * requests.len() + 2, bytes);
    let mut key = Vec::with_capacity(64);
    for request in requests {
        key.clear();
        layout.write_lease(&request.key, &mut key);
        call.cmd.arg(&key[..]);
        key.clear();
        // A permit key's counter is its semaphore's.
        layout.write_counted(&request.key, &mut key);
        key.extend_from_slice(b":fence");
        call.cmd.arg(&key[..]);
    }
    for request in requests {
        call.cmd
            .arg(&request.holder.to_hex_bytes()[..])
            .arg(request.lock_delay.expiry_millis(request.ttl))
            .arg(request.label.as_deref().unwrap_or(""));
    }
    call.cmd.arg(if tracked { "1" } else { "0" });
    // A lone acquisition (acquire.lua) sends its minimum hold ('0': none);
    // a batch (acquire_many.lua) never has one (see the backend).
    if let [request] = requests {
        call.cmd.arg(request.hold_at_least_millis().unwrap_or(0));
    }
    call.cmd.arg(layout.fence_retention_ms());
    call
}

/// Takes or keeps a place in a lease's fair queue, and the lease when it is
/// free and the place is first; see `scripts/fair.lua`, with
/// `scripts/grant.lua` in front, as for [`ACQUIRE`].
pub(crate) static FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/fair.lua")
    ))
});

/// Leaves a place in a lease's fair queue; see `scripts/fair_leave.lua`.
pub(crate) static FAIR_LEAVE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("scripts/fair_leave.lua")));

/// Releases a lease taken in fair mode, handing it to the head of its fair
/// queue when that waiter asked; see `scripts/release_fair.lua`, with
/// `scripts/grant.lua` in front, as for [`ACQUIRE`].
pub(crate) static RELEASE_FAIR: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("scripts/grant.lua"),
        include_str!("scripts/release_fair.lua")
    ))
});

/// Appends the lease `P` of `key` and its fencing counter `P:fence` (a
/// permit's counter is its semaphore's), and returns the counted prefix,
/// to which a caller appends `:released` for the lease's channel.
fn lease_and_fence(layout: &KeyLayout, key: &LeaseKey, call: &mut Call) -> Vec<u8> {
    let mut name = Vec::with_capacity(64);
    layout.write_lease(key, &mut name);
    call.cmd.arg(&name[..]);
    name.clear();
    layout.write_counted(key, &mut name);
    let stem = name.len();
    name.extend_from_slice(b":fence");
    call.cmd.arg(&name[..]);
    name.truncate(stem);
    name
}

/// Appends the keys of `key`'s fair queue (`P:fair`, `P:fair-places`,
/// `P:fair-asks`).
fn fair_keys(layout: &KeyLayout, key: &LeaseKey, call: &mut Call) {
    let mut queue = Vec::with_capacity(64);
    layout.write_lease(key, &mut queue);
    queue.extend_from_slice(b":fair");
    call.cmd.arg(&queue[..]);
    let stem = queue.len();
    queue.extend_from_slice(b"-places");
    call.cmd.arg(&queue[..]);
    queue.truncate(stem);
    queue.extend_from_slice(b"-asks");
    call.cmd.arg(&queue[..]);
}

/// `fair.lua` for `request`, its place to live `place_ttl` milliseconds;
/// a lease handed to it is kept `handover.0` from the call (0: none asked)
/// and announced on the release channel with `:<handover.1>` appended (the
/// waiting process's name; empty: the release channel itself).
pub(crate) fn fair(
    layout: &KeyLayout,
    request: &AcquireRequest,
    tracked: bool,
    place_ttl: u64,
    handover: (u64, &[u8]),
) -> Call {
    // The queue's keys are named by the script, from the lease's (see
    // fair.lua's header for why).
    let mut call = Call::new(&FAIR, 2);
    lease_and_fence(layout, &request.key, &mut call);
    call.cmd
        .arg(&request.holder.to_hex_bytes()[..])
        .arg(request.lock_delay.expiry_millis(request.ttl))
        .arg(request.label.as_deref().unwrap_or(""))
        .arg(if tracked { "1" } else { "0" })
        .arg(place_ttl)
        .arg(handover.0)
        .arg(handover.1)
        .arg(layout.fence_retention_ms());
    call
}

/// `release_fair.lua` for `holder`'s lease `key`; `channel` false where no
/// one can listen for notices (then nothing is handed over either).
pub(crate) fn release_fair(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder: &HolderId,
    channel: bool,
    sharded: bool,
) -> Call {
    // As in `fair`: the script names the queue's keys.
    let mut call = Call::new(&RELEASE_FAIR, 2);
    let mut lease = lease_and_fence(layout, key, &mut call);
    lease.extend_from_slice(b":released");
    call.cmd
        .arg(&holder.to_hex_bytes()[..])
        .arg(if channel { &lease[..] } else { &b""[..] })
        .arg(if sharded { "SPUBLISH" } else { "PUBLISH" })
        .arg(layout.fence_retention_ms());
    call
}

/// `fair_leave.lua` for `holder`'s place in `key`'s fair queue.
pub(crate) fn fair_leave(layout: &KeyLayout, key: &LeaseKey, holder: &HolderId) -> Call {
    let mut call = Call::new(&FAIR_LEAVE, 3);
    fair_keys(layout, key, &mut call);
    call.cmd.arg(&holder.to_hex_bytes()[..]);
    call
}

/// `renew.lua` for a batch of at most [`RENEW_BATCH`] requests, over a
/// connection that tracks when `tracked`: only there is the batch read
/// again after it is renewed, to track it.
///
/// A batch whose leases share one ttl (nearly every batch: a manager's
/// leases mostly share their options) sends it once; a mixed batch sends an
/// empty shared ttl and then one per lease. The ttl sent is the key's
/// expiry, ttl + lock-delay: leases that differ in either differ here. Each
/// holder id goes with the `:` that follows it in the lease's value, so that
/// the script recognises its lease with one comparison; the batch says
/// whether a key of it may be a reader's, so that no other batch looks.
pub(crate) fn renew(layout: &KeyLayout, requests: &[RenewRequest], tracked: bool) -> Call {
    let expiry = |r: &RenewRequest| r.lock_delay.expiry_millis(r.ttl);
    let shared = requests
        .first()
        .map(expiry)
        .filter(|ms| requests.iter().all(|r| expiry(r) == *ms));
    let per_lease = if shared.is_some() { 0 } else { requests.len() };
    // Per lease: a key (namespace, braces, the key), a holder id and its
    // `:` (33 bytes), and in a mixed batch a ttl (at most 8 digits).
    let bytes: usize = requests
        .iter()
        .map(|r| layout.namespace().len() + r.key.as_str().len() + 3 + 33)
        .sum::<usize>()
        + 8 * (per_lease + 1)
        + 2;
    let args = 2 * requests.len() + 3 + per_lease;
    let mut call = Call::with_capacity(&RENEW, requests.len(), args, bytes);
    // One scratch buffer for every key of the batch.
    let mut key = Vec::with_capacity(64);
    let mut readers = false;
    for request in requests {
        key.clear();
        layout.write_lease(&request.key, &mut key);
        readers |= may_be_reader(&key);
        call.cmd.arg(&key[..]);
    }
    match shared {
        Some(ms) => call.cmd.arg(ms),
        None => call.cmd.arg(""),
    };
    let mut holder = [b':'; 33];
    for request in requests {
        holder[..32].copy_from_slice(&request.holder.to_hex_bytes());
        call.cmd.arg(&holder[..]);
    }
    if shared.is_none() {
        for request in requests {
            call.cmd.arg(expiry(request));
        }
    }
    call.cmd
        .arg(if readers { "1" } else { "0" })
        .arg(if tracked { "1" } else { "0" });
    call
}

/// Whether `renew.lua` takes the Redis key `key` for a reader's of a
/// read-write lease (`P:read:` and 32 more bytes), whose renewal lengthens
/// the lease's reader index too: the script's own test, byte for byte.
fn may_be_reader(key: &[u8]) -> bool {
    key.len() >= 38 && key[key.len() - 38..key.len() - 32] == *b":read:"
}

/// One release of a [`release_many`] batch: the lease, its holder, and
/// how many of its channel's subscribers are the backend's own connection.
#[derive(Debug, Clone)]
pub(crate) struct Release {
    pub(crate) key: LeaseKey,
    pub(crate) holder: HolderId,
    pub(crate) own: u8,
    /// The lease may carry a minimum hold's mark (it was acquired with a
    /// minimum): its release goes alone, by `release.lua`, told to read the
    /// mark. `release_many.lua` reads none, so a release with `hold` is
    /// never put in a batch (the backend sends it on its own).
    pub(crate) hold: bool,
}

/// `release.lua` for `key` and `holder`: the one-lease form of
/// [`release_many`], through which the backend sends every release.
///
/// With `notify`, the release is announced on `P:released`, with `SPUBLISH`
/// when `sharded` (a cluster) and `PUBLISH` otherwise, for waiters
/// subscribed to it; without, nothing is published.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn release(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder: &HolderId,
    notify: bool,
    sharded: bool,
    own: u8,
    hold: bool,
) -> Call {
    let one = Release {
        key: key.clone(),
        holder: *holder,
        own,
        hold,
    };
    release_many(layout, std::slice::from_ref(&one), notify, sharded, false)
}

/// `release_many.lua` for a batch of at most [`WRITE_BATCH`] releases, all
/// in one cluster slot, announced as [`release`] says, over a connection
/// that tracks when `tracked` (a batch then reads its leases with a write
/// command: see `release_many.lua`); one release makes exactly the call of
/// [`release`].
pub(crate) fn release_many(
    layout: &KeyLayout,
    releases: &[Release],
    notify: bool,
    sharded: bool,
    tracked: bool,
) -> Call {
    // Sized up front, as for acquire: per lease a key, a holder id, a
    // channel, the publish command, `own`.
    let bytes: usize = releases
        .iter()
        .map(|r| 2 * lease_len(layout, &r.key) + ":released".len() + 32 + "SPUBLISH".len() + 1)
        .sum();
    // One release: release.lua itself, which sends exactly what it always did.
    let script = if releases.len() == 1 {
        &*RELEASE
    } else {
        &*RELEASE_MANY
    };
    let mut call = Call::with_capacity(script, releases.len(), 5 * releases.len() + 1, bytes);
    let mut lease = Vec::with_capacity(64);
    for release in releases {
        lease.clear();
        layout.write_lease(&release.key, &mut lease);
        call.cmd.arg(&lease[..]);
    }
    for release in releases {
        call.cmd.arg(&release.holder.to_hex_bytes()[..]);
        if notify {
            // A permit's release is announced to its semaphore's waiters.
            lease.clear();
            layout.write_counted(&release.key, &mut lease);
            lease.extend_from_slice(b":released");
            call.cmd.arg(&lease[..]);
        } else {
            call.cmd.arg("");
        }
        call.cmd
            .arg(if sharded { "SPUBLISH" } else { "PUBLISH" })
            .arg(release.own);
    }
    match releases {
        // release.lua reads the minimum hold's mark when told to; told
        // nothing, it reads none, and its arguments stay four (a fifth
        // would cost the server a larger table for each call's ARGV).
        [one] if one.hold => {
            call.cmd.arg("1");
        }
        [_] => {}
        _ => {
            call.cmd.arg(if tracked { "1" } else { "0" });
        }
    }
    call
}

/// `handover.lua`: release `key` for `holder` and grant it to `next`
/// unless the channel has more than `own` subscribers; `sharded` picks
/// `SHARDNUMSUB`/`SPUBLISH` (a cluster) over `NUMSUB`/`PUBLISH`.
pub(crate) fn handover(
    layout: &KeyLayout,
    key: &LeaseKey,
    holder: &HolderId,
    own: u8,
    sharded: bool,
    next: &AcquireRequest,
) -> Call {
    let mut call = Call::new(&HANDOVER, 2);
    let (count, publish) = if sharded {
        ("SHARDNUMSUB", "SPUBLISH")
    } else {
        ("NUMSUB", "PUBLISH")
    };
    // A permit's counter and channel are its semaphore's.
    let mut lease = lease_and_fence(layout, key, &mut call);
    lease.extend_from_slice(b":released");
    call.cmd
        .arg(&holder.to_hex_bytes()[..])
        .arg(&lease[..])
        .arg(own)
        .arg(count)
        .arg(publish)
        .arg(&next.holder.to_hex_bytes()[..])
        .arg(next.lock_delay.expiry_millis(next.ttl))
        .arg(next.label.as_deref().unwrap_or(""))
        .arg(next.hold_at_least_millis().unwrap_or(0))
        .arg(layout.fence_retention_ms());
    call
}

/// `permit.lua` for one of the `limit` permits of the semaphore
/// `request.key`, sending the keys of `max(limit, check)` permits: `check`
/// is a larger limit the semaphore is stored with, whose permits the script
/// must see to tell whether any is held.
///
/// # Errors
///
/// The refusal of [`LeaseKey::permit`] when the semaphore key leaves no
/// room for its permits' keys.
pub(crate) fn permit(
    layout: &KeyLayout,
    request: &AcquireRequest,
    limit: PermitLimit,
    check: u32,
) -> Result<Call, leasehold_core::InputError> {
    let sent = limit.get().max(check);
    let keys = usize::try_from(sent).map_or(usize::MAX, |n| n.saturating_add(2));
    let mut call = Call::new(&PERMIT, keys);
    let mut key = Vec::with_capacity(64);
    layout.write_lease(&request.key, &mut key);
    key.extend_from_slice(b":permits");
    call.cmd.arg(&key[..]);
    key.clear();
    layout.write_counted(&request.key, &mut key);
    key.extend_from_slice(b":fence");
    call.cmd.arg(&key[..]);
    for i in 0..sent {
        key.clear();
        layout.write_lease(&request.key.permit(i)?, &mut key);
        call.cmd.arg(&key[..]);
    }
    call.cmd
        .arg(&request.holder.to_hex_bytes()[..])
        .arg(request.lock_delay.expiry_millis(request.ttl))
        .arg(request.label.as_deref().unwrap_or(""))
        .arg(limit.get())
        .arg(layout.fence_retention_ms());
    Ok(call)
}

/// `read.lua` for `request` on the reader key `reader`
/// (`request.key.reader_key(&request.holder)`).
pub(crate) fn read(layout: &KeyLayout, request: &AcquireRequest, reader: &LeaseKey) -> Call {
    let mut call = Call::new(&READ, 5);
    let mut key = Vec::with_capacity(64);
    layout.write_lease(reader, &mut key);
    call.cmd.arg(&key[..]);
    key.clear();
    layout.write_lease(&request.key, &mut key);
    let stem = key.len();
    for suffix in [&b":write"[..], b":write-wanted", b":readers"] {
        key.truncate(stem);
        key.extend_from_slice(suffix);
        call.cmd.arg(&key[..]);
    }
    key.clear();
    layout.write_counted(&request.key, &mut key);
    key.extend_from_slice(b":fence");
    call.cmd
        .arg(&key[..])
        .arg(&request.holder.to_hex_bytes()[..])
        .arg(request.lock_delay.expiry_millis(request.ttl))
        .arg(request.label.as_deref().unwrap_or(""))
        .arg(layout.fence_retention_ms());
    call
}

/// `write.lua` for `request`.
pub(crate) fn write(layout: &KeyLayout, request: &AcquireRequest) -> Call {
    let mut call = Call::new(&WRITE, 4);
    let mut key = Vec::with_capacity(64);
    layout.write_lease(&request.key, &mut key);
    let stem = key.len();
    for suffix in [&b":write"[..], b":write-wanted", b":readers"] {
        key.truncate(stem);
        key.extend_from_slice(suffix);
        call.cmd.arg(&key[..]);
    }
    key.truncate(stem);
    key.extend_from_slice(b":read:");
    let readers = key.clone();
    key.clear();
    layout.write_counted(&request.key, &mut key);
    key.extend_from_slice(b":fence");
    call.cmd
        .arg(&key[..])
        .arg(&request.holder.to_hex_bytes()[..])
        .arg(request.lock_delay.expiry_millis(request.ttl))
        .arg(request.label.as_deref().unwrap_or(""))
        .arg(&readers[..])
        .arg(layout.fence_retention_ms());
    call
}

/// `inspect.lua` for `key`.
pub(crate) fn inspect(layout: &KeyLayout, key: &LeaseKey) -> Call {
    let mut call = Call::new(&INSPECT, 1);
    let mut lease = Vec::with_capacity(64);
    layout.write_lease(key, &mut lease);
    call.cmd.arg(&lease[..]);
    call
}

/// `withdraw.lua` for the intent of the writer `holder` on the read-write
/// lease `key`.
pub(crate) fn withdraw(layout: &KeyLayout, key: &LeaseKey, holder: &HolderId) -> Call {
    let mut call = Call::new(&WITHDRAW, 1);
    let mut wanted = Vec::with_capacity(64);
    layout.write_lease(key, &mut wanted);
    wanted.extend_from_slice(b":write-wanted");
    call.cmd.arg(&wanted[..]).arg(&holder.to_hex_bytes()[..]);
    call
}

/// `withdraw.lua` for the minimum-hold mark `P:held-until` of `holder`'s
/// lease `key` (the same `<holder hex>:…` form as a writer's intent): a
/// grant given back drops its mark first, so that its release frees the key
/// rather than keeping it for a minimum no one used.
pub(crate) fn unmark(layout: &KeyLayout, key: &LeaseKey, holder: &HolderId) -> Call {
    let mut call = Call::new(&WITHDRAW, 1);
    let mut mark = Vec::with_capacity(64);
    layout.write_lease(key, &mut mark);
    mark.extend_from_slice(b":held-until");
    call.cmd.arg(&mark[..]).arg(&holder.to_hex_bytes()[..]);
    call
}

/// `inspect_rw.lua` for the read-write lease `key`.
pub(crate) fn inspect_rw(layout: &KeyLayout, key: &LeaseKey) -> Call {
    let mut call = Call::new(&INSPECT_RW, 3);
    let mut prefix = Vec::with_capacity(64);
    layout.write_lease(key, &mut prefix);
    let stem = prefix.len();
    for suffix in [&b":write"[..], b":write-wanted", b":readers", b":read:"] {
        prefix.truncate(stem);
        prefix.extend_from_slice(suffix);
        call.cmd.arg(&prefix[..]);
    }
    call
}

/// `d` in whole milliseconds, rounded up, at least 1: a record's expiry
/// (`PEXPIRE 0` would delete it).
pub(crate) fn expiry_millis(d: std::time::Duration) -> u64 {
    let millis = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let rounded = if d.subsec_nanos().is_multiple_of(1_000_000) {
        millis
    } else {
        millis.saturating_add(1)
    };
    rounded.max(1)
}

/// `d` in whole milliseconds, rounded down.
fn floor_millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The keys of a job's run lease (`P`, `P:fence`) as the first two of
/// `call`'s, then its record's.
fn job_keys(layout: &KeyLayout, job: &JobName, call: &mut Call) {
    let run = job.run_key();
    let mut key = Vec::with_capacity(64);
    layout.write_lease(&run, &mut key);
    call.cmd.arg(&key[..]);
    key.extend_from_slice(b":fence");
    call.cmd.arg(&key[..]).arg(layout.job_record(job));
}

/// `tick.lua` for `request`, over a connection that tracks when `tracked`.
/// The run lease is the job's ([`JobName::run_key`]), whatever key
/// `request.run` names (the caller checks they agree).
pub(crate) fn tick(layout: &KeyLayout, request: &TickRequest, tracked: bool) -> Call {
    let mut call = Call::new(&TICK, 3);
    job_keys(layout, &request.job, &mut call);
    let run = &request.run;
    call.cmd
        .arg(&request.fingerprint)
        .arg(request.tick)
        .arg(request.next)
        .arg(floor_millis(request.start_deadline))
        .arg(request.catch_up.as_str())
        .arg(expiry_millis(request.record_ttl))
        .arg(&run.holder.to_hex_bytes()[..])
        .arg(run.lock_delay.expiry_millis(run.ttl))
        .arg(run.label.as_deref().unwrap_or(""))
        .arg(if tracked { "1" } else { "0" })
        .arg(layout.fence_retention_ms());
    call
}

/// `tick_rerun.lua` for `request`, over a connection that tracks when
/// `tracked`; the run lease is the job's, as for [`tick`].
pub(crate) fn tick_rerun(layout: &KeyLayout, request: &RerunRequest, tracked: bool) -> Call {
    let mut call = Call::new(&TICK_RERUN, 3);
    job_keys(layout, &request.job, &mut call);
    let run = &request.run;
    call.cmd
        .arg(request.abandoned.0)
        .arg(request.on_abandon.as_str())
        .arg(expiry_millis(request.record_ttl))
        .arg(&run.holder.to_hex_bytes()[..])
        .arg(run.lock_delay.expiry_millis(run.ttl))
        .arg(run.label.as_deref().unwrap_or(""))
        .arg(if tracked { "1" } else { "0" })
        .arg(layout.fence_retention_ms());
    call
}

/// `tick_complete.lua` for the run of `job` with `token`, held by
/// `holder`; the release is announced as [`release`] announces it.
pub(crate) fn tick_complete(
    layout: &KeyLayout,
    job: &JobName,
    holder: &HolderId,
    token: FencingToken,
    notify: bool,
    sharded: bool,
) -> Call {
    let mut call = Call::new(&TICK_COMPLETE, 2);
    let run = job.run_key();
    let mut key = Vec::with_capacity(64);
    layout.write_lease(&run, &mut key);
    call.cmd.arg(&key[..]).arg(layout.job_record(job));
    call.cmd.arg(&holder.to_hex_bytes()[..]).arg(token.0);
    if notify {
        key.extend_from_slice(b":released");
        call.cmd.arg(&key[..]);
    } else {
        call.cmd.arg("");
    }
    call.cmd.arg(if sharded { "SPUBLISH" } else { "PUBLISH" });
    call
}

/// `tick_record.lua` for `job`: its record first, then its run lease.
pub(crate) fn tick_record(layout: &KeyLayout, job: &JobName) -> Call {
    let mut call = Call::new(&TICK_RECORD, 2);
    call.cmd
        .arg(layout.job_record(job))
        .arg(layout.lease(&job.run_key()));
    call
}

/// What a [`fenced_write`] call stores besides the fence.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fenced<'a> {
    /// A value, with the resource's expiry in ms (`None`: it lives until
    /// deleted).
    Value(&'a [u8], Option<u64>),
    /// Nothing: a seal, giving a resource it creates this expiry in ms.
    Seal(Option<u64>),
}

/// `fenced_write.lua` on the resource kept at `resource` (a
/// [`KeyLayout::fenced`] key), fenced by the tokens of `lease` (its counted
/// key, as [`KeyLayout::fenced`] takes it) at `token`.
pub(crate) fn fenced_write(
    resource: &str,
    lease: &LeaseKey,
    token: FencingToken,
    what: Fenced<'_>,
) -> Call {
    let (mode, value, expiry) = match what {
        Fenced::Value(value, expiry) => ("write", value, expiry),
        Fenced::Seal(expiry) => ("seal", &b""[..], expiry),
    };
    let bytes = resource.len() + lease.as_str().len() + 20 + 5 + value.len() + 20;
    let mut call = Call::with_capacity(&FENCED_WRITE, 1, 6, bytes);
    call.cmd
        .arg(resource)
        .arg(lease.as_str())
        .arg(token.0)
        .arg(mode)
        .arg(value);
    match expiry {
        Some(ms) => call.cmd.arg(ms),
        None => call.cmd.arg(""),
    };
    call
}

/// `fence_read.lua` on the resource kept at `resource`.
pub(crate) fn fence_read(resource: &str) -> Call {
    let mut call = Call::new(&FENCE_READ, 1);
    call.cmd.arg(resource);
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
            ("permit", include_str!("scripts/permit.lua")),
            ("read", include_str!("scripts/read.lua")),
            ("write", include_str!("scripts/write.lua")),
            ("inspect_rw", include_str!("scripts/inspect_rw.lua")),
            ("withdraw", include_str!("scripts/withdraw.lua")),
            ("fair", include_str!("scripts/fair.lua")),
            ("fair_leave", include_str!("scripts/fair_leave.lua")),
            ("release_fair", include_str!("scripts/release_fair.lua")),
            ("acquire_many", include_str!("scripts/acquire_many.lua")),
            ("release_many", include_str!("scripts/release_many.lua")),
            ("tick", include_str!("scripts/tick.lua")),
            ("tick_complete", include_str!("scripts/tick_complete.lua")),
            ("tick_rerun", include_str!("scripts/tick_rerun.lua")),
            ("tick_record", include_str!("scripts/tick_record.lua")),
            ("fenced_write", include_str!("scripts/fenced_write.lua")),
            ("fence_read", include_str!("scripts/fence_read.lua")),
        ] {
            if [
                "acquire",
                "acquire_many",
                "handover",
                "permit",
                "read",
                "write",
                "fair",
                "release_fair",
                "tick",
                "tick_rerun",
            ]
            .contains(&name)
            {
                assert!(source.contains("grant("), "{name} grants through grant.lua");
            }
            assert!(source.starts_with(&format!("-- {name}.lua:")), "{name}");
            assert!(source.contains("-- KEYS["), "{name} names its KEYS");
            assert!(source.contains("ARGV"), "{name} names its ARGV");
        }
    }

    /// The arguments of a command, as text.
    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(a) => String::from_utf8_lossy(a).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn calls_are_encoded_as_the_scripts_expect() -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::default();
        let (a, b) = (LeaseKey::new("a")?, LeaseKey::new("order:{42}")?);
        let (h1, h2) = (HolderId::generate()?, HolderId::generate()?);
        let ttl = leasehold_core::Ttl::parse("3s")?;
        // One ttl shared: sent once, before the holders. Different ttls: an
        // empty shared ttl, then one per lease after the holders.
        // Each holder with its ':'; then whether a key may be a reader's,
        // and whether the connection tracks.
        let (holder1, holder2) = (format!("{}:", h1.to_hex()), format!("{}:", h2.to_hex()));
        let minute = leasehold_core::Ttl::parse("1m")?;
        for (second, tail) in [
            (ttl, vec!["3000", &holder1, &holder2, "0", "1"]),
            (
                minute,
                vec!["", &holder1, &holder2, "3000", "60000", "0", "1"],
            ),
        ] {
            let call = renew(
                &layout,
                &[
                    RenewRequest::new(a.clone(), h1, ttl),
                    RenewRequest::new(b.clone(), h2, second),
                ],
                true,
            );
            let mut expected = vec![
                "EVALSHA",
                RENEW.get_hash(),
                "2",
                "leasehold:{a}",
                "leasehold:order:{42}",
            ];
            expected.extend(tail);
            assert_eq!(args(call.evalsha()), expected);
            assert_eq!(call.first_key(), b"leasehold:{a}");
        }
        // A reader's key in the batch (`P:read:<holder>`): the script looks
        // for readers; untracked, it does not read the batch again.
        let reader = LeaseKey::new("doc")?.reader_key(&h1)?;
        let call = renew(
            &layout,
            &[
                RenewRequest::new(a.clone(), h1, ttl),
                RenewRequest::new(reader, h2, ttl),
            ],
            false,
        );
        let sent = args(call.evalsha());
        assert_eq!(sent[sent.len() - 2..], ["1", "0"]);

        let request = AcquireRequest::new(a.clone(), h1, ttl).with_label("pod-1")?;
        let call = acquire(&layout, &request, true);
        assert_eq!(
            args(call.evalsha()),
            [
                "EVALSHA",
                ACQUIRE.get_hash(),
                "2",
                "leasehold:{a}",
                "leasehold:{a}:fence",
                &h1.to_hex(),
                "3000",
                "pod-1",
                "1",
                "0",
                "3600000"
            ]
        );
        assert_eq!(args(acquire(&layout, &request, false).evalsha())[8], "0");
        let call = release(&layout, &a, &h1, true, false, 1, false);
        assert_eq!(
            args(call.evalsha())[3..],
            [
                "leasehold:{a}",
                &h1.to_hex(),
                "leasehold:{a}:released",
                "PUBLISH",
                "1"
            ]
        );
        let call = release(&layout, &a, &h1, false, false, 0, true);
        assert_eq!(
            args(call.evalsha())[3..],
            ["leasehold:{a}", &h1.to_hex(), "", "PUBLISH", "0", "1"]
        );
        let call = release(&layout, &a, &h1, true, true, 0, false);
        assert_eq!(args(call.evalsha())[6], "SPUBLISH");
        let call = handover(&layout, &a, &h1, 1, true, &request);
        assert_eq!(
            args(call.evalsha())[2..],
            [
                "2",
                "leasehold:{a}",
                "leasehold:{a}:fence",
                &h1.to_hex(),
                "leasehold:{a}:released",
                "1",
                "SHARDNUMSUB",
                "SPUBLISH",
                &h1.to_hex(),
                "3000",
                "pod-1",
                "0",
                "3600000"
            ]
        );
        assert_eq!(
            args(inspect(&layout, &a).evalsha())[2..],
            ["1", "leasehold:{a}"]
        );
        let two = PermitLimit::new(2)?;
        let call = permit(&layout, &request, two, 0)?;
        assert_eq!(
            args(call.evalsha())[1..],
            [
                PERMIT.get_hash(),
                "4",
                "leasehold:{a}:permits",
                "leasehold:{a}:fence",
                "leasehold:{a}:permit:0",
                "leasehold:{a}:permit:1",
                &h1.to_hex(),
                "3000",
                "pod-1",
                "2",
                "3600000"
            ]
        );
        // A larger stored limit to check: its permits are sent too.
        assert_eq!(args(permit(&layout, &request, two, 3)?.evalsha())[2], "5");
        // A permit's counter and channel are its semaphore's.
        let slot = a.permit(1)?;
        let call = acquire(&layout, &AcquireRequest::new(slot.clone(), h1, ttl), true);
        assert_eq!(
            args(call.evalsha())[3..5],
            ["leasehold:{a}:permit:1", "leasehold:{a}:fence"]
        );
        let call = release(&layout, &slot, &h1, true, false, 0, false);
        assert_eq!(args(call.evalsha())[5], "leasehold:{a}:released");
        let call = handover(&layout, &slot, &h1, 0, false, &request);
        assert_eq!(
            args(call.evalsha())[3..7],
            [
                "leasehold:{a}:permit:1",
                "leasehold:{a}:fence",
                &h1.to_hex(),
                "leasehold:{a}:released"
            ]
        );
        Ok(())
    }

    /// Every script that grants ends its arguments with the fencing
    /// counter's retention (grant.lua reads it as the last one), as the
    /// layout sets it; the others send none.
    #[test]
    fn every_grant_sends_the_counter_retention_last() -> Result<(), Box<dyn std::error::Error>> {
        let layout =
            KeyLayout::default().with_fence_retention(std::time::Duration::from_secs(90))?;
        let a = LeaseKey::new("a")?;
        let h = HolderId::generate()?;
        let ttl = leasehold_core::Ttl::parse("3s")?;
        let request = AcquireRequest::new(a.clone(), h, ttl);
        let other = AcquireRequest::new(LeaseKey::new("b")?, h, ttl);
        let job = JobName::new("nightly")?;
        let run = AcquireRequest::new(job.run_key(), h, ttl);
        let tick_request =
            TickRequest::new(job.clone(), "0 * * * * *", 60_000, 120_000, run.clone());
        let rerun_request = RerunRequest::new(
            job,
            leasehold_core::FencingToken(7),
            leasehold_core::OnAbandon::Rerun,
            std::time::Duration::from_secs(600),
            run,
        );
        let granting = [
            acquire(&layout, &request, true),
            acquire_many(&layout, &[request.clone(), other], true),
            fair(&layout, &request, true, 1000, (0, b"")),
            release_fair(&layout, &a, &h, true, false),
            handover(&layout, &a, &h, 0, false, &request),
            permit(&layout, &request, PermitLimit::new(2)?, 0)?,
            read(&layout, &request, &a.reader_key(&h)?),
            write(&layout, &request),
            tick(&layout, &tick_request, true),
            tick_rerun(&layout, &rerun_request, false),
        ];
        for call in &granting {
            let hash = args(call.evalsha()).get(1).cloned();
            let script = all()
                .into_iter()
                .find(|s| Some(s.get_hash()) == hash.as_deref());
            assert!(script.is_some_and(|s| s.source.contains("grant(")));
            assert_eq!(
                args(call.evalsha()).last().map(String::as_str),
                Some("90000")
            );
        }
        let plain = release(&layout, &a, &h, true, false, 0, false);
        assert!(!args(plain.evalsha()).contains(&"90000".to_owned()));
        Ok(())
    }

    /// A minimum hold reaches the scripts that mark it (acquire.lua,
    /// handover.lua for the waiter) as its milliseconds, last; a request
    /// without one sends exactly what it always did.
    #[test]
    fn a_minimum_hold_is_sent_only_where_a_script_marks_it()
    -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::default();
        let (a, b) = (LeaseKey::new("a")?, LeaseKey::new("b")?);
        let (h1, h2) = (HolderId::generate()?, HolderId::generate()?);
        let ttl = leasehold_core::Ttl::parse("1s")?;
        let minimum = std::time::Duration::from_secs(600);
        let plain = AcquireRequest::new(a.clone(), h1, ttl);
        let held = plain.clone().with_hold_at_least(minimum)?;
        // acquire.lua: ARGV[5] after the tracking flag, '0' without one;
        // then the counter's retention.
        let sent = args(acquire(&layout, &held, true).evalsha());
        assert_eq!(sent[8..], ["1", "600000", "3600000"]);
        let sent = args(acquire(&layout, &plain, true).evalsha());
        assert_eq!(sent[8..], ["1", "0", "3600000"]);
        // handover.lua: ARGV[9] for the waiter's own minimum.
        let sent = args(handover(&layout, &b, &h2, 0, false, &held).evalsha());
        assert_eq!(sent[sent.len() - 2..], ["600000", "3600000"]);
        let sent = args(handover(&layout, &b, &h2, 0, false, &plain).evalsha());
        assert_eq!(sent[sent.len() - 2..], ["0", "3600000"]);
        Ok(())
    }

    /// A lock-delay reaches the server as the key's expiry, ttl + delay,
    /// in every script that sets one; renewals whose expiries differ form a
    /// mixed batch, and ones that share it share it, whatever their ttls.
    #[test]
    fn a_lock_delay_is_sent_as_ttl_plus_delay() -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::default();
        let (a, b) = (LeaseKey::new("a")?, LeaseKey::new("b")?);
        let (h1, h2) = (HolderId::generate()?, HolderId::generate()?);
        // renew.lua takes each holder with the ':' after it.
        let (holder1, holder2) = (format!("{}:", h1.to_hex()), format!("{}:", h2.to_hex()));
        let ttl = leasehold_core::Ttl::parse("1s")?;
        let delay = leasehold_core::LockDelay::parse("2s")?;
        let request = AcquireRequest::new(a.clone(), h1, ttl).with_lock_delay(delay);
        assert_eq!(args(acquire(&layout, &request, true).evalsha())[6], "3000");
        let call = permit(&layout, &request, PermitLimit::new(1)?, 0)?;
        assert_eq!(args(call.evalsha())[7], "3000");
        let call = handover(&layout, &b, &h2, 0, false, &request);
        assert_eq!(args(call.evalsha())[11], "3000");

        let delayed = RenewRequest::new(a.clone(), h1, ttl).with_lock_delay(delay);
        let plain = RenewRequest::new(b.clone(), h2, ttl);
        let call = renew(&layout, &[delayed.clone(), plain], true);
        assert_eq!(
            args(call.evalsha())[5..],
            ["", &holder1, &holder2, "3000", "1000", "0", "1"]
        );
        let three = RenewRequest::new(b, h2, leasehold_core::Ttl::parse("3s")?);
        let call = renew(&layout, &[delayed, three], false);
        assert_eq!(
            args(call.evalsha())[5..],
            ["3000", &holder1, &holder2, "0", "0"]
        );
        Ok(())
    }

    /// A job's calls name its run lease, counter and record, all in the
    /// job's slot, and send numbers as the scripts read them: ms, a record
    /// expiry of at least 1 ms rounded up.
    #[test]
    fn job_calls_are_encoded_as_the_scripts_expect() -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::default();
        let job = JobName::new("nightly")?;
        let h = HolderId::generate()?;
        let run = AcquireRequest::new(job.run_key(), h, leasehold_core::Ttl::parse("3s")?)
            .with_label("pod-1")?;
        let request =
            TickRequest::new(job.clone(), "0 * * * * * UTC", 60_000, 120_000, run.clone())
                .with_start_deadline(std::time::Duration::from_millis(1500))
                .with_catch_up(leasehold_core::CatchUp::Latest)
                .with_record_ttl(std::time::Duration::from_micros(90_000_500));
        let call = tick(&layout, &request, false);
        assert_eq!(
            args(call.evalsha())[1..],
            [
                TICK.get_hash(),
                "3",
                "leasehold:job:{nightly}:run",
                "leasehold:job:{nightly}:run:fence",
                "leasehold:job:{nightly}:record",
                "0 * * * * * UTC",
                "60000",
                "120000",
                "1500",
                "latest",
                "90001",
                &h.to_hex(),
                "3000",
                "pod-1",
                "0",
                "3600000"
            ]
        );
        assert_eq!(call.first_key(), b"leasehold:job:{nightly}:run");
        let zero = request.with_record_ttl(std::time::Duration::ZERO);
        assert_eq!(args(tick(&layout, &zero, true).evalsha())[11], "1");
        let rerun = RerunRequest::new(
            job.clone(),
            FencingToken(41),
            leasehold_core::OnAbandon::Skip,
            std::time::Duration::from_secs(600),
            run,
        );
        assert_eq!(
            args(tick_rerun(&layout, &rerun, true).evalsha())[6..],
            [
                "41",
                "skip",
                "600000",
                &h.to_hex(),
                "3000",
                "pod-1",
                "1",
                "3600000"
            ]
        );
        assert_eq!(
            args(tick_complete(&layout, &job, &h, FencingToken(9), true, true).evalsha())[2..],
            [
                "2",
                "leasehold:job:{nightly}:run",
                "leasehold:job:{nightly}:record",
                &h.to_hex(),
                "9",
                "leasehold:job:{nightly}:run:released",
                "SPUBLISH"
            ]
        );
        assert_eq!(
            args(tick_complete(&layout, &job, &h, FencingToken(9), false, false).evalsha())[7..],
            ["", "PUBLISH"]
        );
        assert_eq!(
            args(tick_record(&layout, &job).evalsha())[2..],
            [
                "2",
                "leasehold:job:{nightly}:record",
                "leasehold:job:{nightly}:run"
            ]
        );
        Ok(())
    }

    /// A fenced call names the resource's key alone (its slot is the
    /// lease's), then the lease key, the token, the mode, the value and
    /// the expiry ('' for none), as `fenced_write.lua` reads them.
    #[test]
    fn fenced_calls_are_encoded_as_the_scripts_expect() -> Result<(), leasehold_core::InputError> {
        let layout = KeyLayout::default();
        let lease = LeaseKey::new("order:{42}")?;
        let key = layout.fenced(&lease, "total");
        let call = fenced_write(
            &key,
            &lease,
            FencingToken(u64::MAX),
            Fenced::Value(b"v", Some(1500)),
        );
        assert_eq!(
            args(call.evalsha())[1..],
            [
                FENCED_WRITE.get_hash(),
                "1",
                "leasehold{42}:fenced:total",
                "order:{42}",
                "18446744073709551615",
                "write",
                "v",
                "1500"
            ]
        );
        assert_eq!(call.first_key(), b"leasehold{42}:fenced:total");
        let call = fenced_write(&key, &lease, FencingToken(7), Fenced::Seal(None));
        assert_eq!(args(call.evalsha())[5..], ["7", "seal", "", ""]);
        assert_eq!(
            args(fence_read(&key).evalsha())[1..],
            [FENCE_READ.get_hash(), "1", "leasehold{42}:fenced:total"]
        );
        Ok(())
    }

    #[test]
    fn scripts_have_distinct_hashes() {
        let hashes = all().map(Lua::get_hash);
        for (i, a) in hashes.iter().enumerate() {
            assert_eq!(a.len(), 40);
            assert!(hashes[i + 1..].iter().all(|b| a != b));
        }
    }
}
