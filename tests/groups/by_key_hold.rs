//! `by_key`: what a key's rows waiting for its worker hold, and how they go back — at
//! shutdown, and (lease form) at half their lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

use crate::by_key::{BOUND, enqueue};
use crate::support::{Ctx, Form, Spec, TestDb, wait_for};

/// One key's 10 rows on 2 workers: its first row in work, the rows claimed after it wait in its
/// lane; shutdown cancels the first and releases all of them unsettled, their attempts as they
/// were (the cancelled one's counted where its form counts at the take).
pub(crate) async fn rows_waiting_for_their_key_are_released_at_shutdown<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    enqueue(&ctx, &t, std::iter::repeat_n(0, 10)).await;
    let started = Arc::new(AtomicUsize::new(0));
    let handler = {
        let started = Arc::clone(&started);
        move |d: Delivery<DB>| {
            let started = Arc::clone(&started);
            async move {
                started.fetch_add(1, Ordering::SeqCst);
                // Until the shutdown timeout cancels it.
                let _ = tokio::time::timeout(BOUND, d.cancelled()).await;
                Outcome::ack()
            }
        }
    };
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler);
    let pool = ctx.pool(4).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .shutdown_timeout(Duration::from_millis(200))
        .mount(queue)
        .start()
        .await
        .unwrap();
    // The lease and plain advisory forms claim every row (16 in hand per worker); the row lock
    // form a row per worker (its connections).
    let waiting = if F::NAME == "row_lock" { 2 } else { 10 };
    wait_for("the rows claimed for the busy key", BOUND, || async {
        running.stats().claimed >= waiting && started.load(Ordering::SeqCst) == 1
    })
    .await;
    let report = running.shutdown().await.unwrap();
    pool.close().await;
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "one row of the key started"
    );
    assert_eq!(
        (report.cancelled, report.released, report.unreleased),
        (1, waiting, 0),
        "the row in work cancelled, every row claimed released: {report:?}"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 10, "no row settled");
    let counted = i64::from(F::COUNTS_AT_TAKE);
    assert_eq!(
        ctx.count(&t, "attempt = 1").await,
        10 - counted,
        "only a cancelled take keeps its attempt"
    );
    if F::NAME == "lease" {
        assert_eq!(
            ctx.count(&t, "locked_until IS NOT NULL").await,
            0,
            "no lease left"
        );
    }
    ctx.drop_tables().await;
}

/// The lease form, a lease of 300 ms: one key's 60 rows — more than the queue keeps in hand,
/// so its claims are full — wait in its lane behind a first row of 1.2 s; each is given back at
/// half its lease and claimed again, its attempt uncounted, so every row runs once, in id
/// order, on its first attempt. Without the give-back their leases would expire in the lane,
/// and each claim after would count an attempt more; with a claim floor, the claim after a
/// give-back would start at the last full claim's smallest id, past rows given back.
pub(crate) async fn a_row_waiting_past_half_its_lease_goes_back_uncounted<DB: TestDb>() {
    const ROWS: usize = 60;
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    enqueue(&ctx, &t, std::iter::repeat_n(0, ROWS)).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let runs = Arc::clone(&runs);
        move |d: Delivery<DB>| {
            let runs = Arc::clone(&runs);
            async move {
                let first = runs.lock().unwrap().is_empty();
                runs.lock().unwrap().push((d.id(), d.attempt()));
                if first {
                    // The first row's work: its rows after it wait four leases.
                    tokio::time::sleep(Duration::from_millis(1200)).await;
                }
                Outcome::ack()
            }
        }
    };
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let queue = Queue::table(table)
        .lease("locked_until")
        .lease_duration(Duration::from_millis(300))
        .attempt("attempt")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler);
    let pool = ctx.pool(4).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for("every row to be handled", BOUND, || async {
        ctx.count(&t, "1 = 1").await == 0
    })
    .await;
    let claimed = running.stats().claimed;
    running.shutdown().await.unwrap();
    pool.close().await;
    let runs = runs.lock().unwrap().clone();
    let ids: Vec<i64> = runs.iter().map(|(id, _)| *id).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "each row once, in id order");
    assert_eq!(ids.len(), ROWS);
    assert!(
        runs.iter().all(|(_, attempt)| *attempt == 1),
        "a row given back kept its attempt: {runs:?}"
    );
    assert!(
        claimed > ROWS as u64,
        "the waiting rows were given back and claimed again"
    );
    ctx.drop_tables().await;
}
