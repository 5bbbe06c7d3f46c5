//! The statements of a runner whose table has a cancel requests' table: the read of the
//! requests for its deliveries in work, a request's removal with its row, and the sweep of
//! requests that name no unfinished row.

use super::common::as_i64;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// The statements of a runner whose table has a cancel requests' table.
#[derive(Debug)]
pub(crate) struct RequestSql {
    /// The ids among `REQUESTED_IDS` ids in work (`IdAt`) that have a request.
    pub(crate) requested: Stmt,
    /// The removal of row `id`'s request, once its delivery ended.
    pub(crate) forget: Stmt,
    /// The removal of up to [`SWEPT`] requests that name no unfinished row (left by a runner
    /// that died between a row's removal and its request's).
    pub(crate) sweep: Stmt,
}

/// How many requests naming no row one sweep removes, at most.
pub(crate) const SWEPT: u64 = 100;

/// How many ids one read of requests asks about (a shorter list repeats its last id).
pub(crate) const REQUESTED_IDS: u16 = 16;

/// Renders a runner's statements of cancel requests, where the table has their table.
pub(crate) fn requests(n: &Names) -> Option<RequestSql> {
    let requests = n.cancel_requests.as_ref()?;
    let mut w = n.writer();
    w.push("SELECT ");
    as_i64(&mut w, "id");
    w.push(" FROM ").push(requests).push(" WHERE id IN (");
    for i in 0..REQUESTED_IDS {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::IdAt(i));
    }
    w.push(")");
    let requested = w.finish();
    let mut w = n.writer();
    w.push("DELETE FROM ")
        .push(requests)
        .push(" WHERE id = ")
        .param(Slot::Id);
    let forget = w.finish();
    Some(RequestSql {
        requested,
        forget,
        sweep: sweep(n, requests),
    })
}

/// `DELETE` of up to [`SWEPT`] requests whose row is gone or finished: one statement, each
/// request looked up by the table's primary key. MySQL/MariaDB, which cannot read the table it
/// deletes from in a subquery, limits the `DELETE` itself (SQLite's needs a compile option).
fn sweep(n: &Names, requests: &str) -> Stmt {
    let mut w = n.writer();
    let no_row = |w: &mut SqlWriter, request: &str| {
        w.push("NOT EXISTS (SELECT 1 FROM ")
            .push(&n.table)
            .push(" t WHERE t.")
            .push(&n.id)
            .push(" = ")
            .push(request)
            .push(".id");
        if let Some(processed_at) = &n.processed_at {
            w.push(" AND t.").push(processed_at).push(" IS NULL");
        }
        w.push(")");
    };
    w.push("DELETE FROM ").push(requests).push(" WHERE ");
    match n.dialect {
        Dialect::MySql => {
            no_row(&mut w, requests);
            w.push(" LIMIT ").push(&SWEPT.to_string());
        }
        Dialect::Postgres | Dialect::Sqlite => {
            w.push("id IN (SELECT r.id FROM ")
                .push(requests)
                .push(" r WHERE ");
            no_row(&mut w, "r");
            w.push(" LIMIT ").push(&SWEPT.to_string()).push(")");
        }
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    #[test]
    fn a_runner_reads_forgets_and_sweeps_requests() {
        let t = Table::new("jobs").cancel_requests("jobs_cancels");
        let names = |dialect, table: &Table| Names::of_table(dialect, table).unwrap();
        let runner = requests(&names(Dialect::Sqlite, &t)).unwrap();
        assert!(
            runner
                .requested
                .text()
                .starts_with("SELECT id FROM `jobs_cancels` WHERE id IN (?, ?, ")
        );
        assert_eq!(
            runner.forget.text(),
            "DELETE FROM `jobs_cancels` WHERE id = ?"
        );
        assert_eq!(
            runner.sweep.text(),
            "DELETE FROM `jobs_cancels` WHERE id IN (SELECT r.id FROM `jobs_cancels` r WHERE NOT EXISTS (SELECT 1 FROM `jobs` t WHERE t.`id` = r.id) LIMIT 100)"
        );
        let marked = t.processed_at("done");
        let my = requests(&names(Dialect::MySql, &marked)).unwrap();
        assert_eq!(
            my.sweep.text(),
            "DELETE FROM `jobs_cancels` WHERE NOT EXISTS (SELECT 1 FROM `jobs` t WHERE t.`id` = `jobs_cancels`.id AND t.`done` IS NULL) LIMIT 100"
        );
        assert!(requests(&names(Dialect::Sqlite, &Table::new("jobs"))).is_none());
    }
}
