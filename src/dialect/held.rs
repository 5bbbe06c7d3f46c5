//! Statements of the forms that hold a connection per delivery: row lock and advisory lock.

use super::MAX_FINISH;
use super::common::{as_i64, claimable, finish, ids, order};
use super::{Dialect, Names, Slot, SqlWriter, Stmt, mysql, postgres};

/// The row lock form's statements. Each runs in the claim's transaction; its commit is the
/// settlement.
#[derive(Debug, Clone)]
pub(crate) struct RowLockSql {
    /// What opens the claim's transaction instead of a plain `BEGIN` (MySQL: READ COMMITTED).
    pub(crate) begin: Option<&'static str>,
    /// `SELECT id, payload[, attempt] .. LIMIT ? FOR UPDATE SKIP LOCKED`.
    pub(crate) claim: Stmt,
    /// The claim, passing over held-back rows.
    pub(crate) claim_excluding: Stmt,
    /// The id the claim would take next, passing over held-back rows.
    pub(crate) next: Stmt,
    /// ack and drop: `DELETE`, or `processed_at = now`.
    pub(crate) finish: Stmt,
    /// retry: `attempt = attempt + 1` (stopping at the column's largest value); absent without
    /// an attempt column (a rollback).
    pub(crate) retry: Option<Stmt>,
    /// retry_after: `retry_after = at[, attempt = attempt + 1]`; absent without the column.
    pub(crate) retry_after: Option<Stmt>,
    /// A batch's acks and drops in one statement: `finish_many[k]` takes `2^k` ids (a short
    /// list repeats its last id), up to [`MAX_FINISH`]. PostgreSQL only: on MariaDB 10.11,
    /// batches of 16 settled by `DELETE .. WHERE id IN (..)` from 8 workers deadlocked on
    /// records outside their lists (a hand-written loop did too), where a statement per row
    /// does not.
    pub(crate) finish_many: Option<Box<[Stmt]>>,
    /// A batch's retries in one statement, as `finish_many`; absent without an attempt column.
    pub(crate) retry_many: Option<Box<[Stmt]>>,
}

/// The advisory lock form's statements. Each commits on its own, on the session holding the
/// row's key.
#[derive(Debug, Clone)]
pub(crate) struct AdvisorySql {
    /// Ids of claimable rows whose keys no session holds (PostgreSQL, MySQL), in id order.
    pub(crate) candidates: Stmt,
    /// The candidates, passing over held-back rows.
    pub(crate) candidates_excluding: Stmt,
    /// Takes the key of row `id` without waiting: returns 1 when taken (absent on SQLite, whose
    /// keys are held in the process).
    pub(crate) lock: Option<Stmt>,
    /// Releases the key of row `id` (absent on SQLite).
    pub(crate) unlock: Option<Stmt>,
    /// Once the key is held: the row if it is still claimable, `(id, payload[, attempt])`,
    /// counting the attempt where the database has `RETURNING`.
    pub(crate) take: Stmt,
    /// Counts the attempt after `take` where it could not (MySQL/MariaDB).
    pub(crate) count: Option<Stmt>,
    /// ack and drop.
    pub(crate) finish: Stmt,
    /// retry_after: `retry_after = at`; absent without the column.
    pub(crate) retry_after: Option<Stmt>,
}

fn by_id(w: &mut SqlWriter, n: &Names) {
    w.push(" WHERE ").push(&n.id).push(" = ").param(Slot::Id);
}

fn update(w: &mut SqlWriter, n: &Names) {
    w.push("UPDATE ").push(&n.table).push(" SET ");
}

fn select_row(w: &mut SqlWriter, n: &Names) {
    w.push("SELECT ");
    as_i64(w, &n.id);
    w.push(", ");
    n.read_payload(w, "");
    if let Some(attempt) = &n.attempt {
        w.push(", ");
        as_i64(w, attempt);
    }
    if n.session {
        w.push(", CAST(CONNECTION_ID() AS SIGNED)");
    }
    w.push(" FROM ").push(&n.table);
}

fn finish_by_id(n: &Names) -> Stmt {
    let mut w = n.writer();
    finish(&mut w, n);
    by_id(&mut w, n);
    w.finish()
}

/// `retry_after = at`, and `attempt + 1` when `count` (row lock counts on return).
fn retry_after_by_id(n: &Names, count: bool) -> Option<Stmt> {
    let retry_after = n.retry_after.as_deref()?;
    let mut w = n.writer();
    update(&mut w, n);
    w.push(retry_after).push(" = ").param(Slot::At);
    if let (true, Some(attempt)) = (count, &n.attempt) {
        w.push(", ");
        n.count_attempt(&mut w, attempt);
    }
    by_id(&mut w, n);
    Some(w.finish())
}

/// The statement `body` renders, once per list size `2^k` up to [`MAX_FINISH`], each ending in
/// `WHERE id IN (..)`.
fn by_ids(n: &Names, body: impl Fn(&mut SqlWriter)) -> Box<[Stmt]> {
    (0..=MAX_FINISH.trailing_zeros())
        .map(|k| {
            let mut w = n.writer();
            body(&mut w);
            w.push(" WHERE ");
            ids(&mut w, n, 1 << k);
            w.finish()
        })
        .collect()
}

pub(crate) fn row_lock(n: &Names) -> RowLockSql {
    let claim = |n: &Names| {
        let mut w = n.writer();
        select_row(&mut w, n);
        w.push(" WHERE ");
        claimable(&mut w, n);
        order(&mut w, n);
        w.push(" LIMIT ")
            .param(Slot::Limit)
            .push(" FOR UPDATE SKIP LOCKED");
        w.finish()
    };
    let excluding = n.excluding();

    let retry = n.attempt.as_deref().map(|attempt| {
        let mut w = n.writer();
        update(&mut w, n);
        n.count_attempt(&mut w, attempt);
        by_id(&mut w, n);
        w.finish()
    });
    let sets = n.dialect == Dialect::Postgres;
    let retry_many = n.attempt.as_deref().filter(|_| sets).map(|attempt| {
        by_ids(n, |w| {
            update(w, n);
            n.count_attempt(w, attempt);
        })
    });

    RowLockSql {
        begin: (n.dialect == Dialect::MySql).then_some(mysql::BEGIN_READ_COMMITTED),
        claim: claim(n),
        claim_excluding: claim(&excluding),
        next: super::common::next(&excluding),
        finish: finish_by_id(n),
        retry,
        retry_after: retry_after_by_id(n, true),
        finish_many: sets.then(|| by_ids(n, |w| finish(w, n))),
        retry_many,
    }
}

pub(crate) fn advisory(n: &Names) -> AdvisorySql {
    let candidates = |n: &Names| {
        let mut w = n.writer();
        w.push("SELECT ");
        as_i64(&mut w, &n.id);
        w.push(" FROM ").push(&n.table).push(" WHERE ");
        claimable(&mut w, n);
        match n.dialect {
            Dialect::Postgres => postgres::key_not_held(&mut w, n),
            Dialect::MySql => mysql::key_not_held(&mut w, n),
            Dialect::Sqlite => {}
        }
        order(&mut w, n);
        w.push(" LIMIT ").param(Slot::Limit);
        w.finish()
    };

    let (lock, unlock) = match n.dialect {
        Dialect::Postgres => (Some(postgres::try_lock()), Some(postgres::unlock())),
        Dialect::MySql => (Some(mysql::try_lock()), Some(mysql::unlock())),
        Dialect::Sqlite => (None, None),
    };

    // The row again, now that its key is held: it may have been settled meanwhile.
    let mut w = n.writer();
    let count = match (n.dialect, &n.attempt) {
        (Dialect::Postgres | Dialect::Sqlite, Some(attempt)) => {
            update(&mut w, n);
            n.count_attempt(&mut w, attempt);
            by_id(&mut w, n);
            w.push(" AND ");
            claimable(&mut w, n);
            w.push(" RETURNING ");
            as_i64(&mut w, &n.id);
            w.push(", ");
            n.read_payload(&mut w, "");
            w.push(", ");
            as_i64(&mut w, attempt);
            w.push(" - 1");
            None
        }
        (_, attempt) => {
            select_row(&mut w, n);
            by_id(&mut w, n);
            w.push(" AND ");
            claimable(&mut w, n);
            attempt.as_deref().map(|attempt| {
                let mut w = n.writer();
                update(&mut w, n);
                n.count_attempt(&mut w, attempt);
                by_id(&mut w, n);
                w.finish()
            })
        }
    };
    let take = w.finish();

    AdvisorySql {
        candidates: candidates(n),
        candidates_excluding: candidates(&n.excluding()),
        lock,
        unlock,
        take,
        count,
        finish: finish_by_id(n),
        retry_after: retry_after_by_id(n, false),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Dialect, Names};
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table, advisory: bool) -> Names {
        let form = if advisory { "advisory" } else { "row_lock" };
        Names::for_test(dialect, table, Some("mail"), form, true)
    }

    #[test]
    fn row_lock_claims_one_locked_row_and_counts_on_return() {
        let table = Table::new("jobs").group("queue").retry_after("not_before");
        let mut n = names(Dialect::Postgres, table, false);
        n.attempt_max = 32_767; // a smallint column
        let sql = super::row_lock(&n);
        assert_eq!(
            sql.claim.text(),
            r#"SELECT CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT) FROM "jobs" WHERE "queue" = $1 AND ("not_before" IS NULL OR "not_before" <= $2) ORDER BY "id" LIMIT $3 FOR UPDATE SKIP LOCKED"#
        );
        assert_eq!(
            sql.retry.unwrap().text(),
            r#"UPDATE "jobs" SET "attempt" = CASE WHEN "attempt" < 32767 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $1"#
        );
        assert_eq!(
            sql.retry_after.unwrap().text(),
            r#"UPDATE "jobs" SET "not_before" = $1, "attempt" = CASE WHEN "attempt" < 32767 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $2"#
        );
        assert_eq!(sql.finish.text(), r#"DELETE FROM "jobs" WHERE "id" = $1"#);
        assert!(sql.begin.is_none());
        let mysql = super::row_lock(&names(Dialect::MySql, Table::new("jobs"), false));
        assert_eq!(
            mysql.begin,
            Some("SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION")
        );
    }

    #[test]
    fn advisory_skips_keys_held_elsewhere_in_the_candidate_query() {
        let sql = super::advisory(&names(Dialect::Postgres, Table::new("jobs"), true));
        assert!(
            sql.candidates.text().contains(
                "NOT IN (SELECT objid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            ),
            "{}",
            sql.candidates.text()
        );
        assert_eq!(
            sql.take.text(),
            r#"UPDATE "jobs" SET "attempt" = CASE WHEN "attempt" < 9223372036854775807 THEN "attempt" + 1 ELSE "attempt" END WHERE "id" = $1 AND 1 = 1 RETURNING CAST("id" AS BIGINT), "payload", CAST("attempt" AS BIGINT) - 1"#
        );
        assert!(sql.count.is_none());
        let mut n = names(Dialect::MySql, Table::new("jobs"), true);
        n.attempt_max = 255; // a tinyint unsigned column
        let sql = super::advisory(&n);
        assert!(
            sql.candidates.text().contains("IS_USED_LOCK("),
            "{}",
            sql.candidates.text()
        );
        assert_eq!(
            sql.count.unwrap().text(),
            "UPDATE `jobs` SET `attempt` = CASE WHEN `attempt` < 255 THEN `attempt` + 1 \
             ELSE `attempt` END WHERE `id` = ?"
        );
        let sql = super::advisory(&names(Dialect::Sqlite, Table::new("jobs"), true));
        assert!(sql.lock.is_none() && sql.unlock.is_none());
    }
}
