// Transactional mode's settings: the isolation level (PostgreSQL, MySQL/MariaDB) or SQLite mode
// asked for is the one in effect inside the handler; and a lost lease rolls the handler back.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::{Semaphore, mpsc};

use crate::support::TestDb;

type Tx = Delivery<Db, Transactional>;

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// Reads what a handler's transaction sees of `accounts` twice: before and after the test
/// commits a row there from another connection.
async fn reads_twice(isolation: Option<sqlx_queue::Isolation>) -> Option<(i64, i64)> {
    let mut ctx = Ctx::<Db>::new().await?;
    let t = ctx.table(Spec::lease()).await;
    let accounts = format!("{t}_accounts");
    ctx.exec(&format!("CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)")).await;
    jobs(&t).enqueue(&ctx.pool, Job::new("x")).await.unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let count = format!("SELECT COUNT(*) FROM {accounts}");
    let queue = Queue::table(jobs(&t)).lease("locked_until").transactional();
    let queue = match isolation {
        Some(level) => queue.isolation(level),
        None => queue,
    };
    let queue = queue.handler({
        let gate = Arc::clone(&gate);
        move |mut d: Tx| {
            let (gate, tx, count) = (Arc::clone(&gate), tx.clone(), count.clone());
            async move {
                let before: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.clone()))
                    .fetch_one(&mut *d.tx())
                    .await
                    .unwrap();
                let _ = tx.send(None);
                let _permit = gate.acquire().await.unwrap();
                let after: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count))
                    .fetch_one(&mut *d.tx())
                    .await
                    .unwrap();
                let _ = tx.send(Some((before, after)));
                Outcome::ack()
            }
        }
    });
    let running = Runner::new(ctx.pool.clone()).mount(queue).start().await.unwrap();
    recv(&mut seen, "the first read", 10).await;
    ctx.exec(&format!("INSERT INTO {accounts} (email) VALUES ('elsewhere')")).await;
    gate.add_permits(1);
    let reads = recv(&mut seen, "the second read", 10).await;
    running.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_committed_is_the_default_and_repeatable_read_is_a_snapshot() {
    if <Db as TestDb>::LABEL == "sqlite" {
        return; // SQLite has no isolation levels: `sqlite_mode` below.
    }
    let Some(default) = reads_twice(None).await else { return };
    assert_eq!(default, (0, 1), "read committed sees the other commit");
    let repeatable = reads_twice(Some(sqlx_queue::Isolation::RepeatableRead)).await.unwrap();
    assert_eq!(repeatable, (0, 0), "repeatable read keeps its snapshot");
    // MySQL/MariaDB's SERIALIZABLE reads take shared locks: the other connection's insert
    // would wait for the handler, which waits for it. PostgreSQL's is a snapshot.
    if <Db as TestDb>::LABEL == "postgres" {
        let serializable = reads_twice(Some(sqlx_queue::Isolation::Serializable)).await.unwrap();
        assert_eq!(serializable, (0, 0), "serializable keeps its snapshot");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reports_the_isolation_asked_for() {
    if <Db as TestDb>::LABEL != "postgres" {
        return;
    }
    let Some(mut ctx) = Ctx::<Db>::new().await else { return };
    let t = ctx.table(Spec::lease()).await;
    jobs(&t).enqueue(&ctx.pool, Job::new("x")).await.unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .transactional()
        .isolation(sqlx_queue::Isolation::Serializable)
        .handler(move |mut d: Tx| {
            let tx = tx.clone();
            async move {
                let level: String = sqlx::query_scalar("SHOW transaction_isolation")
                    .fetch_one(&mut *d.tx())
                    .await
                    .unwrap();
                let _ = tx.send(level);
                Outcome::ack()
            }
        });
    let running = Runner::new(ctx.pool.clone()).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the level in effect", 10).await, "serializable");
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_immediate_mode_takes_the_write_lock_at_begin() {
    if <Db as TestDb>::LABEL != "sqlite" {
        return;
    }
    for (mode, locked) in [
        (sqlx_queue::SqliteMode::Deferred, false),
        (sqlx_queue::SqliteMode::Immediate, true),
    ] {
        let Some(mut ctx) = Ctx::<Db>::new().await else { return };
        let t = ctx.table(Spec::lease()).await;
        jobs(&t).enqueue(&ctx.pool, Job::new("x")).await.unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut seen) = mpsc::unbounded_channel();
        let queue = Queue::table(jobs(&t))
            .lease("locked_until")
            .transactional()
            .sqlite_mode(mode)
            .handler({
                let gate = Arc::clone(&gate);
                move |_: Tx| {
                    let (gate, tx) = (Arc::clone(&gate), tx.clone());
                    async move {
                        let _ = tx.send(());
                        let _permit = gate.acquire().await.unwrap();
                        Outcome::ack()
                    }
                }
            });
        let running = Runner::new(ctx.pool.clone()).mount(queue).start().await.unwrap();
        recv(&mut seen, "the handler in its transaction", 10).await;
        // Another writer that does not wait: refused only while the handler holds the lock.
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(ctx.url.as_deref().unwrap())
            .busy_timeout(Duration::ZERO);
        let mut other = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
        let began = sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK").execute(&mut other).await;
        assert_eq!(began.is_err(), locked, "{mode:?}: {began:?}");
        other.close().await.unwrap();
        gate.add_permits(1);
        ctx.wait_none(&t, "1 = 1", 10).await;
        running.shutdown().await.unwrap();
        ctx.drop_tables().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_rolls_the_handlers_writes_back() {
    let Some(mut ctx) = Ctx::<Db>::new().await else { return };
    let t = ctx.table(Spec::lease()).await;
    let accounts = format!("{t}_accounts");
    ctx.exec(&format!("CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)")).await;
    let id = jobs(&t).enqueue(&ctx.pool, Job::new("x")).await.unwrap();
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let pool = ctx.pool.clone();
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = {id}");
    let insert = format!("INSERT INTO {accounts} (email) VALUES ('lost')");
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .transactional()
        .handler(move |mut d: Tx| {
            let (pool, steal, insert) = (pool.clone(), steal.clone(), insert.clone());
            async move {
                // Another claim takes the row (through the pool, committed at once; on SQLite
                // before the handler's first write, whose lock would keep every writer out).
                <Db as TestDb>::exec_time(&pool, &steal, later_claim).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .execute(&mut *d.tx())
                    .await
                    .unwrap();
                Outcome::ack()
            }
        });
    let running = Runner::new(ctx.pool.clone()).mount(queue).start().await.unwrap();
    wait_for("the lost lease counted", Duration::from_secs(20), || async {
        running.stats().lease_lost == 1
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&accounts, "1 = 1").await, 0, "the handler's write rolled back");
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}
