//! A queue on SQLite, with no server: create its table from the declaration (printing it as a
//! migration), enqueue three emails, run the queue (one email fails on its first attempt and is
//! retried after a short delay), print what happened, exit.
//!
//! Run it with `cargo run --example quickstart`.

use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

/// Sends one email; the mail server "times out" on bob's first attempt.
async fn send(email: Delivery<Sqlite>) -> Outcome {
    let to = String::from_utf8_lossy(email.payload()).into_owned();
    if to.starts_with("bob") && email.attempt() == 1 {
        println!(
            "row {}: sending to {to} timed out on attempt 1, retrying in 200 ms",
            email.id()
        );
        return Outcome::retry_after(Duration::from_millis(200));
    }
    println!(
        "row {}: sent to {to} on attempt {}",
        email.id(),
        email.attempt()
    );
    Outcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file =
        std::env::temp_dir().join(format!("sqlx-queue-quickstart-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;

    // The queue, declared once: enqueue through it, and mount it with its handler.
    let emails = Queue::table(Table::new("email_jobs").retry_after("retry_after"))
        .lease("locked_until")
        .attempt("attempt")
        .workers(2);
    let runner = Runner::new(pool.clone()).mount(emails.clone().handler(send));

    // The tables the runner needs, as its declaration says: put this in your migrations. Here,
    // on a new database file, the example creates them itself.
    let schema = runner.schema()?;
    println!("{schema}\n");
    schema.create(&pool).await?;

    for to in ["alice@example.com", "bob@example.com", "carol@example.com"] {
        emails.enqueue(&pool, Job::new(to)).await?;
    }
    println!("enqueued 3 emails");

    let running = runner.start().await?;

    // Wait (at most 10 s) until every row is settled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM email_jobs")
            .fetch_one(&pool)
            .await?;
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{left} rows still queued after 10 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let stats = running.stats();
    running.shutdown().await?;
    println!(
        "done: {} acked, {} retried, queue empty",
        stats.acked, stats.retried
    );
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
