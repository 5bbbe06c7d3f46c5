//! Test databases: one context per test, with its own tables (SQLite: its own file), and the few
//! statements the tests assert with. Every assertion reads the database through a count, so the
//! same test text runs on PostgreSQL, MariaDB and SQLite.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use sqlx_queue::Backend;

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

/// A database the tests run against.
pub(crate) trait TestDb: Backend + Sized {
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

/// A name no other test (in this run or an earlier one) uses.
pub(crate) fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}_{n}_{nanos:x}", std::process::id())
}

/// One test's database.
pub(crate) struct Ctx<DB: TestDb> {
    pub(crate) pool: Pool<DB>,
    /// The server's URL, or (SQLite) the database file.
    pub(crate) url: Option<String>,
    tables: Vec<String>,
}

impl<DB: TestDb> Ctx<DB> {
    /// The database, or `None` (with a notice) when its URL is not set and not required.
    pub(crate) async fn new() -> Option<Self> {
        // `RUST_LOG=sqlx_queue=debug cargo test ..` shows the runner's logs of failing tests.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let url = match DB::URL_VAR {
            None => Some(
                std::env::temp_dir()
                    .join(format!("sqlx-queue-test-{}.db", unique()))
                    .display()
                    .to_string(),
            ),
            Some(var) => match std::env::var(var) {
                Ok(url) => Some(url),
                Err(_) if std::env::var("SQLX_QUEUE_REQUIRE_ALL").as_deref() == Ok("1") => {
                    panic!("{var} is not set, and SQLX_QUEUE_REQUIRE_ALL=1 requires every database")
                }
                Err(_) => {
                    skipped::<DB>(var);
                    return None;
                }
            },
        };
        Some(Ctx {
            pool: DB::connect(url.as_deref(), 12).await,
            url,
            tables: Vec::new(),
        })
    }

    /// Another pool on the same database (as another process would have), of `max` connections.
    pub(crate) async fn pool(&self, max: u32) -> Pool<DB> {
        DB::connect(self.url.as_deref(), max).await
    }

    /// Another pool on the same database, built from `options`.
    pub(crate) async fn pool_with(&self, options: sqlx::pool::PoolOptions<DB>) -> Pool<DB> {
        DB::connect_with(self.url.as_deref(), options).await
    }

    /// Creates a fresh table with `spec`'s columns and returns its name.
    pub(crate) async fn table(&mut self, spec: Spec) -> String {
        let name = format!("q_{}", unique());
        self.exec(&DB::ddl(&name, spec)).await;
        self.tables.push(name.clone());
        name
    }

    pub(crate) async fn exec(&self, sql: &str) {
        DB::exec(&self.pool, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    pub(crate) async fn exec_time(&self, sql: &str, time: DateTime<Utc>) {
        DB::exec_time(&self.pool, sql, time)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `SELECT COUNT(*) FROM table WHERE condition`.
    pub(crate) async fn count(&self, table: &str, condition: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {condition}");
        DB::count(&self.pool, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub(crate) async fn payload(&self, table: &str, id: i64) -> Vec<u8> {
        let sql = format!("SELECT payload FROM {table} WHERE id = {id}");
        DB::bytes(&self.pool, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Waits (at most `secs`) until `table` has no row matching `condition`.
    pub(crate) async fn wait_none(&self, table: &str, condition: &str, secs: u64) {
        let what = format!("no row of {table} where {condition}");
        wait_for(&what, Duration::from_secs(secs), || async {
            self.count(table, condition).await == 0
        })
        .await;
    }

    /// Waits (at most `secs`) until `table` has exactly `n` rows matching `condition`.
    pub(crate) async fn wait_count(&self, table: &str, condition: &str, n: i64, secs: u64) {
        let what = format!("{n} rows of {table} where {condition}");
        wait_for(&what, Duration::from_secs(secs), || async {
            self.count(table, condition).await == n
        })
        .await;
    }

    pub(crate) async fn drop_tables(self) {
        for table in &self.tables {
            let _ = DB::exec(&self.pool, &format!("DROP TABLE IF EXISTS {table}")).await;
        }
        self.pool.close().await;
        if DB::URL_VAR.is_none() {
            let file = self.url.expect("a SQLite file");
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{file}{suffix}"));
            }
        }
    }
}

/// Says once per database that its tests are skipped. Written to the process's stderr directly:
/// the test harness captures `eprintln!` of passing tests, and this notice must be seen.
fn skipped<DB: TestDb>(var: &str) {
    use std::io::Write as _;
    use std::sync::Mutex;
    static SAID: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&DB::LABEL) {
        said.push(DB::LABEL);
        let _ = writeln!(
            std::io::stderr(),
            "note: {var} is not set: the {} tests are skipped (set it, or run .ci/run)",
            DB::LABEL
        );
    }
}

/// `pool` as a PostgreSQL pool, when it is one (tests written once for every database call
/// PostgreSQL-only functions through it).
pub(crate) fn as_pg<DB: sqlx::Database>(pool: &Pool<DB>) -> Option<sqlx::PgPool> {
    let any: &dyn std::any::Any = pool;
    any.downcast_ref::<sqlx::PgPool>().cloned()
}

/// Polls `check` every 10 ms until it holds, failing the test with `what` after `timeout`.
pub(crate) async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Receives from `rx`, failing the test with `what` after `secs`.
pub(crate) async fn recv<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    what: &str,
    secs: u64,
) -> T {
    tokio::time::timeout(Duration::from_secs(secs), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out after {secs} s waiting for {what}"))
        .unwrap_or_else(|| panic!("the channel closed while waiting for {what}"))
}

/// The path of an example's binary, which `cargo test` builds with the tests.
pub(crate) fn example_binary(name: &str) -> std::path::PathBuf {
    let deps = std::env::current_exe().expect("the test binary's path");
    let profile = deps
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = profile.join("examples").join(name);
    assert!(
        binary.exists(),
        "{} is missing: `cargo test` builds the examples (or run `cargo build --example {name}`)",
        binary.display()
    );
    binary
}

/// Prints a measured figure where `cargo test` shows it (the harness captures `eprintln!`).
pub(crate) fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "measured: {line}");
}

/// A consumer process (`examples/consumer.rs`) on `table`, and its standard output.
pub(crate) struct Consumer {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Consumer {
    pub(crate) fn spawn(
        database: &str,
        table: &str,
        form: &str,
        mode: &str,
        extra: &[&str],
    ) -> Self {
        let mut child = tokio::process::Command::new(example_binary("consumer"))
            .args([database, table, form, mode])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the consumer starts");
        let stdout = child.stdout.take().expect("piped");
        use tokio::io::AsyncBufReadExt as _;
        Consumer {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    /// The next line the consumer prints, failing the test after `secs`.
    pub(crate) async fn line(&mut self, secs: u64) -> String {
        tokio::time::timeout(Duration::from_secs(secs), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("the consumer printed nothing for {secs} s"))
            .expect("the consumer's output")
            .expect("the consumer exited")
    }

    /// Kills the process with SIGKILL and reaps it.
    pub(crate) async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child
            .wait()
            .await
            .expect("the killed consumer is reaped");
    }
}
