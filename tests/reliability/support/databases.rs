//! The databases: on top of what `tests/it` shares with the scenarios (`common::databases`),
//! server sessions, locks and triggers.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::pool::PoolOptions;
use sqlx::{Pool, Row as _};

use super::common::databases::{Db, Spec, create_table, placeholders};

/// How long a test pool waits for a connection.
const ACQUIRE: Duration = Duration::from_secs(20);
/// The `application_name` of the test pools on PostgreSQL.
const TAG: &str = "sqlx-queue-reliability";

/// Server connection ids a pool's connections had, recorded when each connected.
pub(crate) type ConnIds = Arc<Mutex<Vec<i64>>>;

/// A database the scenarios run against.
pub(crate) trait TestDb: Db {
    /// A pool of `max` connections on `url` (SQLite: a file).
    fn connect(url: &str, max: u32) -> impl Future<Output = Pool<Self>> + Send {
        async move {
            Self::connect_tagged(url, max, ACQUIRE, TAG, ConnIds::default())
                .await
                .unwrap_or_else(|e| panic!("{} at {url}: {e}", Self::LABEL))
        }
    }

    /// A pool whose connections record their server ids in `ids` when they connect, and (on
    /// PostgreSQL) carry `tag` as their `application_name`; `acquire` is its acquire timeout.
    /// (SQLite's, without server sessions, records nothing.)
    fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        tag: &str,
        ids: ConnIds,
    ) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send {
        recording(max, acquire, ids).connect_with(Self::tagged_options(url, tag))
    }

    /// How a pool tagged `tag` connects to `url`.
    fn tagged_options(url: &str, _tag: &str) -> <Self::Connection as sqlx::Connection>::Options {
        Self::connect_options(url)
    }

    fn count_time(
        pool: &Pool<Self>,
        sql: &str,
        time: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;
    /// Rows of integer columns (NULL as `None`).
    fn ints(
        pool: &Pool<Self>,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<Vec<Vec<Option<i64>>>>> + Send;
    fn exec_time_on(
        conn: &mut Self::Connection,
        sql: &str,
        time: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// The statements that take `table`'s write lock from another session and keep it until
    /// `COMMIT`: `SELECT .. FOR UPDATE` of row `id`, or SQLite's `BEGIN IMMEDIATE`.
    fn lock_row(table: &str, id: i64) -> Vec<String> {
        vec![
            "BEGIN".to_owned(),
            format!("SELECT id FROM {table} WHERE id = {id} FOR UPDATE"),
        ]
    }

    /// Takes every row of `table` with `FOR UPDATE NOWAIT` in a transaction it rolls back:
    /// `Err` when any row is locked.
    fn nowait_all(pool: &Pool<Self>, table: &str)
    -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// `CREATE TABLE table` with `spec`'s columns, `attempt` a `BIGINT` on every database.
    fn ddl(table: &str, spec: Spec) -> String {
        create_table::<Self>(table, spec, "BIGINT")
    }

    /// A table `settled` and a trigger that writes the id of every row deleted from `table`.
    fn settled_ledger(table: &str, settled: &str) -> Vec<String> {
        let mut sql = vec![format!("CREATE TABLE {settled} (job BIGINT NOT NULL)")];
        sql.extend(Self::settle_trigger(table, settled));
        sql
    }

    /// The trigger of `settled_ledger` (PostgreSQL: and its function).
    fn settle_trigger(table: &str, settled: &str) -> Vec<String>;

    /// What the trigger of `settled_ledger` leaves besides its tables.
    fn cleanup(_table: &str) -> Vec<String> {
        Vec::new()
    }

    /// The server's id of the session `conn` is on.
    fn session_id(conn: &mut Self::Connection) -> BoxFuture<'_, sqlx::Result<i64>>;

    /// Ends the server sessions `ids` (or tagged `tag`) of a pool, returning how many it ended.
    fn kill_sessions(
        admin: &Pool<Self>,
        tag: &str,
        ids: &[i64],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
}

/// Pool options of `max` connections that wait `acquire` for one, and record the server id of
/// each connection in `ids` when it connects.
fn recording<DB: TestDb>(max: u32, acquire: Duration, ids: ConnIds) -> PoolOptions<DB> {
    PoolOptions::new()
        .max_connections(max)
        .acquire_timeout(acquire)
        .after_connect(move |conn, _| {
            let ids = Arc::clone(&ids);
            Box::pin(async move {
                let id = DB::session_id(conn).await?;
                ids.lock().unwrap().push(id);
                Ok(())
            })
        })
}

macro_rules! test_db_calls {
    () => {
        async fn count_time(
            pool: &Pool<Self>,
            sql: &str,
            time: DateTime<Utc>,
        ) -> sqlx::Result<i64> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(placeholders::<Self>(sql)))
                .bind(time)
                .fetch_one(pool)
                .await
        }

        async fn ints(pool: &Pool<Self>, sql: &str) -> sqlx::Result<Vec<Vec<Option<i64>>>> {
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(pool)
                .await?;
            rows.iter()
                .map(|row| {
                    (0..row.len())
                        .map(|i| row.try_get::<Option<i64>, _>(i))
                        .collect()
                })
                .collect()
        }

        async fn exec_time_on(
            conn: &mut Self::Connection,
            sql: &str,
            time: DateTime<Utc>,
        ) -> sqlx::Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(placeholders::<Self>(sql)))
                .bind(time)
                .execute(conn)
                .await?;
            Ok(done.rows_affected())
        }

        async fn nowait_all(pool: &Pool<Self>, table: &str) -> sqlx::Result<u64> {
            let mut tx = pool.begin().await?;
            let sql = format!("SELECT id FROM {table} FOR UPDATE NOWAIT");
            let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut *tx)
                .await?;
            tx.rollback().await?;
            Ok(rows.len() as u64)
        }
    };
}

impl TestDb for sqlx::Sqlite {
    async fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        _tag: &str,
        _ids: ConnIds,
    ) -> sqlx::Result<Pool<Self>> {
        PoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .connect_with(Self::connect_options(url))
            .await
    }

    test_db_calls!();

    fn lock_row(_table: &str, _id: i64) -> Vec<String> {
        vec!["BEGIN IMMEDIATE".to_owned()]
    }

    fn settle_trigger(table: &str, settled: &str) -> Vec<String> {
        vec![format!(
            "CREATE TRIGGER {table}_settled AFTER DELETE ON {table} \
             BEGIN INSERT INTO {settled} (job) VALUES (OLD.id); END"
        )]
    }

    fn session_id(_conn: &mut Self::Connection) -> BoxFuture<'_, sqlx::Result<i64>> {
        unreachable!("SQLite has no server sessions")
    }

    async fn kill_sessions(_admin: &Pool<Self>, _tag: &str, _ids: &[i64]) -> sqlx::Result<u64> {
        unreachable!("SQLite has no server sessions")
    }
}

impl TestDb for sqlx::Postgres {
    fn tagged_options(url: &str, tag: &str) -> sqlx::postgres::PgConnectOptions {
        Self::connect_options(url).application_name(tag)
    }

    test_db_calls!();

    fn settle_trigger(table: &str, settled: &str) -> Vec<String> {
        vec![
            format!(
                "CREATE FUNCTION {table}_settle() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN INSERT INTO {settled} (job) VALUES (OLD.id); RETURN OLD; END $$"
            ),
            format!(
                "CREATE TRIGGER {table}_settled AFTER DELETE ON {table} \
                 FOR EACH ROW EXECUTE FUNCTION {table}_settle()"
            ),
        ]
    }

    fn cleanup(table: &str) -> Vec<String> {
        vec![format!("DROP FUNCTION IF EXISTS {table}_settle() CASCADE")]
    }

    fn session_id(conn: &mut Self::Connection) -> BoxFuture<'_, sqlx::Result<i64>> {
        Box::pin(async move {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(conn)
                .await?;
            Ok(i64::from(pid))
        })
    }

    /// Returns once the sessions have ended, not once they were told to (PostgreSQL 14+'s
    /// timeout): a session told to end may still answer a statement meanwhile, so a kill's
    /// effect (a row free again while its handler works) could come after the kill returned.
    async fn kill_sessions(admin: &Pool<Self>, tag: &str, _ids: &[i64]) -> sqlx::Result<u64> {
        let ended: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid, 5000) AS ended \
             FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()) t \
             WHERE ended",
        )
        .bind(tag)
        .fetch_one(admin)
        .await?;
        Ok(u64::try_from(ended).unwrap_or(0))
    }
}

impl TestDb for sqlx::MySql {
    test_db_calls!();

    fn settle_trigger(table: &str, settled: &str) -> Vec<String> {
        vec![format!(
            "CREATE TRIGGER {table}_settled AFTER DELETE ON {table} FOR EACH ROW \
             INSERT INTO {settled} (job) VALUES (OLD.id)"
        )]
    }

    fn session_id(conn: &mut Self::Connection) -> BoxFuture<'_, sqlx::Result<i64>> {
        Box::pin(async move {
            let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(conn)
                .await?;
            Ok(id as i64)
        })
    }

    async fn kill_sessions(admin: &Pool<Self>, _tag: &str, ids: &[i64]) -> sqlx::Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        // Only sessions still open: an id the server has not reused yet is still one of ours.
        let list: Vec<String> = ids.iter().map(i64::to_string).collect();
        let sql = format!(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE ID IN ({}) AND ID <> CONNECTION_ID()",
            list.join(", ")
        );
        let open: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(admin)
            .await?;
        let mut ended = 0;
        for id in open {
            // A session that ended meanwhile is "unknown thread": not ours to count.
            if sqlx::raw_sql(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(admin)
                .await
                .is_ok()
            {
                ended += 1;
            }
        }
        Ok(ended)
    }
}
