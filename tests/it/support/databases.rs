//! The databases the tests run on: on top of what the reliability suite shares with them
//! (`common::databases`), what each needs written its own way (connections, triggers), and the
//! calls a generic test cannot make itself (sqlx's executor and decode bounds do not follow a
//! generic `DB`): statements on a transaction or a delivery's connection, enqueues there, and the
//! columns of a row.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx_queue::{Backend, Job, Table};

use super::common::databases::{Db, Spec, create_table};

/// A value `TestDb::rows` binds to a placeholder.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bind<'a> {
    Text(&'a str),
    Int(i64),
    Time(DateTime<Utc>),
}

/// A row of one of the databases, read by column (`Row::try_get` as each database's own row
/// type has it).
pub(crate) trait TestRow: sqlx::Row {
    fn int(&self, column: &str) -> sqlx::Result<i64>;
    fn blob(&self, column: &str) -> sqlx::Result<Vec<u8>>;
    fn text(&self, column: &str) -> sqlx::Result<String>;
    fn text_or_null(&self, column: &str) -> sqlx::Result<Option<String>>;
    fn text_at(&self, index: usize) -> sqlx::Result<String>;
}

macro_rules! test_row {
    ($($row:ty),*) => {$(
        impl TestRow for $row {
            fn int(&self, column: &str) -> sqlx::Result<i64> {
                sqlx::Row::try_get(self, column)
            }

            fn blob(&self, column: &str) -> sqlx::Result<Vec<u8>> {
                sqlx::Row::try_get(self, column)
            }

            fn text(&self, column: &str) -> sqlx::Result<String> {
                sqlx::Row::try_get(self, column)
            }

            fn text_or_null(&self, column: &str) -> sqlx::Result<Option<String>> {
                sqlx::Row::try_get(self, column)
            }

            fn text_at(&self, index: usize) -> sqlx::Result<String> {
                sqlx::Row::try_get(self, index)
            }
        }
    )*};
}

test_row!(
    sqlx::sqlite::SqliteRow,
    sqlx::postgres::PgRow,
    sqlx::mysql::MySqlRow
);

/// A database the tests run against. A test is written once, generic over it: what differs
/// between the databases is an item here or of `Db`, or a branch on `LABEL`.
pub(crate) trait TestDb: Db + Backend<Row: TestRow> {
    fn connect(url: Option<&str>, max: u32) -> impl Future<Output = Pool<Self>> + Send {
        Self::connect_with(url, sqlx::pool::PoolOptions::new().max_connections(max))
    }

    /// A pool of `options` (a 20 s acquire timeout added).
    fn connect_with(
        url: Option<&str>,
        options: sqlx::pool::PoolOptions<Self>,
    ) -> impl Future<Output = Pool<Self>> + Send {
        let connect = Self::connect_options(url.expect("a URL"));
        async move {
            options
                .acquire_timeout(Duration::from_secs(20))
                .connect_with(connect)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", Self::LABEL))
        }
    }

    /// `CREATE TABLE table` with `spec`'s columns.
    fn ddl(table: &str, spec: Spec) -> String {
        create_table::<Self>(table, spec, Self::INT)
    }

    /// A trigger that refuses every `op` (`DELETE`, `INSERT`) on `table`.
    fn refusing(table: &str, op: &str) -> String;
    fn text(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<String>> + Send;
    /// The rows of `sql` (in the database's own placeholders), with `binds` bound in order.
    fn rows(
        pool: &Pool<Self>,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = sqlx::Result<Vec<Self::Row>>> + Send;
    /// Runs `sql` on `conn` as a prepared statement, as `sqlx::query`.
    fn query_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn count_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn text_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<String>> + Send;
    /// `Queue::enqueue` on `conn` (a transaction or a delivery's), into an unnamed queue.
    fn enqueue_on(
        conn: &mut Self::Connection,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    /// `Queue::enqueue_many` on `conn`: how many it enqueued.
    fn enqueue_many_on(
        conn: &mut Self::Connection,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
}

/// The calls of `TestDb`, written once for every database.
macro_rules! test_db_calls {
    () => {
        async fn text(pool: &Pool<Self>, sql: &str) -> sqlx::Result<String> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }

        async fn rows(
            pool: &Pool<Self>,
            sql: &str,
            binds: &[Bind<'_>],
        ) -> sqlx::Result<Vec<Self::Row>> {
            let mut query = sqlx::query::<Self>(sqlx::AssertSqlSafe(sql));
            for bind in binds {
                query = match *bind {
                    Bind::Text(text) => query.bind(text),
                    Bind::Int(n) => query.bind(n),
                    Bind::Time(time) => query.bind(time),
                };
            }
            query.fetch_all(pool).await
        }

        async fn query_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(conn).await?;
            Ok(())
        }

        async fn count_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<i64> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(conn)
                .await
        }

        async fn text_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<String> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(conn)
                .await
        }

        async fn enqueue_on(
            conn: &mut Self::Connection,
            table: &Table,
            job: Job<'_>,
        ) -> sqlx_queue::Result<i64> {
            sqlx_queue::Queue::table(table.clone())
                .enqueue(conn, job)
                .await
        }

        async fn enqueue_many_on(
            conn: &mut Self::Connection,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            let queue = sqlx_queue::Queue::table(table.clone());
            let ids = queue.enqueue_many(conn, jobs).await?;
            Ok(ids.len() as u64)
        }
    };
}

impl TestDb for sqlx::Sqlite {
    test_db_calls!();

    fn refusing(table: &str, op: &str) -> String {
        format!(
            "CREATE TRIGGER {table}_no_{op} BEFORE {op} ON {table} \
             BEGIN SELECT RAISE(ABORT, '{op} refused'); END"
        )
    }
}

impl TestDb for sqlx::Postgres {
    test_db_calls!();

    fn refusing(table: &str, op: &str) -> String {
        format!(
            "CREATE FUNCTION {table}_refuse_{op}() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION '{op} refused'; END $$; \
             CREATE TRIGGER {table}_no_{op} BEFORE {op} ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_refuse_{op}()"
        )
    }
}

impl TestDb for sqlx::MySql {
    test_db_calls!();

    fn refusing(table: &str, op: &str) -> String {
        format!(
            "CREATE TRIGGER {table}_no_{op} BEFORE {op} ON {table} FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{op} refused'"
        )
    }
}
