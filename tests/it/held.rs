// The forms that hold a connection per delivery — row lock and advisory lock — row by row of
// the settlement table (DESIGN.md §3), and under concurrency.
//
// Each test runs on one database `DB` and one of these forms `F`: `F::COUNTS_AT_TAKE` is true
// for the advisory form, which counts the attempt when it takes the row, false for the row lock
// form, which counts it in the statement that returns the row.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Running, Table};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{
    Ctx, Form, INTENDED_PANIC, Spec, TestDb, intended_panics_without_backtrace, recv, wait_for,
};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(held<$db, $form>:
            a_row_handler_gets_its_row_whole,
            ack_and_drop_delete_the_row,
            ack_marks_processed_at_where_the_table_has_it,
            retry_returns_the_row_at_once_and_counts_the_attempt,
            retry_without_an_attempt_column_returns_the_row_as_it_was,
            retry_after_sets_the_delay_and_counts_the_attempt,
            a_panic_is_a_retry,
            shutdown_finishes_deliveries_and_holds_nothing,
            a_delivery_dropped_unsettled_returns_its_row_at_once,
            three_runners_of_four_workers_never_deliver_a_row_twice,
            a_pool_of_workers_plus_one_is_enough_and_a_smaller_one_is_refused,
            a_killed_consumer_process_returns_its_row_at_once,
            a_transactional_row_lock_above_read_committed_is_refused_on_mysql,
            a_failed_settlement_returns_the_row_as_it_was,
        );
    };
}
pub(crate) use tests;

type Seen = mpsc::UnboundedReceiver<(i64, u32)>;

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// Row mode: the row is read whole on the connection that holds it.
pub(crate) async fn a_row_handler_gets_its_row_whole<DB: TestDb, F: Form<DB>>() {
    use crate::rows::{emails, handled, send_rows};
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, want) = emails(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .workers(2)
        .row_handler(send_rows(tx));
    let got = handled(&ctx, &t, want.len(), |r| r.mount(queue), &mut seen).await;
    assert_eq!(got, want, "each row whole, with the service's own column");
    ctx.drop_tables().await;
}

/// Starts a runner of `workers` on `pool` whose handler reports `(id, attempt)` and
/// settles with `outcome(attempt)`.
async fn start<DB: TestDb, F: Form<DB>>(
    pool: &Pool<DB>,
    table: Table,
    workers: usize,
    outcome: impl Fn(u32) -> Outcome + Send + Sync + 'static,
) -> (Running, Seen) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .workers(workers)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            let outcome = outcome(d.attempt());
            async move { outcome }
        });
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    (running, rx)
}

pub(crate) async fn ack_and_drop_delete_the_row<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let first = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("a"))
        .await
        .unwrap();
    let second = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("b"))
        .await
        .unwrap();
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, {
        let n = std::sync::atomic::AtomicU32::new(0);
        move |_| match n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => Outcome::ack(),
            _ => Outcome::drop(),
        }
    })
    .await;
    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (first, 1));
    assert_eq!(
        recv(&mut seen, "the second delivery", 10).await,
        (second, 1)
    );
    ctx.wait_none(&t, "1 = 1", 10).await;
    wait_for("an ack and a drop", Duration::from_secs(5), || async {
        let stats = running.stats();
        stats.acked == 1 && stats.dropped == 1
    })
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn ack_marks_processed_at_where_the_table_has_it<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            processed_at: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).processed_at("processed_at");
    let id = DB::enqueue(&ctx.pool, &table, Job::new("a")).await.unwrap();
    let (running, mut seen) = start::<DB, F>(&ctx.pool, table.clone(), 1, |_| Outcome::ack()).await;
    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_count(&t, "processed_at IS NOT NULL", 1, 10).await;
    let later = DB::enqueue(&ctx.pool, &table, Job::new("later"))
        .await
        .unwrap();
    assert_eq!(
        recv(&mut seen, "the later row, not the marked one", 10).await,
        (later, 1)
    );
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&t, "1 = 1").await, 2);
    ctx.drop_tables().await;
}

pub(crate) async fn retry_returns_the_row_at_once_and_counts_the_attempt<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("flaky"))
        .await
        .unwrap();
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, |attempt| {
        if attempt < 3 {
            Outcome::retry()
        } else {
            Outcome::ack()
        }
    })
    .await;
    for attempt in 1..=3 {
        assert_eq!(recv(&mut seen, "a delivery", 10).await, (id, attempt));
    }
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn retry_without_an_attempt_column_returns_the_row_as_it_was<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            attempt: false,
            ..Spec::lease()
        })
        .await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let retried = std::sync::atomic::AtomicBool::new(false);
    let queue = F::apply(Queue::table(jobs(&t))).handler(move |d: Delivery<DB>| {
        let _ = tx.send((d.id(), d.attempt()));
        let first = !retried.swap(true, std::sync::atomic::Ordering::SeqCst);
        async move {
            if first {
                Outcome::retry()
            } else {
                Outcome::ack()
            }
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (id, 1));
    assert_eq!(recv(&mut seen, "the retry", 10).await, (id, 1));
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn retry_after_sets_the_delay_and_counts_the_attempt<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("later"))
        .await
        .unwrap();
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, |_| {
        Outcome::retry_after(Duration::from_secs(3600))
    })
    .await;
    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_count(
        &t,
        &format!("id = {id} AND retry_after IS NOT NULL AND attempt = 2"),
        1,
        10,
    )
    .await;
    let next = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("next"))
        .await
        .unwrap();
    assert_eq!(
        recv(&mut seen, "the next row, not the delayed one", 10).await,
        (next, 1)
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_panic_is_a_retry<DB: TestDb, F: Form<DB>>() {
    intended_panics_without_backtrace();
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, |attempt| {
        assert!(attempt > 1, "{INTENDED_PANIC}");
        Outcome::ack()
    })
    .await;
    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (id, 1));
    assert_eq!(recv(&mut seen, "the retry", 10).await, (id, 2));
    ctx.wait_none(&t, "1 = 1", 10).await;
    assert_eq!(running.stats().panicked, 1);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// Four handlers of `table` that report their row, then wait for `gate`, then retry.
async fn gated<DB: TestDb, F: Form<DB>>(
    pool: &Pool<DB>,
    table: Table,
    gate: Arc<Semaphore>,
    timeout: Duration,
) -> (Running, mpsc::UnboundedReceiver<i64>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let (gate, tx) = (Arc::clone(&gate), tx.clone());
            async move {
                let _ = tx.send(d.id());
                let _permit = gate.acquire().await.unwrap();
                Outcome::retry()
            }
        });
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .shutdown_timeout(timeout)
        .mount(queue)
        .start()
        .await
        .unwrap();
    (running, rx)
}

/// Waits until a fresh runner has taken every row of `t`: nothing is left held.
async fn all_claimable<DB: TestDb, F: Form<DB>>(ctx: &Ctx<DB>, t: &str, rows: usize) {
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(t), 4, |_| Outcome::ack()).await;
    for _ in 0..rows {
        recv(&mut seen, "every row claimable again at once", 10).await;
    }
    ctx.wait_none(t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
}

pub(crate) async fn shutdown_finishes_deliveries_and_holds_nothing<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let batch: Vec<Job<'_>> = (0..6).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (running, mut started) = gated::<DB, F>(
        &ctx.pool,
        jobs(&t),
        Arc::clone(&gate),
        Duration::from_secs(30),
    )
    .await;
    for _ in 0..4 {
        recv(&mut started, "four deliveries in work", 10).await;
    }
    // The first poll of `shutdown` counts the deliveries in work and stops claiming.
    let mut shutdown = Box::pin(running.shutdown());
    assert!(futures::poll!(&mut shutdown).is_pending());
    gate.add_permits(4);
    let report = tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown returns once its handlers finish")
        .unwrap();
    assert_eq!((report.in_work, report.cancelled), (4, 0));
    if F::COUNTS_AT_TAKE {
        // The keys of the four in work, and of the rows claimed ahead of them (released
        // unstarted).
        assert_eq!(
            report.keys_released,
            4 + report.released,
            "every key in work released: {report:?}"
        );
    }
    assert_eq!(
        ctx.count(&t, "attempt = 2").await,
        4,
        "the four were retried"
    );
    all_claimable::<DB, F>(&ctx, &t, 6).await;
    ctx.drop_tables().await;
}

pub(crate) async fn a_delivery_dropped_unsettled_returns_its_row_at_once<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let batch: Vec<Job<'_>> = (0..4).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    // The gate never opens: shutdown cancels the handlers at its timeout.
    let (running, mut started) = gated::<DB, F>(
        &ctx.pool,
        jobs(&t),
        Arc::new(Semaphore::new(0)),
        Duration::from_millis(200),
    )
    .await;
    for _ in 0..4 {
        recv(&mut started, "four deliveries in work", 10).await;
    }
    let report = running.shutdown().await.unwrap();
    assert_eq!((report.cancelled, report.released), (4, 4));
    // Row lock: rolled back, the attempt not counted; advisory: counted at the take.
    let attempt = if F::COUNTS_AT_TAKE { 2 } else { 1 };
    assert_eq!(ctx.count(&t, &format!("attempt = {attempt}")).await, 4);
    all_claimable::<DB, F>(&ctx, &t, 4).await;
    ctx.drop_tables().await;
}

pub(crate) async fn three_runners_of_four_workers_never_deliver_a_row_twice<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let payloads: Vec<String> = (0..2000).map(|i| i.to_string()).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();

    let in_work: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let handled: Arc<Mutex<Vec<i64>>> = Arc::default();
    let overlaps: Arc<Mutex<Vec<i64>>> = Arc::default();
    let mut runners = Vec::new();
    for _ in 0..3 {
        // A pool of its own, as another process would have: workers + 1.
        let pool = ctx.pool(5).await;
        let (in_work, handled, overlaps) = (
            Arc::clone(&in_work),
            Arc::clone(&handled),
            Arc::clone(&overlaps),
        );
        let queue = F::apply(Queue::table(jobs(&t)))
            .attempt("attempt")
            .workers(4)
            .handler(move |d: Delivery<DB>| {
                let (in_work, handled, overlaps) = (
                    Arc::clone(&in_work),
                    Arc::clone(&handled),
                    Arc::clone(&overlaps),
                );
                async move {
                    if !in_work.lock().unwrap().insert(d.id()) {
                        overlaps.lock().unwrap().push(d.id());
                    }
                    tokio::task::yield_now().await;
                    handled.lock().unwrap().push(d.id());
                    in_work.lock().unwrap().remove(&d.id());
                    Outcome::ack()
                }
            });
        let running = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(50))
            .mount(queue)
            .start()
            .await
            .unwrap();
        runners.push((running, pool));
    }
    ctx.wait_none(&t, "1 = 1", 120).await;
    let mut failed = 0;
    for (running, pool) in runners {
        failed += running.stats().failed;
        running.shutdown().await.unwrap();
        pool.close().await;
    }
    assert!(
        overlaps.lock().unwrap().is_empty(),
        "rows in two handlers at once"
    );
    let mut handled = std::mem::take(&mut *handled.lock().unwrap());
    handled.sort_unstable();
    let before = handled.len();
    handled.dedup();
    assert_eq!(before, handled.len(), "a row was handled twice");
    assert_eq!(handled.len(), 2000, "every row handled");
    assert_eq!(failed, 0, "no settlement failed");
    ctx.drop_tables().await;
}

pub(crate) async fn a_pool_of_workers_plus_one_is_enough_and_a_smaller_one_is_refused<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let payloads: Vec<String> = (0..300).map(|i| i.to_string()).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();

    let small = ctx.pool(4).await;
    let queue = F::apply(Queue::table(jobs(&t)))
        .workers(4)
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(small.clone()).mount(queue).start().await;
    let Err(error @ Error::PoolTooSmall { needed: 5, .. }) = refused else {
        panic!("a pool of 4 for 4 workers is refused: {refused:?}");
    };
    assert!(
        error.to_string().contains("max_connections to 5"),
        "{error}"
    );
    small.close().await;

    let pool = ctx.pool(5).await;
    let (running, mut seen) = start::<DB, F>(&pool, jobs(&t), 4, |_| Outcome::ack()).await;
    for _ in 0..300 {
        recv(&mut seen, "every row, at full load", 30).await;
    }
    ctx.wait_none(&t, "1 = 1", 30).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    pool.close().await;
    assert_eq!((stats.failed, stats.lease_lost), (0, 0), "{stats:?}");
    ctx.drop_tables().await;
}

pub(crate) async fn a_killed_consumer_process_returns_its_row_at_once<DB: TestDb, F: Form<DB>>() {
    if F::COUNTS_AT_TAKE && DB::LABEL == "sqlite" {
        return; // SQLite's advisory keys live in one process: nothing to take over.
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let database = ctx.url.clone().expect("a database");
    let form = F::NAME;
    let mut consumer = crate::support::Consumer::spawn(&database, &t, form, "hang", &[]);
    // The consumer prints `running` once its runner started, and the runner's queue may claim
    // (and print `started`) before that line is written: the two in either order.
    let mut lines = [consumer.line(30).await, consumer.line(30).await];
    lines.sort();
    assert_eq!(
        lines,
        ["running".to_owned(), format!("started {id}")],
        "the consumer's first lines"
    );
    consumer.kill().await;
    let killed = tokio::time::Instant::now();

    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, |_| Outcome::ack()).await;
    let started = killed.elapsed();
    let (got, attempt) = recv(&mut seen, "the killed consumer's row", 10).await;
    let back = killed.elapsed();
    assert_eq!(got, id, "the row the killed consumer held");
    // Row lock: the server rolled the claim back; advisory: the take had counted.
    assert_eq!(
        attempt,
        if F::COUNTS_AT_TAKE { 2 } else { 1 },
        "the attempt of the delivery after the kill"
    );
    assert!(
        back < Duration::from_secs(3),
        "back after {back:?} (the runner started {started:?} after the kill)"
    );
    crate::support::report(&format!(
        "{}: {form}: a row held by a killed process delivered again {back:?} after the kill",
        DB::LABEL
    ));
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_transactional_row_lock_above_read_committed_is_refused_on_mysql<
    DB: TestDb,
    F: Form<DB>,
>() {
    if F::COUNTS_AT_TAKE || DB::LABEL != "mysql" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let queue = F::apply(Queue::table(jobs(&t)))
        .transactional()
        .isolation(DB::setting(
            sqlx_queue::Isolation::RepeatableRead,
            sqlx_queue::SqliteMode::Deferred,
        ))
        .handler(|_: Delivery<DB, sqlx_queue::Transactional>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_failed_settlement_returns_the_row_as_it_was<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&DB::refusing(&t, "DELETE")).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    // The ack's DELETE fails: the row returns (the key released, or the claim's
    // transaction rolled back), and is delivered again.
    let (running, mut seen) = start::<DB, F>(&ctx.pool, jobs(&t), 1, |_| Outcome::ack()).await;
    assert_eq!(recv(&mut seen, "the delivery", 10).await.0, id);
    assert_eq!(recv(&mut seen, "the delivery again", 10).await.0, id);
    assert!(running.stats().failed >= 1);
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&t, &format!("id = {id}")).await,
        1,
        "the row is kept"
    );
    ctx.drop_tables().await;
}
