//! MySQL and MariaDB statement text.

use super::common::{claimable, mark_processed, order, read_created};
use super::lease::lease_set;
use super::{BySize, Claim, Kind, Names, Slot, SqlWriter, Stmt};
use crate::table::Dialect;

/// The columns of a table: name, type, `YES` when it takes NULL, and how an insert that leaves
/// it out fills it (`generated`, `default` — a default or `AUTO_INCREMENT` —, or empty). Binds
/// the schema (NULL: the current database) and the table name. MariaDB's generation expression
/// is NULL on other columns, MySQL's empty.
pub(super) const CATALOG: &str = "SELECT CAST(COLUMN_NAME AS CHAR), CAST(COLUMN_TYPE AS CHAR), \
     CAST(IS_NULLABLE AS CHAR), CAST(CASE WHEN COALESCE(GENERATION_EXPRESSION, '') <> '' \
     THEN 'generated' WHEN COLUMN_DEFAULT IS NOT NULL OR EXTRA LIKE '%auto_increment%' \
     THEN 'default' ELSE '' END AS CHAR) FROM information_schema.COLUMNS \
     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";

/// A table's database and name as the catalog spells them; binds the schema (NULL: the current
/// database) and the table name.
pub(super) const IDENTITY: &str = "SELECT CAST(TABLE_SCHEMA AS CHAR), CAST(TABLE_NAME AS CHAR), '', '' \
     FROM information_schema.TABLES WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?";

/// Starts a claim's transaction at READ COMMITTED in one round trip, so the locking read takes
/// no gap locks that would block inserts.
pub(crate) const BEGIN_READ_COMMITTED: &str =
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION";

/// No `UPDATE .. RETURNING`: a locking `SELECT` of the claimable rows, then an `UPDATE` of their
/// ids, in one READ COMMITTED transaction. The updates are rendered for 1, 2, 4, .. ids up to
/// `max_claim`; a shorter list is padded by repeating an id.
pub(super) fn lease_claim(n: &Names, lease: &str, max_claim: usize) -> Claim {
    let mut w = n.writer();
    w.push("SELECT CAST(").push(&n.id).push(" AS SIGNED), ");
    n.read_payload(&mut w, "");
    if let Some(attempt) = &n.attempt {
        w.push(", CAST(").push(attempt).push(" AS SIGNED)");
    }
    read_created(&mut w, n, "");
    w.push(" FROM ").push(&n.table).push(" WHERE ");
    claimable(&mut w, n);
    order(&mut w, n);
    w.limit(Slot::Limit).push(" FOR UPDATE SKIP LOCKED");
    let select = w.finish();

    let updates = BySize::new(max_claim, |count| update_ids(n, lease, count));
    Claim::SelectThenUpdate { select, updates }
}

fn update_ids(n: &Names, lease: &str, count: u16) -> Stmt {
    let mut w = n.writer();
    w.push("UPDATE ").push(&n.table);
    lease_set(&mut w, n, lease);
    w.push(" WHERE ").push(&n.id).push(" IN (");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::IdAt(i));
    }
    w.push(")");
    w.finish()
}

/// The lock name of a row: the key prefix (database, table) and the id, hashed with MD5 when
/// longer than the 64 characters `GET_LOCK` takes. `id` is the id's SQL: a column or `?`.
fn lock_name(w: &mut SqlWriter, id: impl Fn(&mut SqlWriter)) {
    let name = |w: &mut SqlWriter| {
        w.push("CONCAT(").param(Slot::KeyPrefix).push(", ");
        id(w);
        w.push(")");
    };
    w.push("IF(CHAR_LENGTH(");
    name(w);
    w.push(") > 64, CONCAT('sqlxq:', MD5(");
    name(w);
    w.push(")), ");
    name(w);
    w.push(")");
}

/// `GET_LOCK` of the lock name of `id` (SQL) without waiting: 1 when taken.
pub(super) fn try_lock_of(w: &mut SqlWriter, id: &str) {
    w.push("GET_LOCK(");
    lock_name(w, |w| {
        w.push(id);
    });
    w.push(", 0) = 1");
}

/// `RELEASE_LOCK` of the lock name of `id` (SQL).
pub(super) fn release_of(w: &mut SqlWriter, id: &str) {
    w.push("RELEASE_LOCK(");
    lock_name(w, |w| {
        w.push(id);
    });
    w.push(")");
}

/// `SELECT CAST(? AS SIGNED) AS <column> UNION ..` of `count` ids (`IdAt`): a list of ids as a
/// derived table, each id once.
fn id_union(w: &mut SqlWriter, count: u16, column: &str) {
    for i in 0..count {
        if i > 0 {
            w.push(" UNION ");
        }
        w.push("SELECT CAST(")
            .param(Slot::IdAt(i))
            .push(" AS SIGNED) AS ")
            .push(column);
    }
}

/// Releases the locks of `count` ids (`IdAt`, a short list repeating its last id), returning
/// the ids whose lock was held.
pub(super) fn unlock_many(count: u16) -> Stmt {
    let mut w = SqlWriter::new(Dialect::MySql);
    unlock_many_into(&mut w, count);
    w.finish()
}

/// [`unlock_many`]'s text, written on `w`.
pub(super) fn unlock_many_into(w: &mut SqlWriter, count: u16) {
    w.push("SELECT CAST(d.k AS SIGNED) FROM (");
    id_union(w, count, "k");
    w.push(") AS d WHERE RELEASE_LOCK(");
    lock_name(w, |w| {
        w.push("d.k");
    });
    w.push(") = 1");
}

/// The advisory form's `finish_unlock_many` of a table whose lock names need no hash: see
/// [`finish_release_named`].
pub(crate) fn finish_unlock_named(n: &Names) -> BySize {
    BySize::new(super::MAX_FINISH, |count| finish_release_named(n, count))
}

/// Acks and drops of `count` rows (`finish_ids`), then the release of their keys by the lock
/// names the client wrote (`LockNameAt`), sent together ([`Stmt::multi`]): one row of one
/// column, a `1` or `0` per name in order, `1` where its key was held. Cheaper for the server
/// than [`unlock_many`]'s derived table, whose names it computes (`benches/throughput`'s
/// advisory cells on MariaDB); only for names that need no hash
/// (`Keys::lock_names`). One column, not one per name: the client decodes each column's
/// definition with every result (a batch of 16 had sent 16).
fn finish_release_named(n: &Names, count: u16) -> Stmt {
    let mut w = n.writer();
    super::common::finish_ids(&mut w, n, count);
    w.then().push("SELECT CONCAT(");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.push("RELEASE_LOCK(")
            .param(Slot::LockNameAt(i))
            .push(") <=> 1");
    }
    w.push(")");
    w.finish()
}

/// `(SELECT ? AS sqlxq_id UNION ..) AS sqlxq_ids STRAIGHT_JOIN <table> ON <id> = sqlxq_id` of
/// `count` ids: the rows of a set settlement, each reached through the primary key. Never
/// `WHERE id IN (..)` for a locking write: on a small table (the end of a drain) MariaDB plans it
/// as a scan, which locks rows other transactions hold, and concurrent batches deadlock.
fn joined_ids(w: &mut SqlWriter, n: &Names, count: u16) {
    w.push("(");
    id_union(w, count, "sqlxq_id");
    w.push(") AS sqlxq_ids STRAIGHT_JOIN ")
        .push(&n.table)
        .push(" ON ")
        .push(&n.table)
        .push(".")
        .push(&n.id)
        .push(" = sqlxq_ids.sqlxq_id");
}

/// Acks and drops of `count` rows in one statement (`DELETE`, or `processed_at = now`), each row
/// reached through the primary key (see [`joined_ids`]).
pub(super) fn finish_joined(n: &Names, count: u16) -> Stmt {
    let mut w = n.writer();
    match &n.processed_at {
        Some(processed_at) => {
            w.push("UPDATE ");
            joined_ids(&mut w, n, count);
            mark_processed(&mut w, n, processed_at);
        }
        None => {
            w.push("DELETE ").push(&n.table).push(" FROM ");
            joined_ids(&mut w, n, count);
        }
    }
    w.finish()
}

/// Counts the attempt of `count` rows in one statement, each reached through the primary key:
/// a row the join meets twice (a padded list) is updated once.
pub(super) fn count_joined(n: &Names, attempt: &str, count: u16) -> Stmt {
    let mut w = n.writer();
    w.push("UPDATE ");
    joined_ids(&mut w, n, count);
    w.push(" SET ");
    n.count_attempt(&mut w, attempt);
    w.finish()
}

/// Releases a row's lock: 1 when it was held.
pub(super) fn unlock() -> Stmt {
    let mut w = SqlWriter::new(Dialect::MySql);
    w.push("SELECT CAST(RELEASE_LOCK(");
    lock_name(&mut w, |w| {
        w.param(Slot::Id);
    });
    w.push(") AS SIGNED)");
    w.finish()
}

/// Whether a column of type `ty` (lower case) holds `kind` (integers: `types::integer_range`).
pub(super) fn accepts(kind: Kind, ty: &str) -> bool {
    match kind {
        Kind::Integer => false,
        Kind::Bytes => {
            ty.contains("blob") || ty.starts_with("binary") || ty.starts_with("varbinary")
        }
        Kind::Text => ty.contains("char") || ty.contains("text"),
        // MariaDB's JSON is an alias of LONGTEXT (with a JSON_VALID check).
        Kind::Json | Kind::Jsonb => ty == "json" || ty.contains("text"),
        // Not TIMESTAMP: before MariaDB 10.10 its first column defaults to the current time and
        // is updated with the row, and its range ends in 2038.
        Kind::Time => ty == "datetime(6)",
    }
}

/// The types that hold `kind`, in words.
pub(super) fn expected(kind: Kind) -> &'static str {
    match kind {
        Kind::Bytes => {
            "a BLOB or VARBINARY type (a text or JSON payload: declare `Table::payload_type`)"
        }
        Kind::Json | Kind::Jsonb => "JSON or a text type",
        Kind::Time => "DATETIME(6)",
        Kind::Integer => "an integer type",
        Kind::Text => "a text type",
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Claim, Dialect, Names};
    use crate::table::Table;

    #[test]
    fn lease_claim_selects_then_updates() {
        let table = Table::new("jobs").processed_at("done_at");
        let mut n = Names::for_test(Dialect::MySql, table, None, "lease", true);
        n.attempt_max = 127; // a tinyint column
        let Claim::SelectThenUpdate { select, updates } =
            super::lease_claim(&n, n.lease.as_deref().unwrap(), 5)
        else {
            panic!("MySQL claims in two statements");
        };
        assert_eq!(
            select.text(),
            "SELECT CAST(`id` AS SIGNED), `payload`, CAST(`attempt` AS SIGNED) FROM `jobs` \
             WHERE `done_at` IS NULL AND (`locked_until` IS NULL OR `locked_until` < ?) \
             ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(updates.iter().count(), 4, "1, 2, 4 and 8 ids");
        assert_eq!(
            updates.for_len(2).text(),
            "UPDATE `jobs` SET `locked_until` = ?, \
             `attempt` = CASE WHEN `attempt` < 127 THEN `attempt` + 1 ELSE `attempt` END \
             WHERE `id` IN (?, ?)"
        );
        assert_eq!(updates.for_len(3).slots.len(), 5);
        assert_eq!(updates.for_len(1).slots.len(), 2);
        assert_eq!(updates.for_len(8).slots.len(), 9);
    }

    #[test]
    fn a_fifo_claim_takes_each_group_s_first_due_row_found_through_the_group_index() {
        let fifo = || super::super::names::Fifo {
            group: "`queue`".to_owned(),
            lease: Some("`locked_until`".to_owned()),
            limit: 1,
        };
        let table = Table::new("jobs")
            .group("queue")
            .processed_at("done_at")
            .retry_after("not_before");
        let mut n = Names::for_test(Dialect::MySql, table.clone(), None, "lease", false);
        n.fifo = Some(fifo());
        let Claim::SelectThenUpdate { select, .. } =
            super::lease_claim(&n, n.lease.as_deref().unwrap(), 4)
        else {
            panic!("MySQL claims in two statements");
        };
        assert_eq!(
            select.text(),
            "SELECT CAST(`id` AS SIGNED), `payload` FROM `jobs` WHERE `done_at` IS NULL AND \
             (`locked_until` IS NULL OR `locked_until` < ?) AND (`not_before` IS NULL OR \
             `not_before` <= ?) AND `id` IN (WITH sqlxq_g AS (SELECT h.`queue` AS k FROM `jobs` AS h \
             WHERE h.`queue` IS NOT NULL AND h.`done_at` IS NULL GROUP BY h.`queue`) SELECT \
             (SELECT h.`id` FROM `jobs` AS h WHERE h.`queue` = sqlxq_g.k AND h.`done_at` IS NULL \
             AND (h.`not_before` IS NULL OR h.`not_before` <= ?) ORDER BY h.`id` LIMIT 1) FROM \
             sqlxq_g) AND NOT EXISTS (SELECT 1 FROM `jobs` AS h WHERE h.`queue` = \
             `jobs`.`queue` AND h.`done_at` IS NULL AND h.`id` <> `jobs`.`id` AND \
             h.`locked_until` >= ?) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let mut n = Names::for_test(Dialect::MySql, table, Some("mail"), "lease", false);
        n.fifo = Some(fifo());
        let Claim::SelectThenUpdate { select, .. } =
            super::lease_claim(&n, n.lease.as_deref().unwrap(), 4)
        else {
            panic!("MySQL claims in two statements");
        };
        assert_eq!(
            select.text(),
            "SELECT CAST(`id` AS SIGNED), `payload` FROM `jobs` WHERE `queue` = ? AND `done_at` IS \
             NULL AND (`locked_until` IS NULL OR `locked_until` < ?) AND (`not_before` IS NULL OR \
             `not_before` <= ?) AND `id` = (SELECT h.`id` FROM `jobs` AS h WHERE h.`queue` = ? \
             AND h.`done_at` IS NULL AND (h.`not_before` IS NULL OR h.`not_before` <= ?) ORDER BY \
             h.`id` LIMIT 1) AND NOT EXISTS (SELECT 1 FROM `jobs` AS h WHERE h.`queue` = \
             `jobs`.`queue` AND h.`done_at` IS NULL AND h.`id` <> `jobs`.`id` AND \
             h.`locked_until` >= ?) ORDER BY `id` LIMIT ? FOR UPDATE SKIP LOCKED",
            "a named queue: its group's first due row, one index probe"
        );
    }
}
