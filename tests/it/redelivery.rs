// Redelivery: a settlement that makes a row claimable again wakes its queue's claim loop at once,
// whatever the number of workers, for one database `DB` and one form `F`. The runner polls every
// 10 s here, so a redelivery that waited for the poll would take seconds.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::time::Instant;

use crate::support::{Ctx, Form, Spec, TestDb, recv};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(redelivery<$db, $form>:
            a_retried_row_returns_at_once_with_one_worker_or_eight,
            a_short_retry_after_returns_when_due_not_at_the_poll,
            a_row_released_unsettled_returns_at_once,
        );
    };
}
pub(crate) use tests;

/// How many times the row is retried before its ack.
const RETRIES: u32 = 20;

/// The runners' poll interval: what a redelivery that waited for the poll would take.
const POLL: Duration = Duration::from_secs(10);

/// The times between one delivery of a row and the next, over `RETRIES` retries,
/// with `workers` workers and `outcome` for every delivery but the last.
async fn gaps<DB: TestDb, F: Form<DB>>(workers: usize, outcome: Outcome) -> Vec<Duration> {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return Vec::new();
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    DB::enqueue(&ctx.pool, &jobs, Job::new("again"))
        .await
        .unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs))
        .attempt("attempt")
        .workers(workers)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(Instant::now());
            let last = d.attempt() > RETRIES;
            async move { if last { Outcome::ack() } else { outcome } }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(queue)
        .start()
        .await
        .unwrap();
    let mut starts = Vec::new();
    for i in 0..=RETRIES {
        starts.push(recv(&mut seen, &format!("delivery {}", i + 1), 10).await);
    }
    ctx.wait_none(&t, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
    starts.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

/// Checks the `gaps` between deliveries of a row made claimable again `due` after each
/// settlement (what a redelivery takes beyond it).
fn check<DB: TestDb, F: Form<DB>>(workers: usize, what: &str, gaps: Vec<Duration>, due: Duration) {
    if gaps.is_empty() {
        return; // database skipped
    }
    let mut gaps: Vec<Duration> = gaps.iter().map(|gap| gap.saturating_sub(due)).collect();
    gaps.sort();
    let (p50, p90, max) = (
        gaps[gaps.len() / 2],
        gaps[gaps.len() * 9 / 10],
        gaps[gaps.len() - 1],
    );
    crate::support::report(&format!(
        "{}_redelivery: {what} with {workers} workers: redelivery past due p50 {p50:?}, \
         p90 {p90:?}, max {max:?}",
        F::NAME
    ));
    // One redelivery that waited for the poll would take 10 s. The median holds the typical
    // (a few ms); the tail allows for a machine busy with other tests (SQLite's statements
    // queue on one gate per process, shared by every SQLite test running beside this one: a
    // full run saw p90 358 ms once, 2–11 ms alone).
    assert!(
        p50 < Duration::from_millis(100)
            && p90 < Duration::from_millis(600)
            && max < Duration::from_secs(1),
        "{what} with {workers} workers: p50 {p50:?}, p90 {p90:?}, max {max:?}"
    );
}

pub(crate) async fn a_retried_row_returns_at_once_with_one_worker_or_eight<
    DB: TestDb,
    F: Form<DB>,
>() {
    for workers in [1, 8] {
        check::<DB, F>(
            workers,
            "retry",
            gaps::<DB, F>(workers, Outcome::retry()).await,
            Duration::ZERO,
        );
    }
}

pub(crate) async fn a_short_retry_after_returns_when_due_not_at_the_poll<
    DB: TestDb,
    F: Form<DB>,
>() {
    let delay = Duration::from_millis(20);
    for workers in [1, 8] {
        let gaps = gaps::<DB, F>(workers, Outcome::retry_after(delay)).await;
        assert!(
            gaps.iter().all(|gap| *gap >= delay),
            "not before it is due: {gaps:?}"
        );
        check::<DB, F>(workers, "retry_after(20 ms)", gaps, delay);
    }
}

pub(crate) async fn a_row_released_unsettled_returns_at_once<DB: TestDb, F: Form<DB>>() {
    if F::HOLDS {
        // A row lock or key lives on the escaped delivery's connection, released when whoever
        // holds it drops it: nothing the runner could wake on.
        return;
    }
    for workers in [1, 8] {
        let Some(mut ctx) = Ctx::<DB>::new().await else {
            return;
        };
        let t = ctx.table(Spec::lease()).await;
        let jobs = Table::new(&t);
        DB::enqueue(&ctx.pool, &jobs, Job::new("escapes"))
            .await
            .unwrap();
        let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        // The first delivery escapes its handler (kept here): its settlement fails with
        // `TransactionHeld` and the runner releases the row unsettled.
        let escaped = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = std::sync::Arc::clone(&escaped);
        let queue = F::apply(Queue::table(jobs))
            .attempt("attempt")
            .transactional()
            .workers(workers)
            .handler(move |d: Delivery<DB, Transactional>| {
                let _ = tx.send(Instant::now());
                if d.attempt() == 1 {
                    keep.lock().unwrap().push(d);
                }
                async { Outcome::ack() }
            });
        let running = Runner::new(ctx.pool.clone())
            .poll_interval(POLL)
            .mount(queue)
            .start()
            .await
            .unwrap();
        let first = recv(&mut seen, "the delivery that escapes", 10).await;
        let again = recv(&mut seen, "the row released and delivered again", 10).await;
        ctx.wait_none(&t, "1 = 1", 5).await;
        let stats = running.stats();
        escaped.lock().unwrap().clear();
        running.shutdown().await.unwrap();
        ctx.drop_tables().await;
        assert_eq!(stats.failed, 1, "{stats:?}");
        // The poll would take 10 s.
        assert!(
            again - first < Duration::from_secs(1),
            "{workers} workers: delivered again after {:?}",
            again - first
        );
    }
}
