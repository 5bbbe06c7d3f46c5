//! The statements of a runner whose table has a cancel requests' table: the read of the
//! requests for its deliveries in work, a request's removal with its row, the sweep of requests
//! that name no unfinished row, and the insert of a request that a cancellation records and a
//! settlement takes for itself (its `reserve`): both insert the row's id, so the table's primary
//! key makes each wait for the other's commit.

use super::common::as_i64;
use super::{Dialect, Names, Slot, SqlWriter, Stmt};

/// The statements of a runner whose table has a cancel requests' table.
#[derive(Debug)]
pub(crate) struct RequestSql {
    /// The ids among `REQUESTED_IDS` ids in work (`IdAt`) that have a request.
    pub(crate) requested: Stmt,
    /// The removal of row `id`'s request, once its delivery ended (and of a settlement's
    /// reservation, before it commits).
    pub(crate) forget: Stmt,
    /// The insert of row `id`'s request, which changes no row where one is there already: a
    /// settlement's reservation (see `form::requests`).
    pub(crate) reserve: Stmt,
    /// PostgreSQL, SQLite: the removal of up to [`SWEPT`] requests that name no unfinished row
    /// (left by a runner that died between a row's removal and its request's). MySQL/MariaDB:
    /// the read of up to [`SWEPT`] of their ids, which `sweep_ids` removes.
    pub(crate) sweep: Stmt,
    /// MySQL/MariaDB: the removal of the requests of `REQUESTED_IDS` ids (`IdAt`). A `DELETE`
    /// reading the job table in a subquery would lock the rows it reads there (also at READ
    /// COMMITTED), and wait for a row lock claim's; a plain `SELECT` locks nothing.
    pub(crate) sweep_ids: Option<Stmt>,
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
    w.push(" FROM ").push(requests).push(" WHERE ");
    ids_in(&mut w);
    let requested = w.finish();
    let forget = forget(n, requests);
    let sweep_ids = (n.dialect == Dialect::MySql).then(|| {
        let mut w = n.writer();
        w.push("DELETE FROM ").push(requests).push(" WHERE ");
        ids_in(&mut w);
        w.finish()
    });
    Some(RequestSql {
        requested,
        forget,
        reserve: request(n, requests),
        sweep: sweep(n, requests),
        sweep_ids,
    })
}

/// The insert of row `id`'s request into `requests`, which changes no row where the request is
/// there already (it waits for the commit of one that another transaction inserted).
pub(super) fn request(n: &Names, requests: &str) -> Stmt {
    let mut w = n.writer();
    w.push(match n.dialect {
        Dialect::MySql => "INSERT IGNORE INTO ",
        Dialect::Sqlite => "INSERT OR IGNORE INTO ",
        Dialect::Postgres => "INSERT INTO ",
    })
    .push(requests)
    .push(" (id) VALUES (")
    .param(Slot::Id)
    .push(")");
    if n.dialect == Dialect::Postgres {
        w.push(" ON CONFLICT DO NOTHING");
    }
    w.finish()
}

/// The removal of row `id`'s request from `requests`.
pub(super) fn forget(n: &Names, requests: &str) -> Stmt {
    let mut w = n.writer();
    w.push("DELETE FROM ")
        .push(requests)
        .push(" WHERE id = ")
        .param(Slot::Id);
    w.finish()
}

/// `id IN (?, .. REQUESTED_IDS times)`.
fn ids_in(w: &mut SqlWriter) {
    w.push("id IN (");
    for i in 0..REQUESTED_IDS {
        if i > 0 {
            w.push(", ");
        }
        w.param(Slot::IdAt(i));
    }
    w.push(")");
}

/// Up to [`SWEPT`] requests whose row is gone or finished, each looked up by the table's
/// primary key: removed in one statement (PostgreSQL, SQLite), or read (MySQL/MariaDB).
fn sweep(n: &Names, requests: &str) -> Stmt {
    let mut w = n.writer();
    match n.dialect {
        Dialect::MySql => {
            w.push("SELECT ");
            as_i64(&mut w, "sqlxq_r.id");
            w.push(" FROM ").push(requests).push(" sqlxq_r WHERE ");
        }
        Dialect::Postgres | Dialect::Sqlite => {
            w.push("DELETE FROM ")
                .push(requests)
                .push(" WHERE id IN (SELECT sqlxq_r.id FROM ")
                .push(requests)
                .push(" sqlxq_r WHERE ");
        }
    }
    w.push("NOT EXISTS (SELECT 1 FROM ")
        .push(&n.table)
        .push(" sqlxq_j WHERE sqlxq_j.")
        .push(&n.id)
        .push(" = sqlxq_r.id");
    if let Some(processed_at) = &n.processed_at {
        w.push(" AND sqlxq_j.").push(processed_at).push(" IS NULL");
    }
    w.push(") LIMIT ").push(&SWEPT.to_string());
    if n.dialect != Dialect::MySql {
        w.push(")");
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
            runner.reserve.text(),
            "INSERT OR IGNORE INTO `jobs_cancels` (id) VALUES (?)"
        );
        assert_eq!(
            runner.sweep.text(),
            "DELETE FROM `jobs_cancels` WHERE id IN (SELECT sqlxq_r.id FROM `jobs_cancels` sqlxq_r WHERE NOT EXISTS (SELECT 1 FROM `jobs` sqlxq_j WHERE sqlxq_j.`id` = sqlxq_r.id) LIMIT 100)"
        );
        let marked = t.processed_at("done");
        let my = requests(&names(Dialect::MySql, &marked)).unwrap();
        assert_eq!(
            my.sweep.text(),
            "SELECT CAST(sqlxq_r.id AS SIGNED) FROM `jobs_cancels` sqlxq_r WHERE NOT EXISTS (SELECT 1 FROM `jobs` sqlxq_j WHERE sqlxq_j.`id` = sqlxq_r.id AND sqlxq_j.`done` IS NULL) LIMIT 100"
        );
        assert!(
            my.sweep_ids
                .unwrap()
                .text()
                .starts_with("DELETE FROM `jobs_cancels` WHERE id IN (?, ?, ")
        );
        assert!(runner.sweep_ids.is_none());
        assert!(requests(&names(Dialect::Sqlite, &Table::new("jobs"))).is_none());
    }
}
