//! The databases: on top of what `tests/it` shares with the scenarios (`common::databases`),
//! server sessions, locks and triggers.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{Pool, Row as _};

use super::common::databases::{Db, Spec, create_table, placeholders};

/// How long a test pool waits for a connection.
const ACQUIRE: Duration = Duration::from_secs(20);

/// Server connection ids a pool's connections had, recorded when each connected.
pub(crate) type ConnIds = Arc<Mutex<Vec<i64>>>;

/// A database the scenarios run against.
pub(crate) trait TestDb: Db {
    /// A pool of `max` connections on `url` (SQLite: a file).
    fn connect(url: &str, max: u32) -> impl Future<Output = Pool<Self>> + Send;
    /// A pool whose connections record their server ids in `ids` when they connect, and (on
    /// PostgreSQL) carry `tag` as their `application_name`; `acquire` is its acquire timeout.
    fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        tag: &str,
        ids: ConnIds,
    ) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send;
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
    /// The statement that takes `table`'s write lock from another session and keeps it until
    /// `COMMIT`: `SELECT .. FOR UPDATE` of row `id`, or SQLite's `BEGIN IMMEDIATE`.
    fn lock_row(table: &str, id: i64) -> Vec<String>;
    /// Takes every row of `table` with `FOR UPDATE NOWAIT` in a transaction it rolls back:
    /// `Err` when any row is locked.
    fn nowait_all(pool: &Pool<Self>, table: &str)
    -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// `CREATE TABLE table` with `spec`'s columns, `attempt` a `BIGINT` on every database.
    fn ddl(table: &str, spec: Spec) -> String {
        create_table::<Self>(table, spec, "BIGINT")
    }
    /// A table `settled` and a trigger that writes the id of every row deleted from `table`.
    fn settled_ledger(table: &str, settled: &str) -> Vec<String>;
    /// What the trigger of `settled_ledger` leaves besides its tables.
    fn cleanup(table: &str) -> Vec<String>;
    /// Ends the server sessions `ids` (or tagged `tag`) of a pool, returning how many it ended.
    fn kill_sessions(
        admin: &Pool<Self>,
        tag: &str,
        ids: &[i64],
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
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
    async fn connect(url: &str, max: u32) -> Pool<Self> {
        Self::connect_tagged(url, max, ACQUIRE, "", ConnIds::default())
            .await
            .expect("a SQLite file in the temporary directory")
    }

    async fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        _tag: &str,
        _ids: ConnIds,
    ) -> sqlx::Result<Pool<Self>> {
        sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .connect_with(Self::connect_options(url))
            .await
    }

    test_db_calls!();

    fn lock_row(_table: &str, _id: i64) -> Vec<String> {
        vec!["BEGIN IMMEDIATE".to_owned()]
    }

    fn settled_ledger(table: &str, settled: &str) -> Vec<String> {
        vec![
            format!("CREATE TABLE {settled} (job BIGINT NOT NULL)"),
            format!(
                "CREATE TRIGGER {table}_settled AFTER DELETE ON {table} \
                 BEGIN INSERT INTO {settled} (job) VALUES (OLD.id); END"
            ),
        ]
    }

    fn cleanup(_table: &str) -> Vec<String> {
        Vec::new()
    }

    async fn kill_sessions(_admin: &Pool<Self>, _tag: &str, _ids: &[i64]) -> sqlx::Result<u64> {
        unreachable!("SQLite has no server sessions")
    }
}

impl TestDb for sqlx::Postgres {
    async fn connect(url: &str, max: u32) -> Pool<Self> {
        Self::connect_tagged(
            url,
            max,
            ACQUIRE,
            "sqlx-queue-reliability",
            ConnIds::default(),
        )
        .await
        .expect("PostgreSQL at SQLX_QUEUE_PG_URL")
    }

    async fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        tag: &str,
        ids: ConnIds,
    ) -> sqlx::Result<Pool<Self>> {
        let options = Self::connect_options(url).application_name(tag);
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .after_connect(move |conn, _| {
                let ids = Arc::clone(&ids);
                Box::pin(async move {
                    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                        .fetch_one(&mut *conn)
                        .await?;
                    ids.lock().unwrap().push(i64::from(pid));
                    Ok(())
                }) as BoxFuture<'_, sqlx::Result<()>>
            })
            .connect_with(options)
            .await
    }

    test_db_calls!();

    fn lock_row(table: &str, id: i64) -> Vec<String> {
        vec![
            "BEGIN".to_owned(),
            format!("SELECT id FROM {table} WHERE id = {id} FOR UPDATE"),
        ]
    }

    fn settled_ledger(table: &str, settled: &str) -> Vec<String> {
        vec![
            format!("CREATE TABLE {settled} (job BIGINT NOT NULL)"),
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

    async fn kill_sessions(admin: &Pool<Self>, tag: &str, _ids: &[i64]) -> sqlx::Result<u64> {
        let ended: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) AS ended FROM pg_stat_activity \
             WHERE application_name = $1 AND pid <> pg_backend_pid()) t WHERE ended",
        )
        .bind(tag)
        .fetch_one(admin)
        .await?;
        Ok(u64::try_from(ended).unwrap_or(0))
    }
}

impl TestDb for sqlx::MySql {
    async fn connect(url: &str, max: u32) -> Pool<Self> {
        Self::connect_tagged(url, max, ACQUIRE, "", ConnIds::default())
            .await
            .expect("MySQL/MariaDB at SQLX_QUEUE_MYSQL_URL")
    }

    async fn connect_tagged(
        url: &str,
        max: u32,
        acquire: Duration,
        _tag: &str,
        ids: ConnIds,
    ) -> sqlx::Result<Pool<Self>> {
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .after_connect(move |conn, _| {
                let ids = Arc::clone(&ids);
                Box::pin(async move {
                    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                        .fetch_one(&mut *conn)
                        .await?;
                    ids.lock().unwrap().push(id as i64);
                    Ok(())
                }) as BoxFuture<'_, sqlx::Result<()>>
            })
            .connect_with(Self::connect_options(url))
            .await
    }

    test_db_calls!();

    fn lock_row(table: &str, id: i64) -> Vec<String> {
        vec![
            "BEGIN".to_owned(),
            format!("SELECT id FROM {table} WHERE id = {id} FOR UPDATE"),
        ]
    }

    fn settled_ledger(table: &str, settled: &str) -> Vec<String> {
        vec![
            format!("CREATE TABLE {settled} (job BIGINT NOT NULL)"),
            format!(
                "CREATE TRIGGER {table}_settled AFTER DELETE ON {table} FOR EACH ROW \
                 INSERT INTO {settled} (job) VALUES (OLD.id)"
            ),
        ]
    }

    fn cleanup(_table: &str) -> Vec<String> {
        Vec::new()
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
