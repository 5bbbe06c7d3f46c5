//! The databases this crate runs on, and the few driver calls it makes through them.
//!
//! sqlx's generic bounds (`for<'c> &'c mut DB::Connection: Executor<'c>`, `T: Encode<DB>` for
//! every bound type) would have to be repeated on every function that runs a statement. Instead
//! each database implements a small sealed trait here, with concrete types; the forms, the
//! runner and the enqueue functions are written once over it.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::Pool;
use sqlx::query::Query;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::dialect::{Args, Dialect, Stmt, Value};

/// A database a queue can run on: [`sqlx::Postgres`], [`sqlx::MySql`] (MySQL and MariaDB) or
/// [`sqlx::Sqlite`], each behind the crate feature of the same name.
///
/// This trait is sealed: its methods are the crate's own.
pub trait Backend: sqlx::Database + private::Driver {}

/// One claimed row, as a claim statement returns it.
#[derive(Debug)]
pub struct ClaimedRow {
    pub(crate) id: i64,
    pub(crate) payload: Vec<u8>,
    /// The delivery's number, where the queue has an attempt column.
    pub(crate) attempt: Option<i64>,
    /// The server session that holds the row (MySQL/MariaDB transactional row lock and advisory
    /// claims), so a delivery cancelled at shutdown can end it.
    pub(crate) session: Option<i64>,
    /// Why the row's payload or attempt did not decode: it never reaches the handler.
    pub(crate) undecodable: Option<String>,
}

pub(crate) type Q<DB> = Query<'static, DB, <DB as sqlx::Database>::Arguments>;

pub(crate) mod private {
    use super::*;

    /// The driver calls of one database. Public only in name: it lives in a private module.
    pub trait Driver: sqlx::Database {
        const DIALECT: Dialect;

        fn bind(query: Q<Self>, value: Value<'_>) -> Q<Self>;

        /// What a statement on `conn` waits for first: nothing, but on SQLite (see `sqlite`).
        fn gate(
            conn: &Self::Connection,
        ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
            let _ = conn;
            std::future::ready(None)
        }

        /// Runs a statement, returning the number of rows it changed.
        fn execute(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;

        /// Runs a claim, returning `(id, payload[, attempt][, session])` rows: the session is the
        /// column after the others, where the claim has one.
        fn fetch_claimed(
            conn: &mut Self::Connection,
            query: Q<Self>,
            with_attempt: bool,
        ) -> impl Future<Output = Result<Vec<ClaimedRow>, sqlx::Error>> + Send;

        /// Runs an insert on any executor, returning the new row's id (from `RETURNING` or the
        /// driver). Boxed, as sqlx's own executor methods are: an opaque future generic over the
        /// executor's lifetimes would keep a handler that enqueues through `&mut *d.tx()` from
        /// being `Send` (rust-lang/rust#100013).
        fn insert_id<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
            returning: bool,
        ) -> BoxFuture<'e, Result<i64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>;

        /// Runs a statement on any executor, returning the number of rows it changed (boxed, as
        /// `insert_id`).
        fn execute_on<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
        ) -> BoxFuture<'e, Result<u64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>;

        /// Runs a query returning four text columns (the catalog).
        fn fetch_quads(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Vec<[String; 4]>, sqlx::Error>> + Send;

        /// Runs a query, reading its first column as integers.
        fn fetch_i64s(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Vec<i64>, sqlx::Error>> + Send;

        /// Runs a query returning at most one row, and reads its first column as an integer.
        fn fetch_i64(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

        /// Runs a query returning at most one row, as it is (a row mode handler's row), without
        /// keeping it prepared.
        fn fetch_row(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;

        /// Runs a query returning at most one row, and reads its first column as text.
        fn fetch_text(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;

        /// The server setting `error` says a statement of `bytes` bytes exceeded, if it says so
        /// (MySQL/MariaDB's `max_allowed_packet`).
        fn too_large(error: &sqlx::Error, bytes: usize) -> Option<&'static str> {
            let _ = (error, bytes);
            None
        }

        /// Prepares a statement, so the server checks it.
        fn prepare(
            conn: &mut Self::Connection,
            sql: &Stmt,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// Listens for the notifications of `channels` (`(channel, table)`) on a dedicated
        /// connection, waking the table's queues in this process, until `stop`. `None` where the
        /// database has no notifications.
        fn listen(
            pool: &Pool<Self>,
            channels: Vec<(String, String)>,
            stop: CancellationToken,
        ) -> BoxFuture<'static, Result<Option<JoinHandle<()>>, sqlx::Error>> {
            let _ = (pool, channels, stop);
            Box::pin(async { Ok(None) })
        }

        /// Ends the server session `session` (a delivery's, cancelled at shutdown while a statement
        /// of its handler's may still run there), on another connection: MySQL/MariaDB only; on
        /// PostgreSQL a delivery's session ends by itself once its connection is closed (see
        /// `Dialect::begin_delivery`).
        fn end_session(
            conn: &mut Self::Connection,
            session: i64,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
            let _ = (conn, session);
            std::future::ready(Ok(()))
        }

        /// The server's version string and its clock, where it has one apart from ours.
        fn server(
            conn: &mut Self::Connection,
        ) -> impl Future<Output = Result<(String, Option<DateTime<Utc>>), sqlx::Error>> + Send;
    }
}

use private::Driver;

/// Whether `error` is a row's own: a value the statement could not compute or store, a
/// constraint or a trigger refusing the row, a value that does not decode. Anything else (a lost
/// connection, a timeout, a deadlock) is the database's, and backs off the whole queue.
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

/// Builds the query of `stmt`, binding each slot from `args`.
pub(crate) fn query<DB: Backend>(stmt: &Stmt, args: &Args<'_>) -> Q<DB> {
    let mut q = sqlx::query::<DB>(stmt.sql());
    for &slot in stmt.slots.iter() {
        q = DB::bind(q, args.value(slot));
    }
    q
}

/// Builds a query from text and values (statements rendered per call: catalog, bulk insert).
pub(crate) fn query_values<DB: Backend>(sql: sqlx::SqlStr, values: &[Value<'_>]) -> Q<DB> {
    let mut q = sqlx::query::<DB>(sql);
    for &value in values {
        q = DB::bind(q, value);
    }
    q
}

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
            Ok(query.execute(conn).await?.rows_affected())
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

        async fn fetch_claimed(
            conn: &mut Self::Connection,
            query: Q<Self>,
            with_attempt: bool,
        ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
            use sqlx::Row as _;
            let _gate = Self::gate(conn).await;
            let rows = query.fetch_all(conn).await?;
            let session = 2 + usize::from(with_attempt);
            rows.iter()
                .map(|row| {
                    // The id identifies the row; a value of the rest that does not decode marks
                    // this row alone, which the runner settles by the decode policy.
                    let id = row.try_get(0)?;
                    let rest = || -> Result<_, sqlx::Error> {
                        let attempt = match with_attempt {
                            true => Some(row.try_get(2)?),
                            false => None,
                        };
                        Ok((row.try_get(1)?, attempt))
                    };
                    let (payload, attempt, undecodable) = match rest() {
                        Ok((payload, attempt)) => (payload, attempt, None),
                        Err(error) => (Vec::new(), None, Some(error.to_string())),
                    };
                    Ok(ClaimedRow {
                        id,
                        payload,
                        attempt,
                        session: if row.len() > session {
                            Some(row.try_get(session)?)
                        } else {
                            None
                        },
                        undecodable,
                    })
                })
                .collect()
        }

        async fn fetch_quads(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Vec<[String; 4]>, sqlx::Error> {
            use sqlx::Row as _;
            let rows = query.fetch_all(conn).await?;
            rows.iter()
                .map(|row| {
                    Ok([
                        row.try_get(0)?,
                        row.try_get(1)?,
                        row.try_get(2)?,
                        row.try_get(3)?,
                    ])
                })
                .collect()
        }

        async fn fetch_i64s(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Vec<i64>, sqlx::Error> {
            use sqlx::Row as _;
            let _gate = Self::gate(conn).await;
            let rows = query.fetch_all(conn).await?;
            rows.iter().map(|row| row.try_get(0)).collect()
        }

        async fn fetch_i64(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Option<i64>, sqlx::Error> {
            use sqlx::Row as _;
            match query.fetch_optional(conn).await? {
                Some(row) => row.try_get(0),
                None => Ok(None),
            }
        }

        async fn fetch_row(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Option<Self::Row>, sqlx::Error> {
            // Not kept prepared: `SELECT *` changes with the table (PostgreSQL refuses a cached
            // plan whose result type changed).
            query.persistent(false).fetch_optional(conn).await
        }

        async fn fetch_text(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Option<String>, sqlx::Error> {
            use sqlx::Row as _;
            match query.fetch_optional(conn).await? {
                Some(row) => row.try_get(0),
                None => Ok(None),
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use sqlx::Postgres;

    impl Backend for Postgres {}

    impl Driver for Postgres {
        const DIALECT: Dialect = Dialect::Postgres;

        driver_common!();

        /// Prepared with the parameter types the statement is later bound with: sqlx caches the
        /// prepared statement, and a type PostgreSQL inferred instead (`int4` for an `INTEGER`
        /// id, say) would refuse the `int8` bound later.
        async fn prepare(conn: &mut Self::Connection, sql: &Stmt) -> Result<(), sqlx::Error> {
            use crate::dialect::Slot;
            use sqlx::{Executor as _, Type};
            let types: Vec<_> = sql
                .slots
                .iter()
                .map(|slot| match slot {
                    Slot::Id
                    | Slot::IdAt(_)
                    | Slot::Excluded(_)
                    | Slot::Limit
                    | Slot::Key
                    | Slot::KeyClass
                    | Slot::Priority => <i64 as Type<Postgres>>::type_info(),
                    Slot::Token | Slot::TokenAt(_) | Slot::NewToken | Slot::Now | Slot::At => {
                        <DateTime<Utc> as Type<Postgres>>::type_info()
                    }
                    Slot::Group
                    | Slot::KeyPrefix
                    | Slot::DeadGroup
                    | Slot::NotifyTable
                    | Slot::NotifyPayload => <&str as Type<Postgres>>::type_info(),
                    Slot::Payload => <&[u8] as Type<Postgres>>::type_info(),
                })
                .collect();
            conn.prepare_with(sql.sql(), &types).await?;
            Ok(())
        }

        fn insert_id<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
            _returning: bool,
        ) -> BoxFuture<'e, Result<i64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>,
        {
            use sqlx::Row as _;
            Box::pin(async move { query.fetch_one(executor).await?.try_get(0) })
        }

        fn listen(
            pool: &Pool<Self>,
            channels: Vec<(String, String)>,
            stop: CancellationToken,
        ) -> BoxFuture<'static, Result<Option<JoinHandle<()>>, sqlx::Error>> {
            let pool = pool.clone();
            Box::pin(async move {
                let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                listener
                    .listen_all(channels.iter().map(|(channel, _)| channel.as_str()))
                    .await?;
                Ok(Some(tokio::spawn(crate::runner::notify::relay(
                    listener, channels, stop,
                ))))
            })
        }

        async fn server(
            conn: &mut Self::Connection,
        ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
            let (version, now): (String, DateTime<Utc>) =
                sqlx::query_as("SELECT current_setting('server_version'), now()")
                    .fetch_one(conn)
                    .await?;
            Ok((version, Some(now)))
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    use sqlx::MySql;

    impl Backend for MySql {}

    impl Driver for MySql {
        const DIALECT: Dialect = Dialect::MySql;

        driver_common!();

        /// Error 1153 ("Got a packet bigger than 'max_allowed_packet' bytes") when the server's
        /// answer arrives before it closes the connection; else the connection breaks while the
        /// statement is sent, which is taken for the same cause from 1 MiB on (no server takes
        /// less than 1 KiB, hardly any less than 1 MiB; below that a broken connection is more
        /// likely something else, and is reported as it is).
        fn too_large(error: &sqlx::Error, bytes: usize) -> Option<&'static str> {
            use std::io::ErrorKind;
            let too_large = match error {
                sqlx::Error::Database(e) => e
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| e.number() == 1153),
                sqlx::Error::Io(e) => {
                    bytes >= 1 << 20
                        && matches!(
                            e.kind(),
                            ErrorKind::ConnectionReset
                                | ErrorKind::ConnectionAborted
                                | ErrorKind::BrokenPipe
                                | ErrorKind::UnexpectedEof
                        )
                }
                _ => false,
            };
            too_large.then_some("max_allowed_packet")
        }

        async fn prepare(conn: &mut Self::Connection, sql: &Stmt) -> Result<(), sqlx::Error> {
            use sqlx::Executor as _;
            conn.prepare(sql.sql()).await?;
            Ok(())
        }

        fn insert_id<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
            _returning: bool,
        ) -> BoxFuture<'e, Result<i64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>,
        {
            Box::pin(async move {
                let id = query.execute(executor).await?.last_insert_id();
                i64::try_from(id).map_err(|e| sqlx::Error::Decode(Box::new(e)))
            })
        }

        async fn end_session(conn: &mut Self::Connection, session: i64) -> Result<(), sqlx::Error> {
            // An integer, formatted: `KILL` takes no placeholder on every server.
            let kill = format!("KILL {session}");
            match sqlx::raw_sql(sqlx::AssertSqlSafe(kill)).execute(conn).await {
                // 1094: no such thread — it ended meanwhile.
                Err(sqlx::Error::Database(error))
                    if error.code().as_deref() == Some("HY000")
                        && error.message().contains("Unknown thread") =>
                {
                    Ok(())
                }
                other => other.map(drop),
            }
        }

        async fn server(
            conn: &mut Self::Connection,
        ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
            let (version, now): (String, DateTime<Utc>) =
                sqlx::query_as("SELECT CAST(VERSION() AS CHAR), UTC_TIMESTAMP(6)")
                    .fetch_one(conn)
                    .await?;
            Ok((version, Some(now)))
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use sqlx::Sqlite;

    impl Backend for Sqlite {}

    /// This process's statements on SQLite, one at a time. SQLite has one writer: when two of
    /// a runner's connections write at once, the loser sleeps in SQLite's busy handler (1 ms,
    /// then longer) for a lock held a fraction of that, and at eight workers the runner spent its
    /// time asleep. Queued here instead, each statement starts the moment the previous one ends.
    /// Statements inside a transaction are not queued: the transaction may hold the write lock
    /// a queued statement waits for.
    static STATEMENTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    impl Driver for Sqlite {
        const DIALECT: Dialect = Dialect::Sqlite;

        driver_common!();

        fn gate(
            conn: &Self::Connection,
        ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
            use sqlx_core::transaction::TransactionManager as _;
            let in_transaction =
                <Sqlite as sqlx::Database>::TransactionManager::get_transaction_depth(conn) > 0;
            async move {
                if in_transaction {
                    None
                } else {
                    Some(STATEMENTS.lock().await)
                }
            }
        }

        async fn prepare(conn: &mut Self::Connection, sql: &Stmt) -> Result<(), sqlx::Error> {
            use sqlx::Executor as _;
            conn.prepare(sql.sql()).await?;
            Ok(())
        }

        fn insert_id<'e, 'c: 'e, E>(
            executor: E,
            query: Q<Self>,
            returning: bool,
        ) -> BoxFuture<'e, Result<i64, sqlx::Error>>
        where
            E: 'e + sqlx::Executor<'c, Database = Self>,
        {
            use sqlx::Row as _;
            Box::pin(async move {
                if returning {
                    query.fetch_one(executor).await?.try_get(0)
                } else {
                    Ok(query.execute(executor).await?.last_insert_rowid())
                }
            })
        }

        async fn server(
            conn: &mut Self::Connection,
        ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
            let version: String = sqlx::query_scalar("SELECT sqlite_version()")
                .fetch_one(conn)
                .await?;
            Ok((version, None))
        }
    }
}
