//! Latency: how soon a handler starts after its job is enqueued, and allocations per delivery.
//!
//! - **Idle queue**: jobs enqueued one at a time (1,000 by default), each once the previous one
//!   was settled and after a pause of 2–12 ms (polling: 2–52 ms, so that jobs arrive anywhere
//!   in the poll interval), so the queue is idle and waiting. Latency runs
//!   from just before the enqueue call to the first line of the handler:
//!   - (a) *in-process wake*: enqueued through [`Table::enqueue`] in the same process, which
//!     wakes the queue (poll interval left at its 1 s default), for each claim form;
//!   - (b) *`listen_notify()`* (PostgreSQL): the queue listens on its table's channel and the
//!     job comes from another connection as another process would send it, a plain `INSERT`
//!     and a `NOTIFY` of [`Table::notify_channel`] in one transaction (no in-process wake; poll
//!     interval 1 s);
//!   - (c) *polling only*: enqueued with a plain sqlx `INSERT`, which wakes nothing; the
//!     runner polls every 50 ms.
//! - **Under load**: a backlog of 20,000 jobs is drained by 8 workers while jobs are enqueued
//!   through [`Table::enqueue`] every 10 ms; their latency is mostly their place in line.
//! - **Allocations per delivery**: a drain on a current-thread runtime, counted by a counting
//!   global allocator (`stats_alloc`: a std-only one needs `unsafe impl GlobalAlloc`, which the
//!   package's `unsafe_code = "forbid"` refuses), for the crate and for a hand-written sqlx loop
//!   running the throughput bench's baseline lease statements (`benches/sql/baseline.rs`, one row
//!   at a time: the driver's own share).
//!
//! ```sh
//! export SQLX_QUEUE_PG_URL=postgres://postgres@127.0.0.1:5432/test
//! export SQLX_QUEUE_MYSQL_URL=mysql://root@127.0.0.1:3306/test
//! cargo bench --bench latency -- --quick   # fewer jobs, about a minute
//! cargo bench --bench latency              # 1,000 jobs per case, a backlog of 20,000
//! ```
//!
//! Options: `--jobs N`, `--polled N`, `--backlog N`, `--drain N`, `--db postgres,mysql,sqlite`,
//! `--no-test-before-acquire` (pools that do not ping a connection at each acquire).
//!
//! A database whose URL is not set is skipped with a notice; SQLite runs in a temporary file.
//! Tables go to standard output, progress to standard error.

use std::alloc::System;
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use sqlx::{AssertSqlSafe, Connection as _, Pool};
use sqlx_queue::{Backend, Delivery, Job, Outcome, Queue, Runner, Running, Table};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::sync::mpsc;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Mounts `$queue` (a claim form and the attempt column chosen) on `$runner` with a handler
/// that reports to `$handler`; `$listen`: with `listen_notify()`. A macro, expanded where the
/// database is known, so that the bench names none of the crate's typestate.
macro_rules! mount {
    ($db:ty, $runner:expr, $queue:expr, $handler:expr, $listen:expr $(,)?) => {{
        let handler: Handler = $handler;
        let queue = $queue;
        let queue = if $listen {
            queue.listen_notify()
        } else {
            queue
        };
        // One worker for the allocation drain (a plain loop to compare with), four otherwise.
        let workers = if matches!(handler, Handler::Count(_)) {
            1
        } else {
            4
        };
        $runner.mount(queue.workers(workers).handler(move |d: Delivery<$db>| {
            handler.handle(d.id(), d.payload());
            std::future::ready(Outcome::ack())
        }))
    }};
}

/// The baseline's statements, shared with the throughput bench (this one runs the lease form's).
#[allow(dead_code)]
#[path = "sql/baseline.rs"]
mod sql;

/// sqlx's `PoolOptions::test_before_acquire` for every pool (`--no-test-before-acquire`: off;
/// sqlx's default pings an idle connection at each acquire).
static TEST_BEFORE_ACQUIRE: AtomicBool = AtomicBool::new(true);

/// The poll interval of the polling-only case.
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone)]
struct Options {
    quick: bool,
    /// Jobs per idle case.
    jobs: usize,
    /// Jobs per polling case.
    polled: usize,
    /// The backlog of the case under load.
    backlog: usize,
    /// Rows of the allocation drains.
    drain: usize,
    dbs: Vec<String>,
}

impl Options {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let mut options = Options {
            quick,
            jobs: if quick { 300 } else { 1_000 },
            polled: if quick { 100 } else { 1_000 },
            backlog: if quick { 5_000 } else { 20_000 },
            drain: if quick { 2_000 } else { 5_000 },
            dbs: vec!["postgres".into(), "mysql".into(), "sqlite".into()],
        };
        let mut i = 0;
        while i < args.len() {
            let value = args.get(i + 1).map(String::as_str).unwrap_or("");
            let number = || value.parse::<usize>().expect("a number");
            match args[i].as_str() {
                "--jobs" => options.jobs = number(),
                "--polled" => options.polled = number(),
                "--backlog" => options.backlog = number(),
                "--drain" => options.drain = number(),
                "--db" => options.dbs = value.split(',').map(str::to_owned).collect(),
                "--no-test-before-acquire" => {
                    TEST_BEFORE_ACQUIRE.store(false, Ordering::Relaxed);
                    i += 1;
                    continue;
                }
                _ => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        options
    }
}

// ---------------------------------------------------------------------------------------------
// The databases

/// The few driver calls the bench makes, per database.
trait Db: Backend {
    const ID: &'static str;
    const URL_VAR: Option<&'static str>;
    /// Whether the database has row locks (`row_lock!`).
    const ROW_LOCK: bool = false;

    /// A pool of `max` connections to `url` (SQLite: to a file).
    fn connect(url: &str, max: u32) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send {
        pool_options(max).connect(url)
    }
    fn create_table(table: &str) -> String;
    /// A plain `INSERT` of one job, which wakes no queue.
    fn insert(pool: &Pool<Self>, table: &str) -> impl Future<Output = sqlx::Result<()>> + Send;
    fn script(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// The table's notification channel ([`Table::notify_channel`], PostgreSQL; empty elsewhere).
    fn notify_channel(
        pool: &Pool<Self>,
        table: &Table,
    ) -> impl Future<Output = sqlx_queue::Result<String>> + Send {
        let _ = (pool, table);
        async { Ok(String::new()) }
    }
    /// [`Table::enqueue`] on the pool (written per database: the executor bound is concrete).
    fn enqueue(
        pool: &Pool<Self>,
        table: &Table,
        job: Job<'_>,
    ) -> impl Future<Output = sqlx_queue::Result<i64>> + Send;
    /// [`Table::enqueue_many`] on the pool.
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    /// The baseline's lease statements on `table`, in the order [`Db::lease_one`] runs them.
    fn lease_texts(table: &str) -> Vec<Arc<str>>;
    /// One claim and ack of the baseline's lease form, a batch of one row, on `conn` (a
    /// connection that ran [`Db::session`]); `false` when nothing was left.
    fn lease_one(
        conn: &mut Self::Connection,
        texts: &[Arc<str>],
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;
    /// What the baseline runs once per connection (MySQL/MariaDB: READ COMMITTED).
    fn session(conn: &mut Self::Connection) -> impl Future<Output = sqlx::Result<()>> + Send {
        let _ = conn;
        async { Ok(()) }
    }
    fn mount_row_lock(_: Runner<Self>, _: Table, _: Handler) -> Runner<Self> {
        unreachable!("{} has no row lock", Self::ID)
    }
}

/// `Db::ROW_LOCK` and `Db::mount_row_lock` of a database with row locks.
macro_rules! row_lock {
    () => {
        const ROW_LOCK: bool = true;

        fn mount_row_lock(runner: Runner<Self>, table: Table, handler: Handler) -> Runner<Self> {
            let queue = Queue::table(table).row_lock().attempt("attempt");
            mount!(Self, runner, queue, handler, false)
        }
    };
}

/// `Db::lease_one` of the lease form in two statements (PostgreSQL, SQLite): the claim of a
/// row, then its ack fenced by the token, which binds the row's id `$id` as `$ack_id`.
macro_rules! lease_in_two {
    (|$id:ident| $ack_id:expr) => {
        async fn lease_one(conn: &mut Self::Connection, texts: &[Arc<str>]) -> sqlx::Result<bool> {
            let (now, token) = now_and_token();
            let rows: Vec<Claimed> = sqlx::query_as(text(&texts[0]))
                .bind(token)
                .bind(now)
                .bind(1_i64)
                .fetch_all(&mut *conn)
                .await?;
            let Some(&($id, _, _)) = rows.first() else {
                return Ok(false);
            };
            let n = sqlx::query(text(&texts[1]))
                .bind($ack_id)
                .bind(token)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            deleted(n, $id)?;
            Ok(true)
        }
    };
}

/// The pool options of every pool.
fn pool_options<DB: sqlx::Database>(max: u32) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .max_connections(max)
        .test_before_acquire(TEST_BEFORE_ACQUIRE.load(Ordering::Relaxed))
}

macro_rules! db_common {
    () => {
        async fn insert(pool: &Pool<Self>, table: &str) -> sqlx::Result<()> {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (payload) VALUES ('plain insert')"
            )))
            .execute(pool)
            .await?;
            Ok(())
        }

        async fn script(pool: &Pool<Self>, sql: String) -> sqlx::Result<()> {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
            Ok(())
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
    };
}

/// A claimed row: id, payload, attempt.
type Claimed = (i64, Vec<u8>, i32);

/// The token of a lease claimed now (the crate's default lease), to the microsecond.
fn now_and_token() -> (DateTime<Utc>, DateTime<Utc>) {
    let now = Utc::now().trunc_subsecs(6);
    (now, now + TimeDelta::seconds(30))
}

fn text(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

/// Checks an ack deleted its row.
fn deleted(n: u64, id: i64) -> sqlx::Result<()> {
    if n == 1 {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "ack of {id} deleted {n} rows"
        )))
    }
}

impl Db for sqlx::Postgres {
    const ID: &'static str = "postgres";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");

    async fn notify_channel(pool: &Pool<Self>, table: &Table) -> sqlx_queue::Result<String> {
        table.notify_channel(pool).await
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, \
             payload BYTEA NOT NULL, attempt INT NOT NULL DEFAULT 1, locked_until TIMESTAMPTZ)"
        )
    }

    db_common!();
    row_lock!();
    lease_in_two!(|id| vec![id]);

    fn lease_texts(table: &str) -> Vec<Arc<str>> {
        let texts = [
            sql::postgres::lease_claim(table),
            sql::postgres::lease_delete(table),
        ];
        texts.into_iter().map(Arc::from).collect()
    }
}

impl Db for sqlx::MySql {
    const ID: &'static str = "mysql";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGINT AUTO_INCREMENT \
             PRIMARY KEY, payload LONGBLOB NOT NULL, attempt INT NOT NULL DEFAULT 1, \
             locked_until DATETIME(6)) ENGINE = InnoDB"
        )
    }

    db_common!();
    row_lock!();

    async fn session(conn: &mut Self::Connection) -> sqlx::Result<()> {
        sqlx::query(sql::mysql::SESSION).execute(conn).await?;
        Ok(())
    }

    fn lease_texts(table: &str) -> Vec<Arc<str>> {
        let texts = [
            sql::mysql::lease_claim(table),
            sql::mysql::lease_update(table, 1),
            sql::mysql::lease_delete(table, 1),
        ];
        texts.into_iter().map(Arc::from).collect()
    }

    async fn lease_one(conn: &mut Self::Connection, texts: &[Arc<str>]) -> sqlx::Result<bool> {
        let (now, token) = now_and_token();
        let mut tx = conn.begin().await?;
        let rows: Vec<Claimed> = sqlx::query_as(text(&texts[0]))
            .bind(now)
            .bind(1_i64)
            .fetch_all(&mut *tx)
            .await?;
        let Some(&(id, _, _)) = rows.first() else {
            tx.commit().await?;
            return Ok(false);
        };
        sqlx::query(text(&texts[1]))
            .bind(token)
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        let n = sqlx::query(text(&texts[2]))
            .bind(id)
            .bind(token)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        deleted(n, id)?;
        Ok(true)
    }
}

impl Db for sqlx::Sqlite {
    const ID: &'static str = "sqlite";
    const URL_VAR: Option<&'static str> = None;

    async fn connect(file: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
        let options = SqliteConnectOptions::new()
            .filename(file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        pool_options(max).connect_with(options).await
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id INTEGER PRIMARY KEY, \
             payload BLOB NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT)"
        )
    }

    db_common!();
    lease_in_two!(|id| id);

    fn lease_texts(table: &str) -> Vec<Arc<str>> {
        let texts = [
            sql::sqlite::lease_claim(table),
            sql::sqlite::lease_delete(table, 1),
        ];
        texts.into_iter().map(Arc::from).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The handler: reports when it started, or counts deliveries without allocating

/// What the handler does with a delivery.
#[derive(Debug, Clone)]
enum Handler {
    /// Sends the row's id and the time the handler started (only for payloads starting with
    /// `probe` when `probes_only`).
    Report {
        started: mpsc::UnboundedSender<(i64, Instant)>,
        probes_only: bool,
    },
    /// Counts, and allocates nothing.
    Count(Arc<AtomicU64>),
}

impl Handler {
    fn handle(&self, id: i64, payload: &[u8]) {
        match self {
            Handler::Report {
                started,
                probes_only,
            } => {
                let now = Instant::now();
                if !probes_only || payload.starts_with(b"probe") {
                    let _ = started.send((id, now));
                }
            }
            Handler::Count(n) => {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    RowLock,
    Lease,
    Advisory,
}

impl Form {
    fn label(self) -> &'static str {
        match self {
            Form::RowLock => "row lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }
}

fn mount_form<DB: Db>(
    runner: Runner<DB>,
    table: &str,
    form: Form,
    handler: Handler,
    listen: bool,
) -> Runner<DB> {
    let table = Table::new(table);
    match form {
        Form::Lease => mount!(
            DB,
            runner,
            Queue::table(table).lease("locked_until").attempt("attempt"),
            handler,
            listen,
        ),
        Form::Advisory => mount!(
            DB,
            runner,
            Queue::table(table).advisory_lock().attempt("attempt"),
            handler,
            listen,
        ),
        Form::RowLock => DB::mount_row_lock(runner, table, handler),
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

/// Latencies in ms: p50, p95, p99, max, count.
fn percentiles(mut ms: Vec<f64>) -> Option<(f64, f64, f64, f64, usize)> {
    if ms.is_empty() {
        return None;
    }
    ms.sort_by(f64::total_cmp);
    // The nearest rank, ceil(len * p) with p in 0..=1: never negative, never past len.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let at = |p: f64| ms[(((ms.len() as f64) * p).ceil() as usize).clamp(1, ms.len()) - 1];
    Some((at(0.5), at(0.95), at(0.99), ms[ms.len() - 1], ms.len()))
}

fn latency_row(db: &str, case: &str, ms: Vec<f64>, note: &str) -> String {
    match percentiles(ms) {
        Some((p50, p95, p99, max, n)) => format!(
            "| {} | {case} | {n} | {p50:.2} | {p95:.2} | {p99:.2} | {max:.1} | {note} |",
            db_label(db)
        ),
        None => format!("| {} | {case} | 0 | — | — | — | — | {note} |", db_label(db)),
    }
}

fn failed_row(db: &str, case: &str, error: &str) -> String {
    latency_row(db, case, Vec::new(), &format!("FAILED: {error}"))
}

fn idle_row(db: &str, case: &str, idle: Idle) -> String {
    let enqueue = percentiles(idle.enqueues).map_or(String::new(), |(p50, ..)| {
        format!("the enqueue call itself: p50 {p50:.2} ms")
    });
    latency_row(db, case, idle.latencies, &enqueue)
}

fn db_label(db: &str) -> &'static str {
    match db {
        "postgres" => "PostgreSQL",
        "mysql" => "MariaDB/MySQL",
        _ => "SQLite",
    }
}

/// A pause of 2 ms and up to `spread` more, varied so that enqueues do not keep step with the
/// runner's polls (the polling case spreads them over a whole poll interval).
fn pause(i: usize, spread: Duration) -> Duration {
    let spread = u64::try_from(spread.as_micros()).unwrap_or(u64::MAX).max(1);
    let at = (i as u64).wrapping_mul(2_654_435_761) % spread;
    Duration::from_micros(2_000 + at)
}

// ---------------------------------------------------------------------------------------------
// The cases

#[derive(Debug)]
struct Ctx {
    url: String,
    table: String,
}

impl Ctx {
    async fn fresh<DB: Db>(&self) -> Result<Pool<DB>, String> {
        let pool = DB::connect(&self.url, 10)
            .await
            .map_err(|e| e.to_string())?;
        DB::script(&pool, DB::create_table(&self.table))
            .await
            .map_err(|e| e.to_string())?;
        Ok(pool)
    }

    async fn fill<DB: Db>(&self, pool: &Pool<DB>, rows: usize) -> Result<(), String> {
        let payloads: Vec<Vec<u8>> = (0..rows).map(|i| format!("{i:064}").into_bytes()).collect();
        let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
        DB::enqueue_many(pool, &Table::new(self.table.as_str()), &jobs)
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Waits until the runner has acked `n` deliveries.
async fn acked(running: &Running, n: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while running.stats().acked < n {
        if Instant::now() > deadline {
            return Err(format!("acked {:?} of {n}", running.stats()));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    Ok(())
}

/// Latencies, and how long the enqueue calls took, in ms.
#[derive(Debug, Default)]
struct Idle {
    latencies: Vec<f64>,
    enqueues: Vec<f64>,
}

/// How an idle case's jobs reach the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrival {
    /// [`Table::enqueue`] in this process: an in-process wake.
    Wake,
    /// A plain `INSERT` and a `NOTIFY` from another connection; the queue listens.
    Notify,
    /// A plain `INSERT`; the runner polls every 50 ms.
    Poll,
}

/// Jobs enqueued one at a time on an idle queue.
async fn idle<DB: Db>(
    ctx: &Ctx,
    form: Form,
    jobs: usize,
    arrival: Arrival,
) -> Result<Idle, String> {
    let wake = arrival != Arrival::Poll;
    let pool = ctx.fresh::<DB>().await?;
    let (started, mut starts) = mpsc::unbounded_channel();
    let handler = Handler::Report {
        started,
        probes_only: false,
    };
    let mut runner = Runner::new(pool.clone());
    if !wake {
        runner = runner.poll_interval(POLL);
    }
    let listen = arrival == Arrival::Notify;
    let running = mount_form::<DB>(runner, &ctx.table, form, handler, listen)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let table = Table::new(ctx.table.as_str());
    let channel = DB::notify_channel(&pool, &table)
        .await
        .map_err(|e| e.to_string())?;
    let mut figures = Idle::default();
    // Let the runner's first (empty) claim pass, so it waits as an idle queue does.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for i in 0..jobs {
        let spread = if wake {
            Duration::from_millis(10)
        } else {
            POLL
        };
        tokio::time::sleep(pause(i, spread)).await;
        let t0 = Instant::now();
        if arrival == Arrival::Notify {
            DB::script(
                &pool,
                format!(
                    "INSERT INTO {} (payload) VALUES ('notified'); NOTIFY {channel}",
                    ctx.table
                ),
            )
            .await
            .map_err(|e| e.to_string())?;
        } else if wake {
            DB::enqueue(&pool, &table, Job::new("job"))
                .await
                .map_err(|e| e.to_string())?;
        } else {
            DB::insert(&pool, &ctx.table)
                .await
                .map_err(|e| e.to_string())?;
        }
        figures.enqueues.push(t0.elapsed().as_secs_f64() * 1000.0);
        let (_, at) = tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .map_err(|_| format!("job {i} not handled within 10 s"))?
            .ok_or("the handler is gone")?;
        figures.latencies.push((at - t0).as_secs_f64() * 1000.0);
        acked(&running, i as u64 + 1).await?;
    }
    running.shutdown().await.map_err(|e| e.to_string())?;
    pool.close().await;
    Ok(figures)
}

/// Jobs enqueued every 10 ms while 8 workers drain a backlog; returns their latencies and the
/// drain's rate.
async fn under_load<DB: Db>(ctx: &Ctx, backlog: usize) -> Result<(Vec<f64>, f64), String> {
    let pool = ctx.fresh::<DB>().await?;
    ctx.fill::<DB>(&pool, backlog).await?;
    let (started, mut starts) = mpsc::unbounded_channel();
    let handler = Handler::Report {
        started,
        probes_only: true,
    };
    let runner = Runner::new(pool.clone());
    let table = Table::new(ctx.table.as_str());
    let queue = Queue::table(table.clone())
        .lease("locked_until")
        .attempt("attempt")
        .workers(8)
        .handler(move |d: Delivery<DB>| {
            handler.handle(d.id(), d.payload());
            std::future::ready(Outcome::ack())
        });
    let began = Instant::now();
    let running = runner
        .mount(queue)
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let mut sent: HashMap<i64, Instant> = HashMap::new();
    let mut latencies = Vec::new();
    while running.stats().acked < backlog as u64 {
        let t0 = Instant::now();
        let id = DB::enqueue(&pool, &table, Job::new("probe"))
            .await
            .map_err(|e| e.to_string())?;
        sent.insert(id, t0);
        while let Ok((id, at)) = starts.try_recv() {
            if let Some(t0) = sent.get(&id) {
                latencies.push((at - *t0).as_secs_f64() * 1000.0);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        if began.elapsed() > Duration::from_secs(600) {
            return Err("the backlog was not drained within 10 minutes".into());
        }
    }
    let rate = backlog as f64 / began.elapsed().as_secs_f64();
    while latencies.len() < sent.len() {
        let (id, at) = tokio::time::timeout(Duration::from_secs(10), starts.recv())
            .await
            .map_err(|_| "a probe was not handled within 10 s".to_owned())?
            .ok_or("the handler is gone")?;
        if let Some(t0) = sent.get(&id) {
            latencies.push((at - *t0).as_secs_f64() * 1000.0);
        }
    }
    running.shutdown().await.map_err(|e| e.to_string())?;
    pool.close().await;
    Ok((latencies, rate))
}

/// Allocations and bytes per delivery over a drain by the crate (lease, one worker).
async fn allocations_crate<DB: Db>(ctx: &Ctx, rows: usize) -> Result<(f64, f64), String> {
    let pool = ctx.fresh::<DB>().await?;
    ctx.fill::<DB>(&pool, rows).await?;
    let count = Arc::new(AtomicU64::new(0));
    let runner = mount_form::<DB>(
        Runner::new(pool.clone()),
        &ctx.table,
        Form::Lease,
        Handler::Count(Arc::clone(&count)),
        false,
    );
    let running = runner.start().await.map_err(|e| e.to_string())?;
    // Counted from the first delivery's end to the last one's.
    acked(&running, 1).await?;
    let region = Region::new(GLOBAL);
    acked(&running, rows as u64).await?;
    let change = region.change();
    running.shutdown().await.map_err(|e| e.to_string())?;
    pool.close().await;
    let n = (rows - 1) as f64;
    Ok((
        (change.allocations + change.reallocations) as f64 / n,
        change.bytes_allocated as f64 / n,
    ))
}

/// The same over the baseline's lease loop (`benches/sql/baseline.rs`), one row at a time on
/// one connection.
async fn allocations_raw<DB: Db>(ctx: &Ctx, rows: usize) -> Result<(f64, f64), String> {
    let pool = ctx.fresh::<DB>().await?;
    ctx.fill::<DB>(&pool, rows).await?;
    let texts = DB::lease_texts(&ctx.table);
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    DB::session(&mut conn).await.map_err(|e| e.to_string())?;
    let mut region = None;
    let mut done = 0usize;
    while DB::lease_one(&mut conn, &texts)
        .await
        .map_err(|e| e.to_string())?
    {
        done += 1;
        if done == 1 {
            region = Some(Region::new(GLOBAL));
        }
    }
    let change = region.ok_or("nothing drained")?.change();
    drop(conn);
    pool.close().await;
    if done != rows {
        return Err(format!("drained {done} of {rows}"));
    }
    let n = (rows - 1) as f64;
    Ok((
        (change.allocations + change.reallocations) as f64 / n,
        change.bytes_allocated as f64 / n,
    ))
}

// ---------------------------------------------------------------------------------------------
// Per database

fn url<DB: Db>() -> Option<String> {
    match DB::URL_VAR {
        Some(var) => match std::env::var(var) {
            Ok(url) => Some(url),
            Err(_) => {
                eprintln!("{}: skipped ({var} is not set)", DB::ID);
                None
            }
        },
        None => Some(
            std::env::temp_dir()
                .join(format!("sqlx_queue_latency_{}.db", std::process::id()))
                .to_string_lossy()
                .into_owned(),
        ),
    }
}

fn ctx<DB: Db>(url: String) -> Ctx {
    Ctx {
        url,
        table: format!("bench_latency_{}", std::process::id()),
    }
}

async fn cleanup<DB: Db>(ctx: &Ctx) {
    if let Ok(pool) = DB::connect(&ctx.url, 1).await {
        let _ = DB::script(&pool, format!("DROP TABLE IF EXISTS {}", ctx.table)).await;
        pool.close().await;
    }
    if DB::URL_VAR.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", ctx.url));
        }
    }
}

async fn latencies<DB: Db>(options: &Options, out: &Mutex<Vec<String>>) {
    let Some(url) = url::<DB>() else { return };
    let ctx = ctx::<DB>(url);
    let push = |line: String| {
        println!("{line}");
        out.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    };
    let idle_case = |case: &str, result: Result<Idle, String>| {
        push(match result {
            Ok(idle) => idle_row(DB::ID, case, idle),
            Err(e) => failed_row(DB::ID, case, &e),
        });
    };
    let forms: &[Form] = if DB::ROW_LOCK {
        &[Form::Lease, Form::RowLock, Form::Advisory]
    } else {
        &[Form::Lease, Form::Advisory]
    };
    for &form in forms {
        eprintln!(
            "  {} {}: in-process wake, {} jobs",
            DB::ID,
            form.label(),
            options.jobs
        );
        let case = format!("(a) in-process wake, {}", form.label());
        idle_case(
            &case,
            idle::<DB>(&ctx, form, options.jobs, Arrival::Wake).await,
        );
    }
    if DB::ID == "postgres" {
        eprintln!("  {} lease: listen_notify, {} jobs", DB::ID, options.jobs);
        idle_case(
            "(b) `listen_notify()`, lease",
            idle::<DB>(&ctx, Form::Lease, options.jobs, Arrival::Notify).await,
        );
    } else {
        push(format!(
            "| {} | (b) `listen_notify()` | — | n/a | n/a | n/a | n/a | PostgreSQL only |",
            db_label(DB::ID)
        ));
    }
    eprintln!("  {} lease: polling only, {} jobs", DB::ID, options.polled);
    idle_case(
        &format!("(c) polling only ({} ms), lease", POLL.as_millis()),
        idle::<DB>(&ctx, Form::Lease, options.polled, Arrival::Poll).await,
    );
    eprintln!(
        "  {} lease: under load, backlog {}",
        DB::ID,
        options.backlog
    );
    let case = format!("under load: backlog {}, 8 workers, lease", options.backlog);
    match under_load::<DB>(&ctx, options.backlog).await {
        Ok((ms, rate)) => push(latency_row(
            DB::ID,
            &case,
            ms,
            &format!("behind the backlog (FIFO); drained at {rate:.0} jobs/s"),
        )),
        Err(e) => push(failed_row(DB::ID, &case, &e)),
    }
    cleanup::<DB>(&ctx).await;
}

/// Runs the allocation drains of one database on a current-thread runtime.
fn allocations<DB: Db>(options: &Options) -> Option<String> {
    let url = url::<DB>()?;
    let ctx = ctx::<DB>(url);
    eprintln!(
        "  {}: allocations over a drain of {}",
        DB::ID,
        options.drain
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let line = runtime.block_on(async {
        let krate = allocations_crate::<DB>(&ctx, options.drain).await;
        let raw = allocations_raw::<DB>(&ctx, options.drain).await;
        cleanup::<DB>(&ctx).await;
        match (krate, raw) {
            (Ok((ka, kb)), Ok((ra, rb))) => format!(
                "| {} | {ka:.1} | {kb:.0} | {ra:.1} | {rb:.0} | {:.1} |",
                db_label(DB::ID),
                ka - ra
            ),
            (k, r) => format!(
                "| {} | FAILED: {:?} | | {:?} | | |",
                db_label(DB::ID),
                k.err(),
                r.err()
            ),
        }
    });
    println!("{line}");
    Some(line)
}

fn main() {
    let options = Options::parse();
    eprintln!(
        "latency: {} jobs per idle case, {} polled, backlog {}, drains of {}{}",
        options.jobs,
        options.polled,
        options.backlog,
        options.drain,
        if options.quick { " (--quick)" } else { "" }
    );
    println!("Enqueue → handler start, in ms (4 workers; under load 8):\n");
    println!("| database | case | jobs | p50 | p95 | p99 | max | note |");
    println!("|---|---|---:|---:|---:|---:|---:|---|");
    let rows = Mutex::new(Vec::new());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        for db in &options.dbs {
            match db.as_str() {
                "postgres" | "pg" => latencies::<sqlx::Postgres>(&options, &rows).await,
                "mysql" | "mariadb" => latencies::<sqlx::MySql>(&options, &rows).await,
                "sqlite" => latencies::<sqlx::Sqlite>(&options, &rows).await,
                other => eprintln!("unknown database {other}: skipped"),
            }
        }
    });
    drop(runtime);

    println!(
        "\nAllocations per delivery (lease, 1 worker, current-thread runtime; the raw loop runs \
         the baseline's lease statements of the throughput bench on one connection):\n"
    );
    println!(
        "| database | crate allocs/delivery | crate bytes/delivery | raw allocs/job | \
         raw bytes/job | crate − raw allocs |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for db in &options.dbs {
        match db.as_str() {
            "postgres" | "pg" => allocations::<sqlx::Postgres>(&options),
            "mysql" | "mariadb" => allocations::<sqlx::MySql>(&options),
            "sqlite" => allocations::<sqlx::Sqlite>(&options),
            _ => None,
        };
    }
}
