//! The tests of periodic jobs written once for every database (`main.rs` runs them on each), and
//! what they share with `three_runners`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use sqlx_queue::{Delivery, Error, Job, Missed, Outcome, Queue, Runner, Running, Schedule, Table};

use crate::support::{Ctx, Spec, TestDb, TestRow, report, wait_for};

/// A lease table with a `dedupe` unique key, and a schedules table (the guide's, docs/guide/periodic.md); their names.
/// Each is made as a test table first, so the context drops it at the end.
pub(crate) async fn tables<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, String) {
    let jobs = ctx.table(Spec::lease()).await;
    ctx.exec(&format!(
        "ALTER TABLE {jobs} ADD COLUMN dedupe {}",
        DB::TEXT
    ))
    .await;
    ctx.exec(&format!(
        "CREATE UNIQUE INDEX {jobs}_dedupe ON {jobs} (dedupe)"
    ))
    .await;
    let schedules = ctx.table(Spec::default()).await;
    ctx.exec(&format!("DROP TABLE {schedules}")).await;
    let (name, time) = match DB::LABEL {
        "mysql" => ("VARCHAR(255)", "DATETIME(6)"),
        _ => (DB::TEXT, DB::TIME),
    };
    ctx.exec(&format!(
        "CREATE TABLE {schedules} (name {name} PRIMARY KEY, last_tick {time} NOT NULL)"
    ))
    .await;
    (jobs, schedules)
}

pub(crate) fn jobs(t: &str) -> Table {
    Table::new(t).unique_key("dedupe")
}

/// A job whose payload is its tick, to the microsecond.
pub(crate) fn tick_job(tick: DateTime<Utc>) -> Job<'static> {
    Job::from_vec(
        tick.to_rfc3339_opts(SecondsFormat::Micros, true)
            .into_bytes(),
    )
}

pub(crate) fn parse(payload: &[u8]) -> DateTime<Utc> {
    let text = String::from_utf8_lossy(payload);
    text.parse()
        .unwrap_or_else(|e| panic!("a tick, not {text:?}: {e}"))
}

/// The ticks of the jobs in `t`, in order.
pub(crate) async fn queued<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> Vec<DateTime<Utc>> {
    let rows = DB::rows(&ctx.pool, &format!("SELECT payload FROM {t}"), &[])
        .await
        .unwrap();
    let mut ticks: Vec<_> = rows
        .iter()
        .map(|row| parse(&row.blob("payload").unwrap()))
        .collect();
    ticks.sort();
    ticks
}

/// A runner of schedule `name` on `pool` (`every`, by `missed`), enqueueing into `jobs_table`,
/// recording its last tick in `schedules`.
async fn runner<DB: TestDb>(
    pool: sqlx::Pool<DB>,
    schedules: &str,
    jobs_table: &str,
    schedule: Schedule,
) -> Running {
    Runner::new(pool)
        .schedules_table(schedules)
        .schedule("tick", schedule, jobs(jobs_table), tick_job)
        .start()
        .await
        .unwrap()
}

/// A queue on `t` that acks every job at once, recording its tick in `seen`.
pub(crate) fn consumer<DB: TestDb>(
    t: &str,
    seen: &Arc<Mutex<Vec<DateTime<Utc>>>>,
) -> impl sqlx_queue::state::Mount<DB> {
    let seen = Arc::clone(seen);
    Queue::table(jobs(t))
        .lease("locked_until")
        .workers(2)
        .handler(move |d: Delivery<DB>| {
            seen.lock().unwrap().push(parse(d.payload()));
            async { Outcome::ack() }
        })
}

pub(crate) async fn a_tick_whose_job_finished_is_not_enqueued_again_by_a_late_runner<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, s) = tables(&mut ctx).await;
    let every = || Schedule::every(Duration::from_secs(1));
    let seen = Arc::new(Mutex::new(Vec::new()));
    // Runner A fires ticks, and its queue handles and deletes their jobs within milliseconds.
    let a = Runner::new(ctx.pool.clone())
        .schedules_table(&s)
        .schedule("tick", every(), jobs(&t), tick_job)
        .mount(consumer::<DB>(&t, &seen))
        .start()
        .await
        .unwrap();
    // Runner B carries the same schedule on a pool of one connection, which the test holds:
    // B reaches its first tick and stalls there (as a pause, a slow clock, a restart would).
    let pool_b = ctx.pool(1).await;
    let b = runner(pool_b.clone(), &s, &t, every()).await;
    let held = pool_b.acquire().await.unwrap();
    let stalled_from = Utc::now();
    let mut tick = None;
    wait_for(
        "a tick B stalls on, handled by A's queue",
        Duration::from_secs(5),
        || {
            let found = seen
                .lock()
                .unwrap()
                .iter()
                .copied()
                .find(|t| *t > stalled_from);
            tick = found;
            async move { found.is_some() }
        },
    )
    .await;
    let tick = tick.unwrap();
    ctx.wait_none(&t, "1 = 1", 5).await; // its job finished: the row deleted, the key free
    let stats = b.stats();
    assert_eq!(
        stats.ticks_fired + stats.ticks_fired_elsewhere,
        0,
        "B waits for its connection"
    );
    drop(held);
    wait_for("B to reach the tick", Duration::from_secs(5), || async {
        let stats = b.stats();
        stats.ticks_fired + stats.ticks_fired_elsewhere > 0
    })
    .await;
    // A job B enqueued by mistake would be committed by now, and handled by A's queue.
    ctx.wait_none(&t, "1 = 1", 5).await;
    let b_stats = b.stats();
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    let mut ticks = seen.lock().unwrap().clone();
    ticks.extend(queued(&ctx, &t).await);
    let of_tick = ticks.iter().filter(|t| **t == tick).count();
    assert_eq!(of_tick, 1, "tick {tick} made one job: {ticks:?}");
    assert!(
        b_stats.ticks_fired_elsewhere >= 1,
        "B found the tick fired: {b_stats:?}"
    );
    assert_no_duplicate(&ticks);
    ctx.drop_tables().await;
}

pub(crate) fn assert_no_duplicate(ticks: &[DateTime<Utc>]) {
    let mut sorted = ticks.to_vec();
    sorted.sort();
    for pair in sorted.windows(2) {
        assert_ne!(
            pair[0], pair[1],
            "tick {} made two jobs: {sorted:?}",
            pair[0]
        );
    }
}

const PERIOD: Duration = Duration::from_millis(250);

/// Runs schedule `every(PERIOD)` by `missed` until it fired twice, stops it for five ticks, then
/// runs it again for two ticks: the ticks after the last before the stop, the last before the
/// stop, and the restarted runner's stats.
async fn restart<DB: TestDb>(
    ctx: &mut Ctx<DB>,
    missed: Missed,
) -> (Vec<DateTime<Utc>>, DateTime<Utc>, sqlx_queue::Stats) {
    let (t, s) = tables(ctx).await;
    let schedule = || Schedule::every(PERIOD).missed(missed);
    let first = runner(ctx.pool.clone(), &s, &t, schedule()).await;
    ctx.wait_count(&t, "1 = 1", 2, 5).await;
    first.shutdown().await.unwrap();
    let last = *queued(ctx, &t).await.last().unwrap();
    // Stopped for five ticks: restart 25 ms after the fifth tick after the last one.
    let period = TimeDelta::from_std(PERIOD).unwrap();
    let restart_at = last + period * 5 + TimeDelta::milliseconds(25);
    tokio::time::sleep((restart_at - Utc::now()).to_std().unwrap_or_default()).await;
    assert_eq!(
        queued(ctx, &t).await.last(),
        Some(&last),
        "nothing fired while stopped"
    );
    let started = Utc::now();
    let second = runner(ctx.pool.clone(), &s, &t, schedule()).await;
    let took = Utc::now() - started;
    assert!(
        took < TimeDelta::milliseconds(200),
        "the test needs a start within the tick it restarts in; it took {took}"
    );
    let next = second.next_tick("tick").expect("the next tick");
    assert_eq!(
        next,
        last + period * 6,
        "the next tick is the one after the restart"
    );
    assert_eq!(second.next_tick("another"), None);
    wait_for(
        "two ticks after the restart",
        Duration::from_secs(5),
        || async {
            queued(ctx, &t)
                .await
                .iter()
                .filter(|t| **t > started)
                .count()
                >= 2
        },
    )
    .await;
    // The counters follow the commits: wait until they count every job since the stop.
    wait_for(
        "the counters of the ticks fired",
        Duration::from_secs(5),
        || async {
            let fired = queued(ctx, &t).await.iter().filter(|t| **t > last).count();
            second.stats().ticks_fired == fired as u64
        },
    )
    .await;
    let stats = second.stats();
    second.shutdown().await.unwrap();
    let ticks: Vec<_> = queued(ctx, &t)
        .await
        .into_iter()
        .filter(|t| *t > last)
        .collect();
    report(&format!(
        "{} restart ({missed:?}): ticks after the stop {ticks:?}",
        DB::LABEL
    ));
    (ticks, last, stats)
}

pub(crate) async fn a_restarted_runner_skips_the_ticks_it_missed<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (ticks, last, stats) = restart(&mut ctx, Missed::Skip).await;
    let period = TimeDelta::from_std(PERIOD).unwrap();
    assert_eq!(ticks[0], last + period * 6, "no backfill: {ticks:?}");
    assert_consecutive(&ticks);
    assert_eq!(stats.ticks_missed, 5, "{stats:?}");
    ctx.drop_tables().await;
}

pub(crate) async fn a_restarted_runner_catches_up_the_latest_missed_tick_once<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (ticks, last, stats) = restart(&mut ctx, Missed::CatchUp).await;
    let period = TimeDelta::from_std(PERIOD).unwrap();
    assert_eq!(
        ticks[0],
        last + period * 5,
        "the latest missed tick: {ticks:?}"
    );
    assert_consecutive(&ticks);
    assert_eq!(
        (stats.ticks_missed, stats.ticks_fired >= 3),
        (4, true),
        "{stats:?}"
    );
    ctx.drop_tables().await;
}

/// `ticks` follow each other by one period.
fn assert_consecutive(ticks: &[DateTime<Utc>]) {
    let period = TimeDelta::from_std(PERIOD).unwrap();
    for pair in ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], period, "consecutive ticks: {ticks:?}");
    }
}

pub(crate) async fn a_changed_schedule_takes_effect_at_its_next_tick<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, s) = tables(&mut ctx).await;
    let fast = runner(
        ctx.pool.clone(),
        &s,
        &t,
        Schedule::every(Duration::from_millis(100)),
    )
    .await;
    ctx.wait_count(&t, "1 = 1", 2, 5).await;
    fast.shutdown().await.unwrap();
    let before = queued(&ctx, &t).await;
    // The schedule changes to a cron expression of every second.
    let changed = Utc::now();
    let every_second = || Schedule::cron("* * * * * *").unwrap();
    let slow = runner(ctx.pool.clone(), &s, &t, every_second()).await;
    ctx.wait_count(&t, "1 = 1", before.len() as i64 + 1, 5)
        .await;
    slow.shutdown().await.unwrap();
    let after: Vec<_> = queued(&ctx, &t)
        .await
        .into_iter()
        .filter(|t| !before.contains(t))
        .collect();
    // Its first tick after the change (the second one, when the start took past it).
    let first = every_second().next_after(changed).unwrap();
    assert!(
        after[0] == first || after[0] == first + TimeDelta::seconds(1),
        "the new schedule's next tick after {changed}: {after:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn what_a_schedule_needs_is_said_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, s) = tables(&mut ctx).await;
    let every = || Schedule::every(Duration::from_secs(60));
    let start = |runner: Runner<DB>| async move { runner.start().await.map(|_| ()).unwrap_err() };
    let on = |s: &str| Runner::new(ctx.pool.clone()).schedules_table(s);

    let missing = format!("{s}_missing");
    match start(on(&missing).schedule("a", every(), jobs(&t), tick_job)).await {
        Error::Schema(e) => assert_eq!(e.table, missing, "{e}"),
        other => panic!("a missing schedules table: {other}"),
    }
    match start(on(&s).schedule("a", every(), Table::new(&t), tick_job)).await {
        Error::Declaration { queue, reason } => {
            assert_eq!(queue, "schedule `a`");
            assert!(reason.contains("unique_key"), "{reason}");
        }
        other => panic!("a table without a unique key: {other}"),
    }
    match start(on(&s).schedule("a", every(), jobs(&format!("{t}_missing")), tick_job)).await {
        Error::Schema(e) => assert_eq!(e.table, format!("{t}_missing"), "{e}"),
        other => panic!("a missing job table: {other}"),
    }
    let twice = on(&s).schedule("a", every(), jobs(&t), tick_job).schedule(
        "a",
        every(),
        jobs(&t),
        tick_job,
    );
    assert!(matches!(start(twice).await, Error::Declaration { .. }));
    assert!(matches!(
        start(on(&s).schedule("", every(), jobs(&t), tick_job)).await,
        Error::Declaration { .. }
    ));
    assert_eq!(
        ctx.count(&s, "1 = 1").await,
        0,
        "a refused start wrote nothing"
    );
    ctx.drop_tables().await;
}
