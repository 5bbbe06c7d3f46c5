//! Statements that move a row to its dead letter, count a queue's rows, and bring dead rows back.

use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// Where dead rows go, with quoted names.
#[derive(Debug, Clone)]
pub(crate) enum DeadTarget {
    /// A group of the queue's own table, in its group column `column`: binds
    /// [`Slot::DeadGroup`].
    Group { column: String },
    /// Another table with the queue table's columns (`columns`, quoted, in the table's order).
    Table { table: String, columns: Vec<String> },
}

/// How a row is moved to its dead letter.
#[derive(Debug, Clone)]
pub(crate) enum DeadSql {
    /// One statement: an `UPDATE` of the row's group, or on PostgreSQL
    /// `WITH moved AS (DELETE .. RETURNING ..) INSERT .. SELECT ..`.
    One(Stmt),
    /// A copy into the dead-letter table, then a delete, in one transaction committed only when
    /// the delete removed the row (MySQL/MariaDB, SQLite).
    CopyDelete { copy: Stmt, delete: Stmt },
}

impl DeadSql {
    pub(crate) fn statements(&self) -> Vec<&Stmt> {
        match self {
            DeadSql::One(stmt) => vec![stmt],
            DeadSql::CopyDelete { copy, delete } => vec![copy, delete],
        }
    }
}

/// `WHERE id = ? [AND lease = ?]`: the lease form's statements carry the token.
fn by_id(w: &mut SqlWriter, n: &Names, guarded: bool) {
    w.push(" WHERE ").push(&n.id).push(" = ").param(Slot::Id);
    if let (true, Some(lease)) = (guarded, &n.lease) {
        w.push(" AND ").push(lease).push(" = ").param(Slot::Token);
    }
}

/// The columns to copy, with the lease column cleared in the copy.
fn copied(w: &mut SqlWriter, n: &Names, columns: &[String], from: Option<&str>) {
    for (i, column) in columns.iter().enumerate() {
        if i > 0 {
            w.push(", ");
        }
        if n.lease.as_deref() == Some(column.as_str()) {
            w.push("NULL");
        } else {
            if let Some(from) = from {
                w.push(from).push(".");
            }
            w.push(column);
        }
    }
}

fn column_list(w: &mut SqlWriter, columns: &[String]) {
    w.push(" (").push(&columns.join(", ")).push(")");
}

/// Moves row `id` to `target`; `guarded` adds the lease token to every `WHERE`.
pub(crate) fn dead_letter(n: &Names, target: &DeadTarget, guarded: bool) -> DeadSql {
    match target {
        DeadTarget::Group { column: group } => {
            let mut w = n.writer();
            w.push("UPDATE ")
                .push(&n.table)
                .push(" SET ")
                .push(group)
                .push(" = ")
                .param(Slot::DeadGroup);
            if let Some(lease) = &n.lease {
                w.push(", ").push(lease).push(" = NULL");
            }
            by_id(&mut w, n, guarded);
            DeadSql::One(w.finish())
        }
        DeadTarget::Table { table, columns } if n.dialect == Dialect::Postgres => {
            let mut w = n.writer();
            w.push("WITH moved AS (DELETE FROM ").push(&n.table);
            by_id(&mut w, n, guarded);
            w.push(" RETURNING ")
                .push(&columns.join(", "))
                .push(") INSERT INTO ")
                .push(table);
            column_list(&mut w, columns);
            w.push(" SELECT ");
            copied(&mut w, n, columns, Some("moved"));
            w.push(" FROM moved");
            DeadSql::One(w.finish())
        }
        DeadTarget::Table { table, columns } => {
            let mut w = n.writer();
            w.push("INSERT INTO ").push(table);
            column_list(&mut w, columns);
            w.push(" SELECT ");
            copied(&mut w, n, columns, None);
            w.push(" FROM ").push(&n.table);
            by_id(&mut w, n, guarded);
            let copy = w.finish();
            let mut w = n.writer();
            w.push("DELETE FROM ").push(&n.table);
            by_id(&mut w, n, guarded);
            DeadSql::CopyDelete {
                copy,
                delete: w.finish(),
            }
        }
    }
}

/// The statements that count a queue's rows (its dead rows come back by [`requeue`]).
#[derive(Debug, Clone)]
pub(crate) struct InspectSql {
    /// Rows claimable now, and the oldest one's creation time where the table has the column
    /// ([`ready`](super::upkeep::ready)).
    pub(crate) ready: Stmt,
    /// Rows waiting for their `retry_after` (absent without the column).
    pub(crate) delayed: Option<Stmt>,
    /// Rows whose lease is live (absent without a lease column).
    pub(crate) in_work: Option<Stmt>,
    /// Rows in the dead letter (absent without one).
    pub(crate) dead: Option<Stmt>,
}

fn count(n: &Names, table: &str, conditions: impl FnOnce(&mut SqlWriter)) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT COUNT(*) FROM ").push(table).push(" WHERE ");
    conditions(&mut w);
    w.finish()
}

fn not_processed(w: &mut SqlWriter, n: &Names) {
    if let (Some(group), true) = (&n.group, n.one_group) {
        w.push(group).push(" = ").param(Slot::Group).push(" AND ");
    }
    match &n.processed_at {
        Some(processed_at) => w.push(processed_at).push(" IS NULL"),
        None => w.push("1 = 1"),
    };
}

pub(crate) fn inspect(n: &Names, target: Option<&DeadTarget>) -> InspectSql {
    let ready = super::ready(n);
    let delayed = n.retry_after.as_deref().map(|retry_after| {
        count(n, &n.table, |w| {
            not_processed(w, n);
            w.push(" AND ")
                .push(retry_after)
                .push(" > ")
                .param(Slot::Now);
        })
    });
    let in_work = n.lease.as_deref().map(|lease| {
        count(n, &n.table, |w| {
            not_processed(w, n);
            w.push(" AND ").push(lease).push(" >= ").param(Slot::Now);
        })
    });
    let dead = target.map(|target| match target {
        DeadTarget::Group { column: group } => count(n, &n.table, |w| {
            w.push(group).push(" = ").param(Slot::DeadGroup);
        }),
        DeadTarget::Table { table, .. } => count(n, table, |w| match (&n.group, n.one_group) {
            (Some(group), true) => {
                w.push(group).push(" = ").param(Slot::Group);
            }
            _ => {
                w.push("1 = 1");
            }
        }),
    });
    InspectSql {
        ready,
        delayed,
        in_work,
        dead,
    }
}

/// `attempt = 1, retry_after = NULL, lease = NULL`, or those columns' values in a copy.
fn reset(n: &Names, column: &str) -> Option<&'static str> {
    let is = |role: &Option<String>| role.as_deref() == Some(column);
    if is(&n.attempt) {
        Some("1")
    } else if is(&n.retry_after) || is(&n.lease) {
        Some("NULL")
    } else {
        None
    }
}

/// Moves every dead row of the queue back to it from `target`, attempt reset.
pub(crate) fn requeue(n: &Names, target: &DeadTarget) -> DeadSql {
    match target {
        DeadTarget::Group { column: group } => {
            let mut w = n.writer();
            w.push("UPDATE ")
                .push(&n.table)
                .push(" SET ")
                .push(group)
                .push(" = ")
                .param(Slot::Group);
            for column in [&n.attempt, &n.retry_after, &n.lease].into_iter().flatten() {
                if let Some(value) = reset(n, column) {
                    w.push(", ").push(column).push(" = ").push(value);
                }
            }
            w.push(" WHERE ")
                .push(group)
                .push(" = ")
                .param(Slot::DeadGroup);
            DeadSql::One(w.finish())
        }
        DeadTarget::Table { table, columns } => {
            let select = |w: &mut SqlWriter, from: Option<&str>| {
                for (i, column) in columns.iter().enumerate() {
                    if i > 0 {
                        w.push(", ");
                    }
                    match (reset(n, column), from) {
                        (Some(value), _) => w.push(value),
                        (None, Some(from)) => w.push(from).push(".").push(column),
                        (None, None) => w.push(column),
                    };
                }
            };
            let of_group = |w: &mut SqlWriter| {
                if let (Some(group), true) = (&n.group, n.one_group) {
                    w.push(" WHERE ").push(group).push(" = ").param(Slot::Group);
                }
            };
            if n.dialect == Dialect::Postgres {
                let mut w = n.writer();
                w.push("WITH moved AS (DELETE FROM ").push(table);
                of_group(&mut w);
                w.push(" RETURNING ")
                    .push(&columns.join(", "))
                    .push(") INSERT INTO ")
                    .push(&n.table);
                column_list(&mut w, columns);
                w.push(" SELECT ");
                select(&mut w, Some("moved"));
                w.push(" FROM moved");
                return DeadSql::One(w.finish());
            }
            let mut w = n.writer();
            w.push("INSERT INTO ").push(&n.table);
            column_list(&mut w, columns);
            w.push(" SELECT ");
            select(&mut w, None);
            w.push(" FROM ").push(table);
            of_group(&mut w);
            let copy = w.finish();
            // Deletes exactly the rows copied: their ids are in the queue table now.
            let mut w = n.writer();
            w.push("DELETE FROM ").push(table).push(" WHERE ");
            if let (Some(group), true) = (&n.group, n.one_group) {
                w.push(group).push(" = ").param(Slot::Group).push(" AND ");
            }
            w.push(&n.id)
                .push(" IN (SELECT ")
                .push(&n.id)
                .push(" FROM ")
                .push(&n.table)
                .push(")");
            DeadSql::CopyDelete {
                copy,
                delete: w.finish(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Dialect, Names};
    use super::*;
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table) -> Names {
        Names::for_test(dialect, table, Some("mail"), "lease", true)
    }

    fn dead_group(n: &Names) -> DeadTarget {
        DeadTarget::Group {
            column: n.group.clone().unwrap(),
        }
    }

    fn dead_table(dialect: Dialect) -> DeadTarget {
        let q = |c: &str| dialect.quote(c).unwrap();
        DeadTarget::Table {
            table: q("jobs_dead"),
            columns: vec![q("id"), q("payload"), q("attempt"), q("locked_until")],
        }
    }

    #[test]
    fn a_group_dead_letter_is_one_guarded_update() {
        let n = names(Dialect::Postgres, Table::new("jobs").group("queue"));
        let DeadSql::One(stmt) = dead_letter(&n, &dead_group(&n), true) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"UPDATE "jobs" SET "queue" = $1, "locked_until" = NULL WHERE "id" = $2 AND "locked_until" = $3"#
        );
    }

    #[test]
    fn postgres_moves_to_a_table_in_one_statement_with_the_lease_cleared() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let DeadSql::One(stmt) = dead_letter(&n, &dead_table(Dialect::Postgres), true) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"WITH moved AS (DELETE FROM "jobs" WHERE "id" = $1 AND "locked_until" = $2 RETURNING "id", "payload", "attempt", "locked_until") INSERT INTO "jobs_dead" ("id", "payload", "attempt", "locked_until") SELECT moved."id", moved."payload", moved."attempt", NULL FROM moved"#
        );
    }

    #[test]
    fn mysql_copies_then_deletes() {
        let n = names(Dialect::MySql, Table::new("jobs"));
        let DeadSql::CopyDelete { copy, delete } =
            dead_letter(&n, &dead_table(Dialect::MySql), false)
        else {
            panic!("two statements");
        };
        assert_eq!(
            copy.text(),
            "INSERT INTO `jobs_dead` (`id`, `payload`, `attempt`, `locked_until`) \
             SELECT `id`, `payload`, `attempt`, NULL FROM `jobs` WHERE `id` = ?"
        );
        assert_eq!(delete.text(), "DELETE FROM `jobs` WHERE `id` = ?");
    }

    #[test]
    fn requeue_resets_the_attempt_in_one_statement() {
        let n = names(Dialect::Sqlite, Table::new("jobs").group("queue"));
        let DeadSql::One(stmt) = requeue(&n, &dead_group(&n)) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            "UPDATE `jobs` SET `queue` = ?, `attempt` = 1, `locked_until` = NULL \
             WHERE `queue` = ?"
        );
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let DeadSql::One(stmt) = requeue(&n, &dead_table(Dialect::Postgres)) else {
            panic!("one statement");
        };
        assert!(
            stmt.text()
                .ends_with(r#"SELECT moved."id", moved."payload", 1, NULL FROM moved"#),
            "{}",
            stmt.text()
        );
    }
}
