//! Not part of the API: what the benchmarks need to run the crate's own statements in a
//! hand-written loop, so the two cannot drift. May change in any release.

use crate::dialect::{self, Claim, Dialect, Names, Slot, Stmt};
use crate::error::Result;
use crate::queue::config::{Form, QueueConfig};
use crate::table::Table;

/// One rendered statement: its role, its text, and what each placeholder takes, in order.
#[derive(Debug, Clone)]
pub struct Statement {
    /// What the statement does (`claim`, `finish`, `update_ids_8`, `lock`, ..).
    pub role: String,
    /// The statement's text.
    pub sql: String,
    /// One name per placeholder: `id`, `id_at_<i>`, `token`, `new_token`, `now`, `at`, `group`,
    /// `limit`, `payload`, `key`, `key_class`, `key_prefix`.
    pub params: Vec<String>,
}

fn statement(role: impl Into<String>, stmt: &Stmt) -> Statement {
    Statement {
        role: role.into(),
        sql: stmt.text().to_owned(),
        params: stmt
            .slots
            .iter()
            .map(|slot| match slot {
                Slot::Id => "id".to_owned(),
                Slot::IdAt(i) => format!("id_at_{i}"),
                Slot::Excluded(i) => format!("excluded_{i}"),
                Slot::Token => "token".to_owned(),
                Slot::TokenAt(i) => format!("token_at_{i}"),
                Slot::NewToken => "new_token".to_owned(),
                Slot::Now => "now".to_owned(),
                Slot::At => "at".to_owned(),
                Slot::Group => "group".to_owned(),
                Slot::Limit => "limit".to_owned(),
                Slot::Payload => "payload".to_owned(),
                Slot::Key => "key".to_owned(),
                Slot::KeyClass => "key_class".to_owned(),
                Slot::KeyPrefix => "key_prefix".to_owned(),
                Slot::DeadGroup => "dead_group".to_owned(),
                Slot::Priority => "priority".to_owned(),
                Slot::NotifyTable => "notify_table".to_owned(),
                Slot::NotifyPayload => "notify_payload".to_owned(),
            })
            .collect(),
    }
}

/// The statements a queue of `form` (`lease`, `row_lock` or `advisory`) on `table` runs on
/// `database` (`postgres`, `mysql` or `sqlite`), with an attempt column `attempt` and, for the
/// lease form, the lease column `locked_until`.
///
/// # Errors
///
/// A name that cannot be quoted.
///
/// # Panics
///
/// An unknown database or form.
pub fn statements(
    database: &str,
    table: &Table,
    form: &str,
    attempt: Option<&str>,
    workers: usize,
) -> Result<Vec<Statement>> {
    statements_of(database, table, None, form, attempt, workers)
}

/// [`statements`] of a queue `named` (the group it serves, on a table with a group column).
///
/// # Errors
///
/// A name that cannot be quoted.
///
/// # Panics
///
/// An unknown database or form.
pub fn statements_of(
    database: &str,
    table: &Table,
    named: Option<&str>,
    form: &str,
    attempt: Option<&str>,
    workers: usize,
) -> Result<Vec<Statement>> {
    let dialect = match database {
        "postgres" => Dialect::Postgres,
        "mysql" => Dialect::MySql,
        "sqlite" => Dialect::Sqlite,
        other => panic!("unknown database {other}"),
    };
    let form = match form {
        "lease" => Form::Lease {
            column: "locked_until".to_owned(),
            duration: crate::DEFAULT_LEASE,
        },
        "row_lock" => Form::RowLock,
        "advisory" => Form::Advisory,
        other => panic!("unknown form {other}"),
    };
    let config = QueueConfig {
        table: table.clone(),
        name: named.map(str::to_owned),
        form,
        attempt: attempt.map(str::to_owned),
        max_attempts: None,
        dead_letter: None,
        transactional: false,
        batch: None,
        workers,
        custom: Vec::new(),
        isolation: None,
        sqlite_mode: None,
        fifo: false,
        listen_notify: false,
    };
    let names = Names::of_queue(dialect, &config)?;
    let mut all = Vec::new();
    match &config.form {
        Form::Lease { .. } => {
            let sql = dialect::lease(&names, workers);
            match &sql.claim {
                Claim::Returning(stmt) => all.push(statement("claim", stmt)),
                Claim::SelectThenUpdate { select, updates } => {
                    all.push(statement("claim", select));
                    for update in updates.iter() {
                        all.push(statement(
                            format!("update_ids_{}", update.slots.len() - 1),
                            update,
                        ));
                    }
                }
            }
            all.push(statement("extend", &sql.extend));
            all.push(statement("release", &sql.release));
            all.push(statement("finish", &sql.finish));
        }
        Form::RowLock => {
            let sql = dialect::row_lock(&names);
            if let Some(begin) = sql.begin {
                all.push(Statement {
                    role: "begin".to_owned(),
                    sql: begin.to_owned(),
                    params: Vec::new(),
                });
            }
            all.push(statement("claim", &sql.claim));
            all.push(statement("finish", &sql.finish));
        }
        Form::Advisory => {
            let sql = dialect::advisory(&names);
            all.push(statement("candidates", &sql.candidates));
            all.extend(sql.lock.as_ref().map(|s| statement("lock", s)));
            all.push(statement("take", &sql.take));
            all.extend(sql.count.as_ref().map(|s| statement("count", s)));
            all.push(statement("finish", &sql.finish));
            all.extend(sql.unlock.as_ref().map(|s| statement("unlock", s)));
        }
    }
    Ok(all)
}

/// The PostgreSQL advisory key class of a bare table name in the `public` schema, and the MySQL
/// lock-name prefix (`<database>.<table>:`), as the advisory form computes them.
pub fn advisory_keys(table: &str, mysql_database: &str) -> (i64, String) {
    let class = i64::from(crate::form::advisory::fnv1a_32(table));
    (class, format!("{mysql_database}.{table}:"))
}
