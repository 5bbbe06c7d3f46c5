// The runner: concurrency, shutdown, panics, wake-ups, claim failures, groups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::support::{
    Ctx, INTENDED_PANIC, Spec, TestDb, intended_panics_without_backtrace, recv, wait_for,
};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(runner<$db>:
            two_runners_of_four_workers_handle_every_row_exactly_once,
            shutdown_finishes_deliveries_in_work_and_leaves_no_lease,
            shutdown_cancels_handlers_at_its_timeout_and_releases_their_rows,
            a_panicking_handler_is_retried_and_the_runner_goes_on,
            an_enqueue_in_this_process_wakes_an_idle_queue,
            claims_that_fail_are_retried_until_the_table_is_back,
            queues_of_one_table_serve_their_own_group,
            batched_acknowledgements_report_a_lost_lease_row_by_row,
            busy_queues_leave_the_pool_a_connection_for_the_application,
            a_connection_a_handler_used_goes_back_through_the_pools_after_release,
        );
    };
}
pub(crate) use tests;

fn jobs(table: &str) -> Table {
    Table::new(table).retry_after("retry_after")
}

fn runner<DB: TestDb>(ctx: &Ctx<DB>) -> Runner<DB> {
    Runner::new(ctx.pool.clone()).poll_interval(Duration::from_millis(50))
}

pub(crate) async fn two_runners_of_four_workers_handle_every_row_exactly_once<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let payloads: Vec<String> = (0..1000).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    assert_eq!(
        DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
            .await
            .unwrap(),
        1000
    );

    let handled: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    // A runner's handlers wait (at most 30 s) until the other runner has handled a row too, so
    // that the one started first cannot drain the table before the other has started (it did,
    // 1,000 rows, on a machine where MariaDB drains them in well under a second).
    let started: Arc<[watch::Sender<bool>; 2]> =
        Arc::new([watch::Sender::new(false), watch::Sender::new(false)]);
    let queue = |who: usize, handled: Arc<Mutex<HashMap<i64, u32>>>| {
        let started = Arc::clone(&started);
        Queue::table(jobs(&t))
            .lease("locked_until")
            .attempt("attempt")
            .workers(4)
            .handler(move |d: Delivery<DB>| {
                *handled.lock().unwrap().entry(d.id()).or_default() += 1;
                let started = Arc::clone(&started);
                async move {
                    started[who].send_replace(true);
                    let mut other = started[1 - who].subscribe();
                    let both = other.wait_for(|handled| *handled);
                    let _ = tokio::time::timeout(Duration::from_secs(30), both).await;
                    Outcome::ack()
                }
            })
    };
    let first = runner(&ctx)
        .mount(queue(0, Arc::clone(&handled)))
        .start()
        .await
        .unwrap();
    let second = runner(&ctx)
        .mount(queue(1, Arc::clone(&handled)))
        .start()
        .await
        .unwrap();

    ctx.wait_none(&t, "1 = 1", 120).await;
    let (a, b) = (first.stats(), second.stats());
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
    {
        let handled = handled.lock().unwrap();
        assert_eq!(handled.len(), 1000, "every row handled");
        let twice: Vec<_> = handled.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "rows handled more than once: {twice:?}");
    }
    assert_eq!(a.claimed + b.claimed, 1000, "claimed once each");
    assert!(
        a.claimed > 0 && b.claimed > 0,
        "both runners worked: {a:?} {b:?}"
    );
    ctx.drop_tables().await;
}

/// A queue of 4 workers whose handlers wait for `gate`, then retry.
fn gated<DB: TestDb>(
    table: &str,
    gate: Arc<Semaphore>,
    started: mpsc::UnboundedSender<i64>,
) -> impl sqlx_queue::state::Mount<DB> {
    Queue::table(jobs(table))
        .lease("locked_until")
        .attempt("attempt")
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let (gate, started) = (Arc::clone(&gate), started.clone());
            async move {
                let _ = started.send(d.id());
                let _permit = gate.acquire().await.unwrap();
                Outcome::retry()
            }
        })
}

pub(crate) async fn shutdown_finishes_deliveries_in_work_and_leaves_no_lease<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let batch: Vec<Job<'_>> = (0..10).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = mpsc::unbounded_channel();
    let running = runner(&ctx)
        .mount(gated(&t, Arc::clone(&gate), tx))
        .start()
        .await
        .unwrap();
    for _ in 0..4 {
        recv(&mut started, "four deliveries in work", 10).await;
    }
    // The four in work, and the six claimed ahead of the workers.
    ctx.wait_count(&t, "locked_until IS NOT NULL", 10, 10).await;

    // The first poll of `shutdown` counts the deliveries in work and stops claiming.
    let mut shutdown = Box::pin(running.shutdown());
    assert!(futures::poll!(&mut shutdown).is_pending());
    // Shutdown waits for the handlers: let them finish now.
    gate.add_permits(4);
    let report = tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown returns once its handlers finish")
        .unwrap();
    assert_eq!(report.in_work, 4);
    assert_eq!(report.cancelled, 0);
    assert_eq!(
        ctx.count(&t, "locked_until IS NOT NULL").await,
        0,
        "no lease left"
    );
    assert_eq!(
        ctx.count(&t, "attempt = 2").await,
        4,
        "the four were settled (retried)"
    );
    assert_eq!(
        ctx.count(&t, "attempt = 1").await,
        6,
        "the six claimed ahead went back uncounted"
    );
    assert!(
        started.try_recv().is_err(),
        "nothing claimed after shutdown began"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn shutdown_cancels_handlers_at_its_timeout_and_releases_their_rows<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let batch: Vec<Job<'_>> = (0..6).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let (tx, mut started) = mpsc::unbounded_channel();
    // The gate never opens.
    let running = runner(&ctx)
        .shutdown_timeout(Duration::from_millis(300))
        .mount(gated(&t, Arc::new(Semaphore::new(0)), tx))
        .start()
        .await
        .unwrap();
    for _ in 0..4 {
        recv(&mut started, "four deliveries in work", 10).await;
    }
    let report = tokio::time::timeout(Duration::from_secs(10), running.shutdown())
        .await
        .expect("shutdown returns after its timeout")
        .unwrap();
    // The four cancelled, and the two claimed ahead of the workers, unstarted.
    assert_eq!(
        (report.in_work, report.cancelled, report.released),
        (4, 4, 6)
    );
    assert_eq!(
        ctx.count(&t, "locked_until IS NOT NULL").await,
        0,
        "no lease left"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_panicking_handler_is_retried_and_the_runner_goes_on<DB: TestDb>() {
    intended_panics_without_backtrace();
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            async move {
                assert!(d.attempt() > 1, "{INTENDED_PANIC}");
                Outcome::ack()
            }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (id, 1));
    assert_eq!(recv(&mut seen, "the retry", 10).await, (id, 2));
    ctx.wait_none(&t, "1 = 1", 10).await;
    assert_eq!(running.stats().panicked, 1);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn an_enqueue_in_this_process_wakes_an_idle_queue<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    // Without the wake-up, the queue would not look again for an hour.
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_secs(3600))
        .mount(queue)
        .start()
        .await
        .unwrap();
    // After each delivery the queue finds nothing more and sleeps: each row needs a wake-up.
    for _ in 0..3 {
        let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("now"))
            .await
            .unwrap();
        assert_eq!(recv(&mut seen, "the woken delivery", 5).await, id);
    }
    // An enqueue inside a transaction wakes the queue before it commits: the queue looks
    // again shortly after.
    let mut tx = ctx.pool.begin().await.unwrap();
    let id = DB::enqueue_on(&mut *tx, &jobs(&t), Job::new("in tx"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    tx.commit().await.unwrap();
    assert_eq!(recv(&mut seen, "the delivery after commit", 5).await, id);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn claims_that_fail_are_retried_until_the_table_is_back<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    ctx.exec(&format!("DROP TABLE {t}")).await;
    // Let a few claims fail.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctx.exec(&DB::ddl(&t, Spec::lease())).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("back"))
        .await
        .unwrap();
    assert_eq!(
        recv(&mut seen, "a delivery from the new table", 20).await,
        id
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn queues_of_one_table_serve_their_own_group<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).group("queue");
    for group in ["mail", "sms", "mail", "mail", "sms"] {
        DB::enqueue(&ctx.pool, &table, Job::new(group).group(group))
            .await
            .unwrap();
    }
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = |group: &'static str| {
        let tx = tx.clone();
        Queue::table(table.clone())
            .named(group)
            .lease("locked_until")
            .handler(move |d: Delivery<DB>| {
                let _ = tx.send((group, d.group().map(str::to_owned), d.into_payload()));
                async { Outcome::ack() }
            })
    };
    let running = runner(&ctx)
        .mount(queue("mail"))
        .mount(queue("sms"))
        .start()
        .await
        .unwrap();
    for _ in 0..5 {
        let (queue, group, payload) = recv(&mut seen, "a delivery", 10).await;
        assert_eq!(group.as_deref(), Some(queue));
        assert_eq!(
            payload,
            queue.as_bytes(),
            "the {queue} queue got a row of its group"
        );
    }
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn batched_acknowledgements_report_a_lost_lease_row_by_row<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let payloads: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let pool = ctx.pool.clone();
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = ");
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .workers(8)
        .handler(move |d: Delivery<DB>| {
            let (pool, steal) = (pool.clone(), steal.clone());
            async move {
                if d.payload() == b"7" {
                    // Another claim takes this one row while its handler works.
                    let sql = format!("{steal}{}", d.id());
                    DB::exec_time(&pool, &sql, later_claim).await.unwrap();
                }
                Outcome::ack()
            }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    ctx.wait_count(&t, "1 = 1", 1, 20).await;
    wait_for(
        "39 acks and one lost lease",
        Duration::from_secs(10),
        || async {
            let stats = running.stats();
            stats.acked == 39 && stats.lease_lost == 1
        },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&t, "locked_until IS NOT NULL").await,
        1,
        "the stolen row"
    );
    ctx.drop_tables().await;
}

/// Two busy lease queues on a pool of two: the connections they keep between statements never
/// leave the application without one.
pub(crate) async fn busy_queues_leave_the_pool_a_connection_for_the_application<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (a, b) = (
        ctx.table(Spec::lease()).await,
        ctx.table(Spec::lease()).await,
    );
    for t in [&a, &b] {
        DB::enqueue(&ctx.pool, &jobs(t), Job::new("held"))
            .await
            .unwrap();
    }
    let pool = ctx.pool(2).await;
    let gate = Arc::new(Semaphore::new(0));
    let (started, mut seen) = mpsc::unbounded_channel();
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(gated(&a, Arc::clone(&gate), started.clone()))
        .mount(gated(&b, Arc::clone(&gate), started))
        .start()
        .await
        .unwrap();
    recv(&mut seen, "the first queue's delivery", 10).await;
    recv(&mut seen, "the second queue's delivery", 10).await;
    // Both queues have claimed and are in work: the application still gets a connection.
    let conn = tokio::time::timeout(Duration::from_secs(5), pool.acquire())
        .await
        .expect("the application waited 5 s for a connection of a pool of 2 with 2 queues busy")
        .unwrap();
    drop(conn);
    gate.add_permits(2);
    running.shutdown().await.unwrap();
    pool.close().await;
    ctx.drop_tables().await;
}

/// A transactional delivery's connection, once a handler used it, goes back through the pool
/// and its `after_release` hook (where an application resets session state), never kept by the
/// queue for the next delivery.
pub(crate) async fn a_connection_a_handler_used_goes_back_through_the_pools_after_release<
    DB: TestDb,
>() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let rows = 20;
    let payloads: Vec<String> = (0..rows).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let released = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&released);
    let options = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(4)
        .after_release(move |_, _| {
            counter.fetch_add(1, Ordering::Relaxed);
            Box::pin(async { Ok(true) })
        });
    let pool = ctx.pool_with(options).await;
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .transactional()
        .handler(
            |mut d: Delivery<DB, sqlx_queue::Transactional>| async move {
                DB::query_on(&mut *d.tx(), "SELECT 1").await.unwrap();
                Outcome::ack()
            },
        );
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 20).await;
    running.shutdown().await.unwrap();
    let seen = released.load(Ordering::Relaxed);
    assert!(
        seen >= rows,
        "after_release ran {seen} times for {rows} deliveries whose handlers used a connection"
    );
    pool.close().await;
    ctx.drop_tables().await;
}
