//! The PostgreSQL side of leasehold's fencing tokens: writes that the
//! database itself refuses from a stale lease holder, checked inside the
//! caller's transaction.
//!
//! A lease can end while its holder still works (a long pause, a lost
//! connection to Redis): the next holder gets a higher fencing token. A
//! [`Fence`] carries a holder's token to the database, which keeps, per
//! resource, the highest token that has passed and the lease key whose
//! tokens it compares (tokens of different keys do not compare). A lower
//! token is refused by the database, in the same statement that would
//! have let it in: the transaction is aborted, with every write in it.
//!
//! ```no_run
//! use leasehold::{FencingToken, LeaseKey};
//! use leasehold_postgres::{Fence, PgFenceError, tokio_postgres};
//!
//! # async fn job(token: FencingToken) -> Result<(), Box<dyn std::error::Error>> {
//! let (mut client, connection) =
//!     tokio_postgres::connect("host=127.0.0.1 user=app dbname=reports", tokio_postgres::NoTls)
//!         .await?;
//! tokio::spawn(connection);
//! leasehold_postgres::install(&client).await?; // the table and function; idempotent
//!
//! // `token`: the lease's fencing token (`work.fencing_token()` under leasehold).
//! let key = LeaseKey::new("reports:nightly")?;
//! let fence = Fence::new("report:2024-06-01", &key, token);
//!
//! // Every write of a transaction, fenced together:
//! let tx = client.transaction().await?;
//! fence.check(&tx).await?;
//! tx.execute("INSERT INTO report_rows (day, line) VALUES ('2024-06-01', 'a')", &[]).await?;
//! tx.execute("INSERT INTO report_rows (day, line) VALUES ('2024-06-01', 'b')", &[]).await?;
//! tx.commit().await?;
//!
//! // One write, fenced in one statement:
//! match fence
//!     .execute(&client, "UPDATE reports SET done = true WHERE day = '2024-06-01'", &[])
//!     .await
//! {
//!     Ok(_rows) => {}
//!     Err(PgFenceError::Stale { newer, .. }) => println!("lost the lease to the holder of token {newer}"),
//!     Err(other) => return Err(other.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! The table, `leasehold_fence` (created by [`install`] in the first schema
//! of the connection's `search_path`):
//!
//! | column                | type             | what it holds                                |
//! |-----------------------|------------------|----------------------------------------------|
//! | `resource` (key)      | `text`           | the name the writers give what they write    |
//! | `lease_key`           | `text`           | the lease key whose tokens the fence compares |
//! | `token`               | `numeric(20, 0)` | the highest fencing token that has passed    |
//! | `passed_at`           | `timestamptz`    | when a token last passed                     |
//!
//! `token` holds every `u64` (a `bigint` stops at 2^63 − 1), so no token
//! is out of range. A row lives as long as its resource: delete it with
//! the resource (deleting it alone lets any token of any key pass once).
//!
//! Over [`tokio_postgres`] (re-exported): [`Fence::check`] takes its
//! `Transaction`, the other calls any `GenericClient`. With deadpool-postgres,
//! pass the client or transaction it derefs to.

mod error;
mod fence;
mod sql;

pub use error::PgFenceError;
pub use fence::Fence;
pub use leasehold_core::{FencingToken, LeaseKey};
pub use tokio_postgres;

use tokio_postgres::GenericClient;

/// Creates the fence table (`leasehold_fence`) and the function that
/// refuses stale tokens (`leasehold_fence_refuse`) in the first schema of
/// the connection's `search_path`, if they are not there yet. Safe to run
/// at every start, from every process at once: installs wait for each
/// other on an advisory lock. Needs the right to create tables and
/// functions there (and PL/pgSQL, which every PostgreSQL has by default).
///
/// On a client outside a transaction the install is one transaction of its
/// own; inside a transaction it commits with it.
///
/// # Errors
///
/// [`PgFenceError::Postgres`] when PostgreSQL refuses (for example, no `CREATE`
/// right on the schema).
///
/// # Cancel safety
///
/// Not cancel safe: a dropped call may still install.
pub async fn install<C>(client: &C) -> Result<(), PgFenceError>
where
    C: GenericClient + Sync,
{
    client.batch_execute(sql::INSTALL).await?;
    Ok(())
}

/// What a resource's fence holds: the lease key it compares and the
/// highest token that has passed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct FenceState {
    /// The lease key whose tokens the fence compares.
    pub lease_key: String,
    /// The highest token that has passed.
    pub token: FencingToken,
}

/// Reads a resource's fence; `None` when no token has passed it yet.
/// Outside a transaction it reads the latest committed state; it does not
/// wait for a transaction that holds the fence.
///
/// # Errors
///
/// [`PgFenceError::NotInstalled`] without [`install`]; [`PgFenceError::Postgres`] otherwise.
///
/// # Cancel safety
///
/// Cancel safe: it only reads.
pub async fn inspect<C>(client: &C, resource: &str) -> Result<Option<FenceState>, PgFenceError>
where
    C: GenericClient + Sync,
{
    let unfenced = error::Writer {
        resource,
        lease_key: "",
        token: FencingToken(0),
    };
    let row = client
        .query_opt(sql::INSPECT, &[&resource])
        .await
        .map_err(|error| error::classify(error, &unfenced, |_| true))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let lease_key: String = row.try_get(0)?;
    let token: String = row.try_get(1)?;
    // The column's type and check keep it within u64, unless the table
    // is not the one install() makes.
    let token = token
        .parse::<u64>()
        .map(FencingToken)
        .map_err(|_| PgFenceError::NotAToken {
            resource: resource.to_owned(),
            value: token,
        })?;
    Ok(Some(FenceState { lease_key, token }))
}
