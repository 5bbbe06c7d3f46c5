//! What `Runner::start` checks before anything is claimed: the server, the declaration, the
//! table's columns and their types, and every statement, prepared once.

use std::sync::Arc;

use chrono::Utc;
use sqlx::{Pool, SqlStr};

use crate::backend::{Backend, query_values};
use crate::dialect::{self, DeadTarget, Dialect, Names, Stmt, Value};
use crate::error::{Error, Result, SchemaError};
use crate::form::advisory::{AdvisoryForm, Keys, fnv1a_32};
use crate::form::lease::LeaseForm;
use crate::form::row_lock::RowLockForm;
use crate::form::{Clock, Custom, Dead, FormRuntime};
use crate::queue::Isolation;
use crate::queue::config::{Form, QueueConfig};
use crate::table::{DeadLetter, PayloadType, table_parts};

/// What the runner learns of the server at start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// The server has a clock of its own (SQLite shares this host's).
    pub(crate) own_clock: bool,
    /// PostgreSQL 14 or later: a session can notice its client is gone while a statement runs
    /// (`client_connection_check_interval`).
    pub(crate) checks_connection: bool,
}

/// Reads the server's version (refusing servers without `SKIP LOCKED`) and corrects `clock` by
/// the server's.
pub(super) async fn measure_clock<DB: Backend>(pool: &Pool<DB>, clock: &Clock) -> Result<Server> {
    let mut conn = pool.acquire().await?;
    let sent = Utc::now();
    let (version, server_now) = DB::server(&mut conn).await?;
    let received = Utc::now();
    if DB::DIALECT == Dialect::MySql {
        check_mysql_version(&version)?;
    }
    if let Some(now) = server_now {
        clock.measure(sent, received, now);
    }
    let major: u32 = version
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|major| major.parse().ok())
        .unwrap_or(0);
    Ok(Server {
        own_clock: server_now.is_some(),
        checks_connection: DB::DIALECT == Dialect::Postgres && major >= 14,
    })
}

/// MySQL 8.0.1 and MariaDB 10.6 are the first with `SKIP LOCKED`.
fn check_mysql_version(version: &str) -> Result<()> {
    let mariadb = version.to_ascii_lowercase().contains("mariadb");
    let found: Vec<u32> = version
        .split(['.', '-'])
        .take(3)
        .map_while(|part| part.parse().ok())
        .collect();
    let (server, needed): (&str, &[u32]) = if mariadb {
        ("MariaDB", &[10, 6, 0])
    } else {
        ("MySQL", &[8, 0, 1])
    };
    if found.len() == 3 && found.as_slice() < needed {
        return Err(Error::ServerTooOld {
            server: server.to_owned(),
            found: version.to_owned(),
            needed: needed
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join("."),
        });
    }
    Ok(())
}

/// What processes must agree on about a table, read from the catalog: never from the name as a
/// `Table` spells it, which differs between `jobs`, `public.jobs` and a bare name found through
/// PostgreSQL's `search_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// What the advisory keys are made of: PostgreSQL the resolved name (`table` in `public`,
    /// else `schema.table`); MySQL/MariaDB `database.table`; SQLite the database's file and the
    /// table's name, case folded.
    pub(crate) key: String,
    /// The notification channel (PostgreSQL).
    pub(crate) channel: Option<String>,
}

/// Reads the identity of `table` from the catalog, as the session of `conn` resolves its name.
pub(crate) async fn read_identity<DB: Backend>(
    conn: &mut DB::Connection,
    queue: &str,
    table: &str,
) -> Result<Identity> {
    let quoted = DB::DIALECT.quote_table(table)?;
    let (schema, bare) = table_parts(table)?;
    let values = match DB::DIALECT {
        Dialect::Postgres => vec![Value::Text(Some(&quoted))],
        Dialect::MySql => vec![Value::Text(schema), Value::Text(Some(bare))],
        Dialect::Sqlite => vec![
            Value::Text(Some(bare)),
            Value::Text(schema),
            Value::Text(schema),
        ],
    };
    let sql = SqlStr::from_static(dialect::identity(DB::DIALECT));
    let found = DB::fetch_quads(conn, query_values::<DB>(sql, &values)).await?;
    let Some([first, second, third, _]) = found.into_iter().next() else {
        return Err(Error::schema(
            queue,
            table,
            None,
            "the table does not exist",
        ));
    };
    Ok(match DB::DIALECT {
        Dialect::Postgres => Identity {
            key: first,
            channel: Some(second),
        },
        Dialect::MySql => Identity {
            key: format!("{first}.{second}"),
            channel: None,
        },
        Dialect::Sqlite => Identity {
            key: format!("{third}\u{0}{}", second.to_lowercase()),
            channel: None,
        },
    })
}

/// Checks one queue against the database and renders its statements; returns them with the
/// table's identity.
pub(super) async fn prepare<DB: Backend>(
    pool: &Pool<DB>,
    config: &QueueConfig,
    clock: Clock,
    server: Server,
) -> Result<(FormRuntime, Identity)> {
    refuse_unworkable::<DB>(config)?;
    let mut names = Names::of_queue(DB::DIALECT, config)?;
    let mut conn = pool.acquire().await?;
    let columns = check_columns::<DB>(&mut conn, config).await?;
    let identity = read_identity::<DB>(&mut conn, config.label(), &config.table.name).await?;
    names.attempt_max = attempt_max::<DB>(config, &columns)?;
    let dead_target = dead_target::<DB>(&mut conn, config, &columns).await?;
    let guarded = matches!(config.form, Form::Lease { .. });
    let dead = match dead_target {
        Some((target, group)) => {
            let sql = dialect::dead_letter(&names, &target, guarded);
            prepare_all::<DB>(&mut conn, config, &sql.statements()).await?;
            Some(Dead { sql, group })
        }
        None => None,
    };

    let mut custom = Vec::with_capacity(config.custom.len());
    for (event, sql) in &config.custom {
        let stmt = dialect::custom(DB::DIALECT, sql).map_err(|reason| {
            Error::declaration(
                config.label(),
                format!("the custom {event:?} statement: {reason}"),
            )
        })?;
        custom.push((*event, stmt));
    }
    let custom = Custom::new(custom);
    prepare_all::<DB>(&mut conn, config, &custom.statements().collect::<Vec<_>>()).await?;
    let group = config.name.as_deref().map(Arc::<str>::from);
    let with_attempt = config.attempt.is_some();
    let table = Arc::<str>::from(config.table.name.as_str());
    let form = match &config.form {
        Form::Lease { duration, .. } => {
            // One claim takes a row per free worker, or a batch.
            let max_claim = config
                .workers
                .max(config.batch.unwrap_or(1))
                .min(super::claim::MAX_CLAIM);
            let sql = dialect::lease(&names, max_claim);
            prepare_all::<DB>(&mut conn, config, &sql.statements()).await?;
            FormRuntime::Lease(LeaseForm {
                sql,
                max_claim,
                duration: *duration,
                group,
                with_attempt,
                clock,
                queue: config.label().into(),
                table,
                dead,
                custom,
                begin_write: DB::DIALECT.begin_write(),
            })
        }
        Form::RowLock => {
            let mut sql = dialect::row_lock(&names);
            if config.transactional {
                // The handler's transaction is the claim's: it begins at the queue's isolation.
                sql.begin = DB::DIALECT.begin_delivery(
                    config.isolation,
                    config.sqlite_mode,
                    server.checks_connection,
                );
            }
            let mut statements = vec![&sql.claim, &sql.finish];
            statements.extend(sql.retry.iter().chain(&sql.retry_after));
            prepare_all::<DB>(&mut conn, config, &statements).await?;
            FormRuntime::RowLock(RowLockForm {
                sql,
                group,
                with_attempt,
                clock,
                table,
                dead,
                custom,
            })
        }
        Form::Advisory => {
            let sql = dialect::advisory(&names);
            let mut statements = vec![&sql.candidates, &sql.take, &sql.finish];
            statements.extend(sql.lock.iter().chain(&sql.unlock));
            statements.extend(sql.count.iter().chain(&sql.retry_after));
            prepare_all::<DB>(&mut conn, config, &statements).await?;
            let keys = match DB::DIALECT {
                Dialect::Postgres => Keys::postgres(&identity.key),
                Dialect::MySql => Keys::mysql(&identity.key),
                Dialect::Sqlite => Keys::in_process(&identity.key),
            };
            FormRuntime::Advisory(AdvisoryForm {
                sql,
                keys,
                group,
                with_attempt,
                clock,
                table,
                dead,
                custom,
            })
        }
    };
    Ok((form, identity))
}

/// The largest value the queue's attempt column holds, refusing a `max_attempts` it cannot
/// count to: the lease and advisory forms count an attempt when they take the row, so the column
/// holds up to `max_attempts + 1`; the row lock form counts it when a retry returns the row.
fn attempt_max<DB: Backend>(config: &QueueConfig, columns: &[Column]) -> Result<i64> {
    let Some(column) = config.attempt.as_deref() else {
        return Ok(i64::MAX);
    };
    let Some(Column { ty, .. }) = find_column(DB::DIALECT, columns, column) else {
        return Ok(i64::MAX); // `check_columns` has refused a missing column already.
    };
    let max = dialect::attempt_max(DB::DIALECT, ty);
    let Some(n) = config.max_attempts else {
        return Ok(max);
    };
    let (form, stored, largest) = match config.form {
        Form::RowLock => ("row lock", i64::from(n), max),
        Form::Lease { .. } => ("lease", i64::from(n) + 1, max - 1),
        Form::Advisory => ("advisory lock", i64::from(n) + 1, max - 1),
    };
    if stored > max {
        let counts = if matches!(config.form, Form::RowLock) {
            "max_attempts"
        } else {
            "max_attempts + 1"
        };
        return Err(Error::declaration(
            config.label(),
            format!(
                "the attempt column `{column}` has type `{ty}`, whose largest value is {max}; the \
                 {form} form stores up to {counts} in it, so `max_attempts` can be at most \
                 {largest} on this column, not {n}: lower it, or widen the column"
            ),
        ));
    }
    Ok(max)
}

/// Whether two column names are the same column: PostgreSQL's quoted names are case-sensitive,
/// MySQL's and SQLite's columns are not.
fn same_column(dialect: Dialect, a: &str, b: &str) -> bool {
    match dialect {
        Dialect::Postgres => a == b,
        Dialect::MySql | Dialect::Sqlite => a.eq_ignore_ascii_case(b),
    }
}

/// Checks the dead letter against the database: a group needs a group column; a table must
/// exist, have every column of the queue table and take the rows moved into it
/// ([`dead_table::check`](super::dead_table::check)).
async fn dead_target<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
    columns: &[Column],
) -> Result<Option<(DeadTarget, Option<Arc<str>>)>> {
    let dialect = DB::DIALECT;
    match &config.dead_letter {
        None => Ok(None),
        Some(DeadLetter::Group(group)) => {
            if config.table.group.is_none() {
                return Err(Error::declaration(
                    config.label(),
                    format!(
                        "`DeadLetter::group({group:?})` needs a group column on table `{}`; \
                         declare it with `Table::group(..)`, or dead-letter into a table",
                        config.table.name
                    ),
                ));
            }
            Ok(Some((DeadTarget::Group, Some(Arc::from(group.as_str())))))
        }
        Some(DeadLetter::Table(dead)) => {
            let dead_columns = read_catalog::<DB>(conn, config.label(), dead).await?;
            let missing = |column: Option<&str>, reason: &str| {
                Error::schema(config.label(), dead, column, reason)
            };
            if dead_columns.is_empty() {
                return Err(missing(None, "the dead-letter table does not exist"));
            }
            for column in columns {
                let Some(Column { ty, .. }) = find_column(dialect, &dead_columns, &column.name)
                else {
                    return Err(missing(
                        Some(&column.name),
                        "the dead-letter table lacks a column of the queue table",
                    ));
                };
                // The payload moves as it is: the dead letter's column must hold the same kind.
                let payload = Kind::payload(config.table.payload_type);
                if same_column(dialect, &column.name, &config.table.payload)
                    && !payload.accepts(dialect, ty)
                {
                    return Err(Error::schema(
                        config.label(),
                        dead,
                        Some(&column.name),
                        format!(
                            "the dead-letter table's payload column has type `{ty}`; like the \
                             queue's, on {} it needs {}",
                            dialect.product(),
                            payload.expected(dialect)
                        ),
                    ));
                }
            }
            super::dead_table::check(dialect, columns, &dead_columns).map_err(
                |(column, reason)| Error::schema(config.label(), dead, Some(&column), reason),
            )?;
            let columns = columns
                .iter()
                .map(|column| dialect.quote(&column.name))
                .collect::<Result<_>>()?;
            let table = dialect.quote_table(dead)?;
            Ok(Some((DeadTarget::Table { table, columns }, None)))
        }
    }
}

/// Prepares each statement, so that the server checks it before anything is claimed.
async fn prepare_all<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
    statements: &[&Stmt],
) -> Result<()> {
    for stmt in statements {
        DB::prepare(conn, stmt).await.map_err(|source| {
            Error::Schema(Box::new(SchemaError {
                queue: config.label().to_owned(),
                table: config.table.name.clone(),
                column: None,
                statement: Some(stmt.text().to_owned()),
                reason: "the database refused to prepare a statement".to_owned(),
                source: Some(source),
            }))
        })?;
    }
    Ok(())
}

/// Checks what the mounted queues need together: pooled connections for the forms that hold one
/// per delivery.
pub(super) fn check_together<DB: Backend>(pool: &Pool<DB>, queues: &[&QueueConfig]) -> Result<()> {
    let held: usize = queues
        .iter()
        .filter(|config| config.transactional || !matches!(config.form, Form::Lease { .. }))
        .map(|config| config.workers)
        .sum();
    let max = pool.options().get_max_connections() as usize;
    if held > 0 && held + 1 > max {
        let names: Vec<&str> = queues.iter().map(|config| config.label()).collect();
        return Err(Error::declaration(
            &names.join(", "),
            format!(
                "the row lock and advisory lock forms and transactional queues hold a pooled \
                 connection per delivery in work: these queues need {held} connections for their \
                 workers and one more for claims and settlements, and the pool has at most {max}; \
                 raise the pool's max_connections to {} or lower `workers` (a handler that also \
                 writes through the pool needs one more per worker)",
                held + 1
            ),
        ));
    }
    Ok(())
}

/// Refuses advisory queues on two tables whose PostgreSQL key classes collide (`queues`: each
/// advisory queue's label and table identity).
pub(super) fn check_classes(queues: &[(&str, &Identity)]) -> Result<()> {
    let mut classes: Vec<(u32, &str, &str)> = queues
        .iter()
        .map(|(label, identity)| (fnv1a_32(&identity.key), identity.key.as_str(), *label))
        .collect();
    classes.sort_unstable();
    classes.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
    match classes.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        Some(pair) => Err(Error::declaration(
            pair[1].2,
            format!(
                "the advisory keys of tables `{}` and `{}` share a class; rename one",
                pair[0].1, pair[1].1
            ),
        )),
        None => Ok(()),
    }
}

/// Declarations that type-check but cannot work on this database or table.
fn refuse_unworkable<DB: Backend>(config: &QueueConfig) -> Result<()> {
    let queue = config.label();
    if config.listen_notify && DB::DIALECT != Dialect::Postgres {
        return Err(Error::declaration(
            queue,
            format!(
                "`.listen_notify()` needs PostgreSQL's LISTEN/NOTIFY; {} has none (polling and \
                 in-process wake-ups remain)",
                DB::DIALECT.product()
            ),
        ));
    }
    if config.isolation.is_some() && DB::DIALECT == Dialect::Sqlite {
        return Err(Error::declaration(
            queue,
            "SQLite has no isolation levels: use `.sqlite_mode(..)`",
        ));
    }
    if config.sqlite_mode.is_some() && DB::DIALECT != Dialect::Sqlite {
        return Err(Error::declaration(
            queue,
            "`.sqlite_mode(..)` is for SQLite: use `.isolation(..)`",
        ));
    }
    let above_read_committed = !matches!(config.isolation, None | Some(Isolation::ReadCommitted));
    if DB::DIALECT == Dialect::MySql && matches!(config.form, Form::RowLock) && above_read_committed
    {
        return Err(Error::declaration(
            queue,
            "the row lock form claims with a locking read, which above READ COMMITTED takes gap \
             locks on MySQL/MariaDB that block inserts: keep `Isolation::ReadCommitted`, or use \
             the lease or advisory lock form",
        ));
    }
    if config.fifo {
        if !matches!(config.form, Form::Lease { .. }) {
            return Err(Error::declaration(
                queue,
                "FIFO needs the lease form: a row held by a row lock or an advisory key is not \
                 visible to other claims, which would take the next row of its group",
            ));
        }
        if config.table.group.is_none() {
            return Err(Error::declaration(
                queue,
                "FIFO orders rows within a group: declare the table's group column with \
                 `Table::group(..)`",
            ));
        }
    }
    match (&config.table.group, &config.name) {
        // An unnamed FIFO queue serves every group, each in its own order.
        (Some(_), None) if config.fifo => Ok(()),
        (Some(column), None) => Err(Error::declaration(
            queue,
            format!(
                "table `{}` has the group column `{column}`: name the group this queue serves \
                 with `.named(..)`",
                config.table.name
            ),
        )),
        (None, Some(name)) => Err(Error::declaration(
            queue,
            format!(
                "`.named({name:?})` selects a group, but table `{}` has no group column: \
                 declare it with `Table::group(..)`",
                config.table.name
            ),
        )),
        _ => Ok(()),
    }
}

/// What a column's type must be.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Integer,
    Bytes,
    Text,
    Json,
    Jsonb,
    Time,
}

impl Kind {
    fn payload(payload_type: PayloadType) -> Kind {
        match payload_type {
            PayloadType::Text => Kind::Text,
            PayloadType::Json => Kind::Json,
            PayloadType::Jsonb => Kind::Jsonb,
            _ => Kind::Bytes,
        }
    }

    fn accepts(self, dialect: Dialect, ty: &str) -> bool {
        let ty = ty.to_ascii_lowercase();
        let ty = ty.as_str();
        match (self, dialect) {
            (Kind::Integer, _) => dialect::integer_range(dialect, ty).is_some(),
            (Kind::Bytes, Dialect::Postgres) => ty == "bytea",
            (Kind::Bytes, Dialect::MySql) => {
                ty.contains("blob") || ty.starts_with("binary") || ty.starts_with("varbinary")
            }
            (Kind::Bytes, Dialect::Sqlite) => ty.is_empty() || ty.contains("blob"),
            (Kind::Text, Dialect::Postgres) => {
                ty == "text" || ty.starts_with("character") || ty.starts_with("varchar")
            }
            (Kind::Text, Dialect::MySql) => ty.contains("char") || ty.contains("text"),
            (Kind::Text, Dialect::Sqlite) => {
                ty.is_empty() || ["char", "clob", "text"].iter().any(|t| ty.contains(t))
            }
            (Kind::Json, Dialect::Postgres) => ty == "json",
            (Kind::Jsonb, Dialect::Postgres) => ty == "jsonb",
            // MariaDB's JSON is an alias of LONGTEXT (with a JSON_VALID check).
            (Kind::Json | Kind::Jsonb, Dialect::MySql) => ty == "json" || ty.contains("text"),
            // Text affinity only: a column declared `JSON` has NUMERIC affinity, which turns a
            // payload that is a bare number into an INTEGER or REAL (and may round it).
            (Kind::Json | Kind::Jsonb, Dialect::Sqlite) => {
                ["char", "clob", "text"].iter().any(|t| ty.contains(t))
            }
            // Lease tokens are compared to the microsecond: a coarser column would round them.
            (Kind::Time, Dialect::Postgres) => {
                matches!(
                    ty,
                    "timestamp with time zone" | "timestamp(6) with time zone"
                )
            }
            // Not TIMESTAMP: before MariaDB 10.10 its first column defaults to the current time and
            // is updated with the row, and its range ends in 2038.
            (Kind::Time, Dialect::MySql) => ty == "datetime(6)",
            (Kind::Time, Dialect::Sqlite) => {
                ty.is_empty()
                    || ["text", "char", "date", "time"]
                        .iter()
                        .any(|t| ty.contains(t))
            }
        }
    }

    fn expected(self, dialect: Dialect) -> &'static str {
        match (self, dialect) {
            (Kind::Integer, _) => "an integer type",
            (Kind::Bytes, Dialect::Postgres) => {
                "BYTEA (a text or JSON payload: declare `Table::payload_type`)"
            }
            (Kind::Bytes, Dialect::MySql) => {
                "a BLOB or VARBINARY type (a text or JSON payload: declare `Table::payload_type`)"
            }
            (Kind::Bytes, Dialect::Sqlite) => {
                "BLOB (a text or JSON payload: declare `Table::payload_type`)"
            }
            (Kind::Text, _) => "a text type",
            (Kind::Json, Dialect::Postgres) => "JSON (`PayloadType::Jsonb` for JSONB)",
            (Kind::Jsonb, Dialect::Postgres) => "JSONB (`PayloadType::Json` for JSON)",
            (Kind::Json | Kind::Jsonb, Dialect::MySql) => "JSON or a text type",
            (Kind::Json | Kind::Jsonb, Dialect::Sqlite) => {
                "TEXT (a column declared JSON has numeric affinity: SQLite would change numbers)"
            }
            (Kind::Time, Dialect::Postgres) => "TIMESTAMPTZ (microseconds)",
            (Kind::Time, Dialect::MySql) => "DATETIME(6)",
            (Kind::Time, Dialect::Sqlite) => "TEXT (RFC 3339, as sqlx writes chrono times)",
        }
    }
}

/// A column of a table, as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    pub(crate) name: String,
    /// The type as the catalog writes it (SQLite: as declared).
    pub(crate) ty: String,
    pub(crate) nullable: bool,
    pub(crate) fill: Fill,
}

/// What an insert that leaves a column out writes into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Nothing: NULL where the column takes it, else the insert fails.
    Nothing,
    /// Its default (a serial, identity by default, `AUTO_INCREMENT` or SQLite rowid alias too).
    Default,
    /// A value the database computes, and which refuses one given: a generated column, or
    /// PostgreSQL's `GENERATED ALWAYS` identity.
    Generated,
}

impl Column {
    fn from_catalog([name, ty, nullable, fill]: [String; 4]) -> Self {
        Column {
            name,
            ty,
            nullable: nullable == "YES",
            fill: match fill.as_str() {
                "generated" => Fill::Generated,
                "default" => Fill::Default,
                _ => Fill::Nothing,
            },
        }
    }
}

/// The column of `columns` named `name`.
pub(super) fn find_column<'a>(
    dialect: Dialect,
    columns: &'a [Column],
    name: &str,
) -> Option<&'a Column> {
    columns
        .iter()
        .find(|column| same_column(dialect, &column.name, name))
}

/// Reads a table's columns from the catalog (none when the table does not exist). On SQLite, a
/// table qualified by a name that is not an attached database (`public.jobs`, written as on
/// PostgreSQL) is an [`Error::Schema`] that says so, for `queue`.
pub(crate) async fn read_catalog<DB: Backend>(
    conn: &mut DB::Connection,
    queue: &str,
    table: &str,
) -> Result<Vec<Column>> {
    let quoted = DB::DIALECT.quote_table(table)?;
    let (schema, bare) = table_parts(table)?;
    if let (Dialect::Sqlite, Some(schema)) = (DB::DIALECT, schema) {
        let list = SqlStr::from_static(dialect::sqlite_attached());
        let attached = DB::fetch_text(conn, query_values::<DB>(list, &[]))
            .await?
            .unwrap_or_default();
        let attached: Vec<&str> = attached.lines().collect();
        if !attached
            .iter()
            .any(|name| name.eq_ignore_ascii_case(schema))
        {
            let reason = dialect::sqlite_qualified(schema, bare, Some(&attached));
            return Err(Error::schema(queue, table, None, reason));
        }
    }
    let values = match DB::DIALECT {
        Dialect::Postgres => vec![Value::Text(Some(&quoted))],
        Dialect::MySql => vec![Value::Text(schema), Value::Text(Some(bare))],
        Dialect::Sqlite => [Value::Text(Some(bare)), Value::Text(schema)].repeat(2),
    };
    let sql = SqlStr::from_static(dialect::catalog(DB::DIALECT));
    let rows = DB::fetch_quads(conn, query_values::<DB>(sql, &values)).await?;
    Ok(rows.into_iter().map(Column::from_catalog).collect())
}

/// Reads the table's columns from the catalog and checks each role's column and type.
async fn check_columns<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
) -> Result<Vec<Column>> {
    let table = &config.table;
    let columns = read_catalog::<DB>(conn, config.label(), &table.name).await?;
    let schema_error = |column: Option<&str>, reason: String| {
        Error::schema(config.label(), &table.name, column, reason)
    };
    if columns.is_empty() {
        return Err(schema_error(None, "the table does not exist".to_owned()));
    }

    let mut roles = vec![
        ("id", table.id.as_str(), Kind::Integer),
        (
            "payload",
            table.payload.as_str(),
            Kind::payload(table.payload_type),
        ),
    ];
    let optional = [
        ("group", table.group.as_deref(), Kind::Text),
        ("retry_after", table.retry_after.as_deref(), Kind::Time),
        ("processed_at", table.processed_at.as_deref(), Kind::Time),
        ("attempt", config.attempt.as_deref(), Kind::Integer),
        ("priority", table.priority.as_deref(), Kind::Integer),
    ];
    roles.extend(
        optional
            .into_iter()
            .filter_map(|(role, column, kind)| Some((role, column?, kind))),
    );
    if let Form::Lease { column, .. } = &config.form {
        roles.push(("lease", column, Kind::Time));
    }

    for (role, column, kind) in roles {
        let Some(Column { ty, nullable, .. }) = find_column(DB::DIALECT, &columns, column) else {
            return Err(schema_error(
                Some(column),
                format!("the {role} column does not exist"),
            ));
        };
        if !kind.accepts(DB::DIALECT, ty) {
            return Err(schema_error(
                Some(column),
                format!(
                    "the {role} column has type `{ty}`; on {} it needs {}",
                    DB::DIALECT.product(),
                    kind.expected(DB::DIALECT)
                ),
            ));
        }
        // Time roles are NULL until set; payload and attempt are read as values.
        let needs_null = matches!(kind, Kind::Time);
        let needs_value = matches!(role, "payload" | "attempt");
        if needs_null && !nullable {
            return Err(schema_error(
                Some(column),
                format!("the {role} column must take NULL (NULL means not set)"),
            ));
        }
        if needs_value && *nullable {
            return Err(schema_error(
                Some(column),
                format!("the {role} column must be NOT NULL"),
            ));
        }
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_without_skip_locked_are_refused() {
        check_mysql_version("10.11.19-MariaDB-0+deb12u1").unwrap();
        check_mysql_version("10.6.0-MariaDB").unwrap();
        check_mysql_version("8.0.36").unwrap();
        check_mysql_version("8.4.0-commercial").unwrap();
        let err = check_mysql_version("10.5.23-MariaDB").unwrap_err();
        assert!(matches!(&err, Error::ServerTooOld { needed, .. } if needed == "10.6.0"));
        assert!(err.to_string().contains("10.5.23-MariaDB"), "{err}");
        let err = check_mysql_version("5.7.44-log").unwrap_err();
        assert!(matches!(err, Error::ServerTooOld { needed, .. } if needed == "8.0.1"));
    }

    #[test]
    fn column_types_per_dialect() {
        assert!(Kind::Time.accepts(Dialect::Postgres, "timestamp with time zone"));
        assert!(!Kind::Time.accepts(Dialect::Postgres, "timestamp(3) with time zone"));
        assert!(!Kind::Time.accepts(Dialect::Postgres, "timestamp without time zone"));
        assert!(Kind::Time.accepts(Dialect::MySql, "datetime(6)"));
        assert!(!Kind::Time.accepts(Dialect::MySql, "datetime"));
        assert!(Kind::Integer.accepts(Dialect::MySql, "bigint(20)"));
        assert!(Kind::Integer.accepts(Dialect::MySql, "int(11) unsigned"));
        assert!(!Kind::Integer.accepts(Dialect::MySql, "point"));
        assert!(Kind::Bytes.accepts(Dialect::MySql, "longblob"));
        assert!(!Kind::Bytes.accepts(Dialect::Postgres, "text"));
        assert!(Kind::Bytes.accepts(Dialect::Sqlite, "BLOB"));
        assert!(!Kind::Bytes.accepts(Dialect::Sqlite, "INTEGER"));
    }
}
