//! Transactional mode, on SQLite with no server: a signup opens its account and queues its
//! welcome email through the delivery's transaction. The CRM call times out on the first
//! attempt: the retry discards both writes; the second attempt commits them with the
//! acknowledgement. The tables are printed after each step.
//!
//! Run it with `cargo run --example transactional`.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};

/// The application's own table, which a signup writes: the queues' tables come from their
/// declarations.
const ACCOUNTS: &str = "CREATE TABLE accounts (email TEXT NOT NULL)";

/// A queue that only enqueues here (another service runs it): declared without a handler.
fn welcome_emails() -> Queue {
    Queue::table(Table::new("welcome_jobs"))
}

/// The CRM registration, which times out on the first attempt.
async fn register(attempt: u32) -> bool {
    attempt > 1
}

/// Opens the account and queues its welcome email, both through the delivery's transaction.
async fn open(d: &mut Delivery<Sqlite, Transactional>) -> Result<(), sqlx_queue::Error> {
    let email = String::from_utf8_lossy(d.payload()).into_owned();
    sqlx::query("INSERT INTO accounts (email) VALUES (?)")
        .bind(&email)
        .execute(&mut *d.tx())
        .await?;
    welcome_emails()
        .enqueue(&mut *d.tx(), Job::new(&email))
        .await?;
    Ok(())
}

/// The handler. `steps` tells `main` where it is, and `go` lets it finish, so that `main` can
/// print the tables in between.
async fn open_account(
    mut d: Delivery<Sqlite, Transactional>,
    steps: mpsc::UnboundedSender<u32>,
    go: Arc<Semaphore>,
) -> Outcome {
    let attempt = d.attempt();
    if open(&mut d).await.is_err() {
        return Outcome::retry();
    }
    let _ = steps.send(attempt);
    if let Ok(permit) = go.acquire().await {
        permit.forget(); // one permit per attempt
    }
    if register(attempt).await {
        // The commit keeps the account and its welcome email, and finishes the signup.
        Outcome::ack()
    } else {
        // The retry rolls the account and its welcome email back first.
        Outcome::retry()
    }
}

async fn print_tables(pool: &SqlitePool, after: &str) -> Result<(), sqlx::Error> {
    let count = |table: &str| format!("SELECT COUNT(*) FROM {table}");
    let mut line = format!("after {after}:");
    for table in ["signup_jobs", "accounts", "welcome_jobs"] {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count(table)))
            .fetch_one(pool)
            .await?;
        line.push_str(&format!(" {table}={n}"));
    }
    println!("{line}");
    Ok(())
}

/// Waits (at most 10 s) until `done` holds.
async fn until(done: impl Fn() -> bool) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        if tokio::time::Instant::now() > deadline {
            return Err("the runner did not settle the signup within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!(
        "sqlx-queue-transactional-{}.db",
        std::process::id()
    ));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await?;
    sqlx::raw_sql(ACCOUNTS).execute(&pool).await?;

    let signups = Queue::table(Table::new("signup_jobs"))
        .lease("locked_until")
        .attempt("attempt");
    // The queues' tables, as declared here (the welcome emails': the columns enqueuing needs;
    // the service that runs them declares the rest).
    signups.schema::<Sqlite>()?.create(&pool).await?;
    welcome_emails().schema::<Sqlite>()?.create(&pool).await?;
    signups
        .enqueue(&pool, Job::new("alice@example.com"))
        .await?;
    print_tables(&pool, "the signup was queued").await?;

    let (tx, mut steps) = mpsc::unbounded_channel();
    let go = Arc::new(Semaphore::new(0));
    let signups = signups.transactional().handler({
        let go = Arc::clone(&go);
        move |d| open_account(d, tx.clone(), Arc::clone(&go))
    });
    let running = Runner::new(pool.clone()).mount(signups).start().await?;
    let mut step = async || -> Result<u32, Box<dyn std::error::Error>> {
        let next = tokio::time::timeout(Duration::from_secs(10), steps.recv()).await?;
        Ok(next.ok_or("the runner stopped")?)
    };

    let attempt = step().await?;
    print_tables(&pool, &format!("attempt {attempt} wrote, uncommitted")).await?;
    println!("attempt {attempt}: the CRM times out: retry");
    go.add_permits(1);
    until(|| running.stats().retried == 1).await?;
    print_tables(&pool, "the retry rolled them back").await?;

    let attempt = step().await?;
    print_tables(&pool, &format!("attempt {attempt} wrote, uncommitted")).await?;
    println!("attempt {attempt}: the CRM answers: ack");
    go.add_permits(1);
    until(|| running.stats().acked == 1).await?;
    print_tables(&pool, "the ack committed them with the settlement").await?;

    running.shutdown().await?;
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
