//! The databases this crate runs on: the few driver calls it makes, the connection a delivery
//! holds, and the time as the database sees it.
//!
//! sqlx's generic bounds (`for<'c> &'c mut DB::Connection: Executor<'c>`, `T: Decode<DB>` for
//! every type read) would have to be repeated on every function that runs a statement. Instead
//! each database implements a small sealed trait here, with concrete types, and everything above
//! is written once over it. Nothing here knows statement text: it binds [`Value`]s and reads
//! columns by position.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, NaiveDate, SubsecRound as _, TimeDelta, Utc};
use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::query::Query;
use sqlx::{Pool, SqlStr};
use sqlx_core::transaction::TransactionManager;

use crate::table::{Dialect, Value, ValueKind};

/// A database a queue can run on: [`sqlx::Postgres`], [`sqlx::MySql`] (MySQL and MariaDB) or
/// [`sqlx::Sqlite`], each behind the crate feature of the same name.
///
/// This trait is sealed: its methods are the crate's own.
pub trait Backend: sqlx::Database + private::Driver {}

pub(crate) type Q<DB> = Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// A notification a [`Listener`] received: its channel and its payload.
pub(crate) type Notification = (String, String);

/// A dedicated connection that listens for notifications (PostgreSQL).
pub trait Listener: Send {
    /// The next notification; `None` when the connection was lost and listens again (those sent
    /// meanwhile are lost).
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<Notification>, sqlx::Error>>;
}

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

        /// Runs a query, returning its rows.
        fn fetch_all(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;

        /// Runs a query returning at most one row, without keeping it prepared (a `SELECT *`,
        /// whose result changes with the table: PostgreSQL refuses a cached plan whose result
        /// type changed).
        fn fetch_transient(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;

        fn get_i64(row: &Self::Row, index: usize) -> Result<i64, sqlx::Error>;
        fn get_bytes(row: &Self::Row, index: usize) -> Result<Vec<u8>, sqlx::Error>;
        fn get_text(row: &Self::Row, index: usize) -> Result<String, sqlx::Error>;

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

        /// The server setting `error` says a statement of `bytes` bytes exceeded, if it says so
        /// (MySQL/MariaDB's `max_allowed_packet`).
        fn too_large(error: &sqlx::Error, bytes: usize) -> Option<&'static str> {
            let _ = (error, bytes);
            None
        }

        /// Prepares a statement, so the server checks it; `kinds` are its placeholders' types.
        fn prepare(
            conn: &mut Self::Connection,
            sql: SqlStr,
            kinds: &[ValueKind],
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

        /// Listens for the notifications of `channels` on a dedicated connection; `None` where
        /// the database has no notifications.
        fn listen(
            pool: &Pool<Self>,
            channels: Vec<String>,
        ) -> BoxFuture<'static, Result<Option<Box<dyn Listener>>, sqlx::Error>> {
            let _ = (pool, channels);
            Box::pin(async { Ok(None) })
        }

        /// Ends the server session `session` (a delivery's, cancelled at shutdown while a
        /// statement of its handler's may still run there), on another connection: MySQL/MariaDB
        /// only; a PostgreSQL delivery's session ends by itself once its connection is closed
        /// (its transaction sets `client_connection_check_interval`).
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

/// One claimed row, as a claim statement returns it: `(id, payload[, attempt][, session])`.
#[derive(Debug)]
pub(crate) struct ClaimedRow {
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

/// Runs a claim and reads its rows. The id identifies a row; a value of the rest that does not
/// decode marks that row alone, which the runner settles by the decode policy.
pub(crate) async fn fetch_claimed<DB: Backend>(
    conn: &mut DB::Connection,
    query: Q<DB>,
    with_attempt: bool,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    use sqlx::Row as _;
    let rows = DB::fetch_all(conn, query).await?;
    let session = 2 + usize::from(with_attempt);
    rows.iter()
        .map(|row| {
            let id = DB::get_i64(row, 0)?;
            let rest = || -> Result<_, sqlx::Error> {
                let attempt = match with_attempt {
                    true => Some(DB::get_i64(row, 2)?),
                    false => None,
                };
                Ok((DB::get_bytes(row, 1)?, attempt))
            };
            let (payload, attempt, undecodable) = match rest() {
                Ok((payload, attempt)) => (payload, attempt, None),
                Err(error) => (Vec::new(), None, Some(error.to_string())),
            };
            let session = match row.len() > session {
                true => Some(DB::get_i64(row, session)?),
                false => None,
            };
            Ok(ClaimedRow {
                id,
                payload,
                attempt,
                session,
                undecodable,
            })
        })
        .collect()
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

/// A pooled connection a delivery keeps from its claim to its settlement: the claim's
/// transaction (row lock), the row's key (advisory lock), or the delivery's own transaction
/// (transactional mode).
///
/// Transactions are opened and ended through the driver's own transaction manager, so sqlx's
/// nesting (savepoints) stays right, and the connection outlives them (the advisory form unlocks
/// its key on the same session once the transaction ended).
///
/// Dropped while it still holds something — an open transaction or a key — the connection never
/// goes back to the pool as it is: it is closed, and the server rolls the transaction back and
/// releases the key (an in-process key is released at once).
pub(crate) struct HeldConn<DB: Backend> {
    /// Always `Some` but in `into_clean`.
    conn: Option<PoolConnection<DB>>,
    /// The keys this connection's deliveries hold (one, or a batch's).
    keys: Vec<Key>,
    /// Lent to a handler: it goes back to the pool (and its `after_release`), never kept.
    lent: bool,
}

/// A key a delivery holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// A session lock of the connection's on row `id` (PostgreSQL, MySQL/MariaDB).
    Session(i64),
    /// A key held in this process (SQLite): `(table, id)`.
    InProcess(u64, i64),
}

/// Keys held in this process (the advisory form on SQLite).
pub(crate) mod in_process {
    use std::collections::HashSet;
    use std::sync::{Mutex, MutexGuard};

    static KEYS: Mutex<Option<HashSet<(u64, i64)>>> = Mutex::new(None);

    fn keys() -> MutexGuard<'static, Option<HashSet<(u64, i64)>>> {
        KEYS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a key; `false` when it is held already.
    pub(crate) fn take(table: u64, id: i64) -> bool {
        keys()
            .get_or_insert_with(Default::default)
            .insert((table, id))
    }

    /// How many keys of `table` are held.
    pub(crate) fn count(table: u64) -> usize {
        keys()
            .as_ref()
            .map_or(0, |keys| keys.iter().filter(|(t, _)| *t == table).count())
    }

    /// Whether a key is held.
    pub(crate) fn holds(table: u64, id: i64) -> bool {
        keys()
            .as_ref()
            .is_some_and(|keys| keys.contains(&(table, id)))
    }

    pub(super) fn release(table: u64, id: i64) {
        if let Some(keys) = keys().as_mut() {
            keys.remove(&(table, id));
        }
    }
}

impl<DB: Backend> HeldConn<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        HeldConn {
            conn: Some(conn),
            keys: Vec::new(),
            lent: false,
        }
    }

    /// Opens a transaction, or a savepoint inside one; `statement` replaces the `BEGIN`.
    pub(crate) async fn begin(&mut self, statement: Option<&'static str>) -> sqlx::Result<()> {
        DB::TransactionManager::begin(self, statement.map(SqlStr::from_static)).await
    }

    /// Commits the innermost transaction (or releases the innermost savepoint).
    pub(crate) async fn commit(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::commit(self).await
    }

    /// Rolls the innermost transaction back (or back to the innermost savepoint).
    pub(crate) async fn rollback(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::rollback(self).await
    }

    /// How many transactions and savepoints are open.
    pub(crate) fn depth(&self) -> usize {
        DB::TransactionManager::get_transaction_depth(self)
    }

    /// Records that this connection's delivery holds `key`.
    pub(crate) fn hold_key(&mut self, key: Key) {
        self.keys.push(key);
    }

    /// Records that `key` was released (an in-process key is released here).
    pub(crate) fn release_key(&mut self, key: Key) {
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            self.keys.swap_remove(i);
            if let Key::InProcess(table, id) = key {
                in_process::release(table, id);
            }
        }
    }

    /// Marks the connection lent to a handler (a transactional delivery's).
    pub(crate) fn lend(&mut self) {
        self.lent = true;
    }

    /// The pooled connection, when it holds nothing any more (no transaction, no key) and ran
    /// nothing of a handler's.
    pub(crate) fn into_clean(mut self) -> Option<PoolConnection<DB>> {
        if self.keys.is_empty() && self.depth() == 0 && !self.lent {
            self.conn.take()
        } else {
            None
        }
    }
}

impl<DB: Backend> Deref for HeldConn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("taken only when dropped")
    }
}

impl<DB: Backend> DerefMut for HeldConn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("taken only when dropped")
    }
}

impl<DB: Backend> Drop for HeldConn<DB> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut close = DB::TransactionManager::get_transaction_depth(conn) > 0;
        for key in std::mem::take(&mut self.keys) {
            match key {
                Key::InProcess(table, id) => in_process::release(table, id),
                Key::Session(_) => close = true,
            }
        }
        if close {
            conn.close_on_drop();
        }
    }
}

impl<DB: Backend> fmt::Debug for HeldConn<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldConn")
            .field("depth", &self.depth())
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The time as the database sees it: this host's clock corrected by its offset to the server's
/// clock, measured at start and again every minute while the runner runs (so a step of this
/// host's clock does not shorten or lengthen leases for long), so that leases and delays written
/// by runners on several hosts agree. Times are kept to the microsecond, the precision PostgreSQL
/// and MySQL store, and never beyond the year 9999, the last MySQL and SQLite text order keep.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    offset_micros: Arc<AtomicI64>,
}

impl Clock {
    /// Corrects the clock by `server_now`, read by a query that started at `sent` and answered
    /// at `received` (this host's times).
    pub(crate) fn measure(
        &self,
        sent: DateTime<Utc>,
        received: DateTime<Utc>,
        server_now: DateTime<Utc>,
    ) {
        let midpoint = sent + (received - sent) / 2;
        let offset = (server_now - midpoint).num_microseconds().unwrap_or(0);
        self.offset_micros.store(offset, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        let offset = TimeDelta::microseconds(self.offset_micros.load(Ordering::Relaxed));
        (Utc::now() + offset).trunc_subsecs(6)
    }

    /// `now` plus `delay`, to the microsecond.
    pub(crate) fn after(&self, delay: std::time::Duration) -> DateTime<Utc> {
        let last = NaiveDate::from_ymd_opt(9999, 12, 31)
            .and_then(|day| day.and_hms_opt(23, 59, 59))
            .expect("a valid date")
            .and_utc();
        TimeDelta::from_std(delay)
            .ok()
            .and_then(|delay| self.now().checked_add_signed(delay))
            .map_or(last, |at| at.min(last))
            .trunc_subsecs(6)
    }
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

        async fn fetch_all(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Vec<Self::Row>, sqlx::Error> {
            let _gate = Self::gate(conn).await;
            query.fetch_all(conn).await
        }

        async fn fetch_transient(
            conn: &mut Self::Connection,
            query: Q<Self>,
        ) -> Result<Option<Self::Row>, sqlx::Error> {
            query.persistent(false).fetch_optional(conn).await
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
        ) -> Result<(), sqlx::Error> {
            use sqlx::Executor as _;
            conn.prepare(sql).await?;
            Ok(())
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
        async fn prepare(
            conn: &mut Self::Connection,
            sql: SqlStr,
            kinds: &[ValueKind],
        ) -> Result<(), sqlx::Error> {
            use sqlx::{Executor as _, Type};
            let types: Vec<_> = kinds
                .iter()
                .map(|kind| match kind {
                    ValueKind::I64 => <i64 as Type<Postgres>>::type_info(),
                    ValueKind::Time => <DateTime<Utc> as Type<Postgres>>::type_info(),
                    ValueKind::Text => <&str as Type<Postgres>>::type_info(),
                    ValueKind::Bytes => <&[u8] as Type<Postgres>>::type_info(),
                })
                .collect();
            conn.prepare_with(sql, &types).await?;
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
            channels: Vec<String>,
        ) -> BoxFuture<'static, Result<Option<Box<dyn Listener>>, sqlx::Error>> {
            let pool = pool.clone();
            Box::pin(async move {
                let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
                listener
                    .listen_all(channels.iter().map(String::as_str))
                    .await?;
                Ok(Some(Box::new(listener) as Box<dyn Listener>))
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

    impl Listener for sqlx::postgres::PgListener {
        fn recv(&mut self) -> BoxFuture<'_, Result<Option<Notification>, sqlx::Error>> {
            Box::pin(async move {
                let received = self.try_recv().await?;
                Ok(received.map(|n| (n.channel().to_owned(), n.payload().to_owned())))
            })
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
        prepare_untyped!();

        /// MySQL and MariaDB refuse a statement larger than their `max_allowed_packet` with
        /// error 1153 — or, when they close the connection first, with a reset while the
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
        prepare_untyped!();

        fn gate(
            conn: &Self::Connection,
        ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
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

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike as _;

    #[test]
    fn the_clock_follows_the_server() {
        let sent = Utc::now();
        let received = sent + TimeDelta::milliseconds(10);
        let server = sent + TimeDelta::seconds(60);
        let clock = Clock::default();
        clock.measure(sent, received, server);
        let skew = clock.now() - Utc::now();
        assert!(skew > TimeDelta::seconds(59) && skew < TimeDelta::seconds(61));
        assert_eq!(clock.now().timestamp_subsec_nanos() % 1000, 0);
    }

    #[test]
    fn far_delays_stop_at_the_year_9999() {
        let clock = Clock::default();
        assert_eq!(clock.after(std::time::Duration::MAX).year(), 9999);
        let soon = clock.after(std::time::Duration::MAX.min(std::time::Duration::from_secs(1)));
        assert!(soon > clock.now() && soon.year() < 9999);
    }
}
