//! `per_group(3)`: never more than 3 rows of a group in work, across two runners, and a
//! saturated slow group holds back none of the others — the lease form (rows under a live lease
//! counted) and the row lock form (rows before the row counted).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Form, Spec, TestDb, wait_for};

const LIMIT: usize = 3;
const WORKERS: usize = 8;
const SLOW_ROWS: usize = 45;
const FAST_ROWS: usize = 150;
const SLOW: Duration = Duration::from_millis(20);
const FAST: Duration = Duration::from_millis(2);

/// Per group: the rows in work now, and the most ever seen by a handler at its start.
#[derive(Default)]
struct Gauge {
    now: [AtomicUsize; 3],
    most: [AtomicUsize; 3],
}

pub(crate) async fn per_group_caps_each_group_and_never_blocks_the_others<
    DB: TestDb,
    F: Form<DB>,
>() {
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
    // The slow group's rows first: a claim in id order alone would fill its workers with them.
    let mut jobs: Vec<Job<'_>> = (0..SLOW_ROWS)
        .map(|_| Job::new("0").group("slow"))
        .collect();
    for i in 0..2 * FAST_ROWS {
        let (payload, group) = if i % 2 == 0 {
            ("1", "fast1")
        } else {
            ("2", "fast2")
        };
        jobs.push(Job::new(payload).group(group));
    }
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();

    let gauge = Arc::new(Gauge::default());
    // The slow group's handlers wait here until the fast groups have drained: its rows in work
    // stay in work meanwhile, the group saturated.
    let (open, gate) = tokio::sync::watch::channel(false);
    let mut runners = Vec::new();
    for _ in 0..2 {
        let gauge = Arc::clone(&gauge);
        let gate = gate.clone();
        let queue = F::apply(Queue::table(table.clone()))
            .per_group(u32::try_from(LIMIT).unwrap())
            .workers(WORKERS)
            .handler(move |d: Delivery<DB>| {
                let group = usize::from(d.payload()[0] - b'0');
                let gauge = Arc::clone(&gauge);
                let mut gate = gate.clone();
                async move {
                    let now = gauge.now[group].fetch_add(1, Ordering::SeqCst) + 1;
                    gauge.most[group].fetch_max(now, Ordering::SeqCst);
                    if group == 0 {
                        let _ = gate.wait_for(|open| *open).await;
                    }
                    tokio::time::sleep(if group == 0 { SLOW } else { FAST }).await;
                    gauge.now[group].fetch_sub(1, Ordering::SeqCst);
                    Outcome::ack()
                }
            });
        let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
        let running = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(20))
            .mount(queue)
            .start()
            .await
            .unwrap();
        runners.push((running, pool));
    }

    // The fast groups drain while the slow one has its 3 rows in work, held at the gate.
    ctx.wait_none(&t, "queue <> 'slow'", 60).await;
    assert_eq!(
        ctx.count(&t, "queue = 'slow'").await,
        SLOW_ROWS as i64,
        "no slow row finished: the gate was shut"
    );
    assert_eq!(
        gauge.now[0].load(Ordering::SeqCst),
        LIMIT,
        "the slow group held its {LIMIT} slots while the fast groups drained"
    );
    open.send(true).unwrap();
    wait_for(
        "the slow group to drain",
        Duration::from_secs(60),
        || async { ctx.count(&t, "1 = 1").await == 0 },
    )
    .await;
    for (running, pool) in runners {
        running.shutdown().await.unwrap();
        pool.close().await;
    }
    let most: Vec<usize> = gauge
        .most
        .iter()
        .map(|m| m.load(Ordering::SeqCst))
        .collect();
    for (group, most) in most.iter().enumerate() {
        assert!(
            *most <= LIMIT,
            "group {group}: {most} rows in work at once, above the limit of {LIMIT}"
        );
    }
    assert_eq!(most[0], LIMIT, "the slow group used its {LIMIT} slots");
    ctx.drop_tables().await;
}
