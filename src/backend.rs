//! The databases this crate runs on: the few driver calls it makes, the connection a delivery
//! holds, and the time as the database sees it.
//!
//! sqlx's generic bounds (`for<'c> &'c mut DB::Connection: Executor<'c>`, `T: Decode<DB>` for
//! every type read) would have to be repeated on every function that runs a statement. Instead
//! each database implements a small sealed trait (`driver`), with concrete types, and everything
//! above is written once over it. Nothing here knows statement text: it binds [`Value`]s and reads
//! columns by position.
//!
//! Each database's implementation is a file of its own (`postgres`, `mysql`, `sqlite`), behind
//! its feature; the held connection (`held`), the clock (`clock`) and which engine speaks the
//! dialect (`engine`) are apart too.

mod claimed;
mod clock;
pub(crate) mod driver;
mod engine;
mod held;

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{Pool, SqlStr};
use sqlx_core::transaction::TransactionManager as _;

pub(crate) use claimed::{ClaimColumns, ClaimedRow, claimed_row, claimed_rows, fetch_claimed};
pub(crate) use clock::Clock;
pub(crate) use engine::Engine;
pub(crate) use held::{HeldConn, Key, in_process};

use crate::table::{Dialect, Value, ValueKind};

/// A database a queue can run on: [`sqlx::Postgres`], [`sqlx::MySql`] (MySQL and MariaDB) or
/// [`sqlx::Sqlite`], each behind the crate feature of the same name.
///
/// This trait is sealed: its methods are the crate's own.
pub trait Backend: sqlx::Database + driver::Driver {}

pub(crate) type Q<DB> = Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// A notification a [`Listener`] received: its channel and its payload.
pub(crate) type Notification = (String, String);

/// Why an insert returned no id.
#[derive(Debug)]
pub enum InsertFailed {
    /// The driver's error.
    Driver(sqlx::Error),
    /// The id the driver reported does not fit in an `i64` (MySQL/MariaDB's last insert id is
    /// unsigned): the row was inserted.
    IdOutOfRange(u64),
}

impl From<sqlx::Error> for InsertFailed {
    fn from(error: sqlx::Error) -> Self {
        InsertFailed::Driver(error)
    }
}

/// A dedicated connection that listens for notifications (PostgreSQL).
pub trait Listener: Send {
    /// The next notification; `None` when the connection was lost and listens again (those sent
    /// meanwhile are lost).
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<Notification>, sqlx::Error>>;
}

/// Whether `conn` is inside a transaction (a caller's, when a call runs on the caller's
/// transaction).
pub(crate) fn in_transaction<DB: Backend>(conn: &DB::Connection) -> bool {
    DB::TransactionManager::get_transaction_depth(conn) > 0
}

/// Opens the transaction that the checks at start run in behind a transaction pooler, so that
/// they reach one server session (a statement prepared there is still there for its next use).
pub(crate) async fn pin_checks<DB: Backend>(
    conn: &mut PoolConnection<DB>,
) -> Result<(), sqlx::Error> {
    DB::TransactionManager::begin(conn, None).await
}

/// Ends what [`pin_checks`] opened: closes every statement the checks prepared while the session
/// is still this connection's, then rolls back (the checks write nothing). A connection where
/// that fails, or whose checks failed (a failed statement aborts the transaction), is closed
/// instead, and its session's statements go with it.
pub(crate) async fn unpin_checks<DB: Backend>(
    mut conn: PoolConnection<DB>,
    checked: bool,
) -> Result<(), sqlx::Error> {
    if checked {
        DB::forget_prepared(&mut conn).await?;
        if DB::TransactionManager::rollback(&mut conn).await.is_ok() {
            return Ok(());
        }
    }
    conn.close().await
}

/// A query of `sql`, with `values` bound in order.
pub(crate) fn query<'v, DB: Backend>(
    sql: SqlStr,
    values: impl IntoIterator<Item = Value<'v>>,
) -> Q<DB> {
    values
        .into_iter()
        .fold(sqlx::query::<DB>(sql), |q, value| DB::bind(q, value))
}

/// Runs a query, reading its first column as integers.
pub(crate) async fn fetch_i64s<DB: Backend>(
    conn: &mut DB::Connection,
    query: Q<DB>,
) -> Result<Vec<i64>, sqlx::Error> {
    let rows = DB::fetch_all(conn, query).await?;
    rows.iter().map(|row| DB::get_i64(row, 0)).collect()
}

/// Runs the insert of `rows` rows, returning their ids in the rows' order: read from its
/// `RETURNING` (PostgreSQL, SQLite; ascending is the rows' order, the ids having been given in
/// it), or, on MySQL/MariaDB, the first id the driver reports and the others after it by the
/// session's `@@auto_increment_increment` (a multi-row insert's ids are consecutive in that step).
pub(crate) async fn inserted_ids<DB: Backend>(
    conn: &mut DB::Connection,
    insert: Q<DB>,
    rows: usize,
) -> Result<Vec<i64>, InsertFailed> {
    if DB::DIALECT != Dialect::MySql {
        let mut ids = fetch_i64s::<DB>(conn, insert).await?;
        ids.sort_unstable();
        return Ok(ids);
    }
    let first = DB::insert_id_on(conn, insert).await?;
    let step = match rows {
        0 | 1 => 1,
        _ => {
            let step = query::<DB>(
                SqlStr::from_static("SELECT CAST(@@auto_increment_increment AS SIGNED)"),
                [],
            );
            fetch_i64::<DB>(conn, step).await?.unwrap_or(1)
        }
    };
    Ok((0..rows)
        .map(|row| first + step * i64::try_from(row).unwrap_or(i64::MAX))
        .collect())
}

/// Runs a query returning at most one row, reading its first column as an integer.
pub(crate) async fn fetch_i64<DB: Backend>(
    conn: &mut DB::Connection,
    query: Q<DB>,
) -> Result<Option<i64>, sqlx::Error> {
    Ok(fetch_i64s::<DB>(conn, query).await?.into_iter().next())
}

/// Runs a query returning `N` text columns (the catalog).
pub(crate) async fn fetch_texts<DB: Backend, const N: usize>(
    conn: &mut DB::Connection,
    query: Q<DB>,
) -> Result<Vec<[String; N]>, sqlx::Error> {
    let rows = DB::fetch_all(conn, query).await?;
    rows.iter()
        .map(|row| {
            let mut texts: [String; N] = std::array::from_fn(|_| String::new());
            for (i, text) in texts.iter_mut().enumerate() {
                *text = DB::get_text(row, i)?;
            }
            Ok(texts)
        })
        .collect()
}

/// Runs a query of one row, `(count[, time])`: how many rows are ready and the oldest one's
/// creation time (`None` without the column, or without a ready row).
pub(crate) async fn fetch_ready<DB: Backend>(
    conn: &mut DB::Connection,
    query: Q<DB>,
) -> Result<(u64, Option<DateTime<Utc>>), sqlx::Error> {
    use sqlx::Row as _;
    let rows = DB::fetch_all(conn, query).await?;
    let Some(row) = rows.first() else {
        return Ok((0, None));
    };
    let ready = DB::get_i64(row, 0)?.try_into().unwrap_or(0);
    let oldest = match row.len() > 1 {
        true => DB::get_time_or_null(row, 1)?,
        false => None,
    };
    Ok((ready, oldest))
}

/// Whether `error` is a row's own: a value the statement could not compute or store, a
/// constraint or a trigger refusing the row, a value that does not decode. Anything else (a lost
/// connection, a timeout, a deadlock) is the database's.
pub(crate) fn is_row_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => true,
        sqlx::Error::Database(db) => {
            use sqlx::error::ErrorKind;
            if !matches!(db.kind(), ErrorKind::Other) {
                return true; // unique, foreign key, not null, check
            }
            let code = db.code().unwrap_or_default();
            // SQLSTATE 22 (data exception), 23 (integrity), P0001 (PostgreSQL's RAISE), 45000
            // (MySQL's SIGNAL); SQLite's extended codes of SQLITE_CONSTRAINT (19), SQLITE_TOOBIG
            // (18) and SQLITE_MISMATCH (20).
            code.starts_with("22")
                || code.starts_with("23")
                || code == "P0001"
                || code == "45000"
                || code
                    .parse::<u32>()
                    .is_ok_and(|code| matches!(code & 0xff, 18..=20))
        }
        _ => false,
    }
}

/// The driver calls every database makes alike, through sqlx's own executor methods.
macro_rules! driver_common {
    () => {
        fn bind(query: Q<Self>, value: Value<'_>) -> Q<Self> {
            match value {
                Value::I64(v) => query.bind(v),
                Value::Bytes(v) => query.bind(v),
                Value::Text(v) => query.bind(v),
                Value::Time(v) => query.bind(v),
            }
        }

        async fn execute(conn: &mut Self::Connection, query: Q<Self>) -> Result<u64, sqlx::Error> {
            let _gate = Self::gate(conn).await;
            let pinned = Self::pin(conn, !sqlx::Execute::persistent(&query)).await?;
            let done = query.execute(&mut *conn).await;
            Self::unpin(conn, pinned, done.is_ok()).await?;
            Ok(done?.rows_affected())
        }

        async fn fetch_all(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Vec<Self::Row>, sqlx::Error> {
            let _gate = Self::gate(conn).await;
            let pinned = Self::pin(conn, !sqlx::Execute::persistent(&query)).await?;
            let rows = query.fetch_all(&mut *conn).await;
            Self::unpin(conn, pinned, rows.is_ok()).await?;
            rows
        }

        async fn fetch_sets_until(
            conn: &mut Self::Connection,
            sql: String,
        ) -> (Vec<Vec<Self::Row>>, Result<(), sqlx::Error>) {
            use futures::TryStreamExt as _;
            let _gate = Self::gate(conn).await;
            let mut sets = Vec::new();
            let mut rows = Vec::new();
            let mut results = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_many(&mut *conn);
            // A statement's rows, then its result.
            loop {
                match results.try_next().await {
                    Ok(Some(sqlx::Either::Left(_))) => sets.push(std::mem::take(&mut rows)),
                    Ok(Some(sqlx::Either::Right(row))) => rows.push(row),
                    Ok(None) => return (sets, Ok(())),
                    Err(error) => return (sets, Err(error)),
                }
            }
        }

        async fn fetch_transient(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Option<Self::Row>, sqlx::Error> {
            let pinned = Self::pin(conn, !sqlx::Execute::persistent(&query)).await?;
            let row = query.persistent(false).fetch_optional(&mut *conn).await;
            Self::unpin(conn, pinned, row.is_ok()).await?;
            row
        }

        fn get_i64(row: &Self::Row, index: usize) -> Result<i64, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn get_text(row: &Self::Row, index: usize) -> Result<String, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn get_bytes_or_null(
            row: &Self::Row,
            index: usize,
        ) -> Result<Option<Vec<u8>>, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn get_time(
            row: &Self::Row,
            index: usize,
        ) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn get_time_or_null(
            row: &Self::Row,
            index: usize,
        ) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
            sqlx::Row::try_get(row, index)
        }

        fn execute_on<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
        ) -> BoxFuture<'e, Result<u64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>,
        {
            Box::pin(async move { Ok(query.execute(executor).await?.rows_affected()) })
        }
    };
}

/// Prepares `sql` untyped (the databases that infer nothing from a prepared parameter's type).
macro_rules! prepare_untyped {
    () => {
        async fn prepare(
            conn: &mut Self::Connection,
            sql: SqlStr,
            _: &[ValueKind],
            _unprepared: bool,
        ) -> Result<(), sqlx::Error> {
            use sqlx::Executor as _;
            conn.prepare(sql).await?;
            Ok(())
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(all(test, feature = "sqlite"))]
pub(crate) use sqlite::scratch;
