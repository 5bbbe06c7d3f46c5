//! The fragments the statement families share, the same on every database but for quoting and
//! placeholders: what makes a row claimable, the claim order, a row's finish, an id read as a
//! 64-bit integer, a list of ids. The families are apart: the lease form's (`lease`), the held
//! forms' (`held`), the insert's (`enqueue`), the dead letter's (`dead`).

use super::names::Fifo;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// How many held-back rows a claim passes over at most (`Slot::Excluded`).
pub(crate) const MAX_EXCLUDED: u16 = 16;

/// `WHERE` conditions that make a row claimable now (no leading `WHERE`): its group, not
/// processed, no live lease, due.
pub(super) fn claimable(w: &mut SqlWriter, n: &Names) {
    let mut any = false;
    let mut and = |w: &mut SqlWriter| {
        if std::mem::replace(&mut any, true) {
            w.push(" AND ");
        }
    };
    if let (Some(group), true) = (&n.group, n.one_group) {
        and(w);
        w.push(group).push(" = ").param(Slot::Group);
    }
    if n.floored {
        and(w);
        w.push(&n.id).push(" >= ").param(Slot::Floor);
    }
    if let Some(processed_at) = &n.processed_at {
        and(w);
        w.push(processed_at).push(" IS NULL");
    }
    if let Some(lease) = &n.lease {
        and(w);
        w.push("(")
            .push(lease)
            .push(" IS NULL OR ")
            .push(lease)
            .push(" < ")
            .param(Slot::Now)
            .push(")");
    }
    if let Some(retry_after) = &n.retry_after {
        and(w);
        w.push("(")
            .push(retry_after)
            .push(" IS NULL OR ")
            .push(retry_after)
            .push(" <= ")
            .param(Slot::Now)
            .push(")");
    }
    if let Some(columns) = &n.fifo {
        and(w);
        fifo(w, n, columns);
    }
    if n.excluding {
        and(w);
        w.push(&n.id).push(" NOT IN (");
        for i in 0..MAX_EXCLUDED {
            if i > 0 {
                w.push(", ");
            }
            w.param(Slot::Excluded(i));
        }
        w.push(")");
    }
    if !any {
        w.push("1 = 1");
    }
}

/// The id a claim would take next: `SELECT id .. WHERE <claimable> ORDER BY .. LIMIT 1`, a plain
/// read that locks nothing.
pub(crate) fn next(n: &Names) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, &n.id);
    w.push(" FROM ").push(&n.table).push(" WHERE ");
    claimable(&mut w, n);
    order(&mut w, n);
    w.push(" LIMIT 1");
    w.finish()
}

/// FIFO within a group: a row is claimable only when no other row of its group is in work
/// (under a live lease) and no earlier row of its group is due. A delayed row does not hold
/// back later rows that are due. A limit above 1 counts both kinds of rows instead
/// ([`per_group`]).
fn fifo(w: &mut SqlWriter, n: &Names, columns: &Fifo) {
    let group = columns.group.as_str();
    let lease = match (&columns.lease, columns.limit) {
        (Some(lease), 1) => lease.as_str(),
        (Some(lease), _) => {
            per_group(w, n, group, lease, columns.limit);
            return;
        }
        // The row lock form: only the no-earlier-due-row half (its guard keeps one in work).
        (None, 1) => "",
        (None, _) => {
            slots(w, n, group, columns.limit);
            return;
        }
    };
    let outer = |w: &mut SqlWriter, column: &str| {
        w.push(&n.table).push(".").push(column);
    };
    let same_group = |w: &mut SqlWriter| {
        w.push(" FROM ")
            .push(&n.table)
            .push(" AS h WHERE h.")
            .push(group)
            .push(" = ");
        outer(w, group);
        if let Some(processed_at) = &n.processed_at {
            w.push(" AND h.").push(processed_at).push(" IS NULL");
        }
    };
    if !lease.is_empty() {
        w.push("NOT EXISTS (SELECT 1");
        same_group(w);
        w.push(" AND h.").push(&n.id).push(" <> ");
        outer(w, &n.id);
        w.push(" AND h.").push(lease).push(" >= ").param(Slot::Now);
        w.push(") AND ");
    }
    w.push("NOT EXISTS (SELECT 1");
    same_group(w);
    w.push(" AND h.").push(&n.id).push(" < ");
    outer(w, &n.id);
    earlier_row_due(w, n);
    w.push(")");
}

/// ` AND (h.retry_after IS NULL OR h.retry_after <= now)`: the group's earlier row `h` is due
/// (nothing where the table has no `retry_after`).
fn earlier_row_due(w: &mut SqlWriter, n: &Names) {
    if let Some(retry_after) = &n.retry_after {
        w.push(" AND (h.")
            .push(retry_after)
            .push(" IS NULL OR h.")
            .push(retry_after)
            .push(" <= ")
            .param(Slot::Now)
            .push(")");
    }
}

/// At most `limit` rows of a group in work: a row is claimable only when fewer than `limit`
/// other rows of its group are in work (under a live lease) or due before it (by id). Counting
/// the earlier due rows keeps concurrent claims within the limit: of two claims that each take
/// a row of the group unseen by the other, the one of the later row counts the earlier row as
/// due, and the rows a claim takes at once are the group's first due ones.
fn per_group(w: &mut SqlWriter, n: &Names, group: &str, lease: &str, limit: u32) {
    let outer = |w: &mut SqlWriter, column: &str| {
        w.push(&n.table).push(".").push(column);
    };
    w.push("(SELECT COUNT(*) FROM ")
        .push(&n.table)
        .push(" AS h WHERE h.")
        .push(group)
        .push(" = ");
    outer(w, group);
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND h.").push(processed_at).push(" IS NULL");
    }
    w.push(" AND h.").push(&n.id).push(" <> ");
    outer(w, &n.id);
    w.push(" AND (h.").push(lease).push(" >= ").param(Slot::Now);
    w.push(" OR h.").push(&n.id).push(" < ");
    outer(w, &n.id);
    earlier_row_due(w, n);
    w.push(")) < ").push(&limit.to_string());
}

/// At most `limit` rows of a group in work on the row lock form, whose claims cannot see the
/// rows other transactions hold: a row is claimable only when fewer than `limit` unfinished
/// rows of its group come before it (by id), due or not. The rows in work are then always among
/// their group's first `limit` unfinished rows (rows before them only ever finish), so at most
/// `limit` are; a row waiting for its `retry_after` keeps its place among them.
fn slots(w: &mut SqlWriter, n: &Names, group: &str, limit: u32) {
    w.push("(SELECT COUNT(*) FROM ")
        .push(&n.table)
        .push(" AS h WHERE h.")
        .push(group)
        .push(" = ")
        .push(&n.table)
        .push(".")
        .push(group);
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND h.").push(processed_at).push(" IS NULL");
    }
    w.push(" AND h.")
        .push(&n.id)
        .push(" < ")
        .push(&n.table)
        .push(".")
        .push(&n.id)
        .push(") < ")
        .push(&limit.to_string());
}

/// `AND id IN (SELECT id .. WHERE id = $id FOR UPDATE SKIP LOCKED)` (PostgreSQL): the row, unless
/// another transaction holds its row lock (a row lock form's delivery), never waited for.
pub(super) fn unless_row_locked(w: &mut SqlWriter, n: &Names) {
    w.push(" AND ")
        .push(&n.id)
        .push(" IN (SELECT ")
        .push(&n.id)
        .push(" FROM ")
        .push(&n.table)
        .push(" WHERE ")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id)
        .push(" FOR UPDATE SKIP LOCKED)");
}

/// ` ORDER BY`: priority (smaller first), then due time (a row never delayed first), then id.
pub(super) fn order(w: &mut SqlWriter, n: &Names) {
    w.push(" ORDER BY ");
    if let Some(priority) = &n.priority {
        w.push(priority).push(", ");
        if let Some(retry_after) = &n.retry_after {
            match n.dialect {
                // NULLs sort first in ascending order on MySQL and SQLite, last on PostgreSQL.
                Dialect::Postgres => w.push(retry_after).push(" NULLS FIRST, "),
                Dialect::MySql | Dialect::Sqlite => w.push(retry_after).push(", "),
            };
        }
    }
    w.push(&n.id);
}

/// `[, created_at][, headers]` (named with `prefix`, e.g. `q.`) after a claim's other columns,
/// where the claim reads the row's creation time ([`Names::read_created`]) and its headers
/// ([`Names::headers`]).
pub(super) fn read_created(w: &mut SqlWriter, n: &Names, prefix: &str) {
    if let (true, Some(created_at)) = (n.read_created, &n.created_at) {
        w.push(", ").push(prefix).push(created_at);
    }
    n.read_headers(w, prefix);
}

/// `id` read as a 64-bit integer (PostgreSQL decodes strictly; MySQL reads it signed).
pub(super) fn as_i64(w: &mut SqlWriter, column: &str) {
    match w.dialect() {
        Dialect::Postgres => w.push("CAST(").push(column).push(" AS BIGINT)"),
        Dialect::MySql => w.push("CAST(").push(column).push(" AS SIGNED)"),
        Dialect::Sqlite => w.push(column),
    };
}

/// `DELETE` of row `id`, or `processed_at = now` where the table keeps finished rows; the lease
/// cleared too in the lease form.
pub(super) fn finish(w: &mut SqlWriter, n: &Names) {
    match &n.processed_at {
        Some(processed_at) => {
            w.push("UPDATE ").push(&n.table);
            mark_processed(w, n, processed_at);
        }
        None => {
            w.push("DELETE FROM ").push(&n.table);
        }
    }
}

/// ` SET processed_at = now[, lease = NULL][, unique key = NULL]` of a finish that marks rather than deletes.
pub(super) fn mark_processed(w: &mut SqlWriter, n: &Names, processed_at: &str) {
    w.push(" SET ")
        .push(processed_at)
        .push(" = ")
        .param(Slot::Now);
    if let Some(lease) = &n.lease {
        w.push(", ").push(lease).push(" = NULL");
    }
    // MySQL/MariaDB has no partial index: a finished row frees its unique key by losing it.
    if let (Dialect::MySql, Some(key)) = (w.dialect(), &n.unique_key) {
        w.push(", ").push(key).push(" = NULL");
    }
}

/// `id IN (?, ..)` of `count` ids.
pub(super) fn ids(w: &mut SqlWriter, n: &Names, count: u16) {
    w.push(&n.id).push(" IN (");
    for i in 0..count {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::IdAt(i));
    }
    w.push(")");
}
