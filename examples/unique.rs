//! Unique jobs, on SQLite with no server: a search index refresh debounced per account, a welcome
//! email that is never queued twice, a report whose latest request replaces the one waiting — and
//! a signup handler that queues its welcome email, uniquely, in its own transaction.
//!
//! Run it with `cargo run --example unique`.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::state::Lease;
use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::mpsc;

/// The queue of unique jobs (its lease column tells a replace or debounce a job in work). Its
/// table has a unique index on `dedupe`: one unfinished job per key (finished jobs are deleted,
/// which frees their key).
fn jobs() -> Queue<Lease> {
    let table = Table::new("jobs")
        .unique_key("dedupe")
        .retry_after("retry_after")
        .created_at("created_at");
    Queue::table(table).lease("locked_until")
}

/// Queues the welcome email of the signup in the delivery's transaction: it commits with the
/// signup's acknowledgement, and a second signup of the same address queues nothing.
async fn signup(mut d: Delivery<Sqlite, Transactional>) -> sqlx_queue::Result<Outcome> {
    let email = String::from_utf8_lossy(d.payload()).into_owned();
    let welcome = Job::new(&email).unique(format!("welcome:{email}"));
    let done = jobs().enqueue_unique(&mut *d.tx(), welcome).await?;
    println!("signup of {email}: welcome email {}", said(done));
    Ok(Outcome::ack())
}

fn said(done: Enqueued) -> &'static str {
    match done {
        Enqueued::New(_) => "queued",
        Enqueued::Duplicate(_) => "already queued",
        Enqueued::Replaced(_) => "replaced",
        Enqueued::Debounced(_) => "pushed later",
        Enqueued::InWork(_) => "in work, left alone",
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlx-queue-unique-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool: SqlitePool = SqlitePoolOptions::new().connect_with(options).await?;
    let jobs = jobs();
    jobs.schema::<Sqlite>()?.create(&pool).await?;

    // Three edits of account 42 in a row: one refresh, 10 s after the last edit, and at the
    // latest a minute after the first.
    for edit in 1..=3 {
        let refresh = Job::new("refresh account 42")
            .unique("refresh:42")
            .debounce(Duration::from_secs(10), Duration::from_secs(60));
        let done = jobs.enqueue_unique(&pool, refresh).await?;
        println!("edit {edit}: index refresh {}", said(done));
    }

    // The latest report request replaces the one waiting.
    for month in ["2026-10", "2026-11"] {
        let report = Job::new(month).unique("report:monthly").replace();
        let done = jobs.enqueue_unique(&pool, report).await?;
        println!("report for {month}: {}", said(done));
    }

    // Two signups of one address, each queueing the welcome email in its own transaction.
    let signups = Queue::table(Table::new("signups")).lease("locked_until");
    signups.schema::<Sqlite>()?.create(&pool).await?;
    signups
        .enqueue_many(
            &pool,
            &[Job::new("ann@example.com"), Job::new("ann@example.com")],
        )
        .await?;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel();
    let queue =
        signups
            .transactional()
            .workers(1)
            .handler(move |d: Delivery<Sqlite, Transactional>| {
                let done_tx = done_tx.clone();
                async move {
                    let outcome = signup(d).await;
                    let _ = done_tx.send(());
                    outcome
                }
            });
    let running = Runner::new(pool.clone()).mount(queue).start().await?;
    for _ in 0..2 {
        done_rx.recv().await;
    }
    running.shutdown().await?;

    let keys: Vec<(String, Vec<u8>)> =
        sqlx::query_as("SELECT dedupe, payload FROM jobs ORDER BY id")
            .fetch_all(&pool)
            .await?;
    for (key, payload) in keys {
        println!("queued: {key} = {}", String::from_utf8_lossy(&payload));
    }
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
