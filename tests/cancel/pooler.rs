//! Cancellation behind a transaction pooler: PgBouncer in `pool_mode = transaction` in front of
//! the PostgreSQL of `SQLX_QUEUE_PG_URL`, at `SQLX_QUEUE_PGBOUNCER_URL`. No session listens
//! there, so a runner learns of a request at its poll (row lock form), or of a lease taken away
//! at its renewal (lease form). The tables are created and read on the server directly (`Ctx`);
//! the runner and the cancellation go through the pooler.

use std::time::Duration;

use sqlx::Postgres;
use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Pooler, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, LeaseForm, RowLockForm, Spec, pooled, recv};

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(i64),
    Cancelled(i64),
}

/// The lease of the lease form's test: renewed every second.
const LEASE: Duration = Duration::from_secs(2);

/// The runners' poll interval: what tells a row lock handler of its request.
const POLL: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_job_in_work_is_cancelled_through_a_transaction_pooler() {
    in_work_through_the_pooler::<RowLockForm>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_job_in_work_is_cancelled_through_a_transaction_pooler() {
    in_work_through_the_pooler::<LeaseForm>().await;
}

/// A job in work on form `F` (the lease form, or the row lock form with a cancel requests'
/// table), cancelled through the pooler: its handler is told within the poll interval (row
/// lock) or half a lease (lease), and the row and its request are gone.
async fn in_work_through_the_pooler<F: Form<Postgres>>() {
    let leased = F::NAME == "lease";
    let Some(mut ctx) = Ctx::<Postgres>::new().await else {
        return;
    };
    let Some(pool) = pooled(6).await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .pooler(Pooler::Transaction);
    let table = match leased {
        true => table,
        false => table.cancel_requests(&cancels),
    };
    let declared = F::apply_leasing(Queue::table(table), LEASE);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let handler = move |d: Delivery<Postgres>| {
        let tx = tx.clone();
        async move {
            tx.send(Seen::Started(d.id())).unwrap();
            tokio::select! {
                () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                () = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
            Outcome::ack()
        }
    };
    let runner = Runner::new(pool.clone()).poll_interval(POLL);
    let running = runner
        .mount(declared.clone().handler(handler))
        .start()
        .await
        .unwrap();
    // In a transaction, as statements go through a transaction pooler.
    let mut enqueue = pool.begin().await.unwrap();
    let id = declared
        .enqueue(&mut *enqueue, Job::new("x"))
        .await
        .unwrap();
    enqueue.commit().await.unwrap();
    assert_eq!(
        recv(&mut rx, "the handler to start", 5).await,
        Seen::Started(id)
    );
    let asked = tokio::time::Instant::now();
    assert_eq!(
        declared.cancel(&pool, id).await.unwrap(),
        Cancellation::Requested(id)
    );
    let bound = match leased {
        true => LEASE / 2 + Duration::from_millis(750),
        false => POLL + Duration::from_secs(1),
    };
    let seen = tokio::time::timeout(bound, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the handler was not told within {bound:?}"));
    assert_eq!(
        seen,
        Some(Seen::Cancelled(id)),
        "after {:?}",
        asked.elapsed()
    );
    ctx.wait_none(&t, "1 = 1", 5).await;
    ctx.wait_none(&cancels, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}
