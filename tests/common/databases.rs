//! What both test crates do on each database the same way: connect, run and count statements,
//! enqueue, and create a test table. Each crate's own `TestDb` extends `Db` with what only its
//! tests need.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx_queue::{Backend, Job, Table};

/// A database the tests run against, with the calls a generic test cannot make itself (sqlx's
/// executor and decode bounds do not follow a generic `DB`): each is written once, in `db!`,
/// for every database.
pub(crate) trait Db: Backend + Sized {
    /// The environment variable with the server's URL (`None`: SQLite, always available).
    const URL_VAR: Option<&'static str>;
    const LABEL: &'static str;
    /// The column types of a test table: its key, its payload, text, integers and times.
    const ID: &'static str;
    const BLOB: &'static str;
    const TEXT: &'static str;
    #[allow(
        dead_code,
        reason = "tests/reliability's attempt is a BIGINT everywhere"
    )]
    const INT: &'static str;
    const TIME: &'static str;
    /// A creation time column: a time the database sets when a row is inserted.
    const CREATED: &'static str;
    /// The kind of transaction setting this database takes (`Queue::isolation`).
    type Setting: sqlx_queue::state::SettingOn<Self>;

    /// `isolation` where the database takes isolation levels, else `mode` (SQLite).
    #[allow(dead_code, reason = "used by some test crates only")]
    fn setting(isolation: sqlx_queue::Isolation, mode: sqlx_queue::SqliteMode) -> Self::Setting;

    /// How a test connects to `url` (SQLite: the file `url`, in WAL mode, with a busy timeout).
    fn connect_options(url: &str) -> <Self::Connection as sqlx::Connection>::Options;
    /// Runs `sql` unprepared, as `sqlx::raw_sql`; returns the rows it affected.
    fn exec(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Runs `sql` with one `?` placeholder, bound to `time`.
    fn exec_time(
        pool: &Pool<Self>,
        sql: &str,
        time: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    fn count(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn bytes(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<Vec<u8>>> + Send;
    /// Runs `sql` on `conn` (a transaction, `&mut *tx`, or a delivery's, `&mut *d.tx()`, or one
    /// opened and ended with plain statements) unprepared, as `sqlx::raw_sql`.
    fn exec_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// `Queue::enqueue` on the pool, into an unnamed queue of `table`.
    fn enqueue(
        pool: &Pool<Self>,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    /// `Queue::enqueue_many` on the pool: how many it enqueued.
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
}

/// `impl Db` for each database: its constants, its connect options, and the calls, written once.
macro_rules! db {
    ($(
        $db:ty {
            URL_VAR: $url_var:expr,
            LABEL: $label:literal,
            ID: $id:literal,
            BLOB: $blob:literal,
            TEXT: $text:literal,
            INT: $int:literal,
            TIME: $time:literal,
            CREATED: $created:literal,
            Setting: $setting:ty = |$iso:ident, $mode:ident| $pick:expr,
            connect_options: |$url:ident| $options:expr $(,)?
        }
    )+) => {$(
        impl Db for $db {
            const URL_VAR: Option<&'static str> = $url_var;
            const LABEL: &'static str = $label;
            const ID: &'static str = $id;
            const BLOB: &'static str = $blob;
            const TEXT: &'static str = $text;
            const INT: &'static str = $int;
            const TIME: &'static str = $time;
            const CREATED: &'static str = $created;
            type Setting = $setting;

            fn setting(
                $iso: sqlx_queue::Isolation,
                $mode: sqlx_queue::SqliteMode,
            ) -> Self::Setting {
                $pick
            }

            fn connect_options($url: &str) -> <Self::Connection as sqlx::Connection>::Options {
                $options
            }

            async fn exec(pool: &Pool<Self>, sql: &str) -> sqlx::Result<u64> {
                let done = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
                Ok(done.rows_affected())
            }

            async fn exec_time(
                pool: &Pool<Self>,
                sql: &str,
                time: DateTime<Utc>,
            ) -> sqlx::Result<u64> {
                let sql = placeholders::<Self>(sql);
                let done = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(time).execute(pool).await?;
                Ok(done.rows_affected())
            }

            async fn count(pool: &Pool<Self>, sql: &str) -> sqlx::Result<i64> {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(pool).await
            }

            async fn bytes(pool: &Pool<Self>, sql: &str) -> sqlx::Result<Vec<u8>> {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).fetch_one(pool).await
            }

            async fn exec_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<u64> {
                let done = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(conn).await?;
                Ok(done.rows_affected())
            }

            async fn enqueue(
                pool: &Pool<Self>,
                table: &Table,
                job: Job<'_>,
            ) -> sqlx_queue::Result<i64> {
                // An unnamed queue of the table, without a form: a plain enqueue needs none.
                sqlx_queue::Queue::table(table.clone()).enqueue(pool, job).await
            }

            async fn enqueue_many(
                pool: &Pool<Self>,
                table: &Table,
                jobs: &[Job<'_>],
            ) -> sqlx_queue::Result<u64> {
                let queue = sqlx_queue::Queue::table(table.clone());
                let ids = queue.enqueue_many(pool, jobs).await?;
                Ok(ids.len() as u64)
            }
        }
    )+};
}

db! {
    sqlx::Sqlite {
        URL_VAR: None,
        LABEL: "sqlite",
        ID: "INTEGER PRIMARY KEY",
        BLOB: "BLOB",
        TEXT: "TEXT",
        INT: "INTEGER",
        TIME: "TEXT",
        CREATED: "TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP",
        Setting: sqlx_queue::SqliteMode = |_isolation, mode| mode,
        connect_options: |url| {
            use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
            SqliteConnectOptions::new()
                .filename(url)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(10))
        },
    }
    sqlx::Postgres {
        URL_VAR: Some("SQLX_QUEUE_PG_URL"),
        LABEL: "postgres",
        ID: "BIGSERIAL PRIMARY KEY",
        BLOB: "BYTEA",
        TEXT: "TEXT",
        INT: "INT",
        TIME: "TIMESTAMPTZ",
        CREATED: "TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP",
        Setting: sqlx_queue::Isolation = |isolation, _mode| isolation,
        connect_options: |url| url.parse().expect("a PostgreSQL URL"),
    }
    sqlx::MySql {
        URL_VAR: Some("SQLX_QUEUE_MYSQL_URL"),
        LABEL: "mysql",
        ID: "BIGINT AUTO_INCREMENT PRIMARY KEY",
        BLOB: "LONGBLOB",
        TEXT: "VARCHAR(64)",
        INT: "INT",
        TIME: "DATETIME(6)",
        CREATED: "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)",
        Setting: sqlx_queue::Isolation = |isolation, _mode| isolation,
        connect_options: |url| url.parse().expect("a MySQL/MariaDB URL"),
    }
}

/// `?` placeholders as the database writes them.
pub(crate) fn placeholders<DB: Db>(sql: &str) -> String {
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

/// The columns a test table has beyond `id` and `payload`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spec {
    pub(crate) group: bool,
    pub(crate) attempt: bool,
    pub(crate) lease: bool,
    pub(crate) retry_after: bool,
    pub(crate) processed_at: bool,
    pub(crate) priority: bool,
    /// `created_at`, set by the database's default when a row is inserted.
    pub(crate) created_at: bool,
}

impl Spec {
    /// `attempt`, `locked_until` and `retry_after`: a lease queue's usual table, the guide's
    /// schema without groups.
    pub(crate) fn lease() -> Self {
        Spec {
            attempt: true,
            lease: true,
            retry_after: true,
            ..Spec::default()
        }
    }
}

/// `CREATE TABLE table` with `spec`'s columns on `DB`, its integer columns (`attempt`,
/// `priority`) of type `int`.
pub(crate) fn create_table<DB: Db>(table: &str, spec: Spec, int: &str) -> String {
    let time = DB::TIME;
    let columns = [
        (spec.group, format!("queue {}", DB::TEXT)),
        (spec.attempt, format!("attempt {int} NOT NULL DEFAULT 1")),
        (spec.lease, format!("locked_until {time}")),
        (spec.retry_after, format!("retry_after {time}")),
        (spec.processed_at, format!("processed_at {time}")),
        (spec.priority, format!("priority {int} NOT NULL DEFAULT 0")),
        (spec.created_at, format!("created_at {}", DB::CREATED)),
    ];
    let mut ddl = format!(
        "CREATE TABLE {table} (id {}, payload {} NOT NULL",
        DB::ID,
        DB::BLOB
    );
    for (wanted, column) in columns {
        if wanted {
            ddl += ", ";
            ddl += &column;
        }
    }
    ddl + ")"
}
