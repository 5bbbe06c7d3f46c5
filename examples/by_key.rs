//! Per-key order inside one process, on SQLite with no server: ledger entries of three accounts
//! are applied one after the other per account, in the order they were enqueued, while the
//! accounts run in parallel — and the slow account holds back none of the others.
//!
//! Run it with `cargo run --example by_key`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx_queue::{ByKey, Delivery, Job, Outcome, Queue, Runner, Table};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlx-queue-by-key-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;

    // The account is the job's group: the key `by_key` routes by. Unnamed, the queue
    // serves every account; 4 workers, each account's rows on one of them.
    let ledger = Queue::table(Table::new("ledger_jobs").group("account"))
        .lease("locked_until")
        .workers(4)
        .by_key(ByKey::group());
    // Its table (and the claim's index on account and id), as declared.
    ledger.schema::<Sqlite>()?.create(&pool).await?;
    let mut jobs = Vec::new();
    for entry in 1..=5 {
        for account in ["alice", "bob", "carol"] {
            jobs.push((account, format!("{account} #{entry}")));
        }
    }
    let batch: Vec<Job<'_>> = jobs
        .iter()
        .map(|(account, entry)| Job::new(entry.as_bytes()).group(*account))
        .collect();
    ledger.enqueue_many(&pool, &batch).await?;
    println!("enqueued 5 entries for each of alice, bob and carol");

    // What each account's entries were applied in, as the handler saw them.
    let applied: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
    let handler = {
        let applied = Arc::clone(&applied);
        move |d: Delivery<Sqlite>| {
            let applied = Arc::clone(&applied);
            async move {
                let entry = String::from_utf8_lossy(d.payload()).into_owned();
                let account = entry.split(' ').next().unwrap_or_default().to_owned();
                // Bob's bank is slow: his entries wait for each other, not for alice or carol.
                let work = if account == "bob" { 60 } else { 5 };
                tokio::time::sleep(Duration::from_millis(work)).await;
                println!("row {}: applied {entry}", d.id());
                let mut applied = applied.lock().unwrap_or_else(|e| e.into_inner());
                applied.entry(account).or_default().push(entry);
                Outcome::ack()
            }
        }
    };
    let queue = ledger.handler(handler);
    let running = Runner::new(pool.clone()).mount(queue).start().await?;

    // Wait (at most 10 s) until every row is settled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM ledger_jobs")
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
    running.shutdown().await?;

    let applied = std::mem::take(&mut *applied.lock().unwrap_or_else(|e| e.into_inner()));
    for account in ["alice", "bob", "carol"] {
        let entries = &applied[account];
        let expected: Vec<String> = (1..=5).map(|n| format!("{account} #{n}")).collect();
        if *entries != expected {
            return Err(format!("{account}'s entries out of order: {entries:?}").into());
        }
        println!("{account}: {}", entries.join(", "));
    }
    println!("done: every account's entries in order");
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
