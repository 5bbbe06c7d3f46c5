// PostgreSQL behind a transaction pooler: PgBouncer in `pool_mode = transaction` (`.ci/run`
// starts one on port 6432 in front of the PostgreSQL of `SQLX_QUEUE_PG_URL`), whose URL is
// `SQLX_QUEUE_PGBOUNCER_URL`. The queue tables are created and read on the server directly
// (`Ctx`); the runners, enqueues and inspection go through the pooler. Its server pool is
// smaller than the clients' pools together, so consecutive transactions of one client run on
// different server sessions, and each session serves several clients in turn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Postgres;
use sqlx::postgres::PgPool;
use sqlx_queue::{Delivery, Error, Job, Outcome, Pooler, Queue, Runner, Table, Transactional};

use crate::support::{Ctx, Spec, pooled};

/// Leaves statements prepared under sqlx's names (`sqlx_s_1`, ..) on the pooler's server
/// sessions, as an application on sqlx's defaults does through it: a client that prepared a
/// statement by one of those names on such a session would fail ("already exists"), and one
/// that binds one would run another client's statement.
async fn leave_prepared_statements(pool: &PgPool) {
    let mut conns = Vec::new();
    for _ in 0..6 {
        conns.push(pool.acquire().await.unwrap());
    }
    for round in 0..4_i32 {
        for conn in &mut conns {
            // Errors are expected: the names collide on the sessions the pooler lends.
            let _ = sqlx::query("SELECT $1::int + 1")
                .bind(round)
                .fetch_one(&mut **conn)
                .await;
            let _ = sqlx::query("SELECT $1::text")
                .bind("x")
                .fetch_one(&mut **conn)
                .await;
        }
    }
}

/// The server (`Ctx`, direct) and a pool through the pooler, when both are there.
async fn setup(max: u32) -> Option<(Ctx<Postgres>, PgPool)> {
    let ctx = Ctx::<Postgres>::new().await?;
    let pool = pooled(max).await?;
    Some((ctx, pool))
}

fn table(name: &str) -> Table {
    Table::new(name).group("queue").retry_after("retry_after")
}

/// Enqueues `n` jobs of group `q` through the pooler, in transactions of ten (the way an enqueue
/// goes through a transaction pooler), and one more transaction that rolls back.
async fn enqueue(pool: &PgPool, name: &str, n: usize) {
    let jobs = Queue::table(table(name).pooler(Pooler::Transaction));
    for first in (0..n).step_by(10) {
        let mut tx = pool.begin().await.unwrap();
        for i in first..(first + 10).min(n) {
            let job = Job::from_vec(i.to_string().into_bytes()).group("q");
            jobs.enqueue(&mut *tx, job).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    let discarded = [Job::new("x").group("q"), Job::new("y").group("q")];
    jobs.enqueue_many(&mut *tx, &discarded).await.unwrap();
    tx.rollback().await.unwrap();
}

/// Each payload's attempts as the handlers saw them, acked or retried.
type Seen = Arc<Mutex<HashMap<String, Vec<(u32, bool)>>>>;

fn record(seen: &Seen, d: &Delivery<Postgres, impl sqlx_queue::state::Mode>, acked: bool) {
    let payload = String::from_utf8_lossy(d.payload()).into_owned();
    let mut seen = seen.lock().unwrap();
    seen.entry(payload).or_default().push((d.attempt(), acked));
}

/// Every one of `n` payloads was acked exactly once, at its second attempt when its number is a
/// multiple of three (its first was retried), else at its first.
fn each_acked_once(seen: &Seen, n: usize) {
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), n, "payloads delivered");
    for (payload, deliveries) in seen.iter() {
        let retried = payload.parse::<usize>().unwrap().is_multiple_of(3);
        let expected = if retried {
            vec![(1, false), (2, true)]
        } else {
            vec![(1, true)]
        };
        assert_eq!(deliveries, &expected, "payload {payload}");
    }
}

/// Retries the first attempt of every third payload, acks the rest.
fn outcome(d: &Delivery<Postgres, impl sqlx_queue::state::Mode>) -> bool {
    let n: usize = String::from_utf8_lossy(d.payload()).parse().unwrap();
    !(n.is_multiple_of(3) && d.attempt() == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_form_drains_through_a_transaction_pooler() {
    let Some((mut ctx, pool)) = setup(6).await else {
        return;
    };
    let other = pooled(6).await.unwrap();
    leave_prepared_statements(&other).await;
    let name = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    enqueue(&pool, &name, 300).await;
    assert_eq!(ctx.count(&name, "1 = 1").await, 300);

    // Two runners, as two processes would be: the runner says where its pool goes.
    let seen: Seen = Arc::default();
    let mut running = Vec::new();
    for pool in [&pool, &other] {
        let seen = Arc::clone(&seen);
        let queue = Queue::table(table(&name).pooler(Pooler::Transaction))
            .named("q")
            .lease("locked_until")
            .attempt("attempt")
            .workers(4)
            .handler(move |d: Delivery<Postgres>| {
                let ack = outcome(&d);
                record(&seen, &d, ack);
                async move {
                    if ack {
                        Outcome::ack()
                    } else {
                        Outcome::retry()
                    }
                }
            });
        let runner = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(50))
            .mount(queue);
        running.push(runner.start().await.unwrap());
    }
    ctx.wait_none(&name, "1 = 1", 60).await;
    for running in running {
        let stats = running.stats();
        assert_eq!((stats.failed, stats.lease_lost), (0, 0), "{stats:?}");
        running.shutdown().await.unwrap();
    }
    each_acked_once(&seen, 300);
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_lease_form_commits_once_through_a_transaction_pooler() {
    let Some((mut ctx, pool)) = setup(8).await else {
        return;
    };
    let spec = Spec {
        group: true,
        ..Spec::lease()
    };
    let name = ctx.table(spec).await;
    let welcome = ctx.table(spec).await;
    let effects = format!("{name}_effects");
    ctx.exec(&format!(
        "CREATE TABLE {effects} (payload TEXT NOT NULL, attempt INT NOT NULL)"
    ))
    .await;
    enqueue(&pool, &name, 60).await;

    let seen: Seen = Arc::default();
    let handler = {
        let (seen, effects, welcome) = (Arc::clone(&seen), effects.clone(), welcome.clone());
        move |mut d: Delivery<Postgres, Transactional>| {
            let (seen, effects, welcome) = (Arc::clone(&seen), effects.clone(), welcome.clone());
            async move {
                let payload = String::from_utf8_lossy(d.payload()).into_owned();
                // The handler's own statement: unnamed, as statements through PgBouncer before
                // 1.21 must be (a prepared one would be looked for on another session later).
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {effects} (payload, attempt) VALUES ($1, $2)"
                )))
                .bind(&payload)
                .bind(i32::try_from(d.attempt()).unwrap())
                .persistent(false)
                .execute(&mut *d.tx())
                .await
                .unwrap();
                Queue::table(table(&welcome).pooler(Pooler::Transaction))
                    .enqueue(&mut *d.tx(), Job::new(&payload).group("welcome"))
                    .await
                    .unwrap();
                let ack = outcome(&d);
                record(&seen, &d, ack);
                if ack {
                    Outcome::ack()
                } else {
                    Outcome::retry()
                }
            }
        }
    };
    let queue = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("q")
        .lease("locked_until")
        .attempt("attempt")
        .transactional()
        .workers(4)
        .handler(handler);
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&name, "1 = 1", 60).await;
    let stats = running.stats();
    assert_eq!((stats.failed, stats.lease_lost), (0, 0), "{stats:?}");
    running.shutdown().await.unwrap();
    each_acked_once(&seen, 60);
    // The retried attempts' writes were rolled back: one effect and one welcome job per job,
    // each written by the delivery that acked.
    assert_eq!(ctx.count(&effects, "1 = 1").await, 60);
    assert_eq!(
        ctx.count(&effects, "(payload::int % 3 = 0) = (attempt = 2)")
            .await,
        60
    );
    assert_eq!(ctx.count(&welcome, "1 = 1").await, 60);
    ctx.exec(&format!("DROP TABLE {effects}")).await;
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_lock_form_drains_through_a_transaction_pooler() {
    let Some((mut ctx, pool)) = setup(4).await else {
        return;
    };
    let name = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    enqueue(&pool, &name, 60).await;
    let seen: Seen = Arc::default();
    let handler = {
        let seen = Arc::clone(&seen);
        move |d: Delivery<Postgres>| {
            let ack = outcome(&d);
            record(&seen, &d, ack);
            async move {
                if ack {
                    Outcome::ack()
                } else {
                    Outcome::retry()
                }
            }
        }
    };
    // Each delivery holds its claim's transaction, so its server session, until it settles.
    let queue = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("q")
        .row_lock()
        .attempt("attempt")
        .workers(3)
        .handler(handler);
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&name, "1 = 1", 60).await;
    let stats = running.stats();
    assert_eq!(stats.failed, 0, "{stats:?}");
    running.shutdown().await.unwrap();
    // The row lock form counts the attempt when the row returns: the retried rows were
    // delivered at attempt 1, then 2.
    each_acked_once(&seen, 60);
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_and_inspection_work_through_a_transaction_pooler() {
    let Some((mut ctx, pool)) = setup(4).await else {
        return;
    };
    let name = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let jobs = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("q")
        .lease("locked_until")
        .attempt("attempt");
    enqueue(&pool, &name, 25).await;
    let mut tx = pool.begin().await.unwrap();
    let many: Vec<Job<'_>> = (0..5).map(|_| Job::new("later").group("q")).collect();
    jobs.enqueue_many(&mut *tx, &many).await.unwrap();
    let delayed = Job::new("delayed")
        .group("q")
        .delay(Duration::from_secs(3600));
    let id = jobs.enqueue(&mut *tx, delayed).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ctx.count(&name, "1 = 1").await, 31);
    assert_eq!(ctx.payload(&name, id).await, b"delayed");

    for _ in 0..5 {
        let counts = jobs.counts(&pool).await.unwrap();
        assert_eq!((counts.ready, counts.delayed, counts.in_work), (30, 1, 0));
    }
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_needs_one_session_is_refused_at_start_behind_a_transaction_pooler() {
    let Some((mut ctx, pool)) = setup(4).await else {
        return;
    };
    let name = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let handler = |_: Delivery<Postgres>| async { Outcome::ack() };
    let refused = |error: Error, what: &str| match error {
        Error::Unsupported { reason, .. } => {
            assert!(reason.contains("transaction pooler"), "{what}: {reason}");
            assert!(reason.contains(what), "{what}: {reason}");
        }
        other => panic!("{what}: {other}"),
    };

    // The advisory lock form.
    let advisory = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("q")
        .advisory_lock()
        .handler(handler);
    let error = Runner::new(pool.clone())
        .mount(advisory)
        .start()
        .await
        .unwrap_err();
    refused(error, "advisory");

    // `.listen_notify()`.
    let listening = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("q")
        .lease("locked_until")
        .listen_notify()
        .handler(handler);
    let error = Runner::new(pool.clone())
        .mount(listening)
        .start()
        .await
        .unwrap_err();
    refused(error, "listen_notify");

    // Neither is refused on a direct connection.
    let advisory = Queue::table(table(&name))
        .named("q")
        .advisory_lock()
        .handler(handler);
    Runner::new(ctx.pool.clone())
        .mount(advisory)
        .start()
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();

    // The pooler is said on the tables; a runner's tables that say it differently are refused
    // (one pool, one way to the server).
    let pooled = Queue::table(table(&name).pooler(Pooler::Transaction))
        .named("a")
        .lease("locked_until")
        .handler(handler);
    let direct = Queue::table(table(&name))
        .named("b")
        .lease("locked_until")
        .handler(handler);
    let error = Runner::new(pool.clone())
        .mount(pooled)
        .mount(direct)
        .start()
        .await
        .unwrap_err();
    match error {
        Error::Declaration { reason, .. } => {
            assert!(reason.contains("one `Table::pooler`"), "{reason}");
        }
        other => panic!("tables disagreeing on the pooler: {other}"),
    }
    ctx.drop_tables().await;
}
