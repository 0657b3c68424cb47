//! [`Fence`]: a resource, the lease key that guards it, and a holder's token.

use leasehold_core::{FencingToken, LeaseKey};
use tokio_postgres::error::ErrorPosition;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, Row, Transaction};

use crate::error::{PgFenceError, Writer, classify};
use crate::sql;

/// A holder's pass for one resource: the resource's name, the lease key
/// that guards it, and the holder's fencing token.
///
/// The database keeps, per resource, the highest token that has passed
/// (in the table [`install`](crate::install) creates). A token at least as
/// high passes and raises the fence to itself; a lower one is refused by
/// the database ([`PgFenceError::Stale`]), and so is a token of another lease key
/// ([`PgFenceError::OtherKey`]), since tokens of different keys do not compare.
///
/// Three ways to use it:
///
/// - [`check`](Fence::check) inside the caller's transaction: every write of
///   the transaction is fenced together, and commits or rolls back with
///   the fence;
/// - [`execute`](Fence::execute) / [`query`](Fence::query): one statement,
///   the fence and the caller's insert, update or delete, atomic even
///   without a transaction;
/// - [`seal`](Fence::seal): raise the fence and write nothing, so that a
///   previous holder's late writes are refused before this holder writes.
///
/// ```no_run
/// use leasehold::{FencingToken, LeaseKey};
/// use leasehold_postgres::{Fence, tokio_postgres};
///
/// # async fn job(token: FencingToken) -> Result<(), Box<dyn std::error::Error>> {
/// let (mut client, connection) =
///     tokio_postgres::connect("host=127.0.0.1 user=app dbname=reports", tokio_postgres::NoTls)
///         .await?;
/// tokio::spawn(connection);
/// leasehold_postgres::install(&client).await?; // once per database; idempotent
///
/// // `token` is the lease's fencing token (`work.fencing_token()`).
/// let key = LeaseKey::new("reports:nightly")?;
/// let fence = Fence::new("report:2024-06-01", &key, token);
/// let tx = client.transaction().await?;
/// fence.check(&tx).await?; // a stale token: Err(PgFenceError::Stale), the transaction aborted
/// tx.execute("DELETE FROM report_rows WHERE day = '2024-06-01'", &[]).await?;
/// tx.execute("INSERT INTO report_rows (day, line) VALUES ('2024-06-01', 'total: 42')", &[])
///     .await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    resource: String,
    lease_key: LeaseKey,
    token: FencingToken,
    /// The lease key and the token as the statements take them.
    key_text: String,
    token_text: String,
}

impl Fence {
    /// The fence of `resource` (any name the writers agree on, such as a
    /// table and a row's key), guarded by the lease `lease_key`, for the
    /// holder of `token`.
    ///
    /// A permit's or a read-write share's key stands for its semaphore's
    /// or lease's ([`LeaseKey::counted_as`]), whose fencing counter hands
    /// out its tokens, as in the Redis fenced write.
    pub fn new(resource: impl Into<String>, lease_key: &LeaseKey, token: FencingToken) -> Self {
        let lease_key = lease_key.counted_as();
        Self {
            resource: resource.into(),
            key_text: lease_key.as_str().to_owned(),
            lease_key,
            token,
            token_text: token.get().to_string(),
        }
    }

    /// The resource's name.
    #[must_use]
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The lease key whose tokens the fence compares.
    #[must_use]
    pub fn lease_key(&self) -> &LeaseKey {
        &self.lease_key
    }

    /// The holder's fencing token.
    #[must_use]
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Passes the fence inside the caller's transaction: one statement
    /// that raises the resource's fence to this token, or fails if a newer
    /// token has passed.
    ///
    /// On success the transaction holds the fence's row lock until it
    /// ends: a holder with a higher token waits for this transaction, so
    /// every write in it, before or after the check, commits (or rolls
    /// back) before the next holder's. A holder with a lower token waits
    /// too, and is refused once this one commits.
    ///
    /// Call it before the transaction's writes, or after them: either way
    /// they are fenced together. Waiting on the lock is bounded only by
    /// the transaction's `lock_timeout` (`SET LOCAL lock_timeout = '5s'`).
    ///
    /// # Errors
    ///
    /// [`PgFenceError::Stale`] (a newer holder passed) and [`PgFenceError::OtherKey`]:
    /// refused by the database, which has aborted the transaction (writes
    /// made in it are gone, and `COMMIT` rolls back). [`PgFenceError::NotInstalled`]
    /// without [`install`](crate::install); [`PgFenceError::Postgres`] otherwise
    /// (under `REPEATABLE READ`, a fence raised by a concurrent transaction
    /// is a serialization failure: [`PgFenceError::is_retryable`]).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may still pass the fence on the
    /// server. Drop the transaction too (it rolls back).
    pub async fn check(&self, tx: &Transaction<'_>) -> Result<(), PgFenceError> {
        self.pass(tx).await
    }

    /// Raises the resource's fence to this token and writes nothing else:
    /// a new holder seals a resource before its work, so that the previous
    /// holder's late writes are refused even where the new one has not
    /// written yet. On a client outside a transaction it is committed at
    /// once; in a transaction, with it.
    ///
    /// ```no_run
    /// # use leasehold_postgres::{FencingToken, LeaseKey, tokio_postgres::Client};
    /// # async fn seal(client: &Client, key: &LeaseKey, token: FencingToken) -> Result<(), leasehold_postgres::PgFenceError> {
    /// use leasehold_postgres::Fence;
    ///
    /// // Right after acquiring the lease, before any work:
    /// Fence::new("report:2024-06-01", key, token).seal(client).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check`](Fence::check).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may still raise the fence.
    pub async fn seal<C>(&self, client: &C) -> Result<(), PgFenceError>
    where
        C: GenericClient + Sync,
    {
        self.pass(client).await
    }

    /// Runs the caller's statement and the fence as one statement: the
    /// write happens only if the fence passes, and the fence is raised only
    /// if the write succeeds, with or without a transaction around it.
    /// Returns the number of rows the statement affected.
    ///
    /// The statement is one `INSERT`, `UPDATE` or `DELETE` (or any
    /// statement that may follow a `WITH` list), with parameters `$1` to
    /// `$n` for the `n` values of `params`; the fence takes the next three.
    /// It goes in front as the data-modifying `WITH` entry
    /// `leasehold_fence_passed`, which PostgreSQL runs whether or not the
    /// statement reads it; a statement that starts with its own `WITH` list
    /// gets it as the first entry of that list. The statement cannot see
    /// the fence's change (one snapshot for the whole statement), and need
    /// not.
    ///
    /// ```no_run
    /// # use leasehold_postgres::{FencingToken, LeaseKey, tokio_postgres::Client};
    /// # async fn write(client: &Client, key: &LeaseKey, token: FencingToken) -> Result<(), leasehold_postgres::PgFenceError> {
    /// use leasehold_postgres::Fence;
    ///
    /// let fence = Fence::new("report:2024-06-01", key, token);
    /// let rows = fence
    ///     .execute(
    ///         client,
    ///         "UPDATE reports SET body = $1 WHERE day = '2024-06-01'",
    ///         &[&"total: 42"],
    ///     )
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`check`](Fence::check); in a transaction, a refusal aborts it.
    /// An error of the caller's statement is [`PgFenceError::Postgres`] (and the
    /// fence is not raised).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may still write, fenced.
    pub async fn execute<C>(
        &self,
        client: &C,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, PgFenceError>
    where
        C: GenericClient + Sync,
    {
        let (sql, prefix) = sql::fenced(statement, params.len() + 1);
        let params = self.with_fence_params(params);
        client
            .execute(sql.as_str(), &params)
            .await
            .map_err(|error| classify(error, &self.writer(), |db| in_prefix(db, prefix)))
    }

    /// As [`execute`](Fence::execute), for a statement that returns rows
    /// (`INSERT … RETURNING id`); returns them.
    ///
    /// # Errors
    ///
    /// As [`execute`](Fence::execute).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a dropped call may still write, fenced.
    pub async fn query<C>(
        &self,
        client: &C,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, PgFenceError>
    where
        C: GenericClient + Sync,
    {
        let (sql, prefix) = sql::fenced(statement, params.len() + 1);
        let params = self.with_fence_params(params);
        client
            .query(sql.as_str(), &params)
            .await
            .map_err(|error| classify(error, &self.writer(), |db| in_prefix(db, prefix)))
    }

    /// The fence statement alone, typed so that it takes one round trip.
    async fn pass<C>(&self, client: &C) -> Result<(), PgFenceError>
    where
        C: GenericClient + Sync,
    {
        client
            .execute_typed(
                &sql::pass_fence(1),
                &[
                    (&self.resource, Type::TEXT),
                    (&self.key_text, Type::TEXT),
                    (&self.token_text, Type::TEXT),
                ],
            )
            .await
            // The statement is the fence's alone: a missing table or
            // function is the fence's.
            .map(drop)
            .map_err(|error| classify(error, &self.writer(), |_| true))
    }

    fn with_fence_params<'a>(
        &'a self,
        params: &[&'a (dyn ToSql + Sync)],
    ) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut all = Vec::with_capacity(params.len() + 3);
        all.extend_from_slice(params);
        all.push(&self.resource);
        all.push(&self.key_text);
        all.push(&self.token_text);
        all
    }

    fn writer(&self) -> Writer<'_> {
        Writer {
            resource: &self.resource,
            lease_key: &self.key_text,
            token: self.token,
        }
    }
}

/// Whether a database error points into the fence's part of a fenced
/// statement (the first `prefix` characters; positions count from 1).
fn in_prefix(db: &tokio_postgres::error::DbError, prefix: usize) -> bool {
    matches!(
        db.position(),
        Some(ErrorPosition::Original(position))
            if usize::try_from(*position).is_ok_and(|p| p >= 1 && p <= prefix)
    )
}
