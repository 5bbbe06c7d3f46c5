//! What the scenarios share: the databases, the claim forms as types, the ledgers the invariants
//! are read from, and the consumer process.

mod databases;
mod ledger;
mod process;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::Queue;
use sqlx_queue::state::{AdvisoryLock, ClaimForm, FormOn, Lease, NoForm, RowLock};
use tokio::time::Instant;

pub(crate) use databases::{ConnIds, Spec, TestDb};
pub(crate) use ledger::{Delivered, Journal, assert_handled, micros_now, ms, overlaps, spread};
pub(crate) use process::Consumer;

/// A claim form as a type, so one scenario is written once for every form and database.
pub(crate) trait Form<DB: TestDb>: Send + Sync + 'static {
    type F: ClaimForm + FormOn<DB> + Send + 'static;
    /// As the consumer example names it.
    const NAME: &'static str;
    /// Whether the form holds each row on a session (row lock, advisory): no row is then in two
    /// handlers at once while that session lives.
    const HOLDS: bool;

    /// Gives `queue` this form; `lease` is the lease form's duration.
    fn apply<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        lease: Duration,
    ) -> Queue<Self::F, A, C, M, B, H>;
}

/// The lease form, on its `locked_until` column.
pub(crate) struct LeaseForm;
/// The row lock form (PostgreSQL, MySQL/MariaDB).
pub(crate) struct RowLockForm;
/// The advisory lock form.
pub(crate) struct AdvisoryForm;

impl<DB: TestDb> Form<DB> for LeaseForm {
    type F = Lease;
    const NAME: &'static str = "lease";
    const HOLDS: bool = false;

    fn apply<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        lease: Duration,
    ) -> Queue<Lease, A, C, M, B, H> {
        queue.lease("locked_until").lease_duration(lease)
    }
}

impl<DB: TestDb> Form<DB> for RowLockForm
where
    RowLock: FormOn<DB>,
{
    type F = RowLock;
    const NAME: &'static str = "row_lock";
    const HOLDS: bool = true;

    fn apply<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        _lease: Duration,
    ) -> Queue<RowLock, A, C, M, B, H> {
        queue.row_lock()
    }
}

impl<DB: TestDb> Form<DB> for AdvisoryForm {
    type F = AdvisoryLock;
    const NAME: &'static str = "advisory";
    const HOLDS: bool = true;

    fn apply<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        _lease: Duration,
    ) -> Queue<AdvisoryLock, A, C, M, B, H> {
        queue.advisory_lock()
    }
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

/// The size of a pool for `n` handlers at once: a connection each, and one for the runner's own
/// statements. A test's counts are small: the panic never fires.
pub(crate) fn pool_for(n: usize) -> u32 {
    u32::try_from(n + 1).expect("a test's pool size fits a u32")
}

/// The URL of `DB`'s server (SQLite: a fresh file), or `None` with a notice when it is not set
/// and not required.
pub(crate) fn database_url<DB: TestDb>() -> Option<String> {
    init_tracing();
    match DB::URL_VAR {
        None => Some(
            std::env::temp_dir()
                .join(format!("sqlx-queue-reliability-{}.db", unique()))
                .display()
                .to_string(),
        ),
        Some(var) => match std::env::var(var) {
            Ok(url) => Some(url),
            Err(_) if required() => {
                panic!("{var} is not set, and SQLX_QUEUE_REQUIRE_ALL=1 requires every database")
            }
            Err(_) => {
                skipped(DB::LABEL, &format!("{var} is not set"));
                None
            }
        },
    }
}

pub(crate) fn required() -> bool {
    std::env::var("SQLX_QUEUE_REQUIRE_ALL").as_deref() == Ok("1")
}

fn init_tracing() {
    // `RUST_LOG=sqlx_queue=debug cargo test --test reliability ..` shows the runner's logs.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// One test's database: its pool, and the tables to drop at the end.
pub(crate) struct Ctx<DB: TestDb> {
    pub(crate) pool: Pool<DB>,
    /// The server's URL, or (SQLite) the database file.
    pub(crate) url: String,
    tables: Vec<String>,
    cleanup: Vec<String>,
}

impl<DB: TestDb> Ctx<DB> {
    /// The database, or `None` (with a notice) when its URL is not set and not required.
    pub(crate) async fn new() -> Option<Self> {
        let url = database_url::<DB>()?;
        Some(Self::on(url).await)
    }

    /// A context on the database at `url`.
    pub(crate) async fn on(url: String) -> Self {
        Ctx {
            pool: DB::connect(&url, 12).await,
            url,
            tables: Vec::new(),
            cleanup: Vec::new(),
        }
    }

    /// Another pool on the same database (as another process would have), of `max` connections.
    pub(crate) async fn pool(&self, max: u32) -> Pool<DB> {
        DB::connect(&self.url, max).await
    }

    /// Creates a fresh queue table with `spec`'s columns and returns its name.
    pub(crate) async fn table(&mut self, spec: Spec) -> String {
        let name = format!("r_{}", unique());
        self.create(&name, &DB::ddl(&name, spec)).await;
        name
    }

    /// Runs `ddl`, which creates `table`, and drops that table at the end.
    pub(crate) async fn create(&mut self, table: &str, ddl: &str) {
        self.tables.push(table.to_owned());
        self.exec(ddl).await;
    }

    /// `<table>_settled` and the trigger that fills it: one row per row deleted from `table`.
    pub(crate) async fn settled_ledger(&mut self, table: &str) -> String {
        let settled = format!("{table}_settled");
        self.tables.push(settled.clone());
        self.cleanup.extend(DB::cleanup(table));
        for sql in DB::settled_ledger(table, &settled) {
            self.exec(&sql).await;
        }
        settled
    }

    /// `<table>_deliveries`, which the consumer's `ledger` mode writes.
    pub(crate) async fn deliveries_ledger(&mut self, table: &str) -> String {
        let name = format!("{table}_deliveries");
        let ddl = format!(
            "CREATE TABLE {name} (job BIGINT NOT NULL, attempt BIGINT NOT NULL, \
             pid BIGINT NOT NULL, started_us BIGINT NOT NULL, ended_us BIGINT)"
        );
        self.create(&name, &ddl).await;
        name
    }

    pub(crate) async fn exec(&self, sql: &str) -> u64 {
        DB::exec(&self.pool, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// `SELECT COUNT(*) FROM table WHERE condition`.
    pub(crate) async fn count(&self, table: &str, condition: &str) -> i64 {
        let sql = format!("SELECT COUNT(*) FROM {table} WHERE {condition}");
        DB::count(&self.pool, &sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    pub(crate) async fn ints(&self, sql: &str) -> Vec<Vec<Option<i64>>> {
        DB::ints(&self.pool, sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Every id of `table`.
    pub(crate) async fn ids(&self, table: &str, column: &str) -> Vec<i64> {
        self.ints(&format!("SELECT {column} FROM {table}"))
            .await
            .into_iter()
            .map(|row| row[0].expect("an id"))
            .collect()
    }

    /// Waits (at most `secs`) until `table` has no row matching `condition`.
    pub(crate) async fn wait_none(&self, table: &str, condition: &str, secs: u64) {
        let what = format!("no row of {table} where {condition}");
        wait_for(&what, Duration::from_secs(secs), || async {
            self.count(table, condition).await == 0
        })
        .await;
    }

    /// Asserts that every id of `ids` was settled (deleted) exactly once, and nothing else.
    pub(crate) async fn assert_settled_once(&self, settled: &str, ids: &[i64]) {
        let mut counts: BTreeMap<i64, u32> = BTreeMap::new();
        for id in self.ids(settled, "job").await {
            *counts.entry(id).or_default() += 1;
        }
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "rows settled more than once: {twice:?}");
        let missing: Vec<_> = ids.iter().filter(|id| !counts.contains_key(id)).collect();
        assert!(missing.is_empty(), "rows never settled: {missing:?}");
        assert_eq!(
            counts.len(),
            ids.len(),
            "rows settled that were not enqueued"
        );
    }

    pub(crate) async fn drop_tables(self) {
        for table in self.tables.iter().rev() {
            let _ = DB::exec(&self.pool, &format!("DROP TABLE IF EXISTS {table}")).await;
        }
        for sql in &self.cleanup {
            let _ = DB::exec(&self.pool, sql).await;
        }
        self.pool.close().await;
        if DB::URL_VAR.is_none() {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", self.url));
            }
        }
    }
}

/// Checks that nothing of `table` is held any more, as `F` would hold it: no lease (lease), no
/// row lock (`FOR UPDATE NOWAIT` takes every row), no advisory key of the table (PostgreSQL
/// `pg_locks` of the table's class, MySQL `IS_USED_LOCK` of the lock name of every row, and of
/// every row `settled` recorded). SQLite's advisory keys live in the runner's process: a fresh
/// runner taking every row at once (`shutdown.rs`) checks them.
pub(crate) async fn assert_nothing_held<DB: TestDb, F: Form<DB>>(
    ctx: &Ctx<DB>,
    table: &str,
    settled: Option<&str>,
) {
    match F::NAME {
        "lease" => {
            let leased = ctx.count(table, "locked_until IS NOT NULL").await;
            assert_eq!(leased, 0, "{leased} rows of {table} still leased");
        }
        "row_lock" => {
            DB::nowait_all(&ctx.pool, table)
                .await
                .unwrap_or_else(|e| panic!("a row of {table} is still locked: {e}"));
        }
        _ => match DB::LABEL {
            "postgres" => {
                let class = fnv1a_32(table);
                let held = ctx
                    .count(
                        "pg_locks",
                        &format!(
                            "locktype = 'advisory' AND classid = {class} AND database = \
                             (SELECT oid FROM pg_database WHERE datname = current_database())"
                        ),
                    )
                    .await;
                assert_eq!(
                    held, 0,
                    "{held} advisory keys of {table} (class {class}) left"
                );
            }
            "mysql" => {
                let used = |column: &str| {
                    format!("IS_USED_LOCK(CONCAT(DATABASE(), '.{table}:', {column})) IS NOT NULL")
                };
                let mut held = ctx.count(table, &used("id")).await;
                if let Some(settled) = settled {
                    held += ctx.count(settled, &used("job")).await;
                }
                assert_eq!(held, 0, "{held} advisory keys of {table} left");
            }
            _ => {}
        },
    }
}

/// The 32-bit FNV-1a hash of a table name: the class of its PostgreSQL advisory keys (README).
pub(crate) fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Says that a test is skipped, where `cargo test` shows it.
pub(crate) fn skipped(what: &str, why: &str) {
    use std::io::Write as _;
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|e| e.into_inner());
    let line = format!("note: {why}: the {what} reliability tests are skipped");
    if !said.contains(&line) {
        let _ = writeln!(std::io::stderr(), "{line}");
        said.push(line);
    }
}

/// Prints a measured figure where `cargo test` shows it (the harness captures `eprintln!`).
pub(crate) fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "measured: {line}");
}

/// Polls `check` every 10 ms until it holds, failing the test with `what` after `timeout`.
pub(crate) async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
