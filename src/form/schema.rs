//! What every form checks before anything is claimed: the server, the table's columns and their
//! types, the dead letter, the service's own statements; and every statement, prepared once.

use std::sync::Arc;

use chrono::Utc;
use sqlx::Pool;

use super::catalog::{self, Column, Identity, find_column};
use super::floor::Floor;
use super::requests::Requests;
use super::{Custom, Dead, dead_table};
use crate::backend::{Backend, ClaimColumns, Clock, Engine};
use crate::config::{Event, FormKind, QueueConfig};
use crate::delivery::{Outcome, Settle};
use crate::dialect::schema::{self, Plan};
use crate::dialect::{self, DeadTarget, Kind, Names, Stmt};
use crate::error::{Error, Result, SchemaError};
use crate::table::{DeadLetter, Dialect};

/// What the runner learns of the server at start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Server {
    /// The server has a clock of its own (SQLite shares this host's).
    pub(crate) own_clock: bool,
    /// PostgreSQL 14 or later: a session can notice its client is gone while a statement runs
    /// (`client_connection_check_interval`).
    pub(crate) checks_connection: bool,
    /// The engine its version string names (CockroachDB, YugabyteDB, TiDB are refused the forms
    /// they cannot hold a row with).
    pub(crate) engine: Engine,
}

/// Reads the server's version (refusing servers without `SKIP LOCKED`) and corrects `clock` by
/// the server's.
pub(crate) async fn measure_server<DB: Backend>(pool: &Pool<DB>, clock: &Clock) -> Result<Server> {
    let mut conn = pool.acquire().await?;
    let sent = Utc::now();
    let (version, server_now) = DB::server(&mut conn).await?;
    let received = Utc::now();
    let engine = Engine::detect(DB::DIALECT, &version);
    check_version(engine, &version)?;
    if let Some(now) = server_now {
        clock.measure(sent, received, now);
    }
    Ok(Server {
        own_clock: server_now.is_some(),
        checks_connection: engine == Engine::PostgreSql && engine.major(&version) >= 14,
        engine,
    })
}

/// Refuses servers without `SKIP LOCKED`: MySQL before 8.0.1, MariaDB before 10.6, CockroachDB
/// before 23.1.
fn check_version(engine: Engine, version: &str) -> Result<()> {
    let needed: &[u32] = match engine {
        Engine::MySql => &[8, 0, 1],
        Engine::MariaDb => &[10, 6, 0],
        Engine::CockroachDb => &[23, 1],
        _ => return Ok(()),
    };
    let found = engine.numbers(version);
    if found.len() >= needed.len() && found[..needed.len()] < *needed {
        return Err(Error::ServerTooOld {
            server: engine.name().to_owned(),
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

/// What a form starts from: the queue's checked table and what it shares with the other forms.
#[derive(Debug)]
pub(crate) struct Checked {
    /// The queue's quoted names, the attempt column's largest value read.
    pub(crate) names: Names,
    pub(crate) identity: Identity,
    pub(crate) dead: Option<Dead>,
    pub(crate) custom: Custom,
    /// The queue's name in messages.
    pub(crate) queue: Arc<str>,
    pub(crate) table: Arc<str>,
    /// The group the queue serves.
    pub(crate) group: Option<Arc<str>>,
    /// What the claim returns beyond the id and payload.
    pub(crate) columns: ClaimColumns,
    /// `SELECT *` of a row by id: what a row mode handler decodes.
    pub(crate) row: Stmt,
    pub(crate) clock: Clock,
    pub(crate) server: Server,
    /// Where the queue's claims start reading ([`Floor`]).
    pub(crate) floor: Floor,
    /// The reservations of its rows' cancel requests, where a settlement makes them.
    pub(crate) requests: Option<Requests>,
}

impl Checked {
    /// Whether `outcome` settles by a batch's grouped `DELETE` (or marking): an ack, a drop or
    /// an undecodable row, with no statement of the queue's own for it.
    pub(crate) fn finishes(&self, outcome: Outcome) -> bool {
        matches!(outcome.0, Settle::Ack | Settle::Drop | Settle::Undecodable)
            && self.custom.get(outcome.0).is_none()
    }
}

/// Checks one queue's table, dead letter and own statements on `conn`, preparing what is the
/// same for every form.
pub(crate) async fn check<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
    clock: Clock,
    server: Server,
) -> Result<Checked> {
    let mut names = Names::of_queue(DB::DIALECT, config)?;
    names.delete_returning = server.engine == Engine::MariaDb;
    let columns = check_columns::<DB>(conn, config).await?;
    let identity = catalog::read_identity::<DB>(conn, config.label(), &config.table.name).await?;
    names.attempt_max = attempt_max::<DB>(config, &columns)?;
    let guarded = matches!(config.form, FormKind::Lease { .. });
    let dead = match dead_target::<DB>(conn, config, &names, &columns).await? {
        Some((target, group)) => {
            let sql = dialect::dead_letter(&names, &target, guarded);
            prepare_all::<DB>(conn, config, &sql.statements()).await?;
            Some(Dead { sql, group })
        }
        None => None,
    };
    let custom = custom_statements(DB::DIALECT, config)?
        .into_iter()
        .map(|(event, stmt)| (event, stmt.unprepared_if(names.unprepared)))
        .collect();
    let custom = Custom::new(custom);
    prepare_all::<DB>(conn, config, &custom.statements().collect::<Vec<_>>()).await?;
    let columns = ClaimColumns {
        attempt: config.attempt.is_some(),
        created_at: names.read_created,
        headers: names.headers.is_some(),
        key: names.key.is_some(),
    };
    Ok(Checked {
        row: dialect::row_by_id(&names),
        requests: Requests::of(config, &names),
        floor: Floor::new(names.claims_in_id_order()),
        names,
        identity,
        dead,
        custom,
        queue: config.label().into(),
        table: config.table.name.as_str().into(),
        group: config.name.as_deref().map(Into::into),
        columns,
        clock,
        server,
    })
}

/// Renders the queue's own statements ([`Queue::custom`](crate::Queue::custom)), refusing one
/// that does not render (more than one statement, an unknown marker): a check that needs no
/// database, made when the queue is mounted, and again here at start, where they are prepared.
pub(crate) fn custom_statements(
    dialect: Dialect,
    config: &QueueConfig,
) -> Result<Vec<(Event, Stmt)>> {
    config
        .custom
        .iter()
        .map(|(event, sql)| {
            let stmt = dialect::custom(dialect, sql).map_err(|reason| {
                Error::declaration(
                    config.label(),
                    format!("the custom {event:?} statement: {reason}"),
                )
            })?;
            Ok((*event, stmt))
        })
        .collect()
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
    let Some(n) = config.max_attempts() else {
        return Ok(max);
    };
    let (form, stored, largest) = match config.form {
        FormKind::RowLock => ("row lock", i64::from(n), max),
        FormKind::Lease { .. } => ("lease", i64::from(n) + 1, max - 1),
        FormKind::Advisory => ("advisory lock", i64::from(n) + 1, max - 1),
    };
    if stored > max {
        let counts = match config.form {
            FormKind::RowLock => "max_attempts",
            _ => "max_attempts + 1",
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

/// Checks the dead letter against the database: a table must exist, have every column of the
/// queue table and take the rows moved into it ([`dead_table::check`]).
async fn dead_target<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
    names: &Names,
    columns: &[Column],
) -> Result<Option<(DeadTarget, Option<Arc<str>>)>> {
    let dialect = DB::DIALECT;
    let dead = match config.dead_letter() {
        None => return Ok(None),
        Some(DeadLetter::Group(group)) => {
            // Refused without a group column when the queue was mounted (`QueueConfig::check`).
            let Some(column) = names.group.clone() else {
                return Err(Error::declaration(
                    config.label(),
                    "a group dead letter needs the table's group column",
                ));
            };
            let target = DeadTarget::Group { column };
            return Ok(Some((target, Some(Arc::from(group.as_str())))));
        }
        Some(DeadLetter::Table(dead)) => dead,
    };
    let dead_columns = catalog::read_catalog::<DB>(conn, config.label(), dead).await?;
    let missing =
        |column: Option<&str>, reason: &str| Error::schema(config.label(), dead, column, reason);
    if dead_columns.is_empty() {
        let fix = schema::fix_for(dialect, &Plan::of(config), dead);
        return Err(missing(None, "the dead-letter table does not exist").with_fix(fix));
    }
    for column in columns {
        let Some(Column { ty, .. }) = find_column(dialect, &dead_columns, &column.name) else {
            // The queue table's own type: the move needs the same.
            let fix = schema::add_typed(dialect, dead, &column.name, &column.ty).ok();
            let reason = "the dead-letter table lacks a column of the queue table";
            return Err(missing(Some(&column.name), reason).with_fix(fix));
        };
        // The payload moves as it is: the dead letter's column must hold the same kind.
        let payload = Kind::payload(config.table.payload_type);
        if dialect.same_column(&column.name, &config.table.payload) && !payload.accepts(dialect, ty)
        {
            return Err(Error::schema(
                config.label(),
                dead,
                Some(&column.name),
                format!(
                    "the dead-letter table's payload column has type `{ty}`; like the queue's, \
                     on {} it needs {}",
                    dialect.product(),
                    payload.expected(dialect)
                ),
            ));
        }
    }
    dead_table::check(dialect, columns, &dead_columns)
        .map_err(|(column, reason)| Error::schema(config.label(), dead, Some(&column), reason))?;
    let columns = columns
        .iter()
        .map(|column| dialect.quote(&column.name))
        .collect::<Result<_>>()?;
    let table = dialect.quote_table(dead)?;
    Ok(Some((DeadTarget::Table { table, columns }, None)))
}

/// Prepares each statement, so that the server checks it before anything is claimed.
pub(crate) async fn prepare_all<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
    statements: &[&Stmt],
) -> Result<()> {
    for stmt in statements.iter().flat_map(|stmt| stmt.parts()) {
        DB::prepare(conn, stmt.sql(), &stmt.kinds(), stmt.unprepared)
            .await
            .map_err(|source| {
                Error::Schema(Box::new(SchemaError {
                    queue: config.label().to_owned(),
                    table: config.table.name.clone(),
                    column: None,
                    statement: Some(stmt.text().to_owned()),
                    reason: "the database refused to prepare a statement".to_owned(),
                    fix: None,
                    source: Some(source),
                }))
            })?;
    }
    Ok(())
}

/// Reads the table's columns from the catalog and checks each role's column and type.
async fn check_columns<DB: Backend>(
    conn: &mut DB::Connection,
    config: &QueueConfig,
) -> Result<Vec<Column>> {
    let table = &config.table;
    let columns = catalog::read_catalog::<DB>(conn, config.label(), &table.name).await?;
    let schema_error = |column: Option<&str>, reason: String| {
        Error::schema(config.label(), &table.name, column, reason)
    };
    let plan = Plan::of(config);
    if columns.is_empty() {
        let fix = schema::fix_for(DB::DIALECT, &plan, &table.name);
        return Err(schema_error(None, "the table does not exist".to_owned()).with_fix(fix));
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
        // Read by the claims for the pickup latency (`metrics`), as a time.
        (
            "created_at",
            table
                .created_at
                .as_deref()
                .filter(|_| cfg!(feature = "metrics")),
            Kind::Time,
        ),
    ];
    roles.extend(
        optional
            .into_iter()
            .filter_map(|(role, column, kind)| Some((role, column?, kind))),
    );
    if let FormKind::Lease { column, .. } = &config.form {
        roles.push(("lease", column, Kind::Time));
    }
    if let Some(column) = table.headers.as_deref() {
        // Any of text, JSON and JSONB: checked against the first the column's type is.
        let ty = find_column(DB::DIALECT, &columns, column).map(|c| c.ty.as_str());
        let kind = [Kind::Json, Kind::Jsonb, Kind::Text]
            .into_iter()
            .find(|kind| ty.is_some_and(|ty| kind.accepts(DB::DIALECT, ty)))
            .unwrap_or(Kind::Text);
        roles.push(("headers", column, kind));
    }

    for (role, column, kind) in roles {
        let Some(Column { ty, nullable, .. }) = find_column(DB::DIALECT, &columns, column) else {
            let fix = schema::add_column(DB::DIALECT, &plan, &table.name, column);
            let reason = format!("the {role} column does not exist");
            return Err(schema_error(Some(column), reason).with_fix(fix));
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
        // Time roles are NULL until set (but the creation time, set by its default), headers
        // NULL for a job without any; payload and attempt are read as values.
        let needs_null = (kind == Kind::Time && role != "created_at") || role == "headers";
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
mod tests;
