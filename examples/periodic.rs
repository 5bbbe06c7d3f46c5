//! Periodic jobs, on SQLite with no server: two runners (as two processes would be) carry one
//! schedule, and each tick makes one job; then both stop for five ticks, and one restarts with
//! `Missed::CatchUp`: one job for the five ticks missed, then the schedule goes on.
//!
//! Run it with `cargo run --example periodic`.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Sqlite, SqlitePool};
use sqlx_queue::{Delivery, Job, Missed, Outcome, Queue, Runner, Schedule, Table};
use tokio::sync::mpsc;

const PERIOD: Duration = Duration::from_millis(200);

/// The reports' table: a tick's job carries the unique key `report@<tick>`.
fn jobs() -> Table {
    Table::new("jobs").unique_key("dedupe")
}

/// The report of one tick: its payload is the tick's time.
fn report(tick: DateTime<Utc>) -> Job<'static> {
    Job::from_vec(
        tick.to_rfc3339_opts(SecondsFormat::Micros, true)
            .into_bytes(),
    )
}

fn schedule() -> Schedule {
    Schedule::every(PERIOD).missed(Missed::CatchUp)
}

/// A runner carrying the schedule "report"; with `handled`, also the queue that handles the
/// reports, telling each tick there.
fn runner(
    pool: SqlitePool,
    handled: Option<mpsc::UnboundedSender<DateTime<Utc>>>,
) -> Runner<Sqlite> {
    let runner = Runner::new(pool).schedule("report", schedule(), jobs(), report);
    let Some(handled) = handled else {
        return runner;
    };
    let queue = Queue::table(jobs())
        .lease("locked_until")
        .handler(move |d: Delivery<Sqlite>| {
            let tick = String::from_utf8_lossy(d.payload()).parse().ok();
            let handled = handled.clone();
            async move {
                if let Some(tick) = tick {
                    let _ = handled.send(tick);
                }
                Outcome::ack()
            }
        });
    runner.mount(queue)
}

async fn open(file: &std::path::Path) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(file)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    SqlitePoolOptions::new().connect_with(options).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("sqlx-queue-periodic-{}.db", std::process::id()));
    let (pool_a, pool_b) = (open(&file).await?, open(&file).await?);

    // Two runners carry the schedule; runner A's queue handles the reports. The tables runner A
    // needs: the reports' (with the unique key's index), and the schedules table, where each
    // schedule records its last tick: a tick is fired once, by the runner whose update moves it
    // forward.
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let a = runner(pool_a.clone(), Some(handled_tx.clone()));
    a.schema()?.create(&pool_a).await?;
    let a = a.start().await?;
    let b = runner(pool_b.clone(), None).start().await?;
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.extend(handled.recv().await);
    }
    b.shutdown().await?;
    a.shutdown().await?;
    while let Ok(tick) = handled.try_recv() {
        seen.push(tick);
    }
    let distinct: BTreeSet<_> = seen.iter().collect();
    let once = if distinct.len() == seen.len() {
        "each once"
    } else {
        "SOME TWICE"
    };
    println!("two runners carry \"report\" every 200 ms: the first 5 ticks handled, {once}");

    // Every runner stops for five ticks.
    let last: DateTime<Utc> = sqlx::query_scalar("SELECT last_tick FROM sqlx_queue_schedules")
        .fetch_one(&pool_a)
        .await?;
    let period = TimeDelta::from_std(PERIOD)?;
    let restart = last + period * 5 + TimeDelta::milliseconds(20);
    tokio::time::sleep((restart - Utc::now()).to_std().unwrap_or_default()).await;
    println!("both stopped for 5 ticks");

    // One restarts: the latest missed tick is caught up once, and the schedule goes on.
    let a = runner(pool_a.clone(), Some(handled_tx)).start().await?;
    let mut after = Vec::new();
    while after.len() < 2 {
        // A report fired before the stop and not handled then is handled now: not one of these.
        after.extend(handled.recv().await.filter(|tick| *tick > last));
    }
    a.shutdown().await?;
    if after == [last + period * 5, last + period * 6] {
        println!(
            "restarted with Missed::CatchUp: the latest missed tick handled once, then the next \
             on time"
        );
    } else {
        println!("restarted: handled {after:?} (the last tick before the stop: {last})");
    }
    pool_a.close().await;
    pool_b.close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
