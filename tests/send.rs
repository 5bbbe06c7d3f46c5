//! Every public future of the crate is `Send`, so that it can run in a task of its own: a
//! runner started from `tokio::spawn` (a supervisor, a framework's start-up hook) and shut down
//! from another, enqueues and cancellations in spawned tasks — on every database and through
//! every kind of executor (a pool, a connection, the caller's transaction).
//!
//! `futures` below is a compile test: it is never called, and fails to build if one of the
//! futures it names is not `Send` (E0277, naming the future). The one test that runs starts a
//! SQLite runner inside a spawned task and drains a job there.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Pool, Transaction};
use sqlx_queue::{
    Cancellation, DeadLetter, Delivery, Job, Outcome, Queue, Runner, Running, Table, Transactional,
};

fn assert_send<T: Send>(_: T) {}

/// The futures of one database's public calls, each asserted `Send`. `$forms`: the claim forms
/// the database has, each mounted with the same handlers.
macro_rules! per_database {
    ($db:ident: $ty:ty, $($form:ident),+) => {
        #[allow(dead_code, reason = "a compile test: never called")]
        mod $db {
            use super::*;

            async fn plain(_: Delivery<$ty>) -> Outcome {
                Outcome::ack()
            }

            async fn transactional(_: Delivery<$ty, Transactional>) -> Outcome {
                Outcome::ack()
            }

            async fn batch(deliveries: Vec<Delivery<$ty>>) -> Vec<Outcome> {
                deliveries.iter().map(|_| Outcome::ack()).collect()
            }

            fn futures(
                pool: Pool<$ty>,
                mut conn: PoolConnection<$ty>,
                mut tx: Transaction<'static, $ty>,
                running: Running,
                delivery: Delivery<$ty>,
            ) {
                let table = Table::new("jobs").unique_key("dedupe");
                $(
                    let queue = Queue::table(table.clone());
                    let single = per_database!(@form queue, $form).handler(plain);
                    let queue = Queue::table(table.clone());
                    let tx_queue = per_database!(@form queue, $form).transactional();
                    let queue = Queue::table(table.clone());
                    let batches = per_database!(@form queue, $form).batch(16).batch_handler(batch);
                    let runner = Runner::new(pool.clone())
                        .mount(single)
                        .mount(tx_queue.handler(transactional))
                        .mount(batches);
                    assert_send(runner.start());
                )+
                assert_send(running.shutdown());
                assert_send(delivery.cancelled());

                let job = || Job::new("payload");
                let jobs = Queue::table(Table::new("jobs").unique_key("dedupe"))
                    .lease("locked_until")
                    .attempt("attempt")
                    .max_attempts(3)
                    .dead_letter(DeadLetter::table("jobs_dead"));
                assert_send(jobs.enqueue(&pool, job()));
                assert_send(jobs.enqueue(&mut *conn, job()));
                assert_send(jobs.enqueue(&mut *tx, job()));
                let many = [job(), job()];
                assert_send(jobs.enqueue_many(&pool, &many));
                assert_send(jobs.enqueue_many(&mut *conn, &many));
                assert_send(jobs.enqueue_many(&mut *tx, &many));
                assert_send(jobs.enqueue_unique(&pool, job().unique("k")));
                assert_send(jobs.enqueue_unique(&mut *conn, job().unique("k")));
                assert_send(jobs.enqueue_unique(&mut *tx, job().unique("k")));
                let unique = [job().unique("a"), job().unique("b")];
                assert_send(jobs.enqueue_many_unique(&pool, &unique));
                assert_send(jobs.enqueue_many_unique(&mut *conn, &unique));
                assert_send(jobs.enqueue_many_unique(&mut *tx, &unique));
                assert_send(jobs.cancel(&pool, 1));
                assert_send(jobs.cancel(&mut *conn, 1));
                assert_send(jobs.cancel(&mut *tx, 1));
                assert_send(jobs.cancel_unique(&pool, "k"));
                assert_send(jobs.cancel_unique(&mut *conn, "k"));
                assert_send(jobs.cancel_unique(&mut *tx, "k"));
                assert_send(jobs.counts(&pool));
                assert_send(jobs.counts(&mut *conn));
                assert_send(jobs.counts(&mut *tx));
                assert_send(jobs.requeue_dead(&pool));
                assert_send(jobs.requeue_dead(&mut *tx));
                assert_send(jobs.prune(&pool, Duration::from_secs(60), 100));
                assert_send(jobs.prune(&mut *tx, Duration::from_secs(60), 100));
                assert_send(jobs.prune_dead(&pool, Duration::from_secs(60), 100));
                assert_send(jobs.prune_dead(&mut *tx, Duration::from_secs(60), 100));
                // A queue with a handler (not `Sync`) still enqueues and cancels.
                let handled = jobs.clone().handler(plain);
                assert_send(handled.enqueue(&pool, job()));
                assert_send(handled.cancel(&pool, 1));
            }
        }
    };
    (@form $queue:ident, lease) => { $queue.lease("locked_until") };
    (@form $queue:ident, row_lock) => { $queue.row_lock() };
    (@form $queue:ident, advisory) => { $queue.advisory_lock() };
}

per_database!(sqlite: sqlx::Sqlite, lease, advisory);
per_database!(postgres: sqlx::Postgres, lease, row_lock, advisory);
per_database!(mysql: sqlx::MySql, lease, row_lock, advisory);

#[allow(dead_code, reason = "a compile test: never called")]
fn notify_channel(pool: sqlx::PgPool) {
    assert_send(Table::new("jobs").notify_channel(&pool));
}

async fn drain(d: Delivery<sqlx::Sqlite>) -> Outcome {
    let _ = d.id();
    Outcome::ack()
}

/// A runner started inside `tokio::spawn`, and shut down by another task once its one job was
/// handled: the job is deleted, and nothing is left in work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_starts_and_stops_in_spawned_tasks() {
    let dir = std::env::temp_dir().join(format!("sqlxq-send-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("send.db");
    let _ = std::fs::remove_file(&path);
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
    sqlx::query(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, locked_until TEXT)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let jobs = Queue::table(Table::new("jobs")).lease("locked_until");
    let queue = jobs.clone().handler(drain);
    let started = tokio::spawn({
        let pool = pool.clone();
        async move {
            Runner::new(pool)
                .poll_interval(Duration::from_millis(50))
                .mount(queue)
                .start()
                .await
        }
    });
    let running = started.await.unwrap().unwrap();
    let id = tokio::spawn({
        let (pool, jobs) = (pool.clone(), jobs.clone());
        async move { jobs.enqueue(&pool, Job::new("x")).await }
    })
    .await
    .unwrap()
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
        if left == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "job {id} was not handled within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = tokio::spawn(running.shutdown()).await.unwrap().unwrap();
    assert_eq!(report.unreleased, 0, "{report:?}");
    assert_eq!(
        jobs.cancel(&pool, id).await.unwrap(),
        Cancellation::NotFound,
        "the job was handled and deleted"
    );
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
