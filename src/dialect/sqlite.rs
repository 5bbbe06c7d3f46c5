//! SQLite statement text.

use super::common::{claimable, order, read_created};
use super::lease::lease_set;
use super::{Claim, Kind, Names, Slot};

/// The columns of a table: name, declared type, `YES` when it takes NULL, and how an insert that
/// leaves it out fills it (`default`: a default, or the rowid alias — the one `INTEGER PRIMARY
/// KEY` column —; empty: NULL or nothing). Binds the table name, then the schema (NULL: every
/// attached database, `main` first), twice. Generated columns are not listed (`table_info` hides
/// them), and so are neither copied nor checked.
pub(super) const CATALOG: &str = "SELECT name, type, CASE WHEN \"notnull\" = 0 AND pk = 0 \
     THEN 'YES' ELSE 'NO' END, CASE WHEN dflt_value IS NOT NULL THEN 'default' \
     WHEN pk = 1 AND lower(type) = 'integer' AND (SELECT COUNT(*) FROM pragma_table_info(?, ?) \
     WHERE pk > 0) = 1 THEN 'default' ELSE '' END FROM pragma_table_info(?, ?)";

/// The names of the attached databases (`main`, `temp`, and those ATTACHed), one a line.
pub(super) const ATTACHED: &str = "SELECT group_concat(name, char(10)) FROM pragma_database_list";

pub(super) fn qualified(schema: &str, table: &str, attached: Option<&[&str]>) -> String {
    let how = format!(
        "SQLite qualifies a table by the attached database it is in (`main.{table}`, \
         `temp.{table}`, or the name a database was ATTACHed as), not by a schema as PostgreSQL \
         does"
    );
    match attached {
        Some([]) => format!(
            "{how}: `{schema}` is not an attached database; write `{table}` or `main.{table}`"
        ),
        Some(attached) => format!(
            "{how}: `{schema}` is not an attached database (attached: {}); write `{table}` or \
             `main.{table}`",
            attached.join(", ")
        ),
        None => format!(
            "no table `{table}` in a database attached as `{schema}`; {how}: unless a database \
             was attached as `{schema}`, it is not an attached database; write `{table}` or \
             `main.{table}`"
        ),
    }
}

/// The attached database a table lives in, its name as the catalog spells it, and the database's
/// file, by name (case-insensitive, as SQLite resolves it: `temp`, then `main`, then the attached
/// databases in order); binds the table name, then the schema twice (NULL: any).
pub(super) const IDENTITY: &str = "SELECT t.schema, t.name, d.file, '' FROM pragma_table_list AS t \
     JOIN pragma_database_list AS d ON d.name = t.schema WHERE t.name = ? COLLATE NOCASE \
     AND (? IS NULL OR t.schema = ? COLLATE NOCASE) \
     ORDER BY CASE t.schema WHEN 'temp' THEN 0 WHEN 'main' THEN 1 ELSE 2 + d.seq END LIMIT 1";

/// SQLite has one writer: the claim is one `UPDATE .. WHERE id IN (SELECT .. LIMIT n)
/// RETURNING ..`, atomic without row locks.
pub(super) fn lease_claim(n: &Names, lease: &str) -> Claim {
    let mut w = n.writer();
    w.push("UPDATE ").push(&n.table);
    lease_set(&mut w, n, lease);
    w.push(" WHERE ")
        .push(&n.id)
        .push(" IN (SELECT ")
        .push(&n.id)
        .push(" FROM ")
        .push(&n.table)
        .push(" WHERE ");
    claimable(&mut w, n);
    order(&mut w, n);
    w.limit(Slot::Limit)
        .push(") RETURNING ")
        .push(&n.id)
        .push(", ");
    n.read_payload(&mut w, "");
    if let Some(attempt) = &n.attempt {
        w.push(", ").push(attempt).push(" - 1");
    }
    read_created(&mut w, n, "");
    Claim::Returning(w.finish())
}

/// Whether a column of declared type `ty` (lower case) holds `kind` (integers:
/// `types::integer_range`).
pub(super) fn accepts(kind: Kind, ty: &str) -> bool {
    let any = |names: &[&str]| names.iter().any(|name| ty.contains(name));
    match kind {
        Kind::Integer => false,
        Kind::Bytes => ty.is_empty() || ty.contains("blob"),
        Kind::Text => ty.is_empty() || any(&["char", "clob", "text"]),
        // Text affinity only: a column declared `JSON` has NUMERIC affinity, which turns a
        // payload that is a bare number into an INTEGER or REAL (and may round it).
        Kind::Json | Kind::Jsonb => any(&["char", "clob", "text"]),
        Kind::Time => ty.is_empty() || any(&["text", "char", "date", "time"]),
    }
}

/// The types that hold `kind`, in words.
pub(super) fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Bytes => "BLOB (a text or JSON payload: declare `Table::payload_type`)",
        Kind::Json | Kind::Jsonb => {
            "TEXT (a column declared JSON has numeric affinity: SQLite would change numbers)"
        }
        Kind::Time => "TEXT (RFC 3339, as sqlx writes chrono times)",
        Kind::Integer => "an integer type",
        Kind::Text => "a text type",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Claim, Dialect, Names, Slot};
    use crate::table::Table;

    #[test]
    fn lease_claim_is_one_update_returning() {
        let table = Table::new("jobs").retry_after("not_before");
        let n = Names::for_test(Dialect::Sqlite, table, None, "lease", false);
        let Claim::Returning(stmt) = super::lease_claim(&n, n.lease.as_deref().unwrap()) else {
            panic!("SQLite claims in one statement");
        };
        assert_eq!(
            stmt.text(),
            "UPDATE `jobs` SET `locked_until` = ? WHERE `id` IN (SELECT `id` FROM `jobs` \
             WHERE (`locked_until` IS NULL OR `locked_until` < ?) \
             AND (`not_before` IS NULL OR `not_before` <= ?) ORDER BY `id` LIMIT CAST(? AS INTEGER)) \
             RETURNING `id`, `payload`"
        );
        assert_eq!(
            &*stmt.slots,
            &[Slot::NewToken, Slot::Now, Slot::Now, Slot::Limit]
        );
    }

    #[test]
    fn the_claim_counts_the_attempt_up_to_the_largest_integer() {
        let n = Names::for_test(Dialect::Sqlite, Table::new("jobs"), None, "lease", true);
        let Claim::Returning(stmt) = super::lease_claim(&n, n.lease.as_deref().unwrap()) else {
            panic!("SQLite claims in one statement");
        };
        // SQLite's `attempt + 1` at the largest integer would turn the column into a REAL.
        assert_eq!(
            stmt.text(),
            "UPDATE `jobs` SET `locked_until` = ?, `attempt` = CASE WHEN `attempt` < \
             9223372036854775807 THEN `attempt` + 1 ELSE `attempt` END WHERE `id` IN \
             (SELECT `id` FROM `jobs` WHERE (`locked_until` IS NULL OR `locked_until` < ?) \
             ORDER BY `id` LIMIT CAST(? AS INTEGER)) RETURNING `id`, `payload`, `attempt` - 1"
        );
    }

    /// The claim reads a row's creation time as milliseconds since 1970, computed by SQLite from
    /// each form sqlx decodes a time from; anything else is `NULL` (no pickup latency).
    #[tokio::test]
    async fn a_creation_time_is_read_as_milliseconds_from_every_form_sqlx_reads() {
        use sqlx::Row as _;
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let mut w = crate::dialect::SqlWriter::new(Dialect::Sqlite);
        w.push("SELECT ");
        super::super::common::created_millis(&mut w, "c");
        w.push(" FROM (SELECT ? AS c)");
        let sql = w.finish();
        // 2026-12-02 11:30:00.123 UTC
        let at = 1_796_211_000_123_i64;
        let read = |value: sqlx::sqlite::SqliteArguments| {
            let query = sqlx::query_with(sqlx::AssertSqlSafe(sql.text().to_owned()), value);
            let pool = pool.clone();
            async move {
                query
                    .fetch_one(&pool)
                    .await
                    .unwrap()
                    .get::<Option<i64>, _>(0)
            }
        };
        let text = |t: &str| {
            let mut args = sqlx::sqlite::SqliteArguments::default();
            sqlx::Arguments::add(&mut args, t.to_owned()).unwrap();
            args
        };
        for form in [
            "2026-12-02 11:30:00.123",
            "2026-12-02T11:30:00.123",
            "2026-12-02T11:30:00.123456+00:00",
            "2026-12-02T12:30:00.123+01:00",
            "2026-12-02 11:30:00.123Z",
        ] {
            assert_eq!(read(text(form)).await, Some(at), "{form}");
        }
        assert_eq!(read(text("2026-12-02 11:30:00")).await, Some(at - 123));
        let mut seconds = sqlx::sqlite::SqliteArguments::default();
        sqlx::Arguments::add(&mut seconds, at / 1000).unwrap();
        assert_eq!(read(seconds).await, Some(at - 123));
        let mut julian = sqlx::sqlite::SqliteArguments::default();
        sqlx::Arguments::add(&mut julian, 2_440_587.5 + at as f64 / 86_400_000.0).unwrap();
        assert_eq!(read(julian).await, Some(at));
        for other in ["1796211000", "yesterday", ""] {
            assert_eq!(read(text(other)).await, None, "{other}");
        }
    }
}
