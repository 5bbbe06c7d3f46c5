//! Statements of a queue's upkeep: how many of its rows are ready and when the oldest of them was
//! created (counts, the runner's gauges), and the pruning of finished and dead rows in bounded
//! batches.

use super::common::{as_i64, claimable, ids};
use super::{BySize, DeadTarget, Dialect, Names, Slot, SqlWriter, Stmt, mysql};

/// `SELECT COUNT(*)[, MIN(created_at)] FROM t WHERE <claimable>`: the rows claimable now, and the
/// creation time of the oldest of them where the table has the column (NULL when none is ready).
/// It reads what a claim reads, through the claim's index.
pub(crate) fn ready(n: &Names) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT COUNT(*)");
    if let Some(created_at) = &n.created_at {
        w.push(", MIN(").push(created_at).push(")");
    }
    w.push(" FROM ").push(&n.table).push(" WHERE ");
    claimable(&mut w, n);
    w.finish()
}

/// Which rows a prune deletes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pruned<'a> {
    /// Rows finished (`processed_at`) before [`Slot::At`].
    Finished,
    /// Dead rows created (`created_at`) before [`Slot::At`]: rows of the dead-letter group
    /// ([`Slot::DeadGroup`]), or of the dead-letter table (of the queue's group, where it has
    /// one).
    Dead(&'a DeadTarget),
}

/// One batch of a prune.
#[derive(Debug, Clone)]
pub(crate) enum PruneSql {
    /// One statement deletes up to [`Slot::Limit`] rows, passing over rows locked elsewhere
    /// (PostgreSQL), or with the write lock held (SQLite).
    One(Stmt),
    /// In a READ COMMITTED transaction: lock up to [`Slot::Limit`] ids, passing over rows locked
    /// elsewhere, then delete those ids (MySQL/MariaDB, which take no `LIMIT` in an `IN`
    /// subquery), one statement per list size up to the batch.
    SelectThenDelete {
        begin: &'static str,
        select: Stmt,
        delete: BySize,
    },
}

/// A prune's batch of at most `batch` rows, or why the table cannot have one (a column missing).
pub(crate) fn prune(n: &Names, pruned: Pruned<'_>, batch: usize) -> Result<PruneSql, String> {
    let (table, column) = match pruned {
        Pruned::Finished => (&n.table, n.processed_at.as_ref()),
        Pruned::Dead(DeadTarget::Group { .. }) => (&n.table, n.created_at.as_ref()),
        Pruned::Dead(DeadTarget::Table { table, .. }) => (table, n.created_at.as_ref()),
    };
    let Some(column) = column else {
        return Err(match pruned {
            Pruned::Finished => {
                "pruning finished rows needs the table's processed_at column: \
                                 `Table::processed_at(..)`"
            }
            Pruned::Dead(_) => {
                "pruning dead rows needs the table's creation time column, \
                                which dates them: `Table::created_at(..)`"
            }
        }
        .to_owned());
    };
    let condition = |w: &mut SqlWriter| {
        match pruned {
            Pruned::Dead(DeadTarget::Group { column: group }) => {
                w.push(group)
                    .push(" = ")
                    .param(Slot::DeadGroup)
                    .push(" AND ");
            }
            Pruned::Dead(DeadTarget::Table { .. }) => {
                if let (Some(group), true) = (&n.group, n.one_group) {
                    w.push(group).push(" = ").param(Slot::Group).push(" AND ");
                }
            }
            Pruned::Finished => {}
        }
        // SQLite compares text: a default such as CURRENT_TIMESTAMP writes `2025-01-31 12:00:00`,
        // sqlx writes RFC 3339 (`2025-01-31T12:00:00+00:00`); julianday reads both.
        match (n.dialect, pruned) {
            (Dialect::Sqlite, Pruned::Dead(_)) => {
                w.push("julianday(")
                    .push(column)
                    .push(") < julianday(")
                    .param(Slot::At)
                    .push(")");
            }
            _ => {
                w.push(column).push(" < ").param(Slot::At);
            }
        }
    };
    let select = |w: &mut SqlWriter, id: &dyn Fn(&mut SqlWriter)| {
        w.push("SELECT ");
        id(w);
        w.push(" FROM ").push(table).push(" WHERE ");
        condition(w);
        w.limit(Slot::Limit);
        if n.dialect != Dialect::Sqlite {
            w.push(" FOR UPDATE SKIP LOCKED");
        }
    };
    let mut w = n.writer();
    if n.dialect == Dialect::MySql {
        select(&mut w, &|w| as_i64(w, &n.id));
        let delete = BySize::new(batch, |count| {
            let mut w = n.writer();
            w.push("DELETE FROM ").push(table).push(" WHERE ");
            ids(&mut w, n, count);
            w.finish()
        });
        return Ok(PruneSql::SelectThenDelete {
            begin: mysql::BEGIN_READ_COMMITTED,
            select: w.finish(),
            delete,
        });
    }
    w.push("DELETE FROM ")
        .push(table)
        .push(" WHERE ")
        .push(&n.id)
        .push(" IN (");
    select(&mut w, &|w| {
        w.push(&n.id);
    });
    w.push(")");
    Ok(PruneSql::One(w.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    fn names(dialect: Dialect, table: Table) -> Names {
        let mut n = Names::of_table(dialect, &table).unwrap();
        n.one_group = n.group.is_some();
        n
    }

    fn jobs() -> Table {
        Table::new("jobs")
            .group("queue")
            .processed_at("done_at")
            .created_at("created_at")
    }

    #[test]
    fn ready_counts_claimable_rows_and_reads_the_oldest_creation_time() {
        let n = names(Dialect::Postgres, jobs().retry_after("not_before"));
        assert_eq!(
            ready(&n).text(),
            r#"SELECT COUNT(*), MIN("created_at") FROM "jobs" WHERE "queue" = $1 AND "done_at" IS NULL AND ("not_before" IS NULL OR "not_before" <= $2)"#
        );
        let n = names(Dialect::Sqlite, Table::new("jobs"));
        assert_eq!(ready(&n).text(), "SELECT COUNT(*) FROM `jobs` WHERE 1 = 1");
    }

    #[test]
    fn postgres_prunes_a_batch_in_one_statement_passing_over_locked_rows() {
        let n = names(Dialect::Postgres, jobs());
        let Ok(PruneSql::One(stmt)) = prune(&n, Pruned::Finished, 500) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"DELETE FROM "jobs" WHERE "id" IN (SELECT "id" FROM "jobs" WHERE "done_at" < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)"#
        );
        let dead = DeadTarget::Group {
            column: n.group.clone().unwrap(),
        };
        let Ok(PruneSql::One(stmt)) = prune(&n, Pruned::Dead(&dead), 500) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            r#"DELETE FROM "jobs" WHERE "id" IN (SELECT "id" FROM "jobs" WHERE "queue" = $1 AND "created_at" < $2 LIMIT $3 FOR UPDATE SKIP LOCKED)"#
        );
    }

    #[test]
    fn mysql_locks_a_batch_then_deletes_its_ids() {
        let n = names(Dialect::MySql, jobs());
        let dead = DeadTarget::Table {
            table: "`jobs_dead`".to_owned(),
            columns: Vec::new(),
        };
        let Ok(PruneSql::SelectThenDelete { select, delete, .. }) =
            prune(&n, Pruned::Dead(&dead), 100)
        else {
            panic!("two statements");
        };
        assert_eq!(
            select.text(),
            "SELECT CAST(`id` AS SIGNED) FROM `jobs_dead` WHERE `queue` = ? AND `created_at` < ? \
             LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            delete.for_len(3).text(),
            "DELETE FROM `jobs_dead` WHERE `id` IN (?, ?, ?, ?)"
        );
        assert_eq!(delete.iter().count(), 8, "1, 2, 4, .. 128 ids");
    }

    #[test]
    fn sqlite_dates_dead_rows_by_julian_day() {
        let n = names(Dialect::Sqlite, jobs());
        let dead = DeadTarget::Group {
            column: n.group.clone().unwrap(),
        };
        let Ok(PruneSql::One(stmt)) = prune(&n, Pruned::Dead(&dead), 10) else {
            panic!("one statement");
        };
        assert_eq!(
            stmt.text(),
            "DELETE FROM `jobs` WHERE `id` IN (SELECT `id` FROM `jobs` WHERE `queue` = ? AND \
             julianday(`created_at`) < julianday(?) LIMIT CAST(? AS INTEGER))"
        );
    }

    /// With `metrics`, every claim returns the creation time after the attempt (and before a
    /// MySQL/MariaDB session), where the table declares it.
    #[cfg(feature = "metrics")]
    #[test]
    fn claims_read_the_creation_time_after_the_attempt() {
        use super::super::{Claim, advisory, lease, row_lock};
        let table = || Table::new("jobs").created_at("made");
        let n = Names::for_test(Dialect::Postgres, table(), None, "lease", true);
        let Claim::Returning(claim) = lease(&n, n.lease.as_deref().unwrap(), 8).claim else {
            panic!("one statement");
        };
        assert!(
            claim
                .text()
                .ends_with(r#"CAST(q."attempt" AS BIGINT) - 1, q."made""#),
            "{}",
            claim.text()
        );
        let n = Names::for_test(Dialect::Sqlite, table(), None, "lease", false);
        let Claim::Returning(claim) = lease(&n, n.lease.as_deref().unwrap(), 8).claim else {
            panic!("one statement");
        };
        // SQLite reads it as milliseconds since 1970 (`common::created_millis`).
        assert!(
            claim.text().ends_with(
                "RETURNING `id`, `payload`, CASE typeof(`made`) WHEN 'text' THEN CASE \
                            WHEN substr(`made`, 5, 1) = '-' THEN CAST(round((julianday(`made`) - \
                            2440587.5) * 86400000.0) AS INTEGER) END WHEN 'integer' THEN `made` * \
                            1000 WHEN 'real' THEN CAST(round((`made` - 2440587.5) * 86400000.0) AS \
                            INTEGER) END"
            ),
            "{}",
            claim.text()
        );
        let mut n = Names::for_test(Dialect::MySql, table(), None, "row_lock", true);
        n.session = true;
        assert!(row_lock(&n).claim.text().starts_with(
            "SELECT CAST(`id` AS SIGNED), `payload`, CAST(`attempt` AS SIGNED), `made`, \
             CAST(CONNECTION_ID() AS SIGNED) FROM"
        ));
        let n = Names::for_test(Dialect::Postgres, table(), None, "advisory", true);
        let take = advisory(&n).take;
        assert!(
            take.text()
                .ends_with(r#"CAST("attempt" AS BIGINT) - 1, "made""#)
        );
        let n = Names::for_test(Dialect::Postgres, Table::new("jobs"), None, "lease", true);
        let Claim::Returning(claim) = lease(&n, n.lease.as_deref().unwrap(), 8).claim else {
            panic!("one statement");
        };
        assert!(claim.text().ends_with(r#"CAST(q."attempt" AS BIGINT) - 1"#));
    }

    #[test]
    fn a_prune_names_the_column_it_lacks() {
        let n = names(Dialect::Postgres, Table::new("jobs"));
        let finished = prune(&n, Pruned::Finished, 10).unwrap_err();
        assert!(finished.contains("Table::processed_at"), "{finished}");
        let dead = DeadTarget::Table {
            table: "\"d\"".to_owned(),
            columns: Vec::new(),
        };
        let dead = prune(&n, Pruned::Dead(&dead), 10).unwrap_err();
        assert!(dead.contains("Table::created_at"), "{dead}");
    }
}
