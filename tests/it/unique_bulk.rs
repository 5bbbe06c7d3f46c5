// A bulk enqueue of unique jobs whose keys meet a job in work, a waiting job to debounce, and a
// key given twice in the batch — each job told what happened to it, the job in work unchanged.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Notify, mpsc};

use crate::support::{Bind, Ctx, Spec, TestDb, TestRow, recv};
use crate::unique::unique_table;

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(unique_bulk<$db>:
            bulk_enqueue_meets_a_job_in_work_and_debounces_a_waiting_one,
        );
    };
}
pub(crate) use tests;

/// Rows of `t` with id `id` due between `from` and `to` seconds from now.
async fn due_between<DB: TestDb>(ctx: &Ctx<DB>, t: &str, id: i64, from: i64, to: i64) -> i64 {
    let p = |n: usize| {
        if DB::LABEL == "postgres" {
            format!("${n}")
        } else {
            "?".to_owned()
        }
    };
    let sql = format!(
        "SELECT COUNT(*) AS n FROM {t} WHERE id = {id} AND retry_after >= {} AND retry_after <= {}",
        p(1),
        p(2)
    );
    let now = Utc::now();
    let binds = [
        Bind::Time(now + TimeDelta::seconds(from)),
        Bind::Time(now + TimeDelta::seconds(to)),
    ];
    DB::rows(&ctx.pool, &sql, &binds).await.unwrap()[0]
        .int("n")
        .unwrap()
}

pub(crate) async fn bulk_enqueue_meets_a_job_in_work_and_debounces_a_waiting_one<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    // A priority column: the lease form claims no rows ahead of its one worker.
    let t = unique_table(
        &mut ctx,
        Spec {
            priority: true,
            ..Spec::lease()
        },
    )
    .await;
    let jobs = Queue::table(
        Table::new(&t)
            .unique_key("dedupe")
            .retry_after("retry_after")
            .priority("priority")
            .created_at("created_at"),
    )
    .lease("locked_until");
    let held = jobs
        .enqueue_unique(&ctx.pool, Job::new("held").unique("held"))
        .await
        .unwrap()
        .id();
    let (started, mut starts) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let hold = Arc::clone(&release);
    let queue = jobs.clone().workers(1).handler(move |d: Delivery<DB>| {
        let (started, hold) = (started.clone(), Arc::clone(&hold));
        async move {
            let _ = started.send(d.id());
            hold.notified().await;
            Outcome::ack()
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut starts, "the held job", 10).await, held);
    // Its one worker busy, the runner claims nothing more: a job enqueued now waits.
    let waiting = jobs
        .enqueue_unique(&ctx.pool, Job::new("waiting").unique("waiting"))
        .await
        .unwrap()
        .id();
    let debounce = |payload: &'static str, key: &'static str| {
        Job::new(payload)
            .unique(key)
            .debounce(Duration::from_secs(20), Duration::from_secs(60))
    };
    let batch = [
        Job::new("new payload").priority(7).unique("held").replace(),
        debounce("w2", "waiting"),
        debounce("f1", "fresh"),
        Job::new("f2").unique("fresh"),
        debounce("h2", "held"),
    ];
    let done = jobs.enqueue_many_unique(&ctx.pool, &batch).await.unwrap();
    let fresh = done[2].id();
    assert_eq!(
        done,
        vec![
            Enqueued::InWork(held),
            Enqueued::Debounced(waiting),
            Enqueued::New(fresh),
            Enqueued::Duplicate(fresh),
            Enqueued::InWork(held),
        ]
    );
    assert_eq!(
        ctx.payload(&t, held).await,
        b"held",
        "the job in work unchanged"
    );
    assert_eq!(
        ctx.count(
            &t,
            &format!("id = {held} AND priority = 0 AND retry_after IS NULL")
        )
        .await,
        1
    );
    assert_eq!(
        ctx.payload(&t, waiting).await,
        b"waiting",
        "a debounce keeps the payload"
    );
    assert_eq!(
        due_between(&ctx, &t, waiting, 15, 21).await,
        1,
        "pushed 20 s"
    );
    assert_eq!(
        due_between(&ctx, &t, fresh, 15, 21).await,
        1,
        "new, due after the wait"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 3);
    release.notify_one();
    ctx.wait_none(&t, &format!("id = {held}"), 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
