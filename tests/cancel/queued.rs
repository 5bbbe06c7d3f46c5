//! Cancelling jobs not in work: a queued job is removed (or marked) and never delivered, also by
//! its unique key, and inside a transaction (a rollback cancels nothing); a finished job is not
//! found. Queues whose form the table's declaration hides from a cancellation are refused at
//! start. The helpers the tests of jobs in work (`in_work`) share are here too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{AdvisoryForm, Ctx, Form, RowLockForm, Spec, TestDb};

/// The lease queue's table, its `locked_until` declared so a cancellation knows its leases.
pub(crate) fn jobs(t: &str) -> Table {
    Table::new(t)
        .lease("locked_until")
        .retry_after("retry_after")
}

/// Enqueues `job` into `table`, returning its id.
pub(crate) async fn enqueue<DB: TestDb>(ctx: &Ctx<DB>, table: &Table, job: Job<'_>) -> i64 {
    let mut conn = ctx.pool.acquire().await.unwrap();
    DB::enqueue_on(&mut conn, table, job).await.unwrap()
}

/// A runner of one lease queue on `t` whose handler records each id it is given and acks.
async fn recorder<DB: TestDb>(
    ctx: &Ctx<DB>,
    table: Table,
) -> (sqlx_queue::Running, Arc<Mutex<Vec<i64>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let queue = Queue::table(table)
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
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
    let table = jobs(&t).processed_at("processed_at");
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
    let later = enqueue(
        &ctx,
        &jobs(&t).processed_at("processed_at"),
        Job::new("later"),
    )
    .await;
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
    let table = jobs(&t).unique_key("dedupe");
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
    let table = Table::new(&t).cancel_requests(&cancels);
    let id = enqueue(&ctx, &table, Job::new("x")).await;
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
    let queue = Queue::table(jobs(&t).cancel_requests(&missing))
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

pub(crate) async fn an_advisory_queue_on_a_leased_table_is_refused<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    a_held_queue_on_a_leased_table_is_refused::<DB, AdvisoryForm>().await;
}

pub(crate) async fn a_row_lock_queue_on_a_leased_table_is_refused<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    a_held_queue_on_a_leased_table_is_refused::<DB, RowLockForm>().await;
}

/// A cancellation knows the table, not the queue: on a table that declares a lease column it
/// tells a job in work by its lease, so a queue of a form that holds rows otherwise (a row lock,
/// an advisory key) would have its jobs in work removed and answered `Cancelled` while their
/// handlers run. Such a queue is refused at start, naming the declaration to remove.
async fn a_held_queue_on_a_leased_table_is_refused<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let queue =
        F::apply(Queue::table(jobs(&t))).handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    assert_refused(refused, "declares the lease column `locked_until`");
    ctx.drop_tables().await;
}

/// A lease queue whose table declares another lease column, or cancel requests (the other
/// forms') without its lease column, is refused at start: a cancellation would take its jobs
/// in work for queued ones.
pub(crate) async fn a_lease_queue_on_a_table_that_hides_its_lease_is_refused<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let other = Queue::table(Table::new(&t).lease("retry_after"))
        .lease("locked_until")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(other).start().await;
    assert_refused(refused, "but the queue leases with `locked_until`");
    let cancels = format!("{t}_cancels");
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let hidden = Queue::table(Table::new(&t).cancel_requests(&cancels))
        .lease("locked_until")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(hidden).start().await;
    assert_refused(refused, "`Table::lease(\"locked_until\")`");
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}

fn assert_refused(started: sqlx_queue::Result<sqlx_queue::Running>, says: &str) {
    match started {
        Err(sqlx_queue::Error::Declaration { reason, .. }) => {
            assert!(reason.contains(says), "{reason:?} does not say {says:?}");
        }
        Err(other) => panic!("expected a declaration error saying {says:?}: {other}"),
        Ok(_) => panic!("started, where a declaration error should say {says:?}"),
    }
}
