//! The validated lease key and its Redis Cluster hash tag.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::InputError;
use crate::error::excerpt;

/// The name of a lease.
///
/// A key is 1 to [`LeaseKey::MAX_LEN`] bytes of UTF-8 without control
/// characters (they would corrupt logs and terminals), not starting with `}`
/// (which would defeat the hash tag backends wrap around it), and, if it has
/// a hash tag, not ending with `:fence` or `:permits` (a Redis backend
/// stores the fencing counter of `K` at `K:fence` and the permit limit of a
/// semaphore `K` at `K:permits`, so `order:{42}:fence` would name the
/// counter of `order:{42}`; likewise not with `:readers` or
/// `:write-wanted`, the reader index and writer intent of a read-write
/// lease, nor with `:fair`, `:fair-places` or `:fair-asks`, a lease's
/// fair queue, nor with `:held-until`, a lease's minimum hold), and not
/// `job:{<name>}:record`, a scheduled job's record. It is cheap to clone.
///
/// A key with a hash tag that ends with `:write` or `:read:<32 hex
/// digits>` is a share of a read-write lease (see [`LeaseKey::rw_of`]):
/// its fencing tokens and release notices are the lease's.
///
/// A key with a hash tag that ends with `:permit:<n>` is a permit of a
/// semaphore (see [`LeaseKey::permit_of`]): its fencing tokens and release
/// notices are its semaphore's.
///
/// A key may carry a Redis Cluster *hash tag*, the text between the first
/// `{` and the next `}` (`order:{42}` has the tag `42`): backends store the
/// lease, its fencing counter and its release channel under that tag, so a
/// lease can sit in the same slot as the data it guards.
///
/// ```
/// use leasehold_core::LeaseKey;
/// let key = LeaseKey::new("order:{42}")?;
/// assert_eq!(key.hash_tag(), Some("42"));
/// assert!(LeaseKey::new("").is_err());
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseKey(Arc<str>);

impl LeaseKey {
    /// The longest key accepted, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Validates a lease key.
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidKey`] when the key is empty, longer than
    /// [`LeaseKey::MAX_LEN`] bytes, contains a control character, starts
    /// with `}`, or has a hash tag and ends with `:fence`, `:permits`,
    /// `:readers`, `:write-wanted`, `:fair`, `:fair-places`, `:fair-asks`
    /// or `:held-until`.
    pub fn new(key: impl AsRef<str>) -> Result<Self, InputError> {
        let key = key.as_ref();
        let refuse = |reason| InputError::InvalidKey {
            key: excerpt(key),
            reason,
        };
        if key.is_empty() {
            return Err(refuse("a lease key must not be empty"));
        }
        if key.len() > Self::MAX_LEN {
            return Err(refuse("a lease key may be at most 512 bytes long"));
        }
        if key.chars().any(char::is_control) {
            return Err(refuse(
                "a lease key must not contain control characters such as newlines or tabs",
            ));
        }
        if key.starts_with('}') {
            // Stored as `namespace:{key}`, such a key would have an empty hash
            // tag, and Redis Cluster could split the lease from its counter.
            return Err(refuse("a lease key must not start with '}'"));
        }
        let key = Self(Arc::from(key));
        if key.hash_tag().is_some() && key.0.ends_with(":fence") {
            // A key with a hash tag is stored as is (`namespace:key`), and a
            // lease's fencing counter beside it with `:fence` appended: this
            // key would be another lease's counter.
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key with a hash tag must not end with ':fence', the suffix of fencing counters; choose another ending",
            });
        }
        if key.hash_tag().is_some()
            && (key.0.ends_with(":readers") || key.0.ends_with(":write-wanted"))
        {
            // A read-write lease keeps the index of its readers and its
            // waiting writer's intent beside it with these suffixes.
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key with a hash tag must not end with ':readers' or ':write-wanted', the suffixes of a read-write lease's reader index and writer intent; choose another ending",
            });
        }
        if key.hash_tag().is_some()
            && [":fair", ":fair-places", ":fair-asks"]
                .iter()
                .any(|suffix| key.0.ends_with(suffix))
        {
            // A fair queue is kept beside its lease with these suffixes.
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key with a hash tag must not end with ':fair', ':fair-places' or ':fair-asks', the suffixes of a lease's fair queue; choose another ending",
            });
        }
        if key.hash_tag().is_some() && key.0.ends_with(":held-until") {
            // A lease under a minimum hold keeps its holder's mark beside it
            // with `:held-until` appended: this key would be another
            // lease's mark.
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key with a hash tag must not end with ':held-until', the suffix of a lease's minimum hold; choose another ending",
            });
        }
        if key.0.starts_with("job:{") && key.0.ends_with("}:record") {
            // A scheduled job `J` keeps its record at `job:{J}:record`
            // beside its run's lease `job:{J}:run` (`JobName`).
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key must not be 'job:{<name>}:record', the key of a scheduled job's record; choose another key",
            });
        }
        if key.hash_tag().is_some() && key.0.ends_with(":permits") {
            // Likewise a semaphore's permit limit is stored beside it with
            // `:permits` appended.
            return Err(InputError::InvalidKey {
                key: excerpt(&key.0),
                reason: "a lease key with a hash tag must not end with ':permits', the suffix of semaphore limits; choose another ending",
            });
        }
        Ok(key)
    }

    /// The key as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Redis Cluster hash tag of the key, if it has one: the non-empty
    /// text between the first `{` and the first `}` after it.
    #[must_use]
    pub fn hash_tag(&self) -> Option<&str> {
        let open = self.0.find('{')?;
        let rest = &self.0[open + 1..];
        let close = rest.find('}')?;
        (close > 0).then(|| &rest[..close])
    }
}

impl FromStr for LeaseKey {
    type Err = InputError;
    fn from_str(s: &str) -> Result<Self, InputError> {
        Self::new(s)
    }
}

impl TryFrom<&str> for LeaseKey {
    type Error = InputError;
    fn try_from(s: &str) -> Result<Self, InputError> {
        Self::new(s)
    }
}

impl TryFrom<String> for LeaseKey {
    type Error = InputError;
    fn try_from(s: String) -> Result<Self, InputError> {
        Self::new(s)
    }
}

impl AsRef<str> for LeaseKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseKey({:?})", &*self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        let tag = |k: &str| LeaseKey::new(k).map(|k| k.hash_tag().map(str::to_owned));
        assert_eq!(tag("order:{42}:lock"), Ok(Some("42".to_owned())));
        assert_eq!(tag("{a}{b}"), Ok(Some("a".to_owned())));
        assert_eq!(tag("x{}y"), Ok(None));
        assert_eq!(tag("a}b{c"), Ok(None));
        assert_eq!(tag("plain"), Ok(None));
    }

    #[test]
    fn refuses_bad_keys() {
        for bad in ["", "a\nb", "tab\there", "}abc", &"k".repeat(513)] {
            assert!(
                matches!(LeaseKey::new(bad), Err(InputError::InvalidKey { .. })),
                "{bad:?}"
            );
        }
        assert!(LeaseKey::new("k".repeat(512)).is_ok());
        assert!(LeaseKey::new("ünïcode:{ok}").is_ok());
        // A scheduled job's record, beside its run's lease.
        assert!(LeaseKey::new("job:{nightly}:record").is_err());
        assert!(LeaseKey::new("job:{nightly}:run").is_ok());
        assert!(LeaseKey::new("orders:{nightly}:record").is_ok());
    }

    #[test]
    fn a_key_with_a_hash_tag_cannot_name_a_fencing_counter() {
        // Stored as is, it would be the counter of "order:{42}" or "42".
        for bad in ["order:{42}:fence", "{42}:fence"] {
            let Err(InputError::InvalidKey { reason, .. }) = LeaseKey::new(bad) else {
                panic!("{bad:?} was accepted");
            };
            assert!(reason.contains(":fence"), "{reason}");
        }
        // Nor the limit of a semaphore.
        for bad in ["order:{42}:permits", "{42}:permits"] {
            let Err(InputError::InvalidKey { reason, .. }) = LeaseKey::new(bad) else {
                panic!("{bad:?} was accepted");
            };
            assert!(reason.contains(":permits"), "{reason}");
        }
        // Nor a lease's fair queue.
        for bad in ["doc:{42}:fair", "{42}:fair-places", "{42}:fair-asks"] {
            let Err(InputError::InvalidKey { reason, .. }) = LeaseKey::new(bad) else {
                panic!("{bad:?} was accepted");
            };
            assert!(reason.contains(":fair"), "{reason}");
        }
        assert!(LeaseKey::new("doc:fair").is_ok());
        // Nor a read-write lease's reader index or writer intent.
        for bad in ["doc:{42}:readers", "{42}:write-wanted"] {
            let Err(InputError::InvalidKey { reason, .. }) = LeaseKey::new(bad) else {
                panic!("{bad:?} was accepted");
            };
            assert!(reason.contains(":readers"), "{reason}");
        }
        assert!(LeaseKey::new("doc:readers").is_ok());
        // Nor a lease's minimum-hold mark.
        let Err(InputError::InvalidKey { reason, .. }) = LeaseKey::new("job:{7}:held-until") else {
            panic!("a minimum-hold mark's name was accepted");
        };
        assert!(reason.contains(":held-until"), "{reason}");
        assert!(LeaseKey::new("job:held-until").is_ok());
        // Without a hash tag the key is stored in braces, so it cannot.
        assert!(LeaseKey::new("reports:fence").is_ok());
        assert!(LeaseKey::new("reports:permits").is_ok());
        assert!(LeaseKey::new("order:{42}:fence:x").is_ok());
    }
}
