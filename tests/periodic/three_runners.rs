//! Three runners carry one `every(1 s)` schedule for ten seconds: the figures, run once
//! for every database at once (the ten seconds are the scenario, not a wait), so the suite pays
//! them once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx_queue::{Runner, Schedule};

use crate::support::{Ctx, TestDb, on_server_of, report};
use crate::ticks::{assert_no_duplicate, consumer, jobs, queued, tables, tick_job};

/// Three runners, each on a pool of its own and with a queue that handles and deletes the jobs
/// at once (so a tick's unique key is free again within milliseconds), carry one `every(1 s)`
/// schedule for ten seconds: ten jobs (one more or less at the window's edges), one per tick,
/// none twice, none missing between the first and the last.
async fn ten_seconds<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, s) = tables(&mut ctx).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let started = Utc::now();
    let mut runners = Vec::new();
    for _ in 0..3 {
        let runner = Runner::new(ctx.pool(4).await)
            .schedules_table(&s)
            .schedule(
                "tick",
                Schedule::every(Duration::from_secs(1)),
                jobs(&t),
                tick_job,
            )
            .mount(consumer::<DB>(&t, &seen))
            .start()
            .await
            .unwrap();
        runners.push(runner);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let stopped = Utc::now();
    let mut fired = Vec::new();
    for runner in runners {
        fired.push(runner.stats().ticks_fired);
        runner.shutdown().await.unwrap();
    }
    let mut ticks = seen.lock().unwrap().clone();
    ticks.extend(queued(&ctx, &t).await);
    assert_no_duplicate(&ticks);
    ticks.sort();
    report(&format!(
        "{}: three runners, every(1 s) for {:.1} s: {} jobs, fired by each runner {fired:?}",
        DB::LABEL,
        (stopped - started).as_seconds_f64(),
        ticks.len()
    ));
    assert!((9..=11).contains(&ticks.len()), "ten ticks: {ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            TimeDelta::seconds(1),
            "consecutive: {ticks:?}"
        );
    }
    assert!(
        ticks[0] > started && *ticks.last().unwrap() <= stopped,
        "{ticks:?}"
    );
    // Each runner's count is read before its shutdown, and may miss the tick it fires then.
    let counted = fired.iter().sum::<u64>();
    let jobs = ticks.len() as u64;
    assert!(
        counted <= jobs && counted + 3 >= jobs,
        "{fired:?} for {jobs} jobs"
    );
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_database() {
    tokio::join!(
        ten_seconds::<sqlx::Sqlite>(),
        ten_seconds::<sqlx::Postgres>(),
        on_server_of(
            "periodic::postgres18::three_runners",
            ten_seconds::<sqlx::Postgres>()
        ),
        ten_seconds::<sqlx::MySql>(),
    );
}
