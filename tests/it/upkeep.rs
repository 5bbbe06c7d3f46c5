// Upkeep: the oldest ready job's age (`counts`, the runner's depth gauges) and pruning.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Semaphore, mpsc};

use crate::metrics::Recorded;
use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(upkeep<$db>:
            counts_and_gauges_tell_the_oldest_ready_jobs_age,
            prune_deletes_exactly_the_old_finished_and_dead_rows_while_a_runner_drains,
        );
    };
}
pub(crate) use tests;

fn jobs(t: &str) -> Table {
    Table::new(t)
        .group("queue")
        .retry_after("retry_after")
        .created_at("created_at")
}

/// Sets `created_at` of row `id` to `ago` before now.
async fn created<DB: TestDb>(ctx: &Ctx<DB>, t: &str, id: i64, ago: TimeDelta) {
    let sql = format!("UPDATE {t} SET created_at = ? WHERE id = {id}");
    ctx.exec_time(&sql, Utc::now() - ago).await;
}

/// A lease queue of one worker on group `queue` whose handler waits for `gate`.
fn held_queue<DB: TestDb>(
    t: &str,
    queue: &'static str,
    gate: &Arc<Semaphore>,
    seen: mpsc::UnboundedSender<i64>,
) -> impl sqlx_queue::state::Mount<DB> {
    let gate = Arc::clone(gate);
    // With priorities, the lease form claims no rows ahead of its one worker: the rows after the
    // one in work stay ready.
    Queue::table(jobs(t).priority("priority"))
        .named(queue)
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let (gate, seen) = (Arc::clone(&gate), seen.clone());
            async move {
                let _ = seen.send(d.id());
                let _permit = gate.acquire().await;
                Outcome::ack()
            }
        })
}

pub(crate) async fn counts_and_gauges_tell_the_oldest_ready_jobs_age<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            created_at: true,
            priority: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t);
    let mut ids = Vec::new();
    for (payload, ago) in [
        ("in work", 600),
        ("oldest ready", 60),
        ("ready", 1),
        ("ready", 0),
    ] {
        let id = DB::enqueue(&ctx.pool, &table, Job::new(payload).group("ages"))
            .await
            .unwrap();
        created(&ctx, &t, id, TimeDelta::seconds(ago)).await;
        ids.push(id);
    }
    // Older still, but neither ready (delayed) nor of this queue.
    let delayed = Job::new("delayed")
        .group("ages")
        .delay(Duration::from_secs(3600));
    let id = DB::enqueue(&ctx.pool, &table, delayed).await.unwrap();
    created(&ctx, &t, id, TimeDelta::seconds(900)).await;
    let id = DB::enqueue(&ctx.pool, &table, Job::new("other").group("other"))
        .await
        .unwrap();
    created(&ctx, &t, id, TimeDelta::seconds(900)).await;

    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let runner = Runner::new(ctx.pool.clone())
        .queue_gauges(Duration::from_millis(50))
        .mount(held_queue::<DB>(&t, "ages", &gate, tx));
    let (running, mut recorded) = Recorded::start(runner).await;
    assert_eq!(recv(&mut seen, "the first row in work", 10).await, ids[0]);

    let ages = Queue::table(table.clone())
        .named("ages")
        .lease("locked_until");
    let counts = ages.counts(&ctx.pool).await.unwrap();
    assert_eq!(counts.ready, 3, "{counts:?}");
    let age = counts.oldest_ready_age.expect("an age").as_secs_f64();
    assert!(
        (59.0..90.0).contains(&age),
        "the oldest ready row's: {age} s"
    );
    wait_for("the gauges' reading", Duration::from_secs(10), || {
        let r = recorded.read();
        let ready = r.last("sqlx_queue_ready_jobs", "ages");
        let age = r.last("sqlx_queue_oldest_ready_age_seconds", "ages");
        let read = ready == Some(3.0) && age.is_some_and(|age| (59.0..90.0).contains(&age));
        async move { read }
    })
    .await;
    // A table that declares no creation time has no age.
    let ageless = Table::new(&t).group("queue").retry_after("retry_after");
    let counts = Queue::table(ageless)
        .named("ages")
        .lease("locked_until")
        .counts(&ctx.pool)
        .await
        .unwrap();
    assert_eq!((counts.ready, counts.oldest_ready_age), (3, None));
    gate.add_permits(100);
    ctx.wait_none(&t, "queue = 'ages' AND retry_after IS NULL", 10)
        .await;
    let counts = ages.counts(&ctx.pool).await.unwrap();
    assert_eq!((counts.ready, counts.oldest_ready_age), (0, None));
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn prune_deletes_exactly_the_old_finished_and_dead_rows_while_a_runner_drains<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            processed_at: true,
            created_at: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).processed_at("processed_at");
    let enqueue = async |payload: &str, group: &str, n: usize| {
        let batch: Vec<Job<'_>> = (0..n).map(|_| Job::new(payload).group(group)).collect();
        DB::enqueue_many(&ctx.pool, &table, &batch).await.unwrap();
    };
    let (hours_ago, minute_ago) = (
        Utc::now() - TimeDelta::hours(2),
        Utc::now() - TimeDelta::minutes(1),
    );
    // Rows finished two hours ago (pruned) and a minute ago (kept), of groups of their own; dead
    // rows created two hours ago (pruned) and now (kept).
    enqueue("finished", "old", 25).await;
    enqueue("finished", "recent", 10).await;
    enqueue("dead", "p_dead", 8).await;
    let finished = |group: &str| format!("UPDATE {t} SET processed_at = ? WHERE queue = '{group}'");
    ctx.exec_time(&finished("old"), hours_ago).await;
    ctx.exec_time(&finished("recent"), minute_ago).await;
    ctx.exec_time(&format!("UPDATE {t} SET created_at = ?"), hours_ago)
        .await;
    enqueue("dead", "p_dead", 5).await;
    // The queue's rows, created two hours ago too: two held in work, the rest drained by one
    // worker while the prunes run, each marked finished now.
    enqueue("work", "p", 60).await;
    let old_work = format!("UPDATE {t} SET created_at = ? WHERE queue = 'p'");
    ctx.exec_time(&old_work, hours_ago).await;

    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let p = Queue::table(table.clone())
        .named("p")
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(5)
        .dead_letter(DeadLetter::group("p_dead"));
    let queue = {
        let (gate, handled) = (Arc::clone(&gate), Arc::clone(&handled));
        p.clone().workers(3).handler(move |d: Delivery<DB>| {
            let (gate, tx, handled) = (Arc::clone(&gate), tx.clone(), Arc::clone(&handled));
            async move {
                // The first two wait for the gate; the rest go one at a time.
                if handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 2 {
                    let _ = tx.send(d.id());
                    let _permit = gate.acquire().await;
                } else {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Outcome::ack()
            }
        })
    };
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    recv(&mut seen, "a row in work", 10).await;
    recv(&mut seen, "a second row in work", 10).await;

    // Two processes' worth of prunes at once, in batches of 4.
    let hour = Duration::from_secs(3600);
    let (a, b, c, d) = tokio::join!(
        p.prune(&ctx.pool, hour, 4),
        p.prune(&ctx.pool, hour, 4),
        p.prune_dead(&ctx.pool, hour, 4),
        p.prune_dead(&ctx.pool, hour, 4),
    );
    let drained = ctx
        .count(&t, "queue = 'p' AND processed_at IS NOT NULL")
        .await;
    assert_eq!(a.unwrap() + b.unwrap(), 25, "finished rows pruned");
    assert_eq!(c.unwrap() + d.unwrap(), 8, "dead rows pruned");
    assert!(
        drained < 58,
        "the prunes ran while the queue drained: {drained} of 58 done"
    );
    assert_eq!(ctx.count(&t, "queue = 'old'").await, 0);
    assert_eq!(ctx.count(&t, "queue = 'recent'").await, 10);
    assert_eq!(ctx.count(&t, "queue = 'p_dead'").await, 5);
    assert_eq!(ctx.count(&t, "queue = 'p'").await, 60, "ready and in work");
    assert!(
        ctx.count(&t, "locked_until IS NOT NULL AND processed_at IS NULL")
            .await
            >= 2,
        "the held rows still in work"
    );

    gate.add_permits(2);
    ctx.wait_count(&t, "queue = 'p' AND processed_at IS NOT NULL", 60, 20)
        .await;
    running.shutdown().await.unwrap();
    // Finished just now: not an hour ago.
    assert_eq!(p.prune(&ctx.pool, hour, 4).await.unwrap(), 0);
    assert_eq!(p.prune(&ctx.pool, Duration::ZERO, 1000).await.unwrap(), 70);
    assert_eq!(ctx.count(&t, "1 = 1").await, 5, "the recent dead rows");
    let keeps_none = Queue::table(Table::new(&t));
    let refused = keeps_none.prune(&ctx.pool, hour, 4).await.unwrap_err();
    assert!(refused.to_string().contains("processed_at"), "{refused}");
    ctx.drop_tables().await;
}
