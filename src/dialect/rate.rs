//! The statements of a queue's rate limiter: a token bucket kept in one row of the limiter table
//! the user declares ([`Table::limits`](crate::Table::limits)), refilled by the time elapsed on
//! the database's clock, so that runners on different hosts agree.
//!
//! The table has four columns, each with a fixed name: `name` (the queue's key, the primary
//! key), `tokens` and `refilled_at` (the tokens in the bucket at that time, in seconds since
//! the epoch by the database's clock: both floating point), and `granted` (the tokens the last
//! grant gave, which the grant returns). The grant creates the row on first use (an upsert),
//! with a full bucket.
//!
//! The grant binds the queue's key, then the tokens wanted; it returns the tokens granted and
//! the tokens left, in millionths. PostgreSQL and SQLite grant in one `INSERT .. ON CONFLICT ..
//! DO UPDATE .. RETURNING`; MySQL/MariaDB, without `RETURNING`, in one transaction of an
//! `INSERT .. ON DUPLICATE KEY UPDATE` (whose assignments run in order, each seeing those
//! before: `refilled_at` comes last, and no assignment reads a column assigned before it) and a
//! `SELECT` of what it wrote; its placeholders are positional, so the tokens wanted are bound
//! twice ([`RateStatements::wants`]). The give-back binds the tokens given back, then the key.

use crate::config::RateLimit;
use crate::error::Result;
use crate::table::Dialect;

/// The rendered statements of one queue's limiter.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateStatements {
    /// The grant: one statement, or (MySQL/MariaDB) the upsert then the read, in a transaction.
    pub(crate) grant: Vec<String>,
    /// How many times the grant's upsert binds the tokens wanted, after the key.
    pub(crate) wants: usize,
    /// Gives unused tokens back, the bucket still capped at its burst.
    pub(crate) give_back: String,
}

/// The seconds since the epoch by the database's clock.
fn now(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
        Dialect::MySql => "UNIX_TIMESTAMP(NOW(6))",
        Dialect::Sqlite => "((julianday('now') - 2440587.5) * 86400.0)",
    }
}

/// The smaller of `a` and `b` (SQLite's two-argument `MIN` is its `LEAST`).
fn least(dialect: Dialect, a: &str, b: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("MIN({a}, {b})"),
        _ => format!("LEAST({a}, {b})"),
    }
}

fn greatest(dialect: Dialect, a: &str, b: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("MAX({a}, {b})"),
        _ => format!("GREATEST({a}, {b})"),
    }
}

/// The limiter's statements on the (unquoted) table `table`, for `limit`.
pub(crate) fn statements(
    dialect: Dialect,
    table: &str,
    limit: &RateLimit,
) -> Result<RateStatements> {
    let table = dialect.quote_table(table)?;
    let q = |column: &str| dialect.quote(column);
    let (name, tokens, at, granted) = (q("name")?, q("tokens")?, q("refilled_at")?, q("granted")?);
    // Numbers of the declaration, written as literals: they are no user text.
    let rate = format!("{:?}", limit.per_second());
    let burst = format!("{}.0", limit.burst);
    let now = now(dialect);
    // PostgreSQL's upsert sees the row proposed too (`excluded`): the row's columns are
    // qualified by the table's alias.
    let (tokens_in, at_in) = match dialect {
        Dialect::Postgres => (format!("l.{tokens}"), format!("l.{at}")),
        _ => (tokens.clone(), at.clone()),
    };
    let (key, want) = match dialect {
        Dialect::Postgres => ("$1", "CAST($2 AS BIGINT)"),
        Dialect::MySql => ("?", "?"),
        Dialect::Sqlite => ("?1", "?2"),
    };
    // The tokens now: those at the last refill, plus the time since at the rate, at most the
    // burst (a clock that went back refills nothing).
    let elapsed = greatest(dialect, "0", &format!("{now} - {at_in}"));
    let available = least(
        dialect,
        &burst,
        &format!("{tokens_in} + {elapsed} * {rate}"),
    );
    // SQLite has no FLOOR without its math functions; the tokens are never negative, so a cast
    // (which truncates) floors them.
    let whole = match dialect {
        Dialect::Sqlite => format!("CAST({available} AS INTEGER)"),
        _ => format!("FLOOR({available})"),
    };
    let granting = least(dialect, want, &whole);
    let granting = match dialect {
        Dialect::Postgres => format!("CAST({granting} AS BIGINT)"),
        Dialect::MySql => format!("CAST({granting} AS SIGNED)"),
        Dialect::Sqlite => format!("CAST({granting} AS INTEGER)"),
    };
    let later = greatest(dialect, &at_in, now);
    let alias = if dialect == Dialect::Postgres {
        " AS l"
    } else {
        ""
    };
    let insert = format!(
        "INSERT INTO {table}{alias} ({name}, {tokens}, {at}, {granted}) \
         VALUES ({key}, {burst}, {now}, 0)"
    );
    let left_millionths = |tokens: &str| match dialect {
        Dialect::Postgres => format!("CAST({tokens} * 1000000 AS BIGINT)"),
        Dialect::MySql => format!("CAST({tokens} * 1000000 AS SIGNED)"),
        Dialect::Sqlite => format!("CAST({tokens} * 1000000 AS INTEGER)"),
    };
    let grant = match dialect {
        Dialect::MySql => vec![
            // MySQL/MariaDB run the assignments in order, each seeing those before it: each
            // reads only columns assigned after it (`refilled_at` last), so they mean what they
            // would read all at once.
            format!(
                "{insert} ON DUPLICATE KEY UPDATE {granted} = {granting}, \
                 {tokens} = {available} - {granting}, {at} = {later}"
            ),
            format!(
                "SELECT {granted}, {} FROM {table} WHERE {name} = ?",
                left_millionths(&tokens)
            ),
        ],
        _ => vec![format!(
            "{insert} ON CONFLICT ({name}) DO UPDATE SET {granted} = {granting}, \
             {tokens} = {available} - {granting}, {at} = {later} RETURNING {granted}, {}",
            left_millionths(&tokens_in)
        )],
    };
    let (back, key) = match dialect {
        Dialect::Postgres => ("CAST($1 AS BIGINT)", "$2"),
        Dialect::MySql => ("?", "?"),
        Dialect::Sqlite => ("?1", "?2"),
    };
    let give_back = format!(
        "UPDATE {table} SET {tokens} = {} WHERE {name} = {key}",
        least(dialect, &burst, &format!("{tokens} + {back}"))
    );
    let wants = if dialect == Dialect::MySql { 2 } else { 1 };
    Ok(RateStatements {
        grant,
        wants,
        give_back,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limit() -> RateLimit {
        RateLimit::new(200, Duration::from_secs(1))
    }

    #[test]
    fn postgres_grants_in_one_upsert() {
        let s = statements(Dialect::Postgres, "job_limits", &limit()).unwrap();
        assert_eq!(s.grant.len(), 1);
        let now = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)";
        let available =
            format!("LEAST(200.0, l.\"tokens\" + GREATEST(0, {now} - l.\"refilled_at\") * 200.0)");
        let granting = format!("CAST(LEAST(CAST($2 AS BIGINT), FLOOR({available})) AS BIGINT)");
        assert_eq!(
            s.grant[0],
            format!(
                "INSERT INTO \"job_limits\" AS l (\"name\", \"tokens\", \"refilled_at\", \"granted\") \
                 VALUES ($1, 200.0, {now}, 0) ON CONFLICT (\"name\") DO UPDATE SET \
                 \"granted\" = {granting}, \"tokens\" = {available} - {granting}, \
                 \"refilled_at\" = GREATEST(l.\"refilled_at\", {now}) RETURNING \"granted\", \
                 CAST(l.\"tokens\" * 1000000 AS BIGINT)"
            )
        );
        assert_eq!(
            s.give_back,
            "UPDATE \"job_limits\" SET \"tokens\" = LEAST(200.0, \"tokens\" + CAST($1 AS BIGINT)) \
             WHERE \"name\" = $2"
        );
    }

    #[test]
    fn mysql_grants_in_an_upsert_and_a_read() {
        let s = statements(Dialect::MySql, "job_limits", &limit()).unwrap();
        assert_eq!(s.grant.len(), 2);
        assert!(s.grant[0].contains(
            "ON DUPLICATE KEY UPDATE `granted` = CAST(LEAST(?, FLOOR(LEAST(200.0, `tokens` + \
             GREATEST(0, UNIX_TIMESTAMP(NOW(6)) - `refilled_at`) * 200.0))) AS SIGNED), \
             `tokens` = LEAST(200.0, `tokens` + GREATEST(0, UNIX_TIMESTAMP(NOW(6)) - \
             `refilled_at`) * 200.0) - CAST(LEAST(?, FLOOR("
        ));
        assert_eq!(
            s.grant[1],
            "SELECT `granted`, CAST(`tokens` * 1000000 AS SIGNED) FROM `job_limits` \
             WHERE `name` = ?"
        );
    }

    #[test]
    fn sqlite_uses_its_two_argument_min_and_max() {
        let s = statements(Dialect::Sqlite, "job_limits", &limit()).unwrap();
        assert!(
            s.grant[0].contains("MIN(?2, CAST(MIN(200.0, `tokens` + MAX(0, "),
            "{}",
            s.grant[0]
        );
        assert_eq!(
            s.give_back,
            "UPDATE `job_limits` SET `tokens` = MIN(200.0, `tokens` + ?1) WHERE `name` = ?2"
        );
    }

    #[test]
    fn a_slow_rate_is_a_fraction_per_second() {
        let limit = RateLimit::new(3, Duration::from_secs(60));
        let s = statements(Dialect::Postgres, "l", &limit).unwrap();
        assert!(s.grant[0].contains("* 0.05)"), "{}", s.grant[0]);
    }
}
