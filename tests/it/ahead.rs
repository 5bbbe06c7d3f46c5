// Rows a lease queue claims ahead of its workers: they start in claim order as workers free up,
// a row whose lease was lost while it waited is not delivered, and rows still waiting when the
// runner stops go back as they were, their attempt uncounted.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Notify, Semaphore};

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(ahead<$db>:
            rows_claimed_ahead_start_in_claim_order_as_the_worker_frees,
            a_row_whose_lease_was_lost_while_it_waited_is_not_delivered,
            rows_waiting_at_shutdown_go_back_with_their_attempt_uncounted,
            a_row_that_waited_past_its_lease_is_delivered_on_its_first_attempt,
        );
    };
}
pub(crate) use tests;

const ROWS: usize = 4;

/// One worker whose first delivery waits for `go`; every delivery's id is recorded in `seen`.
struct Gate {
    seen: Arc<Mutex<Vec<i64>>>,
    go: Arc<Notify>,
}

impl Gate {
    fn new() -> Self {
        Gate {
            seen: Arc::default(),
            go: Arc::new(Notify::new()),
        }
    }

    fn seen(&self) -> Vec<i64> {
        self.seen.lock().unwrap().clone()
    }

    async fn start<DB: TestDb>(
        &self,
        ctx: &Ctx<DB>,
        table: &str,
        lease: Duration,
    ) -> sqlx_queue::Running {
        let (seen, go) = (Arc::clone(&self.seen), Arc::clone(&self.go));
        let queue = Queue::table(Table::new(table))
            .lease("locked_until")
            .lease_duration(lease)
            .attempt("attempt")
            .handler(move |d: Delivery<DB>| {
                let first = {
                    let mut seen = seen.lock().unwrap();
                    seen.push(d.id());
                    seen.len() == 1
                };
                let go = Arc::clone(&go);
                async move {
                    if first {
                        go.notified().await;
                    }
                    Outcome::ack()
                }
            });
        Runner::new(ctx.pool.clone())
            .poll_interval(Duration::from_millis(50))
            .mount(queue)
            .start()
            .await
            .unwrap()
    }

    /// Waits until the first delivery is in its handler and the other rows are claimed ahead
    /// of the one worker (their lease taken, their attempt counted).
    async fn wait_ahead<DB: TestDb>(&self, ctx: &Ctx<DB>, table: &str) {
        wait_for("the first row in work", Duration::from_secs(10), || async {
            self.seen().len() == 1
        })
        .await;
        let ahead = "locked_until IS NOT NULL AND attempt = 2";
        ctx.wait_count(table, ahead, ROWS as i64, 10).await;
    }
}

async fn fill<DB: TestDb>(ctx: &Ctx<DB>, table: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    for i in 0..ROWS {
        let payload = format!("job {i}");
        let job = Job::new(&payload);
        ids.push(
            DB::enqueue(&ctx.pool, &Table::new(table), job)
                .await
                .unwrap(),
        );
    }
    ids
}

pub(crate) async fn rows_claimed_ahead_start_in_claim_order_as_the_worker_frees<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let ids = fill(&ctx, &t).await;
    let gate = Gate::new();
    let running = gate.start(&ctx, &t, Duration::from_secs(30)).await;

    gate.wait_ahead(&ctx, &t).await;
    assert_eq!(gate.seen(), ids[..1], "one worker, one row in work");
    gate.go.notify_one();
    ctx.wait_none(&t, "1 = 1", 10).await;
    assert_eq!(gate.seen(), ids, "each row once, in claim order");
    let stats = running.shutdown().await.unwrap();
    assert_eq!(stats.released, 0, "{stats:?}");
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_whose_lease_was_lost_while_it_waited_is_not_delivered<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let ids = fill(&ctx, &t).await;
    let gate = Gate::new();
    // Long enough for the steal below to come before half of it.
    let lease = Duration::from_secs(2);
    let running = gate.start(&ctx, &t, lease).await;

    gate.wait_ahead(&ctx, &t).await;
    // Another claim takes the second row while it waits, as one would once its lease expired.
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = {}", ids[1]);
    ctx.exec_time(&steal, later_claim).await;
    // At half their lease the rows waiting go back, uncounted: all but the one claimed
    // elsewhere, whose release finds another token.
    let back = "locked_until IS NULL AND attempt = 1";
    ctx.wait_count(&t, back, ROWS as i64 - 2, 10).await;
    gate.go.notify_one();

    ctx.wait_count(&t, "1 = 1", 1, 10).await;
    let mut delivered = ids.clone();
    delivered.remove(1);
    assert_eq!(
        gate.seen(),
        delivered,
        "the row claimed elsewhere was delivered"
    );
    let stolen = format!(
        "id = {} AND locked_until IS NOT NULL AND attempt = 2",
        ids[1]
    );
    assert_eq!(
        ctx.count(&t, &stolen).await,
        1,
        "the other claim's row was touched"
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn rows_waiting_at_shutdown_go_back_with_their_attempt_uncounted<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let ids = fill(&ctx, &t).await;
    let gate = Gate::new();
    let running = gate.start(&ctx, &t, Duration::from_secs(30)).await;

    gate.wait_ahead(&ctx, &t).await;
    let stopping = tokio::spawn(running.shutdown());
    // The rows waiting for the worker are released while the first one is still in work.
    let back = "locked_until IS NULL AND attempt = 1";
    ctx.wait_count(&t, back, ROWS as i64 - 1, 10).await;
    gate.go.notify_one();
    let stats = stopping.await.unwrap().unwrap();
    assert_eq!((stats.in_work, stats.released), (1, 3), "{stats:?}");
    ctx.wait_count(&t, "1 = 1", ROWS as i64 - 1, 10).await;
    assert_eq!(ctx.count(&t, back).await, ROWS as i64 - 1);
    assert_eq!(
        gate.seen(),
        ids[..1],
        "a row delivered after shutdown began"
    );
    ctx.drop_tables().await;
}

/// Rows the lease form claims ahead of a worker that turns slow go back, their attempt
/// uncounted, once they waited half their lease: another runner takes them on their first
/// attempt (before, their lease expired while they waited, and the other runner's claim counted
/// their attempt a second time), and the first runner delivers none of them.
pub(crate) async fn a_row_that_waited_past_its_lease_is_delivered_on_its_first_attempt<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    for payload in ["first", "r2", "r3", "r4"] {
        ctx.exec(&format!("INSERT INTO {t} (payload) VALUES ('{payload}')"))
            .await;
    }
    let lease = Duration::from_millis(400);
    // Runner A, one worker: before any delivery it claims three rows ahead with the first,
    // whose handler then waits for the gate.
    let gate = Arc::new(Semaphore::new(0));
    let (a_tx, mut a_seen) = tokio::sync::mpsc::unbounded_channel();
    let a_gate = Arc::clone(&gate);
    let a = Queue::table(Table::new(&t))
        .lease("locked_until")
        .lease_duration(lease)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let payload = String::from_utf8_lossy(d.payload()).into_owned();
            let gate = Arc::clone(&a_gate);
            let _ = a_tx.send((payload.clone(), d.attempt()));
            async move {
                if payload == "first" {
                    gate.acquire().await.expect("never closed").forget();
                }
                Outcome::ack()
            }
        });
    let a = Runner::new(ctx.pool.clone())
        .mount(a)
        .start()
        .await
        .unwrap();
    assert_eq!(
        recv(&mut a_seen, "runner A's first delivery", 30).await,
        ("first".to_owned(), 1)
    );
    // Runner B takes the rows waiting in A once their lease expired.
    let (b_tx, mut b_seen) = tokio::sync::mpsc::unbounded_channel();
    let b = Queue::table(Table::new(&t))
        .lease("locked_until")
        .lease_duration(lease)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let payload = String::from_utf8_lossy(d.payload()).into_owned();
            let _ = b_tx.send((payload, d.attempt()));
            async { Outcome::ack() }
        });
    let b = Runner::new(ctx.pool(4).await)
        .poll_interval(Duration::from_millis(20))
        .mount(b)
        .start()
        .await
        .unwrap();
    let mut by_b = Vec::new();
    for _ in 0..3 {
        by_b.push(
            recv(
                &mut b_seen,
                "runner B's deliveries of the rows A waited with",
                30,
            )
            .await,
        );
    }
    gate.add_permits(1);
    ctx.wait_none(&t, "1 = 1", 30).await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    let mut by_a = Vec::new();
    while let Ok(seen) = a_seen.try_recv() {
        by_a.push(seen);
    }
    assert!(by_a.is_empty(), "A delivered no row B took: {by_a:?}");
    by_b.sort();
    let once: Vec<(String, u32)> = ["r2", "r3", "r4"]
        .iter()
        .map(|p| ((*p).to_owned(), 1))
        .collect();
    assert_eq!(by_b, once, "each row delivered once, on its first attempt");
    ctx.drop_tables().await;
}
