//! A queue's rate limiter on a connection: the grant of tokens before a claim, and the give-back
//! of the tokens of rows a claim did not find (the statements are `dialect::rate`'s).

use std::marker::PhantomData;
use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr as _};
use sqlx_core::transaction::TransactionManager as _;

use crate::backend::{self, Backend, Q};
use crate::config::{QueueConfig, RateLimit};
use crate::dialect::rate::{RateStatements, statements};
use crate::dialect::schema::limits_table;
use crate::error::{Error, Result};
use crate::table::{Pooler, Value};

/// What a grant gave: the tokens granted, and the tokens left in the bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Grant {
    pub(crate) granted: usize,
    pub(crate) left: f64,
}

/// One queue's limiter: its rendered statements and its row's key.
#[derive(Debug)]
pub(crate) struct Limiter<DB> {
    sql: RateStatements,
    key: Arc<str>,
    table: String,
    limit: RateLimit,
    /// Behind a transaction pooler (PostgreSQL) the statements run unprepared, in a
    /// transaction.
    unprepared: bool,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Backend> Limiter<DB> {
    /// The limiter of `config`'s queue, if it has a rate limit.
    pub(crate) fn new(config: &QueueConfig) -> Result<Option<Self>> {
        let (Some(limit), Some(table)) = (config.rate, config.table.limits.as_ref()) else {
            return Ok(None);
        };
        // A queue's key: its table, and its group where it serves one.
        let key = match &config.name {
            Some(group) => format!("{}:{group}", config.table.name),
            None => config.table.name.clone(),
        };
        Ok(Some(Limiter {
            sql: statements(DB::DIALECT, table, &limit)?,
            key: key.into(),
            table: table.clone(),
            limit,
            unprepared: config.table.pooler == Pooler::Transaction,
            db: PhantomData,
        }))
    }

    pub(crate) fn limit(&self) -> &RateLimit {
        &self.limit
    }

    fn query<'v>(&self, sql: &str, values: impl IntoIterator<Item = Value<'v>>) -> Q<DB> {
        let sql = AssertSqlSafe(sql.to_owned()).into_sql_str();
        backend::query::<DB>(sql, values).persistent(!self.unprepared)
    }

    /// Takes up to `want` tokens.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub(crate) async fn grant(
        &self,
        conn: &mut DB::Connection,
        want: usize,
    ) -> Result<Grant, sqlx::Error> {
        let want = i64::try_from(want).unwrap_or(i64::MAX);
        let key = Value::Text(Some(&self.key));
        let in_transaction = self.sql.grant.len() > 1 || self.unprepared;
        let upsert: Vec<Value<'_>> = std::iter::once(key)
            .chain(std::iter::repeat_n(Value::I64(want), self.sql.wants))
            .collect();
        if !in_transaction {
            let rows = DB::fetch_all(conn, self.query(&self.sql.grant[0], upsert));
            return read::<DB>(&rows.await?);
        }
        DB::TransactionManager::begin(conn, None).await?;
        let granted = async {
            let mut rows = Vec::new();
            for (i, sql) in self.sql.grant.iter().enumerate() {
                // MySQL's read after the upsert binds the key.
                let values = if i == 0 { upsert.clone() } else { vec![key] };
                rows = DB::fetch_all(conn, self.query(sql, values)).await?;
            }
            read::<DB>(&rows)
        }
        .await;
        match granted {
            Ok(granted) => {
                DB::TransactionManager::commit(conn).await?;
                Ok(granted)
            }
            Err(error) => {
                let _ = DB::TransactionManager::rollback(conn).await;
                Err(error)
            }
        }
    }

    /// Gives `n` unused tokens back.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub(crate) async fn give_back(
        &self,
        conn: &mut DB::Connection,
        n: usize,
    ) -> Result<(), sqlx::Error> {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let values = [Value::I64(n), Value::Text(Some(&self.key))];
        if self.unprepared {
            DB::TransactionManager::begin(conn, None).await?;
            let done = DB::execute(conn, self.query(&self.sql.give_back, values)).await;
            return match done {
                Ok(_) => DB::TransactionManager::commit(conn).await,
                Err(error) => {
                    let _ = DB::TransactionManager::rollback(conn).await;
                    Err(error)
                }
            };
        }
        DB::execute(conn, self.query(&self.sql.give_back, values))
            .await
            .map(drop)
    }

    /// Checks the limiter table at start: a grant of no token, which creates the queue's row.
    ///
    /// # Errors
    ///
    /// [`Error::Schema`] naming the limiter table when the grant fails.
    pub(crate) async fn check(&self, conn: &mut DB::Connection, queue: &str) -> Result<()> {
        self.grant(conn, 0).await.map(drop).map_err(|error| {
            Error::schema(
                queue,
                &self.table,
                None,
                format!(
                    "the rate limiter's table cannot be used ({error}): it needs the columns \
                     name (primary key), tokens, refilled_at and granted (`Queue::schema` creates it)"
                ),
            )
            .with_fix(
                limits_table(DB::DIALECT, &self.table)
                    .ok()
                    .map(|sql| format!("{sql};")),
            )
        })
    }
}

/// Reads a grant's one row: the tokens granted, the tokens left in millionths.
fn read<DB: Backend>(rows: &[DB::Row]) -> Result<Grant, sqlx::Error> {
    let row = rows
        .first()
        .ok_or_else(|| sqlx::Error::Protocol("the rate limiter's grant returned no row".into()))?;
    let granted = DB::get_i64(row, 0)?;
    let left = DB::get_i64(row, 1)?;
    #[allow(
        clippy::cast_precision_loss,
        reason = "millionths of a token, well within f64"
    )]
    Ok(Grant {
        granted: usize::try_from(granted).unwrap_or(0),
        left: left as f64 / 1e6,
    })
}
