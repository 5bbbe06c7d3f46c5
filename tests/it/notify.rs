// Wake-ups across processes: PostgreSQL LISTEN/NOTIFY.

use std::time::Duration;

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::support::{Ctx, Spec, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(notify<$db>:
            listen_notify_is_refused_without_postgres,
            an_enqueue_notifies_at_commit_once,
            a_notification_starts_the_handler_well_under_the_poll_interval,
            a_lost_listening_connection_listens_again_and_looks_once,
        );
    };
}
pub(crate) use tests;

fn is_postgres<DB: TestDb>() -> bool {
    DB::LABEL == "postgres"
}

/// A runner that polls every 10 s, woken by notifications only; its handler reports when each
/// delivery starts.
async fn listening<DB: TestDb>(
    ctx: &Ctx<DB>,
    table: Table,
) -> (sqlx_queue::Running, mpsc::UnboundedReceiver<(i64, Instant)>) {
    let (tx, seen) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .lease("locked_until")
        .listen_notify()
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), Instant::now()));
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_secs(10))
        .mount(queue)
        .start()
        .await
        .unwrap();
    (running, seen)
}

/// Inserts a row and notifies its table's channel in one transaction, as another process's
/// enqueue through a `Table::notify()` table does (and without this process's own wake-up).
async fn insert_elsewhere<DB: TestDb>(ctx: &Ctx<DB>, table: &Table) {
    let t = table.name();
    let pg = crate::support::as_pg(&ctx.pool).expect("PostgreSQL");
    let channel = table.notify_channel(&pg).await.unwrap();
    ctx.exec(&format!(
        "INSERT INTO {t} (payload) VALUES ('x'); SELECT pg_notify('{channel}', '')"
    ))
    .await;
}

pub(crate) async fn listen_notify_is_refused_without_postgres<DB: TestDb>() {
    if is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let queue = Queue::table(Table::new(&t))
        .lease("locked_until")
        .listen_notify()
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let refused = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn an_enqueue_notifies_at_commit_once<DB: TestDb>() {
    if !is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t).notify();
    let url = ctx.url.clone().expect("a URL");
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    let pg = crate::support::as_pg(&ctx.pool).expect("PostgreSQL");
    listener
        .listen(&table.notify_channel(&pg).await.unwrap())
        .await
        .unwrap();
    let mut tx = ctx.pool.begin().await.unwrap();
    for _ in 0..3 {
        DB::enqueue_on(&mut *tx, &table, Job::new("x"))
            .await
            .unwrap();
    }
    let batch = [Job::new("y"), Job::new("z")];
    assert_eq!(
        DB::enqueue_many_on(&mut *tx, &table, &batch).await.unwrap(),
        2
    );
    let early = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await;
    assert!(early.is_err(), "nothing before the commit: {early:?}");
    tx.commit().await.unwrap();
    let notification = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification at commit")
        .unwrap();
    assert_eq!(notification.payload(), "", "no group");
    let more = tokio::time::timeout(Duration::from_millis(200), listener.recv()).await;
    assert!(
        more.is_err(),
        "one notification for the transaction: {more:?}"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 5);
    ctx.drop_tables().await;
}

pub(crate) async fn a_notification_starts_the_handler_well_under_the_poll_interval<DB: TestDb>() {
    if !is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t);
    let (running, mut seen) = listening(&ctx, table.clone()).await;
    let mut latencies = Vec::with_capacity(200);
    for _ in 0..200 {
        let sent = Instant::now();
        insert_elsewhere(&ctx, &table).await;
        let (_, started) = recv(&mut seen, "a delivery woken by its notification", 5).await;
        latencies.push(started.saturating_duration_since(sent));
    }
    running.shutdown().await.unwrap();
    latencies.sort();
    let (p50, p99) = (latencies[99], latencies[197]);
    crate::support::report(&format!(
        "postgres: listen_notify wake-up over 200 jobs (10 s poll): p50 {p50:?}, p99 {p99:?}"
    ));
    assert!(p99 < Duration::from_secs(2), "p99 {p99:?}");
    ctx.drop_tables().await;
}

pub(crate) async fn a_lost_listening_connection_listens_again_and_looks_once<DB: TestDb>() {
    if !is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t);
    let (running, mut seen) = listening(&ctx, table.clone()).await;
    // A row arrives without a notification while the listening connection is cut.
    ctx.exec(&format!("INSERT INTO {t} (payload) VALUES ('quiet')"))
        .await;
    let pg = crate::support::as_pg(&ctx.pool).expect("PostgreSQL");
    let channel = table.notify_channel(&pg).await.unwrap();
    let killed = DB::count(
        &ctx.pool,
        &format!(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE query LIKE 'LISTEN%{channel}%' AND pid <> pg_backend_pid()"
        ),
    )
    .await
    .unwrap();
    assert_eq!(killed, 1, "the runner's listening connection");
    // Without the reconnect's look, the row would wait for the 10 s poll.
    recv(
        &mut seen,
        "the row, found by the look after the reconnect",
        5,
    )
    .await;
    // And notifications flow again.
    insert_elsewhere(&ctx, &table).await;
    recv(
        &mut seen,
        "a row woken by a notification after the reconnect",
        5,
    )
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
