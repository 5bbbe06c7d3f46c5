//! A runner's metrics as Prometheus text, on SQLite with no server: install a recorder (here
//! `metrics-exporter-prometheus`'s, without its HTTP listener) before the runner starts, drain ten
//! jobs (two fail once and are retried, one is dead-lettered), read the queue's depth gauges, and
//! print what a Prometheus scrape would read.
//!
//! Run it with `cargo run --example metrics --features metrics`.

use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table};

/// Job 3 and job 7 fail once; job 9 always fails, and reaches its dead letter.
async fn work(d: Delivery<Sqlite>) -> Outcome {
    tokio::time::sleep(Duration::from_millis(5)).await;
    match (d.payload(), d.attempt()) {
        (b"job 9", _) | (b"job 3" | b"job 7", 1) => Outcome::retry(),
        _ => Outcome::ack(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // First: the runner registers its instruments with the recorder installed when it starts.
    // Durations as histograms (aggregatable across processes) rather than the exporter's
    // default summaries.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 60.0],
        )?
        .install_recorder()?;

    let file = std::env::temp_dir().join(format!("sqlx-queue-metrics-{}.db", std::process::id()));
    let options = SqliteConnectOptions::new()
        .filename(&file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().connect_with(options).await?;

    // A group column (the dead letter is a group) and `created_at`, which the pickup latency and
    // the oldest ready job's age are measured from.
    let jobs = Table::new("jobs")
        .group("queue")
        .retry_after("retry_after")
        .created_at("created_at");
    let emails = Queue::table(jobs)
        .named("emails")
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::group("emails_dead"))
        .workers(2);
    emails.schema::<Sqlite>()?.create(&pool).await?;
    let payloads: Vec<String> = (0..10).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    emails.enqueue_many(&pool, &batch).await?;

    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .queue_gauges(Duration::from_millis(50))
        .mount(emails.handler(work))
        .start()
        .await?;
    // Ten jobs, two retried once and one twice before its dead letter: 14 deliveries.
    while running.stats().acked + running.stats().dead_lettered < 10 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the depth gauges read the empty queue once more.
    tokio::time::sleep(Duration::from_millis(200)).await;
    running.shutdown().await?;
    pool.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }

    // What a scrape of `/metrics` would read (the crate's series, their help and type lines).
    let text = prometheus.render();
    for line in text.lines().filter(|line| line.contains("sqlx_queue_")) {
        println!("{line}");
    }
    Ok(())
}
