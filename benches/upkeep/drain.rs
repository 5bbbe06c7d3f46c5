//! One drain: the databases the benches run on, filling a table, and timing a runner until it
//! has acked every row.

use std::future::Future;
use std::str::FromStr as _;
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
use sqlx::{AssertSqlSafe, ConnectOptions as _, Pool};
use sqlx_queue::{Backend, Enqueued, Job, Runner, Running, Table, UniqueJob};

/// A database a bench drains on.
pub(crate) trait BenchDb: Backend {
    const ID: &'static str;
    /// The variable with the server's URL (`None`: SQLite, in a temporary file).
    const URL_VAR: Option<&'static str>;
    fn connect(url: &str, max: u32) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send;
    fn exec(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn scalar(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    fn enqueue(
        pool: &Pool<Self>,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    fn enqueue_unique(
        pool: &Pool<Self>,
        table: &Table,
        job: UniqueJob<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<Enqueued>> + Send;
    fn enqueue_many_unique(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[UniqueJob<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<Vec<Enqueued>>> + Send;
    /// The queue table (the guide's schema for this database, without `processed_at`: acks
    /// delete), with `fillfactor` where the database takes one.
    fn schema(table: &str, fillfactor: u8) -> String;
    /// A `dedupe` unique key column for [`schema`](BenchDb::schema)'s table, and its unique
    /// index (the table keeps no finished rows: a plain index).
    fn unique_column(table: &str) -> String;
}

macro_rules! calls {
    () => {
        async fn exec(pool: &Pool<Self>, sql: String) -> sqlx::Result<()> {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
            Ok(())
        }

        async fn scalar(pool: &Pool<Self>, sql: String) -> sqlx::Result<i64> {
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

        async fn enqueue(
            pool: &Pool<Self>,
            table: &Table,
            job: Job<'_>,
        ) -> sqlx_queue::Result<i64> {
            sqlx_queue::Queue::table(table.clone())
                .enqueue(pool, job)
                .await
        }

        async fn enqueue_unique(
            pool: &Pool<Self>,
            table: &Table,
            job: UniqueJob<'_>,
        ) -> sqlx_queue::Result<Enqueued> {
            sqlx_queue::Queue::table(table.clone())
                .lease("locked_until")
                .enqueue_unique(pool, job)
                .await
        }

        async fn enqueue_many_unique(
            pool: &Pool<Self>,
            table: &Table,
            jobs: &[UniqueJob<'_>],
        ) -> sqlx_queue::Result<Vec<Enqueued>> {
            sqlx_queue::Queue::table(table.clone())
                .lease("locked_until")
                .enqueue_many_unique(pool, jobs)
                .await
        }
    };
}

fn pool_options<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(60))
}

impl BenchDb for sqlx::Postgres {
    const ID: &'static str = "postgres";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");
    calls!();

    async fn connect(url: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        let options = PgConnectOptions::from_str(url)?.disable_statement_logging();
        pool_options(max).connect_with(options).await
    }

    fn schema(table: &str, fillfactor: u8) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (
                id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, payload BYTEA NOT NULL,
                attempt INT NOT NULL DEFAULT 1, locked_until TIMESTAMPTZ, retry_after TIMESTAMPTZ,
                created_at TIMESTAMPTZ NOT NULL DEFAULT now()
            ) WITH (fillfactor = {fillfactor});
            CREATE INDEX {table}_claim ON {table} (queue, id)"
        )
    }

    fn unique_column(table: &str) -> String {
        format!(
            "ALTER TABLE {table} ADD COLUMN dedupe TEXT; \
             CREATE UNIQUE INDEX {table}_dedupe ON {table} (dedupe)"
        )
    }
}

impl BenchDb for sqlx::MySql {
    const ID: &'static str = "mysql";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");
    calls!();

    async fn connect(url: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        let options = MySqlConnectOptions::from_str(url)?
            .ssl_mode(MySqlSslMode::Disabled)
            .disable_statement_logging();
        pool_options(max).connect_with(options).await
    }

    fn schema(table: &str, _: u8) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (
                id BIGINT AUTO_INCREMENT PRIMARY KEY, queue VARCHAR(64) NOT NULL,
                payload LONGBLOB NOT NULL, attempt INT NOT NULL DEFAULT 1,
                locked_until DATETIME(6), retry_after DATETIME(6),
                created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
                INDEX {table}_claim (queue, id)
            ) ENGINE = InnoDB"
        )
    }

    fn unique_column(table: &str) -> String {
        format!(
            "ALTER TABLE {table} ADD COLUMN dedupe VARCHAR(255), \
             ADD UNIQUE INDEX {table}_dedupe (dedupe)"
        )
    }
}

impl BenchDb for sqlx::Sqlite {
    const ID: &'static str = "sqlite";
    const URL_VAR: Option<&'static str> = None;
    calls!();

    async fn connect(url: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        let options = SqliteConnectOptions::new()
            .filename(url)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30))
            .disable_statement_logging();
        pool_options(max).connect_with(options).await
    }

    fn schema(table: &str, _: u8) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (
                id INTEGER PRIMARY KEY, queue TEXT NOT NULL, payload BLOB NOT NULL,
                attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, retry_after TEXT,
                created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
            );
            CREATE INDEX {table}_claim ON {table} (queue, id)"
        )
    }

    fn unique_column(table: &str) -> String {
        format!(
            "ALTER TABLE {table} ADD COLUMN dedupe TEXT; \
             CREATE UNIQUE INDEX {table}_dedupe ON {table} (dedupe)"
        )
    }
}

/// The database's URL, or `None` (with a notice) when its variable is not set.
pub(crate) fn url<DB: BenchDb>() -> Option<String> {
    match DB::URL_VAR {
        Some(var) => std::env::var(var)
            .map_err(|_| eprintln!("{}: skipped ({var} is not set)", DB::ID))
            .ok(),
        None => Some(
            std::env::temp_dir()
                .join(format!("sqlx_queue_bench_upkeep_{}.db", std::process::id()))
                .to_string_lossy()
                .into_owned(),
        ),
    }
}

/// The bench's table name in this process.
pub(crate) fn table_name() -> String {
    format!("bench_upkeep_{}", std::process::id())
}

/// The group every bench job belongs to (the queue's `named`).
pub(crate) const QUEUE: &str = "bench";

/// Creates the queue table afresh and fills it with `rows` jobs of 64 bytes.
pub(crate) async fn fill<DB: BenchDb>(
    pool: &Pool<DB>,
    name: &str,
    fillfactor: u8,
    rows: usize,
) -> Result<(), String> {
    DB::exec(pool, DB::schema(name, fillfactor))
        .await
        .map_err(|e| format!("create: {e}"))?;
    let table = Table::new(name).group("queue");
    let payload = [b'x'; 64];
    let chunk = sqlx_queue::Queue::table(table.clone()).max_batch();
    let mut left = rows;
    while left > 0 {
        let n = left.min(chunk);
        let jobs: Vec<Job<'_>> = (0..n).map(|_| Job::new(&payload).group(QUEUE)).collect();
        DB::enqueue_many(pool, &table, &jobs)
            .await
            .map_err(|e| format!("fill: {e}"))?;
        left -= n;
    }
    Ok(())
}

/// Starts `runner` (with `recorder` set for this thread while it starts, where there is one) and
/// waits until it has acked `rows` rows: jobs per second from the start to the last ack.
pub(crate) async fn drain<DB: BenchDb>(
    pool: &Pool<DB>,
    name: &str,
    runner: Runner<DB>,
    rows: usize,
    cap: Duration,
    recorder: Option<&dyn metrics::Recorder>,
) -> Result<f64, String> {
    let began = Instant::now();
    let running = match recorder {
        Some(recorder) => {
            let _local = metrics::set_default_local_recorder(recorder);
            runner.start().await
        }
        None => runner.start().await,
    }
    .map_err(|e| format!("start: {e}"))?;
    let done = wait_acked(&running, rows as u64, cap).await;
    let secs = began.elapsed().as_secs_f64();
    let stats = running.stats();
    running
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    done?;
    let left = DB::scalar(pool, format!("SELECT COUNT(*) FROM {name}"))
        .await
        .map_err(|e| format!("count: {e}"))?;
    if stats.acked != rows as u64 || stats.claimed != rows as u64 || left != 0 {
        return Err(format!("{stats:?}, {left} rows left"));
    }
    Ok(rows as f64 / secs)
}

/// This process's CPU time so far, in clock ticks (user + system), where /proc has it.
pub(crate) fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

async fn wait_acked(running: &Running, rows: u64, cap: Duration) -> Result<(), String> {
    let began = Instant::now();
    loop {
        let stats = running.stats();
        if stats.acked >= rows {
            return Ok(());
        }
        if stats.failed + stats.lease_lost + stats.panicked > 0 {
            return Err(format!("{stats:?}"));
        }
        if began.elapsed() > cap {
            return Err(format!("not drained within {cap:?}: {stats:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
