//! A consumer process, as a service would run one: the crash tests (`tests/it` and the
//! reliability suite, `tests/reliability`) start it, kill it with SIGKILL in the middle of its
//! deliveries and check what happens to the rows it held; the soak runs three side by side.
//!
//! ```text
//! cargo run --example consumer -- <database> <table> <form> <mode> [workers] [lease-ms]
//! ```
//!
//! - `<database>`: a `postgres://` or `mysql://` URL, or a SQLite file.
//! - `<form>`: `lease`, `row_lock` or `advisory`; or `lease_per_group:<n>`, the lease form on a
//!   table grouped by its `queue` column with `.per_group(n)` (`1`: FIFO), serving every group;
//!   `row_lock_fifo`, the row lock form on that table with `.fifo()`.
//! - `<mode>`:
//!   - `hang`: each delivery prints `started <id>` and never ends;
//!   - `work:<ms>`: each delivery prints `started <id>`, works that long, prints `acked <id>` and
//!     acks;
//!   - `ledger:<ms>`: each delivery writes a row into `<table>_deliveries` (`job`, `attempt`,
//!     `pid`, `started_us`) through the pool when it starts, works that long, writes its
//!     `ended_us` and acks (times in microseconds since the Unix epoch, by this host's clock);
//!   - `soak:<seed>`: a transactional queue capped at 3 attempts, dead-lettered into the table
//!     `<table>_dead`; each delivery writes (`job`, `attempt`, `pid`) into `<table>_effects`
//!     through its transaction, then settles as [`soak::decide`] says: only an ack commits it.
//!
//! The table has the columns of the guide's schema (docs/guide/table.md) (`attempt`, `locked_until`, `retry_after`).
//! The process prints `running` once its runner has started.

#[path = "consumer/soak.rs"]
mod soak;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use sqlx_queue::{DeadLetter, Delivery, Outcome, Queue, Runner, Table, Transactional};

#[derive(Clone, Copy)]
enum Mode {
    Hang,
    Work(Duration),
    Ledger(Duration),
    Soak(u64),
}

/// A write into the `ledger` mode's table.
#[derive(Clone, Copy)]
enum Entry {
    Started { id: i64, attempt: u32, at: i64 },
    Ended { id: i64, started: i64, at: i64 },
}

/// Writes ledger entries through the pool; made for each database in `main`.
type Ledger = Arc<dyn Fn(Entry) -> BoxFuture<'static, ()> + Send + Sync>;

fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

async fn handle(id: i64, attempt: u32, mode: Mode, ledger: Option<Ledger>) -> Outcome {
    match (mode, ledger) {
        (Mode::Ledger(work), Some(ledger)) => {
            let started = micros_now();
            ledger(Entry::Started {
                id,
                attempt,
                at: started,
            })
            .await;
            tokio::time::sleep(work).await;
            ledger(Entry::Ended {
                id,
                started,
                at: micros_now(),
            })
            .await;
            Outcome::ack()
        }
        (Mode::Work(work), _) => {
            println!("started {id}");
            tokio::time::sleep(work).await;
            println!("acked {id}");
            Outcome::ack()
        }
        _ => {
            println!("started {id}");
            std::future::pending().await
        }
    }
}

fn soak_outcome(decision: soak::Decision) -> Outcome {
    match decision {
        soak::Decision::Ack => Outcome::ack(),
        soak::Decision::Retry => Outcome::retry(),
        soak::Decision::RetryAfter(delay) => Outcome::retry_after(delay),
        soak::Decision::Drop => Outcome::drop(),
    }
}

/// `?` placeholders as PostgreSQL writes them (`$1`, `$2`, ..) when `numbered`.
fn placeholders(sql: &str, numbered: bool) -> String {
    if !numbered {
        return sql.to_owned();
    }
    let mut n = 0;
    let mut out = String::with_capacity(sql.len() + 8);
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// The `ledger` mode's writer on `$pool` (a `Pool<_>`).
macro_rules! ledger {
    ($pool:expr, $table:expr, $numbered:expr) => {{
        let pool = $pool.clone();
        let insert = placeholders(
            &format!(
                "INSERT INTO {}_deliveries (job, attempt, pid, started_us) VALUES (?, ?, ?, ?)",
                $table
            ),
            $numbered,
        );
        let end = placeholders(
            &format!(
                "UPDATE {}_deliveries SET ended_us = ? \
                 WHERE job = ? AND pid = ? AND started_us = ?",
                $table
            ),
            $numbered,
        );
        let pid = i64::from(std::process::id());
        let ledger: Ledger = Arc::new(move |entry| {
            let (pool, insert, end) = (pool.clone(), insert.clone(), end.clone());
            Box::pin(async move {
                let written = match entry {
                    Entry::Started { id, attempt, at } => {
                        sqlx::query(sqlx::AssertSqlSafe(insert))
                            .bind(id)
                            .bind(i64::from(attempt))
                            .bind(pid)
                            .bind(at)
                            .execute(&pool)
                            .await
                    }
                    Entry::Ended { id, started, at } => {
                        sqlx::query(sqlx::AssertSqlSafe(end))
                            .bind(at)
                            .bind(id)
                            .bind(pid)
                            .bind(started)
                            .execute(&pool)
                            .await
                    }
                };
                if let Err(error) = written {
                    eprintln!("the ledger write failed: {error}");
                }
            })
        });
        ledger
    }};
}

/// The `soak` mode's handler for deliveries of `$db`.
macro_rules! soak_handler {
    ($db:ty, $table:expr, $seed:expr, $numbered:expr) => {{
        let insert = placeholders(
            &format!(
                "INSERT INTO {}_effects (job, attempt, pid) VALUES (?, ?, ?)",
                $table
            ),
            $numbered,
        );
        let (seed, pid) = ($seed, i64::from(std::process::id()));
        move |mut d: Delivery<$db, Transactional>| {
            let insert = insert.clone();
            async move {
                let (id, attempt) = (d.id(), d.attempt());
                // Written before the outcome is chosen: only an ack may commit it.
                let written = sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(id)
                    .bind(i64::from(attempt))
                    .bind(pid)
                    .execute(&mut *d.tx())
                    .await;
                if let Err(error) = written {
                    eprintln!("the effect of row {id} was not written: {error}");
                    return Outcome::retry();
                }
                soak_outcome(soak::decide(seed, id, attempt))
            }
        }
    }};
}

/// The prefix of the forms with a per-group limit.
const PER_GROUP: &str = "lease_per_group:";

/// Gives `$queue` the claim form named `$form`, finishes its chain with `$finish` (which sees the
/// queue as `$q`), mounts it on `$runner` and starts it.
macro_rules! start {
    (
        $row_lock:ident,
        $runner:expr,
        $queue:expr,
        $form:expr,
        $lease:expr,
        |$q:ident| $finish:expr
    ) => {
        match $form {
            "lease" => {
                let $q = $queue.lease("locked_until").lease_duration($lease);
                $runner.mount($finish).start().await?
            }
            "advisory" => {
                let $q = $queue.advisory_lock();
                $runner.mount($finish).start().await?
            }
            other if other.starts_with(PER_GROUP) => {
                let n: u32 = other[PER_GROUP.len()..].parse()?;
                let $q = $queue
                    .lease("locked_until")
                    .lease_duration($lease)
                    .per_group(n);
                $runner.mount($finish).start().await?
            }
            other => start!(@$row_lock other, $runner, $queue, |$q| $finish),
        }
    };
    (@no_row_lock $form:expr, $runner:expr, $queue:expr, |$q:ident| $finish:expr) => {
        return Err(format!("form {} does not exist on SQLite", $form).into())
    };
    (@row_lock $form:expr, $runner:expr, $queue:expr, |$q:ident| $finish:expr) => {{
        match $form {
            "row_lock" => {
                let $q = $queue.row_lock();
                $runner.mount($finish).start().await?
            }
            "row_lock_fifo" => {
                let $q = $queue.row_lock().fifo();
                $runner.mount($finish).start().await?
            }
            _ => return Err(format!("unknown form {}", $form).into()),
        }
    }};
}

/// Mounts one queue on `$pool` (a `Pool<$db>`) and runs it until killed.
macro_rules! run {
    (
        $db:ty,
        $row_lock:ident,
        $pool:expr,
        $table:expr,
        $form:expr,
        $mode:expr,
        $workers:expr,
        $lease:expr,
        $numbered:expr
    ) => {{
        let pool = $pool;
        let (table, mode, workers) = ($table, $mode, $workers);
        let runner = Runner::new(pool.clone()).poll_interval(Duration::from_millis(20));
        let mut declared = Table::new(table).retry_after("retry_after");
        if $form.starts_with(PER_GROUP) || $form == "row_lock_fifo" {
            declared = declared.group("queue");
        }
        let queue = Queue::table(declared);
        let running = match mode {
            Mode::Soak(seed) => {
                let handler = soak_handler!($db, table, seed, $numbered);
                let dead = DeadLetter::table(format!("{table}_dead"));
                start!($row_lock, runner, queue, $form, $lease, |q| q
                    .attempt("attempt")
                    .max_attempts(soak::MAX_ATTEMPTS)
                    .dead_letter(dead)
                    .transactional()
                    .workers(workers)
                    .handler(handler))
            }
            _ => {
                let ledger =
                    matches!(mode, Mode::Ledger(_)).then(|| ledger!(pool, table, $numbered));
                start!($row_lock, runner, queue, $form, $lease, |q| q
                    .attempt("attempt")
                    .workers(workers)
                    .handler(move |d: Delivery<$db>| handle(
                        d.id(),
                        d.attempt(),
                        mode,
                        ledger.clone()
                    )))
            }
        };
        println!("running");
        std::future::pending::<()>().await;
        drop(running);
    }};
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [database, table, form, mode, rest @ ..] = args.as_slice() else {
        return Err("usage: consumer <database> <table> <form> <mode> [workers] [lease-ms]".into());
    };
    let mode = match mode.split_once(':') {
        None if mode == "hang" => Mode::Hang,
        Some(("work", ms)) => Mode::Work(Duration::from_millis(ms.parse()?)),
        Some(("ledger", ms)) => Mode::Ledger(Duration::from_millis(ms.parse()?)),
        Some(("soak", seed)) => Mode::Soak(seed.parse()?),
        _ => return Err(format!("unknown mode {mode}").into()),
    };
    let workers: usize = rest.first().map_or(Ok(1), |w| w.parse())?;
    let lease = Duration::from_millis(rest.get(1).map_or(Ok(30_000), |ms| ms.parse())?);
    let (table, form) = (table.as_str(), form.as_str());
    // Ledger writes go through the pool, beside the connections the form holds.
    let extra = if matches!(mode, Mode::Ledger(_)) {
        workers + 2
    } else {
        2
    };
    let max = u32::try_from(workers + extra)?;
    if database.starts_with("postgres") {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(max)
            .connect(database)
            .await?;
        run!(
            sqlx::Postgres,
            row_lock,
            pool,
            table,
            form,
            mode,
            workers,
            lease,
            true
        );
    } else if database.starts_with("mysql") {
        let pool = sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(max)
            .connect(database)
            .await?;
        run!(
            sqlx::MySql,
            row_lock,
            pool,
            table,
            form,
            mode,
            workers,
            lease,
            false
        );
    } else {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(database)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(max)
            .connect_with(options)
            .await?;
        run!(
            sqlx::Sqlite,
            no_row_lock,
            pool,
            table,
            form,
            mode,
            workers,
            lease,
            false
        );
    }
    Ok(())
}
