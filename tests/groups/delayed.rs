//! A FIFO row that waited for its `retry_after` and becomes due while a later row of its group
//! is in work waits for that row to end; a row of another group claimed meanwhile shows that a
//! claim saw it due (it comes first in claim order) and passed over it. The group's first row is
//! delayed longer still: on the row lock form the claim takes the due row, and the guard (the
//! lock on that first row, held by the later row's claim) sends it back.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

pub(crate) async fn a_fifo_row_due_again_waits_for_the_later_row_in_work<
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
    // The group's first row, due in an hour: the row lock form's guard, which every claim of
    // the group must lock, is this row, not the head below.
    let hour = Duration::from_secs(3600);
    let far = DB::enqueue(&ctx.pool, &table, Job::new("far").group("g").delay(hour))
        .await
        .unwrap();
    // Due in a second.
    let delay = Duration::from_secs(1);
    let due = Instant::now() + delay;
    let head = DB::enqueue(&ctx.pool, &table, Job::new("head").group("g").delay(delay))
        .await
        .unwrap();
    let next = DB::enqueue(&ctx.pool, &table, Job::new("next").group("g"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let gate = std::sync::Arc::new(Notify::new());
    let held = std::sync::Arc::clone(&gate);
    let queue = F::apply(Queue::table(table.clone()))
        .fifo()
        .workers(3)
        .handler(move |d: Delivery<DB>| {
            let (tx, held, id) = (tx.clone(), std::sync::Arc::clone(&held), d.id());
            let _ = tx.send(("start", id));
            async move {
                if id == next {
                    held.notified().await;
                }
                let _ = tx.send(("end", id));
                Outcome::ack()
            }
        });
    let pool = ctx.pool(6).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the row due", 10).await, ("start", next));
    // Once the head is due, first in claim order, a row of another group comes after it.
    wait_for("the head to be due", Duration::from_secs(10), || async {
        Instant::now() > due + Duration::from_millis(50)
    })
    .await;
    let other = DB::enqueue(&ctx.pool, &table, Job::new("other").group("h"))
        .await
        .unwrap();
    assert_eq!(
        recv(&mut seen, "the other group's row", 10).await,
        ("start", other),
        "the head started while the later row of its group was in work"
    );
    assert_eq!(
        recv(&mut seen, "the other row's end", 10).await,
        ("end", other)
    );
    gate.notify_one();
    assert_eq!(
        recv(&mut seen, "the later row's end", 10).await,
        ("end", next)
    );
    assert_eq!(recv(&mut seen, "the head", 10).await, ("start", head));
    assert_eq!(recv(&mut seen, "the head's end", 10).await, ("end", head));
    running.shutdown().await.unwrap();
    pool.close().await;
    assert_eq!(ctx.count(&t, &format!("id <> {far}")).await, 0);
    ctx.drop_tables().await;
}
