// The attempt column at its type's maximum, for one database `DB` and one form `F`.
//
// `F::COUNTS_AT_TAKE`: the lease and advisory forms count the attempt when they claim the row, so
// the column holds up to `max_attempts + 1`; the row lock form counts it when a retry returns the
// row, so the column holds up to `max_attempts`.

use std::time::Duration;

use sqlx_queue::{DeadLetter, Delivery, Error, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Form, Spec, TestDb};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(attempts<$db, $form>:
            a_row_at_the_attempt_columns_maximum_does_not_stop_the_queue,
            a_row_at_the_maximum_past_the_cap_is_dead_lettered_and_the_rest_processed,
            max_attempts_the_attempt_column_cannot_hold_is_refused_at_start,
        );
    };
}
pub(crate) use tests;

/// The attempt column's type in these tests and its largest value: the narrowest
/// integer of each database (SQLite's integers are all 64-bit).
fn narrow<DB: TestDb>() -> (&'static str, i64) {
    match DB::LABEL {
        "postgres" => ("smallint", i64::from(i16::MAX)),
        "mysql" => ("tinyint", i64::from(i8::MAX)),
        _ => ("integer", i64::MAX),
    }
}

/// A lease table (`attempt`, `locked_until`, `retry_after`) whose attempt column is
/// of the narrow type.
async fn narrow_table<DB: TestDb>(ctx: &mut Ctx<DB>) -> String {
    let t = ctx.table(Spec::lease()).await;
    let (ty, _) = narrow::<DB>();
    match DB::LABEL {
        "postgres" => {
            ctx.exec(&format!("ALTER TABLE {t} ALTER COLUMN attempt TYPE {ty}"))
                .await
        }
        "mysql" => {
            ctx.exec(&format!(
                "ALTER TABLE {t} MODIFY attempt {ty} NOT NULL DEFAULT 1"
            ))
            .await
        }
        _ => {}
    }
    t
}

fn jobs(t: &str) -> Table {
    Table::new(t).retry_after("retry_after")
}

/// One row at the attempt column's maximum (payload `max`), enqueued first so that
/// every claim in id order meets it, then 199 others.
async fn fill<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> i64 {
    let (_, max) = narrow::<DB>();
    let id = DB::enqueue(&ctx.pool, &jobs(t), Job::new("max"))
        .await
        .unwrap();
    ctx.exec(&format!("UPDATE {t} SET attempt = {max} WHERE id = {id}"))
        .await;
    let others: Vec<Job<'static>> = (1..200)
        .map(|i| Job::from_vec(format!("job {i}").into_bytes()))
        .collect();
    assert_eq!(
        DB::enqueue_many(&ctx.pool, &jobs(t), &others)
            .await
            .unwrap(),
        199
    );
    id
}

fn runner<DB: TestDb>(pool: &sqlx::Pool<DB>) -> Runner<DB> {
    Runner::new(pool.clone()).poll_interval(Duration::from_millis(50))
}

pub(crate) async fn a_row_at_the_attempt_columns_maximum_does_not_stop_the_queue<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = narrow_table(&mut ctx).await;
    let id = fill(&ctx, &t).await;
    // The row at the maximum is retried later (its attempt counted, so at the cap
    // of its column); every other row is acked.
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .workers(4)
        .handler(|d: Delivery<DB>| {
            let outcome = if d.payload() == b"max" {
                Outcome::retry_after(Duration::from_secs(3600))
            } else {
                Outcome::ack()
            };
            async move { outcome }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    ctx.wait_none(&t, &format!("id <> {id}"), 30).await;
    ctx.wait_count(&t, &format!("id = {id} AND retry_after IS NOT NULL"), 1, 30)
        .await;
    running.shutdown().await.unwrap();
    let (_, max) = narrow::<DB>();
    assert_eq!(
        ctx.count(&t, &format!("id = {id} AND attempt = {max}"))
            .await,
        1,
        "the attempt stays at the column's maximum"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_at_the_maximum_past_the_cap_is_dead_lettered_and_the_rest_processed<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = narrow_table(&mut ctx).await;
    let dead = narrow_table(&mut ctx).await;
    let id = fill(&ctx, &t).await;
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)))
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::table(&dead))
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 30).await;
    let (_, max) = narrow::<DB>();
    ctx.wait_count(&dead, &format!("id = {id} AND attempt = {max}"), 1, 10)
        .await;
    running.shutdown().await.unwrap();
    let mut handled = Vec::new();
    while let Ok(got) = seen.try_recv() {
        handled.push(got);
    }
    assert_eq!(handled.len(), 199, "every other row, once");
    assert!(
        !handled.contains(&id),
        "the row past its cap never reached the handler"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn max_attempts_the_attempt_column_cannot_hold_is_refused_at_start<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (ty, max) = narrow::<DB>();
    let Ok(max) = u32::try_from(max) else {
        return; // SQLite: a 64-bit column holds any `max_attempts`.
    };
    let t = narrow_table(&mut ctx).await;
    let dead = narrow_table(&mut ctx).await;
    let largest = if F::COUNTS_AT_TAKE { max - 1 } else { max };
    let capped = |n: u32| {
        let queue = F::apply(Queue::table(jobs(&t)))
            .attempt("attempt")
            .max_attempts(n)
            .dead_letter(DeadLetter::table(&dead))
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        runner(&ctx.pool).mount(queue).start()
    };
    match capped(largest + 1).await {
        Err(Error::Declaration { reason, .. }) => {
            assert!(reason.contains("`attempt`"), "names the column: {reason}");
            assert!(reason.contains(ty), "names its type: {reason}");
            assert!(
                reason.contains(&format!("at most {largest}")),
                "names the largest max_attempts: {reason}"
            );
        }
        Err(other) => panic!("max_attempts({}) on a {ty}: {other}", largest + 1),
        Ok(_) => panic!("max_attempts({}) on a {ty} column started", largest + 1),
    }
    capped(largest).await.unwrap().shutdown().await.unwrap();
    ctx.drop_tables().await;
}
