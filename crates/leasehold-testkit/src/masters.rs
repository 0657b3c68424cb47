//! Independent masters, for Redlock.

use crate::{RedisServer, TestkitError};

/// Starts `n` standalone servers that know nothing of each other, as
/// Redlock needs.
///
/// ```no_run
/// # fn main() -> Result<(), leasehold_testkit::TestkitError> {
/// let masters = leasehold_testkit::independent_masters(3)?;
/// let urls: Vec<String> = masters.iter().map(|m| m.url()).collect();
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// As [`RedisServer::start`]; servers started before the failure are killed.
pub fn independent_masters(n: usize) -> Result<Vec<RedisServer>, TestkitError> {
    (0..n).map(|_| RedisServer::start()).collect()
}
