//! The fragments the statement families share, the same on every database but for quoting and
//! placeholders: what makes a row claimable, the claim order, a row's finish, an id read as a
//! 64-bit integer, a list of ids. The families are apart: the lease form's (`lease`), the held
//! forms' (`held`), the insert's (`enqueue`), the dead letter's (`dead`).

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
        super::groups::fifo(w, n, columns);
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

/// `[, created_at][, headers][, key]` (named with `prefix`, e.g. `q.`) after a claim's other
/// columns, where the claim reads the row's creation time ([`Names::read_created`]), its headers
/// ([`Names::headers`]) and its key ([`Names::key`]).
pub(super) fn read_created(w: &mut SqlWriter, n: &Names, prefix: &str) {
    if let (true, Some(created_at)) = (n.read_created, &n.created_at) {
        w.push(", ");
        match n.dialect {
            Dialect::Sqlite => created_millis(w, &format!("{prefix}{created_at}")),
            Dialect::Postgres | Dialect::MySql => {
                w.push(prefix).push(created_at);
            }
        }
    }
    n.read_headers(w, prefix);
    n.read_key(w, prefix);
}

/// SQLite: `column`, a time, as milliseconds since 1970 (an integer), computed by SQLite's own
/// date functions: text as they read it (`YYYY-MM-DD HH:MM:SS[.fff]`, a `T`, an offset), an
/// integer as Unix seconds, a real as a Julian day — the forms sqlx decodes a time from; `NULL`
/// for anything else. Read as text, each claimed row's time cost an allocation and a copy on
/// both sides and a parse in the client.
pub(super) fn created_millis(w: &mut SqlWriter, column: &str) {
    w.push("CASE typeof(")
        .push(column)
        .push(") WHEN 'text' THEN CASE WHEN substr(")
        .push(column)
        .push(", 5, 1) = '-' THEN CAST(round((julianday(")
        .push(column)
        .push(") - 2440587.5) * 86400000.0) AS INTEGER) END WHEN 'integer' THEN ")
        .push(column)
        .push(" * 1000 WHEN 'real' THEN CAST(round((")
        .push(column)
        .push(" - 2440587.5) * 86400000.0) AS INTEGER) END");
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

/// [`finish`] of `count` rows by id: `.. WHERE id IN (..)`.
pub(super) fn finish_ids(w: &mut SqlWriter, n: &Names, count: u16) {
    finish(w, n);
    w.push(" WHERE ");
    ids(w, n, count);
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
