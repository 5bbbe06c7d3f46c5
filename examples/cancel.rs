//! Cancelling jobs on SQLite, with no server: a queued job is cancelled before any runner sees
//! it; a running one (a slow "report") is cancelled while its handler works, and its handler
//! stops on `Delivery::cancelled()` at the lease's next renewal; a finished job's cancellation
//! finds nothing. Prints what happened and exits.
//!
//! Run it with `cargo run --example cancel`.

use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

/// Builds a report, slowly, unless it is cancelled first.
async fn build(report: Delivery<Sqlite>, started: mpsc::UnboundedSender<i64>) -> Outcome {
    let name = String::from_utf8_lossy(report.payload()).into_owned();
    println!("row {}: building {name}", report.id());
    let _ = started.send(report.id());
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(20)) => {
            println!("row {}: {name} built", report.id());
        }
        () = report.cancelled() => {
            println!("row {}: {name} cancelled while it was built; stopping", report.id());
        }
    }
    // After a cancellation the settlement changes nothing: the row is gone already.
    Outcome::ack()
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlx-queue-cancel-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;

    // The queue's lease column tells a cancellation a job in work from a queued one. Renewed
    // every half lease: a cancellation reaches the handler within 1 s.
    let jobs = Queue::table(Table::new("report_jobs"))
        .lease("locked_until")
        .lease_duration(Duration::from_secs(2));
    // Its table, as declared. On SQLite its id is `AUTOINCREMENT`: a finished job's id is never
    // given to a later one, so a cancellation by id never meets another job.
    jobs.schema::<Sqlite>()?.create(&pool).await?;
    let queued = jobs.enqueue(&pool, Job::new("the weekly report")).await?;
    println!("row {queued}: cancelling before any runner ran");
    assert_eq!(
        jobs.cancel(&pool, queued).await?,
        Cancellation::Cancelled(queued)
    );

    let (started, mut running_ids) = mpsc::unbounded_channel();
    let reports = jobs
        .clone()
        .handler(move |d: Delivery<Sqlite>| build(d, started.clone()));
    let running = Runner::new(pool.clone()).mount(reports).start().await?;

    let slow = jobs.enqueue(&pool, Job::new("the yearly report")).await?;
    let in_work = tokio::time::timeout(Duration::from_secs(10), running_ids.recv())
        .await?
        .ok_or("the runner stopped")?;
    let asked = tokio::time::Instant::now();
    match jobs.cancel(&pool, in_work).await? {
        Cancellation::Requested(id) => println!("row {id}: in work; its lease taken away"),
        other => return Err(format!("row {slow}: expected in work, got {other:?}").into()),
    }
    // The handler's settlement after its cancellation counts as a lost lease.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while running.stats().lease_lost == 0 {
        if tokio::time::Instant::now() > deadline {
            return Err("the handler did not stop within 10 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "the handler stopped {:?} after the cancellation",
        asked.elapsed()
    );
    running.shutdown().await?;

    match jobs.cancel(&pool, in_work).await? {
        Cancellation::NotFound => println!("row {in_work}: cancelling again finds nothing"),
        other => return Err(format!("expected not found, got {other:?}").into()),
    }
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
