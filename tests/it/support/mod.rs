//! What the tests share: one context per test, with its own tables (SQLite: its own file), on
//! the databases of `databases`; the claim forms as types; the waits; and (`process`) the example
//! binaries. Every assertion reads the database through a count, so the same test text runs on
//! PostgreSQL, MariaDB and SQLite. What the reliability suite uses too is in `tests/common`.

#[path = "../../common/mod.rs"]
mod common;
mod databases;
mod process;
mod servers;

use std::sync::Once;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;

pub(crate) use common::databases::Spec;
pub(crate) use common::forms::{AdvisoryForm, Form, LeaseForm, RowLockForm};
#[allow(
    unused_imports,
    reason = "`it`, `cancel` and `rate` test through the pooler; the other binaries of this support do not"
)]
pub(crate) use common::pooler::pooled;
pub(crate) use common::{example_binary, recv, report, unique, wait_for};
pub(crate) use databases::{Bind, TestDb, TestRow};
pub(crate) use process::Consumer;
pub(crate) use servers::on_server_of;

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
        let url = match common::database_url_in(servers::url_var::<DB>(), "sqlx-queue-test") {
            Ok(url) => url,
            Err(var) => {
                common::note_once(format!(
                    "note: {var} is not set: the {} tests are skipped (set it, or run .ci/run)",
                    DB::LABEL
                ));
                return None;
            }
        };
        Some(Ctx {
            pool: DB::connect(Some(&url), 12).await,
            url: Some(url),
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
        self.table_padded(spec, 0).await
    }

    /// [`table`](Self::table), its name padded with `x` to `len` characters.
    pub(crate) async fn table_padded(&mut self, spec: Spec, len: usize) -> String {
        let name = format!("q_{}", unique());
        let name = format!("{name}{}", "x".repeat(len.saturating_sub(name.len())));
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

/// `pool` as a PostgreSQL pool, when it is one (tests written once for every database call
/// PostgreSQL-only functions through it).
pub(crate) fn as_pg<DB: sqlx::Database>(pool: &Pool<DB>) -> Option<sqlx::PgPool> {
    let any: &dyn std::any::Any = pool;
    any.downcast_ref::<sqlx::PgPool>().cloned()
}

/// The message of the panics the tests' handlers raise on purpose (`assert!(.., INTENDED_PANIC)`).
pub(crate) const INTENDED_PANIC: &str = "the first attempt panics";

/// Installs, once per binary, a panic hook that prints the handlers' intended panics
/// ([`INTENDED_PANIC`]) in one line, without the backtrace `RUST_BACKTRACE=1` asks for; any other
/// panic goes to the hook there was. The hook runs on the runtime's thread that polled the
/// handler, and resolving a backtrace in this binary's debug information took 1.6 s there on an
/// idle machine (a test with one intended panic: 1.74 s, against 0.16 s without the backtrace),
/// longer on a loaded one, where the panics of tests side by side take turns at it: CI once timed
/// out waiting 10 s for the retry after a panic.
pub(crate) fn intended_panics_without_backtrace() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload_as_str() == Some(INTENDED_PANIC) {
                let at = info.location().map(ToString::to_string).unwrap_or_default();
                eprintln!("intended panic at {at}: {INTENDED_PANIC} (no backtrace)");
            } else {
                previous(info);
            }
        }));
    });
}
