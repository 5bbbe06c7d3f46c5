//! Rows the lease form claims ahead of its workers wait for one without their lease being
//! renewed: a row that waits past its lease is taken by another runner's claim, which counts
//! its attempt once more, and the first runner's claim, which counted it too, never delivers it.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};
use tokio::sync::Semaphore;

use crate::support::{Ctx, Spec, TestDb, recv};

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
