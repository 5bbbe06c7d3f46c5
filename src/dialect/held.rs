//! Statements of the forms that hold a connection per delivery: row lock and advisory lock.

use super::MAX_FINISH;
use super::common::{as_i64, claimable, finish, finish_ids, ids, order, read_created};
use super::{BySize, Dialect, Names, Slot, SqlWriter, Stmt, mysql, postgres};

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
    /// A batch's acks and drops in one statement, per number of ids up to [`MAX_FINISH`].
    /// MySQL/MariaDB reach each row through a join on the primary key: MariaDB 10.11 plans
    /// `DELETE .. WHERE id IN (..)` on a small table as a scan, which locks rows other batches
    /// hold, and batches of 16 from 8 workers deadlocked (a hand-written loop did too).
    pub(crate) finish_many: BySize,
    /// A batch's retries in one statement, as `finish_many`; absent without an attempt column.
    pub(crate) retry_many: Option<BySize>,
    /// FIFO's guard, run in the claim's transaction for each row claimed: locks, without
    /// waiting, the first unfinished row (by id) of the claimed row's group and returns its id;
    /// no row when another transaction holds it. Every row in work holds its group's first row
    /// so, and that row stays first while it is held: one row of a group in work at a time,
    /// also when a row that waited for its `retry_after` becomes due behind a later one in
    /// work. Absent without FIFO.
    pub(crate) guard: Option<Stmt>,
}

/// The advisory lock form's statements. Each commits on its own, on the session holding the
/// rows' keys. A claim is two statements (three on MySQL/MariaDB with an attempt column, sent in
/// two round trips: the keys, then `take_count_many`; one on PostgreSQL with an attempt column,
/// `lock_take`), an ack one round trip (`finish_unlock_many`), for one row or many.
#[derive(Debug, Clone)]
pub(crate) struct AdvisorySql {
    /// Ids of claimable rows in claim order (SQLite, whose keys are held in the process).
    pub(crate) candidates: Stmt,
    /// The candidates, passing over held-back rows.
    pub(crate) candidates_excluding: Stmt,
    /// Takes, without waiting, the keys of up to `Limit` of the first `Window` claimable rows in
    /// claim order, and returns their ids: the lock is in the query, so a key another session
    /// holds is passed over, and no key is taken beyond the limit (PostgreSQL, MySQL/MariaDB).
    pub(crate) lock_many: Option<Stmt>,
    /// `lock_many`, passing over held-back rows.
    pub(crate) lock_many_excluding: Option<Stmt>,
    /// `lock_many` and `take_many` in one statement (PostgreSQL with an attempt column): the
    /// rows whose keys it took, `(id, payload, attempt[, ..], 0)`, and `(id, NULL.., 1)` for a
    /// key it took and released again, its row no longer claimable. See
    /// [`lock_take`](postgres::lock_take).
    pub(crate) lock_take: Option<Stmt>,
    /// `lock_take`, passing over held-back rows.
    pub(crate) lock_take_excluding: Option<Stmt>,
    /// Releases every key of the session, after a `lock_take` that failed (run only on a
    /// session that held no key before it).
    pub(crate) unlock_all: Option<Stmt>,
    /// Releases the key of row `id`: 1 when it was held (absent on SQLite).
    pub(crate) unlock: Option<Stmt>,
    /// Releases the keys of `2^k` ids, returning those whose key was held (absent on SQLite).
    pub(crate) unlock_many: Option<BySize>,
    /// Once the key is held: the row if it is still claimable, `(id, payload[, attempt])`,
    /// counting the attempt where the database has `RETURNING`. Row by row, to name a row
    /// whose take fails.
    pub(crate) take: Stmt,
    /// Counts the attempt after `take` where it could not (MySQL/MariaDB).
    pub(crate) count: Option<Stmt>,
    /// `take` of `2^k` rows whose keys are held: the rows still claimable (another session may
    /// have settled one since the claim's snapshot).
    pub(crate) take_many: BySize,
    /// `count` of `2^k` rows (MySQL/MariaDB with an attempt column).
    pub(crate) count_many: Option<BySize>,
    /// The count of the attempts of `2^k` rows still claimable, then their read (`take_many`,
    /// the attempt as it was before the count), sent together ([`Stmt::multi`]; MySQL/MariaDB
    /// with an attempt column): the count's `UPDATE` reads each row's latest version, waiting
    /// for a writer that holds it, so a row another transaction deletes meanwhile is passed
    /// over; the read finds the rows it counted by the same condition and the same `now`, since
    /// no other session settles a row whose key this one holds. Not for FIFO queues, whose
    /// condition reads the table in a subquery, which MySQL refuses in an `UPDATE` of that table.
    pub(crate) take_count_many: Option<BySize>,
    /// ack and drop.
    pub(crate) finish: Stmt,
    /// ack and drop of `2^k` rows.
    pub(crate) finish_many: BySize,
    /// `finish_many` and the release of the rows' keys in one round trip; returns the ids
    /// whose key was held. PostgreSQL: one statement, each key handed to the statement's
    /// transaction, which keeps it until the commit. MySQL/MariaDB have no lock of a
    /// transaction's (a lock released in the statement would be free before the commit, and a
    /// claim could read the row still there): two statements sent together ([`Stmt::multi`]),
    /// the settlement committing before the release runs — outside a transaction only.
    pub(crate) finish_unlock_many: Option<BySize>,
    /// retry_after: `retry_after = at`; absent without the column.
    pub(crate) retry_after: Option<Stmt>,
    /// `attempt = ?` of a row whose key is held: a row claimed but never delivered goes back
    /// with the count its claim read; absent without an attempt column.
    pub(crate) restore_attempt: Option<Stmt>,
}

/// `SELECT id FROM (the first `Window` claimable rows in claim order) AS c WHERE (its key taken
/// without waiting) LIMIT ?`: the candidates in a derived table (its LIMIT keeps it from being
/// merged into the outer query), each key tried as the outer query reads them until it has
/// `Limit`. `None` on SQLite, whose keys are held in the process.
pub(super) fn lock_many_into(w: &mut SqlWriter, n: &Names) -> Option<()> {
    let try_lock: fn(&mut SqlWriter, &str) = match n.dialect {
        Dialect::Postgres => postgres::try_lock_of,
        Dialect::MySql => mysql::try_lock_of,
        Dialect::Sqlite => return None,
    };
    w.push("SELECT ");
    as_i64(w, "c.sqlxq_id");
    w.push(" FROM (SELECT ")
        .push(&n.id)
        .push(" AS sqlxq_id FROM ")
        .push(&n.table)
        .push(" WHERE ");
    claimable(w, n);
    order(w, n);
    w.limit(Slot::Window).push(") AS c WHERE ");
    try_lock(w, "c.sqlxq_id");
    w.limit(Slot::Limit);
    Some(())
}

fn by_id(w: &mut SqlWriter, n: &Names) {
    w.push(" WHERE ").push(&n.id).push(" = ").param(Slot::Id);
}

fn update(w: &mut SqlWriter, n: &Names) {
    w.push("UPDATE ").push(&n.table).push(" SET ");
}

fn select_row(w: &mut SqlWriter, n: &Names) {
    select_row_counted(w, n, false);
}

/// [`select_row`], after the attempt's count (`counted`): the attempt read as it was before.
fn select_row_counted(w: &mut SqlWriter, n: &Names, counted: bool) {
    w.push("SELECT ");
    as_i64(w, &n.id);
    w.push(", ");
    n.read_payload(w, "");
    if let Some(attempt) = &n.attempt {
        w.push(", ");
        as_i64(w, attempt);
        if counted {
            w.push(" - 1");
        }
    }
    read_created(w, n, "");
    if n.session {
        w.push(", CAST(CONNECTION_ID() AS SIGNED)");
    }
    w.push(" FROM ").push(&n.table);
}

/// `UPDATE .. SET <attempt + 1>` of the rows `by` places, those still claimable.
fn count_claimable(w: &mut SqlWriter, n: &Names, attempt: &str, by: &dyn Fn(&mut SqlWriter)) {
    update(w, n);
    n.count_attempt(w, attempt);
    by(w);
    w.push(" AND ");
    claimable(w, n);
}

/// [`select_row_counted`] of the rows `by` places, those still claimable.
fn read_claimable(w: &mut SqlWriter, n: &Names, by: &dyn Fn(&mut SqlWriter), counted: bool) {
    select_row_counted(w, n, counted);
    by(w);
    w.push(" AND ");
    claimable(w, n);
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

/// The statement `body` renders, once per list size `2^k` up to [`MAX_FINISH`]; `body` places
/// ` WHERE id IN (..)` where it calls its second argument.
fn by_ids(n: &Names, body: impl Fn(&mut SqlWriter, &dyn Fn(&mut SqlWriter))) -> BySize {
    BySize::new(MAX_FINISH, |count| {
        let mut w = n.writer();
        body(&mut w, &|w: &mut SqlWriter| {
            w.push(" WHERE ");
            ids(w, n, count);
        });
        w.finish()
    })
}

/// [`RowLockSql::guard`]: `SELECT id FROM t WHERE id = (SELECT MIN(h.id) FROM t AS h WHERE
/// h.group = (the group of row ?) AND h.processed_at IS NULL) FOR UPDATE SKIP LOCKED`.
fn guard(n: &Names, group: &str) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(" FROM ")
        .push(&n.table)
        .push(" WHERE ")
        .push(&n.id)
        .push(" = (SELECT MIN(h.")
        .push(&n.id)
        .push(") FROM ")
        .push(&n.table)
        .push(" AS h WHERE h.")
        .push(group)
        .push(" = (SELECT g.")
        .push(group)
        .push(" FROM ")
        .push(&n.table)
        .push(" AS g WHERE g.")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id)
        .push(")");
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND h.").push(processed_at).push(" IS NULL");
    }
    w.push(") FOR UPDATE SKIP LOCKED");
    w.finish()
}

pub(crate) fn row_lock(n: &Names) -> RowLockSql {
    let claim = |n: &Names| {
        let mut w = n.writer();
        select_row(&mut w, n);
        w.push(" WHERE ");
        claimable(&mut w, n);
        order(&mut w, n);
        w.limit(Slot::Limit).push(" FOR UPDATE SKIP LOCKED");
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
    let retry_many = n.attempt.as_deref().map(|attempt| match n.dialect {
        Dialect::MySql => BySize::new(MAX_FINISH, |count| mysql::count_joined(n, attempt, count)),
        _ => by_ids(n, |w, by| {
            update(w, n);
            n.count_attempt(w, attempt);
            by(w);
        }),
    });
    let finish_many = match n.dialect {
        Dialect::MySql => BySize::new(MAX_FINISH, |count| mysql::finish_joined(n, count)),
        _ => by_ids(n, |w, by| {
            finish(w, n);
            by(w);
        }),
    };

    RowLockSql {
        // FIFO's guard; a limit above 1 counts the rows before the row instead (`slots`).
        guard: n
            .fifo
            .as_ref()
            .filter(|fifo| fifo.limit == 1)
            .map(|fifo| guard(n, &fifo.group)),
        begin: (n.dialect == Dialect::MySql).then_some(mysql::BEGIN_READ_COMMITTED),
        claim: claim(&n.floored()),
        claim_excluding: claim(&excluding.floored()),
        next: super::common::next(&excluding),
        finish: finish_by_id(n),
        retry,
        retry_after: retry_after_by_id(n, true),
        finish_many,
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
        order(&mut w, n);
        w.limit(Slot::Limit);
        w.finish()
    };
    let lock_many = |n: &Names| {
        let mut w = n.writer();
        lock_many_into(&mut w, n)?;
        Some(w.finish())
    };
    // PostgreSQL with an attempt column: the keys and the rows in one statement.
    let lock_take = |lock: &Names| match (n.dialect, &n.attempt) {
        (Dialect::Postgres, Some(attempt)) => Some(postgres::lock_take(lock, n, attempt)),
        _ => None,
    };
    let unlock = match n.dialect {
        Dialect::Postgres => Some(postgres::unlock()),
        Dialect::MySql => Some(mysql::unlock()),
        Dialect::Sqlite => None,
    };
    let unlock_many = |count: u16| match n.dialect {
        Dialect::Postgres => Some(postgres::unlock_many(count)),
        Dialect::MySql => Some(mysql::unlock_many(count)),
        Dialect::Sqlite => None,
    };
    let unlock_many = BySize::maybe(MAX_FINISH, unlock_many);

    // The rows again, now that their keys are held: one may have been settled meanwhile.
    let take = |w: &mut SqlWriter, by: &dyn Fn(&mut SqlWriter)| match (n.dialect, &n.attempt) {
        (Dialect::Postgres | Dialect::Sqlite, Some(attempt)) => {
            count_claimable(w, n, attempt, by);
            w.push(" RETURNING ");
            as_i64(w, &n.id);
            w.push(", ");
            n.read_payload(w, "");
            w.push(", ");
            as_i64(w, attempt);
            w.push(" - 1");
            read_created(w, n, "");
        }
        _ => read_claimable(w, n, by, false),
    };
    let counts = n.dialect == Dialect::MySql;
    let count = |w: &mut SqlWriter, attempt: &str, by: &dyn Fn(&mut SqlWriter)| {
        update(w, n);
        n.count_attempt(w, attempt);
        by(w);
    };
    let one = |w: &mut SqlWriter| by_id(w, n);
    let mut w = n.writer();
    take(&mut w, &one);

    AdvisorySql {
        candidates: candidates(&n.floored()),
        candidates_excluding: candidates(&n.excluding().floored()),
        lock_many: lock_many(&n.floored()),
        lock_many_excluding: lock_many(&n.excluding().floored()),
        lock_take: lock_take(&n.floored()),
        lock_take_excluding: lock_take(&n.excluding().floored()),
        unlock_all: lock_take(n).map(|_| postgres::unlock_all()),
        unlock,
        unlock_many,
        take: w.finish(),
        count: n.attempt.as_deref().filter(|_| counts).map(|attempt| {
            let mut w = n.writer();
            count(&mut w, attempt, &one);
            w.finish()
        }),
        take_many: by_ids(n, |w, by| take(w, by)),
        count_many: n
            .attempt
            .as_deref()
            .filter(|_| counts)
            .map(|attempt| by_ids(n, |w, by| count(w, attempt, by))),
        finish: finish_by_id(n),
        finish_many: by_ids(n, |w, by| {
            finish(w, n);
            by(w);
        }),
        take_count_many: match (n.dialect, &n.attempt, &n.fifo) {
            (Dialect::MySql, Some(attempt), None) => Some(by_ids(n, |w, by| {
                count_claimable(w, n, attempt, by);
                w.then();
                read_claimable(w, n, by, true);
            })),
            _ => None,
        },
        finish_unlock_many: match n.dialect {
            Dialect::Postgres => Some(BySize::new(MAX_FINISH, |count| {
                postgres::finish_unlock_many(n, count)
            })),
            Dialect::MySql => Some(BySize::new(MAX_FINISH, |count| {
                let mut w = n.writer();
                finish_ids(&mut w, n, count);
                w.then();
                mysql::unlock_many_into(&mut w, count);
                w.finish()
            })),
            Dialect::Sqlite => None,
        },
        retry_after: retry_after_by_id(n, false),
        restore_attempt: n.attempt.as_deref().map(|attempt| {
            let mut w = n.writer();
            update(&mut w, n);
            w.push(attempt).push(" = ").param(Slot::Attempt);
            by_id(&mut w, n);
            w.finish()
        }),
    }
}

#[cfg(test)]
mod tests;
