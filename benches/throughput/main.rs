//! Throughput: this crate against a hand-written sqlx loop running the same statements.
//!
//! Each cell of the grid fills a fresh table with N rows (default 20,000, 64-byte payloads) by
//! the crate's bulk insert ([`Table::enqueue_many`]), then drains it with
//!
//! - **crate**: a [`Runner`] with one queue of `workers` workers and a handler that acks at once;
//! - **raw**: `workers` independent tokio tasks, each on a connection of its own, looping
//!   claim → settle with the very statements the crate renders (read through the hidden
//!   accessor `sqlx_queue::private::statements`, so the two cannot drift):
//!   - lease: `claim` (MySQL/MariaDB: `BEGIN` at READ COMMITTED, the locking `SELECT`, the
//!     `UPDATE` of the ids, `COMMIT`), then `finish` guarded by the token, per row;
//!   - row lock: `BEGIN`, `claim` of one row, `finish`, `COMMIT`;
//!   - advisory: `candidates`, `lock`, `take`, `count` (MySQL/MariaDB), `finish`, `unlock`.
//!
//! The two sides alternate, A B A B, for 3 rounds; each drain is timed from the first handled
//! job to the last settled one. Every drain is verified: each row handled exactly once, every
//! settlement counted, and the table empty at the end.
//!
//! The grid is database {PostgreSQL, MariaDB/MySQL, SQLite} x form {row lock, lease, advisory}
//! x workers {1, 4, 8} x batch {1, 16}, where each applies: SQLite has no row lock, its
//! advisory keys are held in the process; batch 16 runs on the lease form, where the crate's
//! queue is `.batch(16).batch_handler(..)` and the raw loop claims 16 rows, then runs one
//! `finish` per row (the accessor renders no batched settlement).
//!
//! ```sh
//! export SQLX_QUEUE_PG_URL=postgres://postgres@127.0.0.1:5432/test
//! export SQLX_QUEUE_MYSQL_URL=mysql://root@127.0.0.1:3306/test
//! cargo bench --bench throughput -- --quick    # a subset, about 2 minutes
//! cargo bench --bench throughput               # the whole grid
//! cargo bench --bench throughput -- --db postgres --form lease --workers 1,8 --rows 5000
//! ```
//!
//! Options: `--rows N`, `--rounds N`, `--db postgres,mysql,sqlite`, `--form
//! row_lock,lease,advisory`, `--workers 1,4,8`, `--batch 1,16`, `--side crate|raw`,
//! `--poll-ms N` (the runner's poll interval), `--no-test-before-acquire` (pools that do not
//! ping a connection at each acquire). `RUST_LOG=sqlx_queue=debug` shows the crate's logs.
//!
//! A database whose URL is not set is skipped with a notice; SQLite runs in a temporary file.
//! The Markdown table goes to standard output, progress and diagnostics to standard error.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use sqlx::{AssertSqlSafe, Connection as _, Pool};
use sqlx_queue::private::{advisory_keys, statements};
use sqlx_queue::state::{AttemptColumn, ClaimForm, FormOn};
use sqlx_queue::{Backend, Delivery, Job, Outcome, Queue, Runner, Table};

type Q<DB> = sqlx::query::Query<'static, DB, <DB as sqlx::Database>::Arguments>;

/// A drain that makes no progress for this long fails.
const STALL: Duration = Duration::from_secs(60);

/// A drain still running after this long is stopped, and its rate taken over what it settled
/// (marked `*` in the table): a stalling runner must not hold the grid for an hour.
const CAP: Duration = Duration::from_secs(120);
const CAP_QUICK: Duration = Duration::from_secs(20);

/// sqlx's `PoolOptions::test_before_acquire` for every pool of the bench (both sides): sqlx
/// pings an idle connection each time it is acquired unless this is off
/// (`--no-test-before-acquire`).
static TEST_BEFORE_ACQUIRE: AtomicBool = AtomicBool::new(true);

/// The lease the raw loop writes (the crate's default).
const LEASE: TimeDelta = TimeDelta::seconds(30);

// ---------------------------------------------------------------------------------------------
// The grid

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    RowLock,
    Lease,
    Advisory,
}

impl Form {
    fn accessor(self) -> &'static str {
        match self {
            Form::RowLock => "row_lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Form::RowLock => "row lock",
            Form::Lease => "lease",
            Form::Advisory => "advisory",
        }
    }
}

#[derive(Debug, Clone)]
struct Options {
    quick: bool,
    rows: usize,
    rounds: usize,
    dbs: Vec<String>,
    forms: Option<Vec<Form>>,
    workers: Vec<usize>,
    batches: Vec<usize>,
    /// The runner's poll interval (`--poll-ms`; default: the crate's default).
    poll: Option<Duration>,
    /// Which sides run (`--side crate|raw`; default both), e.g. to profile one.
    sides: (bool, bool),
}

impl Options {
    fn parse() -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let quick = args.iter().any(|a| a == "--quick");
        let mut options = Options {
            quick,
            rows: if quick { 2_000 } else { 20_000 },
            rounds: if quick { 1 } else { 3 },
            dbs: vec!["postgres".into(), "mysql".into(), "sqlite".into()],
            forms: None,
            workers: if quick { vec![1, 8] } else { vec![1, 4, 8] },
            batches: if quick { vec![1] } else { vec![1, 16] },
            poll: None,
            sides: (true, true),
        };
        let list = |value: &str| -> Vec<String> { value.split(',').map(str::to_owned).collect() };
        let numbers = |value: &str| -> Vec<usize> {
            value
                .split(',')
                .map(|n| n.parse().expect("a list of numbers"))
                .collect()
        };
        let mut i = 0;
        while i < args.len() {
            let value = args.get(i + 1).map(String::as_str).unwrap_or("");
            match args[i].as_str() {
                "--rows" => options.rows = value.parse().expect("--rows N"),
                "--rounds" => options.rounds = value.parse().expect("--rounds N"),
                "--db" => options.dbs = list(value),
                "--workers" => options.workers = numbers(value),
                "--batch" => options.batches = numbers(value),
                "--side" => {
                    options.sides = match value {
                        "crate" => (true, false),
                        "raw" => (false, true),
                        _ => (true, true),
                    }
                }
                "--no-test-before-acquire" => {
                    TEST_BEFORE_ACQUIRE.store(false, Ordering::Relaxed);
                    i += 1;
                    continue;
                }
                "--poll-ms" => {
                    options.poll = Some(Duration::from_millis(value.parse().expect("--poll-ms N")));
                }
                "--form" => {
                    options.forms = Some(
                        list(value)
                            .iter()
                            .map(|f| match f.as_str() {
                                "row_lock" | "rowlock" => Form::RowLock,
                                "lease" => Form::Lease,
                                "advisory" => Form::Advisory,
                                other => panic!("unknown form {other}"),
                            })
                            .collect(),
                    );
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

    /// The forms run on `db`: every one that applies, or in `--quick` one per database.
    fn forms_for(&self, db: &str) -> Vec<Form> {
        let all: Vec<Form> = match db {
            "sqlite" => vec![Form::Lease, Form::Advisory],
            _ => vec![Form::RowLock, Form::Lease, Form::Advisory],
        };
        match (&self.forms, self.quick) {
            (Some(forms), _) => all.into_iter().filter(|f| forms.contains(f)).collect(),
            (None, true) => vec![match db {
                "postgres" => Form::RowLock,
                "mysql" => Form::Advisory,
                _ => Form::Lease,
            }],
            (None, false) => all,
        }
    }
}

/// One cell of the grid.
#[derive(Debug, Clone, Copy)]
struct Cell {
    form: Form,
    workers: usize,
    batch: usize,
    rows: usize,
}

/// One timed drain.
#[derive(Debug, Clone, Copy)]
struct Sample {
    jobs_per_s: f64,
    /// Stopped at the cap before the table was drained: the rate is over what it settled.
    capped: bool,
    /// This process's CPU time per 1,000 jobs, in ms (from /proc/self/stat; 10 ms ticks).
    cpu_ms_per_kjob: f64,
    /// PostgreSQL only: index scans on the table per job (claims, takes, finishes).
    idx_scans_per_job: Option<f64>,
}

/// The samples of one side of a cell.
#[derive(Debug, Default, Clone)]
struct Side {
    samples: Vec<Sample>,
    failure: Option<String>,
}

impl Side {
    fn record(&mut self, result: Result<Sample, String>) {
        match result {
            Ok(sample) => self.samples.push(sample),
            Err(error) => {
                eprintln!("    FAILED: {error}");
                self.failure.get_or_insert(error);
            }
        }
    }

    fn rates(&self) -> Vec<f64> {
        let mut rates: Vec<f64> = self.samples.iter().map(|s| s.jobs_per_s).collect();
        rates.sort_by(f64::total_cmp);
        rates
    }

    /// `*` when a drain was stopped at the cap.
    fn mark(&self) -> &'static str {
        if self.samples.iter().any(|s| s.capped) {
            "*"
        } else {
            ""
        }
    }

    fn best(&self) -> Option<f64> {
        self.rates().last().copied()
    }

    fn median(&self) -> Option<f64> {
        median(&self.rates())
    }

    fn median_of(&self, f: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        let mut values: Vec<f64> = self.samples.iter().filter_map(f).collect();
        values.sort_by(f64::total_cmp);
        median(&values)
    }
}

fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// A finished cell.
#[derive(Debug, Clone)]
struct Row {
    db: &'static str,
    cell: Cell,
    krate: Option<Side>,
    raw: Side,
}

// ---------------------------------------------------------------------------------------------
// The databases

/// A value a placeholder takes.
#[derive(Debug, Clone, Copy)]
enum V<'a> {
    I64(i64),
    Time(DateTime<Utc>),
    Text(&'a str),
}

/// A claimed row: id, payload, attempt.
type Claimed = (i64, Vec<u8>, i64);

/// The few driver calls the bench makes, per database, with concrete types.
trait Db: Backend {
    /// The accessor's name of the database.
    const ID: &'static str;
    /// The variable with the server's URL (`None`: SQLite, in a temporary file).
    const URL_VAR: Option<&'static str>;

    fn connect(url: &str, max: u32) -> impl Future<Output = sqlx::Result<Pool<Self>>> + Send;
    fn create_table(table: &str) -> String;
    fn bind(q: Q<Self>, v: V<'_>) -> Q<Self>;
    fn exec(
        conn: &mut Self::Connection,
        q: Q<Self>,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;
    fn claimed(
        conn: &mut Self::Connection,
        q: Q<Self>,
    ) -> impl Future<Output = sqlx::Result<Vec<Claimed>>> + Send;
    fn ints(
        conn: &mut Self::Connection,
        q: Q<Self>,
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;
    fn int(
        conn: &mut Self::Connection,
        q: Q<Self>,
    ) -> impl Future<Output = sqlx::Result<Option<i64>>> + Send;
    fn script(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<()>> + Send;
    /// [`Table::enqueue_many`] on the pool (written per database: the executor bound is
    /// concrete).
    fn enqueue_many(
        pool: &Pool<Self>,
        table: &Table,
        jobs: &[Job<'_>],
    ) -> impl Future<Output = sqlx_queue::Result<u64>> + Send;
    fn scalar(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<i64>> + Send;
    fn text(pool: &Pool<Self>, sql: String) -> impl Future<Output = sqlx::Result<String>> + Send;
    /// Mounts a row lock queue (SQLite has no row lock: never called there).
    fn mount_row_lock(
        runner: Runner<Self>,
        table: Table,
        workers: usize,
        progress: &Arc<Progress>,
    ) -> Runner<Self>;
}

macro_rules! db_common {
    () => {
        fn bind(q: Q<Self>, v: V<'_>) -> Q<Self> {
            match v {
                V::I64(v) => q.bind(v),
                V::Time(v) => q.bind(v),
                V::Text(v) => q.bind(v.to_owned()),
            }
        }

        async fn exec(conn: &mut Self::Connection, q: Q<Self>) -> sqlx::Result<u64> {
            Ok(q.execute(conn).await?.rows_affected())
        }

        async fn claimed(conn: &mut Self::Connection, q: Q<Self>) -> sqlx::Result<Vec<Claimed>> {
            use sqlx::Row as _;
            q.fetch_all(conn)
                .await?
                .iter()
                .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
                .collect()
        }

        async fn ints(conn: &mut Self::Connection, q: Q<Self>) -> sqlx::Result<Vec<i64>> {
            use sqlx::Row as _;
            q.fetch_all(conn)
                .await?
                .iter()
                .map(|row| row.try_get(0))
                .collect()
        }

        async fn int(conn: &mut Self::Connection, q: Q<Self>) -> sqlx::Result<Option<i64>> {
            use sqlx::Row as _;
            match q.fetch_optional(conn).await? {
                Some(row) => row.try_get(0),
                None => Ok(None),
            }
        }

        async fn script(pool: &Pool<Self>, sql: String) -> sqlx::Result<()> {
            sqlx::raw_sql(AssertSqlSafe(sql)).execute(pool).await?;
            Ok(())
        }

        async fn enqueue_many(
            pool: &Pool<Self>,
            table: &Table,
            jobs: &[Job<'_>],
        ) -> sqlx_queue::Result<u64> {
            table.enqueue_many(pool, jobs).await
        }

        async fn scalar(pool: &Pool<Self>, sql: String) -> sqlx::Result<i64> {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
        }

        async fn text(pool: &Pool<Self>, sql: String) -> sqlx::Result<String> {
            sqlx::query_scalar(AssertSqlSafe(sql)).fetch_one(pool).await
        }
    };
}

impl Db for sqlx::Postgres {
    const ID: &'static str = "postgres";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_PG_URL");

    async fn connect(url: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(max)
            .test_before_acquire(TEST_BEFORE_ACQUIRE.load(Ordering::Relaxed))
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, \
             payload BYTEA NOT NULL, attempt INT NOT NULL DEFAULT 1, locked_until TIMESTAMPTZ)"
        )
    }

    db_common!();

    fn mount_row_lock(
        runner: Runner<Self>,
        table: Table,
        workers: usize,
        progress: &Arc<Progress>,
    ) -> Runner<Self> {
        let queue = Queue::table(table).row_lock().attempt("attempt");
        mount(runner, queue, workers, progress)
    }
}

impl Db for sqlx::MySql {
    const ID: &'static str = "mysql";
    const URL_VAR: Option<&'static str> = Some("SQLX_QUEUE_MYSQL_URL");

    async fn connect(url: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max)
            .test_before_acquire(TEST_BEFORE_ACQUIRE.load(Ordering::Relaxed))
            .acquire_timeout(Duration::from_secs(30))
            .connect(url)
            .await
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id BIGINT AUTO_INCREMENT \
             PRIMARY KEY, payload LONGBLOB NOT NULL, attempt INT NOT NULL DEFAULT 1, \
             locked_until DATETIME(6)) ENGINE = InnoDB"
        )
    }

    db_common!();

    fn mount_row_lock(
        runner: Runner<Self>,
        table: Table,
        workers: usize,
        progress: &Arc<Progress>,
    ) -> Runner<Self> {
        let queue = Queue::table(table).row_lock().attempt("attempt");
        mount(runner, queue, workers, progress)
    }
}

impl Db for sqlx::Sqlite {
    const ID: &'static str = "sqlite";
    const URL_VAR: Option<&'static str> = None;

    async fn connect(file: &str, max: u32) -> sqlx::Result<Pool<Self>> {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
        let options = SqliteConnectOptions::new()
            .filename(file)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(30));
        SqlitePoolOptions::new()
            .max_connections(max)
            .test_before_acquire(TEST_BEFORE_ACQUIRE.load(Ordering::Relaxed))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await
    }

    fn create_table(table: &str) -> String {
        format!(
            "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (id INTEGER PRIMARY KEY, \
             payload BLOB NOT NULL, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT)"
        )
    }

    db_common!();

    fn mount_row_lock(
        _runner: Runner<Self>,
        _table: Table,
        _workers: usize,
        _progress: &Arc<Progress>,
    ) -> Runner<Self> {
        unreachable!("SQLite has no row lock")
    }
}

// ---------------------------------------------------------------------------------------------
// Progress of one drain, shared by the handler (or the raw loop) and the timer

/// What the handlers saw: when the first job was handled, how many were, each row's flag.
#[derive(Debug)]
struct Progress {
    base: Instant,
    /// Nanoseconds from `base` to the first handled job, plus one (0: none yet).
    first: AtomicU64,
    handled: AtomicU64,
    /// Settlements the raw loop completed (the crate's are read from its `Stats`).
    settled: AtomicU64,
    duplicates: AtomicU64,
    /// Tells the raw workers to stop (a drain at its cap).
    stop: AtomicBool,
    min_id: i64,
    seen: Vec<AtomicBool>,
}

impl Progress {
    fn new(min_id: i64, rows: usize) -> Self {
        Progress {
            base: Instant::now(),
            first: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            min_id,
            seen: (0..rows).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// A job handled: the no-op handler of both sides.
    fn handle(&self, id: i64) {
        if self.handled.fetch_add(1, Ordering::Relaxed) == 0 {
            let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.first.store(nanos.saturating_add(1), Ordering::Relaxed);
        }
        let seen = usize::try_from(id - self.min_id)
            .ok()
            .and_then(|i| self.seen.get(i));
        match seen {
            Some(flag) if !flag.swap(true, Ordering::Relaxed) => {}
            _ => {
                self.duplicates.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn first(&self) -> Option<Instant> {
        match self.first.load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }

    /// Checks no row was handled twice, and, when the drain was not capped, that every row
    /// was handled.
    fn verify(&self, rows: usize, end: End) -> Result<(), String> {
        if end.settled < rows as u64 {
            let duplicates = self.duplicates.load(Ordering::Relaxed);
            let handled = self.handled.load(Ordering::Relaxed);
            if duplicates != 0 || handled < end.settled {
                return Err(format!(
                    "capped drain: {handled} handled, {} settled, {duplicates} twice or unknown",
                    end.settled
                ));
            }
            return Ok(());
        }
        let handled = self.handled.load(Ordering::Relaxed);
        let duplicates = self.duplicates.load(Ordering::Relaxed);
        let missing = self
            .seen
            .iter()
            .filter(|f| !f.load(Ordering::Relaxed))
            .count();
        if handled != rows as u64 || duplicates != 0 || missing != 0 {
            return Err(format!(
                "handled {handled} of {rows} rows, {duplicates} twice or unknown, {missing} never"
            ));
        }
        Ok(())
    }
}

/// How a timed drain ended.
#[derive(Debug, Clone, Copy)]
struct End {
    at: Instant,
    /// Settlements by then: `rows`, or fewer when the drain hit the cap.
    settled: u64,
}

/// Waits until `settled()` reaches `rows`, polling every millisecond, or until `cap` has passed
/// since the first job was handled.
async fn wait_settled(
    rows: usize,
    cap: Duration,
    progress: &Progress,
    settled: impl Fn() -> u64,
    gave_up: impl Fn() -> Option<String>,
) -> Result<End, String> {
    let mut last = (0, Instant::now());
    loop {
        let n = settled();
        let now = Instant::now();
        if n >= rows as u64 {
            return Ok(End {
                at: now,
                settled: n,
            });
        }
        if progress.first().is_some_and(|first| now - first > cap) {
            return Ok(End {
                at: now,
                settled: n,
            });
        }
        if let Some(why) = gave_up() {
            return Err(format!("stopped after {n} of {rows} settlements: {why}"));
        }
        if n != last.0 {
            last = (n, now);
        } else if now - last.1 > STALL {
            return Err(format!("no progress for {STALL:?} after {n} of {rows}"));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// This process's CPU time so far, in clock ticks (user + system), where /proc has it.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

// ---------------------------------------------------------------------------------------------
// One database's context: where it is, and its tables

#[derive(Debug)]
struct Ctx {
    url: String,
    table: String,
    /// MySQL/MariaDB: the current database, for advisory lock names.
    database: String,
    poll: Option<Duration>,
    cap: Duration,
}

impl Ctx {
    async fn pool<DB: Db>(&self, max: u32) -> Result<Pool<DB>, String> {
        let pool = DB::connect(&self.url, max)
            .await
            .map_err(|e| e.to_string())?;
        // Open every connection before the clock starts, on both sides alike.
        let mut held = Vec::new();
        for _ in 0..max {
            held.push(pool.acquire().await.map_err(|e| e.to_string())?);
        }
        drop(held);
        Ok(pool)
    }

    /// A fresh table of `rows` jobs; returns the smallest id.
    async fn fill<DB: Db>(&self, rows: usize) -> Result<i64, String> {
        let pool = DB::connect(&self.url, 2).await.map_err(|e| e.to_string())?;
        DB::script(&pool, DB::create_table(&self.table))
            .await
            .map_err(|e| format!("create table: {e}"))?;
        let payloads: Vec<Vec<u8>> = (0..rows).map(|i| format!("{i:064}").into_bytes()).collect();
        let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
        let inserted = DB::enqueue_many(&pool, &Table::new(self.table.as_str()), &jobs)
            .await
            .map_err(|e| format!("enqueue_many: {e}"))?;
        if inserted != rows as u64 {
            return Err(format!("inserted {inserted} of {rows} rows"));
        }
        if DB::ID != "mysql" {
            DB::script(&pool, format!("ANALYZE {}", self.table))
                .await
                .map_err(|e| e.to_string())?;
        }
        let (min, max) = (
            DB::scalar(&pool, format!("SELECT MIN(id) FROM {}", self.table)),
            DB::scalar(&pool, format!("SELECT MAX(id) FROM {}", self.table)),
        );
        let (min, max) = (
            min.await.map_err(|e| e.to_string())?,
            max.await.map_err(|e| e.to_string())?,
        );
        pool.close().await;
        if usize::try_from(max - min + 1) != Ok(rows) {
            return Err(format!("ids {min}..={max} for {rows} rows"));
        }
        Ok(min)
    }

    /// Checks the table is empty, and reads PostgreSQL's index scans of it.
    async fn after<DB: Db>(&self, rows: usize) -> Result<Option<f64>, String> {
        let pool = DB::connect(&self.url, 1).await.map_err(|e| e.to_string())?;
        let left = DB::scalar(&pool, format!("SELECT COUNT(*) FROM {}", self.table))
            .await
            .map_err(|e| e.to_string())?;
        if left != 0 {
            return Err(format!("{left} rows left in the table"));
        }
        let mut scans = None;
        if DB::ID == "postgres" {
            // The drain's backends have exited (their pool is closed): their counts are in.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let sql = format!(
                "SELECT CAST(COALESCE(idx_scan, 0) AS BIGINT) FROM pg_stat_user_tables \
                 WHERE relname = '{}'",
                self.table
            );
            scans = DB::scalar(&pool, sql)
                .await
                .ok()
                .map(|n| n as f64 / rows as f64);
        }
        pool.close().await;
        Ok(scans)
    }
}

// ---------------------------------------------------------------------------------------------
// Side A: the crate

fn mount<DB: Db, F>(
    runner: Runner<DB>,
    queue: Queue<F, AttemptColumn>,
    workers: usize,
    progress: &Arc<Progress>,
) -> Runner<DB>
where
    F: ClaimForm + FormOn<DB>,
{
    let progress = Arc::clone(progress);
    runner.mount(queue.workers(workers).handler(move |d: Delivery<DB>| {
        progress.handle(d.id());
        std::future::ready(Outcome::ack())
    }))
}

async fn run_crate<DB: Db>(ctx: &Ctx, cell: Cell) -> Result<Sample, String> {
    let min_id = ctx.fill::<DB>(cell.rows).await?;
    let pool = ctx.pool::<DB>(cell.workers as u32 + 1).await?;
    let progress = Arc::new(Progress::new(min_id, cell.rows));
    let table = Table::new(ctx.table.as_str());
    let mut runner = Runner::new(pool.clone());
    if let Some(poll) = ctx.poll {
        runner = runner.poll_interval(poll);
    }
    let runner = match cell.form {
        Form::Lease if cell.batch > 1 => {
            let progress = Arc::clone(&progress);
            runner.mount(
                Queue::table(table)
                    .lease("locked_until")
                    .attempt("attempt")
                    .workers(cell.workers)
                    .batch(cell.batch)
                    .batch_handler(move |deliveries: Vec<Delivery<DB>>| {
                        for d in &deliveries {
                            progress.handle(d.id());
                        }
                        std::future::ready(deliveries.iter().map(|_| Outcome::ack()).collect())
                    }),
            )
        }
        Form::Lease => mount(
            runner,
            Queue::table(table).lease("locked_until").attempt("attempt"),
            cell.workers,
            &progress,
        ),
        Form::Advisory => mount(
            runner,
            Queue::table(table).advisory_lock().attempt("attempt"),
            cell.workers,
            &progress,
        ),
        Form::RowLock => DB::mount_row_lock(runner, table, cell.workers, &progress),
    };
    let cpu = cpu_ticks();
    let running = runner.start().await.map_err(|e| format!("start: {e}"))?;
    let end = wait_settled(
        cell.rows,
        ctx.cap,
        &progress,
        || running.stats().acked,
        || {
            let stats = running.stats();
            (stats.failed + stats.lease_lost + stats.panicked > 0).then(|| format!("{stats:?}"))
        },
    )
    .await;
    let cpu = cpu.zip(cpu_ticks()).map(|(a, b)| b - a);
    let stats = running.stats();
    running
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    pool.close().await;
    let end = end?;
    progress.verify(cell.rows, end)?;
    let capped = end.settled < cell.rows as u64;
    if !capped && (stats.claimed != cell.rows as u64 || stats.acked != cell.rows as u64) {
        return Err(format!("runner stats {stats:?}"));
    }
    let scans = if capped {
        None
    } else {
        ctx.after::<DB>(cell.rows).await?
    };
    sample(&progress, end, cpu, scans)
}

fn sample(
    progress: &Progress,
    end: End,
    cpu: Option<u64>,
    idx_scans_per_job: Option<f64>,
) -> Result<Sample, String> {
    let first = progress.first().ok_or("no job handled")?;
    let secs = (end.at - first).as_secs_f64().max(1e-6);
    let jobs = end.settled.max(2) as f64;
    Ok(Sample {
        // From the first handled job to the last settled: `jobs - 1` intervals.
        jobs_per_s: (jobs - 1.0) / secs,
        capped: end.settled < progress.seen.len() as u64,
        cpu_ms_per_kjob: cpu.map_or(f64::NAN, |ticks| ticks as f64 * 10.0 / jobs * 1000.0),
        idx_scans_per_job,
    })
}

// ---------------------------------------------------------------------------------------------
// Side B: the hand-written loop, on the crate's own statements

/// A placeholder, by the accessor's parameter name.
#[derive(Debug, Clone, Copy)]
enum P {
    Id,
    IdAt(usize),
    Token,
    NewToken,
    Now,
    Limit,
    Key,
    KeyClass,
    KeyPrefix,
}

#[derive(Debug, Clone)]
struct RawStmt {
    sql: Arc<str>,
    params: Vec<P>,
}

/// The values a raw statement binds.
#[derive(Debug, Clone, Copy)]
struct Vals<'a> {
    id: i64,
    ids: &'a [i64],
    token: DateTime<Utc>,
    new_token: DateTime<Utc>,
    now: DateTime<Utc>,
    limit: i64,
    key_class: i64,
    key_prefix: &'a str,
}

impl<'a> Vals<'a> {
    fn new(now: DateTime<Utc>, key_class: i64, key_prefix: &'a str) -> Self {
        Vals {
            id: 0,
            ids: &[],
            token: now,
            new_token: now,
            now,
            limit: 1,
            key_class,
            key_prefix,
        }
    }

    fn value(&self, p: P) -> V<'a> {
        match p {
            P::Id => V::I64(self.id),
            // As the crate does: a short id list is padded with its last id.
            P::IdAt(i) => V::I64(self.ids.get(i).or(self.ids.last()).copied().unwrap_or(0)),
            P::Token => V::Time(self.token),
            P::NewToken => V::Time(self.new_token),
            P::Now => V::Time(self.now),
            P::Limit => V::I64(self.limit),
            P::Key => V::I64((self.key_class << 32) | (self.id & 0xffff_ffff)),
            P::KeyClass => V::I64(self.key_class),
            P::KeyPrefix => V::Text(self.key_prefix),
        }
    }
}

impl RawStmt {
    fn query<DB: Db>(&self, vals: &Vals<'_>) -> Q<DB> {
        let mut q = sqlx::query::<DB>(AssertSqlSafe(Arc::clone(&self.sql)));
        for &p in &self.params {
            q = <DB as Db>::bind(q, vals.value(p));
        }
        q
    }
}

/// The crate's statements for one form, as the raw loop runs them.
#[derive(Debug)]
struct Raw {
    form: Form,
    batch: usize,
    /// How many candidates an advisory query lists (as the crate's claim for all workers).
    candidates_limit: i64,
    begin: Option<Arc<str>>,
    /// Lease and row lock: the claim (MySQL lease: the locking `SELECT`).
    claim: Option<RawStmt>,
    /// MySQL lease: the `UPDATE` of the claimed ids, by how many ids it takes.
    updates: Vec<(usize, RawStmt)>,
    finish: RawStmt,
    candidates: Option<RawStmt>,
    lock: Option<RawStmt>,
    take: Option<RawStmt>,
    count: Option<RawStmt>,
    unlock: Option<RawStmt>,
    key_class: i64,
    key_prefix: String,
    /// SQLite's advisory keys, held in this process.
    in_process: Mutex<HashSet<i64>>,
}

impl Raw {
    fn new(db: &str, ctx: &Ctx, cell: Cell) -> Result<Self, String> {
        let table = Table::new(ctx.table.as_str());
        // MySQL lease updates are rendered for claims up to the accessor's `workers`.
        let size = if cell.form == Form::Lease {
            cell.batch
        } else {
            cell.workers
        };
        let all = statements(db, &table, cell.form.accessor(), Some("attempt"), size)
            .map_err(|e| e.to_string())?;
        let convert = |s: &sqlx_queue::private::Statement| -> Result<RawStmt, String> {
            let params = s
                .params
                .iter()
                .map(|p| {
                    Ok(match p.as_str() {
                        "id" => P::Id,
                        "token" => P::Token,
                        "new_token" => P::NewToken,
                        "now" => P::Now,
                        "limit" => P::Limit,
                        "key" => P::Key,
                        "key_class" => P::KeyClass,
                        "key_prefix" => P::KeyPrefix,
                        other => match other.strip_prefix("id_at_") {
                            Some(i) => P::IdAt(i.parse().map_err(|_| other.to_owned())?),
                            None => return Err(format!("unknown parameter {other} in {}", s.sql)),
                        },
                    })
                })
                .collect::<Result<_, String>>()?;
            Ok(RawStmt {
                sql: s.sql.as_str().into(),
                params,
            })
        };
        let find = |role: &str| -> Result<Option<RawStmt>, String> {
            all.iter().find(|s| s.role == role).map(convert).transpose()
        };
        let mut updates = Vec::new();
        for s in &all {
            if let Some(n) = s.role.strip_prefix("update_ids_") {
                updates.push((n.parse::<usize>().map_err(|e| e.to_string())?, convert(s)?));
            }
        }
        updates.sort_by_key(|(n, _)| *n);
        // The MySQL claim's transaction starts as the row lock form's does (READ COMMITTED).
        let begin = if db == "mysql" {
            statements(db, &table, "row_lock", Some("attempt"), 1)
                .map_err(|e| e.to_string())?
                .into_iter()
                .find(|s| s.role == "begin")
                .map(|s| Arc::<str>::from(s.sql.as_str()))
        } else {
            None
        };
        let (key_class, key_prefix) = advisory_keys(&ctx.table, &ctx.database);
        Ok(Raw {
            form: cell.form,
            batch: cell.batch,
            candidates_limit: (cell.workers * 2 + 2) as i64,
            begin,
            claim: find("claim")?,
            updates,
            finish: find("finish")?.ok_or("no finish statement")?,
            candidates: find("candidates")?,
            lock: find("lock")?,
            take: find("take")?,
            count: find("count")?,
            unlock: find("unlock")?,
            key_class,
            key_prefix,
            in_process: Mutex::new(HashSet::new()),
        })
    }

    fn vals(&self, now: DateTime<Utc>) -> Vals<'_> {
        Vals::new(now, self.key_class, &self.key_prefix)
    }
}

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// One raw worker: its own connection, claim → handle → settle until nothing is claimable.
async fn raw_worker<DB: Db>(
    pool: Pool<DB>,
    raw: Arc<Raw>,
    progress: Arc<Progress>,
) -> Result<(), String> {
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    let result = match raw.form {
        Form::Lease => raw_lease::<DB>(&mut conn, &raw, &progress).await,
        Form::RowLock => raw_row_lock::<DB>(&mut conn, &raw, &progress).await,
        Form::Advisory => raw_advisory::<DB>(&mut conn, &raw, &progress).await,
    };
    result.map_err(|e| e.to_string())
}

async fn raw_lease<DB: Db>(
    conn: &mut DB::Connection,
    raw: &Raw,
    progress: &Progress,
) -> sqlx::Result<()> {
    let claim = raw.claim.as_ref().expect("a lease claim");
    while !progress.stop.load(Ordering::Relaxed) {
        let now = now();
        let token = now + LEASE;
        let vals = Vals {
            new_token: token,
            limit: raw.batch as i64,
            ..raw.vals(now)
        };
        let rows = match &raw.begin {
            None => DB::claimed(conn, claim.query::<DB>(&vals)).await?,
            Some(begin) => {
                let mut tx = conn.begin_with(AssertSqlSafe(Arc::clone(begin))).await?;
                let rows = DB::claimed(&mut tx, claim.query::<DB>(&vals)).await?;
                if !rows.is_empty() {
                    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
                    let update = raw
                        .updates
                        .iter()
                        .find(|(n, _)| *n >= ids.len())
                        .or(raw.updates.last())
                        .map(|(_, s)| s)
                        .expect("MySQL lease updates");
                    DB::exec(&mut tx, update.query::<DB>(&Vals { ids: &ids, ..vals })).await?;
                }
                tx.commit().await?;
                rows
            }
        };
        if rows.is_empty() {
            return Ok(());
        }
        for (id, payload, _attempt) in rows {
            progress.handle(id);
            drop(payload);
            let vals = Vals {
                id,
                token,
                ..raw.vals(now)
            };
            let n = DB::exec(conn, raw.finish.query::<DB>(&vals)).await?;
            if n != 1 {
                return Err(sqlx::Error::Protocol(format!(
                    "finish of {id} changed {n} rows"
                )));
            }
            progress.settled.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

async fn raw_row_lock<DB: Db>(
    conn: &mut DB::Connection,
    raw: &Raw,
    progress: &Progress,
) -> sqlx::Result<()> {
    let claim = raw.claim.as_ref().expect("a row lock claim");
    while !progress.stop.load(Ordering::Relaxed) {
        let mut tx = match &raw.begin {
            Some(begin) => conn.begin_with(AssertSqlSafe(Arc::clone(begin))).await?,
            None => conn.begin().await?,
        };
        let vals = Vals {
            limit: 1,
            ..raw.vals(now())
        };
        let Some((id, _payload, _attempt)) =
            DB::claimed(&mut tx, claim.query::<DB>(&vals)).await?.pop()
        else {
            tx.rollback().await?;
            return Ok(());
        };
        progress.handle(id);
        let n = DB::exec(&mut tx, raw.finish.query::<DB>(&Vals { id, ..vals })).await?;
        tx.commit().await?;
        if n != 1 {
            return Err(sqlx::Error::Protocol(format!(
                "finish of {id} changed {n} rows"
            )));
        }
        progress.settled.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

async fn raw_advisory<DB: Db>(
    conn: &mut DB::Connection,
    raw: &Raw,
    progress: &Progress,
) -> sqlx::Result<()> {
    let candidates = raw.candidates.as_ref().expect("a candidates query");
    let take = raw.take.as_ref().expect("a take statement");
    while !progress.stop.load(Ordering::Relaxed) {
        let now = now();
        let vals = Vals {
            limit: raw.candidates_limit,
            ..raw.vals(now)
        };
        let ids = DB::ints(conn, candidates.query::<DB>(&vals)).await?;
        if ids.is_empty() {
            return Ok(());
        }
        for id in ids {
            let vals = Vals { id, ..vals };
            let locked = match &raw.lock {
                Some(lock) => DB::int(conn, lock.query::<DB>(&vals)).await? == Some(1),
                None => raw
                    .in_process
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(id),
            };
            if !locked {
                continue;
            }
            let row = DB::claimed(conn, take.query::<DB>(&vals)).await?.pop();
            if row.is_some() {
                if let Some(count) = &raw.count {
                    DB::exec(conn, count.query::<DB>(&vals)).await?;
                }
                progress.handle(id);
                let n = DB::exec(conn, raw.finish.query::<DB>(&vals)).await?;
                if n != 1 {
                    return Err(sqlx::Error::Protocol(format!(
                        "finish of {id} changed {n} rows"
                    )));
                }
            }
            match &raw.unlock {
                Some(unlock) => {
                    if DB::int(conn, unlock.query::<DB>(&vals)).await? != Some(1) {
                        return Err(sqlx::Error::Protocol(format!("key of {id} not held")));
                    }
                }
                None => {
                    raw.in_process
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&id);
                }
            }
            if row.is_some() {
                progress.settled.fetch_add(1, Ordering::Relaxed);
                // One job per candidates query, as the crate's claim for one free worker.
                break;
            }
        }
    }
    Ok(())
}

async fn run_raw<DB: Db>(ctx: &Ctx, cell: Cell) -> Result<Sample, String> {
    let raw = Arc::new(Raw::new(DB::ID, ctx, cell)?);
    let min_id = ctx.fill::<DB>(cell.rows).await?;
    let pool = ctx.pool::<DB>(cell.workers as u32 + 1).await?;
    let progress = Arc::new(Progress::new(min_id, cell.rows));
    let cpu = cpu_ticks();
    let tasks: Vec<_> = (0..cell.workers)
        .map(|_| {
            tokio::spawn(raw_worker::<DB>(
                pool.clone(),
                Arc::clone(&raw),
                Arc::clone(&progress),
            ))
        })
        .collect();
    let end = wait_settled(
        cell.rows,
        ctx.cap,
        &progress,
        || progress.settled.load(Ordering::Relaxed),
        || {
            tasks
                .iter()
                .all(|t| t.is_finished())
                .then(|| "every raw worker ended".to_owned())
        },
    )
    .await;
    let cpu = cpu.zip(cpu_ticks()).map(|(a, b)| b - a);
    progress.stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    pool.close().await;
    let end = end?;
    if let Some(error) = errors.into_iter().next() {
        return Err(format!("raw worker: {error}"));
    }
    progress.verify(cell.rows, end)?;
    let scans = if end.settled < cell.rows as u64 {
        None
    } else {
        ctx.after::<DB>(cell.rows).await?
    };
    sample(&progress, end, cpu, scans)
}

// ---------------------------------------------------------------------------------------------
// The grid, per database

async fn run_database<DB: Db>(options: &Options, out: &mut Vec<Row>) {
    let url = match DB::URL_VAR {
        Some(var) => match std::env::var(var) {
            Ok(url) => url,
            Err(_) => {
                eprintln!("{}: skipped ({var} is not set)", DB::ID);
                return;
            }
        },
        None => std::env::temp_dir()
            .join(format!("sqlx_queue_bench_{}.db", std::process::id()))
            .to_string_lossy()
            .into_owned(),
    };
    let mut ctx = Ctx {
        url,
        table: format!("bench_throughput_{}", std::process::id()),
        database: String::new(),
        poll: options.poll,
        cap: if options.quick { CAP_QUICK } else { CAP },
    };
    if DB::ID == "mysql" {
        let probe = match DB::connect(&ctx.url, 1).await {
            Ok(pool) => pool,
            Err(e) => {
                eprintln!("{}: skipped (cannot connect: {e})", DB::ID);
                return;
            }
        };
        ctx.database = DB::text(&probe, "SELECT CAST(DATABASE() AS CHAR)".into())
            .await
            .unwrap_or_default();
        probe.close().await;
    }
    let forms = options.forms_for(DB::ID);
    for form in forms {
        for &workers in &options.workers {
            for &batch in &options.batches {
                if batch > 1 && form != Form::Lease {
                    continue;
                }
                let cell = Cell {
                    form,
                    workers,
                    batch,
                    rows: options.rows,
                };
                let row = run_cell::<DB>(&ctx, cell, options).await;
                println!("{}", markdown_row(&row));
                out.push(row);
            }
        }
    }
    // Leave nothing behind.
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

async fn run_cell<DB: Db>(ctx: &Ctx, cell: Cell, options: &Options) -> Row {
    let mut krate = options.sides.0.then(Side::default);
    let mut raw = Side::default();
    for round in 1..=options.rounds {
        if let Some(side) = &mut krate {
            let result = run_crate::<DB>(ctx, cell).await;
            log(DB::ID, cell, round, "crate", &result);
            side.record(result);
        }
        if options.sides.1 {
            let result = run_raw::<DB>(ctx, cell).await;
            log(DB::ID, cell, round, "raw", &result);
            raw.record(result);
        }
    }
    Row {
        db: DB::ID,
        cell,
        krate,
        raw,
    }
}

fn log(db: &str, cell: Cell, round: usize, side: &str, result: &Result<Sample, String>) {
    if let Ok(s) = result {
        let scans = s
            .idx_scans_per_job
            .map(|n| format!(", {n:.2} index scans/job"))
            .unwrap_or_default();
        eprintln!(
            "  {db} {} w{} b{} round {round} {side}: {:.0} jobs/s{}, {:.0} ms CPU/1000 jobs{scans}",
            cell.form.label(),
            cell.workers,
            cell.batch,
            s.jobs_per_s,
            if s.capped { " (capped)" } else { "" },
            s.cpu_ms_per_kjob,
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Output

fn db_label(db: &str) -> &'static str {
    match db {
        "postgres" => "PostgreSQL",
        "mysql" => "MariaDB/MySQL",
        _ => "SQLite",
    }
}

fn rate(value: Option<f64>) -> String {
    value.map_or("—".to_owned(), |v| format!("{v:.0}"))
}

const HEADER: &str = "| database | form | workers | batch | crate best | crate median | raw best | \
     raw median | crate/raw (median) | crate/raw (best) | CPU ms/1000 jobs crate / raw |\n\
     |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

fn markdown_row(row: &Row) -> String {
    let c = row.cell;
    let raw_failed = row.raw.failure.as_ref().map(|_| " (FAILED)").unwrap_or("");
    let (crate_best, crate_median, ratio_median, ratio_best, cpu) = match &row.krate {
        None => (
            "not run".to_owned(),
            "n/a".to_owned(),
            "n/a".to_owned(),
            "n/a".to_owned(),
            format!(
                "— / {:.0}",
                row.raw
                    .median_of(|s| Some(s.cpu_ms_per_kjob))
                    .unwrap_or(f64::NAN)
            ),
        ),
        Some(k) => {
            let ratio = |a: Option<f64>, b: Option<f64>| {
                a.zip(b)
                    .map_or("—".to_owned(), |(a, b)| format!("{:.2}x", a / b))
            };
            let failed = k.failure.as_ref().map(|_| " (FAILED)").unwrap_or("");
            (
                format!("{}{}{failed}", rate(k.best()), k.mark()),
                format!("{}{}", rate(k.median()), k.mark()),
                ratio(k.median(), row.raw.median()),
                ratio(k.best(), row.raw.best()),
                format!(
                    "{:.0} / {:.0}",
                    k.median_of(|s| Some(s.cpu_ms_per_kjob)).unwrap_or(f64::NAN),
                    row.raw
                        .median_of(|s| Some(s.cpu_ms_per_kjob))
                        .unwrap_or(f64::NAN)
                ),
            )
        }
    };
    format!(
        "| {} | {} | {} | {} | {crate_best} | {crate_median} | {}{}{raw_failed} | {}{} | {ratio_median} | {ratio_best} | {cpu} |",
        db_label(row.db),
        c.form.label(),
        c.workers,
        c.batch,
        rate(row.raw.best()),
        row.raw.mark(),
        rate(row.raw.median()),
        row.raw.mark(),
    )
}

/// What the issue's targets say of these figures.
fn summary(rows: &[Row], cap: Duration) {
    let find = |db: &str, form: Form, workers: usize, batch: usize| {
        rows.iter().find(|r| {
            r.db == db && r.cell.form == form && r.cell.workers == workers && r.cell.batch == batch
        })
    };
    let ratio = |r: &Row| {
        r.krate
            .as_ref()
            .and_then(Side::median)
            .zip(r.raw.median())
            .map(|(a, b)| a / b)
    };
    println!();
    if rows
        .iter()
        .any(|r| !r.raw.mark().is_empty() || r.krate.as_ref().is_some_and(|k| !k.mark().is_empty()))
    {
        println!(
            "`*`: a drain was stopped at the cap ({}s after its first job) before the table was \
             empty; its rate is over the jobs it settled.",
            cap.as_secs()
        );
    }
    println!("Targets (medians):");
    for r in rows.iter().filter(|r| r.cell.batch == 1) {
        let Some(x) = ratio(r) else { continue };
        let (goal, applies) = match r.cell.workers {
            1 => (0.95, true),
            8 => (0.9, r.db != "sqlite"),
            _ => (0.0, false),
        };
        if applies {
            println!(
                "- {} {} {} worker(s): crate/raw {x:.2}x, target >= {goal}x: {}",
                db_label(r.db),
                r.cell.form.label(),
                r.cell.workers,
                if x >= goal { "met" } else { "missed" }
            );
        }
    }
    for db in ["postgres", "mysql", "sqlite"] {
        for form in [Form::RowLock, Form::Lease, Form::Advisory] {
            let (Some(one), Some(eight)) = (find(db, form, 1, 1), find(db, form, 8, 1)) else {
                continue;
            };
            let k1 = one.krate.as_ref().and_then(Side::median);
            let k8 = eight.krate.as_ref().and_then(Side::median);
            let (r1, r8) = (one.raw.median(), eight.raw.median());
            println!(
                "- {} {} scaling 1 → 8 workers: crate {}, raw {}{}",
                db_label(db),
                form.label(),
                k1.zip(k8)
                    .map_or("—".into(), |(a, b)| format!("{:.2}x", b / a)),
                r1.zip(r8)
                    .map_or("—".into(), |(a, b)| format!("{:.2}x", b / a)),
                if db == "postgres" && form == Form::RowLock {
                    " (target: crate >= 3x)"
                } else {
                    ""
                }
            );
        }
        if let (Some(b1), Some(b16)) = (find(db, Form::Lease, 8, 1), find(db, Form::Lease, 8, 16))
            && let Some(single) = b1.raw.median()
        {
            let krate = b16.krate.as_ref().and_then(Side::median);
            let raw = b16.raw.median();
            println!(
                "- {} lease 8 workers, batch 16: crate {} the single-row raw loop (target >= \
                 3x); raw batch-16 claims {}",
                db_label(db),
                krate.map_or("—".into(), |k| format!("{:.2}x", k / single)),
                raw.map_or("—".into(), |r| format!("{:.2}x", r / single)),
            );
        }
    }
}

fn main() {
    let options = Options::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        // The crate's own warnings (failed claims and takes, lost leases), for diagnosis.
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    eprintln!(
        "throughput: {} rows of 64 bytes, {} round(s) of crate/raw, workers {:?}, batches {:?}{}",
        options.rows,
        options.rounds,
        options.workers,
        options.batches,
        if options.quick { " (--quick)" } else { "" }
    );
    println!("{HEADER}");
    let mut rows = Vec::new();
    runtime.block_on(async {
        for db in options.dbs.clone() {
            match db.as_str() {
                "postgres" | "pg" => run_database::<sqlx::Postgres>(&options, &mut rows).await,
                "mysql" | "mariadb" => run_database::<sqlx::MySql>(&options, &mut rows).await,
                "sqlite" => run_database::<sqlx::Sqlite>(&options, &mut rows).await,
                other => eprintln!("unknown database {other}: skipped"),
            }
        }
    });
    summary(&rows, if options.quick { CAP_QUICK } else { CAP });
    let failed = rows
        .iter()
        .filter(|r| {
            r.raw.failure.is_some() || r.krate.as_ref().is_some_and(|k| k.failure.is_some())
        })
        .count();
    if failed > 0 {
        eprintln!("{failed} cell(s) had a failed drain: see FAILED above");
        std::process::exit(1);
    }
}
