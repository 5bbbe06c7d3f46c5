//! Scenario 4 — Pool exhaustion. A form that holds a connection per delivery in work — row lock,
//! advisory, any transactional queue — on a pool smaller than its workers plus one is refused at
//! start, with an error that says the size it needs. On a pool of exactly that size, under load,
//! the runner drains its table without a deadlock, and `shutdown()` in the middle of the load
//! returns within its bound: the runner's `shutdown_timeout` plus the statements in flight. A plain
//! lease queue needs one connection, whatever its workers: on a pool of one, the same.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Error, Outcome, Queue, Runner, Transactional};
use tokio::time::Instant;

use crate::crash::{enqueue, fill};
use crate::support::{
    Ctx, Form, Journal, Spec, TestDb, assert_handled, assert_nothing_held, jobs, pool_for, report,
    wait_for,
};

const WORKERS: usize = 8;
const ROWS: usize = 400;
const WORK: Duration = Duration::from_millis(5);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// What a statement in flight may add to a shutdown on this shared, noisy machine.
const STATEMENTS: Duration = Duration::from_secs(3);

every_form!(pool_exhaustion);

async fn pool_exhaustion<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let need = pool_for(WORKERS);

    // Too small: refused at start, naming the size it needs.
    let t = ctx.table(Spec::lease()).await;
    let small = ctx.pool(need - 1).await;
    let transactional = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_secs(30))
        .transactional()
        .workers(WORKERS)
        .handler(|_: Delivery<DB, Transactional>| async { Outcome::ack() });
    let refused = Runner::new(small.clone())
        .mount(transactional)
        .start()
        .await;
    let Err(error @ Error::PoolTooSmall { .. }) = refused else {
        panic!("a transactional queue of {WORKERS} workers on a pool of {WORKERS} started");
    };
    assert!(
        error
            .to_string()
            .contains(&format!("max_connections to {need}")),
        "{error}"
    );
    if F::HOLDS {
        let plain = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_secs(30))
            .workers(WORKERS)
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        let refused = Runner::new(small.clone()).mount(plain).start().await;
        let Err(error @ Error::PoolTooSmall { .. }) = refused else {
            panic!(
                "{} with {WORKERS} workers on a pool of {WORKERS} started",
                F::NAME
            );
        };
        assert!(
            error
                .to_string()
                .contains(&format!("max_connections to {need}")),
            "{error}"
        );
    }
    small.close().await;

    // Exactly sized: transactional (a connection per delivery, whatever the form).
    let pool = ctx.pool(need).await;
    let exact = under_load::<DB, F>(&mut ctx, &pool, true).await;
    pool.close().await;
    let mut lines = vec![format!("transactional on a pool of {need}: {exact}")];
    if !F::HOLDS {
        let pool = ctx.pool(1).await;
        let one = under_load::<DB, F>(&mut ctx, &pool, false).await;
        pool.close().await;
        lines.push(format!("plain on a pool of 1: {one}"));
    } else {
        let pool = ctx.pool(need).await;
        let plain = under_load::<DB, F>(&mut ctx, &pool, false).await;
        pool.close().await;
        lines.push(format!("plain on a pool of {need}: {plain}"));
    }
    report(&format!(
        "pool: {} {}: a pool of {} refused for {WORKERS} workers (\"max_connections to {need}\"); \
         {}",
        DB::LABEL,
        F::NAME,
        need - 1,
        lines.join("; ")
    ));
    ctx.drop_tables().await;
}

/// Drains `ROWS` rows with `WORKERS` workers on `pool`, then shuts down under load; returns what
/// it measured.
async fn under_load<DB: TestDb, F: Form<DB>>(
    ctx: &mut Ctx<DB>,
    pool: &Pool<DB>,
    transactional: bool,
) -> String {
    let t = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&t).await;
    let ids = fill(ctx, &t, ROWS).await;
    let journal = Arc::new(Journal::default());
    let runner = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .shutdown_timeout(SHUTDOWN_TIMEOUT);
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_secs(30)).workers(WORKERS);
    let handlers = Arc::clone(&journal);
    let running = if transactional {
        let handler =
            move |d: Delivery<DB, Transactional>| handlers.work(d.id(), d.attempt(), WORK);
        runner
            .mount(queue.transactional().handler(handler))
            .start()
            .await
    } else {
        let handler = move |d: Delivery<DB>| handlers.work(d.id(), d.attempt(), WORK);
        runner.mount(queue.handler(handler)).start().await
    }
    .unwrap();
    let started = Instant::now();
    ctx.wait_none(&t, "1 = 1", 120).await;
    let drained = started.elapsed();
    let stats = running.stats();
    assert_eq!((stats.failed, stats.lease_lost), (0, 0), "{stats:?}");
    assert_handled(&journal.entries(), &ids);
    ctx.assert_settled_once(&settled, &ids).await;

    // Load again, and shut down in the middle of it (the runner drains while the rows go in).
    enqueue(ctx, &t, ROWS).await;
    wait_for(
        "the runner at full load again",
        Duration::from_secs(30),
        || async { journal.in_work() >= WORKERS / 2 },
    )
    .await;
    let stopping = Instant::now();
    let shutdown = tokio::time::timeout(
        SHUTDOWN_TIMEOUT + STATEMENTS,
        running.shutdown(),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "shutdown hung: not back within shutdown_timeout {SHUTDOWN_TIMEOUT:?} + {STATEMENTS:?}"
        )
    })
    .unwrap();
    let stopped = stopping.elapsed();
    assert_eq!(shutdown.cancelled, 0, "{shutdown:?}");
    assert_eq!(
        journal.in_work(),
        0,
        "a handler still in work after shutdown"
    );
    assert_nothing_held::<DB, F>(ctx, &t, Some(&settled)).await;
    let left = ctx.count(&t, "1 = 1").await;
    assert!(left < ROWS as i64, "nothing was handled of the second load");
    format!(
        "{ROWS} rows drained in {:.2} s ({:.0}/s), shutdown under load returned in {} ms with {} \
         in work",
        drained.as_secs_f64(),
        ROWS as f64 / drained.as_secs_f64(),
        stopped.as_millis(),
        shutdown.in_work
    )
}
