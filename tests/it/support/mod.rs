//! What the tests share: one context per test, with its own tables (SQLite: its own file), on
//! the databases of `databases`; the claim forms as types (`forms`); the waits; and (`process`)
//! the example binaries. Every assertion reads the database through a count, so the same test
//! text runs on PostgreSQL, MariaDB and SQLite.

mod databases;
mod forms;
mod process;
mod servers;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;

pub(crate) use databases::{Bind, Spec, TestDb, TestRow};
pub(crate) use forms::{AdvisoryForm, Form, LeaseForm, RowLockForm};
pub(crate) use process::{Consumer, example_binary};
pub(crate) use servers::on_server_of;

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
        let url = match servers::url_var::<DB>() {
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
fn skipped<DB: TestDb>(var: &'static str) {
    use std::io::Write as _;
    use std::sync::Mutex;
    static SAID: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    if !said.contains(&var) {
        said.push(var);
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

/// Prints a measured figure where `cargo test` shows it (the harness captures `eprintln!`).
pub(crate) fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "measured: {line}");
}
