//! Read-write leases: shared holders (readers) or one exclusive holder
//! (the writer) per key, and the keys each of them holds.
//!
//! A read-write lease `K` is held on concrete lease keys, so that renewing,
//! releasing and inspecting a share are the operations of any lease:
//!
//! - the writer holds `K:write` (`{K}:write` when `K` has no hash tag);
//! - each reader holds its own `K:read:<holder id in hex>`.
//!
//! Both count with `K` (see [`LeaseKey::counted_as`]): their fencing tokens
//! come from `K`'s counter, so they strictly increase across readers and
//! writers, and their releases wake the waiters of `K`. Which holders may
//! coexist is decided by [`ReadWriteBackend::try_acquire_read`] and
//! [`ReadWriteBackend::try_acquire_write`].
//!
//! [`ReadWriteBackend::try_acquire_read`]: crate::ReadWriteBackend::try_acquire_read
//! [`ReadWriteBackend::try_acquire_write`]: crate::ReadWriteBackend::try_acquire_write

use std::time::Duration;

use crate::{HolderId, InputError, LeaseInfo, LeaseKey};

/// Who holds a read-write lease, and who waits to write, as of one instant
/// on the server. Holder ids are not shown: only labels, fencing tokens
/// and the time left.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwInfo {
    /// The writer, if one holds the lease.
    pub writer: Option<LeaseInfo>,
    /// The readers holding the lease, by rising fencing token.
    pub readers: Vec<LeaseInfo>,
    /// The intent a writer refused by the current holders left, so that
    /// new readers wait behind it; `None` when no writer waits.
    pub waiting_writer: Option<WriteIntent>,
}

impl RwInfo {
    /// Whether anyone holds the lease: a writer or a reader.
    #[must_use]
    pub fn is_held(&self) -> bool {
        self.writer.is_some() || !self.readers.is_empty()
    }
}

/// A waiting writer's intent on a read-write lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteIntent {
    /// The waiting writer's public label, if it set one.
    pub label: Option<String>,
    /// How long the intent keeps new readers out unless the writer asks
    /// again; `None` when it has no expiry (not written by leasehold).
    pub ttl_left: Option<Duration>,
}

/// Which share of a read-write lease a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RwRole {
    /// A shared holder's key, `K:read:<holder>`.
    Reader(HolderId),
    /// The exclusive holder's key, `K:write`.
    Writer,
}

/// The text after a read-write lease key that names its writer.
const WRITE_SUFFIX: &str = ":write";
/// The text between a read-write lease key and a reader's holder id.
const READ_INFIX: &str = ":read:";

/// The refusal of a base key too long for its share keys.
fn too_long(k: &str) -> InputError {
    InputError::InvalidKey {
        key: crate::error::excerpt(k),
        reason: "a read-write lease key must leave room for its readers' keys (\"{key}:read:\" and 32 hex digits within 512 bytes); choose a shorter key",
    }
}

impl LeaseKey {
    /// `K` + `suffix` when `K` has a hash tag, else `{K}` + `suffix`.
    fn tagged_with(&self, suffix: &str) -> Result<LeaseKey, InputError> {
        let k = self.as_str();
        let key = if self.hash_tag().is_some() {
            format!("{k}{suffix}")
        } else {
            format!("{{{k}}}{suffix}")
        };
        LeaseKey::new(&key).map_err(|_| too_long(k))
    }

    /// The key the writer of the read-write lease `K` holds: `K:write` when
    /// `K` has a hash tag, else `{K}:write` (one Cluster slot with `K`).
    ///
    /// ```
    /// use leasehold_core::{LeaseKey, RwRole};
    /// let doc = LeaseKey::new("doc")?;
    /// assert_eq!(doc.writer_key()?.as_str(), "{doc}:write");
    /// assert_eq!(doc.writer_key()?.rw_of(), Some((doc, RwRole::Writer)));
    /// # Ok::<(), leasehold_core::InputError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidKey`] when `K` leaves no room for its readers' keys
    /// (the longest share key) within [`LeaseKey::MAX_LEN`] bytes.
    pub fn writer_key(&self) -> Result<LeaseKey, InputError> {
        // Checked against the longest share key, so that a key that has a
        // writer always has readers too.
        self.tagged_with(&format!("{READ_INFIX}{:032}", 0))?;
        self.tagged_with(WRITE_SUFFIX)
    }

    /// The key the reader `holder` of the read-write lease `K` holds:
    /// `K:read:<holder hex>` when `K` has a hash tag, else
    /// `{K}:read:<holder hex>`.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidKey`] when the key would be longer than
    /// [`LeaseKey::MAX_LEN`] bytes.
    pub fn reader_key(&self, holder: &HolderId) -> Result<LeaseKey, InputError> {
        let mut suffix = String::with_capacity(READ_INFIX.len() + 32);
        suffix.push_str(READ_INFIX);
        suffix.push_str(&holder.to_hex());
        self.tagged_with(&suffix)
    }

    /// The read-write lease and the share this key names, if it is a
    /// writer's or a reader's key (see [`writer_key`](Self::writer_key) and
    /// [`reader_key`](Self::reader_key)). The lease is given without the
    /// braces those added (`{doc}:write` is the writer of `doc`).
    #[must_use]
    pub fn rw_of(&self) -> Option<(LeaseKey, RwRole)> {
        self.hash_tag()?;
        let k = self.as_str();
        let (base, role) = if let Some(base) = k.strip_suffix(WRITE_SUFFIX) {
            (base, RwRole::Writer)
        } else {
            let at = k.rfind(READ_INFIX)?;
            let hex = &k[at + READ_INFIX.len()..];
            // Only the lowercase form `to_hex` writes names a reader.
            if hex.len() != 32 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return None;
            }
            (&k[..at], RwRole::Reader(HolderId::from_hex(hex).ok()?))
        };
        let base = LeaseKey::new(base).ok()?;
        // A base without a hash tag has no share keys of this spelling
        // (`a:{b}x:write` is fine, but `{}:write` is not a share of ``).
        base.hash_tag()?;
        Some((base.plain(), role))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> LeaseKey {
        LeaseKey::new(s).expect("valid key")
    }

    #[test]
    fn share_keys_share_the_hash_tag_and_map_back() -> Result<(), InputError> {
        let reader = HolderId::generate()?;
        for (base, writer, tag) in [
            ("doc", "{doc}:write", "doc"),
            ("order:{42}", "order:{42}:write", "42"),
            ("{42}", "{42}:write", "42"),
        ] {
            let w = k(base).writer_key()?;
            assert_eq!(w.as_str(), writer);
            assert_eq!(w.hash_tag(), Some(tag));
            assert_eq!(w.rw_of(), Some((k(base).plain(), RwRole::Writer)));
            let r = k(base).reader_key(&reader)?;
            assert_eq!(r.hash_tag(), Some(tag));
            assert_eq!(r.rw_of(), Some((k(base).plain(), RwRole::Reader(reader))));
            assert_eq!(r.counted_as(), k(base).counted_as());
            assert_eq!(w.counted_as(), k(base).counted_as());
        }
        Ok(())
    }

    #[test]
    fn only_share_keys_are_shares() {
        for other in [
            "doc",
            "doc:write",
            "{doc}:read:",
            "{doc}:read:ABCDEF0123456789abcdef0123456789",
            "{doc}:read:0123",
            "{doc}:writer",
        ] {
            assert_eq!(k(other).rw_of(), None, "{other}");
        }
    }

    #[test]
    fn a_base_key_must_leave_room_for_its_readers() {
        // Braces, ":read:" and 32 hex digits: 40 bytes.
        let fits = k(&"s".repeat(LeaseKey::MAX_LEN - 40));
        assert!(fits.writer_key().is_ok());
        let long = k(&"s".repeat(LeaseKey::MAX_LEN - 39));
        assert!(matches!(
            long.writer_key(),
            Err(InputError::InvalidKey { .. })
        ));
    }
}
