//! Statement text, one file per database.
//!
//! Nothing here talks to a database: each function renders text from validated, quoted names, so
//! the statements are tested as text (below and in each dialect's file) and run against the real
//! servers in `tests/`. Every statement is rendered once, when a queue starts.

mod common;
mod custom;
mod dead;
mod held;
mod mysql;
mod postgres;
mod sqlite;
mod types;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, SqlStr};

use crate::error::{Error, Result};
use crate::queue::config::{Form, QueueConfig};
use crate::table::{PayloadType, Table, table_parts, validate_ident};

pub(crate) use common::{EnqueueSql, FinishMany, LeaseSql, MAX_EXCLUDED, MAX_FINISH};
pub(crate) use custom::custom;
pub(crate) use dead::{DeadSql, DeadTarget, dead_letter, inspect};
pub(crate) use held::{AdvisorySql, RowLockSql, advisory, row_lock};
pub(crate) use types::{attempt_max, holds, integer_range};

/// The SQL dialect of a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// Validates `ident` and quotes it in this dialect's way.
    pub(crate) fn quote(self, ident: &str) -> Result<String> {
        self.refuse_characters(ident)?;
        validate_ident(ident)?;
        match self {
            Dialect::Postgres if ident.len() > 63 => Err(Error::Identifier {
                name: ident.to_owned(),
                reason: "PostgreSQL identifiers are at most 63 bytes (longer ones would be \
                         silently truncated)",
            }),
            Dialect::MySql if ident.chars().count() > 64 => Err(Error::Identifier {
                name: ident.to_owned(),
                reason: "MySQL/MariaDB identifiers are at most 64 characters",
            }),
            Dialect::Postgres => Ok(format!("\"{ident}\"")),
            Dialect::MySql | Dialect::Sqlite => Ok(format!("`{ident}`")),
        }
    }

    /// Refuses characters this database's identifiers cannot hold (before the checks of every
    /// database, which refuse emoji with a reason of their own).
    fn refuse_characters(self, name: &str) -> Result<()> {
        if self == Dialect::MySql && name.chars().any(|c| c > '\u{FFFF}') {
            return Err(Error::Identifier {
                name: name.to_owned(),
                reason: "MySQL/MariaDB identifiers hold characters of the Basic Multilingual \
                         Plane only (U+0001 to U+FFFF): no emoji, no letters beyond it",
            });
        }
        Ok(())
    }

    /// Validates and quotes a possibly schema-qualified table name.
    pub(crate) fn quote_table(self, name: &str) -> Result<String> {
        self.refuse_characters(name)?;
        match table_parts(name)? {
            (None, table) => self.quote(table),
            (Some(schema), table) => Ok(format!("{}.{}", self.quote(schema)?, self.quote(table)?)),
        }
    }

    /// What opens a transaction that writes: SQLite's `BEGIN IMMEDIATE` takes the write lock at
    /// once, so a read at its start cannot be outdated by another writer before its write.
    pub(crate) fn begin_write(self) -> Option<&'static str> {
        (self == Dialect::Sqlite).then_some("BEGIN IMMEDIATE")
    }

    /// What begins a delivery's transaction: at `isolation` (PostgreSQL, MySQL/MariaDB; read
    /// committed unless told), or in `mode` (SQLite; deferred unless told).
    ///
    /// `check_connection` (PostgreSQL 14 and later): the transaction also sets
    /// `client_connection_check_interval`, so a statement of the handler's still running when the
    /// runner closes the delivery's connection (a delivery cancelled at shutdown) ends within
    /// 250 ms, and its transaction with it, instead of running on to its end.
    pub(crate) fn begin_delivery(
        self,
        isolation: Option<crate::queue::Isolation>,
        mode: Option<crate::queue::SqliteMode>,
        check_connection: bool,
    ) -> Option<&'static str> {
        use crate::queue::{Isolation, SqliteMode};
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
        match (self, isolation, mode) {
            (Dialect::Postgres, Some(Isolation::RepeatableRead), _) => {
                Some(postgres!("REPEATABLE READ"))
            }
            (Dialect::Postgres, Some(Isolation::Serializable), _) => {
                Some(postgres!("SERIALIZABLE"))
            }
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

    /// The product name, for messages.
    pub(crate) fn product(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::MySql => "MySQL/MariaDB",
            Dialect::Sqlite => "SQLite",
        }
    }
}

/// What a statement's placeholders take, in the order they appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// The row's id.
    Id,
    /// The `i`-th id of a list (claims on MySQL/MariaDB update the claimed ids).
    IdAt(u16),
    /// The delivery's current lease token.
    Token,
    /// The `i`-th id a claim passes over (rows held back in this process after a failure of
    /// their own), padded with the first.
    Excluded(u16),
    /// The `i`-th token of a list (acknowledgements of many rows).
    TokenAt(u16),
    /// A new lease token (claim, extension).
    NewToken,
    /// The current time.
    Now,
    /// A later time: `retry_after` of a settlement or an enqueue.
    At,
    /// The queue's group value.
    Group,
    /// How many rows a claim takes.
    Limit,
    /// A job's payload.
    Payload,
    /// A row's advisory key (PostgreSQL).
    Key,
    /// The table's advisory key class, the high half of its keys (PostgreSQL).
    KeyClass,
    /// The table's lock-name prefix (MySQL/MariaDB).
    KeyPrefix,
    /// The dead-letter group.
    DeadGroup,
    /// A job's priority.
    Priority,
    /// The table's quoted name, whose notification channel the statement computes (PostgreSQL).
    NotifyTable,
    /// A notification's payload: the job's group.
    NotifyPayload,
}

/// A rendered statement: its text, shared (cloning it clones an `Arc`), and its placeholders.
#[derive(Debug, Clone)]
pub struct Stmt {
    sql: Arc<str>,
    pub(crate) slots: Box<[Slot]>,
}

impl Stmt {
    pub(crate) fn text(&self) -> &str {
        &self.sql
    }

    pub(crate) fn sql(&self) -> SqlStr {
        AssertSqlSafe(Arc::clone(&self.sql)).into_sql_str()
    }
}

use sqlx::SqlSafeStr as _;

/// The values a statement's slots are bound from.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Args<'a> {
    pub(crate) id: i64,
    pub(crate) ids: &'a [i64],
    pub(crate) excluded: &'a [i64],
    pub(crate) tokens: &'a [DateTime<Utc>],
    pub(crate) token: Option<DateTime<Utc>>,
    pub(crate) new_token: Option<DateTime<Utc>>,
    pub(crate) now: Option<DateTime<Utc>>,
    pub(crate) at: Option<DateTime<Utc>>,
    pub(crate) group: Option<&'a str>,
    pub(crate) limit: i64,
    pub(crate) payload: &'a [u8],
    pub(crate) key: i64,
    pub(crate) key_class: i64,
    pub(crate) key_prefix: Option<&'a str>,
    pub(crate) dead_group: Option<&'a str>,
    pub(crate) priority: i64,
    pub(crate) notify_table: Option<&'a str>,
    pub(crate) notify_payload: Option<&'a str>,
}

/// One bound value, as the database drivers take it.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    I64(i64),
    Bytes(&'a [u8]),
    Text(Option<&'a str>),
    Time(Option<DateTime<Utc>>),
}

impl Value<'_> {
    /// About how many bytes the value takes in a statement sent to the server.
    pub(crate) fn size(&self) -> usize {
        match self {
            Value::I64(_) | Value::Time(_) => 8,
            Value::Bytes(bytes) => bytes.len(),
            Value::Text(text) => text.map_or(0, str::len),
        }
    }
}

impl<'a> Args<'a> {
    pub(crate) fn value(&self, slot: Slot) -> Value<'a> {
        match slot {
            Slot::Id => Value::I64(self.id),
            // A short list is padded with its last id: repeating an id in `IN (..)` is harmless.
            Slot::IdAt(i) => Value::I64(
                self.ids
                    .get(usize::from(i))
                    .or(self.ids.last())
                    .copied()
                    .unwrap_or(self.id),
            ),
            // Padded with the first: repeating an id in `NOT IN (..)` is harmless.
            Slot::Excluded(i) => Value::I64(
                self.excluded
                    .get(usize::from(i))
                    .or(self.excluded.first())
                    .copied()
                    .unwrap_or(i64::MIN),
            ),
            Slot::Token => Value::Time(self.token),
            // Padded as `IdAt` is: the last pair repeated.
            Slot::TokenAt(i) => Value::Time(
                self.tokens
                    .get(usize::from(i))
                    .or(self.tokens.last())
                    .copied(),
            ),
            Slot::NewToken => Value::Time(self.new_token),
            Slot::Now => Value::Time(self.now),
            Slot::At => Value::Time(self.at),
            Slot::Group => Value::Text(self.group),
            Slot::Limit => Value::I64(self.limit),
            Slot::Payload => Value::Bytes(self.payload),
            Slot::Key => Value::I64(self.key),
            Slot::KeyClass => Value::I64(self.key_class),
            Slot::KeyPrefix => Value::Text(self.key_prefix),
            Slot::DeadGroup => Value::Text(self.dead_group),
            Slot::Priority => Value::I64(self.priority),
            Slot::NotifyTable => Value::Text(self.notify_table),
            Slot::NotifyPayload => Value::Text(Some(self.notify_payload.unwrap_or(""))),
        }
    }
}

/// Writes statement text, numbering placeholders in the dialect's way.
#[derive(Debug)]
pub(crate) struct SqlWriter {
    dialect: Dialect,
    sql: String,
    slots: Vec<Slot>,
}

impl SqlWriter {
    pub(crate) fn new(dialect: Dialect) -> Self {
        SqlWriter {
            dialect,
            sql: String::with_capacity(256),
            slots: Vec::new(),
        }
    }

    pub(crate) fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub(crate) fn push(&mut self, text: &str) -> &mut Self {
        self.sql.push_str(text);
        self
    }

    pub(crate) fn param(&mut self, slot: Slot) -> &mut Self {
        self.slots.push(slot);
        match self.dialect {
            Dialect::Postgres => {
                self.sql.push('$');
                self.sql.push_str(&self.slots.len().to_string());
            }
            Dialect::MySql | Dialect::Sqlite => self.sql.push('?'),
        }
        self
    }

    /// Appends another writer's text and placeholders (numbered on from this one's).
    pub(crate) fn append(&mut self, other: SqlWriter) -> &mut Self {
        debug_assert!(self.slots.is_empty() || self.dialect != Dialect::Postgres);
        self.sql.push_str(&other.sql);
        self.slots.extend(other.slots);
        self
    }

    pub(crate) fn finish(self) -> Stmt {
        Stmt {
            sql: self.sql.into(),
            slots: self.slots.into(),
        }
    }
}

/// The quoted names a queue's statements use.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) dialect: Dialect,
    pub(crate) table: String,
    pub(crate) id: String,
    pub(crate) payload: String,
    pub(crate) payload_type: PayloadType,
    pub(crate) group: Option<String>,
    pub(crate) retry_after: Option<String>,
    pub(crate) processed_at: Option<String>,
    pub(crate) lease: Option<String>,
    pub(crate) attempt: Option<String>,
    /// The largest value the attempt column takes: counting an attempt stops there (read from
    /// the catalog at start; `i64::MAX` until then).
    pub(crate) attempt_max: i64,
    pub(crate) priority: Option<String>,
    /// One row in work per group at a time, in order (the lease form).
    pub(crate) fifo: bool,
    /// Whether claims take only the rows of one group value (a named queue), or of every group
    /// (an unnamed FIFO queue).
    pub(crate) one_group: bool,
    /// Whether enqueues send the table's notification (PostgreSQL).
    pub(crate) notify: bool,
    /// Whether claims pass over the ids bound to [`Slot::Excluded`] (the claims' variants for a
    /// queue that holds rows back).
    pub(crate) excluding: bool,
    /// Whether claims that hold a connection also return its server session (MySQL/MariaDB
    /// transactional row lock and advisory queues: a delivery cancelled at shutdown ends it).
    pub(crate) session: bool,
}

impl Names {
    /// The names of a table alone (enqueue).
    pub(crate) fn of_table(dialect: Dialect, table: &Table) -> Result<Self> {
        let opt = |name: &Option<String>| name.as_deref().map(|n| dialect.quote(n)).transpose();
        Ok(Names {
            dialect,
            table: dialect.quote_table(&table.name)?,
            id: dialect.quote(&table.id)?,
            payload: dialect.quote(&table.payload)?,
            payload_type: table.payload_type,
            group: opt(&table.group)?,
            retry_after: opt(&table.retry_after)?,
            processed_at: opt(&table.processed_at)?,
            lease: None,
            attempt: None,
            attempt_max: i64::MAX,
            priority: opt(&table.priority)?,
            fifo: false,
            one_group: table.group.is_some(),
            notify: table.notify,
            excluding: false,
            session: false,
        })
    }

    /// The names of a queue: its table's and its own columns.
    pub(crate) fn of_queue(dialect: Dialect, config: &QueueConfig) -> Result<Self> {
        let mut names = Names::of_table(dialect, &config.table)?;
        if let Form::Lease { column, .. } = &config.form {
            names.lease = Some(dialect.quote(column)?);
        }

        names.fifo = config.fifo;
        names.session = dialect == Dialect::MySql
            && config.transactional
            && !matches!(config.form, Form::Lease { .. });
        names.one_group = names.group.is_some() && config.name.is_some();
        names.attempt = config
            .attempt
            .as_deref()
            .map(|a| dialect.quote(a))
            .transpose()?;
        Ok(names)
    }

    /// These names, for the claims' variants that pass over held-back rows.
    pub(crate) fn excluding(&self) -> Names {
        Names {
            excluding: true,
            ..self.clone()
        }
    }

    pub(crate) fn writer(&self) -> SqlWriter {
        SqlWriter::new(self.dialect)
    }

    /// `attempt = attempt + 1`, stopping at the column's largest value: a row whose attempt
    /// reached it would otherwise make every statement that counts it fail ("out of range"),
    /// and a claim fail for every row it takes with that one.
    pub(crate) fn count_attempt(&self, w: &mut SqlWriter, attempt: &str) {
        w.push(attempt)
            .push(" = CASE WHEN ")
            .push(attempt)
            .push(" < ")
            .push(&self.attempt_max.to_string())
            .push(" THEN ")
            .push(attempt)
            .push(" + 1 ELSE ")
            .push(attempt)
            .push(" END");
    }

    /// Reads the payload column (named with `prefix`, e.g. `q.`) as bytes.
    pub(crate) fn read_payload(&self, w: &mut SqlWriter, prefix: &str) {
        let (before, after) = match (self.payload_type, self.dialect) {
            (PayloadType::Bytes, _) => ("", ""),
            (_, Dialect::Postgres) => ("convert_to(", "::text, 'UTF8')"),
            // The column's own character set, whatever it is, read as UTF-8.
            (_, Dialect::MySql) => ("CAST(CONVERT(", " USING utf8mb4) AS BINARY)"),
            (_, Dialect::Sqlite) => ("CAST(", " AS BLOB)"),
        };
        w.push(before).push(prefix).push(&self.payload).push(after);
    }

    /// The payload's parameter, converted from bytes to the column's type.
    pub(crate) fn payload_param(&self, w: &mut SqlWriter) {
        let (before, after) = match (self.payload_type, self.dialect) {
            (PayloadType::Bytes, _) => ("", ""),
            (PayloadType::Text, Dialect::Postgres) => ("convert_from(", ", 'UTF8')"),
            (PayloadType::Json, Dialect::Postgres) => ("convert_from(", ", 'UTF8')::json"),
            (PayloadType::Jsonb, Dialect::Postgres) => ("convert_from(", ", 'UTF8')::jsonb"),
            (_, Dialect::MySql) => ("CONVERT(", " USING utf8mb4)"),
            (_, Dialect::Sqlite) => ("CAST(", " AS TEXT)"),
        };
        w.push(before).param(Slot::Payload).push(after);
    }
}

/// Renders the lease form's statements for `names`.
pub(crate) fn lease(names: &Names, max_claim: usize) -> LeaseSql {
    let claim = |names: &Names| match names.dialect {
        Dialect::Postgres => postgres::lease_claim(names),
        Dialect::MySql => mysql::lease_claim(names, max_claim),
        Dialect::Sqlite => sqlite::lease_claim(names),
    };
    let excluding = names.excluding();
    common::lease(
        names,
        claim(names),
        claim(&excluding),
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
    common::enqueue(names, names.dialect != Dialect::MySql)
}

/// Renders the `INSERT` of `rows` jobs in one statement.
pub(crate) fn enqueue_many(names: &Names, rows: usize) -> String {
    common::enqueue_many(names, rows)
}

/// The statement that starts a MySQL/MariaDB claim's transaction.
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

/// Renders the catalog query that lists a table's columns and their types.
pub(crate) fn catalog(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => postgres::CATALOG,
        Dialect::MySql => mysql::CATALOG,
        Dialect::Sqlite => sqlite::CATALOG,
    }
}

/// The query that reads a table's identity from the catalog: four text columns (the last empty,
/// the catalog's shape) — PostgreSQL its
/// resolved name and its notification channel (binds the quoted name); MySQL/MariaDB its database
/// and name (binds the schema, NULL for the current database, and the name); SQLite its attached
/// database, name and file (binds the name, then the schema twice, NULL for any). No row when the
/// table does not exist.
pub(crate) fn identity(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => postgres::IDENTITY,
        Dialect::MySql => mysql::IDENTITY,
        Dialect::Sqlite => sqlite::IDENTITY,
    }
}

/// How a claim is made.
#[derive(Debug, Clone)]
pub(crate) enum Claim {
    /// One statement that claims and returns the rows (PostgreSQL, SQLite).
    Returning(Stmt),
    /// A locking `SELECT`, then an `UPDATE` of the selected ids in the same transaction
    /// (MySQL/MariaDB, which have no `UPDATE .. RETURNING`). `updates[k]` takes `2^k` ids.
    SelectThenUpdate { select: Stmt, updates: Box<[Stmt]> },
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

    /// The update statement for `n` ids (the smallest that fits; short lists are padded).
    pub(crate) fn update_for(updates: &[Stmt], n: usize) -> &Stmt {
        let k = n.next_power_of_two().trailing_zeros() as usize;
        &updates[k.min(updates.len() - 1)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_per_dialect() {
        assert_eq!(Dialect::Postgres.quote("jobs").unwrap(), "\"jobs\"");
        assert_eq!(Dialect::MySql.quote("jobs").unwrap(), "`jobs`");
        assert_eq!(Dialect::Sqlite.quote("jobs").unwrap(), "`jobs`");
        assert_eq!(
            Dialect::Postgres.quote_table("app.jobs").unwrap(),
            "\"app\".\"jobs\""
        );
        assert_eq!(
            Dialect::MySql.quote_table("app.jobs").unwrap(),
            "`app`.`jobs`"
        );
    }

    #[test]
    fn postgres_refuses_names_it_would_truncate() {
        let long = "j".repeat(64);
        assert!(matches!(
            Dialect::Postgres.quote(&long),
            Err(Error::Identifier { .. })
        ));
        Dialect::Postgres.quote(&"j".repeat(63)).unwrap();
        assert!(Dialect::MySql.quote(&"j".repeat(65)).is_err());
        Dialect::Sqlite.quote(&long).unwrap();
    }

    #[test]
    fn mysql_refuses_characters_beyond_the_basic_multilingual_plane() {
        for name in ["jobs_\u{20000}", "jobs_\u{1D4B3}", "jobs_\u{1F980}"] {
            let Err(Error::Identifier { reason, .. }) = Dialect::MySql.quote(name) else {
                panic!("{name} quoted");
            };
            assert!(reason.contains("Basic Multilingual Plane"), "{reason}");
        }
        Dialect::MySql.quote("jobs_\u{4E2D}\u{E9}").unwrap();
        Dialect::Postgres.quote("jobs_\u{20000}").unwrap();
        Dialect::Sqlite.quote("jobs_\u{20000}").unwrap();
    }

    #[test]
    fn placeholders_are_numbered_on_postgres_only() {
        let mut w = SqlWriter::new(Dialect::Postgres);
        w.push("a = ")
            .param(Slot::Id)
            .push(" AND b = ")
            .param(Slot::Token);
        assert_eq!(w.finish().text(), "a = $1 AND b = $2");
        let mut w = SqlWriter::new(Dialect::MySql);
        w.push("a = ")
            .param(Slot::Id)
            .push(" AND b = ")
            .param(Slot::Token);
        let stmt = w.finish();
        assert_eq!(stmt.text(), "a = ? AND b = ?");
        assert_eq!(&*stmt.slots, &[Slot::Id, Slot::Token]);
    }

    #[test]
    fn short_id_lists_are_padded() {
        let args = Args {
            ids: &[7, 9],
            ..Args::default()
        };
        assert!(matches!(args.value(Slot::IdAt(0)), Value::I64(7)));
        assert!(matches!(args.value(Slot::IdAt(3)), Value::I64(9)));
    }
}
