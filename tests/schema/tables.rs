//! Jobs through the other tables `Schema` creates: text and JSON payload columns, a limiter
//! table, a cancel requests' table, a schedules table.

use std::time::Duration;

use sqlx_queue::{
    Cancellation, Delivery, Job, Outcome, PayloadType, Queue, Runner, Schedule, Table,
};
use tokio::sync::mpsc;

use crate::support::{Ctx, TestDb, recv};
use crate::{create, drop_all, name};

const POLL: Duration = Duration::from_millis(50);

/// A text, a JSON and a JSONB payload column each take a JSON job and hand it back.
pub(crate) async fn text_and_json_payloads_round_trip<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let mut tables = Vec::new();
    for ty in [PayloadType::Text, PayloadType::Json, PayloadType::Jsonb] {
        let t = name();
        let queue =
            Queue::table(Table::new(&t).payload("body").payload_type(ty)).lease("locked_until");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let runner =
            Runner::new(ctx.pool.clone())
                .poll_interval(POLL)
                .mount(queue.clone().handler(move |d: Delivery<DB>| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(d.payload().to_vec());
                        Outcome::ack()
                    }
                }));
        create(&ctx, &runner.schema().unwrap()).await;
        queue
            .enqueue(&ctx.pool, Job::new(r#"{"to": "alice", "n": 1}"#))
            .await
            .unwrap();
        let running = runner.start().await.unwrap();
        let got = recv(&mut rx, "the JSON job", 20).await;
        let got: serde_json::Value = serde_json::from_slice(&got).unwrap();
        assert_eq!(got, serde_json::json!({"to": "alice", "n": 1}), "{ty:?}");
        ctx.wait_none(&t, "1 = 1", 20).await;
        running.shutdown().await.unwrap();
        tables.push(t);
    }
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    drop_all(ctx, &tables).await;
}

/// A rate-limited queue on a created limiter table: its row is made at start, its jobs run.
pub(crate) async fn a_rate_limited_queue_on_its_created_limiter<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, limits) = (name(), name());
    let queue = Queue::table(Table::new(&t).limits(&limits))
        .lease("locked_until")
        .rate_limit(sqlx_queue::RateLimit::new(100, Duration::from_secs(1)));
    let runner = Runner::new(ctx.pool.clone()).poll_interval(POLL).mount(
        queue
            .clone()
            .handler(|_: Delivery<DB>| async { Outcome::ack() }),
    );
    let schema = runner.schema().unwrap();
    assert_eq!(schema.statements().len(), 2, "{schema}");
    create(&ctx, &schema).await;
    for n in 0..5 {
        queue
            .enqueue(&ctx.pool, Job::from_vec(vec![n]))
            .await
            .unwrap();
    }
    let running = runner.start().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 20).await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&limits, "granted >= 0").await, 1);
    drop_all(ctx, &[&t, &limits]).await;
}

/// An advisory queue's job in work, cancelled through the created requests' table: the request
/// is recorded, the handler told, the row removed, the request removed after it.
pub(crate) async fn a_cancel_request_reaches_a_job_in_work<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, cancels) = (name(), name());
    let queue = Queue::table(Table::new(&t).cancel_requests(&cancels)).advisory_lock();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runner = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(queue.clone().handler(move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(("started", d.id()));
                d.cancelled().await;
                let _ = tx.send(("cancelled", d.id()));
                Outcome::ack()
            }
        }));
    create(&ctx, &runner.schema().unwrap()).await;
    let id = queue.enqueue(&ctx.pool, Job::new("long")).await.unwrap();
    let running = runner.start().await.unwrap();
    assert_eq!(recv(&mut rx, "the start", 20).await, ("started", id));
    let answer = queue.cancel(&ctx.pool, id).await.unwrap();
    assert_eq!(answer, Cancellation::Requested(id));
    assert_eq!(
        recv(&mut rx, "the cancellation", 20).await,
        ("cancelled", id)
    );
    ctx.wait_none(&t, "1 = 1", 20).await;
    ctx.wait_none(&cancels, "1 = 1", 20).await;
    running.shutdown().await.unwrap();
    drop_all(ctx, &[&t, &cancels]).await;
}

/// A schedule on a created job table (its unique key and index) and schedules table, with a
/// queue serving the table: ticks are recorded and their jobs run.
pub(crate) async fn a_schedule_ticks_into_its_created_tables<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, schedules) = (name(), name());
    let jobs = Table::new(&t).unique_key("dedupe");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs.clone())
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(d.payload().to_vec());
                Outcome::ack()
            }
        });
    let every = Schedule::every(Duration::from_millis(200));
    let runner = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .schedules_table(&schedules)
        .schedule("tick", every, jobs, |tick| {
            Job::from_vec(tick.to_rfc3339().into_bytes())
        })
        .mount(queue);
    let schema = runner.schema().unwrap();
    let creates = schema
        .statements()
        .iter()
        .filter(|s| s.starts_with("CREATE TABLE"))
        .count();
    assert_eq!(creates, 2, "{schema}");
    create(&ctx, &schema).await;
    let running = runner.start().await.unwrap();
    for _ in 0..2 {
        let tick = recv(&mut rx, "a tick's job", 20).await;
        assert!(String::from_utf8_lossy(&tick).contains('T'));
    }
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&schedules, "name = 'tick'").await, 1);
    drop_all(ctx, &[&t, &schedules]).await;
}
