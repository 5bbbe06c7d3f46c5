// Enqueueing through the table description: in the caller's transaction, in bulk, delayed,
// byte for byte.

use std::time::Duration;

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(enqueue<$db>:
            a_job_commits_or_rolls_back_with_the_callers_transaction,
            payloads_round_trip_byte_for_byte,
            enqueue_many_inserts_every_job_in_bulk,
            a_delayed_job_waits_for_its_time,
            jobs_the_table_cannot_hold_are_refused,
            counts_tell_ready_delayed_in_work_and_dead_rows_apart,
        );
    };
}
pub(crate) use tests;

pub(crate) async fn a_job_commits_or_rolls_back_with_the_callers_transaction<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t);

    let mut tx = ctx.pool.begin().await.unwrap();
    DB::enqueue_on(&mut *tx, &jobs, Job::new("rolled back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);

    let mut tx = ctx.pool.begin().await.unwrap();
    let id = DB::enqueue_on(&mut *tx, &jobs, Job::new("committed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ctx.count(&t, &format!("id = {id}")).await, 1);
    assert_eq!(ctx.payload(&t, id).await, b"committed");
    ctx.drop_tables().await;
}

pub(crate) async fn payloads_round_trip_byte_for_byte<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t);
    let payloads: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0xff, 0x00, 0xfe, 0x80, 0x27, 0x5c],
        "héllo ✉".as_bytes().to_vec(),
        (0..=255u8).cycle().take(1 << 20).collect(),
    ];
    let mut ids = Vec::new();
    for payload in &payloads {
        ids.push(
            DB::enqueue(&ctx.pool, &jobs, Job::new(payload))
                .await
                .unwrap(),
        );
    }
    for (id, payload) in ids.iter().zip(&payloads) {
        assert_eq!(&ctx.payload(&t, *id).await, payload, "stored as given");
    }
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs)
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.into_payload()));
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    for (id, payload) in ids.iter().zip(&payloads) {
        let (got_id, got) = recv(&mut seen, "a delivery", 20).await;
        assert_eq!(got_id, *id, "in id order");
        assert!(
            got == *payload,
            "row {id}: delivered {} bytes as given",
            got.len()
        );
    }
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn enqueue_many_inserts_every_job_in_bulk<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let jobs = Table::new(&t).group("queue").retry_after("retry_after");
    assert_eq!(
        Queue::table(jobs.clone()).max_batch(),
        10_000,
        "three values a job"
    );
    let payloads: Vec<String> = (0..10_001).map(|i| format!("{i}")).collect();
    let batch: Vec<Job<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let job = Job::new(p).group(if i % 2 == 0 { "even" } else { "odd" });
            if i % 5 == 0 {
                job.delay(Duration::from_secs(3600))
            } else {
                job
            }
        })
        .collect();
    let too_many = DB::enqueue_many(&ctx.pool, &jobs, &batch).await;
    assert!(
        matches!(too_many, Err(Error::InvalidJob { .. })),
        "{too_many:?}"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "nothing inserted");
    let batch = &batch[..10_000];
    let mut tx = ctx.pool.begin().await.unwrap();
    assert_eq!(
        DB::enqueue_many_on(&mut *tx, &jobs, batch).await.unwrap(),
        10_000
    );
    tx.commit().await.unwrap();
    assert_eq!(ctx.count(&t, "queue = 'even'").await, 5_000);
    assert_eq!(ctx.count(&t, "retry_after IS NOT NULL").await, 2_000);
    assert_eq!(DB::enqueue_many(&ctx.pool, &jobs, &[]).await.unwrap(), 0);
    ctx.drop_tables().await;
}

pub(crate) async fn a_delayed_job_waits_for_its_time<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    let soon = DB::enqueue(
        &ctx.pool,
        &jobs,
        Job::new("soon").delay(Duration::from_millis(600)),
    )
    .await
    .unwrap();
    let later = DB::enqueue(
        &ctx.pool,
        &jobs,
        Job::new("later").delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let now = DB::enqueue(&ctx.pool, &jobs, Job::new("now"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs)
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let started = tokio::time::Instant::now();
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the undelayed job", 10).await, now);
    assert_eq!(recv(&mut seen, "the job due soon", 10).await, soon);
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "not before its time"
    );
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&t, &format!("id = {later}")).await,
        1,
        "the later job waits"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn jobs_the_table_cannot_hold_are_refused<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let grouped = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let plain = ctx
        .table(Spec {
            retry_after: false,
            ..Spec::lease()
        })
        .await;
    let no_group = DB::enqueue(
        &ctx.pool,
        &Table::new(&grouped).group("queue"),
        Job::new("x"),
    )
    .await;
    assert!(
        matches!(no_group, Err(Error::InvalidJob { .. })),
        "{no_group:?}"
    );
    let stray_group = DB::enqueue(&ctx.pool, &Table::new(&plain), Job::new("x").group("g")).await;
    assert!(
        matches!(stray_group, Err(Error::InvalidJob { .. })),
        "{stray_group:?}"
    );
    let delay = DB::enqueue(
        &ctx.pool,
        &Table::new(&plain),
        Job::new("x").delay(Duration::from_secs(1)),
    )
    .await;
    assert!(matches!(delay, Err(Error::InvalidJob { .. })), "{delay:?}");
    assert_eq!(
        ctx.count(&grouped, "1 = 1").await + ctx.count(&plain, "1 = 1").await,
        0
    );
    ctx.drop_tables().await;
}

pub(crate) async fn counts_tell_ready_delayed_in_work_and_dead_rows_apart<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    for _ in 0..3 {
        DB::enqueue(&ctx.pool, &table, Job::new("ready").group("mail"))
            .await
            .unwrap();
    }
    let hour = Duration::from_secs(3600);
    DB::enqueue(
        &ctx.pool,
        &table,
        Job::new("delayed").group("mail").delay(hour),
    )
    .await
    .unwrap();
    DB::enqueue(&ctx.pool, &table, Job::new("dead").group("mail_dead"))
        .await
        .unwrap();
    DB::enqueue(&ctx.pool, &table, Job::new("other").group("sms"))
        .await
        .unwrap();
    let dead = sqlx_queue::DeadLetter::group("mail_dead");
    let mail = Queue::table(table.clone())
        .named("mail")
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(5)
        .dead_letter(dead);
    let counts = mail.counts(&ctx.pool).await.unwrap();
    assert_eq!(
        (counts.ready, counts.delayed, counts.in_work, counts.dead),
        (3, 1, 0, 1)
    );
    // One row in work under a live lease.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = mail.clone().handler({
        let gate = std::sync::Arc::clone(&gate);
        move |d: Delivery<DB>| {
            let (gate, tx) = (std::sync::Arc::clone(&gate), tx.clone());
            async move {
                let _ = tx.send(d.id());
                let _permit = gate.acquire().await;
                Outcome::retry()
            }
        }
    });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    recv(&mut seen, "a delivery in work", 10).await;
    // The two other ready rows are claimed ahead of the one worker: held as a delivery is.
    wait_for(
        "the rows claimed ahead",
        Duration::from_secs(10),
        || async { mail.counts(&ctx.pool).await.unwrap().in_work == 3 },
    )
    .await;
    let counts = mail.counts(&ctx.pool).await.unwrap();
    assert_eq!((counts.ready, counts.in_work), (0, 3), "{counts:?}");
    gate.add_permits(1000);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
