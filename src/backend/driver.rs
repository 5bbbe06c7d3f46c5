//! The driver calls of one database: the sealed trait each database implements (in its own
//! file beside this one) with concrete types, so that nothing above repeats sqlx's bounds.

use super::*;

/// The driver calls of one database. Public only in name: it lives in a private module.
pub trait Driver: sqlx::Database + sqlx::database::HasStatementCache {
    const DIALECT: Dialect;

    fn bind(query: Q<Self>, value: Value<'_>) -> Q<Self>;

    /// What a statement on `conn` waits for first: nothing, but on SQLite (see `sqlite`).
    fn gate(
        conn: &Self::Connection,
    ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
        let _ = conn;
        std::future::ready(None)
    }

    /// Opens a transaction for a statement that runs unprepared (a query sqlx does not keep
    /// prepared) when `conn` is in none, so that both of its exchanges (parse, then bind and
    /// execute) reach one server session through a transaction pooler: whether it opened
    /// one. Only PostgreSQL runs statements unprepared
    /// ([`Pooler::Transaction`](crate::Pooler::Transaction)).
    fn pin(
        conn: &mut Self::Connection,
        unprepared: bool,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        let _ = (conn, unprepared);
        std::future::ready(Ok(false))
    }

    /// Ends the transaction [`pin`](Driver::pin) opened: commits it after a statement that
    /// succeeded, else rolls it back.
    fn unpin(
        conn: &mut Self::Connection,
        pinned: bool,
        succeeded: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = (conn, pinned, succeeded);
        std::future::ready(Ok(()))
    }

    /// Closes every statement sqlx keeps prepared on `conn` (PostgreSQL: before a
    /// transaction pooler lends its session to another client).
    fn forget_prepared(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send {
        let _ = conn;
        std::future::ready(Ok(()))
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

    /// Runs several statements sent together as text, values in it (a
    /// [`multi`](crate::dialect::Stmt::multi) statement, MySQL/MariaDB): each statement's rows,
    /// in order. The server stops at the first that fails, whose error this is.
    fn fetch_sets(
        conn: &mut Self::Connection,
        sql: String,
    ) -> impl Future<Output = Result<Vec<Vec<Self::Row>>, sqlx::Error>> + Send {
        async move {
            let (sets, done) = Self::fetch_sets_until(conn, sql).await;
            done.map(|()| sets)
        }
    }

    /// As [`fetch_sets`](Driver::fetch_sets), with the rows of the statements that completed
    /// before one failed: a statement's set is there once the server reported it done.
    fn fetch_sets_until(
        conn: &mut Self::Connection,
        sql: String,
    ) -> impl Future<Output = (Vec<Vec<Self::Row>>, Result<(), sqlx::Error>)> + Send;

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
    /// Bytes that may be NULL.
    fn get_bytes_or_null(row: &Self::Row, index: usize) -> Result<Option<Vec<u8>>, sqlx::Error>;
    fn get_time(
        row: &Self::Row,
        index: usize,
    ) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error>;
    /// A claimed row's creation time, for its pickup latency: `None` when it does not decode
    /// (which only loses that row's latency). SQLite reads its text form itself.
    fn get_created(row: &Self::Row, index: usize) -> Option<chrono::DateTime<chrono::Utc>> {
        Self::get_time(row, index).ok()
    }
    /// A time that may be NULL.
    fn get_time_or_null(
        row: &Self::Row,
        index: usize,
    ) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error>;

    /// Runs an insert on any executor, returning the new row's id (from `RETURNING` or the
    /// driver). Boxed, as sqlx's own executor methods are: an opaque future generic over the
    /// executor's lifetimes would keep a handler that enqueues through `&mut *d.tx()` from
    /// being `Send` (rust-lang/rust#100013).
    fn insert_id<'e, 'c: 'e, E>(
        executor: E,
        query: Q<Self>,
        returning: bool,
    ) -> BoxFuture<'e, Result<i64, InsertFailed>>
    where
        E: 'e + sqlx::Executor<'c, Database = Self>;

    /// Runs an insert on a connection, returning the id the driver reports (MySQL/MariaDB's
    /// last insert id; the others return ids with `RETURNING` and report none: 0).
    fn insert_id_on(
        conn: &mut Self::Connection,
        query: Q<Self>,
    ) -> impl Future<Output = Result<i64, InsertFailed>> + Send;

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
    /// A statement that runs `unprepared` is checked without leaving a statement prepared
    /// on the session (PostgreSQL behind a transaction pooler).
    fn prepare(
        conn: &mut Self::Connection,
        sql: SqlStr,
        kinds: &[ValueKind],
        unprepared: bool,
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
