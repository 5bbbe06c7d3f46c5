//! What the scenarios share: the databases, the claim forms as types, the ledgers the invariants
//! are read from, and the consumer process. What `tests/it` uses too is in `tests/common`.

#[path = "../../common/mod.rs"]
mod common;
mod databases;
mod ledger;
mod process;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Outcome, Queue, Runner, Running, Table};
use tokio::sync::{Semaphore, mpsc};

pub(crate) use common::databases::Spec;
pub(crate) use common::forms::{AdvisoryForm, Form, LeaseForm, RowLockForm};
pub(crate) use common::{recv, report, required, unique, wait_for};
pub(crate) use databases::{ConnIds, TestDb};
pub(crate) use ledger::{Delivered, Journal, assert_handled, micros_now, ms, overlaps, spread};
pub(crate) use process::Consumer;

/// The size of a pool for `n` handlers at once: a connection each, and one for the runner's own
/// statements. A test's counts are small: the panic never fires.
pub(crate) fn pool_for(n: usize) -> u32 {
    u32::try_from(n + 1).expect("a test's pool size fits a u32")
}

/// The scenarios' table `table`, with its `retry_after` column.
pub(crate) fn jobs(table: &str) -> Table {
    Table::new(table).retry_after("retry_after")
}

/// Starts a runner on `pool`, polling every 20 ms, with what `mount` mounts on it.
pub(crate) async fn start_runner<DB: TestDb>(
    pool: &Pool<DB>,
    mount: impl FnOnce(Runner<DB>) -> Runner<DB>,
) -> Running {
    let runner = Runner::new(pool.clone()).poll_interval(Duration::from_millis(20));
    mount(runner).start().await.unwrap()
}

/// Mounts a queue of form `F` (a lease of `lease`) on `table`, counting attempts, whose
/// `workers` handlers note each delivery in `journal`, work `work` and ack.
pub(crate) fn journaled<DB: TestDb, F: Form<DB>>(
    table: &str,
    lease: Duration,
    workers: usize,
    journal: &Arc<Journal>,
    work: Duration,
) -> impl FnOnce(Runner<DB>) -> Runner<DB> {
    let journal = Arc::clone(journal);
    let queue = F::apply_leasing(Queue::table(jobs(table)), lease)
        .attempt("attempt")
        .workers(workers)
        .handler(move |d: Delivery<DB>| journal.work(d.id(), d.attempt(), work));
    move |runner| runner.mount(queue)
}

/// Where handlers hold their deliveries until the test lets them ack: each delivery's id is sent
/// on as it arrives.
#[derive(Debug)]
pub(crate) struct Gate {
    arrived: mpsc::UnboundedSender<i64>,
    permits: Arc<Semaphore>,
}

impl Gate {
    /// A closed gate, and the ids of the deliveries that reach it.
    pub(crate) fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<i64>) {
        let (arrived, ids) = mpsc::unbounded_channel();
        let permits = Arc::new(Semaphore::new(0));
        (Arc::new(Gate { arrived, permits }), ids)
    }

    /// A handler's delivery of row `id`: sends `id` on now; the future waits for a permit, which
    /// it holds until it acks.
    pub(crate) fn hold(&self, id: i64) -> impl Future<Output = Outcome> + Send + use<> {
        let _ = self.arrived.send(id);
        let permits = Arc::clone(&self.permits);
        async move {
            let _permit = permits.acquire().await.unwrap();
            Outcome::ack()
        }
    }

    /// Lets `n` deliveries at once through.
    pub(crate) fn open(&self, n: usize) {
        self.permits.add_permits(n);
    }
}

/// The URL of `DB`'s server (SQLite: a fresh file), or `None` with a notice when it is not set
/// and not required.
pub(crate) fn database_url<DB: TestDb>() -> Option<String> {
    common::database_url::<DB>("sqlx-queue-reliability")
        .map_err(|var| skipped(DB::LABEL, &format!("{var} is not set")))
        .ok()
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

/// The 32-bit FNV-1a hash of a table name: the class of its PostgreSQL advisory keys (docs/guide/claim_forms.md).
pub(crate) fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Says that a test is skipped, where `cargo test` shows it.
pub(crate) fn skipped(what: &str, why: &str) {
    common::note_once(format!(
        "note: {why}: the {what} reliability tests are skipped"
    ));
}
