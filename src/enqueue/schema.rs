//! The DDL a declaration needs, as a value: printed as a migration, or run.

use std::fmt;

use futures::future::BoxFuture;
use sqlx::{Acquire, AssertSqlSafe, SqlSafeStr as _};

use crate::backend::{self, Backend};
use crate::dialect::schema::Plan;
use crate::error::Result;
use crate::table::Dialect;

/// The statements that create the tables a declaration needs: the queue table with the columns
/// of the roles declared and the indexes its claims and unique keys use, its dead-letter table,
/// its cancel requests' and limiter tables, and a runner's schedules table — each once, tables
/// whose columns copy another's after it. Made by [`Queue::schema`](crate::Queue::schema) and
/// [`Runner::schema`](crate::Runner::schema).
///
/// Every statement is idempotent (`CREATE TABLE IF NOT EXISTS`; `CREATE INDEX IF NOT EXISTS` on
/// PostgreSQL and SQLite, the indexes inside the `CREATE TABLE` on MySQL/MariaDB), but none
/// changes a table that exists: a column added to a declaration later needs an `ALTER TABLE` of
/// your own, which [`Runner::start`](crate::Runner::start)'s error names
/// ([`SchemaError::fix`](crate::SchemaError::fix)).
///
/// Print it (`{schema}`: each statement ending in `;`) into a migration, or run it with
/// [`create`](Schema::create), in tests and SQLite applications.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> sqlx_queue::Result<()> {
/// use sqlx::{Sqlite, sqlite::SqlitePoolOptions};
/// use sqlx_queue::{Job, Queue, Table};
///
/// let pool = SqlitePoolOptions::new().max_connections(1).connect("sqlite::memory:").await?;
/// let emails = Queue::table(Table::new("email_jobs").retry_after("retry_after"))
///     .lease("locked_until")
///     .attempt("attempt");
/// let schema = emails.schema::<Sqlite>()?;
/// println!("{schema}"); // CREATE TABLE IF NOT EXISTS `email_jobs` (..);
/// schema.create(&pool).await?;
/// emails.enqueue(&pool, Job::new("alice@example.com")).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    statements: Vec<String>,
}

impl Schema {
    /// The statements of `plan` on `dialect`.
    pub(crate) fn of(dialect: Dialect, plan: &Plan) -> Result<Self> {
        let statements = plan.render(dialect)?.into_iter().map(|c| c.sql).collect();
        Ok(Schema { statements })
    }

    /// The statements, in the order they run, without a final `;`.
    pub fn statements(&self) -> &[String] {
        &self.statements
    }

    /// Runs the statements in order on `conn` (a pool, a connection, or `&mut *tx`; on
    /// MySQL/MariaDB each statement commits on its own, whatever the transaction). Running them
    /// again changes nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Database`](crate::Error::Database) for the first statement the database
    /// refused; the statements before it ran.
    pub fn create<'e, 'c: 'e, DB, X>(&'e self, conn: X) -> BoxFuture<'e, Result<()>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
    {
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            for statement in &self.statements {
                let sql = AssertSqlSafe(statement.clone()).into_sql_str();
                let query = backend::query::<DB>(sql, []).persistent(false);
                DB::execute(&mut conn, query).await?;
            }
            Ok(())
        })
    }
}

impl fmt::Display for Schema {
    /// The statements as a migration: each ending in `;`, a blank line between two.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, statement) in self.statements.iter().enumerate() {
            if n > 0 {
                f.write_str("\n\n")?;
            }
            write!(f, "{statement};")?;
        }
        Ok(())
    }
}
