//! The group conditions of a claim: FIFO (a group's first due row, and on the lease form none of
//! its rows under a live lease), `per_group(n)` on the lease form (fewer than `n` of its rows in
//! work or due before the row) and on the row lock form (fewer than `n` unfinished rows before
//! it). Each is a condition on the claimed row `t`, written with subqueries on the same table as
//! `h`.

use super::names::Fifo;
use super::{Dialect, Names, Slot, SqlWriter};

/// FIFO within a group: a row is claimable only when it is its group's first due row (by id)
/// and, in the lease form, no other row of its group is in work (under a live lease). A delayed
/// row does not hold back later rows that are due. A limit above 1 counts both kinds of rows
/// instead ([`per_group`]).
///
/// The first due rows are found group by group through the `(group, id)` index — a few index
/// probes per group, whatever the backlog — rather than by testing every row of the backlog for
/// an earlier due row of its group: on a backlog whose groups are all in work, that test ran
/// once per row at every claim (`group_heads`).
pub(super) fn fifo(w: &mut SqlWriter, n: &Names, columns: &Fifo) {
    let group = columns.group.as_str();
    let lease = match (&columns.lease, columns.limit) {
        (Some(lease), 1) => Some(lease.as_str()),
        (Some(lease), _) => {
            per_group(w, n, group, lease, columns.limit);
            return;
        }
        // The row lock form: only the first-due-row half (its guard keeps one in work).
        (None, 1) => None,
        // The row lock form above 1: the rows before the row (`slots`).
        (None, _) => {
            slots(w, n, group, columns.limit);
            return;
        }
    };
    match (lease, n.dialect) {
        // The row lock form on MySQL/MariaDB: its claim is a locking read, which locks what its
        // subqueries read too; a row lock FIFO drain with the groups' first rows looked up ran
        // at a third of this test of each row's rate (`benches/upkeep`, FIFO on MariaDB).
        (None, Dialect::MySql) => no_earlier_due_row(w, n, group),
        _ => group_heads(w, n, group),
    }
    if let Some(lease) = lease {
        w.push(" AND NOT EXISTS (SELECT 1");
        of_its_group(w, n, group);
        w.push(" AND h.").push(&n.id).push(" <> ");
        outer(w, n, &n.id);
        w.push(" AND h.")
            .push(lease)
            .push(" >= ")
            .param(Slot::Now)
            .push(")");
    }
}

/// `id = (the group's first due row)` of a named queue; `id IN (the first due row of each
/// group)` of an unnamed one (PostgreSQL: `id = ANY (ARRAY(..))`), the groups enumerated through the `(group, id)` index: on
/// PostgreSQL and SQLite a recursive skip scan (the next group after the last one, one index
/// probe each), on MySQL/MariaDB a `GROUP BY` of the group, which it reads as a loose index scan
/// (its recursive step reads the whole index for `group > k`).
/// Rows whose group is NULL belong to no group and are never among them.
fn group_heads(w: &mut SqlWriter, n: &Names, group: &str) {
    if n.one_group {
        w.push(&n.id).push(" = (");
        first_due(w, n, group, &|w| {
            w.param(Slot::Group);
        });
        w.push(")");
        return;
    }
    let unprocessed = |w: &mut SqlWriter| {
        if let Some(processed_at) = &n.processed_at {
            w.push(" AND h.").push(processed_at).push(" IS NULL");
        }
    };
    // PostgreSQL: an array the statement computes once (an init plan) and the primary key
    // reads; as `id IN (..)`, a generic plan of a table without statistics yet tested every
    // row of the backlog for a lease in its group first, then joined the heads.
    w.push(&n.id).push(match n.dialect {
        Dialect::Postgres => " = ANY (ARRAY(",
        Dialect::MySql | Dialect::Sqlite => " IN (",
    });
    match n.dialect {
        Dialect::Postgres | Dialect::Sqlite => {
            let next_group = |w: &mut SqlWriter, after: &str| {
                w.push("(SELECT h.")
                    .push(group)
                    .push(" FROM ")
                    .push(&n.table)
                    .push(" AS h WHERE h.")
                    .push(group)
                    .push(after);
                unprocessed(w);
                w.push(" ORDER BY h.").push(group).push(" LIMIT 1)");
            };
            w.push("WITH RECURSIVE sqlxq_g (k) AS (SELECT ");
            next_group(w, " IS NOT NULL");
            w.push(" UNION ALL SELECT ");
            next_group(w, " > sqlxq_g.k");
            w.push(" FROM sqlxq_g WHERE sqlxq_g.k IS NOT NULL) SELECT (");
            first_due(w, n, group, &|w| {
                w.push("sqlxq_g.k");
            });
            w.push(") FROM sqlxq_g");
        }
        // A common table expression, not a derived table: MariaDB 10.11 re-executing the
        // prepared claim loses a derived table's column ("Unknown column 'sqlxq_g.k'").
        Dialect::MySql => {
            w.push("WITH sqlxq_g AS (SELECT h.")
                .push(group)
                .push(" AS k FROM ")
                .push(&n.table)
                .push(" AS h WHERE h.")
                .push(group)
                .push(" IS NOT NULL");
            unprocessed(w);
            w.push(" GROUP BY h.").push(group).push(") SELECT (");
            first_due(w, n, group, &|w| {
                w.push("sqlxq_g.k");
            });
            w.push(") FROM sqlxq_g");
        }
    }
    w.push(if n.dialect == Dialect::Postgres {
        "))"
    } else {
        ")"
    });
}

/// `NOT EXISTS (an earlier due row of the row's group)`.
fn no_earlier_due_row(w: &mut SqlWriter, n: &Names, group: &str) {
    w.push("NOT EXISTS (SELECT 1");
    of_its_group(w, n, group);
    w.push(" AND h.").push(&n.id).push(" < ");
    outer(w, n, &n.id);
    earlier_row_due(w, n);
    w.push(")");
}

/// `SELECT h.id FROM t AS h WHERE h.group = <value> AND <unprocessed> AND <due> ORDER BY h.id
/// LIMIT 1`: the first due row of the group `value` renders.
fn first_due(w: &mut SqlWriter, n: &Names, group: &str, value: &dyn Fn(&mut SqlWriter)) {
    w.push("SELECT h.")
        .push(&n.id)
        .push(" FROM ")
        .push(&n.table)
        .push(" AS h WHERE h.")
        .push(group)
        .push(" = ");
    value(w);
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND h.").push(processed_at).push(" IS NULL");
    }
    earlier_row_due(w, n);
    w.push(" ORDER BY h.").push(&n.id).push(" LIMIT 1");
}

/// ` AND (h.retry_after IS NULL OR h.retry_after <= now)`: the group's row `h` is due (nothing
/// where the table has no `retry_after`).
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
    w.push("(SELECT COUNT(*)");
    of_its_group(w, n, group);
    w.push(" AND h.").push(&n.id).push(" <> ");
    outer(w, n, &n.id);
    w.push(" AND (h.").push(lease).push(" >= ").param(Slot::Now);
    w.push(" OR h.").push(&n.id).push(" < ");
    outer(w, n, &n.id);
    earlier_row_due(w, n);
    w.push(")) < ").push(&limit.to_string());
}

/// At most `limit` rows of a group in work on the row lock form, whose claims cannot see the
/// rows other transactions hold: a row is claimable only when fewer than `limit` unfinished
/// rows of its group come before it (by id), due or not. The rows in work are then always among
/// their group's first `limit` unfinished rows (rows before them only ever finish), so at most
/// `limit` are; a row waiting for its `retry_after` keeps its place among them.
fn slots(w: &mut SqlWriter, n: &Names, group: &str, limit: u32) {
    w.push("(SELECT COUNT(*)");
    of_its_group(w, n, group);
    w.push(" AND h.").push(&n.id).push(" < ");
    outer(w, n, &n.id);
    w.push(") < ").push(&limit.to_string());
}

/// ` FROM t AS h WHERE h.group = t.group[ AND h.processed_at IS NULL]`: the unfinished rows
/// `h` of the claimed row's group.
fn of_its_group(w: &mut SqlWriter, n: &Names, group: &str) {
    w.push(" FROM ")
        .push(&n.table)
        .push(" AS h WHERE h.")
        .push(group)
        .push(" = ");
    outer(w, n, group);
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND h.").push(processed_at).push(" IS NULL");
    }
}

/// `t.column`: a column of the claimed row, from a subquery on the same table.
fn outer(w: &mut SqlWriter, n: &Names, column: &str) {
    w.push(&n.table).push(".").push(column);
}
