//! PostgreSQL statement text.

use super::common::{as_i64, claimable, finish_ids, order, read_created};
use super::lease::lease_set;
use super::{Claim, Kind, Names, Slot, SqlWriter, Stmt};

/// The columns of a table: name, type, `YES` when it takes NULL, and how an insert that leaves
/// it out fills it (`generated`: a generated or `GENERATED ALWAYS` identity column, which refuses
/// a value; `default`: a default, serial or identity; empty: NULL or nothing). Binds the table's
/// quoted (possibly qualified) name, so the search path and quoting resolve it as every other
/// statement does.
pub(super) const CATALOG: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), \
     CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END, \
     CASE WHEN a.attgenerated <> '' OR a.attidentity = 'a' THEN 'generated' \
     WHEN a.atthasdef OR a.attidentity = 'd' THEN 'default' ELSE '' END \
     FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 \
     AND NOT a.attisdropped";

/// A table's resolved name, from `c` (its `pg_class` row) and `n` (its `pg_namespace` row): the
/// bare name in `public`, else `schema.table`. What other processes must agree on (advisory key
/// classes, notification channels) is made from it, never from the name as a `Table` spells it.
macro_rules! resolved {
    () => {
        "CASE WHEN n.nspname = 'public' THEN c.relname::text ELSE n.nspname || '.' || c.relname END"
    };
}

/// The notification channel of a table: `sqlxq_` and the first 16 hex digits of the MD5 of its
/// resolved name, from `c` and `n`.
macro_rules! channel_of {
    () => {
        concat!("'sqlxq_' || substr(md5(", resolved!(), "), 1, 16)")
    };
}

/// Catalog rows of the table `to_regclass` finds for a text (its quoted, possibly qualified name).
macro_rules! of_regclass {
    ($table:expr) => {
        concat!(
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(CAST(",
            $table,
            " AS text))"
        )
    };
}

/// A table's resolved name and its notification channel, by its quoted name (`$1`); no row when
/// the table does not exist.
pub(super) const IDENTITY: &str = concat!(
    "SELECT ",
    resolved!(),
    ", ",
    channel_of!(),
    ", '', ''",
    of_regclass!("$1")
);

/// The notification channel of the table whose quoted name `table` binds, as a subquery.
pub(super) fn channel(w: &mut SqlWriter, table: Slot) {
    w.push(concat!("(SELECT ", channel_of!(), " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(CAST("))
        .param(table)
        .push(" AS text)))");
}

/// One statement: the claimable ids, locked and skipped when locked elsewhere, then the update.
/// The locking CTE is never inlined, so `LIMIT` holds however the planner joins.
pub(super) fn lease_claim(n: &Names, lease: &str) -> Claim {
    let mut w = n.writer();
    w.push("WITH claimable AS (SELECT ")
        .push(&n.id)
        .push(" FROM ")
        .push(&n.table)
        .push(" WHERE ");
    claimable(&mut w, n);
    order(&mut w, n);
    w.limit(Slot::Limit)
        .push(" FOR UPDATE SKIP LOCKED) UPDATE ")
        .push(&n.table)
        .push(" AS q");
    lease_set(&mut w, n, lease);
    w.push(" FROM claimable WHERE q.")
        .push(&n.id)
        .push(" = claimable.")
        .push(&n.id)
        .push(" RETURNING CAST(q.")
        .push(&n.id)
        .push(" AS BIGINT), ");
    n.read_payload(&mut w, "q.");
    if let Some(attempt) = &n.attempt {
        w.push(", CAST(q.").push(attempt).push(" AS BIGINT) - 1");
    }
    read_created(&mut w, n, "q.");
    Claim::Returning(w.finish())
}

/// The key of the row whose id is `id` (SQL): the table's class in the high half, the id's low
/// 32 bits in the low half.
fn key_of(w: &mut SqlWriter, id: &str) {
    w.push("((CAST(")
        .param(Slot::KeyClass)
        .push(" AS BIGINT) << 32) | (CAST(")
        .push(id)
        .push(" AS BIGINT) & 4294967295))");
}

/// `pg_try_advisory_xact_lock` of the key of `id` (SQL): takes it for the transaction without
/// waiting, true when taken (a cancellation's test that no runner holds the row's key).
pub(super) fn try_xact_lock_of(w: &mut SqlWriter, id: &str) {
    w.push("pg_try_advisory_xact_lock(");
    key_of(w, id);
    w.push(")");
}

/// `pg_try_advisory_lock` of the key of `id` (SQL): takes it without waiting, true when taken.
pub(super) fn try_lock_of(w: &mut SqlWriter, id: &str) {
    w.push("pg_try_advisory_lock(");
    key_of(w, id);
    w.push(")");
}

/// Releases the keys of `count` ids (`IdAt`, a short list repeating its last id), returning
/// the ids whose key was held.
pub(super) fn unlock_many(count: u16) -> Stmt {
    let mut w = SqlWriter::new(super::Dialect::Postgres);
    w.push("SELECT d.k FROM (SELECT DISTINCT v.k FROM (VALUES ");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.push("(CAST(").param(Slot::IdAt(i)).push(" AS BIGINT))");
    }
    w.push(") AS v (k)) AS d WHERE pg_advisory_unlock(");
    key_of(&mut w, "d.k");
    w.push(")");
    w.finish()
}

/// The advisory claim in one statement, for a table with an attempt column: `sqlxq_keys`, the
/// keys taken as [`lock_many_into`](super::held::lock_many_into) takes them (names `lock`);
/// `sqlxq_taken`, those rows still claimable, their attempts counted. The `UPDATE` reads each
/// row's latest version, so a row another session settled after the statement's snapshot (whose
/// key it then released) is passed over, as the second statement of a two-statement claim
/// would. Then, for each key taken in the order taken: its row's columns `(id, payload,
/// attempt[, created_at][, headers][, key])` and `0`; or, a row no longer claimable, its key
/// released again — `CASE` evaluates the release for those rows only — and `(id, NULL.., 1)`
/// (`2` if the session did not hold it).
pub(super) fn lock_take(lock: &Names, n: &Names, attempt: &str) -> Stmt {
    let columns = 3
        + usize::from(n.read_created && n.created_at.is_some())
        + usize::from(n.headers.is_some())
        + usize::from(n.key.is_some());
    let list = |w: &mut SqlWriter, prefix: &str| {
        w.push(prefix).push("sqlxq_id");
        for i in 1..columns {
            w.push(", ").push(prefix).push(&format!("sqlxq_{i}"));
        }
    };
    let mut w = lock.writer();
    w.push("WITH sqlxq_keys (sqlxq_id) AS MATERIALIZED (");
    super::held::lock_many_into(&mut w, lock).expect("PostgreSQL takes keys in the query");
    w.push("), sqlxq_taken (");
    list(&mut w, "");
    w.push(") AS (UPDATE ").push(&n.table).push(" SET ");
    n.count_attempt(&mut w, attempt);
    // `= ANY(ARRAY(..))`, not `IN (SELECT ..)`: the planner then estimates the rows updated
    // alike whatever the limits bound, and keeps one generic plan for the prepared statement;
    // with `IN` a generic plan looked 20 times dearer than one planned for `LIMIT 1`, so each
    // execution was planned again (a claim of one row at one worker then ran well below the
    // two statements it replaces: `benches/throughput`, PostgreSQL, one worker).
    w.push(" WHERE ")
        .push(&n.id)
        .push(" = ANY(ARRAY(SELECT sqlxq_id FROM sqlxq_keys)) AND ");
    claimable(&mut w, n);
    w.push(" RETURNING ");
    as_i64(&mut w, &n.id);
    w.push(", ");
    n.read_payload(&mut w, "");
    w.push(", ");
    as_i64(&mut w, attempt);
    w.push(" - 1");
    read_created(&mut w, n, "");
    w.push(") SELECT k.sqlxq_id");
    for i in 1..columns {
        w.push(&format!(", r.sqlxq_{i}"));
    }
    w.push(", CASE WHEN r.sqlxq_id IS NOT NULL THEN CAST(0 AS BIGINT) WHEN pg_advisory_unlock(");
    key_of(&mut w, "k.sqlxq_id");
    w.push(
        ") THEN CAST(1 AS BIGINT) ELSE CAST(2 AS BIGINT) END FROM sqlxq_keys AS k \
         LEFT JOIN LATERAL (SELECT ",
    );
    list(&mut w, "t.");
    // `OFFSET 0` keeps the lateral subquery from being pulled up into a hash join: a nested
    // loop over the keys returns them in the order they were taken.
    w.push(" FROM sqlxq_taken AS t WHERE t.sqlxq_id = k.sqlxq_id OFFSET 0) AS r ON true");
    w.finish()
}

/// Releases every advisory key the session holds.
pub(super) fn unlock_all() -> Stmt {
    let mut w = SqlWriter::new(super::Dialect::Postgres);
    w.push("SELECT pg_advisory_unlock_all()");
    w.finish()
}

/// Acks and drops of `count` rows whose keys the session holds, and the release of those keys,
/// in one statement: `WITH d AS (DELETE .. WHERE id IN (..) RETURNING 1)` (or `processed_at =
/// now`), then, once `d` has run whole (a settlement that fails releases nothing), each key of
/// the ids (`IdAt`, padded as `unlock_many`'s) taken again for the statement's transaction and
/// released from the session; returns the ids whose key the session held. The transaction's
/// hold keeps the key until the settlement has committed: no claim takes it before, when it
/// would still see the row.
pub(super) fn finish_unlock_many(n: &Names, count: u16) -> Stmt {
    let mut w = n.writer();
    w.push("WITH d AS (");
    finish_ids(&mut w, n, count);
    w.push(" RETURNING 1) SELECT v.k FROM (SELECT DISTINCT v.k FROM (VALUES ");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.push("(CAST(").param(Slot::IdAt(i)).push(" AS BIGINT))");
    }
    w.push(") AS v (k)) AS v WHERE CASE WHEN (SELECT COUNT(*) FROM d) < 0 THEN FALSE WHEN ");
    try_xact_lock_of(&mut w, "v.k");
    w.push(" THEN pg_advisory_unlock(");
    key_of(&mut w, "v.k");
    w.push(") ELSE FALSE END");
    w.finish()
}

/// Releases a row's key: 1 when it was held.
pub(super) fn unlock() -> Stmt {
    let mut w = SqlWriter::new(super::Dialect::Postgres);
    w.push("SELECT CASE WHEN pg_advisory_unlock(")
        .param(Slot::Key)
        .push(") THEN CAST(1 AS BIGINT) ELSE CAST(0 AS BIGINT) END");
    w.finish()
}

/// Whether a column of type `ty` (lower case) holds `kind` (integers: `types::integer_range`).
pub(super) fn accepts(kind: Kind, ty: &str) -> bool {
    match kind {
        Kind::Integer => false,
        Kind::Bytes => ty == "bytea",
        Kind::Text => ty == "text" || ty.starts_with("character") || ty.starts_with("varchar"),
        Kind::Json => ty == "json",
        Kind::Jsonb => ty == "jsonb",
        // Lease tokens are compared to the microsecond: a coarser column would round them.
        Kind::Time => matches!(
            ty,
            "timestamp with time zone" | "timestamp(6) with time zone"
        ),
    }
}

/// The types that hold `kind`, in words.
pub(super) fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Bytes => "BYTEA (a text or JSON payload: declare `Table::payload_type`)",
        Kind::Json => "JSON (`PayloadType::Jsonb` for JSONB)",
        Kind::Jsonb => "JSONB (`PayloadType::Json` for JSON)",
        Kind::Time => "TIMESTAMPTZ (microseconds)",
        Kind::Integer => "an integer type",
        Kind::Text => "a text type",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Claim, Dialect, Names};
    use crate::table::Table;

    #[test]
    fn lease_claim_is_one_statement() {
        let table = Table::new("jobs").group("queue").retry_after("not_before");
        let mut n = Names::for_test(Dialect::Postgres, table, Some("mail"), "lease", true);
        n.attempt_max = 32_767; // a smallint column
        let Claim::Returning(stmt) = super::lease_claim(&n, n.lease.as_deref().unwrap()) else {
            panic!("PostgreSQL claims in one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"WITH claimable AS (SELECT "id" FROM "jobs" WHERE "queue" = $1 AND ("locked_until" IS NULL OR "locked_until" < $2) AND ("not_before" IS NULL OR "not_before" <= $3) ORDER BY "id" LIMIT $4 FOR UPDATE SKIP LOCKED) UPDATE "jobs" AS q SET "locked_until" = $5, "attempt" = CASE WHEN "attempt" < 32767 THEN "attempt" + 1 ELSE "attempt" END FROM claimable WHERE q."id" = claimable."id" RETURNING CAST(q."id" AS BIGINT), q."payload", CAST(q."attempt" AS BIGINT) - 1"#
        );
    }

    #[test]
    fn a_per_group_claim_counts_the_rows_in_work_or_due_before_the_row() {
        let table = Table::new("jobs").group("queue").retry_after("not_before");
        let mut n = Names::for_test(Dialect::Postgres, table, None, "lease", false);
        n.fifo = Some(super::super::names::Fifo {
            group: r#""queue""#.to_owned(),
            lease: Some(r#""locked_until""#.to_owned()),
            limit: 3,
        });
        let Claim::Returning(stmt) = super::lease_claim(&n, n.lease.as_deref().unwrap()) else {
            panic!("PostgreSQL claims in one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"WITH claimable AS (SELECT "id" FROM "jobs" WHERE ("locked_until" IS NULL OR "locked_until" < $1) AND ("not_before" IS NULL OR "not_before" <= $2) AND (SELECT COUNT(*) FROM "jobs" AS h WHERE h."queue" = "jobs"."queue" AND h."id" <> "jobs"."id" AND (h."locked_until" >= $3 OR h."id" < "jobs"."id" AND (h."not_before" IS NULL OR h."not_before" <= $4))) < 3 ORDER BY "id" LIMIT $5 FOR UPDATE SKIP LOCKED) UPDATE "jobs" AS q SET "locked_until" = $6 FROM claimable WHERE q."id" = claimable."id" RETURNING CAST(q."id" AS BIGINT), q."payload""#
        );
    }
}
