//! The price of a unique key column on enqueue: the same jobs enqueued into the same table
//! without the column (**plain**: `Table::enqueue`, `Table::enqueue_many`) and with a `dedupe`
//! column, its unique index and a fresh key per job (**unique**: `Table::enqueue_unique`,
//! `Table::enqueue_many_unique`), the two sides alternating within each round.

use std::sync::Arc;
use std::time::Instant;

use sqlx::Pool;
use sqlx_queue::{Enqueued, Job, Table};

use crate::drain::{BenchDb, QUEUE, table_name, url};
use crate::{Options, median_best};

/// The two ways of enqueueing measured.
const MODES: [&str; 2] = ["single", "bulk"];
/// The two tables.
const SIDES: [&str; 2] = ["plain", "unique"];

pub(crate) async fn run(options: &Options) {
    println!(
        "| database | mode | jobs | plain jobs/s median (best) | unique jobs/s median (best) | \
         unique ÷ plain, median of rounds (best) |"
    );
    println!("|---|---|---:|---:|---:|---:|");
    for db in &options.dbs {
        match db.as_str() {
            "postgres" | "pg" => database::<sqlx::Postgres>(options).await,
            "mysql" | "mariadb" => database::<sqlx::MySql>(options).await,
            "sqlite" => database::<sqlx::Sqlite>(options).await,
            other => eprintln!("unique: unknown database {other}: skipped"),
        }
    }
}

/// How many jobs a mode enqueues in one measurement: `--rows` one at a time, ten times as many
/// in batches of `--batch`.
fn jobs_of(options: &Options, mode: &str) -> usize {
    if mode == "single" {
        options.rows
    } else {
        options.rows * 10
    }
}

async fn database<DB: BenchDb>(options: &Options) {
    let Some(url) = url::<DB>() else { return };
    let size = u32::try_from(options.workers + 2).expect("a pool size");
    let pool = DB::connect(&url, size).await.expect("a pool");
    let name = table_name();
    for mode in MODES {
        let rows = jobs_of(options, mode);
        // Per side its rates; per round the ratio of the round's two rates.
        let mut rates = [Vec::new(), Vec::new()];
        let mut ratios = Vec::new();
        for round in 1..=options.rounds {
            // A B, then B A: neither side always runs on the table space the other just left.
            let order = if round % 2 == 1 { [0, 1] } else { [1, 0] };
            let mut this = [f64::NAN; 2];
            for side in order {
                match once::<DB>(&pool, &name, mode, SIDES[side], rows, round, options).await {
                    Ok(rate) => {
                        eprintln!(
                            "unique {} {mode} round {round} {}: {rate:.0} jobs/s",
                            DB::ID,
                            SIDES[side]
                        );
                        rates[side].push(rate);
                        this[side] = rate;
                    }
                    Err(e) => eprintln!(
                        "unique {} {mode} round {round} {}: FAILED {e}",
                        DB::ID,
                        SIDES[side]
                    ),
                }
            }
            if this.iter().all(|r| r.is_finite()) {
                ratios.push(this[1] / this[0]);
            }
        }
        let (plain_median, plain_best) = median_best(&rates[0]);
        let (unique_median, unique_best) = median_best(&rates[1]);
        let (ratio_median, _) = median_best(&ratios);
        println!(
            "| {} | {mode} | {rows} | {plain_median:.0} ({plain_best:.0}) | {unique_median:.0} \
             ({unique_best:.0}) | {ratio_median:.3}x ({:.3}x) |",
            DB::ID,
            unique_best / plain_best
        );
    }
    let _ = DB::exec(&pool, format!("DROP TABLE IF EXISTS {name}")).await;
    pool.close().await;
    if DB::URL_VAR.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{url}{suffix}"));
        }
    }
}

/// One measurement: a fresh table of `side`, `rows` jobs enqueued by `mode` from
/// `--workers` tasks at once, checked (every job new, the table holding `rows` rows, each key
/// once): jobs per second.
async fn once<DB: BenchDb>(
    pool: &Pool<DB>,
    name: &str,
    mode: &str,
    side: &str,
    rows: usize,
    round: usize,
    options: &Options,
) -> Result<f64, String> {
    let unique = side == "unique";
    // One script, on one connection: another SQLite connection may still hold the schema of
    // the table this one replaces.
    let mut schema = DB::schema(name, 100);
    let mut table = Table::new(name).group("queue");
    if unique {
        schema = format!("{schema}; {}", DB::unique_column(name));
        table = table.unique_key("dedupe");
    }
    DB::exec(pool, schema)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let table = Arc::new(table);
    // The keys are made before the clock starts; each task takes every `workers`-th.
    let keys: Arc<Vec<String>> = Arc::new((0..rows).map(|i| format!("r{round}-{i}")).collect());
    let workers = options.workers.max(1);
    let batch = options
        .batch
        .clamp(1, sqlx_queue::Queue::table((*table).clone()).max_batch());
    let began = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for worker in 0..workers {
        let (pool, table, keys) = (pool.clone(), Arc::clone(&table), Arc::clone(&keys));
        let mode = mode.to_owned();
        tasks.push(tokio::spawn(async move {
            let payload = [b'x'; 64];
            let mine: Vec<&str> = keys
                .iter()
                .skip(worker)
                .step_by(workers)
                .map(String::as_str)
                .collect();
            let job = || Job::new(&payload).group(QUEUE);
            let fresh = |done: Enqueued| match done {
                Enqueued::New(_) => Ok(()),
                other => Err(format!("a fresh key was not new: {other:?}")),
            };
            if mode == "single" {
                for key in mine {
                    if unique {
                        let done = DB::enqueue_unique(&pool, &table, job().unique(key))
                            .await
                            .map_err(|e| e.to_string())?;
                        fresh(done)?;
                    } else {
                        DB::enqueue(&pool, &table, job())
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            } else {
                for chunk in mine.chunks(batch) {
                    if unique {
                        let jobs: Vec<_> = chunk.iter().map(|k| job().unique(*k)).collect();
                        for done in DB::enqueue_many_unique(&pool, &table, &jobs)
                            .await
                            .map_err(|e| e.to_string())?
                        {
                            fresh(done)?;
                        }
                    } else {
                        let jobs: Vec<_> = chunk.iter().map(|_| job()).collect();
                        DB::enqueue_many(&pool, &table, &jobs)
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            }
            Ok::<(), String>(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| format!("task: {e}"))??;
    }
    let secs = began.elapsed().as_secs_f64();
    let count = |sql: String| DB::scalar(pool, sql);
    let total = count(format!("SELECT COUNT(*) FROM {name}"))
        .await
        .map_err(|e| format!("count: {e}"))?;
    if total != rows as i64 {
        return Err(format!("{total} rows, not {rows}"));
    }
    if unique {
        let keys = count(format!("SELECT COUNT(DISTINCT dedupe) FROM {name}"))
            .await
            .map_err(|e| format!("count keys: {e}"))?;
        if keys != rows as i64 {
            return Err(format!("{keys} keys, not {rows}"));
        }
    }
    Ok(rows as f64 / secs)
}
