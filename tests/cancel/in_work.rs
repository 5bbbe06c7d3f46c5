//! Cancelling jobs in work: on the lease form its lease is taken away and its handler told at the
//! next renewal (its transactional writes do not commit); on the row lock and advisory forms a
//! request, which the runner learns of (PostgreSQL at once, else at its next poll); a row lock
//! claim's job is said in work without waiting; the shutdown timeout fires `cancelled()`.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::{Notify, mpsc};

use crate::queued::{Leased, enqueue, jobs, marked};
use crate::support::{AdvisoryForm, Ctx, Form, RowLockForm, Spec, TestDb, recv, wait_for};

/// What a lease test's handler saw.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(i64),
    Cancelled(i64),
}

pub(crate) async fn a_leased_job_in_work_loses_its_lease_and_its_handler_is_told<DB: TestDb>() {
    leased_in_work::<DB>(false).await;
}

pub(crate) async fn a_leased_job_in_work_is_marked_where_the_table_keeps_finished_rows<
    DB: TestDb,
>() {
    leased_in_work::<DB>(true).await;
}

/// A plain lease queue's job cancelled in work, on a table that deletes finished rows or
/// (`marked`) keeps them: the row is gone, or marked with its lease cleared, and the handler's
/// retry after its cancellation leaves it so.
async fn leased_in_work<DB: TestDb>(keeps_rows: bool) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            processed_at: keeps_rows,
            ..Spec::lease()
        })
        .await;
    let (table, left) = match keeps_rows {
        false => (jobs(&t), "1 = 1"),
        true => (
            marked(&t),
            "processed_at IS NULL OR locked_until IS NOT NULL",
        ),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = table
        .clone()
        .lease_duration(LEASE)
        .handler(move |d: Delivery<DB>| {
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
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    cancel_in_work(&ctx, (&table, &t), left, &running, &mut rx, id).await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&t, left).await, 0, "the retry left the row so");
    assert_eq!(ctx.count(&t, "1 = 1").await, i64::from(keeps_rows));
    ctx.drop_tables().await;
}

/// The lease of the tests' queues in work: renewed every second.
const LEASE: Duration = Duration::from_secs(2);

async fn start<DB: TestDb>(
    ctx: &Ctx<DB>,
    queue: impl sqlx_queue::state::Mount<DB>,
) -> sqlx_queue::Running {
    Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap()
}

/// Cancels job `id` of `table` once its handler reported it started on `rx`: the answer is "in
/// work", no row of `id` is `left` at once (gone, or marked and its lease cleared), the handler
/// is told within half a lease (and a margin), and its settlement then finds the lease lost.
async fn cancel_in_work<DB: TestDb>(
    ctx: &Ctx<DB>,
    (table, t): (&Leased, &str),
    left: &str,
    running: &sqlx_queue::Running,
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    id: i64,
) {
    assert_eq!(recv(rx, "the handler to start", 5).await, Seen::Started(id));
    let asked = tokio::time::Instant::now();
    assert_eq!(
        table.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Requested(id)
    );
    assert_eq!(
        ctx.count(t, &format!("id = {id} AND ({left})")).await,
        0,
        "the row is gone (or marked, its lease cleared) at once"
    );
    // The runner renews every half lease: it learns of the cancellation by then.
    let bound = LEASE / 2 + Duration::from_millis(750);
    let seen = tokio::time::timeout(bound, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the handler was not told within {bound:?}"));
    assert_eq!(
        seen,
        Some(Seen::Cancelled(id)),
        "after {:?}",
        asked.elapsed()
    );
    wait_for("the settlement", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.lease_lost >= 1 }
    })
    .await;
}

pub(crate) async fn a_cancelled_transactional_delivery_commits_nothing<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let writes = format!("{t}_writes");
    ctx.exec(&format!("CREATE TABLE {writes} (job BIGINT NOT NULL)"))
        .await;
    let table = jobs(&t);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = writes.clone();
    let queue = table.clone().lease_duration(LEASE).transactional().handler(
        move |mut d: Delivery<DB, Transactional>| {
            let (tx, w) = (tx.clone(), w.clone());
            async move {
                let sql = format!("INSERT INTO {w} (job) VALUES ({})", d.id());
                DB::query_on(&mut *d.tx(), &sql).await.unwrap();
                tx.send(Seen::Started(d.id())).unwrap();
                tokio::select! {
                    () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                    () = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                // An ack commits the write unless the lease is gone.
                Outcome::ack()
            }
        },
    );
    let running = start(&ctx, queue).await;
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    cancel_in_work(&ctx, (&table, &t), "1 = 1", &running, &mut rx, id).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&writes, "1 = 1").await,
        0,
        "the handler's write rolled back"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "the row stays gone");
    ctx.exec(&format!("DROP TABLE {writes}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn the_shutdown_timeout_fires_cancelled<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = jobs(&t);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = table.clone().handler(move |d: Delivery<DB>| {
        let tx = tx.clone();
        async move {
            // What the handler spawned learns of the cancellation; the handler itself never
            // ends and is dropped.
            let cancelled = d.cancelled();
            let told = tx.clone();
            tokio::spawn(async move {
                cancelled.await;
                told.send(Seen::Cancelled(0)).unwrap();
            });
            tx.send(Seen::Started(d.id())).unwrap();
            std::future::pending::<Outcome>().await
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .shutdown_timeout(Duration::from_millis(200))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let id = enqueue(&ctx, &table, Job::new("x")).await;
    assert_eq!(
        recv(&mut rx, "the handler to start", 5).await,
        Seen::Started(id)
    );
    let report = running.shutdown().await.unwrap();
    assert_eq!(
        recv(&mut rx, "cancelled() at the shutdown timeout", 5).await,
        Seen::Cancelled(0)
    );
    assert_eq!(report.cancelled, 1, "{report:?}");
    assert_eq!(
        ctx.count(&t, "locked_until IS NULL").await,
        1,
        "row released"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_lock_claims_job_is_said_in_work_without_waiting<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t).retry_after("retry_after");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let gate = Arc::clone(&go);
    let declared = RowLockForm::apply(Queue::table(table.clone()));
    let queue = declared.clone().handler(move |d: Delivery<DB>| {
        let (tx, gate) = (tx.clone(), Arc::clone(&gate));
        async move {
            tx.send(d.id()).unwrap();
            gate.notified().await;
            Outcome::ack()
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let id = enqueue(&ctx, &declared, Job::new("x")).await;
    assert_eq!(recv(&mut rx, "the handler to start", 5).await, id);
    let answer = tokio::time::timeout(Duration::from_secs(3), declared.cancel(&ctx.pool, id))
        .await
        .expect("the cancellation does not wait for the claim's lock")
        .unwrap();
    // Without a cancel requests' table the job cannot be told: it is said in work, and runs on.
    assert_eq!(answer, Cancellation::InWork(id));
    assert_eq!(ctx.count(&t, "1 = 1").await, 1, "the row is its holder's");
    go.notify_one();
    ctx.wait_none(&t, "1 = 1", 5).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        declared.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::NotFound
    );
    ctx.drop_tables().await;
}

/// A job in work on a form that holds its row (`F`: row lock, advisory lock), transactional,
/// on a table with a cancel requests' table: the cancellation records a request; the handler is
/// told at once on PostgreSQL (NOTIFY: the poll interval is 5 s there), else at the runner's
/// next poll; its write rolls back, its row is removed and the request with it.
pub(crate) async fn a_row_lock_job_in_work_is_cancelled_by_request<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    a_held_job_in_work_is_cancelled_by_request::<DB, RowLockForm>().await;
}

pub(crate) async fn an_advisory_job_in_work_is_cancelled_by_request<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    a_held_job_in_work_is_cancelled_by_request::<DB, AdvisoryForm>().await;
}

async fn a_held_job_in_work_is_cancelled_by_request<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let (writes, cancels) = (format!("{t}_writes"), format!("{t}_cancels"));
    ctx.exec(&format!("CREATE TABLE {writes} (job BIGINT NOT NULL)"))
        .await;
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .cancel_requests(&cancels);
    let postgres = DB::LABEL.starts_with("postgres");
    let poll = if postgres {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(200)
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = writes.clone();
    let declared = F::apply(Queue::table(table.clone()));
    let queue =
        declared
            .clone()
            .transactional()
            .handler(move |mut d: Delivery<DB, Transactional>| {
                let (tx, w) = (tx.clone(), w.clone());
                async move {
                    let sql = format!("INSERT INTO {w} (job) VALUES ({})", d.id());
                    DB::query_on(&mut *d.tx(), &sql).await.unwrap();
                    tx.send(Seen::Started(d.id())).unwrap();
                    tokio::select! {
                        () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                        () = tokio::time::sleep(Duration::from_secs(30)) => {}
                    }
                    // Would commit the write, were the job not cancelled.
                    Outcome::ack()
                }
            });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(poll)
        .mount(queue)
        .start()
        .await
        .unwrap();
    let id = enqueue(&ctx, &declared, Job::new("x")).await;
    assert_eq!(
        recv(&mut rx, "the handler to start", 5).await,
        Seen::Started(id)
    );
    let asked = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(3), declared.cancel(&ctx.pool, id))
        .await
        .expect("the cancellation does not wait for the claim")
        .unwrap();
    assert_eq!(answer, Cancellation::Requested(id));
    let bound = if postgres {
        Duration::from_secs(1)
    } else {
        poll + Duration::from_secs(1)
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
    assert_eq!(
        ctx.count(&writes, "1 = 1").await,
        0,
        "the handler's write rolled back"
    );
    assert_eq!(
        declared.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::NotFound
    );
    ctx.exec(&format!("DROP TABLE {writes}")).await;
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}

/// A request whose delivery ended unsettled (its handler ignored `cancelled()` past the shutdown
/// timeout) stays with its row, and the next runner that claims the row cancels that delivery at
/// its first read of requests, and removes the row and the request.
pub(crate) async fn a_request_outlives_a_delivery_released_unsettled<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .cancel_requests(&cancels);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let started = tx.clone();
    let declared = RowLockForm::apply(Queue::table(table.clone()));
    let deaf = declared.clone().handler(move |d: Delivery<DB>| {
        let started = started.clone();
        async move {
            started.send(Seen::Started(d.id())).unwrap();
            std::future::pending::<Outcome>().await
        }
    });
    let first = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_millis(300))
        .mount(deaf)
        .start()
        .await
        .unwrap();
    let id = enqueue(&ctx, &declared, Job::new("x")).await;
    assert_eq!(
        recv(&mut rx, "the first handler to start", 5).await,
        Seen::Started(id)
    );
    assert_eq!(
        declared.cancel(&ctx.pool, id).await.unwrap(),
        Cancellation::Requested(id)
    );
    let report = first.shutdown().await.unwrap();
    assert_eq!(report.cancelled, 1, "{report:?}");
    assert_eq!(ctx.count(&t, "1 = 1").await, 1, "the row was released");
    assert_eq!(ctx.count(&cancels, "1 = 1").await, 1, "the request stays");
    let listening = declared.clone().handler(move |d: Delivery<DB>| {
        let tx = tx.clone();
        async move {
            tx.send(Seen::Started(d.id())).unwrap();
            tokio::select! {
                () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                () = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
            Outcome::ack()
        }
    });
    let second = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(200))
        .mount(listening)
        .start()
        .await
        .unwrap();
    assert_eq!(
        recv(&mut rx, "the second handler to start", 5).await,
        Seen::Started(id)
    );
    assert_eq!(
        recv(&mut rx, "the second delivery's cancellation", 2).await,
        Seen::Cancelled(id)
    );
    ctx.wait_none(&t, "1 = 1", 5).await;
    ctx.wait_none(&cancels, "1 = 1", 5).await;
    second.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}
