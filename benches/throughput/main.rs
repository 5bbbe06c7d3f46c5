//! Throughput: this crate against a hand-written sqlx baseline with the fewest statements each
//! claim form allows.
//!
//! Each drain fills a fresh table with N rows (default 20,000, 64-byte payloads) by the crate's
//! bulk insert ([`sqlx_queue::Table::enqueue_many`]), then drains it with
//!
//! - **crate**: a [`sqlx_queue::Runner`] with one queue of `workers` workers, an attempt column,
//!   and a handler that acks at once (batch 16: `.batch(16).batch_handler(..)`, every form);
//! - **baseline**: `workers` independent tokio tasks, each on a connection of its own, looping
//!   claim → handle → settle in the bench's own SQL (`benches/sql/baseline.rs`, not the crate's
//!   renderer), a batch of up to 1 or 16 rows at a time, attempts counted:
//!   - row lock: `BEGIN`, `SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED`, one `DELETE`
//!     of the batch, `COMMIT` (4 round trips per batch);
//!   - lease: one claim `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP LOCKED) RETURNING …`
//!     and one `DELETE` fenced by the token (2; MySQL/MariaDB claims with a locking `SELECT` and
//!     an `UPDATE` in a transaction: 5; SQLite, one writer at a time, without `SKIP LOCKED`: 2);
//!   - advisory, on the worker's session: one statement locking up to n free rows in id order,
//!     one re-read that counts the attempt, one `DELETE`, one unlock of every key (4;
//!     MySQL/MariaDB, without `UPDATE … RETURNING`, counts and re-reads in two: 5; SQLite, whose
//!     keys live in the process as the crate's do: candidates, take and `DELETE`, 3).
//!
//! The two sides alternate, A B A B, for 3 rounds; each drain is timed from the first handled
//! job to the last settled one. Then one more drain per side (`--count-rows`, default 4,000),
//! not timed, counts from its start to its last settlement the round trips on the wire (a
//! proxy that reads the protocol's frames, `wire.rs`; SQLite: the statements) and the
//! statements sqlx logs (`count.rs`): per delivery, and per batch (a handler call of the crate,
//! a claim that took rows of the baseline). Every drain is verified: each row handled exactly
//! once, every settlement counted, and the table empty at the end.
//!
//! The grid is database {PostgreSQL, MariaDB/MySQL, SQLite} x form {row lock, lease, advisory}
//! x workers {1, 4, 8} x batch {1, 16}, where each applies (SQLite has no row lock).
//!
//! ```sh
//! export SQLX_QUEUE_PG_URL=postgres://postgres@127.0.0.1:5432/test
//! export SQLX_QUEUE_MYSQL_URL=mysql://root@127.0.0.1:3306/test
//! cargo bench --bench throughput -- --quick    # a subset, a few minutes
//! cargo bench --bench throughput               # the whole grid
//! cargo bench --bench throughput -- --db postgres --form lease --workers 1,8 --rows 5000
//! ```
//!
//! Options: `--rows N`, `--rounds N`, `--count-rows N` (0: no counted drain), `--db
//! postgres,mysql,sqlite`, `--form row_lock,lease,advisory`, `--workers 1,4,8`, `--batch 1,16`,
//! `--side crate|baseline`, `--poll-ms N` (the runner's poll interval),
//! `--no-test-before-acquire` (pools that do not ping a connection at each acquire). `--quick`:
//! 2,000 rows, 1 round, counted drains of 2,000, workers 1 and 8, batches 1 and 16, one form
//! per database (PostgreSQL row lock, MariaDB/MySQL advisory, SQLite lease).
//! `RUST_LOG=sqlx_queue=debug` shows the crate's logs.
//!
//! A database whose URL is not set is skipped with a notice; SQLite runs in a temporary file.
//! The Markdown table, a summary and the baseline's statements go to standard output, progress
//! and diagnostics to standard error.

mod baseline;
mod count;
mod db;
mod drain;
mod grid;
mod krate;
mod report;
#[path = "../sql/baseline.rs"]
mod sql;
mod wire;

use std::time::Duration;

use crate::db::{Counting, Ctx, Db};
use crate::grid::{Cell, Form, Options, Row, Side};

/// A drain still running after this long is stopped, and its rate taken over what it settled
/// (marked `*` in the table): a stalling runner must not hold the grid for an hour.
const CAP: Duration = Duration::from_secs(120);
const CAP_QUICK: Duration = Duration::from_secs(20);

async fn run_database<DB: Db>(
    options: &Options,
    out: &mut Vec<Row>,
    run: &mut Vec<(&'static str, Form)>,
) {
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
        proxy: None,
    };
    if let (Some(wire), Some((host, port)), true) = (
        DB::WIRE,
        DB::server_address(&ctx.url),
        options.count_rows > 0,
    ) {
        match wire::proxy(wire, host, port).await {
            Ok(local) => ctx.proxy = Some(local),
            Err(e) => eprintln!("{}: round trips not counted on the wire: {e}", DB::ID),
        }
    }
    if DB::ID == "mysql" {
        let probe = match DB::connect(&ctx.url, 1, Counting::Off).await {
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
    for form in options.forms_for(DB::ID, DB::FORMS) {
        run.push((DB::ID, form));
        for &workers in &options.workers {
            for &batch in &options.batches {
                let cell = Cell {
                    form,
                    workers,
                    batch,
                    rows: options.rows,
                };
                let row = run_cell::<DB>(&ctx, cell, options).await;
                println!("{}", report::markdown_row(&row));
                out.push(row);
            }
        }
    }
    // Leave nothing behind.
    if let Ok(pool) = DB::connect(&ctx.url, 1, Counting::Off).await {
        let _ = DB::script(&pool, format!("DROP TABLE IF EXISTS {}", ctx.table)).await;
        pool.close().await;
    }
    if DB::URL_VAR.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", ctx.url));
        }
    }
}

/// The rounds of a cell, A B A B, then one counted drain per side.
async fn run_cell<DB: Db>(ctx: &Ctx, cell: Cell, options: &Options) -> Row {
    let mut krate = options.sides.0.then(Side::default);
    let mut baseline = options.sides.1.then(Side::default);
    let counted = Cell {
        rows: options.count_rows.min(cell.rows),
        ..cell
    };
    let rounds = (1..=options.rounds).map(|round| (format!("round {round}"), cell, false));
    let count = (counted.rows > 0).then(|| ("counted".to_owned(), counted, true));
    for (round, cell, counted) in rounds.chain(count) {
        if let Some(side) = &mut krate {
            let result = krate::run::<DB>(ctx, cell, counted).await;
            report::log(DB::ID, cell, &round, "crate", &result);
            side.record(result);
        }
        if let Some(side) = &mut baseline {
            let result = baseline::run::<DB>(ctx, cell, counted).await;
            report::log(DB::ID, cell, &round, "baseline", &result);
            side.record(result);
        }
    }
    Row {
        db: DB::ID,
        cell,
        krate,
        baseline,
    }
}

fn main() {
    let options = Options::parse();
    count::install();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    eprintln!(
        "throughput: {} rows of 64 bytes, {} round(s) of crate/baseline, workers {:?}, batches \
         {:?}, statements counted over {} rows{}",
        options.rows,
        options.rounds,
        options.workers,
        options.batches,
        options.count_rows.min(options.rows),
        if options.quick { " (--quick)" } else { "" }
    );
    println!("{}", report::HEADER);
    let mut rows = Vec::new();
    let mut run = Vec::new();
    runtime.block_on(async {
        for db in options.dbs.clone() {
            match db.as_str() {
                "postgres" | "pg" => {
                    run_database::<sqlx::Postgres>(&options, &mut rows, &mut run).await;
                }
                "mysql" | "mariadb" => {
                    run_database::<sqlx::MySql>(&options, &mut rows, &mut run).await;
                }
                "sqlite" => run_database::<sqlx::Sqlite>(&options, &mut rows, &mut run).await,
                other => eprintln!("unknown database {other}: skipped"),
            }
        }
    });
    report::summary(&rows, if options.quick { CAP_QUICK } else { CAP });
    report::statements(&run);
    let failed = |side: &Option<Side>| side.as_ref().is_some_and(|s| s.failure.is_some());
    let failed = rows
        .iter()
        .filter(|r| failed(&r.krate) || failed(&r.baseline))
        .count();
    if failed > 0 {
        eprintln!("{failed} cell(s) had a failed drain: see FAILED above");
        std::process::exit(1);
    }
}
