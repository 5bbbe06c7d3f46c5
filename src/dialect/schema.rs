//! The DDL of the tables a declaration needs, as text: the queue table with exactly the roles
//! declared (the types the start checks accept), its claim index and unique key index, its
//! dead-letter table, its cancel requests' and limiter tables, and the schedules table. Every
//! statement is idempotent: `CREATE TABLE IF NOT EXISTS`, and `CREATE INDEX IF NOT EXISTS` on
//! PostgreSQL and SQLite; MySQL/MariaDB, which has no `CREATE INDEX IF NOT EXISTS` (MySQL 8),
//! gets its indexes inside the `CREATE TABLE`.

use super::Dialect;
use crate::error::{Error, Result};
use crate::table::{DeadLetter, PayloadType, Table, table_parts};

/// A column's role: what type it gets, and where it stands among the table's columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Id,
    Group,
    Payload(PayloadType),
    Attempt,
    Priority,
    Lease,
    RetryAfter,
    ProcessedAt,
    CreatedAt,
    Headers,
    Key,
}

impl Role {
    /// Where the column stands in the table: the README's order.
    fn rank(self) -> u8 {
        match self {
            Role::Id => 0,
            Role::Group => 1,
            Role::Payload(_) => 2,
            Role::Attempt => 3,
            Role::Priority => 4,
            Role::Lease => 5,
            Role::RetryAfter => 6,
            Role::ProcessedAt => 7,
            Role::CreatedAt => 8,
            Role::Headers => 9,
            Role::Key => 10,
        }
    }

    /// The column's type and constraints on `dialect`.
    fn definition(self, dialect: Dialect) -> &'static str {
        use Dialect::{MySql, Postgres, Sqlite};
        match (self, dialect) {
            (Role::Id, Postgres) => "BIGSERIAL PRIMARY KEY",
            (Role::Id, MySql) => "BIGINT AUTO_INCREMENT PRIMARY KEY",
            // AUTOINCREMENT: a deleted row's id is never given again.
            (Role::Id, Sqlite) => "INTEGER PRIMARY KEY AUTOINCREMENT",
            (Role::Group, MySql) => "VARCHAR(255) NOT NULL",
            (Role::Group, _) => "TEXT NOT NULL",
            (Role::Payload(PayloadType::Bytes), Postgres) => "BYTEA NOT NULL",
            (Role::Payload(PayloadType::Bytes), MySql) => "LONGBLOB NOT NULL",
            (Role::Payload(PayloadType::Bytes), Sqlite) => "BLOB NOT NULL",
            (Role::Payload(PayloadType::Text), MySql) => "LONGTEXT NOT NULL",
            (Role::Payload(PayloadType::Json), Postgres) => "JSON NOT NULL",
            (Role::Payload(PayloadType::Jsonb), Postgres) => "JSONB NOT NULL",
            (Role::Payload(PayloadType::Json | PayloadType::Jsonb), MySql) => "JSON NOT NULL",
            (Role::Payload(_), _) => "TEXT NOT NULL",
            (Role::Attempt, Sqlite) => "INTEGER NOT NULL DEFAULT 1",
            (Role::Attempt, _) => "INT NOT NULL DEFAULT 1",
            (Role::Priority, Sqlite) => "INTEGER NOT NULL DEFAULT 0",
            (Role::Priority, _) => "BIGINT NOT NULL DEFAULT 0",
            (Role::Lease | Role::RetryAfter | Role::ProcessedAt, Postgres) => "TIMESTAMPTZ",
            (Role::Lease | Role::RetryAfter | Role::ProcessedAt, MySql) => "DATETIME(6)",
            (Role::Lease | Role::RetryAfter | Role::ProcessedAt, Sqlite) => "TEXT",
            (Role::CreatedAt, Postgres) => "TIMESTAMPTZ NOT NULL DEFAULT now()",
            (Role::CreatedAt, MySql) => "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
            (Role::CreatedAt, Sqlite) => {
                "TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))"
            }
            (Role::Headers, Postgres) => "JSONB",
            (Role::Headers, MySql) => "JSON",
            (Role::Headers, Sqlite) => "TEXT",
            (Role::Key, MySql) => "VARCHAR(255) NULL",
            (Role::Key, _) => "TEXT",
        }
    }
}

/// A queue table, the union of the roles of every declaration on it.
#[derive(Debug, Clone)]
struct Jobs {
    name: String,
    /// Each column once, with the role it was first declared with.
    columns: Vec<(String, Role)>,
    dead: Vec<String>,
}

impl Jobs {
    fn column(&self, role: fn(Role) -> bool) -> Option<&str> {
        self.columns
            .iter()
            .find(|(_, r)| role(*r))
            .map(|(name, _)| name.as_str())
    }

    fn add(&mut self, column: &str, role: Role) -> Result<()> {
        // Names compare as MySQL and SQLite compare them: a generator for every database.
        match self
            .columns
            .iter()
            .find(|(c, _)| c.eq_ignore_ascii_case(column))
        {
            None => self.columns.push((column.to_owned(), role)),
            Some((_, had)) if *had == role => {}
            Some((_, had)) => {
                let same_type = [Dialect::Postgres, Dialect::MySql, Dialect::Sqlite]
                    .iter()
                    .all(|d| had.definition(*d) == role.definition(*d));
                if !same_type || matches!(role, Role::Id | Role::Payload(_)) {
                    return Err(Error::declaration(
                        &self.name,
                        format!("column `{column}` is declared in two roles of different types"),
                    ));
                }
            }
        }
        let ids = self.columns.iter().filter(|(_, r)| *r == Role::Id).count();
        let payloads = self
            .columns
            .iter()
            .filter(|(_, r)| matches!(r, Role::Payload(_)));
        if ids > 1 || payloads.count() > 1 {
            return Err(Error::declaration(
                &self.name,
                "the queues on this table declare different id or payload columns",
            ));
        }
        Ok(())
    }
}

/// The tables a set of declarations needs, each once, rendered in an order that creates the
/// queue tables before the tables whose columns are theirs (dead letters).
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    jobs: Vec<Jobs>,
    requests: Vec<String>,
    limits: Vec<String>,
    schedules: Option<String>,
}

/// One statement of a [`Plan`], and the table it creates or changes (as declared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Created {
    pub(crate) table: String,
    pub(crate) sql: String,
}

/// `name`'s parts, as a plan compares tables.
fn key(name: &str) -> Result<(Option<String>, String)> {
    let (schema, table) = table_parts(name)?;
    Ok((schema.map(str::to_owned), table.to_owned()))
}

fn add_once(list: &mut Vec<String>, name: &str) -> Result<()> {
    let k = key(name)?;
    for had in list.iter() {
        if key(had)? == k {
            return Ok(());
        }
    }
    list.push(name.to_owned());
    Ok(())
}

impl Plan {
    /// Adds a queue of `table` (its `lease` set from the queue's form) counting attempts in
    /// `attempt`, dead-lettering to `dead`.
    pub(crate) fn queue(
        &mut self,
        table: &Table,
        attempt: Option<&str>,
        dead: Option<&DeadLetter>,
    ) -> Result<()> {
        let k = key(&table.name)?;
        let index = match self
            .jobs
            .iter()
            .position(|j| key(&j.name).ok() == Some(k.clone()))
        {
            Some(index) => index,
            None => {
                self.jobs.push(Jobs {
                    name: table.name.clone(),
                    columns: Vec::new(),
                    dead: Vec::new(),
                });
                self.jobs.len() - 1
            }
        };
        let jobs = &mut self.jobs[index];
        let roles = [
            (Some(table.id.as_str()), Role::Id),
            (table.group.as_deref(), Role::Group),
            (
                Some(table.payload.as_str()),
                Role::Payload(table.payload_type),
            ),
            (attempt, Role::Attempt),
            (table.priority.as_deref(), Role::Priority),
            (table.lease.as_deref(), Role::Lease),
            (table.retry_after.as_deref(), Role::RetryAfter),
            (table.processed_at.as_deref(), Role::ProcessedAt),
            (table.created_at.as_deref(), Role::CreatedAt),
            (table.headers.as_deref(), Role::Headers),
            (table.unique_key.as_deref(), Role::Key),
        ];
        for (column, role) in roles {
            if let Some(column) = column {
                jobs.add(column, role)?;
            }
        }
        if let Some(DeadLetter::Table(dead)) = dead {
            add_once(&mut jobs.dead, dead)?;
        }
        if let Some(requests) = &table.cancel_requests {
            add_once(&mut self.requests, requests)?;
        }
        if let Some(limits) = &table.limits {
            add_once(&mut self.limits, limits)?;
        }
        Ok(())
    }

    /// Adds the schedules table `name`.
    pub(crate) fn schedules(&mut self, name: &str) -> Result<()> {
        key(name)?;
        self.schedules = Some(name.to_owned());
        Ok(())
    }

    /// Every statement, in order: the queue tables and their indexes, their dead-letter tables
    /// (a dead-letter table that is itself a queue table is not created twice), the cancel
    /// requests' tables, the limiter tables, the schedules table.
    pub(crate) fn render(&self, dialect: Dialect) -> Result<Vec<Created>> {
        let mut out = Vec::new();
        let created = |table: &str, sql: String| Created {
            table: table.to_owned(),
            sql,
        };
        for jobs in &self.jobs {
            for sql in queue_table(dialect, &jobs.name, jobs, true)? {
                out.push(created(&jobs.name, sql));
            }
        }
        for jobs in &self.jobs {
            for dead in &jobs.dead {
                let own = self
                    .jobs
                    .iter()
                    .any(|j| key(&j.name).ok() == key(dead).ok());
                if !own
                    && !out
                        .iter()
                        .any(|c: &Created| key(&c.table).ok() == key(dead).ok())
                {
                    let sql = queue_table(dialect, dead, jobs, false)?.remove(0);
                    out.push(created(dead, sql));
                }
            }
        }
        for name in &self.requests {
            out.push(created(name, requests_table(dialect, name)?));
        }
        for name in &self.limits {
            out.push(created(name, limits_table(dialect, name)?));
        }
        if let Some(name) = &self.schedules {
            out.push(created(name, schedules_table(dialect, name)?));
        }
        Ok(out)
    }
}

/// `CREATE TABLE IF NOT EXISTS table (..)`, one column a line, names aligned.
fn create_table(
    dialect: Dialect,
    table: &str,
    columns: &[(&str, &str)],
    inline: &[String],
) -> Result<String> {
    let quoted = columns
        .iter()
        .map(|(name, def)| Ok((dialect.quote(name)?, *def)))
        .collect::<Result<Vec<_>>>()?;
    let width = quoted
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    let mut lines: Vec<String> = quoted
        .iter()
        .map(|(name, def)| format!("    {name:width$} {def}"))
        .collect();
    lines.extend(inline.iter().map(|line| format!("    {line}")));
    let options = if dialect == Dialect::MySql {
        " DEFAULT CHARSET=utf8mb4"
    } else {
        ""
    };
    Ok(format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n){options}",
        dialect.quote_table(table)?,
        lines.join(",\n")
    ))
}

/// The queue table `name` with `jobs`' columns: with its indexes (`indexed`), or as a
/// dead-letter table (the same columns, no index beyond the primary key).
fn queue_table(dialect: Dialect, name: &str, jobs: &Jobs, indexed: bool) -> Result<Vec<String>> {
    let mut columns = jobs.columns.clone();
    columns.sort_by_key(|(_, role)| role.rank());
    let defs: Vec<(&str, &str)> = columns
        .iter()
        .map(|(column, role)| (column.as_str(), role.definition(dialect)))
        .collect();
    if !indexed {
        return Ok(vec![create_table(dialect, name, &defs, &[])?]);
    }
    let indexes = indexes(dialect, name, jobs)?;
    if dialect == Dialect::MySql {
        let inline: Vec<String> = indexes.into_iter().map(|index| index.inline).collect();
        return Ok(vec![create_table(dialect, name, &defs, &inline)?]);
    }
    let mut out = vec![create_table(dialect, name, &defs, &[])?];
    out.extend(indexes.into_iter().map(|index| index.create));
    Ok(out)
}

/// An index, as a statement of its own and as a line of MySQL's `CREATE TABLE`.
struct Index {
    create: String,
    inline: String,
}

/// The claim's index (where the table has a group, `processed_at` or priority column) and the
/// unique key's.
fn indexes(dialect: Dialect, table: &str, jobs: &Jobs) -> Result<Vec<Index>> {
    let group = jobs.column(|r| r == Role::Group);
    let processed = jobs.column(|r| r == Role::ProcessedAt);
    let priority = jobs.column(|r| r == Role::Priority);
    let retry = jobs.column(|r| r == Role::RetryAfter);
    let id = jobs.column(|r| r == Role::Id).unwrap_or("id");
    let mut out = Vec::new();
    if group.is_some() || processed.is_some() || priority.is_some() {
        let mut columns = vec![group];
        if dialect == Dialect::MySql {
            columns.push(processed);
        }
        columns.extend([priority, priority.and(retry), Some(id)]);
        let columns: Vec<&str> = columns.into_iter().flatten().collect();
        out.push(index(dialect, table, "claim", false, &columns, processed)?);
    }
    for (column, _) in jobs.columns.iter().filter(|(_, r)| *r == Role::Key) {
        let suffix = if column == "claim" {
            "claim_unique"
        } else {
            column
        };
        out.push(index(dialect, table, suffix, true, &[column], processed)?);
    }
    Ok(out)
}

/// The index `{table}_{suffix}` on `columns`, partial on unfinished rows where `processed`
/// (PostgreSQL, SQLite).
fn index(
    dialect: Dialect,
    table: &str,
    suffix: &str,
    unique: bool,
    columns: &[&str],
    processed: Option<&str>,
) -> Result<Index> {
    let (schema, bare) = table_parts(table)?;
    let name = dialect.quote(&format!("{bare}_{suffix}"))?;
    let list = columns
        .iter()
        .map(|column| dialect.quote(column))
        .collect::<Result<Vec<_>>>()?
        .join(", ");
    let unique = if unique { "UNIQUE " } else { "" };
    let inline = format!("{unique}INDEX {name} ({list})");
    let (name, on) = match (dialect, schema) {
        // SQLite qualifies the index, and names its table bare; PostgreSQL the other way round.
        (Dialect::Sqlite, Some(schema)) => (
            format!("{}.{name}", dialect.quote(schema)?),
            dialect.quote(bare)?,
        ),
        _ => (name, dialect.quote_table(table)?),
    };
    let mut create = format!("CREATE {unique}INDEX IF NOT EXISTS {name} ON {on} ({list})");
    if let Some(processed) = processed.filter(|_| dialect != Dialect::MySql) {
        create.push_str(&format!(" WHERE {} IS NULL", dialect.quote(processed)?));
    }
    Ok(Index { create, inline })
}

/// The cancel requests' table `name`: its one column, the job's id.
pub(crate) fn requests_table(dialect: Dialect, name: &str) -> Result<String> {
    let id = match dialect {
        Dialect::Sqlite => "INTEGER PRIMARY KEY",
        _ => "BIGINT PRIMARY KEY",
    };
    create_table(dialect, name, &[("id", id)], &[])
}

/// The limiter table `name`: one token bucket a row.
pub(crate) fn limits_table(dialect: Dialect, name: &str) -> Result<String> {
    let (key, real, int) = match dialect {
        Dialect::Postgres => (
            "TEXT PRIMARY KEY",
            "DOUBLE PRECISION NOT NULL",
            "BIGINT NOT NULL",
        ),
        Dialect::MySql => (
            "VARCHAR(255) PRIMARY KEY",
            "DOUBLE NOT NULL",
            "BIGINT NOT NULL",
        ),
        Dialect::Sqlite => ("TEXT PRIMARY KEY", "REAL NOT NULL", "INTEGER NOT NULL"),
    };
    let columns = [
        ("name", key),
        ("tokens", real),
        ("refilled_at", real),
        ("granted", int),
    ];
    create_table(dialect, name, &columns, &[])
}

/// The schedules table `name`: each schedule's last tick.
pub(crate) fn schedules_table(dialect: Dialect, name: &str) -> Result<String> {
    let (key, time) = match dialect {
        Dialect::Postgres => ("TEXT PRIMARY KEY", "TIMESTAMPTZ NOT NULL"),
        Dialect::MySql => ("VARCHAR(255) PRIMARY KEY", "DATETIME(6) NOT NULL"),
        Dialect::Sqlite => ("TEXT PRIMARY KEY", "TEXT NOT NULL"),
    };
    create_table(dialect, name, &[("name", key), ("last_tick", time)], &[])
}

/// The statements creating `table` (as declared) in `plan`, each ending in `;`, on one line
/// each: the fix an [`Error::Schema`] for a missing table names.
pub(crate) fn fix_for(dialect: Dialect, plan: &Plan, table: &str) -> Option<String> {
    let k = key(table).ok()?;
    let statements: Vec<String> = plan
        .render(dialect)
        .ok()?
        .into_iter()
        .filter(|c| key(&c.table).ok().as_ref() == Some(&k))
        .map(|c| format!("{};", c.sql))
        .collect();
    (!statements.is_empty()).then(|| statements.join("\n"))
}

/// `ALTER TABLE table ADD COLUMN column definition`: the column of `plan`'s queue table
/// `table` with the type the declaration gives it (`None` for the id column, which cannot be
/// added, and SQLite's creation time, whose default an added column cannot have).
pub(crate) fn add_column(
    dialect: Dialect,
    plan: &Plan,
    table: &str,
    column: &str,
) -> Option<String> {
    let k = key(table).ok()?;
    let jobs = plan
        .jobs
        .iter()
        .find(|j| key(&j.name).ok().as_ref() == Some(&k))?;
    let (name, role) = jobs
        .columns
        .iter()
        .find(|(c, _)| dialect.same_column(c, column))?;
    if *role == Role::Id || (*role == Role::CreatedAt && dialect == Dialect::Sqlite) {
        return None;
    }
    add_typed(dialect, table, name, role.definition(dialect)).ok()
}

/// `ALTER TABLE table ADD COLUMN column ty;`.
pub(crate) fn add_typed(dialect: Dialect, table: &str, column: &str, ty: &str) -> Result<String> {
    Ok(format!(
        "ALTER TABLE {} ADD COLUMN {} {ty};",
        dialect.quote_table(table)?,
        dialect.quote(column)?
    ))
}

/// The unique key's index of `table` (a queue table as declared): `CREATE UNIQUE INDEX`
/// (partial on unfinished rows where the table keeps them), on MySQL/MariaDB `ALTER TABLE ..
/// ADD UNIQUE INDEX`; `None` without a unique key column.
pub(crate) fn unique_index(dialect: Dialect, table: &Table) -> Option<String> {
    let key = table.unique_key.as_deref()?;
    let processed = table.processed_at.as_deref();
    let suffix = if key == "claim" { "claim_unique" } else { key };
    let index = index(dialect, &table.name, suffix, true, &[key], processed).ok()?;
    Some(match dialect {
        Dialect::MySql => format!(
            "ALTER TABLE {} ADD {};",
            dialect.quote_table(&table.name).ok()?,
            index.inline
        ),
        _ => format!("{};", index.create),
    })
}

#[cfg(test)]
mod tests;
