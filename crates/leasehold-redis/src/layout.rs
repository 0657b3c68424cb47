//! Where a lease lives on the server: the key layout.

use std::time::Duration;

use leasehold_core::{JobName, LeaseKey};

use crate::ConnectError;

/// The Redis keys of leases in one namespace.
///
/// For a lease key `K` in namespace `N` the *prefix* `P` is `N:K` when `K`
/// has a hash tag (`order:{42}` → `N:order:{42}`), else `N:{K}`
/// (`reports:nightly` → `N:{reports:nightly}`). Then:
///
/// | key       | holds                                                                   |
/// |-----------|-------------------------------------------------------------------------|
/// | `P`       | the lease: `<holder hex, 32 digits>:<fencing token>:<label or empty>`, with an expiry |
/// | `P:fence` | the fencing counter, kept for the [retention](KeyLayout::fence_retention) after each grant |
/// | `P:released` | (a pub/sub channel) release notices                                  |
/// | `P:held-until` | a minimum hold's mark, `<holder hex>:<end, server ms>`, expiring at its end; only for a lease granted with one |
///
/// These keys share the hash tag of `P`, so they sit in one Redis Cluster
/// slot and one script can touch them all. (`P:held-until` is named by the
/// scripts from `P`, not passed to them: see docs/design.md, "Minimum
/// hold".) A lease key with its own hash tag
/// keeps it, so a lease can live in the slot of the data it guards.
///
/// A semaphore `K` with `N` permits (see [`LeaseKey::permit`]) keeps, beside
/// `P:fence` and `P:released`:
///
/// | key            | holds                                                    |
/// |----------------|----------------------------------------------------------|
/// | `P:permit:<i>` | permit `i` (0 to N-1), a lease like `P` above            |
/// | `P:permits`    | the limit `N` its holders agreed on, kept as long as `P:fence` |
///
/// `P:permit:<i>` is the `P` of the permit key `K:permit:<i>` (`{K}:permit:<i>`
/// when `K` has no hash tag), so a permit is renewed, released and
/// inspected as any lease; but its fencing counter is the semaphore's
/// `P:fence` and its releases are announced on the semaphore's
/// `P:released`: tokens rise across all permits, and a release wakes a
/// waiter for any permit. All of them share the hash tag of `P`.
///
/// A read-write lease `K` (see `LeaseKey::writer_key`) keeps, beside
/// `P:fence` and `P:released`:
///
/// | key                   | holds                                                   |
/// |-----------------------|---------------------------------------------------------|
/// | `P:write`             | the writer, a lease like `P` above                      |
/// | `P:read:<holder hex>` | one reader, a lease like `P` above                      |
/// | `P:readers`           | the set of readers' holder ids, living as long as its longest-lived reader, pruned of those whose key is gone |
/// | `P:write-wanted`      | `<holder hex>:<label>` of a writer waiting, with the writer's ttl as expiry |
///
/// `P:write` and `P:read:<hex>` are the `P` of the lease keys `K:write` and
/// `K:read:<hex>` (`{K}:…` when `K` has no hash tag), so readers and the
/// writer are renewed, released and inspected as any lease; their fencing
/// counter and release channel are `K`'s. All of them share the hash tag of
/// `P`.
///
/// A lease taken in fair mode (`fair.lua`) also has its queue:
///
/// | key                    | holds                                                   |
/// |------------------------|---------------------------------------------------------|
/// | `P:fair`               | sorted set: holder id → arrival (server µs)             |
/// | `P:fair-places`        | sorted set: holder id → when the place expires (server ms) |
/// | `P:fair-asks`          | hash: holder id → `<call ms>:<handover ms>:<process>:<label>`, for places that asked for a handover |
/// | `P:released:<process>` | (a pub/sub channel) a fair handover to that process's waiter, `<holder hex>:<token>` |
///
/// The three queue keys live as long as the longest-lived place.
///
/// A scheduled job `J` (see [`JobName`]) keeps two keys, both with the hash
/// tag `{J}`, so they sit in one Redis Cluster slot:
///
/// | key                    | holds                                                   |
/// |------------------------|---------------------------------------------------------|
/// | `N:job:{J}:run`        | the job's run lease: the `P` of the lease key [`JobName::run_key`] (`job:{J}:run`), with its `P:fence` and `P:released` |
/// | `N:job:{J}:record`     | the job's record ([`job_record`](KeyLayout::job_record)), a hash: the highest tick decided and its decision, the last run, the counts, the schedule's fingerprint; expiring after the record ttl of its last write |
///
/// The record's fields, each a string (numbers in decimal, instants in UNIX
/// milliseconds on the server's clock):
///
/// | field | holds |
/// |-------|-------|
/// | `fingerprint` | the schedule's fingerprint (its text and time zone) |
/// | `record_ttl` | the record's expiry as last asked for, in milliseconds |
/// | `last_seen` | the server's clock at the record's last write |
/// | `decided` | the highest tick decided |
/// | `decided_state`, `decided_reason` | its decision: `started`, `completed`, `missed`, `skipped` or `abandoned`; `on-time`, `catch-up`, `rerun`, `late`, `overlap`, `lease-ended` or `done` |
/// | `decided_run_tick`, `decided_token`, `decided_label` | the run the decision concerns (the run started for it, or for a skipped tick the run that held; tick `0` for a holder the record did not know); absent for a missed tick |
/// | `run_tick`, `run_token`, `run_holder`, `run_label` | the last run: its tick, fencing token, holder id (hex) and label |
/// | `run_state`, `run_reason` | `running`, `completed` or `abandoned`; why it started: `on-time`, `catch-up` or `rerun` |
/// | `run_started`, `run_ended` | when it started, and when it ended (absent while running) |
/// | `run_claimed` | `1` once the run's abandonment was claimed under `skip`: later claims find it settled (absent otherwise) |
/// | `started`, `completed`, `missed`, `skipped`, `abandoned`, `reruns` | the counts over the record's life (absent while 0) |
///
/// A lease key `job:{J}:record` would be kept at the record's Redis key:
/// `LeaseKey` refuses it.
///
/// A fenced resource `R` guarded by the lease key `K` (see
/// [`Fence`](crate::Fence)) is one key, in the slot of `K`'s `P`:
///
/// | key                  | holds                                                   |
/// |----------------------|---------------------------------------------------------|
/// | `N{T}:fenced:R`      | a hash: `token`, the highest fencing token written or sealed (decimal); `lease`, the lease key whose tokens it compares (`K`, or the key `K`'s tokens are counted for: a permit's semaphore, a read-write share's lease); `value`, the value last written (absent while the resource is only sealed) |
///
/// `T` is the text Redis Cluster hashes in `P`: the hash tag of `K`, or
/// `K` itself when it has none (up to a first `}`). So a resource is named
/// within its lease key's hash tag: `order:{42}` and `invoice:{42}` name
/// one resource `total`, whose fence holds the tokens of whichever of them
/// fenced it first (the other is refused), while `reports` and `audits`
/// each have their own. The key is the *user's data*, not leasehold's
/// bookkeeping: the value and its fence live and die together, for as long
/// as the user wants (until deleted, or the expiry the last write set), so
/// nothing of leasehold's own is left behind by it. Its name starts with
/// `N{`, never `N:` as every other key of the namespace does, so no lease
/// key, counter or record can name it.
///
/// The namespace may not contain `{` or `}`: they would change the hash tag.
/// A lease key with a hash tag may not end with `:fence`, `:permits`,
/// `:readers`, `:write-wanted`, `:held-until`, `:fair`, `:fair-places` or
/// `:fair-asks` (`LeaseKey` refuses it): its `P` would be
/// another lease's counter, another semaphore's limit, or another
/// read-write lease's reader index or writer intent. `K` and `{K}` have the same `P`, and so are
/// one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    namespace: std::sync::Arc<str>,
    /// How long a fencing counter lives after the grant that last wrote it,
    /// in milliseconds: sent with every grant.
    fence_retention_ms: u64,
}

impl KeyLayout {
    /// The default namespace: `leasehold`.
    pub const DEFAULT_NAMESPACE: &'static str = "leasehold";

    /// The longest namespace accepted, in bytes.
    pub const MAX_NAMESPACE_LEN: usize = 64;

    /// How long a fencing counter lives after the latest grant of its key,
    /// by default: one hour.
    ///
    /// A counter only matters when the server's clock has stepped back:
    /// otherwise the clock floor alone keeps tokens rising. An hour is
    /// longer than any step a time daemon makes on a running server (ntpd
    /// refuses to correct an offset above its 1000 s panic threshold;
    /// chrony steps only at start by default, and slews after), and 120
    /// times the default ttl, while a service that locks a new key every
    /// 10 ms keeps at most 360,000 counters (about 30 MB, 85 bytes each in
    /// `benches/footprint`).
    pub const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(60 * 60);

    /// The shortest fencing-counter retention accepted: one second.
    pub const MIN_FENCE_RETENTION: Duration = Duration::from_secs(1);

    /// The longest fencing-counter retention accepted: 30 days.
    pub const MAX_FENCE_RETENTION: Duration = Duration::from_secs(30 * 24 * 60 * 60);

    /// A layout for `namespace`.
    ///
    /// # Errors
    ///
    /// [`ConnectError::InvalidConfig`] when the namespace is empty, longer than
    /// [`KeyLayout::MAX_NAMESPACE_LEN`] bytes, or contains braces, whitespace
    /// or control characters.
    pub fn new(namespace: &str) -> Result<Self, ConnectError> {
        let refuse = |reason: &str| ConnectError::InvalidConfig {
            field: "namespace",
            reason: format!("{namespace:?} {reason}"),
        };
        if namespace.is_empty() {
            return Err(refuse("is empty; use a short name such as \"leasehold\""));
        }
        if namespace.len() > Self::MAX_NAMESPACE_LEN {
            return Err(refuse("is longer than 64 bytes; use a short name"));
        }
        if namespace.contains(['{', '}']) {
            return Err(refuse(
                "contains '{' or '}', which would change the Redis Cluster hash tag of every lease; remove them",
            ));
        }
        if namespace
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(refuse(
                "contains whitespace or control characters; remove them",
            ));
        }
        Ok(Self {
            namespace: namespace.into(),
            fence_retention_ms: millis(Self::DEFAULT_FENCE_RETENTION),
        })
    }

    /// This layout with fencing counters that live `retention` after the
    /// latest grant of their key (default:
    /// [`DEFAULT_FENCE_RETENTION`](Self::DEFAULT_FENCE_RETENTION)).
    ///
    /// Fencing tokens keep rising after a counter expired, as long as the
    /// server's clock never reads more than `retention` behind a time it
    /// has already shown (see docs/design.md, "Guarantees").
    ///
    /// # Errors
    ///
    /// [`ConnectError::InvalidConfig`] when `retention` is below one second, above
    /// 30 days, or not a whole number of milliseconds.
    pub fn with_fence_retention(mut self, retention: Duration) -> Result<Self, ConnectError> {
        let refuse = |reason: String| ConnectError::InvalidConfig {
            field: "fence_retention",
            reason,
        };
        let shown = humantime::format_duration(retention);
        if retention < Self::MIN_FENCE_RETENTION {
            return Err(refuse(format!(
                "{shown} is below 1s; a fencing counter must outlive the leases of its key by far (the default is 1h)"
            )));
        }
        if retention > Self::MAX_FENCE_RETENTION {
            return Err(refuse(format!(
                "{shown} is above 30days; use a shorter retention"
            )));
        }
        if !retention.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(refuse(format!(
                "{shown} is not a whole number of milliseconds; round it"
            )));
        }
        self.fence_retention_ms = millis(retention);
        Ok(self)
    }

    /// How long a fencing counter lives after the latest grant of its key.
    #[must_use]
    pub fn fence_retention(&self) -> Duration {
        Duration::from_millis(self.fence_retention_ms)
    }

    /// [`fence_retention`](Self::fence_retention) in milliseconds, as the
    /// scripts take it.
    pub(crate) fn fence_retention_ms(&self) -> u64 {
        self.fence_retention_ms
    }

    /// The namespace every key starts with.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The prefix `P` of a lease: `N:K` if `K` has a hash tag, else `N:{K}`.
    fn prefix(&self, key: &LeaseKey) -> String {
        let (ns, k) = (&*self.namespace, key.as_str());
        if key.hash_tag().is_some() {
            format!("{ns}:{k}")
        } else {
            format!("{ns}:{{{k}}}")
        }
    }

    /// Appends the prefix `P` of a lease to `out`, as [`lease`](Self::lease)
    /// spells it, without allocating a `String` for it.
    pub(crate) fn write_lease(&self, key: &LeaseKey, out: &mut Vec<u8>) {
        out.extend_from_slice(self.namespace.as_bytes());
        if key.hash_tag().is_some() {
            out.push(b':');
            out.extend_from_slice(key.as_str().as_bytes());
        } else {
            out.extend_from_slice(b":{");
            out.extend_from_slice(key.as_str().as_bytes());
            out.push(b'}');
        }
    }

    /// The Redis key holding the lease itself (`P`).
    #[must_use]
    pub fn lease(&self, key: &LeaseKey) -> String {
        self.prefix(key)
    }

    /// The pub/sub channel on which releases of the lease are announced
    /// (`P:released`), in the lease's hash slot; for a permit, its
    /// semaphore's.
    #[must_use]
    pub fn released(&self, key: &LeaseKey) -> String {
        let mut p = self.prefix(&key.counted_as());
        p.push_str(":released");
        p
    }

    /// The Redis key holding the lease's fencing counter (`P:fence`); for a
    /// permit, its semaphore's.
    #[must_use]
    pub fn fence(&self, key: &LeaseKey) -> String {
        let mut p = self.prefix(&key.counted_as());
        p.push_str(":fence");
        p
    }

    /// Appends the prefix `P` of the lease whose fencing counter and
    /// release channel `key` uses (its semaphore's, for a permit) to `out`.
    pub(crate) fn write_counted(&self, key: &LeaseKey, out: &mut Vec<u8>) {
        if key.permit_of().is_some() || key.rw_of().is_some() {
            self.write_lease(&key.counted_as(), out);
        } else {
            // `K` and `{K}` share their `P`: no need to spell it plainly.
            self.write_lease(key, out);
        }
    }

    /// The Redis key holding the index of the readers of the read-write
    /// lease `key` (`P:readers`).
    #[must_use]
    pub fn readers(&self, key: &LeaseKey) -> String {
        let mut p = self.prefix(key);
        p.push_str(":readers");
        p
    }

    /// The Redis key holding the intent of a writer waiting for the
    /// read-write lease `key` (`P:write-wanted`).
    #[must_use]
    pub fn write_wanted(&self, key: &LeaseKey) -> String {
        let mut p = self.prefix(key);
        p.push_str(":write-wanted");
        p
    }

    /// The Redis key holding the permit limit of the semaphore `key`
    /// (`P:permits`).
    #[must_use]
    pub fn permit_limit(&self, key: &LeaseKey) -> String {
        let mut p = self.prefix(key);
        p.push_str(":permits");
        p
    }

    /// The Redis key holding the record of the scheduled job `job`
    /// (`N:job:{J}:record`, a hash): in the slot of its run lease
    /// ([`lease`](Self::lease) of [`JobName::run_key`], `N:job:{J}:run`).
    #[must_use]
    pub fn job_record(&self, job: &JobName) -> String {
        format!("{}:job:{{{}}}:record", self.namespace, job.as_str())
    }

    /// The Redis key holding the fenced resource `resource` guarded by the
    /// lease key `key` (`N{T}:fenced:<resource>`, a hash; see the table
    /// above): in the slot of `key`'s lease, whatever the topology. A
    /// permit's or a read-write share's resources are its semaphore's or
    /// lease's, whose tokens it holds.
    ///
    /// To delete a resource (its value and its fence), `DEL` this key.
    #[must_use]
    pub fn fenced(&self, key: &LeaseKey, resource: &str) -> String {
        let lease = self.prefix(&key.counted_as());
        let tag = hashed_part(&lease);
        let mut out = String::with_capacity(self.namespace.len() + tag.len() + resource.len() + 10);
        out.push_str(&self.namespace);
        out.push('{');
        out.push_str(tag);
        out.push_str("}:fenced:");
        out.push_str(resource);
        out
    }

    /// The `SCAN … MATCH` pattern of every job record of this namespace
    /// (`N:job:{*}:record`, the namespace's glob characters escaped).
    pub(crate) fn job_records_pattern(&self) -> String {
        let mut pattern = String::with_capacity(self.namespace.len() + 16);
        for c in self.namespace.chars() {
            if matches!(c, '*' | '?' | '[' | ']' | '\\') {
                pattern.push('\\');
            }
            pattern.push(c);
        }
        pattern.push_str(":job:{*}:record");
        pattern
    }

    /// The job whose record is kept at `redis_key`, if it is a job record
    /// of this namespace.
    pub(crate) fn job_of_record(&self, redis_key: &str) -> Option<JobName> {
        let name = redis_key
            .strip_prefix(&*self.namespace)?
            .strip_prefix(":job:{")?
            .strip_suffix("}:record")?;
        JobName::new(name).ok()
    }
}

impl Default for KeyLayout {
    fn default() -> Self {
        Self {
            namespace: Self::DEFAULT_NAMESPACE.into(),
            fence_retention_ms: millis(Self::DEFAULT_FENCE_RETENTION),
        }
    }
}

/// The part of a Redis key that Redis Cluster hashes: the text between the
/// first `{` and the next `}`, when not empty; else the whole key.
fn hashed_part(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

/// `d` in whole milliseconds (every duration here is checked to fit).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> LeaseKey {
        LeaseKey::new(s).expect("valid key")
    }

    #[test]
    fn keys_follow_the_documented_layout() {
        let layout = KeyLayout::default();
        assert_eq!(
            layout.lease(&k("reports:nightly")),
            "leasehold:{reports:nightly}"
        );
        assert_eq!(
            layout.fence(&k("reports:nightly")),
            "leasehold:{reports:nightly}:fence"
        );
        assert_eq!(layout.lease(&k("order:{42}")), "leasehold:order:{42}");
        assert_eq!(layout.fence(&k("order:{42}")), "leasehold:order:{42}:fence");
        assert_eq!(hashed_part(&layout.lease(&k("order:{42}"))), "42");
        // Redis Cluster's rule: an empty tag (`{}` first) is no tag, and
        // the whole key is hashed. No key of this layout has one (a lease
        // key may not start with `}`), but the rule is the server's.
        assert_eq!(hashed_part("a{}b{c}"), "a{}b{c}");
        assert_eq!(hashed_part("a{b}{c}"), "b");
        assert_eq!(hashed_part("a{b"), "a{b");
    }

    #[test]
    fn written_lease_keys_spell_the_same_as_lease() {
        let layout = KeyLayout::new("app").expect("valid namespace");
        let mut out = Vec::new();
        for key in ["plain", "order:{42}", "x{}y", "a}b{c", "ü{ñ}"] {
            let key = k(key);
            out.clear();
            layout.write_lease(&key, &mut out);
            assert_eq!(out, layout.lease(&key).as_bytes(), "{key:?}");
        }
    }

    #[test]
    fn lease_and_fence_share_a_slot() {
        let layout = KeyLayout::new("app").expect("valid namespace");
        for key in [
            "plain",
            "order:{42}",
            "{a}{b}",
            "x{}y",
            "a}b{c",
            "{}",
            "a{b",
            "ü{ñ}",
        ] {
            let key = k(key);
            assert_eq!(
                hashed_part(&layout.lease(&key)),
                hashed_part(&layout.fence(&key)),
                "{key:?}"
            );
        }
    }

    #[test]
    fn a_semaphores_keys_share_its_slot_and_its_permits_count_with_it() {
        let layout = KeyLayout::default();
        for (semaphore, prefix) in [
            ("jobs", "leasehold:{jobs}"),
            ("{jobs}", "leasehold:{jobs}"),
            ("order:{42}", "leasehold:order:{42}"),
        ] {
            let sem = k(semaphore);
            let permit = sem.permit(7).expect("a short key");
            assert_eq!(layout.lease(&permit), format!("{prefix}:permit:7"));
            assert_eq!(layout.fence(&permit), format!("{prefix}:fence"));
            assert_eq!(layout.released(&permit), format!("{prefix}:released"));
            assert_eq!(layout.released(&permit), layout.released(&sem));
            assert_eq!(layout.permit_limit(&sem), format!("{prefix}:permits"));
            let mut counted = Vec::new();
            layout.write_counted(&permit, &mut counted);
            assert_eq!(counted, prefix.as_bytes(), "{semaphore}");
            let tag = hashed_part(&layout.lease(&sem)).to_owned();
            for key in [
                layout.lease(&permit),
                layout.fence(&permit),
                layout.permit_limit(&sem),
                layout.released(&permit),
            ] {
                assert_eq!(hashed_part(&key), tag, "{key}");
            }
        }
    }

    #[test]
    fn a_read_write_leases_keys_share_its_slot_and_count_with_it() {
        let layout = KeyLayout::default();
        let holder = leasehold_core::HolderId::generate().expect("entropy");
        for (lease, prefix) in [
            ("doc", "leasehold:{doc}"),
            ("{doc}", "leasehold:{doc}"),
            ("order:{42}", "leasehold:order:{42}"),
        ] {
            let lease = k(lease);
            let writer = lease.writer_key().expect("a short key");
            let reader = lease.reader_key(&holder).expect("a short key");
            assert_eq!(layout.lease(&writer), format!("{prefix}:write"));
            assert_eq!(
                layout.lease(&reader),
                format!("{prefix}:read:{}", holder.to_hex())
            );
            for share in [&writer, &reader] {
                assert_eq!(layout.fence(share), format!("{prefix}:fence"));
                assert_eq!(layout.released(share), format!("{prefix}:released"));
                let mut counted = Vec::new();
                layout.write_counted(share, &mut counted);
                assert_eq!(counted, prefix.as_bytes());
            }
            assert_eq!(layout.readers(&lease), format!("{prefix}:readers"));
            assert_eq!(
                layout.write_wanted(&lease),
                format!("{prefix}:write-wanted")
            );
            let tag = hashed_part(&layout.lease(&lease)).to_owned();
            for key in [
                layout.lease(&writer),
                layout.lease(&reader),
                layout.readers(&lease),
                layout.write_wanted(&lease),
                layout.fence(&writer),
            ] {
                assert_eq!(hashed_part(&key), tag, "{key}");
            }
        }
    }

    #[test]
    fn a_jobs_record_and_run_lease_share_its_slot() {
        let layout = KeyLayout::new("app").expect("valid namespace");
        let job = JobName::new("nightly-report").expect("valid job");
        let record = layout.job_record(&job);
        assert_eq!(record, "app:job:{nightly-report}:record");
        assert_eq!(layout.lease(&job.run_key()), "app:job:{nightly-report}:run");
        assert_eq!(
            layout.fence(&job.run_key()),
            "app:job:{nightly-report}:run:fence"
        );
        for key in [
            layout.lease(&job.run_key()),
            layout.fence(&job.run_key()),
            layout.released(&job.run_key()),
        ] {
            assert_eq!(hashed_part(&key), hashed_part(&record), "{key}");
        }
        assert_eq!(layout.job_of_record(&record), Some(job));
        for other in [
            "app:job:{a}:run",
            "other:job:{a}:record",
            "app:job:{a b}:record",
            "app:job:{}:record",
        ] {
            assert_eq!(layout.job_of_record(other), None, "{other}");
        }
        assert_eq!(layout.job_records_pattern(), "app:job:{*}:record");
        let globby = KeyLayout::new("a*b?[c]\\d").expect("valid namespace");
        assert_eq!(
            globby.job_records_pattern(),
            "a\\*b\\?\\[c\\]\\\\d:job:{*}:record"
        );
    }

    #[test]
    fn a_fenced_resource_sits_in_its_lease_keys_slot_and_names_no_other_key() {
        let layout = KeyLayout::default();
        for (lease, expected) in [
            (
                "reports:nightly",
                "leasehold{reports:nightly}:fenced:chunk:7",
            ),
            (
                "{reports:nightly}",
                "leasehold{reports:nightly}:fenced:chunk:7",
            ),
            ("order:{42}", "leasehold{42}:fenced:chunk:7"),
            ("invoice:{42}", "leasehold{42}:fenced:chunk:7"),
            ("a}b", "leasehold{a}:fenced:chunk:7"),
            ("x{}y", "leasehold{x{}:fenced:chunk:7"),
            ("a{b", "leasehold{a{b}:fenced:chunk:7"),
            ("jobs:{7}:permit:2", "leasehold{7}:fenced:chunk:7"),
        ] {
            let lease = k(lease);
            let fenced = layout.fenced(&lease, "chunk:7");
            assert_eq!(fenced, expected, "{lease:?}");
            assert_eq!(
                hashed_part(&fenced),
                hashed_part(&layout.lease(&lease)),
                "{lease:?}"
            );
            // Every other key of the namespace starts with `N:`.
            assert!(!fenced.starts_with("leasehold:"));
        }
    }

    #[test]
    fn refuses_bad_namespaces() {
        for bad in ["", "a{b", "a}b", "a b", "a\nb", &"n".repeat(65)] {
            assert!(
                matches!(
                    KeyLayout::new(bad),
                    Err(ConnectError::InvalidConfig {
                        field: "namespace",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            KeyLayout::new("my-app:leases")
                .map(|l| l.namespace().to_owned())
                .ok(),
            Some("my-app:leases".to_owned())
        );
    }

    #[test]
    fn the_counter_retention_is_checked() {
        let layout = KeyLayout::default();
        assert_eq!(layout.fence_retention(), KeyLayout::DEFAULT_FENCE_RETENTION);
        for (retention, says) in [
            (Duration::from_millis(999), "below 1s"),
            (Duration::from_secs(31 * 24 * 3600), "above 30days"),
            (
                Duration::from_micros(1_500_500),
                "whole number of milliseconds",
            ),
        ] {
            match layout.clone().with_fence_retention(retention) {
                Err(ConnectError::InvalidConfig { field, reason }) => {
                    assert_eq!(field, "fence_retention");
                    assert!(reason.contains(says), "{reason}");
                }
                other => panic!("{retention:?} accepted: {other:?}"),
            }
        }
        // The bounds themselves are accepted, and a millisecond past the
        // longest is not: 30 days, as documented.
        let thirty_days = Duration::from_secs(30 * 24 * 3600);
        for edge in [Duration::from_secs(1), thirty_days] {
            let kept = layout.clone().with_fence_retention(edge);
            assert_eq!(kept.map(|l| l.fence_retention()).ok(), Some(edge));
        }
        let past = thirty_days + Duration::from_millis(1);
        assert!(layout.clone().with_fence_retention(past).is_err());
        let day = Duration::from_secs(24 * 3600);
        assert_eq!(
            layout
                .with_fence_retention(day)
                .map(|l| l.fence_retention())
                .ok(),
            Some(day)
        );
    }
}
