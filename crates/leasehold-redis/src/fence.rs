//! Fenced writes: the store's side of the fencing token, on Redis.
//!
//! A lease's fencing token rises with every acquisition of its key, but it
//! protects nothing until the store compares it. A [`Fence`] is that
//! comparison, made by the server in one script (`fenced_write.lua`): a
//! value is written under a *resource* only when the writer's token is at
//! least the highest the resource has seen, and the resource's fence rises
//! to it in the same step. A write with a lower token (a holder that was
//! paused, cut off or slow, whose lease another holder has since taken) is
//! refused, and the refusal names the newer token that won.
//!
//! A new holder can [`seal`](Fence::seal) a resource before any work: the
//! fence rises to its token and nothing else is written, so the previous
//! holder's late writes are refused even where the new holder has not
//! written yet.
//!
//! Tokens compare within one lease key: a fence records the lease key whose
//! tokens it has seen, and a resource is named within that key's hash tag
//! (see [`KeyLayout::fenced`](crate::KeyLayout::fenced)), so it sits in the lease's cluster slot. A
//! write through the fence of another lease key with the same hash tag is
//! an error ([`BackendError::Server`], not transient), never a comparison
//! of unrelated tokens. Lease keys with different hash tags have resources
//! of their own.
//!
//! A fenced resource is the *user's* data, not leasehold's bookkeeping: its
//! value and its fence are one hash that lives as long as the user wants,
//! until deleted (`DEL` of [`Fence::key`]) or for the expiry its last write
//! set ([`Fence::expire_after`]). That expiry is the fence's too: a
//! resource that expired has forgotten the tokens it saw, so a holder paused
//! for longer than it can write there again. Choose an expiry longer than
//! any pause you want fenced, or none.

use std::time::Duration;

use leasehold_core::{BackendError, FencingToken, LeaseKey};

use crate::RedisBackend;
use crate::reply::{self, Failure, FenceAnswer};
use crate::scripts::{self, Fenced};

/// Values written under resources, each refused when its writer's fencing
/// token is below the highest the resource has seen, for the resources of
/// one lease key.
///
/// Made by [`RedisBackend::fence`]; cheap to clone (it shares the
/// backend's connection). Every call is one script run by the server, on
/// every topology (standalone, Sentinel, Cluster: the resource is in the
/// lease key's slot), bounded by the backend's op timeout and, under
/// [`wait_for_replicas`](crate::RedisBackendBuilder::wait_for_replicas),
/// acknowledged by the replicas as a grant is.
///
/// The storage layout is in [`KeyLayout::fenced`](crate::KeyLayout::fenced).
///
/// ```no_run
/// use leasehold_core::{AcquireOutcome, AcquireRequest, HolderId, LeaseBackend, LeaseKey, Ttl};
/// use leasehold_redis::{FencedWrite, RedisBackend};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let key = LeaseKey::new("reports:nightly")?;
/// let request = AcquireRequest::new(key.clone(), HolderId::generate()?, Ttl::parse("30s")?);
/// let AcquireOutcome::Acquired(grant) = backend.try_acquire(&request).await? else {
///     return Ok(()); // someone else runs tonight's report
/// };
/// let fence = backend.fence(&key);
/// // Refuse the late writes of whoever held the lease before us.
/// fence.seal("report:summary", grant.fencing_token).await?;
/// match fence.write("report:summary", grant.fencing_token, "42 rows").await? {
///     FencedWrite::Written => println!("stored"),
///     FencedWrite::Refused { newer } => println!("a newer holder ({newer}) took over; stop"),
/// }
/// if let Some(stored) = fence.read("report:summary").await? {
///     println!("{:?} under token {}", stored.value, stored.token);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Fence {
    backend: RedisBackend,
    /// The key whose tokens the fence compares (`counted_as`).
    lease: LeaseKey,
    expiry: Option<Duration>,
}

/// What a fenced [`write`](Fence::write) or [`seal`](Fence::seal) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[must_use]
pub enum FencedWrite {
    /// Done: the resource's fence is at the writer's token (it was at most
    /// that), and a write's value is stored.
    Written,
    /// Refused: the resource has seen a newer token, from a later holder of
    /// the lease; nothing was written. The writer has lost its lease: stop.
    Refused {
        /// The highest token the resource has seen.
        newer: FencingToken,
    },
}

/// A fenced resource as [`Fence::read`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencedValue {
    /// The value last written; `None` while the resource is sealed and no
    /// value was written.
    pub value: Option<Vec<u8>>,
    /// The resource's fence: the highest token written or sealed.
    pub token: FencingToken,
    /// The time the resource has left; `None` when it lives until deleted.
    pub ttl_left: Option<Duration>,
}

impl RedisBackend {
    /// The [`Fence`] of the resources guarded by `lease_key`: writes there
    /// are refused for tokens below the highest each resource has seen.
    ///
    /// A permit's or a read-write share's fence is its semaphore's or
    /// lease's, whose fencing counter hands out its tokens.
    #[must_use]
    pub fn fence(&self, lease_key: &LeaseKey) -> Fence {
        Fence {
            backend: self.clone(),
            lease: lease_key.counted_as(),
            expiry: None,
        }
    }
}

impl Fence {
    /// The longest resource name accepted, in bytes.
    pub const MAX_RESOURCE_LEN: usize = 512;

    /// The longest expiry accepted: 100 years. Leave the expiry unset for a
    /// resource that lives until deleted.
    pub const MAX_EXPIRY: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

    /// This fence, with every [`write`](Self::write) giving its resource an
    /// expiry of `expiry` from the write (rounded up to whole
    /// milliseconds), and every [`seal`](Self::seal) giving it to a
    /// resource it creates. Default: none, each write leaves its resource
    /// to live until deleted.
    ///
    /// The fence expires with the value: a writer paused for longer than
    /// `expiry` finds no fence and is let in.
    #[must_use]
    pub fn expire_after(mut self, expiry: Duration) -> Self {
        self.expiry = Some(expiry);
        self
    }

    /// The lease key whose tokens this fence compares.
    #[must_use]
    pub fn lease_key(&self) -> &LeaseKey {
        &self.lease
    }

    /// The Redis key of `resource` (see [`KeyLayout::fenced`](crate::KeyLayout::fenced)):
    /// a hash of its value and its fence, to read or delete by hand.
    ///
    /// # Errors
    ///
    /// [`BackendError::InvalidRequest`] for a resource name that is empty,
    /// longer than [`MAX_RESOURCE_LEN`](Self::MAX_RESOURCE_LEN) bytes, or
    /// holds a control character.
    pub fn key(&self, resource: &str) -> Result<String, BackendError> {
        self.checked("fence_key", resource)
    }

    /// Writes `value` under `resource` if `token` is at least the highest
    /// token the resource has seen, and raises its fence to `token`, in one
    /// step on the server. An equal token writes again (the same holder
    /// rewriting). Each write sets the resource's life: the fence's expiry
    /// ([`expire_after`](Self::expire_after)), or none.
    ///
    /// # Errors
    ///
    /// - [`BackendError::InvalidRequest`] for a bad resource name (see
    ///   [`key`](Self::key)) or an expiry of zero or above
    ///   [`MAX_EXPIRY`](Self::MAX_EXPIRY); nothing was sent.
    /// - [`BackendError::Server`] (not transient) when the resource's
    ///   fence compares another lease key's tokens (one with the same hash
    ///   tag); nothing was written.
    /// - [`BackendError::WrongType`] naming the resource's Redis key when
    ///   it holds something other than a hash.
    /// - A timeout, an unreachable server, or a write too few replicas
    ///   acknowledged: its outcome is unknown.
    ///
    /// # Cancel safety
    ///
    /// As for every backend operation: dropping the future leaves the
    /// effect unknown.
    pub async fn write(
        &self,
        resource: &str,
        token: FencingToken,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, BackendError> {
        const OP: &str = "fenced_write";
        let key = self.checked(OP, resource)?;
        let expiry = self.expiry_ms(OP)?;
        let call = scripts::fenced_write(
            &key,
            &self.lease,
            token,
            Fenced::Value(value.as_ref(), expiry),
        );
        self.send(OP, resource, &key, &call).await
    }

    /// Seals `resource` for `token`: raises its fence to `token` and writes
    /// nothing else, if `token` is at least the highest it has seen. Every
    /// later write with a lower token is refused, even before this holder
    /// writes there. The value and the expiry of an existing resource are
    /// left as they are; a resource the seal creates (a fence with no value
    /// yet) gets the fence's expiry, if it has one.
    ///
    /// # Errors
    ///
    /// As for [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// As for [`write`](Self::write).
    pub async fn seal(
        &self,
        resource: &str,
        token: FencingToken,
    ) -> Result<FencedWrite, BackendError> {
        const OP: &str = "fence_seal";
        let key = self.checked(OP, resource)?;
        let expiry = self.expiry_ms(OP)?;
        let call = scripts::fenced_write(&key, &self.lease, token, Fenced::Seal(expiry));
        self.send(OP, resource, &key, &call).await
    }

    /// Reads `resource`: its value, its fence and the time it has left, at
    /// one instant; `None` when it does not exist (never written or sealed,
    /// expired, or deleted).
    ///
    /// # Errors
    ///
    /// As for [`write`](Self::write), but nothing is written: a failure
    /// changed nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    pub async fn read(&self, resource: &str) -> Result<Option<FencedValue>, BackendError> {
        const OP: &str = "fence_read";
        let key = self.checked(OP, resource)?;
        let call = scripts::fence_read(&key);
        let reply = self
            .backend
            .eval(&call)
            .await
            .map_err(|f| self.failed(OP, &key, &f))?;
        let Some(read) = reply::fence_read(&reply).map_err(|f| self.failed(OP, &key, &f))? else {
            return Ok(None);
        };
        if read.lease != self.lease.as_str() {
            return Err(self.other_lease(OP, resource, &read.lease));
        }
        Ok(Some(FencedValue {
            value: read.value,
            token: read.token,
            ttl_left: read.ttl_left,
        }))
    }

    /// Sends a `fenced_write.lua` call and reads its answer.
    async fn send(
        &self,
        op: &'static str,
        resource: &str,
        key: &str,
        call: &scripts::Call,
    ) -> Result<FencedWrite, BackendError> {
        let reply = self
            .backend
            .eval_acked(call)
            .await
            .map_err(|f| self.failed(op, key, &f))?;
        match reply::fenced(&reply).map_err(|f| self.failed(op, key, &f))? {
            FenceAnswer::Done => Ok(FencedWrite::Written),
            FenceAnswer::Newer(newer) => Ok(FencedWrite::Refused { newer }),
            FenceAnswer::OtherLease(other) => Err(self.other_lease(op, resource, &other)),
        }
    }

    /// The Redis key of `resource`, once its name is checked.
    fn checked(&self, op: &'static str, resource: &str) -> Result<String, BackendError> {
        let refuse = |reason| BackendError::InvalidRequest {
            op,
            key: self.lease.as_str().to_owned(),
            reason,
        };
        if resource.is_empty() {
            return Err(refuse(
                "a fenced resource's name must not be empty; name the data the write stores",
            ));
        }
        if resource.len() > Self::MAX_RESOURCE_LEN {
            return Err(refuse(
                "a fenced resource's name may be at most 512 bytes long; use a shorter name",
            ));
        }
        if resource.chars().any(char::is_control) {
            return Err(refuse(
                "a fenced resource's name must not contain control characters such as newlines or tabs",
            ));
        }
        Ok(self.backend.layout().fenced(&self.lease, resource))
    }

    /// The fence's expiry in milliseconds, as the script takes it, once
    /// checked.
    fn expiry_ms(&self, op: &'static str) -> Result<Option<u64>, BackendError> {
        let Some(expiry) = self.expiry else {
            return Ok(None);
        };
        let refuse = |reason| BackendError::InvalidRequest {
            op,
            key: self.lease.as_str().to_owned(),
            reason,
        };
        if expiry.is_zero() {
            return Err(refuse(
                "a fence's expiry of zero would delete each resource as it is written; set at least 1ms, or none for resources that live until deleted",
            ));
        }
        if expiry > Self::MAX_EXPIRY {
            return Err(refuse(
                "a fence's expiry may be at most 100 years; set none for resources that live until deleted",
            ));
        }
        Ok(Some(scripts::expiry_millis(expiry)))
    }

    /// The error of a failed call: a key of another type is named by its
    /// Redis key (the resource's, not the lease's), the rest by the lease key.
    fn failed(&self, op: &'static str, key: &str, failure: &Failure) -> BackendError {
        match failure.for_key(op, &self.lease) {
            BackendError::WrongType { .. } => BackendError::WrongType {
                key: key.to_owned(),
            },
            other => other,
        }
    }

    /// The error of a call on a resource whose fence compares the tokens
    /// of the lease key `other`.
    fn other_lease(&self, op: &'static str, resource: &str, other: &str) -> BackendError {
        BackendError::Server {
            op,
            key: self.lease.as_str().to_owned(),
            detail: format!(
                "resource {:?} is fenced by lease key {:?}, whose tokens do not compare with this lease key's; use that lease key's fence, or another resource name",
                excerpt(resource),
                excerpt(other)
            ),
            transient: false,
        }
    }
}

/// At most 64 characters of user input, for an error message.
fn excerpt(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut cut: String = s.chars().take(MAX).collect();
        cut.push('…');
        cut
    }
}
