//! The unguessable identity of one acquisition.

use std::fmt;

use crate::InputError;

/// 128 random bits from the operating system's CSPRNG naming one acquisition.
///
/// A backend only renews or releases a lease for the holder id that acquired
/// it, and ids are never shown in full by `Debug` or `Display` (only their
/// first 8 hex digits), so no other process can guess or read one from logs.
///
/// ```
/// use leasehold_core::HolderId;
/// let a = HolderId::generate()?;
/// let b = HolderId::generate()?;
/// assert_ne!(a, b);
/// assert_eq!(a.to_hex().len(), 32);
/// # Ok::<(), leasehold_core::InputError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HolderId([u8; 16]);

const HEX: &[u8; 16] = b"0123456789abcdef";

impl HolderId {
    /// Draws a new holder id from the operating system's random source.
    ///
    /// # Errors
    ///
    /// [`InputError::Entropy`] if the operating system cannot supply random bytes.
    pub fn generate() -> Result<Self, InputError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| InputError::Entropy(e.to_string()))?;
        Ok(Self(bytes))
    }

    /// The id as 32 lowercase hexadecimal digits: the form stored on the server.
    #[must_use]
    pub fn to_hex(&self) -> String {
        self.to_hex_bytes().iter().map(|&c| char::from(c)).collect()
    }

    /// The same 32 lowercase hexadecimal digits as [`HolderId::to_hex`], as
    /// bytes on the stack: for writing the id into a request without
    /// allocating.
    ///
    /// ```
    /// use leasehold_core::HolderId;
    /// let id = HolderId::generate()?;
    /// assert_eq!(&id.to_hex_bytes()[..], id.to_hex().as_bytes());
    /// # Ok::<(), leasehold_core::InputError>(())
    /// ```
    #[must_use]
    pub fn to_hex_bytes(&self) -> [u8; 32] {
        let mut hex = [0u8; 32];
        for (pair, b) in hex.chunks_exact_mut(2).zip(self.0) {
            pair[0] = HEX[usize::from(b >> 4)];
            pair[1] = HEX[usize::from(b & 0xf)];
        }
        hex
    }

    /// Parses the form written by [`HolderId::to_hex`].
    ///
    /// # Errors
    ///
    /// [`InputError::InvalidHolderId`] unless `s` is 32 hexadecimal digits.
    pub fn from_hex(s: &str) -> Result<Self, InputError> {
        let digits = s.as_bytes();
        if digits.len() != 32 {
            return Err(InputError::InvalidHolderId);
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(InputError::InvalidHolderId),
        };
        let mut bytes = [0u8; 16];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            bytes[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
        }
        Ok(Self(bytes))
    }

    /// The first 8 hex digits: enough to tell holders apart in logs, too few
    /// to act as the holder.
    #[must_use]
    pub fn short(&self) -> String {
        let mut hex = self.to_hex();
        hex.truncate(8);
        hex
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", self.short())
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({}…)", self.short())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_debug_hides_the_id() -> Result<(), InputError> {
        let id = HolderId::generate()?;
        assert_eq!(HolderId::from_hex(&id.to_hex())?, id);
        assert!(!format!("{id:?} {id}").contains(&id.to_hex()));
        assert_eq!(HolderId::from_hex("xyz"), Err(InputError::InvalidHolderId));
        assert_eq!(
            HolderId::from_hex(&"g".repeat(32)),
            Err(InputError::InvalidHolderId)
        );
        Ok(())
    }
}
