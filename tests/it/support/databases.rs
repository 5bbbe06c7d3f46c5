//! The databases the tests run on: what each needs written its own way (connections, DDL,
//! triggers), the few statements the tests assert with, and the calls a generic test cannot make
//! itself (sqlx's executor and decode bounds do not follow a generic `DB`): enqueues, statements
//! on a transaction or a delivery's connection, and the columns of a row.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx_queue::{Backend, Job, Table};

/// The columns a test table has beyond `id` and `payload`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spec {
    pub(crate) group: bool,
    pub(crate) attempt: bool,
    pub(crate) lease: bool,
    pub(crate) retry_after: bool,
    pub(crate) processed_at: bool,
    pub(crate) priority: bool,
}

impl Spec {
    /// `attempt`, `locked_until` and `retry_after`: a lease queue's usual table.
    pub(crate) fn lease() -> Self {
        Spec {
            attempt: true,
            lease: true,
            retry_after: true,
            ..Spec::default()
        }
    }
}

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
/// between the databases is an item here, or a branch on `LABEL`.
pub(crate) trait TestDb: Backend<Row: TestRow> + Sized {
    /// The environment variable with the server's URL (`None`: SQLite, always available).
    const URL_VAR: Option<&'static str>;
    const LABEL: &'static str;
    /// The type of time columns.
    const TIME: &'static str;

    /// How a test connects (SQLite: a file in WAL mode, with a busy timeout).
    fn connect_options(url: Option<&str>) -> <Self::Connection as sqlx::Connection>::Options;

    fn connect(url: Option<&str>, max: u32) -> impl Future<Output = Pool<Self>> + Send {
        Self::connect_with(url, sqlx::pool::PoolOptions::new().max_connections(max))
    }

    /// A pool of `options` (a 20 s acquire timeout added).
    fn connect_with(
        url: Option<&str>,
        options: sqlx::pool::PoolOptions<Self>,
    ) -> impl Future<Output = Pool<Self>> + Send {
        let connect = Self::connect_options(url);
        async move {
            options
                .acquire_timeout(Duration::from_secs(20))
                .connect_with(connect)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", Self::LABEL))
        }
    }
    /// A trigger that makes every `DELETE` on `table` fail.
    fn failing_delete(table: &str) -> String;
    fn exec(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn exec_time(
        pool: &Pool<Self>,
        sql: &str,
        time: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn count(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn bytes(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<Vec<u8>>> + Send;
    fn text(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<String>> + Send;
    /// The rows of `sql` (in the database's own placeholders), with `binds` bound in order.
    fn rows(
        pool: &Pool<Self>,
        sql: &str,
        binds: &[Bind<'_>],
    ) -> impl Future<Output = sqlx::Result<Vec<Self::Row>>> + Send;
    /// Runs `sql` on `conn` (a transaction, `&mut *tx`, or a delivery's, `&mut *d.tx()`)
    /// unprepared, as `sqlx::raw_sql`.
    fn exec_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
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
    /// `Table::enqueue` on the pool.
    fn enqueue(
        pool: &Pool<Self>,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    /// `Table::enqueue_many` on the pool.
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    /// `Table::enqueue` on `conn` (a transaction or a delivery's).
    fn enqueue_on(
        conn: &mut Self::Connection,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    /// `Table::enqueue_many` on `conn`.
    fn enqueue_many_on(
        conn: &mut Self::Connection,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    fn ddl(table: &str, spec: Spec) -> String;
}

macro_rules! test_db_common {
    () => {
        async fn exec(pool: &Pool<Self>, sql: &str) -> sqlx::Result<()> {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn exec_time(pool: &Pool<Self>, sql: &str, time: DateTime<Utc>) -> sqlx::Result<()> {
            sqlx::query(sqlx::AssertSqlSafe(placeholders::<Self>(sql)))
                .bind(time)
                .execute(pool)
                .await?;
            Ok(())
        }

        async fn count(pool: &Pool<Self>, sql: &str) -> sqlx::Result<i64> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }

        async fn bytes(pool: &Pool<Self>, sql: &str) -> sqlx::Result<Vec<u8>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }

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

        async fn exec_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<()> {
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(conn)
                .await?;
            Ok(())
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

        async fn enqueue(
            pool: &Pool<Self>,
            table: &Table,
            job: Job<'_>,
        ) -> sqlx_queue::Result<i64> {
            table.enqueue(pool, job).await
        }

        async fn enqueue_many(
            pool: &Pool<Self>,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            table.enqueue_many(pool, jobs).await
        }

        async fn enqueue_on(
            conn: &mut Self::Connection,
            table: &Table,
            job: Job<'_>,
        ) -> sqlx_queue::Result<i64> {
            table.enqueue(conn, job).await
        }

        async fn enqueue_many_on(
            conn: &mut Self::Connection,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            table.enqueue_many(conn, jobs).await
        }
    };
}

/// `?` placeholders as the database writes them.
fn placeholders<DB: TestDb>(sql: &str) -> String {
    if DB::LABEL != "postgres" {
        return sql.to_owned();
    }
    let mut n = 0;
    sql.chars()
        .map(|c| {
            if c == '?' {
                n += 1;
                format!("${n}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

impl TestDb for sqlx::Sqlite {
    const URL_VAR: Option<&'static str> = None;
    const LABEL: &'static str = "sqlite";
    const TIME: &'static str = "TEXT";

    fn connect_options(url: Option<&str>) -> sqlx::sqlite::SqliteConnectOptions {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
        SqliteConnectOptions::new()
            .filename(url.expect("a file"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10))
    }

    test_db_common!();

    fn failing_delete(table: &str) -> String {
        format!(
            "CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} \
             BEGIN SELECT RAISE(ABORT, 'deletes refused'); END"
        )
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id INTEGER PRIMARY KEY",
            "BLOB NOT NULL",
            "TEXT",
            "INTEGER",
            Self::TIME,
        )
    }
}

impl TestDb for sqlx::Postgres {
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");
    const LABEL: &'static str = "postgres";
    const TIME: &'static str = "TIMESTAMPTZ";

    fn connect_options(url: Option<&str>) -> sqlx::postgres::PgConnectOptions {
        url.expect("a URL").parse().expect("SQLX_QUEUE_PG_URL")
    }

    test_db_common!();

    fn failing_delete(table: &str) -> String {
        format!(
            "CREATE FUNCTION {table}_refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'deletes refused'; END $$; \
             CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} \
             FOR EACH ROW EXECUTE FUNCTION {table}_refuse()"
        )
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id BIGSERIAL PRIMARY KEY",
            "BYTEA NOT NULL",
            "TEXT",
            "INT",
            Self::TIME,
        )
    }
}

impl TestDb for sqlx::MySql {
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");
    const LABEL: &'static str = "mysql";
    const TIME: &'static str = "DATETIME(6)";

    fn connect_options(url: Option<&str>) -> sqlx::mysql::MySqlConnectOptions {
        url.expect("a URL").parse().expect("SQLX_QUEUE_MYSQL_URL")
    }

    test_db_common!();

    fn failing_delete(table: &str) -> String {
        format!(
            "CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} FOR EACH ROW \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'deletes refused'"
        )
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id BIGINT AUTO_INCREMENT PRIMARY KEY",
            "LONGBLOB NOT NULL",
            "VARCHAR(64)",
            "INT",
            Self::TIME,
        )
    }
}

fn columns(
    table: &str,
    spec: Spec,
    id: &str,
    payload: &str,
    text: &str,
    int: &str,
    time: &str,
) -> String {
    let mut ddl = format!("CREATE TABLE {table} ({id}, payload {payload}");
    if spec.group {
        ddl += &format!(", queue {text}");
    }
    if spec.attempt {
        ddl += &format!(", attempt {int} NOT NULL DEFAULT 1");
    }
    if spec.lease {
        ddl += &format!(", locked_until {time}");
    }
    if spec.retry_after {
        ddl += &format!(", retry_after {time}");
    }
    if spec.processed_at {
        ddl += &format!(", processed_at {time}");
    }
    if spec.priority {
        ddl += &format!(", priority {int} NOT NULL DEFAULT 0");
    }
    ddl + ")"
}
