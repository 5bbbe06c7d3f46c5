// One row never stops a queue: a row whose claim fails for a reason of its own is passed over
// (its value does not decode: settled by the decode policy; its statement fails: held back with a
// growing delay), and a row whose settlement keeps failing is held back likewise, never delivered
// in a hot loop. For one database `DB` and one form `F` (the lease form's lease is 300 ms here);
// `F::COUNTS_AT_TAKE`: the form counts the attempt when it takes the row.

use std::time::Duration;

use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::time::Instant;

use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(poison<$db, $form>:
            a_row_whose_claim_fails_does_not_stop_the_others,
            a_row_that_does_not_decode_is_settled_by_the_decode_policy,
            a_row_whose_settlement_keeps_failing_is_held_back_longer_each_time,
            a_row_whose_dead_letter_move_keeps_failing_is_held_back_longer_each_time,
        );
    };
}
pub(crate) use tests;

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// Refuses any `attempt` above 3 in `t`: a CHECK constraint, or on SQLite (which
/// cannot add one to a table) a trigger.
async fn cap_attempts<DB: TestDb>(ctx: &Ctx<DB>, t: &str) {
    let sql = match DB::LABEL {
        "sqlite" => format!(
            "CREATE TRIGGER {t}_cap BEFORE UPDATE OF attempt ON {t} \
             WHEN NEW.attempt > 3 BEGIN SELECT RAISE(ABORT, 'attempt cap'); END"
        ),
        _ => format!("ALTER TABLE {t} ADD CONSTRAINT {t}_cap CHECK (attempt <= 3)"),
    };
    ctx.exec(&sql).await;
}

pub(crate) async fn a_row_whose_claim_fails_does_not_stop_the_others<DB: TestDb, F: Form<DB>>() {
    if !F::COUNTS_AT_TAKE {
        return; // the row lock form counts at settlement: its claim only reads
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    cap_attempts(&ctx, &t).await;
    // The first row in claim order cannot be counted once more.
    ctx.exec(&format!(
        "INSERT INTO {t} (payload, attempt) VALUES ('stuck', 3)"
    ))
    .await;
    let payloads: Vec<String> = (0..199).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_millis(300))
        .attempt("attempt")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_count(&t, "1 = 1", 1, 60).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&t, "payload = 'stuck' AND attempt = 3").await,
        1,
        "left as it was"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_that_does_not_decode_is_settled_by_the_decode_policy<
    DB: TestDb,
    F: Form<DB>,
>() {
    // Only SQLite stores a value of another type than its column's.
    if DB::LABEL != "sqlite" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!("INSERT INTO {t} (payload) VALUES (42)"))
        .await;
    let payloads: Vec<String> = (0..19).map(|i| format!("job {i}")).collect();
    let batch: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_millis(300))
        .attempt("attempt")
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    // No dead letter: the undecodable row is dropped, as an undecodable JSON payload.
    ctx.wait_none(&t, "1 = 1", 30).await;
    // The counts follow the settlements' commits: wait for them rather than read them at once.
    wait_for(
        "every settlement counted",
        Duration::from_secs(5),
        || async {
            let stats = running.stats();
            stats.acked + stats.dropped >= 20
        },
    )
    .await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    let mut handled = 0;
    while seen.try_recv().is_ok() {
        handled += 1;
    }
    assert_eq!(handled, 19, "the undecodable row never reached the handler");
    assert_eq!((stats.acked, stats.dropped), (19, 1), "{stats:?}");
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_whose_settlement_keeps_failing_is_held_back_longer_each_time<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&DB::refusing(&t, "DELETE")).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    // The lease form's is short: without a hold, it would deliver every 300 ms.
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_millis(300))
        .attempt("attempt")
        .handler(move |_: Delivery<DB>| {
            let _ = tx.send(Instant::now());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    // Every ack fails (its DELETE is refused).
    let deliveries = deliveries_within(&mut seen, Duration::from_millis(3500)).await;
    let failed = running.stats().failed;
    running.shutdown().await.unwrap();
    held_back_longer_each_time(&deliveries);
    assert!(failed >= 2, "{failed}");
    assert_eq!(
        ctx.count(&t, &format!("id = {id}")).await,
        1,
        "the row is kept"
    );
    ctx.drop_tables().await;
}

/// The deliveries seen on `seen` from the first one for `window` after it.
async fn deliveries_within(
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<Instant>,
    window: Duration,
) -> Vec<Instant> {
    let first = recv(seen, "the first delivery", 10).await;
    let end = first + window;
    let mut deliveries = vec![first];
    while let Ok(Some(at)) = tokio::time::timeout_at(end, seen.recv()).await {
        deliveries.push(at);
    }
    deliveries
}

/// Deliveries of 3.5 s of a row held back 1 s, then 2 s (then 4 s): two or three of them, each
/// gap at least the delay before it. A constant 1 s delay would deliver four times, a hot loop
/// hundreds.
fn held_back_longer_each_time(deliveries: &[Instant]) {
    let gaps: Vec<Duration> = deliveries.windows(2).map(|p| p[1] - p[0]).collect();
    assert!(
        (2..=3).contains(&deliveries.len()),
        "1 s, then 2 s between deliveries, not a hot loop: {} deliveries, gaps {gaps:?}",
        deliveries.len()
    );
    for (gap, delay) in gaps.iter().zip([900, 1800]) {
        assert!(
            *gap >= Duration::from_millis(delay),
            "the hold grows (1 s, 2 s): gaps {gaps:?}"
        );
    }
}

pub(crate) async fn a_row_whose_dead_letter_move_keeps_failing_is_held_back_longer_each_time<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let dead = ctx.table(Spec::lease()).await;
    // The dead-letter table passes the checks at start, then refuses every row moved to it.
    ctx.exec(&DB::refusing(&dead, "INSERT")).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply_leasing(Queue::table(jobs(&t)), Duration::from_millis(300))
        .attempt("attempt")
        .max_attempts(1)
        .dead_letter(DeadLetter::table(&dead))
        .handler(move |_: Delivery<DB>| {
            let _ = tx.send(Instant::now());
            // At the cap: the settlement is the move, which fails.
            async { Outcome::retry() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    // A form that counts the attempt at its claim moves the row at its next claim without a
    // delivery (its attempt is past the cap): the handler sees it once, and the moves that
    // fail are counted instead.
    let deliveries = deliveries_within(&mut seen, Duration::from_millis(3500)).await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    if F::COUNTS_AT_TAKE {
        assert!(
            deliveries.len() <= 3,
            "{} deliveries of a row past its cap",
            deliveries.len()
        );
    } else {
        held_back_longer_each_time(&deliveries);
    }
    assert!(
        (2..=3).contains(&stats.failed),
        "moves that fail are spaced 1 s, then 2 s, not a hot loop: {stats:?}"
    );
    assert_eq!(
        ctx.count(&t, &format!("id = {id}")).await,
        1,
        "the row is kept"
    );
    assert_eq!(ctx.count(&dead, "1 = 1").await, 0, "nothing moved");
    ctx.drop_tables().await;
}
