//! The error type of the crate, and how a database error becomes one.

use leasehold_core::FencingToken;
use tokio_postgres::error::{DbError, SqlState};

use crate::sql;

/// What can go wrong with a fence: the two refusals the database makes
/// ([`Stale`](PgFenceError::Stale), [`OtherKey`](PgFenceError::OtherKey)), a database
/// without the fence ([`NotInstalled`](PgFenceError::NotInstalled)), and anything
/// else PostgreSQL or the connection reports.
///
/// After a refusal inside a transaction, the transaction is aborted: its
/// writes are gone, further statements fail, and `COMMIT` rolls back.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum PgFenceError {
    /// A newer holder of the lease has passed the resource's fence: this
    /// holder's lease is lost, and the database refused its write.
    #[error(
        "stale fencing token {token} for resource {resource:?} (lease key {lease_key:?}): a newer \
         holder passed the fence with token {newer}, so the database refused the write and \
         aborted the transaction; this holder has lost the lease: stop writing"
    )]
    Stale {
        /// The resource written to.
        resource: String,
        /// The lease key whose tokens the fence compares.
        lease_key: String,
        /// This holder's token.
        token: FencingToken,
        /// The token at the fence, higher than `token`.
        newer: FencingToken,
    },

    /// The resource's fence compares the tokens of another lease key:
    /// tokens of different keys say nothing about each other, so the
    /// database refused the write.
    #[error(
        "resource {resource:?} is fenced by lease key {fenced_by:?}, not {lease_key:?}: tokens of \
         different lease keys do not compare, so the database refused the write; guard the \
         resource with one lease key (to hand it to another key for good, delete its row from \
         leasehold_fence)"
    )]
    OtherKey {
        /// The resource written to.
        resource: String,
        /// The lease key the writer gave.
        lease_key: String,
        /// The lease key the fence belongs to.
        fenced_by: String,
    },

    /// The fence's table or function is not in this database (or not on
    /// the connection's `search_path`).
    #[error(
        "the leasehold_fence table or its function is missing from this database (or from the \
         connection's search_path): call leasehold_postgres::install(&client) once (it is \
         idempotent) before fencing"
    )]
    NotInstalled {
        /// PostgreSQL's error (undefined table or function).
        #[source]
        source: tokio_postgres::Error,
    },

    /// The fence table holds something that is not a fencing token: it
    /// was not made by [`install`](crate::install).
    #[error(
        "the fence of resource {resource:?} holds {value:?}, which is not a fencing token (an \
         integer from 0 to 2^64 - 1): the leasehold_fence table was not made by \
         leasehold_postgres::install; drop it and install again"
    )]
    NotAToken {
        /// The resource whose fence was read.
        resource: String,
        /// What the fence holds.
        value: String,
    },

    /// PostgreSQL failed the statement for another reason (the caller's
    /// statement, permissions, a lost connection, a deadlock or a
    /// serialization failure between racing writers: see
    /// [`is_retryable`](PgFenceError::is_retryable)).
    ///
    /// Converted from the driver's error, so that `?` works on the other
    /// statements of a fenced transaction too.
    #[error("PostgreSQL failed the statement{}", sqlstate_suffix(source))]
    Postgres {
        /// The driver's error; its source is the database's message.
        #[from]
        source: tokio_postgres::Error,
    },
}

impl PgFenceError {
    /// Whether the database refused the write: [`Stale`](PgFenceError::Stale) or
    /// [`OtherKey`](PgFenceError::OtherKey). A refused holder must stop; it will
    /// be refused again.
    #[must_use]
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            PgFenceError::Stale { .. } | PgFenceError::OtherKey { .. }
        )
    }

    /// Whether the transaction may succeed if run again from the start: a
    /// deadlock (`40P01`) or a serialization failure (`40001`, which a
    /// fence raised by a concurrent transaction gives under `REPEATABLE
    /// READ` or `SERIALIZABLE`). Run again, a stale holder is then refused.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            PgFenceError::Postgres { source } => matches!(
                source.code(),
                Some(code) if *code == SqlState::T_R_DEADLOCK_DETECTED
                    || *code == SqlState::T_R_SERIALIZATION_FAILURE
            ),
            _ => false,
        }
    }

    /// The newer token that won, for [`Stale`](PgFenceError::Stale).
    #[must_use]
    pub fn newer_token(&self) -> Option<FencingToken> {
        match self {
            PgFenceError::Stale { newer, .. } => Some(*newer),
            _ => None,
        }
    }
}

fn sqlstate_suffix(error: &tokio_postgres::Error) -> String {
    error
        .code()
        .map(|code| format!(" (SQLSTATE {})", code.code()))
        .unwrap_or_default()
}

/// Who a fence error is about, to fill in the refusals.
pub(crate) struct Writer<'a> {
    pub(crate) resource: &'a str,
    pub(crate) lease_key: &'a str,
    pub(crate) token: FencingToken,
}

/// Turns a driver error into ours. `ours` tells whether a database error
/// is about the fence's own part of the statement (for a missing table or
/// function: the caller's statement may name a missing table too).
pub(crate) fn classify(
    error: tokio_postgres::Error,
    writer: &Writer<'_>,
    ours: impl Fn(&DbError) -> bool,
) -> PgFenceError {
    let Some(db) = error.as_db_error() else {
        return PgFenceError::Postgres { source: error };
    };
    let code = db.code().code();
    if code == sql::STALE_SQLSTATE {
        // The refusal's detail is the fence's token, in digits (sql.rs).
        if let Ok(newer) = db.detail().unwrap_or_default().parse::<u64>() {
            return PgFenceError::Stale {
                resource: writer.resource.to_owned(),
                lease_key: writer.lease_key.to_owned(),
                token: writer.token,
                newer: FencingToken(newer),
            };
        }
    } else if code == sql::OTHER_KEY_SQLSTATE {
        // The refusal's detail is the fence's lease key (sql.rs).
        if let Some(fenced_by) = db.detail() {
            return PgFenceError::OtherKey {
                resource: writer.resource.to_owned(),
                lease_key: writer.lease_key.to_owned(),
                fenced_by: fenced_by.to_owned(),
            };
        }
    } else if (*db.code() == SqlState::UNDEFINED_TABLE
        || *db.code() == SqlState::UNDEFINED_FUNCTION)
        && ours(db)
    {
        return PgFenceError::NotInstalled { source: error };
    }
    PgFenceError::Postgres { source: error }
}
