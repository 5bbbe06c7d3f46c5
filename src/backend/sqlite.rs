//! SQLite's driver calls: this process's statements queued one at a time.

use std::future::Future;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{SqlStr, Sqlite};
use sqlx_core::transaction::TransactionManager;

use super::driver::Driver;
use super::{Backend, InsertFailed, Q};
use crate::table::{Dialect, Value, ValueKind};

impl Backend for Sqlite {}

/// This process's statements on SQLite, one at a time. SQLite has one writer: when two of
/// a runner's connections write at once, the loser sleeps in SQLite's busy handler (1 ms,
/// then longer) for a lock held a fraction of that, and at eight workers the runner spent its
/// time asleep. Queued here instead, each statement starts the moment the previous one ends.
/// Statements inside a transaction are not queued: the transaction may hold the write lock
/// a queued statement waits for.
static STATEMENTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Driver for Sqlite {
    const DIALECT: Dialect = Dialect::Sqlite;

    driver_common!();
    prepare_untyped!();

    fn gate(
        conn: &Self::Connection,
    ) -> impl Future<Output = Option<tokio::sync::MutexGuard<'static, ()>>> + Send {
        let in_transaction =
            <Sqlite as sqlx::Database>::TransactionManager::get_transaction_depth(conn) > 0;
        async move {
            if in_transaction {
                None
            } else {
                Some(STATEMENTS.lock().await)
            }
        }
    }

    async fn insert_id_on(
        conn: &mut Self::Connection,
        query: Q<Self>,
    ) -> Result<i64, InsertFailed> {
        Ok(Self::execute(conn, query).await.map(|_| 0)?)
    }

    fn insert_id<'e, 'c: 'e, E>(
        executor: E,
        query: Q<Self>,
        returning: bool,
    ) -> BoxFuture<'e, Result<i64, InsertFailed>>
    where
        E: 'e + sqlx::Executor<'c, Database = Self>,
    {
        use sqlx::Row as _;
        Box::pin(async move {
            if returning {
                Ok(query.fetch_one(executor).await?.try_get(0)?)
            } else {
                Ok(query.execute(executor).await?.last_insert_rowid())
            }
        })
    }

    fn get_created(row: &Self::Row, index: usize) -> Option<DateTime<Utc>> {
        // The claim computes it as milliseconds since 1970 (`dialect::common::created_millis`).
        sqlx::Row::try_get::<Option<i64>, _>(row, index)
            .ok()
            .flatten()
            .and_then(DateTime::from_timestamp_millis)
    }

    async fn server(
        conn: &mut Self::Connection,
    ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
        let version: String = sqlx::query_scalar("SELECT sqlite_version()")
            .fetch_one(conn)
            .await?;
        Ok((version, None))
    }
}

/// Fresh database files for the crate's own tests.
#[cfg(test)]
pub(crate) mod scratch {
    use std::path::PathBuf;
    use std::time::Duration;

    use sqlx::SqlitePool;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};

    /// A fresh database file in WAL mode, named after `name`, this process and the time.
    pub(crate) async fn open(name: &str) -> (SqlitePool, PathBuf) {
        let file = std::env::temp_dir().join(format!(
            "sqlx-queue-{name}-{}-{:x}.db",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let options = SqliteConnectOptions::new()
            .filename(&file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        (SqlitePool::connect_with(options).await.unwrap(), file)
    }

    /// Closes `pool` and removes its file, with its WAL files.
    pub(crate) async fn remove(pool: SqlitePool, file: PathBuf) {
        pool.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let mut path = file.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}
