//! The statements of unique jobs: the insert that a taken key does not fail (PostgreSQL and
//! SQLite: `ON CONFLICT .. DO NOTHING`; MySQL/MariaDB, which has no such clause that takes no
//! lock, a plain insert whose duplicate-key error the caller reads), the read of the rows that
//! hold keys, and the update of a job a replace or debounce finds — only where it is not in work.
//!
//! Values are bound in the order the placeholders are written: per job the insert binds what a
//! plain enqueue binds, then the key.

use super::common::as_i64;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// `INSERT` of `rows` unique jobs. PostgreSQL and SQLite return `(id, key)` of each row
/// inserted and insert nothing for a key taken (an unfinished row's: the conflict target is
/// partial on `processed_at IS NULL` where the table keeps finished rows, which a plain unique
/// index satisfies too); on a notifying PostgreSQL table the notification's two values follow.
/// MySQL/MariaDB inserts every row or, on a taken key, none (error 1062).
pub(crate) fn insert(n: &Names, key: &str, rows: usize) -> Stmt {
    let mut w = n.writer();
    w.push("INSERT INTO ")
        .push(&n.table)
        .push(" (")
        .push(&n.payload);
    for column in [&n.group, &n.retry_after, &n.priority, &n.headers]
        .into_iter()
        .flatten()
    {
        w.push(", ").push(column);
    }
    w.push(", ").push(key).push(") VALUES ");
    for row in 0..rows {
        w.push(if row == 0 { "(" } else { ", (" });
        n.payload_param(&mut w);
        if n.group.is_some() {
            w.push(", ").param(Slot::Group);
        }
        if n.retry_after.is_some() {
            w.push(", ").param(Slot::At);
        }
        if n.priority.is_some() {
            w.push(", ").param(Slot::Priority);
        }
        if n.headers.is_some() {
            w.push(", ");
            n.headers_param(&mut w);
        }
        w.push(", ").param(Slot::UniqueKey).push(")");
    }
    if n.dialect == Dialect::MySql {
        return w.finish();
    }
    w.push(" ON CONFLICT (").push(key).push(")");
    if let Some(processed_at) = &n.processed_at {
        w.push(" WHERE ").push(processed_at).push(" IS NULL");
    }
    w.push(" DO NOTHING RETURNING ");
    as_i64(&mut w, &n.id);
    w.push(" AS id, ").push(key).push(" AS k");
    if !(n.notify && n.dialect == Dialect::Postgres) {
        return w.finish();
    }
    let mut out = n.writer();
    out.push("WITH ins AS (");
    out.append(w);
    out.push("), n AS (SELECT pg_notify(");
    super::postgres::channel(&mut out, Slot::NotifyTable);
    out.push(", ")
        .param(Slot::NotifyPayload)
        .push(")) SELECT ins.id, ins.k FROM ins, n");
    out.finish()
}

/// `SELECT id, key[, created_at] FROM t WHERE key IN (..) [AND processed_at IS NULL]`: the
/// unfinished rows that hold `keys` keys.
pub(crate) fn holders(n: &Names, key: &str, keys: usize) -> String {
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(", ").push(key);
    if let Some(created_at) = &n.created_at {
        w.push(", ").push(created_at);
    }
    w.push(" FROM ")
        .push(&n.table)
        .push(" WHERE ")
        .push(key)
        .push(" IN (");
    for i in 0..keys {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::UniqueKey);
    }
    w.push(")");
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND ").push(processed_at).push(" IS NULL");
    }
    w.finish().text().to_owned()
}

/// MySQL/MariaDB: the named locks that let one unique enqueue of a key at a time wait for an
/// unfinished row of that key that another transaction has not committed yet. InnoDB lets every
/// insert of a taken key wait for that transaction; when it rolls back, the waiters meet each
/// other's locks and all but one die of a deadlock (1213), their transactions rolled back. With
/// the named lock, one waits in InnoDB and the others wait for the lock (as long as InnoDB lets
/// a lock wait: `innodb_lock_wait_timeout`). The take of `keys` names (bound in order, each
/// three times), each first released where this session holds it already (an enqueue whose
/// future was dropped while it waited), and their release (each name bound once).
pub(crate) fn key_locks(keys: usize) -> (String, String) {
    let take = (0..keys)
        .map(|_| {
            "IF(IS_USED_LOCK(?) = CONNECTION_ID(), RELEASE_LOCK(?), 0), \
             GET_LOCK(?, @@innodb_lock_wait_timeout)"
        })
        .collect::<Vec<_>>();
    let release = (0..keys).map(|_| "RELEASE_LOCK(?)").collect::<Vec<_>>();
    (
        format!("SELECT {}", take.join(", ")),
        format!("SELECT {}", release.join(", ")),
    )
}

/// What an update of a job found by its key changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Payload, then (where the table has the columns) `retry_after` and priority.
    Replace,
    /// `retry_after` alone.
    Debounce,
}

/// `UPDATE` of row `id` by a replace or debounce, which changes nothing of a row in work: a
/// leased row where the table declares its lease column; else, on PostgreSQL, a row locked by a
/// row lock claim (`FOR UPDATE SKIP LOCKED` passes it over). On MySQL/MariaDB the row lock is
/// taken before, by [`lock`], in the same transaction. Binds the new values, the id, then the
/// current time where the lease is compared.
pub(crate) fn update(n: &Names, change: Change) -> Stmt {
    let mut w = n.writer();
    w.push("UPDATE ").push(&n.table).push(" SET ");
    let mut first = true;
    let mut set = |w: &mut SqlWriter, column: &str, slot: Slot| {
        w.push(if first { "" } else { ", " })
            .push(column)
            .push(" = ");
        if slot == Slot::Payload {
            n.payload_param(w);
        } else if slot == Slot::Headers {
            n.headers_param(w);
        } else {
            w.param(slot);
        }
        first = false;
    };
    if change == Change::Replace {
        set(&mut w, &n.payload, Slot::Payload);
    }
    if let Some(retry_after) = &n.retry_after {
        set(&mut w, retry_after, Slot::At);
    }
    if let (Change::Replace, Some(priority)) = (change, &n.priority) {
        set(&mut w, priority, Slot::Priority);
    }
    if let (Change::Replace, Some(headers)) = (change, &n.headers) {
        set(&mut w, headers, Slot::Headers);
    }
    w.push(" WHERE ").push(&n.id).push(" = ").param(Slot::Id);
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND ").push(processed_at).push(" IS NULL");
    }
    match (&n.table_lease, n.dialect) {
        (Some(lease), _) => {
            w.push(" AND (")
                .push(lease)
                .push(" IS NULL OR ")
                .push(lease)
                .push(" < ")
                .param(Slot::Now)
                .push(")");
        }
        (None, Dialect::Postgres) => {
            super::common::unless_row_locked(&mut w, n);
        }
        (None, Dialect::MySql | Dialect::Sqlite) => {}
    }
    w.finish()
}

/// MySQL/MariaDB, on a table without a declared lease column: the lock of row `id` that an
/// update by [`update`] needs first, in its transaction — none when a row lock claim holds it.
pub(crate) fn lock(n: &Names) -> Option<Stmt> {
    if n.dialect != Dialect::MySql || n.table_lease.is_some() {
        return None;
    }
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(" FROM ")
        .push(&n.table)
        .push(" WHERE ")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id)
        .push(" FOR UPDATE SKIP LOCKED");
    Some(w.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table) -> Names {
        Names::of_table(dialect, &table).unwrap()
    }

    #[test]
    fn the_insert_passes_over_a_taken_key() {
        let t = Table::new("jobs").unique_key("k").processed_at("done");
        assert_eq!(
            insert(&names(Dialect::Postgres, t.clone()), "\"k\"", 2).text(),
            r#"INSERT INTO "jobs" ("payload", "k") VALUES ($1, $2), ($3, $4) ON CONFLICT ("k") WHERE "done" IS NULL DO NOTHING RETURNING CAST("id" AS BIGINT) AS id, "k" AS k"#
        );
        assert_eq!(
            insert(&names(Dialect::MySql, t), "`k`", 1).text(),
            "INSERT INTO `jobs` (`payload`, `k`) VALUES (?, ?)"
        );
    }

    #[test]
    fn unique_keys_are_locked_by_name_on_mysql() {
        let (take, release) = key_locks(2);
        assert_eq!(
            take,
            "SELECT IF(IS_USED_LOCK(?) = CONNECTION_ID(), RELEASE_LOCK(?), 0), GET_LOCK(?, @@innodb_lock_wait_timeout), IF(IS_USED_LOCK(?) = CONNECTION_ID(), RELEASE_LOCK(?), 0), GET_LOCK(?, @@innodb_lock_wait_timeout)"
        );
        assert_eq!(release, "SELECT RELEASE_LOCK(?), RELEASE_LOCK(?)");
    }

    #[test]
    fn an_update_leaves_a_job_in_work_alone() {
        let t = Table::new("jobs").unique_key("k").retry_after("due");
        let pg = update(&names(Dialect::Postgres, t.clone()), Change::Debounce);
        assert_eq!(
            pg.text(),
            r#"UPDATE "jobs" SET "due" = $1 WHERE "id" = $2 AND "id" IN (SELECT "id" FROM "jobs" WHERE "id" = $3 FOR UPDATE SKIP LOCKED)"#
        );
        let leased = t.lease("until");
        let my = update(&names(Dialect::MySql, leased.clone()), Change::Replace);
        assert_eq!(
            my.text(),
            "UPDATE `jobs` SET `payload` = ?, `due` = ? WHERE `id` = ? AND (`until` IS NULL OR `until` < ?)"
        );
        assert!(lock(&names(Dialect::MySql, leased)).is_none());
    }
}
