// Transactional mode's settings: the isolation level (PostgreSQL, MySQL/MariaDB) or SQLite mode
// asked for is the one in effect inside the handler; and a lost lease rolls the handler back.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(isolation<$db>:
            read_committed_is_the_default_and_repeatable_read_is_a_snapshot,
            postgres_reports_the_isolation_asked_for,
            sqlite_immediate_mode_takes_the_write_lock_at_begin,
            a_lost_lease_rolls_the_handlers_writes_back,
        );
    };
}
pub(crate) use tests;

type Tx<DB> = Delivery<DB, Transactional>;

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// Reads what a handler's transaction sees of `accounts` twice: before and after the test
/// commits a row there from another connection.
async fn reads_twice<DB: TestDb>(isolation: Option<sqlx_queue::Isolation>) -> Option<(i64, i64)> {
    let mut ctx = Ctx::<DB>::new().await?;
    let t = ctx.table(Spec::lease()).await;
    let accounts = format!("{t}_accounts");
    ctx.exec(&format!(
        "CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)"
    ))
    .await;
    DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let count = format!("SELECT COUNT(*) FROM {accounts}");
    let queue = Queue::table(jobs(&t)).lease("locked_until").transactional();
    let handler = {
        let gate = Arc::clone(&gate);
        move |mut d: Tx<DB>| {
            let (gate, tx, count) = (Arc::clone(&gate), tx.clone(), count.clone());
            async move {
                let before = DB::count_on(&mut *d.tx(), &count).await.unwrap();
                let _ = tx.send(None);
                let _permit = gate.acquire().await.unwrap();
                let after = DB::count_on(&mut *d.tx(), &count).await.unwrap();
                let _ = tx.send(Some((before, after)));
                Outcome::ack()
            }
        }
    };
    // Without a setting: the default.
    let runner = match isolation {
        Some(level) => Runner::new(ctx.pool.clone()).mount(
            queue
                .isolation(DB::setting(level, sqlx_queue::SqliteMode::Deferred))
                .handler(handler),
        ),
        None => Runner::new(ctx.pool.clone()).mount(queue.handler(handler)),
    };
    let running = runner.start().await.unwrap();
    recv(&mut seen, "the first read", 10).await;
    ctx.exec(&format!(
        "INSERT INTO {accounts} (email) VALUES ('elsewhere')"
    ))
    .await;
    gate.add_permits(1);
    let reads = recv(&mut seen, "the second read", 10).await;
    running.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
    reads
}

pub(crate) async fn read_committed_is_the_default_and_repeatable_read_is_a_snapshot<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        return; // SQLite has no isolation levels: `sqlite_mode` below.
    }
    let Some(default) = reads_twice::<DB>(None).await else {
        return;
    };
    assert_eq!(default, (0, 1), "read committed sees the other commit");
    let repeatable = reads_twice::<DB>(Some(sqlx_queue::Isolation::RepeatableRead))
        .await
        .unwrap();
    assert_eq!(repeatable, (0, 0), "repeatable read keeps its snapshot");
    // MySQL/MariaDB's SERIALIZABLE reads take shared locks: the other connection's insert
    // would wait for the handler, which waits for it. PostgreSQL's is a snapshot.
    if DB::LABEL == "postgres" {
        let serializable = reads_twice::<DB>(Some(sqlx_queue::Isolation::Serializable))
            .await
            .unwrap();
        assert_eq!(serializable, (0, 0), "serializable keeps its snapshot");
    }
}

pub(crate) async fn postgres_reports_the_isolation_asked_for<DB: TestDb>() {
    if DB::LABEL != "postgres" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .transactional()
        .isolation(DB::setting(
            sqlx_queue::Isolation::Serializable,
            sqlx_queue::SqliteMode::Deferred,
        ))
        .handler(move |mut d: Tx<DB>| {
            let tx = tx.clone();
            async move {
                let level = DB::text_on(&mut *d.tx(), "SHOW transaction_isolation")
                    .await
                    .unwrap();
                let _ = tx.send(level);
                Outcome::ack()
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(
        recv(&mut seen, "the level in effect", 10).await,
        "serializable"
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn sqlite_immediate_mode_takes_the_write_lock_at_begin<DB: TestDb>() {
    if DB::LABEL != "sqlite" {
        return;
    }
    for (mode, locked) in [
        (sqlx_queue::SqliteMode::Deferred, false),
        (sqlx_queue::SqliteMode::Immediate, true),
    ] {
        let Some(mut ctx) = Ctx::<DB>::new().await else {
            return;
        };
        let t = ctx.table(Spec::lease()).await;
        DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
            .await
            .unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut seen) = mpsc::unbounded_channel();
        let queue = Queue::table(jobs(&t))
            .lease("locked_until")
            .transactional()
            .isolation(DB::setting(sqlx_queue::Isolation::ReadCommitted, mode))
            .handler({
                let gate = Arc::clone(&gate);
                move |_: Tx<DB>| {
                    let (gate, tx) = (Arc::clone(&gate), tx.clone());
                    async move {
                        let _ = tx.send(());
                        let _permit = gate.acquire().await.unwrap();
                        Outcome::ack()
                    }
                }
            });
        let running = Runner::new(ctx.pool.clone())
            .mount(queue)
            .start()
            .await
            .unwrap();
        recv(&mut seen, "the handler in its transaction", 10).await;
        // Another writer that does not wait: refused only while the handler holds the lock.
        use sqlx::Connection as _;
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(ctx.url.as_deref().unwrap())
            .busy_timeout(Duration::ZERO);
        let mut other = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        let began = sqlx::raw_sql("BEGIN IMMEDIATE; ROLLBACK")
            .execute(&mut other)
            .await;
        assert_eq!(began.is_err(), locked, "{mode:?}: {began:?}");
        other.close().await.unwrap();
        gate.add_permits(1);
        ctx.wait_none(&t, "1 = 1", 10).await;
        running.shutdown().await.unwrap();
        ctx.drop_tables().await;
    }
}

pub(crate) async fn a_lost_lease_rolls_the_handlers_writes_back<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let accounts = format!("{t}_accounts");
    ctx.exec(&format!(
        "CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)"
    ))
    .await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let pool = ctx.pool.clone();
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = {id}");
    let insert = format!("INSERT INTO {accounts} (email) VALUES ('lost')");
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .transactional()
        .handler(move |mut d: Tx<DB>| {
            let (pool, steal, insert) = (pool.clone(), steal.clone(), insert.clone());
            async move {
                // Another claim takes the row (through the pool, committed at once; on SQLite
                // before the handler's first write, whose lock would keep every writer out).
                DB::exec_time(&pool, &steal, later_claim).await.unwrap();
                DB::query_on(&mut *d.tx(), &insert).await.unwrap();
                Outcome::ack()
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for(
        "the lost lease counted",
        Duration::from_secs(20),
        || async { running.stats().lease_lost == 1 },
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&accounts, "1 = 1").await,
        0,
        "the handler's write rolled back"
    );
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}
