//! Statement text, one file per database.
//!
//! Nothing here talks to a database: each function renders text from validated, quoted names, so
//! the statements are tested as text (below and in each dialect's file) and run against the real
//! servers in `tests/`. Every statement is rendered once, when a queue starts.

mod cancel;
mod common;
mod custom;
mod dead;
mod enqueue;
mod groups;
mod held;
#[cfg(feature = "internals")]
pub mod internals;
mod lease;
mod mysql;
mod names;
mod postgres;
pub(crate) mod rate;
mod requests;
mod schedule;
pub(crate) mod schema;
mod sqlite;
mod stmt;
mod types;
mod unique;
mod upkeep;

use crate::config::{Isolation, SqliteMode};
use crate::error::Result;
pub(crate) use crate::table::Dialect;
use crate::table::{Value, table_parts};

pub(crate) use cancel::{CANCEL_NOTICE, CancelSql, KeysAt, cancel};
pub(crate) use common::MAX_EXCLUDED;
pub(crate) use custom::custom;
pub(crate) use dead::{DeadSql, DeadTarget, dead_letter, inspect, requeue};
pub(crate) use enqueue::EnqueueSql;
pub(crate) use held::{AdvisorySql, RowLockSql, advisory, row_lock};
pub(crate) use lease::{FinishMany, LeaseSql, MAX_FINISH};
pub(crate) use mysql::finish_unlock_named;
pub(crate) use names::Names;
pub(crate) use requests::{REQUESTED_IDS, RequestSql, SWEPT, requests as cancel_requests};
pub(crate) use schedule::{TickSql, ticks};
pub(crate) use stmt::{Args, BySize, Slot, SqlWriter, Stmt};
pub(crate) use types::{Kind, attempt_max, holds};
pub(crate) use unique::Change;
pub(crate) use upkeep::{PruneSql, Pruned, prune, ready};

/// The statements of unique jobs.
pub(crate) mod unique_sql {
    pub(crate) use super::unique::{holders, insert, key_locks, lock, update};
}

/// The 32-bit FNV-1a hash: stable across processes, versions and platforms. The high half of a
/// PostgreSQL advisory key is this hash of the table's identity (the advisory form's and a
/// cancellation's test of a row's key).
pub(crate) fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// The 64-bit FNV-1a hash: the table part of a SQLite advisory key, held in the process (the
/// advisory form's and a cancellation's), is this hash of the table's identity.
pub(crate) fn fnv1a_64(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash: u64, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What a table's advisory keys are made of, from the row its [`identity`] query read:
/// PostgreSQL its resolved name (`table` in `public`, else `schema.table`); MySQL/MariaDB
/// `database.table`; SQLite the database's file and the table's name, case folded. The advisory
/// form and a cancellation make their keys of it alike.
pub(crate) fn identity_key(dialect: Dialect, [first, second, third, _]: &[String; 4]) -> String {
    match dialect {
        Dialect::Postgres => first.clone(),
        Dialect::MySql => format!("{first}.{second}"),
        Dialect::Sqlite => format!("{third}\u{0}{}", second.to_lowercase()),
    }
}

/// What opens a transaction that writes: SQLite's `BEGIN IMMEDIATE` takes the write lock at once,
/// so a read at its start cannot be outdated by another writer before its write.
pub(crate) fn begin_write(dialect: Dialect) -> Option<&'static str> {
    (dialect == Dialect::Sqlite).then_some("BEGIN IMMEDIATE")
}

/// What opens a transaction of the crate's own for a unique enqueue or a cancellation on a
/// caller's connection: SQLite's takes the write lock at once (`begin_write`); elsewhere it runs
/// at READ COMMITTED whatever the server's default (MariaDB's is REPEATABLE READ, whose snapshot
/// would hide a key's row committed while the transaction waited for its lock).
pub(crate) fn begin_own(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Sqlite => "BEGIN IMMEDIATE",
        Dialect::MySql => "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION",
        Dialect::Postgres => "BEGIN ISOLATION LEVEL READ COMMITTED",
    }
}

/// What begins a delivery's transaction: at `isolation` (PostgreSQL, MySQL/MariaDB; read
/// committed unless told), or in `mode` (SQLite; deferred unless told).
///
/// `check_connection` (PostgreSQL 14 and later): the transaction also sets
/// `client_connection_check_interval`, so a statement of the handler's still running when the
/// runner closes the delivery's connection (a delivery cancelled at shutdown) ends within 250 ms,
/// and its transaction with it, instead of running on to its end.
pub(crate) fn begin_delivery(
    dialect: Dialect,
    isolation: Option<Isolation>,
    mode: Option<SqliteMode>,
    check_connection: bool,
) -> Option<&'static str> {
    macro_rules! postgres {
        ($level:literal) => {
            if check_connection {
                concat!(
                    "BEGIN ISOLATION LEVEL ",
                    $level,
                    "; SET LOCAL client_connection_check_interval = 250"
                )
            } else {
                concat!("BEGIN ISOLATION LEVEL ", $level)
            }
        };
    }
    match (dialect, isolation, mode) {
        (Dialect::Postgres, Some(Isolation::RepeatableRead), _) => {
            Some(postgres!("REPEATABLE READ"))
        }
        (Dialect::Postgres, Some(Isolation::Serializable), _) => Some(postgres!("SERIALIZABLE")),
        (Dialect::Postgres, _, _) => Some(postgres!("READ COMMITTED")),
        (Dialect::MySql, Some(Isolation::RepeatableRead), _) => {
            Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION")
        }
        (Dialect::MySql, Some(Isolation::Serializable), _) => {
            Some("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION")
        }
        (Dialect::MySql, _, _) => Some(mysql::BEGIN_READ_COMMITTED),
        (Dialect::Sqlite, _, Some(SqliteMode::Immediate)) => Some("BEGIN IMMEDIATE"),
        (Dialect::Sqlite, _, Some(SqliteMode::Exclusive)) => Some("BEGIN EXCLUSIVE"),
        (Dialect::Sqlite, _, _) => None,
    }
}

/// Renders the lease form's statements for `names`, on the (quoted) lease column `lease`.
pub(crate) fn lease(names: &Names, lease: &str, max_claim: usize) -> LeaseSql {
    let claim = |names: &Names| match names.dialect {
        Dialect::Postgres => postgres::lease_claim(names, lease),
        Dialect::MySql => mysql::lease_claim(names, lease, max_claim),
        Dialect::Sqlite => sqlite::lease_claim(names, lease),
    };
    let excluding = names.excluding();
    lease::lease(
        names,
        lease,
        claim(&names.floored()),
        claim(&excluding.floored()),
        common::next(&excluding),
    )
}

/// A row whole, by id: what a row mode handler decodes.
pub(crate) fn row_by_id(n: &Names) -> Stmt {
    let mut w = n.writer();
    w.push("SELECT * FROM ")
        .push(&n.table)
        .push(" WHERE ")
        .push(&n.id)
        .push(" = ")
        .param(Slot::Id);
    w.finish()
}

/// Renders the enqueue statement for `names`.
pub(crate) fn enqueue(names: &Names) -> EnqueueSql {
    enqueue::enqueue(names, names.dialect != Dialect::MySql)
}

/// Renders the `INSERT` of `rows` jobs in one statement.
pub(crate) fn enqueue_many(names: &Names, rows: usize) -> String {
    enqueue::enqueue_many(names, rows)
}

/// The statement that starts a MySQL/MariaDB claim's transaction (at READ COMMITTED, so its
/// locking read takes no gap locks).
pub(crate) fn mysql_begin() -> &'static str {
    mysql::BEGIN_READ_COMMITTED
}

/// SQLite's query for the names of its attached databases, one a line.
pub(crate) fn sqlite_attached() -> &'static str {
    sqlite::ATTACHED
}

/// Why SQLite finds no table `schema.table`: it qualifies tables by attached database, not by
/// schema. `attached` lists the attached databases, where they are known (else `schema` may be
/// attached but lack the table).
pub(crate) fn sqlite_qualified(schema: &str, table: &str, attached: Option<&[&str]>) -> String {
    sqlite::qualified(schema, table, attached)
}

/// A catalog query about one table, and the values it binds.
#[derive(Debug)]
pub(crate) struct CatalogQuery<'a> {
    pub(crate) sql: &'static str,
    pub(crate) values: Vec<Value<'a>>,
}

/// The catalog query that lists `table`'s columns: four text columns — name, type, `YES` when it
/// takes NULL, and how it fills itself (see `postgres::CATALOG`). `quoted` is the table's quoted
/// name.
pub(crate) fn catalog<'a>(
    dialect: Dialect,
    table: &'a str,
    quoted: &'a str,
) -> Result<CatalogQuery<'a>> {
    let (schema, bare) = table_parts(table)?;
    let (sql, values) = match dialect {
        Dialect::Postgres => (postgres::CATALOG, vec![Value::Text(Some(quoted))]),
        Dialect::MySql => (
            mysql::CATALOG,
            vec![Value::Text(schema), Value::Text(Some(bare))],
        ),
        Dialect::Sqlite => (
            sqlite::CATALOG,
            [Value::Text(Some(bare)), Value::Text(schema)].repeat(2),
        ),
    };
    Ok(CatalogQuery { sql, values })
}

/// The catalog query that reads `table`'s identity: four text columns (the last empty) —
/// PostgreSQL its resolved name and its notification channel; MySQL/MariaDB its database and
/// name; SQLite its attached database, name and file. No row when the table does not exist.
pub(crate) fn identity<'a>(
    dialect: Dialect,
    table: &'a str,
    quoted: &'a str,
) -> Result<CatalogQuery<'a>> {
    let (schema, bare) = table_parts(table)?;
    let (sql, values) = match dialect {
        Dialect::Postgres => (postgres::IDENTITY, vec![Value::Text(Some(quoted))]),
        Dialect::MySql => (
            mysql::IDENTITY,
            vec![Value::Text(schema), Value::Text(Some(bare))],
        ),
        Dialect::Sqlite => (
            sqlite::IDENTITY,
            vec![
                Value::Text(Some(bare)),
                Value::Text(schema),
                Value::Text(schema),
            ],
        ),
    };
    Ok(CatalogQuery { sql, values })
}

/// How a claim is made.
#[derive(Debug, Clone)]
pub(crate) enum Claim {
    /// One statement that claims and returns the rows (PostgreSQL, SQLite).
    Returning(Stmt),
    /// A locking `SELECT`, then an `UPDATE` of the selected ids in the same transaction
    /// (MySQL/MariaDB, which have no `UPDATE .. RETURNING`), one per list size.
    SelectThenUpdate { select: Stmt, updates: BySize },
}

impl Claim {
    /// Its statements, to prepare at start.
    pub(crate) fn statements(&self) -> Vec<&Stmt> {
        match self {
            Claim::Returning(stmt) => vec![stmt],
            Claim::SelectThenUpdate { select, updates } => {
                std::iter::once(select).chain(updates.iter()).collect()
            }
        }
    }
}
