// Batches, for one database `DB` and one form `F`. `F::ALL_OR_NOTHING` (row lock): the form
// settles a batch in one transaction, all or nothing.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(batch<$db, $form>:
            rows_arrive_together_and_each_settles_by_its_outcome,
            a_batch_never_waits_to_be_full,
            a_failed_settlement_in_a_batch,
            a_row_that_cannot_be_counted_does_not_hold_back_its_batch,
            a_batch_of_acks_is_one_statement_on_postgres,
            concurrent_batches_drain_without_a_rollback,
            a_batch_larger_than_a_statement_takes_each_row_once,
        );
    };
}
pub(crate) use tests;

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// The outcome of a row, by its payload.
fn outcome_of(payload: &[u8], attempt: u32) -> Outcome {
    match (payload, attempt) {
        (b"ack", _) => Outcome::ack(),
        (b"drop", _) => Outcome::drop(),
        (b"retry", 1) => Outcome::retry(),
        (b"retry", _) => Outcome::ack(),
        (b"later", _) => Outcome::retry_after(Duration::from_secs(3600)),
        _ => Outcome::retry(),
    }
}

pub(crate) async fn rows_arrive_together_and_each_settles_by_its_outcome<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let kinds = ["ack", "drop", "retry", "later"];
    let batch: Vec<Job<'_>> = (0..10).map(|i| Job::new(kinds[i % 4])).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(4)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            let _ = tx.send(
                batch
                    .iter()
                    .map(|d| (d.id(), d.attempt()))
                    .collect::<Vec<_>>(),
            );
            let outcomes = batch
                .iter()
                .map(|d| outcome_of(d.payload(), d.attempt()))
                .collect();
            async move { outcomes }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let first = recv(&mut seen, "the first batch", 10).await;
    assert_eq!(first.len(), 4, "a full batch: {first:?}");
    assert!(first.iter().all(|(_, attempt)| *attempt == 1));
    // 10 rows: 3 ack, 3 drop (deleted); 2 retry (again, then ack); 2 later (kept).
    ctx.wait_count(&t, "1 = 1", 2, 10).await;
    ctx.wait_count(&t, "retry_after IS NOT NULL AND attempt = 2", 2, 10)
        .await;
    running.shutdown().await.unwrap();
    let mut delivered = 0;
    while let Ok(batch) = seen.try_recv() {
        assert!(batch.len() <= 4);
        delivered += batch.len();
    }
    assert_eq!(first.len() + delivered, 12, "10 rows, 2 of them twice");
    ctx.drop_tables().await;
}

pub(crate) async fn a_batch_never_waits_to_be_full<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("ack"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t))).batch(16).batch_handler(
        move |batch: Vec<Delivery<DB>>| {
            let _ = tx.send(batch.iter().map(|d| d.id()).collect::<Vec<_>>());
            async move { batch.iter().map(|_| Outcome::ack()).collect() }
        },
    );
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "a batch of one", 10).await, vec![id]);
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_failed_settlement_in_a_batch<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&DB::refusing(&t, "DELETE")).await;
    let retried = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("retry"))
        .await
        .unwrap();
    let acked = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("ack"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    // Later batches wait here, so the rows are read as the first batch left them
    // (its failed row is held back; the retried one comes again at once).
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let batches = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(2)
        .batch_handler({
            let gate = std::sync::Arc::clone(&gate);
            move |batch: Vec<Delivery<DB>>| {
                let _ = tx.send(batch.len());
                let later = batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0;
                // The retry updates its row; the ack's DELETE then fails.
                let outcomes: Vec<Outcome> =
                    batch.iter().map(|d| outcome_of(d.payload(), 1)).collect();
                let gate = std::sync::Arc::clone(&gate);
                async move {
                    if later {
                        let _ = gate.acquire().await;
                    }
                    outcomes
                }
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the batch", 10).await, 2);
    wait_for(
        "the failed settlement counted",
        Duration::from_secs(10),
        || async { running.stats().failed >= 1 },
    )
    .await;
    // Row lock: one transaction, rolled back whole — the retry's attempt is not
    // counted. Lease and advisory: the retry settled on its own (the take or the
    // claim counted the attempt).
    let retry_row = if F::ALL_OR_NOTHING {
        format!("id = {retried} AND attempt = 1")
    } else {
        format!("id = {retried} AND attempt >= 2")
    };
    assert_eq!(ctx.count(&t, &retry_row).await, 1, "the retried row");
    assert_eq!(
        ctx.count(&t, &format!("id = {acked}")).await,
        1,
        "the ack failed"
    );
    gate.add_permits(1000);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// A batch with a row whose attempt cannot be counted once more (a CHECK constraint; a trigger on
/// SQLite): where a batch settles or re-reads its rows with one statement, that statement fails
/// for every row of it. The others must settle all the same, and the row be held back, not
/// taken again in a hot loop.
pub(crate) async fn a_row_that_cannot_be_counted_does_not_hold_back_its_batch<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let cap = match DB::LABEL {
        "sqlite" => format!(
            "CREATE TRIGGER {t}_cap BEFORE UPDATE OF attempt ON {t} \
             WHEN NEW.attempt > 3 BEGIN SELECT RAISE(ABORT, 'attempt cap'); END"
        ),
        _ => format!("ALTER TABLE {t} ADD CONSTRAINT {t}_cap CHECK (attempt <= 3)"),
    };
    ctx.exec(&cap).await;
    let batch: Vec<Job<'_>> = (0..3).map(|_| Job::new("ack")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    // In the middle of the claim order; the row lock form counts it when it settles its retry.
    ctx.exec(&format!(
        "INSERT INTO {t} (payload, attempt) VALUES ('stuck', 3)"
    ))
    .await;
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let stuck_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(8)
        .batch_handler({
            let stuck_seen = std::sync::Arc::clone(&stuck_seen);
            move |batch: Vec<Delivery<DB>>| {
                let outcomes: Vec<Outcome> = batch
                    .iter()
                    .map(|d| match d.payload() {
                        b"stuck" => {
                            stuck_seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            Outcome::retry()
                        }
                        _ => Outcome::ack(),
                    })
                    .collect();
                async move { outcomes }
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "payload <> 'stuck'", 10).await;
    // Held back for 1 s, then 2 s: within the next 1.5 s the row comes at most once more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let seen = stuck_seen.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        seen <= 3,
        "the stuck row reached the handler {seen} times in about 2 s"
    );
    assert_eq!(ctx.count(&t, "payload = 'stuck' AND attempt = 3").await, 1);
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// On PostgreSQL every form settles a batch's acks with one statement, not one per row: a
/// statement-level trigger counts the `DELETE`s.
pub(crate) async fn a_batch_of_acks_is_one_statement_on_postgres<DB: TestDb, F: Form<DB>>() {
    if DB::LABEL != "postgres" {
        return; // MySQL/MariaDB and SQLite have no statement-level triggers
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!(
        "CREATE TABLE {t}_deletes (n INT); \
         CREATE FUNCTION {t}_count() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN INSERT INTO {t}_deletes VALUES (1); RETURN NULL; END $$; \
         CREATE TRIGGER {t}_count AFTER DELETE ON {t} FOR EACH STATEMENT \
         EXECUTE FUNCTION {t}_count()"
    ))
    .await;
    let batch: Vec<Job<'_>> = (0..16).map(|_| Job::new("ack")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    let batches = std::sync::Arc::new(std::sync::atomic::AtomicI64::new(0));
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(16)
        .workers(1)
        .batch_handler({
            let batches = std::sync::Arc::clone(&batches);
            move |batch: Vec<Delivery<DB>>| {
                batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let outcomes = vec![Outcome::ack(); batch.len()];
                async move { outcomes }
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    let batches = batches.load(std::sync::atomic::Ordering::SeqCst);
    let deletes = ctx.count(&format!("{t}_deletes"), "1 = 1").await;
    assert_eq!(
        deletes, batches,
        "{deletes} DELETE statements for 16 rows in {batches} batches"
    );
    ctx.exec(&format!(
        "DROP TABLE {t}_deletes; DROP TRIGGER {t}_count ON {t}; DROP FUNCTION {t}_count()"
    ))
    .await;
    ctx.drop_tables().await;
}

/// Eight workers settling batches of 16 as sets, down to an almost empty table (where MariaDB
/// planned `DELETE .. WHERE id IN (..)` as a scan that locked other batches' rows, and batches
/// deadlocked): no batch rolls back, every ack is handled once, every retry twice.
pub(crate) async fn concurrent_batches_drain_without_a_rollback<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs_in: Vec<Job<'_>> = (0..480)
        .map(|i| Job::new(if i % 5 == 0 { "retry" } else { "ack" }))
        .collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &jobs_in)
        .await
        .unwrap();
    let pool = ctx.pool(12).await;
    let (tx, mut seen) = mpsc::unbounded_channel::<(i64, u32)>();
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(16)
        .workers(8)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            let outcomes = batch
                .iter()
                .map(|d| {
                    let _ = tx.send((d.id(), d.attempt()));
                    outcome_of(d.payload(), d.attempt())
                })
                .collect();
            async move { outcomes }
        });
    let running = Runner::new(pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 60).await;
    wait_for(
        "every settlement counted",
        Duration::from_secs(5),
        || async {
            let stats = running.stats();
            stats.acked >= 480
        },
    )
    .await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    pool.close().await;
    assert_eq!(
        (stats.acked, stats.retried, stats.failed),
        (480, 96, 0),
        "{stats:?}"
    );
    let mut handled = std::collections::HashMap::<i64, Vec<u32>>::new();
    while let Ok((id, attempt)) = seen.try_recv() {
        handled.entry(id).or_default().push(attempt);
    }
    assert_eq!(handled.len(), 480);
    let twice = handled
        .values()
        .filter(|attempts| attempts.len() == 2)
        .count();
    assert_eq!(twice, 96, "each retried row twice, every other row once");
    assert!(handled.values().all(|attempts| attempts.len() <= 2));
    ctx.drop_tables().await;
}

/// A batch larger than one statement's list (64 rows) takes each row once: the advisory form
/// took its keys in chunks, and a later chunk's candidates began with the rows whose keys the
/// session had just taken (advisory locks are re-entrant on PostgreSQL and MySQL/MariaDB), so a
/// batch of 100 carried 36 rows twice and kept their keys.
pub(crate) async fn a_batch_larger_than_a_statement_takes_each_row_once<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs_in: Vec<Job<'_>> = (0..150).map(|_| Job::new("ack")).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &jobs_in)
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .batch(100)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            let _ = tx.send(batch.iter().map(|d| d.id()).collect::<Vec<_>>());
            async move { batch.iter().map(|_| Outcome::ack()).collect() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 30).await;
    running.shutdown().await.unwrap();
    let mut handled = std::collections::HashMap::<i64, usize>::new();
    while let Ok(batch) = seen.try_recv() {
        assert!(batch.len() <= 100, "a batch of {}", batch.len());
        for id in batch {
            *handled.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = handled.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "rows delivered more than once: {twice:?}");
    assert_eq!(handled.len(), 150, "every row handled");
    ctx.drop_tables().await;
}
