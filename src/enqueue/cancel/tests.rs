//! SQLite's advisory keys as a cancellation sees them, read from the process's own set: a key a
//! claim holds (taken, the row not read again yet) makes the job one in work, and a cancellation
//! leaves no key of its own held — when it succeeds, fails, is dropped, or ran inside the
//! caller's transaction.

use std::time::Duration;

use sqlx::SqlitePool;

use crate::backend::{in_process, scratch};
use crate::dialect::{self, KeysAt};
use crate::state::AdvisoryLock;
use crate::table::Dialect;
use crate::{Cancellation, Job, Queue, Table};

/// A fresh database file with a job table `jobs` and its requests' table `cancels`.
async fn database(name: &str) -> (SqlitePool, std::path::PathBuf) {
    let (pool, file) = scratch::open(&format!("cancel-{name}")).await;
    for ddl in [
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)",
        "CREATE TABLE cancels (id INTEGER PRIMARY KEY)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    (pool, file)
}

async fn close(pool: SqlitePool, file: std::path::PathBuf) {
    scratch::remove(pool, file).await;
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// An advisory queue on `table`.
fn queue(table: &Table) -> Queue<AdvisoryLock> {
    Queue::table(table.clone()).advisory_lock()
}

/// The table part of `table`'s keys in this process, as the advisory form makes it.
async fn keys_of(pool: &SqlitePool, table: &Table) -> u64 {
    let names = dialect::Names::of_table(Dialect::Sqlite, table).unwrap();
    let sql = dialect::cancel(&names);
    assert_eq!(sql.keys, Some(KeysAt::Process));
    let mut conn = pool.acquire().await.unwrap();
    let identity = table
        .keys_identity::<sqlx::Sqlite>(&mut conn, &sql)
        .await
        .unwrap()
        .expect("keys are tested");
    dialect::fnv1a_64(&identity)
}

/// A claim holds the row's key (the advisory form takes it before it reads the row again): the
/// cancellation says the job is in work, records a request (which the runner reads once it
/// delivers the row), leaves the row, and takes no key; once the claim gave its key back, the
/// next cancellation removes the row.
#[tokio::test]
async fn a_key_a_claim_holds_is_a_job_in_work() {
    let (pool, file) = database("held").await;
    let table = Table::new("jobs").cancel_requests("cancels");
    let id = queue(&table).enqueue(&pool, Job::new("x")).await.unwrap();
    let keys = keys_of(&pool, &table).await;
    let claim = in_process::take_for_now(keys, id).expect("the key is free");
    assert_eq!(
        queue(&table).cancel(&pool, id).await.unwrap(),
        Cancellation::Requested(id)
    );
    assert_eq!(in_process::count(keys), 1, "only the claim's key is held");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 1);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM cancels").await, 1);
    drop(claim);
    assert_eq!(
        queue(&table).cancel(&pool, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    assert_eq!(in_process::count(keys), 0, "the cancellation's key is free");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 0);
    close(pool, file).await;
}

/// A cancellation by unique key and one that fails (a trigger refuses the removal) leave no key
/// held either.
#[tokio::test]
async fn no_key_is_left_held_on_success_or_error() {
    let (pool, file) = database("error").await;
    for ddl in [
        "ALTER TABLE jobs ADD COLUMN k TEXT",
        "CREATE UNIQUE INDEX jobs_k ON jobs (k)",
    ] {
        sqlx::query(ddl).execute(&pool).await.unwrap();
    }
    let table = Table::new("jobs")
        .cancel_requests("cancels")
        .unique_key("k");
    let keys = keys_of(&pool, &table).await;
    let kept = queue(&table).enqueue(&pool, Job::new("x")).await.unwrap();
    // Unique enqueues are the lease and row lock forms' (an advisory queue's do not compile):
    // the keyed row is inserted as a producer of another process would.
    let by_key: i64 =
        sqlx::query_scalar("INSERT INTO jobs (payload, k) VALUES (x'79', 'the key') RETURNING id")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        queue(&table).cancel_unique(&pool, "the key").await.unwrap(),
        Cancellation::Cancelled(by_key)
    );
    assert_eq!(in_process::count(keys), 0);
    sqlx::query("CREATE TRIGGER keep BEFORE DELETE ON jobs BEGIN SELECT RAISE(ABORT, 'kept'); END")
        .execute(&pool)
        .await
        .unwrap();
    assert!(queue(&table).cancel(&pool, kept).await.is_err());
    assert_eq!(in_process::count(keys), 0, "given back on the error");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 1);
    close(pool, file).await;
}

/// Inside the caller's transaction the cancellation is a savepoint, and its key is given back
/// when the savepoint ends (the guide's limit, `docs/guide/cancellation.md`): a rollback then cancels nothing, and the next
/// cancellation takes the key again.
#[tokio::test]
async fn inside_the_callers_transaction_the_key_is_given_back_at_its_savepoint() {
    let (pool, file) = database("savepoint").await;
    let table = Table::new("jobs").cancel_requests("cancels");
    let keys = keys_of(&pool, &table).await;
    let id = queue(&table).enqueue(&pool, Job::new("x")).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        queue(&table).cancel(&mut *tx, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    assert_eq!(in_process::count(keys), 0);
    tx.rollback().await.unwrap();
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 1);
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        queue(&table).cancel(&mut *tx, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    tx.commit().await.unwrap();
    assert_eq!(in_process::count(keys), 0);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 0);
    close(pool, file).await;
}

/// A cancellation dropped while its removal runs (a trigger that computes for a while) gives its
/// key back at once, and its transaction rolls back.
#[tokio::test]
async fn a_dropped_cancellation_gives_its_key_back() {
    let (pool, file) = database("dropped").await;
    let table = Table::new("jobs").cancel_requests("cancels");
    let keys = keys_of(&pool, &table).await;
    let id = queue(&table).enqueue(&pool, Job::new("x")).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER slow BEFORE DELETE ON jobs BEGIN SELECT COUNT(*) FROM \
         (WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 3000000) \
         SELECT x FROM n); END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let advisory = queue(&table);
    let mut cancel = advisory.cancel(&pool, id);
    // Polled until it holds the key (its removal then runs for a while), then dropped.
    let started = tokio::time::Instant::now();
    while in_process::count(keys) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the cancellation never took the key"
        );
        if let Ok(done) = tokio::time::timeout(Duration::from_millis(1), &mut cancel).await {
            panic!("the removal ended before the cancellation was dropped: {done:?}");
        }
    }
    drop(cancel);
    assert_eq!(in_process::count(keys), 0, "given back when dropped");
    // Once the dropped transaction rolled back (the statement ran on), the row is there.
    sqlx::query("DROP TRIGGER slow")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM jobs").await, 1);
    assert_eq!(
        queue(&table).cancel(&pool, id).await.unwrap(),
        Cancellation::Cancelled(id)
    );
    close(pool, file).await;
}
