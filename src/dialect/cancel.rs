//! The statements of a cancellation by the table (no queue mounted): the removal of a job not in
//! work, and what tells a job in work apart.
//!
//! A job is in work when a lease column the table declares holds a live lease; on a table
//! without one, when a row lock claim's transaction holds its row (PostgreSQL, MySQL/MariaDB) or
//! a runner holds its advisory key (taken for the cancellation's transaction when free:
//! PostgreSQL `pg_try_advisory_xact_lock`, MySQL/MariaDB `GET_LOCK`, released after the removal;
//! SQLite's keys are held in the process, where the cancellation takes the key around these
//! statements, see [`KeysAt`]). A job in work on those forms gets a request where the table
//! declares their table, which its runner reads (and, PostgreSQL, is notified of at commit):
//! inserted first, so that a settlement that takes the row's request for itself before it
//! commits (`form::requests`) and the cancellation each wait for the other's commit.
//! PostgreSQL and SQLite remove the row first and return whether it was leased; MySQL/MariaDB,
//! which has no `RETURNING`, locks the row first and reads it, then removes it in the same
//! transaction. On a leased row the removal is what takes the lease away: its holder's renewal
//! and settlement, guarded by its token, find none.

use super::common::as_i64;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// The statements of [`Queue::cancel`](crate::Queue::cancel) on one table.
#[derive(Debug)]
pub(crate) struct CancelSql {
    /// MySQL/MariaDB: the locking read of row `id` unfinished, returning whether it is leased;
    /// passed over (no row) when a row lock claim holds it, on a table without a lease column.
    pub(crate) probe: Option<Stmt>,
    /// The removal of row `id` unfinished — deleted, or marked `processed_at` — where no row lock
    /// claim holds it; PostgreSQL and SQLite return whether it was leased.
    pub(crate) remove: Stmt,
    /// Where a marked row keeps its lease column: the lease's removal, after `remove`.
    pub(crate) unlease: Option<Stmt>,
    /// Whether row `id` is there unfinished: asked when `remove` found none, whose row a claim
    /// may hold.
    pub(crate) exists: Stmt,
    /// The unfinished row holding a unique key, on a table with one.
    pub(crate) by_key: Option<Stmt>,
    /// MySQL/MariaDB, where `probe` took the row's advisory key: its release, once the
    /// cancellation's transaction ended (before, a claim could take the key and read the row
    /// as it was).
    pub(crate) release: Option<Stmt>,
    /// The request for a job in work, where the table has a cancel requests' table and no lease
    /// column (one there already is kept): inserted before the removal is tried.
    pub(crate) request: Option<Stmt>,
    /// The removal of that request, when the job was not in work after all.
    pub(crate) forget: Option<Stmt>,
    /// PostgreSQL, with `request` or a lease column: the notification on the table's channel,
    /// sent at commit, for a job in work.
    pub(crate) notify: Option<Stmt>,
    /// Where the row's advisory key is tested, where a runner's key may hold the row (a table
    /// without a lease column).
    pub(crate) keys: Option<KeysAt>,
}

/// Where the advisory keys a cancellation tests are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeysAt {
    /// On the server: the statements take the row's key when it is free, binding the table's
    /// key (`KeyClass`, `KeyPrefix`).
    Server,
    /// In this process (SQLite, whose advisory form serves one process per database file): the
    /// cancellation takes the row's key itself when it is free, runs `remove`, and releases the
    /// key after its commit; a key it finds held is a job in work (`exists`, then `request`).
    Process,
}

/// The notification payload of a cancel request: this prefix, then the job's id (a wake-up's
/// payload is a group name, which this control character does not begin).
pub(crate) const CANCEL_NOTICE: &str = "\u{1}cancel ";

/// Renders the cancellation's statements for table `n` (of [`Names::of_table`]).
pub(crate) fn cancel(n: &Names) -> CancelSql {
    // Held by an advisory lock or a row lock: asked where the table declares no lease column (a
    // queue of another form is refused on a table that declares one).
    let asked = n.table_lease.is_none();
    let keys = asked.then_some(match n.dialect {
        Dialect::Sqlite => KeysAt::Process,
        Dialect::Postgres | Dialect::MySql => KeysAt::Server,
    });
    let server_keys = keys == Some(KeysAt::Server);
    let probe = (n.dialect == Dialect::MySql).then(|| {
        let mut w = n.writer();
        w.push("SELECT ");
        leased(&mut w, n);
        if server_keys {
            w.push(", CAST((");
            super::mysql::try_lock_of(&mut w, &n.id);
            w.push(") AS SIGNED)");
        }
        w.push(" FROM ").push(&n.table);
        by_id(&mut w, n);
        w.push(if n.table_lease.is_some() {
            " FOR UPDATE"
        } else {
            " FOR UPDATE SKIP LOCKED"
        });
        w.finish()
    });
    let mut w = n.writer();
    match &n.processed_at {
        Some(processed_at) => {
            w.push("UPDATE ")
                .push(&n.table)
                .push(" SET ")
                .push(processed_at)
                .push(" = ")
                .param(Slot::Now);
            // MySQL/MariaDB has no partial index: a finished row frees its unique key by losing it.
            if let (Dialect::MySql, Some(key)) = (n.dialect, &n.unique_key) {
                w.push(", ").push(key).push(" = NULL");
            }
        }
        None => {
            w.push("DELETE FROM ").push(&n.table);
        }
    }
    by_id(&mut w, n);
    if n.dialect == Dialect::Postgres && n.table_lease.is_none() {
        super::common::unless_row_locked(&mut w, n);
        if server_keys {
            w.push(" AND CASE WHEN ")
                .push(&n.id)
                .push(" = ")
                .param(Slot::Id)
                .push(" THEN ");
            super::postgres::try_xact_lock_of(&mut w, &n.id);
            w.push(" ELSE false END");
        }
    }
    if n.dialect != Dialect::MySql {
        w.push(" RETURNING ");
        leased(&mut w, n);
    }
    let remove = w.finish();
    let unlease = match (&n.processed_at, &n.table_lease) {
        (Some(_), Some(lease)) => {
            let mut w = n.writer();
            w.push("UPDATE ")
                .push(&n.table)
                .push(" SET ")
                .push(lease)
                .push(" = NULL WHERE ")
                .push(&n.id)
                .push(" = ")
                .param(Slot::Id);
            Some(w.finish())
        }
        _ => None,
    };
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(" FROM ").push(&n.table);
    by_id(&mut w, n);
    let exists = w.finish();
    let by_key = n.unique_key.as_ref().map(|key| {
        let mut w = n.writer();
        w.push("SELECT ");
        as_i64(&mut w, &n.id);
        w.push(" FROM ")
            .push(&n.table)
            .push(" WHERE ")
            .push(key)
            .push(" = ")
            .param(Slot::UniqueKey);
        unfinished(&mut w, n);
        w.finish()
    });
    let release = (server_keys && n.dialect == Dialect::MySql).then(|| {
        let mut w = n.writer();
        w.push("SELECT ");
        super::mysql::release_of(&mut w, "r.id");
        w.push(" FROM (SELECT CAST(")
            .param(Slot::Id)
            .push(" AS SIGNED) AS id) AS r");
        w.finish()
    });
    let requests = n.cancel_requests.as_ref().filter(|_| asked);
    let request = requests.map(|requests| super::requests::request(n, requests));
    let forget = requests.map(|requests| super::requests::forget(n, requests));
    // Also for a leased job in work: a runner listening on the table's channel fires its
    // `cancelled()` at once, or does not start it (a row claimed ahead).
    let told = request.is_some() || n.table_lease.is_some();
    let notify = (told && n.dialect == Dialect::Postgres).then(|| {
        let mut w = n.writer();
        w.push("SELECT pg_notify(");
        super::postgres::channel(&mut w, Slot::NotifyTable);
        w.push(", ").param(Slot::NotifyPayload).push(")");
        w.finish()
    });
    CancelSql {
        probe,
        remove,
        unlease,
        exists,
        by_key,
        release,
        request,
        forget,
        notify,
        keys,
    }
}

/// ` WHERE id = ?[ AND processed_at IS NULL]`.
fn by_id(w: &mut SqlWriter, n: &Names) {
    w.push(" WHERE ").push(&n.id).push(" = ").param(Slot::Id);
    unfinished(w, n);
}

fn unfinished(w: &mut SqlWriter, n: &Names) {
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND ").push(processed_at).push(" IS NULL");
    }
}

/// 1 when the row holds a live lease, else 0 (always 0 on a table without a lease column), a
/// 64-bit integer.
fn leased(w: &mut SqlWriter, n: &Names) {
    let (open, close) = match n.dialect {
        Dialect::Postgres => ("CAST(", " AS BIGINT)"),
        Dialect::MySql => ("CAST(", " AS SIGNED)"),
        Dialect::Sqlite => ("", ""),
    };
    w.push(open);
    match &n.table_lease {
        Some(lease) => {
            w.push("CASE WHEN ")
                .push(lease)
                .push(" >= ")
                .param(Slot::Now)
                .push(" THEN 1 ELSE 0 END");
        }
        None => {
            w.push("0");
        }
    }
    w.push(close);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    fn names(dialect: Dialect, table: &Table) -> Names {
        Names::of_table(dialect, table).unwrap()
    }

    #[test]
    fn a_leased_row_is_removed_and_said_leased() {
        let t = Table::new("jobs").lease("until");
        let pg = cancel(&names(Dialect::Postgres, &t));
        assert!(pg.probe.is_none() && pg.unlease.is_none());
        assert_eq!(
            pg.remove.text(),
            r#"DELETE FROM "jobs" WHERE "id" = $1 RETURNING CAST(CASE WHEN "until" >= $2 THEN 1 ELSE 0 END AS BIGINT)"#
        );
        let marked = t.processed_at("done");
        let lite = cancel(&names(Dialect::Sqlite, &marked));
        assert_eq!(
            lite.remove.text(),
            "UPDATE `jobs` SET `done` = ? WHERE `id` = ? AND `done` IS NULL RETURNING CASE WHEN `until` >= ? THEN 1 ELSE 0 END"
        );
        assert_eq!(
            lite.unlease.unwrap().text(),
            "UPDATE `jobs` SET `until` = NULL WHERE `id` = ?"
        );
        let my = cancel(&names(Dialect::MySql, &marked));
        assert_eq!(
            my.probe.unwrap().text(),
            "SELECT CAST(CASE WHEN `until` >= ? THEN 1 ELSE 0 END AS SIGNED) FROM `jobs` WHERE `id` = ? AND `done` IS NULL FOR UPDATE"
        );
        assert_eq!(
            my.remove.text(),
            "UPDATE `jobs` SET `done` = ? WHERE `id` = ? AND `done` IS NULL"
        );
    }

    #[test]
    fn a_row_a_claim_holds_is_passed_over_without_a_request() {
        let t = Table::new("jobs").unique_key("k");
        let pg = cancel(&names(Dialect::Postgres, &t));
        // Its row lock and its advisory key are both tried (the table does not say its form),
        // and no request is recorded: a job in work is answered `InWork`.
        assert_eq!(pg.keys, Some(KeysAt::Server));
        assert_eq!(
            pg.remove.text(),
            r#"DELETE FROM "jobs" WHERE "id" = $1 AND "id" IN (SELECT "id" FROM "jobs" WHERE "id" = $2 FOR UPDATE SKIP LOCKED) AND CASE WHEN "id" = $3 THEN pg_try_advisory_xact_lock(((CAST($4 AS BIGINT) << 32) | (CAST("id" AS BIGINT) & 4294967295))) ELSE false END RETURNING CAST(0 AS BIGINT)"#
        );
        assert!(pg.request.is_none() && pg.forget.is_none());
        assert_eq!(
            pg.by_key.unwrap().text(),
            r#"SELECT CAST("id" AS BIGINT) FROM "jobs" WHERE "k" = $1"#
        );
        let my = cancel(&names(Dialect::MySql, &t));
        assert!(
            my.probe
                .unwrap()
                .text()
                .starts_with("SELECT CAST(0 AS SIGNED), CAST((GET_LOCK(")
        );
        assert_eq!(
            cancel(&names(Dialect::Sqlite, &t)).keys,
            Some(KeysAt::Process)
        );
    }

    #[test]
    fn a_row_an_advisory_lock_holds_is_passed_over_and_requested() {
        let t = Table::new("jobs").cancel_requests("jobs_cancels");
        let pg = cancel(&names(Dialect::Postgres, &t));
        assert_eq!(pg.keys, Some(KeysAt::Server));
        assert_eq!(
            pg.remove.text(),
            r#"DELETE FROM "jobs" WHERE "id" = $1 AND "id" IN (SELECT "id" FROM "jobs" WHERE "id" = $2 FOR UPDATE SKIP LOCKED) AND CASE WHEN "id" = $3 THEN pg_try_advisory_xact_lock(((CAST($4 AS BIGINT) << 32) | (CAST("id" AS BIGINT) & 4294967295))) ELSE false END RETURNING CAST(0 AS BIGINT)"#
        );
        assert_eq!(
            pg.request.unwrap().text(),
            r#"INSERT INTO "jobs_cancels" (id) VALUES ($1) ON CONFLICT DO NOTHING"#
        );
        let my = cancel(&names(Dialect::MySql, &t));
        assert_eq!(
            my.probe.unwrap().text(),
            "SELECT CAST(0 AS SIGNED), CAST((GET_LOCK(IF(CHAR_LENGTH(CONCAT(?, `id`)) > 64, CONCAT('sqlxq:', MD5(CONCAT(?, `id`))), CONCAT(?, `id`)), 0) = 1) AS SIGNED) FROM `jobs` WHERE `id` = ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            my.release.unwrap().text(),
            "SELECT RELEASE_LOCK(IF(CHAR_LENGTH(CONCAT(?, r.id)) > 64, CONCAT('sqlxq:', MD5(CONCAT(?, r.id))), CONCAT(?, r.id))) FROM (SELECT CAST(? AS SIGNED) AS id) AS r"
        );
        let lite = cancel(&names(Dialect::Sqlite, &t));
        assert_eq!(lite.keys, Some(KeysAt::Process));
        // The key is taken in the process: the statements bind none.
        assert_eq!(
            lite.remove.text(),
            "DELETE FROM `jobs` WHERE `id` = ? RETURNING 0"
        );
        assert_eq!(
            lite.request.unwrap().text(),
            "INSERT OR IGNORE INTO `jobs_cancels` (id) VALUES (?)"
        );
        assert_eq!(
            lite.forget.unwrap().text(),
            "DELETE FROM `jobs_cancels` WHERE id = ?"
        );
        let leased = t.lease("until");
        assert_eq!(cancel(&names(Dialect::Sqlite, &leased)).keys, None);
        assert_eq!(cancel(&names(Dialect::Postgres, &leased)).keys, None);
    }

    #[test]
    fn a_leased_job_in_work_is_notified_on_postgres() {
        let t = Table::new("jobs").lease("until");
        let pg = cancel(&names(Dialect::Postgres, &t));
        assert!(pg.request.is_none());
        assert!(pg.notify.unwrap().text().starts_with("SELECT pg_notify("));
        assert!(cancel(&names(Dialect::MySql, &t)).notify.is_none());
        let queued_only = cancel(&names(Dialect::Postgres, &Table::new("jobs")));
        assert!(queued_only.notify.is_none());
    }
}
