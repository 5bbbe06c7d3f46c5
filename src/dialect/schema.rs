//! The DDL of the tables a declaration needs, as text: the queue table with exactly the roles
//! declared (the types the start checks accept), its claim index and unique key index, its
//! dead-letter table, its cancel requests' and limiter tables, and the schedules table. Every
//! statement is idempotent: `CREATE TABLE IF NOT EXISTS`, and `CREATE INDEX IF NOT EXISTS` on
//! PostgreSQL and SQLite; MySQL/MariaDB, which has no `CREATE INDEX IF NOT EXISTS` (MySQL 8),
//! gets its indexes inside the `CREATE TABLE`.

use super::Dialect;
use crate::config::QueueConfig;
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
    /// Where the column stands in the table: the guide's order (`docs/guide/table.md`).
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
            (Role::Group, MySql) => "VARCHAR(255) COLLATE utf8mb4_bin NOT NULL",
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
            (Role::Key, MySql) => "VARCHAR(255) COLLATE utf8mb4_bin NULL",
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

    /// Adds a mounted queue: its table (with the lease column of its form, which the mount
    /// wrote there), its attempt column and its dead letter.
    pub(crate) fn mounted(&mut self, config: &QueueConfig) -> Result<()> {
        self.queue(
            &config.table,
            config.attempt.as_deref(),
            config.dead_letter(),
        )
    }

    /// The plan of one mounted queue, for the fixes its errors name (empty where the
    /// declaration cannot be rendered: that error is said elsewhere).
    pub(crate) fn of(config: &QueueConfig) -> Self {
        let mut plan = Plan::default();
        if plan.mounted(config).is_err() {
            return Plan::default();
        }
        plan
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

mod fix;
mod render;

pub(crate) use fix::{add_column, add_typed, fix_for, unique_index};
use render::queue_table;
pub(crate) use render::{limits_table, requests_table, schedules_table};

#[cfg(test)]
mod tests;
