//! PostgreSQL's driver calls: statements prepared with their parameter types, notifications.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{Pool, Postgres, SqlStr};

use super::driver::Driver;
use super::{Backend, InsertFailed, Listener, Notification, Q};
use crate::table::{Dialect, Value, ValueKind};

impl Backend for Postgres {}

impl Driver for Postgres {
    const DIALECT: Dialect = Dialect::Postgres;

    driver_common!();

    async fn pin(conn: &mut Self::Connection, unprepared: bool) -> Result<bool, sqlx::Error> {
        use sqlx_core::transaction::TransactionManager as _;
        type Manager = <Postgres as sqlx::Database>::TransactionManager;
        if !unprepared || Manager::get_transaction_depth(conn) > 0 {
            return Ok(false);
        }
        Manager::begin(conn, None).await?;
        Ok(true)
    }

    async fn forget_prepared(conn: &mut Self::Connection) -> Result<(), sqlx::Error> {
        sqlx::Connection::clear_cached_statements(conn).await
    }

    async fn unpin(
        conn: &mut Self::Connection,
        pinned: bool,
        succeeded: bool,
    ) -> Result<(), sqlx::Error> {
        use sqlx_core::transaction::TransactionManager as _;
        type Manager = <Postgres as sqlx::Database>::TransactionManager;
        match (pinned, succeeded) {
            (false, _) => Ok(()),
            (true, true) => Manager::commit(conn).await,
            // The statement's own error is the one reported; a connection whose rollback fails
            // is broken, and the caller gives it back after the error.
            (true, false) => Manager::rollback(conn).await.or(Ok(())),
        }
    }

    /// Prepared with the parameter types the statement is later bound with: sqlx caches the
    /// prepared statement, and a type PostgreSQL inferred instead (`int4` for an `INTEGER`
    /// id, say) would refuse the `int8` bound later.
    ///
    /// A statement that runs unprepared (behind a transaction pooler) is checked by SQL's own
    /// `PREPARE`, under a name of this process's, and deallocated in the same simple query: sqlx
    /// would prepare it as `sqlx_s_<n>`, a name another client's statement may hold on the
    /// pooler's session (sqlx numbers its statements per connection), and leave it there.
    async fn prepare(
        conn: &mut Self::Connection,
        sql: SqlStr,
        kinds: &[ValueKind],
        unprepared: bool,
    ) -> Result<(), sqlx::Error> {
        use sqlx::{Executor as _, Type};
        if unprepared {
            return check_unprepared(conn, sql.as_str(), kinds).await;
        }
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

    async fn insert_id_on(
        conn: &mut Self::Connection,
        query: Q<Self>,
    ) -> Result<i64, InsertFailed> {
        Ok(Self::execute(conn, query).await.map(|_| 0)?)
    }

    fn insert_id<'e, 'c: 'e, E>(
        executor: E,
        query: Q<Self>,
        _returning: bool,
    ) -> BoxFuture<'e, Result<i64, InsertFailed>>
    where
        E: 'e + sqlx::Executor<'c, Database = Self>,
    {
        use sqlx::Row as _;
        Box::pin(async move { Ok(query.fetch_one(executor).await?.try_get(0)?) })
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
        use sqlx::Row as _;
        // `version()`, which names the engine (CockroachDB, YugabyteDB), in one unprepared
        // statement: nothing stays prepared on the session, which a transaction pooler may hand
        // to another client next.
        let row = sqlx::raw_sql("SELECT version(), now()")
            .fetch_one(conn)
            .await?;
        Ok((row.try_get(0)?, Some(row.try_get(1)?)))
    }
}

/// Checks `sql` by `PREPARE` and `DEALLOCATE` in one simple query: nothing stays prepared.
async fn check_unprepared(
    conn: &mut sqlx::PgConnection,
    sql: &str,
    kinds: &[ValueKind],
) -> Result<(), sqlx::Error> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!("sqlxq_check_{}_{nanos:x}_{n}", std::process::id());
    let types: Vec<&str> = kinds
        .iter()
        .map(|kind| match kind {
            ValueKind::I64 => "int8",
            ValueKind::Time => "timestamptz",
            ValueKind::Text => "text",
            ValueKind::Bytes => "bytea",
        })
        .collect();
    let types = match types.is_empty() {
        true => String::new(),
        false => format!(" ({})", types.join(", ")),
    };
    // A newline before the `;`: a statement of the service's own may end in a `--` comment.
    let check = format!("PREPARE {name}{types} AS {sql}\n; DEALLOCATE {name}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(check))
        .execute(conn)
        .await?;
    Ok(())
}

impl Listener for sqlx::postgres::PgListener {
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<Notification>, sqlx::Error>> {
        Box::pin(async move {
            let received = self.try_recv().await?;
            Ok(received.map(|n| (n.channel().to_owned(), n.payload().to_owned())))
        })
    }
}
