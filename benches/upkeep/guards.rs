//! The price of the guards a queue can put on its claims: FIFO groups, `per_group(4)` and a rate
//! limit, each against the same queue without it. Every drain is of `--rows` jobs (default
//! 4,000) in `--groups` groups (default 16, interleaved: job `i` is in group `i % groups`), by an
//! unnamed queue serving every group with `--workers` workers (default 8) that ack at once (the
//! queues without a group guard declare no group column: they serve the table as one queue), the
//! guards of a form alternating within each round (none, then each guard), `--rounds` times
//! (default 5). The rate limit is 1,000,000 starts a second, far above what the queue drains:
//! it never holds a claim back, so what it costs is the limiter's own statement per claim (and,
//! on the lease form, the rows it no longer claims ahead of the workers).

use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

use crate::drain::{BenchDb, drain, table_name, url};
use crate::{Options, median_best};

/// The guards measured on each form (the row lock form's on PostgreSQL and MySQL/MariaDB only).
const GUARDS: [&str; 4] = ["none", "fifo", "per_group4", "rate"];

pub(crate) async fn run(options: &Options) {
    println!("| database | form | guard | jobs/s median (best) | ÷ none median (best) |");
    println!("|---|---|---|---:|---:|");
    for db in &options.dbs {
        match db.as_str() {
            "postgres" | "pg" => database::<sqlx::Postgres>(options).await,
            "mysql" | "mariadb" => database::<sqlx::MySql>(options).await,
            "sqlite" => database::<sqlx::Sqlite>(options).await,
            other => eprintln!("guards: unknown database {other}: skipped"),
        }
    }
}

/// The limiter table of the rate limit (the guide's schema, docs/guide/order.md).
fn limits_schema(db: &str, table: &str) -> String {
    let (text, real, int) = match db {
        "postgres" => ("TEXT", "DOUBLE PRECISION", "BIGINT"),
        "mysql" => ("VARCHAR(255)", "DOUBLE", "BIGINT"),
        _ => ("TEXT", "REAL", "INTEGER"),
    };
    format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (name {text} PRIMARY KEY, \
         tokens {real} NOT NULL, refilled_at {real} NOT NULL, granted {int} NOT NULL)"
    )
}

/// Creates the queue table (and its limiter table) afresh and fills it with `rows` jobs of 64
/// bytes in `groups` groups, interleaved.
async fn fill<DB: BenchDb>(
    pool: &Pool<DB>,
    name: &str,
    rows: usize,
    groups: usize,
) -> Result<(), String> {
    DB::exec(pool, DB::schema(name, 100))
        .await
        .map_err(|e| format!("create: {e}"))?;
    DB::exec(pool, limits_schema(DB::ID, &format!("{name}_limits")))
        .await
        .map_err(|e| format!("create the limiter: {e}"))?;
    let table = Table::new(name).group("queue");
    let payload = [b'x'; 64];
    let chunk = sqlx_queue::Queue::table(table.clone()).max_batch();
    let mut next = 0;
    while next < rows {
        let n = (rows - next).min(chunk);
        let jobs: Vec<Job<'_>> = (next..next + n)
            .map(|i| Job::new(&payload).group(format!("g{}", i % groups.max(1))))
            .collect();
        DB::enqueue_many(pool, &table, &jobs)
            .await
            .map_err(|e| format!("fill: {e}"))?;
        next += n;
    }
    Ok(())
}

/// The queue of `guard` (`none`, `fifo`, `per_group4`, `rate`) on a claim form, mounted on a
/// runner of `pool` for the table `name`.
macro_rules! guarded {
    ($pool:expr, $name:expr, $guard:expr, $workers:expr, $db:ty, $form:ident $(, $arg:expr)?) => {{
        // Without a group guard the queue serves the whole table as one queue (an unnamed queue
        // of a table that declares its group column must guard the groups).
        let table = Table::new($name).limits(format!("{}_limits", $name));
        let table = match $guard {
            "fifo" | "per_group4" => table.group("queue"),
            _ => table,
        };
        let queue = Queue::table(table)
            .$form($($arg)?)
            .attempt("attempt")
            .workers($workers);
        let queue = match $guard {
            "fifo" => queue.fifo(),
            "per_group4" => queue.per_group(4),
            "rate" => queue.rate_limit(sqlx_queue::RateLimit::new(1_000_000, Duration::from_secs(1))),
            _ => queue,
        };
        let queue = queue.handler(|_: Delivery<$db>| std::future::ready(Outcome::ack()));
        Runner::new($pool.clone()).mount(queue)
    }};
}

/// The databases with a row lock form.
trait Forms: BenchDb {
    fn row_lock(pool: &Pool<Self>, name: &str, guard: &str, workers: usize)
    -> Option<Runner<Self>>;
}

impl Forms for sqlx::Postgres {
    fn row_lock(
        pool: &Pool<Self>,
        name: &str,
        guard: &str,
        workers: usize,
    ) -> Option<Runner<Self>> {
        Some(guarded!(pool, name, guard, workers, Self, row_lock))
    }
}

impl Forms for sqlx::MySql {
    fn row_lock(
        pool: &Pool<Self>,
        name: &str,
        guard: &str,
        workers: usize,
    ) -> Option<Runner<Self>> {
        Some(guarded!(pool, name, guard, workers, Self, row_lock))
    }
}

impl Forms for sqlx::Sqlite {
    fn row_lock(_: &Pool<Self>, _: &str, _: &str, _: usize) -> Option<Runner<Self>> {
        None
    }
}

/// The queue of `form` with `guard`, mounted on a runner (`None`: no such form on `DB`).
fn runner<DB: Forms>(
    pool: &Pool<DB>,
    name: &str,
    form: &str,
    guard: &str,
    workers: usize,
) -> Option<Runner<DB>> {
    match form {
        "row_lock" => DB::row_lock(pool, name, guard, workers),
        _ => Some(guarded!(
            pool,
            name,
            guard,
            workers,
            DB,
            lease,
            "locked_until"
        )),
    }
}

async fn database<DB: Forms>(options: &Options) {
    let Some(url) = url::<DB>() else { return };
    // The row lock form holds a connection per worker.
    let size = u32::try_from(options.workers + 4).expect("a pool size");
    let pool = DB::connect(&url, size).await.expect("a pool");
    let name = table_name();
    for form in &options.forms {
        if runner::<DB>(&pool, &name, form, "none", options.workers).is_none() {
            continue;
        }
        let guards: Vec<&str> = GUARDS
            .iter()
            .copied()
            .filter(|g| options.guards.is_empty() || options.guards.iter().any(|o| o == g))
            .collect();
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); guards.len()];
        // Each round's rate of every guard, for the ratio of each round.
        let mut rounds: Vec<Vec<Option<f64>>> = Vec::new();
        for round in 1..=options.rounds {
            let mut this = vec![None; guards.len()];
            for (i, guard) in guards.iter().enumerate() {
                fill::<DB>(&pool, &name, options.rows, options.groups)
                    .await
                    .expect("a filled table");
                let runner = runner::<DB>(&pool, &name, form, guard, options.workers)
                    .expect("the form exists");
                match drain(&pool, &name, runner, options.rows, options.cap, None).await {
                    Ok(rate) => {
                        eprintln!(
                            "guards {} {form} round {round} {guard}: {rate:.0} jobs/s",
                            DB::ID
                        );
                        rates[i].push(rate);
                        this[i] = Some(rate);
                    }
                    Err(e) => {
                        eprintln!("guards {} {form} round {round} {guard}: FAILED {e}", DB::ID)
                    }
                }
            }
            rounds.push(this);
        }
        let none = guards.iter().position(|g| *g == "none");
        for (i, guard) in guards.iter().enumerate() {
            let (median, best) = median_best(&rates[i]);
            let ratio = match none {
                Some(none) if none != i => {
                    let ratios: Vec<f64> = rounds
                        .iter()
                        .filter_map(|r| Some(r[i]? / r[none]?))
                        .collect();
                    let (_, none_best) = median_best(&rates[none]);
                    format!("{:.2}x ({:.2}x)", median_best(&ratios).0, best / none_best)
                }
                Some(_) => "1".to_owned(),
                None => "—".to_owned(),
            };
            println!(
                "| {} | {form} | {guard} | {median:.0} ({best:.0}) | {ratio} |",
                DB::ID
            );
        }
    }
    let _ = DB::exec(&pool, format!("DROP TABLE IF EXISTS {name}")).await;
    let _ = DB::exec(&pool, format!("DROP TABLE IF EXISTS {name}_limits")).await;
    pool.close().await;
    if DB::URL_VAR.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
}
