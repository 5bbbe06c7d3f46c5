//! Cancelling jobs not in work: a queued job is removed (or marked) and never delivered, also by
//! its unique key, and inside a transaction (a rollback cancels nothing); a finished job is not
//! found. The helpers the tests of jobs in work (`in_work`) share are here too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::state::{AttemptState, CapState, FormState, Lease, NoAttempt, NoCap};
use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Spec, TestDb};

/// A lease queue without attempts or a cap, as the tests declare it.
pub(crate) type Leased = Queue<Lease, NoAttempt, NoCap>;

/// The lease queue on table `t`: its `locked_until` tells a cancellation its jobs in work.
pub(crate) fn jobs(t: &str) -> Leased {
    Queue::table(Table::new(t).retry_after("retry_after")).lease("locked_until")
}

/// Enqueues `job` into `queue`, returning its id.
pub(crate) async fn enqueue<DB, F, A, C, M, B, H>(
    ctx: &Ctx<DB>,
    queue: &Queue<F, A, C, M, B, H>,
    job: Job<'_>,
) -> i64
where
    DB: TestDb,
    F: FormState,
    A: AttemptState,
    C: CapState,
{
    queue.enqueue(&ctx.pool, job).await.unwrap()
}

/// A runner of lease queue `queue` whose handler records each id it is given and acks.
async fn recorder<DB: TestDb>(
    ctx: &Ctx<DB>,
    queue: Leased,
) -> (sqlx_queue::Running, Arc<Mutex<Vec<i64>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let queue = queue.handler(move |d: Delivery<DB>| {
        record.lock().unwrap().push(d.id());
        async { Outcome::ack() }
    });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    (running, seen)
}

pub(crate) async fn a_queued_job_is_removed_and_never_delivered<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = jobs(&t);
    let cancelled = enqueue(&ctx, &table, Job::new("cancelled")).await;
    let kept = enqueue(&ctx, &table, Job::new("kept")).await;
    assert_eq!(
        table.cancel(&ctx.pool, cancelled).await.unwrap(),
        Cancellation::Cancelled(cancelled)
    );
    assert_eq!(
        ctx.count(&t, &format!("id = {cancelled}")).await,
        0,
        "row deleted"
    );
    assert_eq!(
        table.cancel(&ctx.pool, cancelled).await.unwrap(),
        Cancellation::NotFound,
        "a second cancellation finds nothing"
    );
    let (running, seen) = recorder(&ctx, table).await;
    ctx.wait_none(&t, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![kept],
        "only the job kept is delivered"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_queued_job_is_marked_where_the_table_keeps_finished_rows<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            processed_at: true,
            ..Spec::lease()
        })
        .await;
    let table = marked(&t);
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    assert_eq!(
        ctx.count(&t, &format!("id = {id} AND processed_at IS NOT NULL"))
            .await,
        1,
        "row marked"
    );
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::NotFound
    );
    let (running, seen) = recorder(&ctx, table).await;
    // A later job is delivered: the runner ran, and passed the marked row over.
    let later = enqueue(&ctx, &marked(&t), Job::new("later")).await;
    ctx.wait_none(&t, "processed_at IS NULL", 5).await;
    running.shutdown().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![later]);
    ctx.drop_tables().await;
}

pub(crate) async fn a_job_is_cancelled_by_its_unique_key<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!("ALTER TABLE {t} ADD COLUMN dedupe {}", DB::TEXT))
        .await;
    ctx.exec(&format!("CREATE UNIQUE INDEX {t}_dedupe ON {t} (dedupe)"))
        .await;
    let table = Queue::table(Table::new(&t).unique_key("dedupe")).lease("locked_until");
    let id = table
        .enqueue_unique(&ctx.pool, Job::new("x").unique("welcome:1"))
        .await
        .unwrap()
        .id();
    assert_eq!(
        table.cancel_unique(&ctx.pool, "welcome:2").await.unwrap(),
        Cancellation::NotFound
    );
    assert_eq!(
        table.cancel_unique(&ctx.pool, "welcome:1").await.unwrap(),
        Cancellation::Cancelled(id)
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    let refused = jobs(&t).cancel_unique(&ctx.pool, "welcome:1").await;
    assert!(
        matches!(refused, Err(sqlx_queue::Error::InvalidJob { .. })),
        "{refused:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_cancel_in_a_transaction_rolled_back_cancels_nothing<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = jobs(&t);
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    let mut tx = ctx.pool.begin().await.unwrap();
    assert_eq!(
        table.cancel(&mut tx, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        1,
        "the cancellation rolled back"
    );
    let mut tx = ctx.pool.begin().await.unwrap();
    assert_eq!(
        table.cancel(&mut tx, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    tx.commit().await.unwrap();
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        0,
        "the cancellation committed"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_finished_job_is_not_found<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = jobs(&t);
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    let (running, seen) = recorder(&ctx, table.clone()).await;
    ctx.wait_none(&t, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![id]);
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::NotFound
    );
    ctx.drop_tables().await;
}

/// A queued job on a table with a cancel requests' table is removed at once, with no request
/// (the advisory key is free, and no claim holds the row).
pub(crate) async fn a_queued_job_with_requests_declared_is_removed_at_once<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let table = Queue::table(Table::new(&t).cancel_requests(&cancels)).advisory_lock();
    let id = table.enqueue(&ctx.pool, Job::new("x")).await.unwrap();
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    assert_eq!(ctx.count(&cancels, "1 = 1").await, 0, "no request");
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}

/// A queue whose cancel requests' table is missing is refused at start, the table named.
pub(crate) async fn a_missing_requests_table_is_refused_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let missing = format!("{t}_no_cancels");
    let queue = Queue::table(Table::new(&t).cancel_requests(&missing))
        .lease("locked_until")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    match refused {
        Err(sqlx_queue::Error::Schema(schema)) => {
            assert_eq!(schema.table, missing, "{schema}");
        }
        other => panic!("expected a schema error naming {missing}: {other:?}"),
    }
    ctx.drop_tables().await;
}

/// The lease queue on table `t` that keeps finished rows.
pub(crate) fn marked(t: &str) -> Leased {
    Queue::table(
        Table::new(t)
            .retry_after("retry_after")
            .processed_at("processed_at"),
    )
    .lease("locked_until")
}
