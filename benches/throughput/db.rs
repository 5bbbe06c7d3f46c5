//! The databases: the few driver calls the bench makes, per database, and one database's
//! context (where it is, its table).

use std::future::Future;
use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AssertSqlSafe, ConnectOptions as _, Pool};
use sqlx_queue::{Backend, Job, Queue, Runner, Table};

use crate::baseline::Baseline;
use crate::drain::Progress;
use crate::grid::{Cell, Form};
use crate::krate::mount;
use crate::wire::Wire;

/// sqlx's `PoolOptions::test_before_acquire` for every pool of the bench (both sides): sqlx
/// pings an idle connection each time it is acquired unless this is off
/// (`--no-test-before-acquire`).
pub(crate) static TEST_BEFORE_ACQUIRE: AtomicBool = AtomicBool::new(true);

/// The few driver calls the bench makes, per database, with concrete types; its baseline
/// worker is [`Baseline::work`].
pub(crate) trait Db: Backend + Baseline {
    /// The database's name in options and output.
    const ID: &'static str;
    /// The variable with the server's URL (`None`: SQLite, in a temporary file).
    const URL_VAR: Option<&'static str>;
    /// The claim forms the crate offers on the database.
    const FORMS: &'static [Form];
    /// Its protocol, where round trips are counted on the wire.
    const WIRE: Option<Wire>;

    /// The connect options of `url`, through the counting proxy at local port `proxy` (without
    /// TLS) when there is one.
    fn options(url: &str, proxy: Option<u16>) -> sqlx::Result<Options<Self>>;
    /// A pool of `max` connections to `url`, counting or not.
    fn connect(
        url: &str,
        max: u32,
        counting: Counting,
    ) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send {
        let options = match counting {
            Counting::Off => Self::options(url, None).map(|o| o.disable_statement_logging()),
            Counting::On(proxy) => Self::options(url, proxy),
        };
        async move { pool_options(max).connect_with(options?).await }
    }
    /// The server's host and TCP port in `url`.
    fn server_address(url: &str) -> Option<(String, u16)>;
    fn create_table(table: &str) -> String;
    fn script(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn scalar(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn text(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<String>> + Send;
    /// [`Table::enqueue_many`] on the pool (written per database: the executor bound is
    /// concrete).
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    /// Mounts the crate's queue of `cell` on the runner.
    fn mount(
        runner: Runner<Self>,
        table: Table,
        cell: Cell,
        progress: &Arc<Progress>,
    ) -> Runner<Self>;
}

/// A database's connect options.
type Options<DB> = <<DB as sqlx::Database>::Connection as sqlx::Connection>::Options;

/// `Db::options` and `Db::server_address` of a database server, its connect options `$options`
/// (from a URL), their TLS off `$no_tls`.
macro_rules! server {
    ($options:ty, $no_tls:expr) => {
        fn options(url: &str, proxy: Option<u16>) -> sqlx::Result<$options> {
            let options = <$options>::from_str(url)?;
            Ok(match proxy {
                Some(port) => options.host("127.0.0.1").port(port).ssl_mode($no_tls),
                None => options,
            })
        }

        fn server_address(url: &str) -> Option<(String, u16)> {
            let options = <$options>::from_str(url).ok()?;
            // A Unix socket (a path) has no TCP port to put a proxy before.
            (!options.get_host().starts_with('/'))
                .then(|| (options.get_host().to_owned(), options.get_port()))
        }
    };
}

/// `Db::FORMS` and `Db::mount`: the claim forms `$form` of the database, each mounted as
/// `Queue::table(table).$claim($arg)`.
macro_rules! forms {
    ($($form:ident => $claim:ident($($arg:expr)?)),+ $(,)?) => {
        const FORMS: &'static [Form] = &[$(Form::$form),+];

        fn mount(
            runner: Runner<Self>,
            table: Table,
            cell: Cell,
            progress: &Arc<Progress>,
        ) -> Runner<Self> {
            let queue = Queue::table(table);
            match cell.form {
                $(Form::$form => mount!(Self, runner, queue.$claim($($arg)?), cell, progress),)+
                #[allow(unreachable_patterns)]
                form => unreachable!("{} has no {} form", Self::ID, form.label()),
            }
        }
    };
}

macro_rules! db_common {
    () => {
        async fn script(pool: &Pool<Self>, sql: String) -> sqlx::Result<()> {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
            Ok(())
        }

        async fn scalar(pool: &Pool<Self>, sql: String) -> sqlx::Result<i64> {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
        }

        async fn text(pool: &Pool<Self>, sql: String) -> sqlx::Result<String> {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
        }

        async fn enqueue_many(
            pool: &Pool<Self>,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            sqlx_queue::Queue::table(table.clone())
                .enqueue_many(pool, jobs)
                .await
                .map(|ids| ids.len() as u64)
        }
    };
}

/// Whether a pool's statements are counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Counting {
    /// Timed drains: sqlx logs nothing (its statement log costs client CPU).
    Off,
    /// Counted drains: sqlx logs each statement, and with a port, connections go through the
    /// counting proxy there (without TLS).
    On(Option<u16>),
}

/// The pool options both sides use.
fn pool_options<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max)
        .test_before_acquire(TEST_BEFORE_ACQUIRE.load(Ordering::Relaxed))
        .acquire_timeout(Duration::from_secs(30))
}

impl Db for sqlx::Postgres {
    const ID: &'static str = "postgres";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");
    const WIRE: Option<Wire> = Some(Wire::Postgres);

    server!(PgConnectOptions, PgSslMode::Disable);
    forms!(RowLock => row_lock(), Lease => lease("locked_until"), Advisory => advisory_lock());
    db_common!();

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, \
             payload BYTEA NOT NULL, attempt INT NOT NULL DEFAULT 1, locked_until TIMESTAMPTZ)"
        )
    }
}

impl Db for sqlx::MySql {
    const ID: &'static str = "mysql";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");
    const WIRE: Option<Wire> = Some(Wire::MySql);

    server!(MySqlConnectOptions, MySqlSslMode::Disabled);
    forms!(RowLock => row_lock(), Lease => lease("locked_until"), Advisory => advisory_lock());
    db_common!();

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGINT AUTO_INCREMENT \
             PRIMARY KEY, payload LONGBLOB NOT NULL, attempt INT NOT NULL DEFAULT 1, \
             locked_until DATETIME(6)) ENGINE = InnoDB"
        )
    }
}

impl Db for sqlx::Sqlite {
    const ID: &'static str = "sqlite";
    const URL_VAR: Option<&'static str> = None;
    const WIRE: Option<Wire> = None;

    forms!(Lease => lease("locked_until"), Advisory => advisory_lock());
    db_common!();

    /// A file, created if missing, in WAL mode; no proxy (no wire).
    fn options(file: &str, _proxy: Option<u16>) -> sqlx::Result<SqliteConnectOptions> {
        Ok(SqliteConnectOptions::new()
            .filename(file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30)))
    }

    fn server_address(_file: &str) -> Option<(String, u16)> {
        None
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id INTEGER PRIMARY KEY, \
             payload BLOB NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT)"
        )
    }
}

/// One database's context: where it is, and its table.
#[derive(Debug)]
pub(crate) struct Ctx {
    pub(crate) url: String,
    pub(crate) table: String,
    /// MySQL/MariaDB: the current database, for the baseline's advisory lock names.
    pub(crate) database: String,
    pub(crate) poll: Option<Duration>,
    pub(crate) cap: Duration,
    /// The local port of the proxy that counts round trips (PostgreSQL, MySQL/MariaDB).
    pub(crate) proxy: Option<u16>,
}

impl Ctx {
    /// A pool of `max` connections, each opened before the clock starts (on both sides alike);
    /// `counted`: a counted drain's.
    pub(crate) async fn pool<DB: Db>(&self, max: u32, counted: bool) -> Result<Pool<DB>, String> {
        let counting = if counted {
            Counting::On(self.proxy)
        } else {
            Counting::Off
        };
        let pool = DB::connect(&self.url, max, counting)
            .await
            .map_err(|e| e.to_string())?;
        let mut held = Vec::new();
        for _ in 0..max {
            held.push(pool.acquire().await.map_err(|e| e.to_string())?);
        }
        drop(held);
        Ok(pool)
    }

    /// A fresh table of `rows` jobs; returns the smallest id.
    pub(crate) async fn fill<DB: Db>(&self, rows: usize) -> Result<i64, String> {
        let pool = DB::connect(&self.url, 2, Counting::Off)
            .await
            .map_err(|e| e.to_string())?;
        DB::script(&pool, DB::create_table(&self.table))
            .await
            .map_err(|e| format!("create table: {e}"))?;
        let payloads: Vec<Vec<u8>> = (0..rows).map(|i| format!("{i:064}").into_bytes()).collect();
        let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
        let inserted = DB::enqueue_many(&pool, &Table::new(self.table.as_str()), &jobs)
            .await
            .map_err(|e| format!("enqueue_many: {e}"))?;
        if inserted != rows as u64 {
            return Err(format!("inserted {inserted} of {rows} rows"));
        }
        if DB::ID != "mysql" {
            DB::script(&pool, format!("ANALYZE {}", self.table))
                .await
                .map_err(|e| e.to_string())?;
        }
        let (min, max) = (
            DB::scalar(&pool, format!("SELECT MIN(id) FROM {}", self.table)),
            DB::scalar(&pool, format!("SELECT MAX(id) FROM {}", self.table)),
        );
        let (min, max) = (
            min.await.map_err(|e| e.to_string())?,
            max.await.map_err(|e| e.to_string())?,
        );
        pool.close().await;
        if usize::try_from(max - min + 1) != Ok(rows) {
            return Err(format!("ids {min}..={max} for {rows} rows"));
        }
        Ok(min)
    }

    /// Checks the table is empty, and reads PostgreSQL's index scans of it.
    pub(crate) async fn after<DB: Db>(&self, rows: usize) -> Result<Option<f64>, String> {
        let pool = DB::connect(&self.url, 1, Counting::Off)
            .await
            .map_err(|e| e.to_string())?;
        let left = DB::scalar(&pool, format!("SELECT COUNT(*) FROM {}", self.table))
            .await
            .map_err(|e| e.to_string())?;
        if left != 0 {
            return Err(format!("{left} rows left in the table"));
        }
        let mut scans = None;
        if DB::ID == "postgres" {
            // The drain's backends have exited (their pool is closed): their counts are in.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let sql = format!(
                "SELECT CAST(COALESCE(idx_scan, 0) AS BIGINT) FROM pg_stat_user_tables \
                 WHERE relname = '{}'",
                self.table
            );
            scans = DB::scalar(&pool, sql)
                .await
                .ok()
                .map(|n| n as f64 / rows as f64);
        }
        pool.close().await;
        Ok(scans)
    }
}
