//! Unique enqueues on a pool under contention are answered, never failed for a deadlock: bulk
//! enqueues insert their keys in one order (the same 8 keys given in different orders by four
//! tasks deadlocked on PostgreSQL in 5–19 of 120–240 calls before), and the crate runs its own
//! transaction again when the database ends it for a deadlock (MariaDB's replaces beside a
//! runner failed 8–17 of 1,200 calls with 1213 before).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Runner};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::support::{Ctx, TestDb, report};
use crate::{jobs, unique_table};

/// 60 rounds of four tasks enqueueing the same 8 fresh keys at once with
/// `enqueue_many_unique` on the pool, each in an order of its own. Each round: no error, each
/// key has one row, and exactly one task made it.
pub(crate) async fn bulk_enqueues_of_one_key_set_in_any_order_all_succeed<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx).await;
    let table = jobs(&t);
    for round in 0..60 {
        let keys: Vec<String> = (0..8).map(|k| format!("r{round}-k{k}")).collect();
        let start = Arc::new(Barrier::new(4));
        let mut tasks = JoinSet::new();
        for task in 0..4usize {
            let (pool, table, start) = (ctx.pool.clone(), table.clone(), Arc::clone(&start));
            // Task 0 in order, 1 reversed, 2 and 3 rotated.
            let mut order = keys.clone();
            match task {
                1 => order.reverse(),
                2 => order.rotate_left(3),
                3 => order.rotate_left(5),
                _ => {}
            }
            tasks.spawn(async move {
                let batch: Vec<_> = order
                    .iter()
                    .map(|key| Job::new("x").unique(key.clone()))
                    .collect();
                start.wait().await;
                let done = table.enqueue_many_unique(&pool, &batch).await;
                (order, done.map_err(|e| e.to_string()))
            });
        }
        let mut made: HashMap<String, usize> = HashMap::new();
        while let Some(done) = tasks.join_next().await {
            let (order, done) = done.unwrap();
            let done = done.unwrap_or_else(|e| panic!("round {round}: {e}"));
            for (key, told) in order.iter().zip(done) {
                if matches!(told, Enqueued::New(_)) {
                    *made.entry(key.clone()).or_default() += 1;
                }
            }
        }
        for key in &keys {
            assert_eq!(made.get(key), Some(&1), "round {round}: {key} made once");
            assert_eq!(ctx.count(&t, &format!("dedupe = '{key}'")).await, 1);
        }
    }
    ctx.drop_tables().await;
}

/// Eight tasks each replace a job of one of four keys 150 times on the pool, beside a lease
/// runner that takes and acks the jobs: no call fails, and each is answered what it did.
pub(crate) async fn replaces_beside_a_runner_all_succeed<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = unique_table(&mut ctx).await;
    let table = jobs(&t);
    let queue = table
        .clone()
        .workers(4)
        .handler(|d: Delivery<DB>| async move {
            tokio::time::sleep(Duration::from_millis(u64::try_from(d.id() % 3).unwrap())).await;
            Outcome::ack()
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let mut tasks = JoinSet::new();
    for task in 0..8 {
        let (pool, table) = (ctx.pool.clone(), table.clone());
        tasks.spawn(async move {
            let mut told: HashMap<&'static str, usize> = HashMap::new();
            for call in 0..150 {
                let key = format!("key-{}", (task + call) % 4);
                let payload = format!("{task}-{call}");
                let job = Job::new(&payload).unique(key).replace();
                let name = match table.enqueue_unique(&pool, job).await {
                    Ok(Enqueued::New(_)) => "New",
                    Ok(Enqueued::Replaced(_)) => "Replaced",
                    Ok(Enqueued::InWork(_)) => "InWork",
                    Ok(other) => panic!("a replace told {other:?}"),
                    Err(error) => panic!("task {task}, call {call}: {error}"),
                };
                *told.entry(name).or_default() += 1;
            }
            told
        });
    }
    let mut told: HashMap<&'static str, usize> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (name, n) in done.unwrap() {
            *told.entry(name).or_default() += n;
        }
    }
    ctx.wait_none(&t, "1 = 1", 30).await;
    running.shutdown().await.unwrap();
    report(&format!(
        "unique replaces beside a runner, {}: 1200 calls, {told:?}",
        DB::LABEL
    ));
    assert_eq!(told.values().sum::<usize>(), 1200);
    ctx.drop_tables().await;
}
