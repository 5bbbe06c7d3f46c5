// Unique jobs: one unfinished job per key, whatever the race; what skip, replace and debounce do
// to the job that holds the key; bulk enqueue; the caller's transaction; finished rows freeing
// their keys; and what is refused.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use sqlx_queue::state::Lease;
use sqlx_queue::{Delivery, Enqueued, Error, Job, Outcome, Queue, Runner, Table};

use crate::support::{Bind, Ctx, Spec, TestDb, TestRow, unique};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(unique<$db>:
            eight_enqueuers_of_one_key_make_one_job_and_each_is_told_the_truth,
            replace_gives_a_waiting_job_the_new_payload_priority_and_due_time,
            debounce_pushes_the_job_later_but_never_past_its_max,
            bulk_enqueue_meets_duplicates_in_the_batch_and_in_the_table,
            a_rolled_back_enqueue_leaves_the_key_free,
            a_finished_job_frees_its_key,
            what_a_unique_job_needs_is_said_before_anything_runs,
        );
    };
}
pub(crate) use tests;

/// A lease table (`Spec`) with a `dedupe` unique key, a `created_at` default and a `priority`
/// column; the unique index partial on unfinished rows where the table keeps them and the
/// database can.
pub(crate) async fn unique_table<DB: TestDb>(ctx: &mut Ctx<DB>, spec: Spec) -> String {
    let name = ctx.table(spec).await;
    ctx.exec(&format!("DROP TABLE {name}")).await;
    let ddl = DB::ddl(
        &name,
        Spec {
            created_at: true,
            ..spec
        },
    );
    let ddl = format!(
        "{}, dedupe {})",
        ddl.strip_suffix(')').expect("a CREATE TABLE"),
        DB::TEXT
    );
    ctx.exec(&ddl).await;
    let partial = if spec.processed_at && DB::LABEL != "mysql" {
        " WHERE processed_at IS NULL"
    } else {
        ""
    };
    ctx.exec(&format!(
        "CREATE UNIQUE INDEX {name}_dedupe ON {name} (dedupe){partial}"
    ))
    .await;
    name
}

fn spec() -> Spec {
    Spec {
        priority: true,
        ..Spec::lease()
    }
}

fn columns(t: &str) -> Table {
    Table::new(t)
        .unique_key("dedupe")
        .retry_after("retry_after")
        .priority("priority")
        .created_at("created_at")
}

/// The lease queue on table `t` (its lease column tells a replace or debounce a job in work).
fn table(t: &str) -> Queue<Lease> {
    Queue::table(columns(t)).lease("locked_until")
}

/// Seconds from now to the row's `retry_after` (negative when past), read by the database.
async fn due_in<DB: TestDb>(ctx: &Ctx<DB>, t: &str, id: i64) -> f64 {
    let now = Utc::now();
    let rows = DB::rows(
        &ctx.pool,
        &format!("SELECT COUNT(*) AS n FROM {t} WHERE id = {id} AND retry_after IS NULL"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(rows[0].int("n").unwrap(), 0, "row {id} has a due time");
    // Bisect on whole milliseconds: the due time's representation differs per database, its
    // order against a bound time does not.
    let (mut low, mut high) = (-120_000i64, 120_000i64);
    while high - low > 1 {
        let mid = (low + high) / 2;
        let at = now + TimeDelta::milliseconds(mid);
        let sql = format!(
            "SELECT COUNT(*) AS n FROM {t} WHERE id = {id} AND retry_after <= {}",
            if DB::LABEL == "postgres" { "$1" } else { "?" }
        );
        let n = DB::rows(&ctx.pool, &sql, &[Bind::Time(at)]).await.unwrap()[0]
            .int("n")
            .unwrap();
        if n > 0 {
            high = mid;
        } else {
            low = mid;
        }
    }
    high as f64 / 1000.0
}

pub(crate) async fn eight_enqueuers_of_one_key_make_one_job_and_each_is_told_the_truth<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = Arc::new(table(&t));
    for round in 0..10 {
        let key = format!("key-{round}");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (pool, jobs, key) = (ctx.pool.clone(), Arc::clone(&jobs), key.clone());
            tasks.push(tokio::spawn(async move {
                let payload = format!("{i}");
                jobs.enqueue_unique(&pool, Job::new(&payload).unique(key))
                    .await
                    .unwrap()
            }));
        }
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap());
        }
        let new: Vec<_> = done
            .iter()
            .filter(|d| matches!(d, Enqueued::New(_)))
            .collect();
        assert_eq!(
            new.len(),
            1,
            "round {round}: one enqueue made the job: {done:?}"
        );
        let id = new[0].id();
        assert!(
            done.iter()
                .all(|d| *d == Enqueued::New(id) || *d == Enqueued::Duplicate(id)),
            "round {round}: every other enqueue was told the job's id: {done:?}"
        );
        assert_eq!(ctx.count(&t, &format!("dedupe = '{key}'")).await, 1);
    }
    assert_eq!(ctx.count(&t, "1 = 1").await, 10);
    ctx.drop_tables().await;
}

pub(crate) async fn replace_gives_a_waiting_job_the_new_payload_priority_and_due_time<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = table(&t);
    let first = jobs
        .enqueue_unique(&ctx.pool, Job::new("old").unique("k"))
        .await
        .unwrap();
    let Enqueued::New(id) = first else {
        panic!("the key was free: {first:?}");
    };
    let again = jobs
        .enqueue_unique(
            &ctx.pool,
            Job::new("new")
                .priority(-3)
                .delay(Duration::from_secs(60))
                .unique("k")
                .replace(),
        )
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Replaced(id));
    assert_eq!(ctx.payload(&t, id).await, b"new");
    assert_eq!(ctx.count(&t, "priority = -3").await, 1);
    let due = due_in(&ctx, &t, id).await;
    assert!((55.0..=61.0).contains(&due), "due in 60 s, found {due} s");
    // A replace without a delay makes the job due at once.
    let now = jobs
        .enqueue_unique(&ctx.pool, Job::new("now").unique("k").replace())
        .await
        .unwrap();
    assert_eq!(now, Enqueued::Replaced(id));
    assert_eq!(ctx.count(&t, "retry_after IS NULL").await, 1);
    // Skip changes nothing.
    let skipped = jobs
        .enqueue_unique(&ctx.pool, Job::new("ignored").unique("k"))
        .await
        .unwrap();
    assert_eq!(skipped, Enqueued::Duplicate(id));
    assert_eq!(ctx.payload(&t, id).await, b"now");
    assert_eq!(ctx.count(&t, "1 = 1").await, 1);
    ctx.drop_tables().await;
}

pub(crate) async fn debounce_pushes_the_job_later_but_never_past_its_max<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = table(&t);
    let debounced = |payload: &'static str| {
        Job::new(payload)
            .unique("d")
            .debounce(Duration::from_secs(20), Duration::from_secs(30))
    };
    let Enqueued::New(id) = jobs
        .enqueue_unique(&ctx.pool, debounced("1"))
        .await
        .unwrap()
    else {
        panic!("the key was free");
    };
    let due = due_in(&ctx, &t, id).await;
    assert!(
        (15.0..=21.0).contains(&due),
        "a new job is due after the wait: {due} s"
    );
    // Created 25 s ago: a push to now + 20 s would pass created + 30 s, so it stops there.
    ctx.exec_time(
        &format!("UPDATE {t} SET created_at = ?, retry_after = NULL WHERE id = {id}"),
        Utc::now() - TimeDelta::seconds(25),
    )
    .await;
    let again = jobs
        .enqueue_unique(&ctx.pool, debounced("2"))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Debounced(id));
    let due = due_in(&ctx, &t, id).await;
    assert!(
        (3.0..=6.0).contains(&due),
        "capped at created + 30 s: {due} s"
    );
    assert_eq!(
        ctx.payload(&t, id).await,
        b"1",
        "a debounce keeps the payload"
    );
    // Created just now: pushed to now + 20 s.
    ctx.exec_time(
        &format!("UPDATE {t} SET created_at = ? WHERE id = {id}"),
        Utc::now(),
    )
    .await;
    assert_eq!(
        jobs.enqueue_unique(&ctx.pool, debounced("3"))
            .await
            .unwrap(),
        Enqueued::Debounced(id)
    );
    let due = due_in(&ctx, &t, id).await;
    assert!(
        (15.0..=21.0).contains(&due),
        "pushed to now + 20 s: {due} s"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn bulk_enqueue_meets_duplicates_in_the_batch_and_in_the_table<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = table(&t);
    let a = jobs
        .enqueue_unique(&ctx.pool, Job::new("a").unique("a"))
        .await
        .unwrap()
        .id();
    let batch = [
        Job::new("a2").unique("a"),
        Job::new("b").unique("b"),
        Job::new("b2").unique("b"),
        Job::new("c").unique("c"),
        Job::new("c2").unique("c").replace(),
        Job::new("a3").unique("a").replace(),
    ];
    let done = jobs.enqueue_many_unique(&ctx.pool, &batch).await.unwrap();
    let (b, c) = (done[1].id(), done[3].id());
    assert_eq!(
        done,
        vec![
            Enqueued::Duplicate(a),
            Enqueued::New(b),
            Enqueued::Duplicate(b),
            Enqueued::New(c),
            Enqueued::Replaced(c),
            Enqueued::Replaced(a),
        ]
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 3);
    assert_eq!(ctx.payload(&t, a).await, b"a3");
    assert_eq!(ctx.payload(&t, b).await, b"b");
    assert_eq!(ctx.payload(&t, c).await, b"c2");
    // Inside a transaction too, all or nothing.
    let mut tx = ctx.pool.begin().await.unwrap();
    let more = [Job::new("d").unique("d"), Job::new("a4").unique("a")];
    let done = jobs.enqueue_many_unique(&mut tx, &more).await.unwrap();
    assert_eq!(done[1], Enqueued::Duplicate(a));
    tx.rollback().await.unwrap();
    assert_eq!(ctx.count(&t, "dedupe = 'd'").await, 0);
    ctx.drop_tables().await;
}

pub(crate) async fn a_rolled_back_enqueue_leaves_the_key_free<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let jobs = table(&t);
    let mut tx = ctx.pool.begin().await.unwrap();
    let done = jobs
        .enqueue_unique(&mut tx, Job::new("x").unique("k"))
        .await
        .unwrap();
    assert!(matches!(done, Enqueued::New(_)), "{done:?}");
    tx.rollback().await.unwrap();
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    let mut tx = ctx.pool.begin().await.unwrap();
    let done = jobs
        .enqueue_unique(&mut tx, Job::new("y").unique("k"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let Enqueued::New(id) = done else {
        panic!("the rolled back job left the key free: {done:?}");
    };
    assert_eq!(ctx.payload(&t, id).await, b"y");
    ctx.drop_tables().await;
}

pub(crate) async fn a_finished_job_frees_its_key<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    // One table deletes finished rows, the other marks them.
    for processed_at in [false, true] {
        let t = unique_table(
            &mut ctx,
            Spec {
                processed_at,
                ..spec()
            },
        )
        .await;
        let mut columns = columns(&t);
        if processed_at {
            columns = columns.processed_at("processed_at");
        }
        let jobs = Queue::table(columns).lease("locked_until");
        let first = jobs
            .enqueue_unique(&ctx.pool, Job::new("1").unique("k"))
            .await
            .unwrap()
            .id();
        let queue = jobs
            .clone()
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        let running = Runner::new(ctx.pool.clone())
            .mount(queue)
            .start()
            .await
            .unwrap();
        let open = if processed_at {
            "processed_at IS NULL"
        } else {
            "1 = 1"
        };
        ctx.wait_none(&t, open, 10).await;
        running.shutdown().await.unwrap();
        let second = jobs
            .enqueue_unique(&ctx.pool, Job::new("2").unique("k"))
            .await
            .unwrap();
        // (SQLite may give the new row the deleted row's id.)
        let Enqueued::New(id) = second else {
            panic!("processed_at {processed_at}: the finished job freed its key: {second:?}");
        };
        assert_eq!(ctx.payload(&t, id).await, b"2");
        assert!(!processed_at || id != first, "the marked row keeps its id");
        let rows = if processed_at { 2 } else { 1 };
        assert_eq!(ctx.count(&t, "1 = 1").await, rows);
    }
    ctx.drop_tables().await;
}

pub(crate) async fn what_a_unique_job_needs_is_said_before_anything_runs<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx, spec()).await;
    let refused = |result: sqlx_queue::Result<Enqueued>, needs: &str| match result {
        Err(Error::InvalidJob { reason, .. }) => {
            assert!(reason.contains(needs), "{reason:?} names {needs}");
        }
        other => panic!("refused for want of {needs}: {other:?}"),
    };
    refused(
        Queue::table(Table::new(&t))
            .lease("locked_until")
            .enqueue_unique(&ctx.pool, Job::new("x").unique("k"))
            .await,
        "Table::unique_key",
    );
    refused(
        Queue::table(
            Table::new(&t)
                .unique_key("dedupe")
                .retry_after("retry_after"),
        )
        .lease("locked_until")
        .enqueue_unique(
            &ctx.pool,
            Job::new("x")
                .unique("k")
                .debounce(Duration::from_secs(1), Duration::from_secs(2)),
        )
        .await,
        "Table::created_at",
    );
    refused(
        table(&t)
            .enqueue_unique(&ctx.pool, Job::new("x").unique("nul\0"))
            .await,
        "NUL",
    );
    // An advisory queue cannot serve it.
    let queue = Queue::table(columns(&t))
        .advisory_lock()
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    match Runner::new(ctx.pool.clone()).mount(queue).start().await {
        Err(Error::Unsupported { reason, .. }) => assert!(reason.contains("advisory"), "{reason}"),
        other => panic!("refused at start: {:?}", other.err()),
    }
    // A key column without a unique index the insert can use (MySQL cannot tell: it has no
    // conflict target, and inserts a second row).
    if DB::LABEL != "mysql" {
        let bare = format!("q_{}", unique());
        ctx.exec(&format!(
            "{}, dedupe {})",
            DB::ddl(&bare, spec()).strip_suffix(')').unwrap(),
            DB::TEXT
        ))
        .await;
        let result = Queue::table(Table::new(&bare).unique_key("dedupe"))
            .lease("locked_until")
            .enqueue_unique(&ctx.pool, Job::new("x").unique("k"))
            .await;
        ctx.exec(&format!("DROP TABLE {bare}")).await;
        match result {
            Err(Error::Schema(e)) => assert!(e.reason.contains("unique index"), "{e}"),
            other => panic!("no unique index: {other:?}"),
        }
    }
    ctx.drop_tables().await;
}
