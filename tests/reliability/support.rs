//! What the scenarios share: the databases (copied from `tests/it/support.rs` and extended), the
//! claim forms as types, the ledgers the invariants are read from, and the consumer process.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{Pool, Row as _};
use sqlx_queue::state::{AdvisoryLock, ClaimForm, FormOn, Lease, NoForm, RowLock};
use sqlx_queue::{Backend, Job, Queue, Table};
use tokio::time::Instant;

/// How long a test pool waits for a connection.
const ACQUIRE: Duration = Duration::from_secs(20);

/// Server connection ids a pool's connections had, recorded when each connected.
pub(crate) type ConnIds = Arc<Mutex<Vec<i64>>>;

/// A database the scenarios run against.
pub(crate) trait TestDb: Backend + Sized {
    /// The environment variable with the server's URL (`None`: SQLite, always available).
    const URL_VAR: Option<&'static str>;
    const LABEL: &'static str;

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
    fn exec(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<u64>> + Send;
    /// Runs `sql` with one `?` placeholder, bound to `time`.
    fn exec_time(
        pool: &Pool<Self>,
        sql: &str,
        time: DateTime<Utc>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    fn count(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<i64>> + Send;
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
    fn bytes(pool: &Pool<Self>, sql: &str) -> impl Future<Output = sqlx::Result<Vec<u8>>> + Send;
    /// Runs `sql` on `conn` (a transaction is opened and ended with plain statements).
    fn exec_on(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
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
    fn ddl(table: &str, spec: Spec) -> String;
    /// `Table::enqueue` on the pool (written per database: sqlx's executor bounds do not
    /// follow a generic `DB`).
    fn enqueue(
        pool: &Pool<Self>,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
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

/// The columns a test table has beyond `id` and `payload`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Spec {
    pub(crate) group: bool,
    pub(crate) attempt: bool,
    pub(crate) lease: bool,
    pub(crate) retry_after: bool,
}

impl Spec {
    /// `attempt`, `locked_until` and `retry_after`: the README's schema without groups.
    pub(crate) fn queue() -> Self {
        Spec {
            attempt: true,
            lease: true,
            retry_after: true,
            ..Spec::default()
        }
    }
}

macro_rules! test_db_common {
    () => {
        async fn exec(pool: &Pool<Self>, sql: &str) -> sqlx::Result<u64> {
            let done = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn exec_time(pool: &Pool<Self>, sql: &str, time: DateTime<Utc>) -> sqlx::Result<u64> {
            let done = sqlx::query(sqlx::AssertSqlSafe(placeholders::<Self>(sql)))
                .bind(time)
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        }

        async fn count(pool: &Pool<Self>, sql: &str) -> sqlx::Result<i64> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }

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

        async fn bytes(pool: &Pool<Self>, sql: &str) -> sqlx::Result<Vec<u8>> {
            sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                .fetch_one(pool)
                .await
        }

        async fn exec_on(conn: &mut Self::Connection, sql: &str) -> sqlx::Result<u64> {
            let done = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(conn)
                .await?;
            Ok(done.rows_affected())
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

        async fn enqueue(
            pool: &Pool<Self>,
            table: &Table,
            job: Job<'_>,
        ) -> sqlx_queue::Result<i64> {
            table.enqueue(pool, job).await
        }

        async fn enqueue_many(
            pool: &Pool<Self>,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            table.enqueue_many(pool, jobs).await
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

/// `?` placeholders as the database writes them.
pub(crate) fn placeholders<DB: TestDb>(sql: &str) -> String {
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
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        let options = SqliteConnectOptions::new()
            .filename(url)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        SqlitePoolOptions::new()
            .max_connections(max)
            .acquire_timeout(acquire)
            .connect_with(options)
            .await
    }

    test_db_common!();

    fn lock_row(_table: &str, _id: i64) -> Vec<String> {
        vec!["BEGIN IMMEDIATE".to_owned()]
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id INTEGER PRIMARY KEY",
            "BLOB NOT NULL",
            "TEXT",
            "TEXT",
        )
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
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");
    const LABEL: &'static str = "postgres";

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
        use std::str::FromStr as _;
        let options = sqlx::postgres::PgConnectOptions::from_str(url)?.application_name(tag);
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

    test_db_common!();

    fn lock_row(table: &str, id: i64) -> Vec<String> {
        vec![
            "BEGIN".to_owned(),
            format!("SELECT id FROM {table} WHERE id = {id} FOR UPDATE"),
        ]
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id BIGSERIAL PRIMARY KEY",
            "BYTEA NOT NULL",
            "TEXT",
            "TIMESTAMPTZ",
        )
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
        Ok(ended as u64)
    }
}

impl TestDb for sqlx::MySql {
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");
    const LABEL: &'static str = "mysql";

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
            .connect(url)
            .await
    }

    test_db_common!();

    fn lock_row(table: &str, id: i64) -> Vec<String> {
        vec![
            "BEGIN".to_owned(),
            format!("SELECT id FROM {table} WHERE id = {id} FOR UPDATE"),
        ]
    }

    fn ddl(table: &str, spec: Spec) -> String {
        columns(
            table,
            spec,
            "id BIGINT AUTO_INCREMENT PRIMARY KEY",
            "LONGBLOB NOT NULL",
            "VARCHAR(64)",
            "DATETIME(6)",
        )
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

fn columns(table: &str, spec: Spec, id: &str, payload: &str, text: &str, time: &str) -> String {
    let mut ddl = format!("CREATE TABLE {table} ({id}, payload {payload}");
    if spec.group {
        ddl += &format!(", queue {text}");
    }
    if spec.attempt {
        ddl += ", attempt BIGINT NOT NULL DEFAULT 1";
    }
    if spec.lease {
        ddl += &format!(", locked_until {time}");
    }
    if spec.retry_after {
        ddl += &format!(", retry_after {time}");
    }
    ddl + ")"
}

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

/// Microseconds since the Unix epoch, by this host's clock (the consumer's ledger uses it too).
pub(crate) fn micros_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Milliseconds, for reports.
pub(crate) fn ms(micros: i64) -> f64 {
    micros as f64 / 1000.0
}

/// The handlers' own record of their deliveries in this process: when each began and ended.
#[derive(Debug, Default)]
pub(crate) struct Journal {
    entries: Mutex<Vec<Delivered>>,
}

/// One delivery as its handler saw it, times in microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivered {
    pub(crate) id: i64,
    pub(crate) attempt: u32,
    pub(crate) start: i64,
    pub(crate) end: Option<i64>,
}

impl Journal {
    /// Notes the start of a delivery; the index ends it.
    pub(crate) fn begin(&self, id: i64, attempt: u32) -> usize {
        let mut entries = self.entries.lock().unwrap();
        entries.push(Delivered {
            id,
            attempt,
            start: micros_now(),
            end: None,
        });
        entries.len() - 1
    }

    pub(crate) fn end(&self, index: usize) {
        self.entries.lock().unwrap()[index].end = Some(micros_now());
    }

    pub(crate) fn entries(&self) -> Vec<Delivered> {
        self.entries.lock().unwrap().clone()
    }

    /// Deliveries started and not ended.
    pub(crate) fn in_work(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|d| d.end.is_none()).count()
    }

    pub(crate) fn ended(&self) -> usize {
        let entries = self.entries.lock().unwrap();
        entries.iter().filter(|d| d.end.is_some()).count()
    }
}

/// Pairs of deliveries of the same row whose handlers ran at once (an unended delivery runs
/// until `ends_by` says, or forever).
pub(crate) fn overlaps(
    deliveries: &[Delivered],
    ends_by: impl Fn(&Delivered) -> Option<i64>,
) -> Vec<(Delivered, Delivered)> {
    let mut by_row: HashMap<i64, Vec<Delivered>> = HashMap::new();
    for d in deliveries {
        by_row.entry(d.id).or_default().push(*d);
    }
    let mut found = Vec::new();
    for (_, mut row) in by_row {
        row.sort_by_key(|d| d.start);
        for (i, earlier) in row.iter().enumerate() {
            let end = earlier.end.or_else(|| ends_by(earlier)).unwrap_or(i64::MAX);
            for later in &row[i + 1..] {
                if later.start < end {
                    found.push((*earlier, *later));
                }
            }
        }
    }
    found
}

/// Asserts that every id of `ids` was handled to its end at least once.
pub(crate) fn assert_handled(deliveries: &[Delivered], ids: &[i64]) {
    let mut done: HashMap<i64, u32> = HashMap::new();
    for d in deliveries.iter().filter(|d| d.end.is_some()) {
        *done.entry(d.id).or_default() += 1;
    }
    let missing: Vec<_> = ids.iter().filter(|id| !done.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "rows never handled to the end: {missing:?}"
    );
}

/// min / median / max of `values` (milliseconds), for reports.
pub(crate) fn spread(values: &mut [f64]) -> String {
    if values.is_empty() {
        return "none".to_owned();
    }
    values.sort_by(f64::total_cmp);
    format!(
        "min {:.0} ms, median {:.0} ms, max {:.0} ms (n = {})",
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
        values.len()
    )
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

/// A consumer process (`examples/consumer.rs`), started and running.
pub(crate) struct Consumer {
    child: tokio::process::Child,
    pub(crate) pid: i64,
}

impl Consumer {
    /// Starts a consumer and waits (at most 30 s) until its runner has started. Its output is
    /// read in the background from then on, so it never blocks on a full pipe.
    pub(crate) async fn start(database: &str, table: &str, form: &str, args: &[&str]) -> Self {
        use tokio::io::AsyncBufReadExt as _;
        let mut child = tokio::process::Command::new(example_binary("consumer"))
            .args([database, table, form])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the consumer starts");
        let pid = i64::from(child.id().expect("a running child"));
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("consumer {pid} did not start within 30 s"))
            .expect("the consumer's output");
        assert_eq!(
            first.as_deref(),
            Some("running"),
            "consumer {pid} failed to start"
        );
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Consumer { child, pid }
    }

    /// Kills the process with SIGKILL and reaps it; returns when the signal was sent (µs since
    /// the epoch): the process ran no handler after it.
    pub(crate) async fn kill(mut self) -> i64 {
        let sent = micros_now();
        self.child.start_kill().expect("SIGKILL");
        self.child
            .wait()
            .await
            .expect("the killed consumer is reaped");
        sent
    }
}
