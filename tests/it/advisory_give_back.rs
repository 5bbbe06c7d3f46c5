//! A claim of the advisory lock form that fails for a reason of one row's own (here a CHECK
//! that refuses counting that row's attempt once more) is released whole, that row held back:
//! the other rows it took must go back with their attempts as they were, since none of them was
//! delivered.

use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Spec, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(advisory_give_back<$db>:
            a_claim_failing_on_one_row_counts_no_attempt_of_the_others,
            a_batch_claim_failing_on_one_row_counts_no_attempt_of_the_others,
        );
    };
}
pub(crate) use tests;

/// Refuses any `attempt` above 3 in `t`: a CHECK constraint, or on SQLite (which cannot add
/// one to a table) a trigger.
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

/// A table of rows `a`, `b`, `stuck` (its attempt cannot be counted once more), `c`, in claim
/// order: a claim of four takes the three others with it.
async fn rows_around_a_stuck_one<DB: TestDb>(ctx: &mut Ctx<DB>) -> String {
    let t = ctx.table(Spec::lease()).await;
    cap_attempts(ctx, &t).await;
    for (payload, attempt) in [("a", 1), ("b", 1), ("stuck", 3), ("c", 1)] {
        ctx.exec(&format!(
            "INSERT INTO {t} (payload, attempt) VALUES ('{payload}', {attempt})"
        ))
        .await;
    }
    t
}

/// What the handlers saw: `(payload, attempt)`, sorted.
async fn seen_three(
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<(String, u32)>,
) -> Vec<(String, u32)> {
    let mut all = Vec::new();
    for _ in 0..3 {
        all.push(recv(seen, "a delivery", 30).await);
    }
    all.sort();
    all
}

fn first_deliveries() -> Vec<(String, u32)> {
    ["a", "b", "c"]
        .iter()
        .map(|p| ((*p).to_owned(), 1))
        .collect()
}

pub(crate) async fn a_claim_failing_on_one_row_counts_no_attempt_of_the_others<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_around_a_stuck_one(&mut ctx).await;
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    // Four workers: the first claim takes the four rows on one session.
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .attempt("attempt")
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let payload = String::from_utf8_lossy(d.payload()).into_owned();
            let _ = tx.send((payload, d.attempt()));
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let seen = seen_three(&mut seen).await;
    ctx.wait_count(&t, "1 = 1", 1, 30).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        seen,
        first_deliveries(),
        "each row delivered once, on its first attempt"
    );
    assert_eq!(
        ctx.count(&t, "payload = 'stuck' AND attempt = 3").await,
        1,
        "the stuck row left as it was"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_batch_claim_failing_on_one_row_counts_no_attempt_of_the_others<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_around_a_stuck_one(&mut ctx).await;
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .attempt("attempt")
        .batch(4)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            for d in &batch {
                let payload = String::from_utf8_lossy(d.payload()).into_owned();
                let _ = tx.send((payload, d.attempt()));
            }
            let outcomes = vec![Outcome::ack(); batch.len()];
            async move { outcomes }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    let seen = seen_three(&mut seen).await;
    ctx.wait_count(&t, "1 = 1", 1, 30).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        seen,
        first_deliveries(),
        "each row delivered once, on its first attempt"
    );
    assert_eq!(
        ctx.count(&t, "payload = 'stuck' AND attempt = 3").await,
        1,
        "the stuck row left as it was"
    );
    ctx.drop_tables().await;
}
