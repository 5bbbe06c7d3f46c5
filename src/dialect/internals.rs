//! Not part of the API: the statements a queue claims with and reads its depth with, for the
//! crate's own tests that read their plans (`EXPLAIN`) on a real server. Behind the `internals` feature; may change in any
//! release.

use super::{Claim, Names, Slot, Stmt};
use crate::config::{DEFAULT_LEASE, FormKind, QueueConfig};
use crate::error::Result;
use crate::table::{Dialect, Table};

/// A database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    MySql,
    /// SQLite.
    Sqlite,
}

/// What a claim statement's placeholder takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The queue's group.
    Group,
    /// How many rows the claim takes.
    Limit,
    /// A time: now, or the new lease token.
    Time,
    /// The smallest id the claim looks at (`i64::MIN`: every id).
    Floor,
    /// Anything else (an id the claim passes over).
    Other,
}

/// A statement: its text and its placeholders, in order.
#[derive(Debug, Clone)]
pub struct Statement {
    /// The statement's text.
    pub sql: String,
    /// What each placeholder takes.
    pub params: Vec<Param>,
}

/// The statement a lease queue on `table`, serving group `named`, with the attempt column
/// `attempt`, claims its rows with on `database` (MySQL/MariaDB: its locking `SELECT`).
///
/// # Errors
///
/// A name that cannot be quoted.
pub fn lease_claim(
    database: Database,
    table: &Table,
    named: Option<&str>,
    attempt: Option<&str>,
) -> Result<Statement> {
    let (dialect, names) = lease_queue(database, table, named, attempt)?;
    let stmt = match super::lease(&names, &dialect.quote(LEASE)?, 8).claim {
        Claim::Returning(stmt) => stmt,
        Claim::SelectThenUpdate { select, .. } => select,
    };
    Ok(statement(&stmt))
}

/// The statement that reads the depth of a lease queue on `table` serving group `named` (its
/// ready rows, and the oldest one's creation time where `table` has the column), as
/// `Runner::queue_gauges` and `Queue::counts` read it on `database`.
///
/// # Errors
///
/// A name that cannot be quoted.
pub fn queue_depth(database: Database, table: &Table, named: Option<&str>) -> Result<Statement> {
    let (_, names) = lease_queue(database, table, named, None)?;
    Ok(statement(&super::ready(&names)))
}

/// The lease column of the queues these statements are rendered for.
const LEASE: &str = "locked_until";

/// The names of a lease queue on `table`, on the lease column `locked_until`.
fn lease_queue(
    database: Database,
    table: &Table,
    named: Option<&str>,
    attempt: Option<&str>,
) -> Result<(Dialect, Names)> {
    let dialect = match database {
        Database::Postgres => Dialect::Postgres,
        Database::MySql => Dialect::MySql,
        Database::Sqlite => Dialect::Sqlite,
    };
    let form = FormKind::Lease {
        column: LEASE.to_owned(),
        duration: DEFAULT_LEASE,
    };
    let mut config = QueueConfig::new(table.clone(), form);
    config.name = named.map(str::to_owned);
    config.attempt = attempt.map(str::to_owned);
    Ok((dialect, Names::of_queue(dialect, &config)?))
}

fn statement(stmt: &Stmt) -> Statement {
    let params = stmt
        .slots
        .iter()
        .map(|slot| match slot {
            Slot::Group => Param::Group,
            Slot::Limit => Param::Limit,
            Slot::Floor => Param::Floor,
            Slot::Now | Slot::NewToken | Slot::At | Slot::Token => Param::Time,
            _ => Param::Other,
        })
        .collect();
    Statement {
        sql: stmt.text().to_owned(),
        params,
    }
}
