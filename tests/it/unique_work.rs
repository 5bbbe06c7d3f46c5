// A unique job in work, on each form that can serve a table with a unique key (lease, row
// lock): a replace or debounce leaves it alone and says so, and its key is free once it ends.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Notify, mpsc};

use crate::support::{Ctx, Form, TestDb, recv};
use crate::unique::unique_table;

/// This file's tests on one database and form, as `#[tokio::test]`s (`main.rs` writes them in
/// each database's module).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(unique_work<$db, $form>:
            a_job_in_work_is_left_alone_by_replace_and_debounce,
        );
    };
}
pub(crate) use tests;

pub(crate) async fn a_job_in_work_is_left_alone_by_replace_and_debounce<DB: TestDb, F: Form<DB>>()
where
    F::F: sqlx_queue::state::UniqueForm,
{
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let spec = crate::support::Spec {
        priority: true,
        ..crate::support::Spec::lease()
    };
    let t = unique_table(&mut ctx, spec).await;
    let table = Table::new(&t)
        .unique_key("dedupe")
        .retry_after("retry_after")
        .priority("priority")
        .created_at("created_at");
    let jobs = F::apply(Queue::table(table));
    let Enqueued::New(id) = jobs
        .enqueue_unique(&ctx.pool, Job::new("old").unique("k"))
        .await
        .unwrap()
    else {
        panic!("the key was free");
    };
    let (started, mut starts) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let hold = Arc::clone(&release);
    let queue = jobs.clone().handler(move |d: Delivery<DB>| {
        let (started, hold) = (started.clone(), Arc::clone(&hold));
        async move {
            let _ = started.send((d.id(), d.payload().to_vec()));
            hold.notified().await;
            Outcome::ack()
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let (delivered, payload) = recv(&mut starts, "the job in work", 10).await;
    assert_eq!((delivered, payload.as_slice()), (id, &b"old"[..]));

    let replace = Job::new("new").priority(5).unique("k").replace();
    assert_eq!(
        jobs.enqueue_unique(&ctx.pool, replace).await.unwrap(),
        Enqueued::InWork(id),
        "{}: a replace leaves the job in work alone",
        F::NAME
    );
    let debounce = Job::new("d")
        .unique("k")
        .debounce(Duration::from_secs(30), Duration::from_secs(60));
    assert_eq!(
        jobs.enqueue_unique(&ctx.pool, debounce).await.unwrap(),
        Enqueued::InWork(id)
    );
    assert_eq!(
        jobs.enqueue_unique(&ctx.pool, Job::new("s").unique("k"))
            .await
            .unwrap(),
        Enqueued::Duplicate(id)
    );
    assert_eq!(ctx.payload(&t, id).await, b"old", "nothing changed");
    assert_eq!(
        ctx.count(&t, "priority = 0 AND retry_after IS NULL").await,
        1
    );

    release.notify_one();
    ctx.wait_none(&t, "1 = 1", 10).await;
    let next = jobs
        .enqueue_unique(&ctx.pool, Job::new("next").unique("k").replace())
        .await
        .unwrap();
    assert!(matches!(next, Enqueued::New(_)), "{next:?}");
    let (second, payload) = recv(&mut starts, "the next job", 10).await;
    assert_eq!((second, payload.as_slice()), (next.id(), &b"next"[..]));
    release.notify_one();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
