// Unique jobs racing transactions: an enqueuer waiting on a key that a transaction not yet ended
// took, told how that transaction ended; and eight enqueuers of one key, each in a transaction of
// its own, half skipping and half replacing.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::state::Lease;
use sqlx_queue::{Enqueued, Job, Queue, Table};

use crate::support::{Ctx, Spec, TestDb, wait_for};
use crate::unique::unique_table;

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(unique_races<$db>:
            an_enqueuer_waiting_on_an_open_transactions_key_is_told_how_it_ended,
            eight_enqueuers_in_transactions_skipping_and_replacing_are_each_told_the_truth,
        );
    };
}
pub(crate) use tests;

fn table(t: &str) -> Queue<Lease> {
    let columns = Table::new(t)
        .unique_key("dedupe")
        .retry_after("retry_after")
        .priority("priority")
        .created_at("created_at");
    Queue::table(columns).lease("locked_until")
}

fn spec() -> Spec {
    Spec {
        priority: true,
        ..Spec::lease()
    }
}

/// Waits until a statement on table `t` waits for a lock (PostgreSQL, MySQL/MariaDB: the
/// server says so). SQLite cannot tell: the writer waits in its busy handler, in the process;
/// there the enqueue is only checked not to have ended.
async fn wait_blocked<DB: TestDb>(ctx: &Ctx<DB>, t: &str) {
    let (view, condition) = match DB::LABEL {
        "postgres" => (
            "pg_stat_activity",
            format!(
                "wait_event_type = 'Lock' AND query LIKE '%{t}%' \
                 AND query NOT LIKE '%pg_stat_activity%'"
            ),
        ),
        // An insert of the key can only end once the transaction that took it has: while the
        // server lists it as executing, it waits (its InnoDB transaction does not always show
        // the statement).
        "mysql" => (
            "information_schema.processlist",
            format!("info LIKE 'INSERT INTO `{t}`%'"),
        ),
        _ => return,
    };
    let what = format!("an enqueue into {t} waiting for a lock");
    wait_for(&what, Duration::from_secs(10), || async {
        ctx.count(view, &condition).await > 0
    })
    .await;
}

pub(crate) async fn an_enqueuer_waiting_on_an_open_transactions_key_is_told_how_it_ended<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = Arc::new(table(&t));
    for commit in [false, true] {
        let key = format!("k-{commit}");
        let mut tx = ctx.pool.begin().await.unwrap();
        let first = jobs
            .enqueue_unique(&mut tx, Job::new("first").unique(key.clone()))
            .await
            .unwrap();
        let Enqueued::New(first) = first else {
            panic!("the key was free: {first:?}");
        };
        let (pool, other, k) = (ctx.pool.clone(), Arc::clone(&jobs), key.clone());
        let mut waiting = tokio::spawn(async move {
            other
                .enqueue_unique(&pool, Job::new("second").unique(k))
                .await
                .unwrap()
        });
        wait_blocked(&ctx, &t).await;
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut waiting)
                .await
                .is_err(),
            "an enqueue of a key an open transaction took waits for it to end"
        );
        let second = if commit {
            tx.commit().await.unwrap();
            waiting.await.unwrap()
        } else {
            tx.rollback().await.unwrap();
            waiting.await.unwrap()
        };
        if commit {
            assert_eq!(second, Enqueued::Duplicate(first), "told the committed job");
            assert_eq!(ctx.payload(&t, first).await, b"first");
        } else {
            let Enqueued::New(id) = second else {
                panic!("the rolled back transaction left the key free: {second:?}");
            };
            assert_eq!(ctx.payload(&t, id).await, b"second");
        }
        assert_eq!(ctx.count(&t, &format!("dedupe = '{key}'")).await, 1);
    }
    assert_eq!(ctx.count(&t, "1 = 1").await, 2);
    ctx.drop_tables().await;
}

pub(crate) async fn eight_enqueuers_in_transactions_skipping_and_replacing_are_each_told_the_truth<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = Arc::new(table(&t));
    // The pool's connections opened before the table and its index were made: on SQLite the
    // first enqueues renew their schema, in their transactions.
    let pool = ctx.pool.clone();
    for round in 0..5 {
        let key = format!("key-{round}");
        let mut tasks = Vec::new();
        // Odd enqueuers replace, even ones skip.
        for i in 0..8 {
            let (pool, jobs, key) = (pool.clone(), Arc::clone(&jobs), key.clone());
            tasks.push(tokio::spawn(async move {
                let payload = format!("{i}");
                let mut job = Job::new(&payload).unique(key);
                if i % 2 == 1 {
                    job = job.replace();
                }
                let mut tx = pool.begin().await.unwrap();
                let done = jobs.enqueue_unique(&mut tx, job).await;
                match done {
                    Ok(done) => {
                        tx.commit().await.unwrap();
                        done
                    }
                    Err(e) => panic!("round {round}, enqueuer {i}: {e}"),
                }
            }));
        }
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap());
        }
        let new: Vec<usize> = (0..8)
            .filter(|&i| matches!(done[i], Enqueued::New(_)))
            .collect();
        assert_eq!(
            new.len(),
            1,
            "round {round}: one enqueue made the job: {done:?}"
        );
        let id = done[new[0]].id();
        for (i, d) in done.iter().enumerate() {
            let told = match (i == new[0], i % 2 == 1) {
                (true, _) => Enqueued::New(id),
                (false, false) => Enqueued::Duplicate(id),
                (false, true) => Enqueued::Replaced(id),
            };
            assert_eq!(*d, told, "round {round}, enqueuer {i}: {done:?}");
        }
        assert_eq!(ctx.count(&t, &format!("dedupe = '{key}'")).await, 1);
        // The payload is the last replace's, or the new job's when none replaced it.
        let payload = String::from_utf8(ctx.payload(&t, id).await).unwrap();
        let replaced: Vec<String> = (0..8)
            .filter(|&i| matches!(done[i], Enqueued::Replaced(_)))
            .map(|i| i.to_string())
            .collect();
        if replaced.is_empty() {
            assert_eq!(payload, new[0].to_string(), "round {round}");
        } else {
            assert!(
                replaced.contains(&payload),
                "round {round}: the payload {payload} is a replacer's: {done:?}"
            );
        }
    }
    assert_eq!(ctx.count(&t, "1 = 1").await, 5);
    ctx.drop_tables().await;
}
