//! Fencing tokens.

use std::fmt;

/// A number that strictly increases per key with every acquisition.
///
/// Hand it to the stores the holder writes to: a store that remembers the
/// highest token it has seen and refuses smaller ones rejects every stale
/// holder, even one whose lease ran out while it was paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token's value.
    #[must_use]
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
