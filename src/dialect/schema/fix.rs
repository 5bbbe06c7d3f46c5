//! The fixes an [`Error::Schema`](crate::Error::Schema) names: the statements that create what
//! the start found missing.

use super::render::index;
use super::{Plan, Role, key};
use crate::error::Result;
use crate::table::{Dialect, Table};

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
