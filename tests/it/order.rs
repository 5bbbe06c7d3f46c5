// The order rows are claimed in: priorities, and FIFO groups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::support::{Ctx, Spec, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(order<$db>:
            priority_then_due_time_then_id,
            fifo_groups_run_in_id_order_one_row_at_a_time_across_runners,
            a_delayed_fifo_head_lets_rows_due_earlier_go_first,
            bulk_jobs_keep_their_priorities,
            a_fifo_group_advances_as_each_row_settles_not_at_the_poll,
        );
    };
}
pub(crate) use tests;

pub(crate) async fn priority_then_due_time_then_id<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            priority: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .priority("priority");
    let low = DB::enqueue(&ctx.pool, &table, Job::new("low").priority(3))
        .await
        .unwrap();
    let mid = DB::enqueue(&ctx.pool, &table, Job::new("mid").priority(2))
        .await
        .unwrap();
    let due_late = DB::enqueue(&ctx.pool, &table, Job::new("due late").priority(1))
        .await
        .unwrap();
    let due_early = DB::enqueue(&ctx.pool, &table, Job::new("due early").priority(1))
        .await
        .unwrap();
    let never_delayed = DB::enqueue(&ctx.pool, &table, Job::new("never delayed").priority(1))
        .await
        .unwrap();
    // Two high-priority rows whose delays have run out, the later id due first.
    let hour_ago = chrono::Utc::now() - chrono::TimeDelta::hours(1);
    let two_hours_ago = hour_ago - chrono::TimeDelta::hours(1);
    DB::exec_time(
        &ctx.pool,
        &format!("UPDATE {t} SET retry_after = ? WHERE id = {due_late}"),
        hour_ago,
    )
    .await
    .unwrap();
    DB::exec_time(
        &ctx.pool,
        &format!("UPDATE {t} SET retry_after = ? WHERE id = {due_early}"),
        two_hours_ago,
    )
    .await
    .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(recv(&mut seen, "the deliveries in order", 10).await);
    }
    assert_eq!(order, vec![never_delayed, due_early, due_late, mid, low]);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// One delivery's start or end, in the order the handlers saw them.
#[derive(Debug, Clone, Copy)]
enum Event {
    Start(usize, i64),
    End(usize),
}

pub(crate) async fn fifo_groups_run_in_id_order_one_row_at_a_time_across_runners<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let groups = ["g0", "g1", "g2"];
    // Interleaved, so that id order within a group is not table order.
    let jobs: Vec<Job<'_>> = (0..300)
        .map(|i| Job::new(groups[i % 3]).group(groups[i % 3]))
        .collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();

    let events: Arc<Mutex<Vec<Event>>> = Arc::default();
    let mut runners = Vec::new();
    for _ in 0..2 {
        let events = Arc::clone(&events);
        let queue = Queue::table(table.clone())
            .lease("locked_until")
            .fifo()
            .workers(8)
            .handler(move |d: Delivery<DB>| {
                let group = groups
                    .iter()
                    .position(|g| g.as_bytes() == d.payload())
                    .expect("a known group");
                events.lock().unwrap().push(Event::Start(group, d.id()));
                let events = Arc::clone(&events);
                async move {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    events.lock().unwrap().push(Event::End(group));
                    Outcome::ack()
                }
            });
        let pool = ctx.pool(10).await;
        let running = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(20))
            .mount(queue)
            .start()
            .await
            .unwrap();
        runners.push((running, pool));
    }
    ctx.wait_none(&t, "1 = 1", 120).await;
    for (running, pool) in runners {
        running.shutdown().await.unwrap();
        pool.close().await;
    }
    let events = events.lock().unwrap().clone();
    let mut last: HashMap<usize, i64> = HashMap::new();
    let mut in_work = [0_u32; 3];
    let mut most_groups_at_once = 0;
    for event in events {
        match event {
            Event::Start(group, id) => {
                in_work[group] += 1;
                assert_eq!(in_work[group], 1, "group {group}: two rows in work at once");
                let previous = last.insert(group, id).unwrap_or(i64::MIN);
                assert!(
                    id > previous,
                    "group {group}: row {id} after row {previous}"
                );
                most_groups_at_once =
                    most_groups_at_once.max(in_work.iter().filter(|n| **n > 0).count());
            }
            Event::End(group) => in_work[group] -= 1,
        }
    }
    assert_eq!(last.len(), 3);
    assert!(most_groups_at_once > 1, "groups ran in parallel");
    ctx.drop_tables().await;
}

pub(crate) async fn a_delayed_fifo_head_lets_rows_due_earlier_go_first<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let hour = Duration::from_secs(3600);
    let head = DB::enqueue(&ctx.pool, &table, Job::new("head").group("g").delay(hour))
        .await
        .unwrap();
    let next = DB::enqueue(&ctx.pool, &table, Job::new("next").group("g"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .named("g")
        .lease("locked_until")
        .fifo()
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the row due", 10).await, next);
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&t, &format!("id = {head}")).await, 1);
    ctx.drop_tables().await;
}

pub(crate) async fn bulk_jobs_keep_their_priorities<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            priority: true,
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t)
        .group("queue")
        .retry_after("retry_after")
        .priority("priority");
    assert_eq!(
        Queue::table(table.clone()).max_batch(),
        7_500,
        "four values a job"
    );
    let batch: Vec<Job<'_>> = [5, 1, 3]
        .into_iter()
        .map(|p| Job::new("x").group("g").priority(p))
        .collect();
    assert_eq!(
        DB::enqueue_many(&ctx.pool, &table, &batch).await.unwrap(),
        3
    );
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .named("g")
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(recv(&mut seen, "the deliveries", 10).await);
    }
    let by_priority: Vec<i64> = {
        let mut ids = order.clone();
        ids.sort_unstable();
        vec![ids[1], ids[2], ids[0]]
    };
    assert_eq!(order, by_priority, "priority 1, then 3, then 5");
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_fifo_group_advances_as_each_row_settles_not_at_the_poll<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let jobs: Vec<Job<'_>> = (0..10).map(|_| Job::new("x").group("mail")).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    let queue = Queue::table(table)
        .named("mail")
        .lease("locked_until")
        .fifo()
        .workers(4)
        .handler(|_: Delivery<DB>| async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            Outcome::ack()
        });
    let started = Instant::now();
    // The default 1 s poll: a group that advanced only at the poll would take about 10 s.
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 30).await;
    let drained = started.elapsed();
    running.shutdown().await.unwrap();
    crate::support::report(&format!(
        "{}: a FIFO group of 10 rows of 20 ms with 4 workers drained in {drained:?}",
        DB::LABEL
    ));
    assert!(drained < Duration::from_secs(1), "drained in {drained:?}");
    ctx.drop_tables().await;
}
