//! Scenario 6 — Shutdown under load: `shutdown()` with 8 deliveries in work. With time to finish,
//! it lets them finish and settles them, claims nothing more, and returns as soon as they are done;
//! with handlers that never end, it cancels them at the runner's `shutdown_timeout` and releases
//! their rows at once. Either way it returns within the bound the guide states (docs/guide/guarantees.md) —
//! `shutdown_timeout` plus the time of the statements in flight — and leaves nothing held: a fresh
//! runner then has every remaining row in work at once.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Outcome, Queue, Runner, ShutdownReport};
use tokio::time::Instant;

use crate::crash::fill;
use crate::support::{
    Ctx, Form, Gate, Journal, Spec, TestDb, assert_nothing_held, jobs, journaled, pool_for, report,
    start_runner, wait_for,
};

const WORKERS: usize = 8;
/// What each handler of the finishing phase still has to do when shutdown begins, at most.
const WORK: Duration = Duration::from_millis(400);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
const CANCEL_TIMEOUT: Duration = Duration::from_millis(500);
/// What the statements in flight (settlements, releases) may add on this shared machine.
const STATEMENTS: Duration = Duration::from_secs(3);

every_form!(shutdown_under_load);

async fn shutdown_under_load<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let pool = ctx.pool(pool_for(WORKERS)).await;

    // Handlers that finish: they are let finish, and settled.
    let t = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&t).await;
    fill(&ctx, &t, 5 * WORKERS).await;
    let journal = Arc::new(Journal::default());
    let mount = journaled::<DB, F>(&t, Duration::from_secs(30), WORKERS, &journal, WORK);
    let (finished, finish_time) = shut_down_in_work(&pool, SHUTDOWN_TIMEOUT, mount, &journal).await;
    assert!(
        finish_time < WORK + STATEMENTS,
        "shutdown took {finish_time:?} for handlers that needed at most {WORK:?}"
    );
    assert_eq!(
        (finished.in_work, finished.cancelled),
        (8, 0),
        "{finished:?}"
    );
    if F::NAME == "advisory" {
        // The rows in work, and those claimed ahead of them, released unstarted.
        assert_eq!(
            finished.keys_released,
            8 + finished.released,
            "{finished:?}"
        );
    }
    let deliveries = journal.entries();
    assert_eq!(deliveries.len(), WORKERS, "claimed after shutdown began");
    assert!(
        deliveries.iter().all(|d| d.end.is_some()),
        "a handler was cut short"
    );
    let ids: Vec<i64> = deliveries.iter().map(|d| d.id).collect();
    ctx.assert_settled_once(&settled, &ids).await;
    assert_nothing_held::<DB, F>(&ctx, &t, Some(&settled)).await;
    let left = 4 * WORKERS;
    assert_eq!(
        ctx.count(&t, "attempt = 1").await,
        left as i64,
        "rows touched"
    );
    let fresh = all_at_once::<DB, F>(&ctx, &t, left).await;

    // Handlers that never end: cancelled at the timeout, their rows released at once.
    let t = ctx.table(Spec::lease()).await;
    fill(&ctx, &t, 2 * WORKERS).await;
    let journal = Arc::new(Journal::default());
    let handlers = Arc::clone(&journal);
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_secs(30))
        .attempt("attempt")
        .workers(WORKERS)
        .handler(move |d: Delivery<DB>| {
            handlers.begin(d.id(), d.attempt());
            std::future::pending::<Outcome>()
        });
    let (cancelled, cancel_time) =
        shut_down_in_work(&pool, CANCEL_TIMEOUT, |r| r.mount(queue), &journal).await;
    assert!(
        cancel_time < CANCEL_TIMEOUT + STATEMENTS,
        "shutdown took {cancel_time:?} with a shutdown_timeout of {CANCEL_TIMEOUT:?}"
    );
    assert!(cancel_time >= CANCEL_TIMEOUT, "returned before its timeout");
    // The eight cancelled, and the eight claimed ahead of the workers: the lease form's; the
    // advisory form's unless they went back before the shutdown (a row ahead that waited
    // 100 ms goes back, and the runner claims none ahead of handlers that slow).
    let ahead = cancelled.released.saturating_sub(8);
    let expected: &[u64] = match F::NAME {
        "lease" => &[8],
        "advisory" => &[0, 8],
        _ => &[0],
    };
    assert_eq!(cancelled.cancelled, 8, "{cancelled:?}");
    assert!(expected.contains(&ahead), "{cancelled:?}");
    if F::NAME == "advisory" {
        assert_eq!(cancelled.keys_released, cancelled.released, "{cancelled:?}");
    }
    assert_nothing_held::<DB, F>(&ctx, &t, None).await;
    // Lease and advisory count an attempt at the claim; a row lock's rollback does not.
    let counted = if F::COUNTS_AT_TAKE { 8 } else { 0 };
    assert_eq!(
        ctx.count(&t, "attempt = 2").await,
        counted,
        "attempts counted"
    );
    let fresh_cancelled = all_at_once::<DB, F>(&ctx, &t, 2 * WORKERS).await;
    pool.close().await;

    report(&format!(
        "shutdown: {} {}: with {WORKERS} in work (each needing <= {WORK:?}) returned in {} ms, \
         all settled, bound shutdown_timeout {SHUTDOWN_TIMEOUT:?} + statements in flight; with \
         {WORKERS} that never end and shutdown_timeout {CANCEL_TIMEOUT:?}: {} ms, {} cancelled \
         and released; a fresh runner had all {left} (then {}) remaining rows in work at once \
         after {} ms ({} ms)",
        DB::LABEL,
        F::NAME,
        finish_time.as_millis(),
        cancel_time.as_millis(),
        cancelled.cancelled,
        2 * WORKERS,
        fresh.as_millis(),
        fresh_cancelled.as_millis(),
    ));
    ctx.drop_tables().await;
}

/// Starts a runner with a worker per remaining row of `t`, and fails unless all `rows` are in
/// work at once (none held elsewhere); then lets them ack. Returns how long they took to start.
pub(crate) async fn all_at_once<DB: TestDb, F: Form<DB>>(
    ctx: &Ctx<DB>,
    t: &str,
    rows: usize,
) -> Duration {
    let pool = ctx.pool(pool_for(rows)).await;
    let (go, mut seen) = Gate::new();
    let gate = Arc::clone(&go);
    let queue = F::apply_leasing(Queue::table(jobs(t)), Duration::from_secs(30))
        .attempt("attempt")
        .workers(rows)
        .handler(move |d: Delivery<DB>| gate.hold(d.id()));
    let begun = Instant::now();
    let running = start_runner(&pool, |r| r.mount(queue)).await;
    let mut ids = Vec::new();
    for _ in 0..rows {
        let id = tokio::time::timeout(Duration::from_secs(10), seen.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "only {} of {rows} rows in work at once after 10 s: {ids:?} (the others \
                     are still held)",
                    ids.len()
                )
            })
            .unwrap();
        ids.push(id);
    }
    let took = begun.elapsed();
    go.open(rows);
    ctx.wait_none(t, "1 = 1", 30).await;
    running.shutdown().await.unwrap();
    pool.close().await;
    took
}

/// Starts the runner `mount` makes on `pool`, waits for `WORKERS` deliveries in work, then shuts
/// it down: its report, and how long the shutdown took.
async fn shut_down_in_work<DB: TestDb>(
    pool: &Pool<DB>,
    timeout: Duration,
    mount: impl FnOnce(Runner<DB>) -> Runner<DB>,
    journal: &Journal,
) -> (ShutdownReport, Duration) {
    let running = start_runner(pool, |r| mount(r.shutdown_timeout(timeout))).await;
    wait_for("8 deliveries in work", Duration::from_secs(10), || async {
        journal.in_work() == WORKERS
    })
    .await;
    let stopping = Instant::now();
    let report = running.shutdown().await.unwrap();
    (report, stopping.elapsed())
}
