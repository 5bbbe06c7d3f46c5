//! The text of each table's statements.

use super::{Jobs, Role};
use crate::error::Result;
use crate::table::{Dialect, table_parts};

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
pub(super) fn queue_table(
    dialect: Dialect,
    name: &str,
    jobs: &Jobs,
    indexed: bool,
) -> Result<Vec<String>> {
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
pub(super) struct Index {
    pub(super) create: String,
    pub(super) inline: String,
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
pub(super) fn index(
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
            "VARCHAR(255) COLLATE utf8mb4_bin PRIMARY KEY",
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
        Dialect::MySql => (
            "VARCHAR(255) COLLATE utf8mb4_bin PRIMARY KEY",
            "DATETIME(6) NOT NULL",
        ),
        Dialect::Sqlite => ("TEXT PRIMARY KEY", "TEXT NOT NULL"),
    };
    create_table(dialect, name, &[("name", key), ("last_tick", time)], &[])
}
