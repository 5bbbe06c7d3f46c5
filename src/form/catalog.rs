//! What the catalog says of a table: its columns, and its identity — what other processes must
//! agree on (advisory keys, notification channels), read from the catalog rather than from the
//! name as a `Table` spells it, which differs between `jobs`, `public.jobs` and a bare name found
//! through PostgreSQL's `search_path`.

use sqlx::SqlStr;

use crate::backend::{self, Backend};
use crate::dialect;
use crate::error::{Error, Result};
use crate::table::{Dialect, table_parts};

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
pub(crate) fn find_column<'a>(
    dialect: Dialect,
    columns: &'a [Column],
    name: &str,
) -> Option<&'a Column> {
    columns
        .iter()
        .find(|column| dialect.same_column(&column.name, name))
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
        let list = backend::query::<DB>(SqlStr::from_static(dialect::sqlite_attached()), [])
            .persistent(false);
        let attached: Vec<[String; 1]> = backend::fetch_texts::<DB, 1>(conn, list).await?;
        let attached: Vec<&str> = attached
            .first()
            .map(|[names]| names.lines().collect())
            .unwrap_or_default();
        if !attached
            .iter()
            .any(|name| name.eq_ignore_ascii_case(schema))
        {
            let reason = dialect::sqlite_qualified(schema, bare, Some(&attached));
            return Err(Error::schema(queue, table, None, reason));
        }
    }
    let catalog = dialect::catalog(DB::DIALECT, table, &quoted)?;
    // Read once at start: kept prepared on no session (nor, behind a transaction pooler, on one
    // the next client gets with a statement of this connection's name on it).
    let query =
        backend::query::<DB>(SqlStr::from_static(catalog.sql), catalog.values).persistent(false);
    let rows = backend::fetch_texts::<DB, 4>(conn, query).await?;
    Ok(rows.into_iter().map(Column::from_catalog).collect())
}

/// What processes must agree on about a table, read from the catalog.
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
    let identity = dialect::identity(DB::DIALECT, table, &quoted)?;
    let query =
        backend::query::<DB>(SqlStr::from_static(identity.sql), identity.values).persistent(false);
    let found = backend::fetch_texts::<DB, 4>(conn, query).await?;
    let Some(row) = found.into_iter().next() else {
        return Err(Error::schema(
            queue,
            table,
            None,
            "the table does not exist",
        ));
    };
    Ok(Identity {
        key: dialect::identity_key(DB::DIALECT, &row),
        channel: (DB::DIALECT == Dialect::Postgres).then(|| row[1].clone()),
    })
}
