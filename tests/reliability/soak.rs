//! Scenario 8 — Soak: three consumer processes (`examples/consumer.rs`, `soak` mode) of four
//! workers each drain a table with random outcomes — ack, retry, retry after a few milliseconds,
//! drop — on a transactional queue capped at 3 attempts with a dead-letter table. Each delivery
//! writes an effect row (job, attempt, pid) through its transaction before it settles, so only an
//! ack commits it. The outcomes are a function of (seed, id, attempt) shared with the consumer
//! (`examples/consumer/soak.rs`), so the test predicts every job's fate and checks it:
//!
//! - exactly one effect per acknowledged job, written by the delivery that acknowledged it, and
//!   none for a dropped or dead-lettered job (their deliveries' writes were rolled back);
//! - the dead-letter table holds exactly the jobs whose third attempt failed;
//! - acked + dropped + dead-lettered == enqueued, and the queue table ends empty.
//!
//! `SQLX_QUEUE_SOAK=<jobs>` sets the size per form and database (the full run is
//! 50000); `SQLX_QUEUE_SOAK_SEED=<n>` replays a seed. On SQLite the advisory form's keys live in
//! one process: its three runners run in the test's process.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sqlx::Sqlite;
use sqlx_queue::{DeadLetter, Delivery, Outcome, Queue, Runner, Table, Transactional};
use tokio::time::Instant;

use crate::crash::fill;
use crate::outcomes::{Decision, MAX_ATTEMPTS, decide};
use crate::support::{
    AdvisoryForm, Consumer, Ctx, Form, LeaseForm, Spec, TestDb, assert_nothing_held, micros_now,
    report,
};

/// Jobs per form and database in CI, where the suite must stay within a few minutes.
const CI_JOBS: usize = 1500;
const PROCESSES: usize = 3;
const WORKERS: &str = "4";

every_form!(soak: servers);
cases! { soak:
    sqlite_lease => sqlx::Sqlite, LeaseForm;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_advisory() {
    soak_in_process().await;
}

fn jobs() -> usize {
    std::env::var("SQLX_QUEUE_SOAK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CI_JOBS)
}

fn seed() -> u64 {
    std::env::var("SQLX_QUEUE_SOAK_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| micros_now().cast_unsigned())
}

/// What becomes of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Acknowledged on this attempt.
    Acked(u32),
    Dropped,
    Dead,
}

/// The fate `decide` gives row `id`, one delivery per attempt.
fn fate(seed: u64, id: i64) -> (Fate, u32) {
    let mut attempt = 1;
    loop {
        match decide(seed, id, attempt) {
            Decision::Ack => return (Fate::Acked(attempt), attempt),
            Decision::Drop => return (Fate::Dropped, attempt),
            Decision::Retry | Decision::RetryAfter(_) if attempt >= MAX_ATTEMPTS => {
                return (Fate::Dead, attempt);
            }
            Decision::Retry | Decision::RetryAfter(_) => attempt += 1,
        }
    }
}

/// The queue table, its dead letter and its effects.
async fn tables<DB: TestDb>(ctx: &mut Ctx<DB>, rows: usize) -> (String, Vec<i64>) {
    let t = ctx.table(Spec::lease()).await;
    let dead = format!("{t}_dead");
    ctx.create(&dead, &DB::ddl(&dead, Spec::lease())).await;
    let effects = format!("{t}_effects");
    let ddl = format!(
        "CREATE TABLE {effects} (job BIGINT NOT NULL, attempt BIGINT NOT NULL, pid BIGINT NOT NULL)"
    );
    ctx.create(&effects, &ddl).await;
    let ids = fill(ctx, &t, rows).await;
    (t, ids)
}

async fn soak<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (rows, seed) = (jobs(), seed());
    let (t, ids) = tables(&mut ctx, rows).await;
    let mode = format!("soak:{seed}");
    let started = Instant::now();
    let mut consumers = Vec::new();
    for _ in 0..PROCESSES {
        consumers.push(Consumer::start(&ctx.url, &t, F::NAME, &[&mode, WORKERS]).await);
    }
    ctx.wait_none(&t, "1 = 1", drain_secs(rows)).await;
    let took = started.elapsed();
    for consumer in consumers {
        consumer.kill().await;
    }
    check::<DB, F>(&ctx, &t, &ids, seed, took).await;
    ctx.drop_tables().await;
}

/// The bound on a drain: generous, for a shared 2-core machine.
fn drain_secs(rows: usize) -> u64 {
    60 + rows as u64 / 20
}

/// SQLite's advisory form: three runners of four workers in this process, with the consumer's
/// handler.
async fn soak_in_process() {
    let Some(mut ctx) = Ctx::<Sqlite>::new().await else {
        return;
    };
    let (rows, seed) = (jobs(), seed());
    let (t, ids) = tables(&mut ctx, rows).await;
    let insert = format!("INSERT INTO {t}_effects (job, attempt, pid) VALUES (?, ?, ?)");
    let started = Instant::now();
    let mut runners = Vec::new();
    for runner in 0..PROCESSES as i64 {
        let pool = ctx.pool(6).await;
        let insert = Arc::new(insert.clone());
        let queue = Queue::table(Table::new(&t).retry_after("retry_after"))
            .advisory_lock()
            .attempt("attempt")
            .max_attempts(MAX_ATTEMPTS)
            .dead_letter(DeadLetter::table(format!("{t}_dead")))
            .transactional()
            .workers(4)
            .handler(move |mut d: Delivery<Sqlite, Transactional>| {
                let insert = Arc::clone(&insert);
                async move {
                    let (id, attempt) = (d.id(), d.attempt());
                    sqlx::query(sqlx::AssertSqlSafe(insert.as_str()))
                        .bind(id)
                        .bind(i64::from(attempt))
                        .bind(runner)
                        .execute(&mut *d.tx())
                        .await
                        .expect("the effect is written");
                    match decide(seed, id, attempt) {
                        Decision::Ack => Outcome::ack(),
                        Decision::Retry => Outcome::retry(),
                        Decision::RetryAfter(delay) => Outcome::retry_after(delay),
                        Decision::Drop => Outcome::drop(),
                    }
                }
            });
        let running = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(20))
            .mount(queue)
            .start()
            .await
            .unwrap();
        runners.push((running, pool));
    }
    ctx.wait_none(&t, "1 = 1", drain_secs(rows)).await;
    let took = started.elapsed();
    for (running, pool) in runners {
        running.shutdown().await.unwrap();
        pool.close().await;
    }
    check::<Sqlite, AdvisoryForm>(&ctx, &t, &ids, seed, took).await;
    ctx.drop_tables().await;
}

/// Every job's fate as predicted, every effect committed exactly once, every row accounted for.
async fn check<DB: TestDb, F: Form<DB>>(
    ctx: &Ctx<DB>,
    t: &str,
    ids: &[i64],
    seed: u64,
    took: Duration,
) {
    let rows = ids.len();
    let mut effects: HashMap<i64, Vec<i64>> = HashMap::new();
    for row in ctx
        .ints(&format!("SELECT job, attempt FROM {t}_effects"))
        .await
    {
        effects
            .entry(row[0].unwrap())
            .or_default()
            .push(row[1].unwrap());
    }
    let dead: HashSet<i64> = ctx
        .ids(&format!("{t}_dead"), "id")
        .await
        .into_iter()
        .collect();
    let twice: Vec<_> = effects.iter().filter(|(_, a)| a.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "effects committed more than once: {twice:?}"
    );

    let (mut acked, mut dropped, mut dead_lettered, mut deliveries) = (0, 0, 0, 0);
    let mut wrong = Vec::new();
    for &id in ids {
        let (expected, attempts) = fate(seed, id);
        deliveries += attempts as usize;
        let effect = effects.get(&id).map(|a| a[0]);
        let is_dead = dead.contains(&id);
        let seen = match (effect, is_dead) {
            (Some(attempt), false) => Some(Fate::Acked(u32::try_from(attempt).unwrap())),
            (None, true) => Some(Fate::Dead),
            (None, false) => Some(Fate::Dropped),
            (Some(_), true) => None,
        };
        match seen {
            Some(Fate::Acked(_)) => acked += 1,
            Some(Fate::Dead) => dead_lettered += 1,
            Some(Fate::Dropped) => dropped += 1,
            None => {}
        }
        if seen != Some(expected) {
            wrong.push((id, expected, seen));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {rows} jobs did not meet their predicted fate (id, predicted, seen; seed \
         {seed}): {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    assert_eq!(
        effects.len(),
        acked,
        "effects of jobs that were not acknowledged"
    );
    assert_eq!(
        acked + dropped + dead_lettered,
        rows,
        "rows unaccounted for"
    );
    assert_eq!(ctx.count(t, "1 = 1").await, 0);
    assert_nothing_held::<DB, F>(ctx, t, None).await;
    report(&format!(
        "soak: {} {}: {rows} jobs, {deliveries} deliveries by {PROCESSES} {} x 4 workers in \
         {:.1} s ({:.0} deliveries/s), seed {seed}: {acked} acked (one effect each), {dropped} \
         dropped, {dead_lettered} dead-lettered at attempt {MAX_ATTEMPTS}; every job as predicted",
        DB::LABEL,
        F::NAME,
        if DB::LABEL == "sqlite" && F::NAME == "advisory" {
            "runners in one process"
        } else {
            "processes"
        },
        took.as_secs_f64(),
        deliveries as f64 / took.as_secs_f64(),
    ));
}
