//! Enqueues of a key an open transaction took wait for it to end, and are told how it ended.
//! InnoDB lets every such insert wait on the row's index entry; when the transaction rolls back
//! the waiters meet each other's locks, and all but one died of a deadlock (MariaDB: 40 of 60
//! waiters over 20 rounds, their transactions rolled back) — the crate now lets one waiter at
//! a time wait there (a named lock per key). PostgreSQL and SQLite order the waiters
//! themselves.

use std::time::Duration;

use sqlx_queue::{Enqueued, Job};
use tokio::task::JoinSet;

use crate::support::{Ctx, TestDb, report, wait_for};
use crate::{jobs, unique_table};

/// 20 rounds: a transaction enqueues a key and stays open while three more enqueue it, each in
/// a transaction of its own, and wait; then it rolls back. Each round: no error, one of the
/// three makes the job (`New`), the other two are told of it (`Duplicate` of its id), and the
/// key has one row, that job.
pub(crate) async fn a_rollback_leaves_the_key_to_one_waiting_enqueue<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx).await;
    let table = jobs(&t);
    for round in 0..20 {
        let key = format!("k-{round}");
        let mut first = ctx.pool.begin().await.unwrap();
        let taken = table
            .enqueue_unique(&mut first, Job::new("first").unique(key.clone()))
            .await
            .unwrap();
        assert!(matches!(taken, Enqueued::New(_)), "{taken:?}");
        let mut waiting = JoinSet::new();
        let mut sessions = Vec::new();
        for i in 0..3 {
            let (pool, table, key) = (ctx.pool.clone(), table.clone(), key.clone());
            let mut conn = pool.acquire().await.unwrap();
            sessions.push(session_of::<DB>(&mut conn).await);
            waiting.spawn(async move {
                let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                let payload = format!("waiter {i}");
                let done = table
                    .enqueue_unique(&mut tx, Job::new(&payload).unique(key))
                    .await;
                if done.is_ok() {
                    tx.commit().await.unwrap();
                }
                done.map_err(|e| e.to_string())
            });
        }
        wait_waiting(&ctx, &sessions, &mut waiting).await;
        first.rollback().await.unwrap();
        let mut told = Vec::new();
        while let Some(done) = waiting.join_next().await {
            told.push(done.unwrap());
        }
        let errors: Vec<&String> = told.iter().filter_map(|d| d.as_ref().err()).collect();
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        let told: Vec<Enqueued> = told.into_iter().map(Result::unwrap).collect();
        let new: Vec<i64> = told
            .iter()
            .filter_map(|d| match d {
                Enqueued::New(id) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(
            new.len(),
            1,
            "round {round}: one waiter makes the job: {told:?}"
        );
        let duplicates = told
            .iter()
            .filter(|d| **d == Enqueued::Duplicate(new[0]))
            .count();
        assert_eq!(duplicates, 2, "round {round}: {told:?}");
        assert_eq!(ctx.count(&t, &format!("dedupe = '{key}'")).await, 1);
        assert_eq!(ctx.count(&t, &format!("id = {}", new[0])).await, 1);
    }
    ctx.drop_tables().await;
}

/// 30 rounds of six transactions enqueueing one key at once, three that commit 30 ms after
/// their enqueue and three that roll back then (alternating). Each round: no error, the key has one row,
/// exactly one committing transaction made it (`New`), and every other committing one was told
/// of that row.
pub(crate) async fn commits_and_rollbacks_in_turns_leave_the_job_once<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx).await;
    let table = jobs(&t);
    let (mut new_by_rollbacks, mut waits) = (0, 0);
    for round in 0..30 {
        let key = format!("k-{round}");
        let mut tasks = JoinSet::new();
        for i in 0..6 {
            let (pool, table, key) = (ctx.pool.clone(), table.clone(), key.clone());
            tasks.spawn(async move {
                let commits = i % 2 == 0;
                let mut tx = pool.begin().await.unwrap();
                let started = std::time::Instant::now();
                let done = table
                    .enqueue_unique(&mut tx, Job::new("x").unique(key))
                    .await;
                let waited = started.elapsed() > Duration::from_millis(20);
                // Open a while, as a transaction doing more: the others wait for its end.
                tokio::time::sleep(Duration::from_millis(30)).await;
                match (&done, commits) {
                    (Ok(_), true) => tx.commit().await.unwrap(),
                    _ => tx.rollback().await.unwrap(),
                }
                (commits, done.map_err(|e| e.to_string()), waited)
            });
        }
        let mut told = Vec::new();
        while let Some(done) = tasks.join_next().await {
            told.push(done.unwrap());
        }
        let errors: Vec<&String> = told
            .iter()
            .filter_map(|(_, d, _)| d.as_ref().err())
            .collect();
        assert!(errors.is_empty(), "round {round}: {errors:?}");
        waits += told.iter().filter(|(_, _, waited)| *waited).count();
        let rows = ctx.count(&t, &format!("dedupe = '{key}'")).await;
        assert_eq!(
            rows, 1,
            "round {round}: the key's job is there once: {told:?}"
        );
        let committed: Vec<Enqueued> = told
            .iter()
            .filter(|(commits, _, _)| *commits)
            .map(|(_, d, _)| *d.as_ref().unwrap())
            .collect();
        let new: Vec<i64> = committed
            .iter()
            .filter_map(|d| match d {
                Enqueued::New(id) => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(new.len(), 1, "round {round}: {told:?}");
        assert!(
            committed
                .iter()
                .all(|d| matches!(d, Enqueued::New(_)) || *d == Enqueued::Duplicate(new[0])),
            "round {round}: {told:?}"
        );
        assert_eq!(ctx.count(&t, &format!("id = {}", new[0])).await, 1);
        new_by_rollbacks += told
            .iter()
            .filter(|(commits, d, _)| !commits && matches!(d, Ok(Enqueued::New(_))))
            .count();
    }
    report(&format!(
        "unique rollbacks in turns, {}: 180 transactions, {waits} waited over 20 ms, \
         {new_by_rollbacks} jobs made by transactions that rolled back",
        DB::LABEL
    ));
    ctx.drop_tables().await;
}

/// The server session of `conn`: PostgreSQL's backend pid, MySQL/MariaDB's connection id (none
/// on SQLite, whose writers wait in the process).
async fn session_of<DB: TestDb>(conn: &mut DB::Connection) -> Option<i64> {
    let sql = match DB::LABEL {
        "postgres" => "SELECT CAST(pg_backend_pid() AS BIGINT)",
        "mysql" => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        _ => return None,
    };
    Some(DB::count_on(conn, sql).await.unwrap())
}

/// Waits until the sessions of `waiting`'s enqueues are all in a statement that waits (the
/// server says so: PostgreSQL for a lock; MariaDB, a statement running for over 100 ms — the
/// insert waiting in InnoDB, or the named lock). SQLite cannot tell (its writers wait in the
/// process): there the enqueues are only checked not to have ended within 200 ms.
async fn wait_waiting<DB: TestDb>(
    ctx: &Ctx<DB>,
    sessions: &[Option<i64>],
    waiting: &mut JoinSet<Result<Enqueued, String>>,
) {
    let ids: Vec<String> = sessions.iter().flatten().map(i64::to_string).collect();
    let (view, condition) = match DB::LABEL {
        "postgres" => (
            "pg_stat_activity",
            format!("wait_event_type = 'Lock' AND pid IN ({})", ids.join(", ")),
        ),
        "mysql" => (
            "information_schema.processlist",
            format!(
                "command <> 'Sleep' AND info IS NOT NULL AND time_ms > 100 AND id IN ({})",
                ids.join(", ")
            ),
        ),
        _ => {
            let ended = tokio::time::timeout(Duration::from_millis(200), waiting.join_next());
            assert!(ended.await.is_err(), "an enqueue of a taken key waits");
            return;
        }
    };
    let n = i64::try_from(ids.len()).unwrap();
    wait_for(
        "the enqueues to wait for the open transaction",
        Duration::from_secs(10),
        || async { ctx.count(view, &condition).await == n },
    )
    .await;
}
