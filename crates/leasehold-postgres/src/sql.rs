//! The SQL the crate runs: the fence's table and function, and the one
//! statement that passes a fence.
//!
//! The table's columns are in the crate's documentation. Its token is a
//! `numeric(20, 0)` rather than a `bigint`: a [`FencingToken`] is a `u64`,
//! and a `bigint` stops at 2^63 − 1. leasehold's own tokens are
//! microseconds of the Redis server's clock (about 2^51 today), but a
//! token from elsewhere compares exactly too, up to 2^64 − 1, as in the
//! Redis fenced write. Tokens travel as text, so no numeric crate is needed.
//!
//! The fence statement is one `INSERT … ON CONFLICT (resource) DO UPDATE`:
//!
//! 1. A resource without a fence gets one at the writer's token.
//! 2. Otherwise PostgreSQL locks the fence's row (a concurrent writer's
//!    transaction that passed it first is waited for, and the row read again
//!    as it committed) and sets the token to the writer's when the lease key
//!    is the fence's and the token is at least the fence's: an equal token
//!    passes, so one holder writes as often as it likes.
//! 3. Else the `CASE` calls `leasehold_fence_refuse`, which raises an error:
//!    the statement fails, and so does the transaction around it, with every
//!    write made in it, before or after. The refusal is the database's own:
//!    a caller that ignores it cannot commit.
//!
//! The row lock taken in step 2 is held until the transaction ends: a
//! writer with a higher token waits for it, so the writes of a transaction
//! that passed the fence are ordered before those of the next holder.

use std::fmt::Write as _;

#[cfg(doc)]
use leasehold_core::FencingToken;

/// The SQLSTATE of a refused stale token; its detail is the fence's token.
pub(crate) const STALE_SQLSTATE: &str = "LH001";
/// The SQLSTATE of a refused lease key; its detail is the fence's lease key.
pub(crate) const OTHER_KEY_SQLSTATE: &str = "LH002";

/// Creates the table and the function, idempotently: one simple-query
/// string, so PostgreSQL runs it as one transaction; the advisory lock makes
/// concurrent installs wait for each other (two `CREATE TABLE IF NOT
/// EXISTS` at once can otherwise fail on the type they both create).
pub(crate) const INSTALL: &str = r"
SELECT pg_advisory_xact_lock(7021964581734211328); -- leasehold-postgres install

CREATE TABLE IF NOT EXISTS leasehold_fence (
    resource  text           PRIMARY KEY,
    lease_key text           NOT NULL,
    token     numeric(20, 0) NOT NULL CHECK (token >= 0 AND token <= 18446744073709551615),
    passed_at timestamptz    NOT NULL DEFAULT now()
);

COMMENT ON TABLE leasehold_fence IS
    'leasehold-postgres: per resource, the lease key that guards it and the highest fencing token that has passed';

CREATE OR REPLACE FUNCTION leasehold_fence_refuse(
    p_resource text, p_fence_key text, p_fence_token numeric, p_key text, p_token numeric)
RETURNS numeric
LANGUAGE plpgsql
AS $refuse$
BEGIN
    -- DETAIL carries the one value the client reads back: the fence's lease
    -- key, or its token in digits.
    IF p_fence_key IS DISTINCT FROM p_key THEN
        RAISE EXCEPTION USING
            ERRCODE = 'LH002',
            MESSAGE = format('leasehold: resource %L is fenced by lease key %L, not %L',
                             p_resource, p_fence_key, p_key),
            DETAIL = p_fence_key,
            HINT = 'Tokens of different lease keys do not compare: guard a resource with one lease key.';
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'LH001',
        MESSAGE = format('leasehold: stale fencing token %s for resource %L (lease key %L): a newer holder passed with token %s',
                         p_token, p_resource, p_key, p_fence_token),
        DETAIL = p_fence_token::text,
        HINT = 'This holder has lost its lease: stop writing. The transaction is aborted.';
END
$refuse$;

COMMENT ON FUNCTION leasehold_fence_refuse(text, text, numeric, text, numeric) IS
    'leasehold-postgres: raises LH001 (stale token; DETAIL: the fence''s token) or LH002 (another lease key; DETAIL: the fence''s key)';
";

/// Reads a resource's fence: lease key and token (as text).
pub(crate) const INSPECT: &str =
    "SELECT lease_key, token::text FROM leasehold_fence WHERE resource = $1";

/// The statement that passes a fence, with the resource, lease key and
/// token (all `text`) at parameters `$first`, `$first + 1`, `$first + 2`.
pub(crate) fn pass_fence(first: usize) -> String {
    let (resource, key, token) = (first, first + 1, first + 2);
    let mut sql = String::new();
    // Writing to a String cannot fail.
    let _ = write!(
        sql,
        "INSERT INTO leasehold_fence AS fence (resource, lease_key, token) \
         VALUES (${resource}::text, ${key}::text, ${token}::text::numeric) \
         ON CONFLICT (resource) DO UPDATE SET \
         token = CASE \
         WHEN fence.lease_key = excluded.lease_key AND fence.token <= excluded.token \
         THEN excluded.token \
         ELSE leasehold_fence_refuse(fence.resource, fence.lease_key, fence.token, \
         excluded.lease_key, excluded.token) \
         END, \
         passed_at = now()"
    );
    sql
}

/// The name of the fence's part in a fenced statement.
pub(crate) const FENCE_CTE: &str = "leasehold_fence_passed";

/// The caller's statement with the fence in front, as a data-modifying
/// `WITH` entry (PostgreSQL runs those exactly once and to completion,
/// whether or not the statement reads them, and an error in one fails the
/// whole statement). A statement that has a `WITH` (or `WITH RECURSIVE`)
/// list of its own gets the fence as the list's first entry.
///
/// Returns the statement and how many characters the fence's part takes
/// at its start (PostgreSQL reports error positions in characters).
pub(crate) fn fenced(statement: &str, first: usize) -> (String, usize) {
    let statement = statement.trim_start();
    let entry = format!("{FENCE_CTE} AS ({})", pass_fence(first));
    let (head, rest) = if let Some(rest) = strip_keyword(statement, "WITH") {
        match strip_keyword(rest, "RECURSIVE") {
            Some(rest) => (format!("WITH RECURSIVE {entry},"), rest),
            None => (format!("WITH {entry},"), rest),
        }
    } else {
        (format!("WITH {entry}"), statement)
    };
    let prefix = head.chars().count();
    (format!("{head} {rest}"), prefix)
}

/// `text` without a leading `keyword` (any case) and the white space after
/// it; `None` when it does not start with the keyword as a whole word.
fn strip_keyword<'a>(text: &'a str, keyword: &str) -> Option<&'a str> {
    let head = text.get(..keyword.len())?;
    let rest = &text[keyword.len()..];
    let word_ends = rest.chars().next().is_some_and(char::is_whitespace);
    (head.eq_ignore_ascii_case(keyword) && word_ends).then(|| rest.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_goes_in_front_of_a_plain_statement() {
        let (sql, prefix) = fenced("  UPDATE t SET v = $1 WHERE id = $2", 3);
        assert!(sql.starts_with("WITH leasehold_fence_passed AS (INSERT INTO leasehold_fence"));
        assert!(sql.contains("VALUES ($3::text, $4::text, $5::text::numeric)"));
        assert!(
            sql.ends_with(") UPDATE t SET v = $1 WHERE id = $2"),
            "{sql}"
        );
        assert_eq!(
            &sql[..prefix],
            &sql[..sql.find(" UPDATE t").expect("the statement")]
        );
    }

    #[test]
    fn the_fence_joins_a_with_list() {
        let (sql, _) = fenced("with x as (select 1) insert into t select * from x", 1);
        assert!(sql.starts_with("WITH leasehold_fence_passed AS ("));
        assert!(
            sql.ends_with("), x as (select 1) insert into t select * from x"),
            "{sql}"
        );
        let (sql, _) = fenced("WITH RECURSIVE r(n) AS (SELECT 1) DELETE FROM t", 1);
        assert!(sql.starts_with("WITH RECURSIVE leasehold_fence_passed AS ("));
        assert!(
            sql.ends_with("), r(n) AS (SELECT 1) DELETE FROM t"),
            "{sql}"
        );
    }

    #[test]
    fn a_word_that_starts_with_with_is_not_a_with_list() {
        let (sql, _) = fenced("withdraw_all()", 1);
        assert!(sql.ends_with(") withdraw_all()"), "{sql}");
        assert_eq!(strip_keyword("WITH", "WITH"), None);
        assert_eq!(strip_keyword("wItH\n x", "WITH"), Some("x"));
        assert_eq!(strip_keyword("é", "WITH"), None);
    }
}
