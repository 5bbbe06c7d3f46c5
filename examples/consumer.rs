//! A consumer process, as a service would run one: the reliability tests start it, kill it with
//! SIGKILL in the middle of its deliveries, and check what happens to the rows it held.
//!
//! ```text
//! cargo run --example consumer -- <database> <table> <form> <mode> [workers] [lease-ms]
//! ```
//!
//! - `<database>`: a `postgres://` or `mysql://` URL, or a SQLite file.
//! - `<form>`: `lease`, `row_lock` or `advisory`.
//! - `<mode>`: `hang` (each delivery prints `started <id>` and never ends) or `work:<ms>` (each
//!   delivery prints `started <id>`, works that long, prints `acked <id>` and acks).
//!
//! The table has the columns of the README's schema (`attempt`, `locked_until`, `retry_after`).

use std::time::Duration;

use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

#[derive(Clone, Copy)]
enum Mode {
    Hang,
    Work(Duration),
}

async fn handle(id: i64, mode: Mode) -> Outcome {
    println!("started {id}");
    match mode {
        Mode::Hang => std::future::pending().await,
        Mode::Work(work) => {
            tokio::time::sleep(work).await;
            println!("acked {id}");
            Outcome::ack()
        }
    }
}

/// Mounts one queue of `$form` on `$pool` (a `Pool<$db>`) and runs it until killed.
macro_rules! run {
    ($db:ty, $row_lock:ident, $pool:expr, $table:expr, $form:ident, $mode:expr, $workers:expr, $lease:expr) => {{
        let queue = Queue::table(Table::new($table).retry_after("retry_after"));
        let mode = $mode;
        let runner = Runner::new($pool).poll_interval(Duration::from_millis(20));
        let running = match $form {
            "lease" => {
                runner
                    .mount(
                        queue
                            .lease("locked_until")
                            .lease_duration($lease)
                            .attempt("attempt")
                            .workers($workers)
                            .handler(move |d: Delivery<$db>| handle(d.id(), mode)),
                    )
                    .start()
                    .await?
            }
            "advisory" => {
                runner
                    .mount(
                        queue
                            .advisory_lock()
                            .attempt("attempt")
                            .workers($workers)
                            .handler(move |d: Delivery<$db>| handle(d.id(), mode)),
                    )
                    .start()
                    .await?
            }
            other => run!(@$row_lock $db, runner, queue, other, mode, $workers),
        };
        println!("running");
        std::future::pending::<()>().await;
        drop(running);
    }};
    (@no_row_lock $db:ty, $runner:expr, $queue:expr, $form:expr, $mode:expr, $workers:expr) => {
        return Err(format!("form {} does not exist on SQLite", $form).into())
    };
    (@row_lock $db:ty, $runner:expr, $queue:expr, $form:expr, $mode:expr, $workers:expr) => {{
        if $form != "row_lock" {
            return Err(format!("unknown form {}", $form).into());
        }
        let mode = $mode;
        $runner
            .mount(
                $queue
                    .row_lock()
                    .attempt("attempt")
                    .workers($workers)
                    .handler(move |d: Delivery<$db>| handle(d.id(), mode)),
            )
            .start()
            .await?
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
        _ => return Err(format!("unknown mode {mode}").into()),
    };
    let workers: usize = rest.first().map_or(Ok(1), |w| w.parse())?;
    let lease = Duration::from_millis(rest.get(1).map_or(Ok(30_000), |ms| ms.parse())?);
    let (table, form) = (table.as_str(), form.as_str());
    let max = u32::try_from(workers + 2)?;
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
            lease
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
            lease
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
            lease
        );
    }
    Ok(())
}
