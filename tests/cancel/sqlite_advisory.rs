//! Cancelling jobs of SQLite's advisory lock form, whose keys are held in the process: a job in
//! work gets a request (its handler is told at the runner's next read of requests, its writes
//! roll back, its row and request go, counted as a drop), a queued one is removed at once, and
//! neither a cancellation nor a failed one leaves the row's key held — a job enqueued later
//! under the same id (SQLite gives a deleted last id again) is claimed.
//!
//! SQLite has one writer: a transactional handler that wrote holds the write lock the
//! cancellation waits for (docs/guide/cancellation.md), so the handlers here write once
//! they are told.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Sqlite;
use sqlx_queue::state::AdvisoryLock;
use sqlx_queue::{
    Cancellation, Delivery, Job, Outcome, Queue, Runner, Running, Table, Transactional,
};
use tokio::sync::mpsc;

use crate::queued::enqueue;
use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// The runners' poll interval: what tells a handler of its request.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(i64),
    Cancelled(i64),
}

/// A table for the advisory form with its cancel requests' table (`<t>_cancels`), and no lease
/// column declared (its keys then tell a job in work).
async fn advisory_table(ctx: &mut Ctx<Sqlite>, spec: Spec) -> (String, Queue<AdvisoryLock>) {
    let t = ctx.table(spec).await;
    let cancels = format!("{t}_cancels");
    ctx.exec(&format!("CREATE TABLE {cancels} (id INTEGER PRIMARY KEY)"))
        .await;
    let table = Queue::table(Table::new(&t).cancel_requests(&cancels)).advisory_lock();
    (t, table)
}

async fn start(ctx: &Ctx<Sqlite>, queue: impl sqlx_queue::state::Mount<Sqlite>) -> Running {
    Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(queue)
        .start()
        .await
        .unwrap()
}

/// A transactional job in work: the answer is `Requested`, its handler is told within the poll
/// interval, the write it makes then rolls back, its row and request are gone, the delivery
/// counted as a drop, and it is never delivered again. Before SQLite's keys were seen, the
/// answer was `Cancelled` and the row was removed from under the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_work_is_cancelled_by_request() {
    let Some(mut ctx) = Ctx::<Sqlite>::new().await else {
        return;
    };
    let (t, table) = advisory_table(&mut ctx, Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    let writes = format!("{t}_writes");
    ctx.exec(&format!("CREATE TABLE {writes} (job INTEGER NOT NULL)"))
        .await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = writes.clone();
    let queue =
        table
            .clone()
            .transactional()
            .handler(move |mut d: Delivery<Sqlite, Transactional>| {
                let (tx, w) = (tx.clone(), w.clone());
                async move {
                    tx.send(Seen::Started(d.id())).unwrap();
                    tokio::select! {
                        () = d.cancelled() => {
                            // Would commit with the ack, were the job not cancelled.
                            let sql = format!("INSERT INTO {w} (job) VALUES ({})", d.id());
                            Sqlite::query_on(&mut *d.tx(), &sql).await.unwrap();
                            tx.send(Seen::Cancelled(d.id())).unwrap();
                        }
                        () = tokio::time::sleep(Duration::from_secs(30)) => {}
                    }
                    Outcome::ack()
                }
            });
    let running = start(&ctx, queue).await;
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    assert_eq!(
        recv(&mut rx, "the handler to start", 5).await,
        Seen::Started(id)
    );
    let asked = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(3), table.cancel(&ctx.pool, id))
        .await
        .expect("the cancellation does not wait for the delivery")
        .unwrap();
    assert_eq!(answer, Cancellation::Requested(id), "the job is in work");
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Requested(id),
        "the runner still holds the key the first cancellation found held"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 1, "the row is its holder's");
    let bound = POLL + Duration::from_secs(1);
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
    wait_for("the drop counted", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.dropped == 1 }
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&writes, "1 = 1").await,
        0,
        "the handler's write rolled back"
    );
    assert!(
        rx.try_recv().is_err(),
        "delivered once: {:?}",
        rx.try_recv()
    );
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::NotFound
    );
    ctx.exec(&format!("DROP TABLE {writes}")).await;
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}

/// A queued job is removed at once (`Cancelled`) and never delivered; the job enqueued next takes
/// its id again, and is claimed and acked (the cancellation gave the key back); once finished it
/// is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_is_removed_and_its_key_given_back() {
    let Some(mut ctx) = Ctx::<Sqlite>::new().await else {
        return;
    };
    // No attempt column: the claim's read of a row writes nothing.
    let spec = Spec {
        retry_after: true,
        ..Spec::default()
    };
    let (t, table) = advisory_table(&mut ctx, spec).await;
    let cancelled = enqueue(&ctx, &table, Job::new("cancelled")).await;
    assert_eq!(
        table.cancel(&ctx.pool, cancelled).await.unwrap(),
        Cancellation::Cancelled(cancelled)
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "the row is gone at once");
    let next = enqueue(&ctx, &table, Job::new("next")).await;
    assert_eq!(next, cancelled, "SQLite gives the deleted last id again");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    let queue = table.clone().handler(move |d: Delivery<Sqlite>| {
        record.lock().unwrap().push(d.payload().to_vec());
        async { Outcome::ack() }
    });
    let running = start(&ctx, queue).await;
    ctx.wait_none(&t, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![b"next".to_vec()]);
    assert_eq!(
        table.cancel(&ctx.pool, next).await.unwrap(),
        Cancellation::NotFound
    );
    ctx.exec(&format!("DROP TABLE {t}_cancels")).await;
    ctx.drop_tables().await;
}

/// A cancellation whose removal fails (a trigger refuses it) returns the error and gives the
/// key back: once the trigger is gone, the next cancellation takes it and removes the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_cancellation_gives_its_key_back() {
    let Some(mut ctx) = Ctx::<Sqlite>::new().await else {
        return;
    };
    let (t, table) = advisory_table(&mut ctx, Spec::lease()).await;
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    ctx.exec(&Sqlite::refusing(&t, "DELETE")).await;
    let failed = table.cancel(&ctx.pool, id).await;
    assert!(
        failed
            .as_ref()
            .is_err_and(|e| e.to_string().contains("DELETE refused")),
        "{failed:?}"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 1, "the removal rolled back");
    ctx.exec(&format!("DROP TRIGGER {t}_no_DELETE")).await;
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Cancelled(id),
        "the key is free: a held one would have said `Requested`"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    ctx.exec(&format!("DROP TABLE {t}_cancels")).await;
    ctx.drop_tables().await;
}

/// What a cancellation leaves when it finds a row's key held by a claim that has not read the
/// row again yet (the crate's unit test `a_key_a_claim_holds_is_a_job_in_work` shows it): the row
/// with its request, written here. The row is delivered once, its `cancelled()` fires at the
/// runner's first read of requests, and it is removed with its request, as a drop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_requested_before_its_delivery_is_delivered_once_and_told() {
    let Some(mut ctx) = Ctx::<Sqlite>::new().await else {
        return;
    };
    let (t, table) = advisory_table(&mut ctx, Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    ctx.exec(&format!("INSERT INTO {cancels} (id) VALUES ({id})"))
        .await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = table.clone().handler(move |d: Delivery<Sqlite>| {
        let tx = tx.clone();
        async move {
            tx.send(Seen::Started(d.id())).unwrap();
            tokio::select! {
                () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                () = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
            Outcome::retry()
        }
    });
    let running = start(&ctx, queue).await;
    assert_eq!(
        recv(&mut rx, "the handler to start", 5).await,
        Seen::Started(id)
    );
    let bound = POLL + Duration::from_secs(1);
    let seen = tokio::time::timeout(bound, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the handler was not told within {bound:?}"));
    assert_eq!(seen, Some(Seen::Cancelled(id)));
    ctx.wait_none(&t, "1 = 1", 5).await;
    ctx.wait_none(&cancels, "1 = 1", 5).await;
    wait_for("the drop counted", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.dropped == 1 }
    })
    .await;
    running.shutdown().await.unwrap();
    assert!(rx.try_recv().is_err(), "delivered once");
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}
