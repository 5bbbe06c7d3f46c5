// Retries, attempt caps and dead letters (the seed's "Retries"), for one database `DB` and one
// form `F`.
//
// `F::COUNTS_AT_TAKE`: the lease and advisory forms count the attempt when they claim the row, so
// a row moved at its n-th failure carries attempt n + 1; the row lock form counts it in the
// statement that returns the row, so the row carries n.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sqlx_queue::state::{AttemptColumn, DeadLettered};
use sqlx_queue::{DeadLetter, Delivery, Event, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(dead<$db, $form>:
            the_nth_failure_moves_the_row_to_its_group_and_requeue_brings_it_back,
            the_nth_failure_moves_the_row_to_a_table_byte_for_byte,
            max_attempts_one_moves_at_the_first_failure_and_retry_after_obeys_the_cap,
            a_row_past_its_cap_is_moved_without_reaching_the_handler,
            a_custom_ack_runs_instead_of_the_crates_statement,
        );
    };
}
pub(crate) use tests;

/// The attempt column of a row moved at its `n`-th failure.
fn moved_attempt<DB: TestDb, F: Form<DB>>(n: i64) -> i64 {
    if F::COUNTS_AT_TAKE { n + 1 } else { n }
}

fn runner<DB: TestDb>(pool: &sqlx::Pool<DB>) -> Runner<DB> {
    Runner::new(pool.clone()).poll_interval(Duration::from_millis(50))
}

/// A capped queue of form `F` with its dead letter, before its handler: the one [`failing`]
/// gives for enqueues and counts.
type Declared<F> = Queue<F, AttemptColumn, DeadLettered>;

/// A capped queue whose handler reports `(id, attempt)`, retries until `fixed` is
/// set, then acks (a row whose payload is `later` is acked at once).
fn failing<DB: TestDb, F: Form<DB>>(
    table: Table,
    name: Option<&str>,
    max: u32,
    dead: DeadLetter,
    fixed: Arc<AtomicBool>,
    tx: mpsc::UnboundedSender<(i64, u32)>,
) -> (Declared<F::F>, impl FnOnce(Runner<DB>) -> Runner<DB>) {
    let queue = Queue::table(table);
    let queue = match name {
        Some(name) => queue.named(name),
        None => queue,
    };
    let declared = F::apply(queue)
        .attempt("attempt")
        .max_attempts(max)
        .dead_letter(dead);
    let queue = declared.clone().handler(move |d: Delivery<DB>| {
        let _ = tx.send((d.id(), d.attempt()));
        let fixed = fixed.load(Ordering::SeqCst) || d.payload() == b"later";
        async move {
            if fixed {
                Outcome::ack()
            } else {
                Outcome::retry()
            }
        }
    });
    (declared, move |runner| runner.mount(queue))
}

pub(crate) async fn the_nth_failure_moves_the_row_to_its_group_and_requeue_brings_it_back<
    DB: TestDb,
    F: Form<DB>,
>() {
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
    let payload = [0xff_u8, 0x00, 0xfe, b'\''];
    let id = DB::enqueue(&ctx.pool, &table, Job::new(&payload).group("mail"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let fixed = Arc::new(AtomicBool::new(false));
    let dead = DeadLetter::group("mail_dead");
    let (declared, mount) = failing::<DB, F>(
        table.clone(),
        Some("mail"),
        3,
        dead.clone(),
        Arc::clone(&fixed),
        tx,
    );
    let running = mount(runner(&ctx.pool)).start().await.unwrap();

    for attempt in 1..=3 {
        assert_eq!(
            recv(&mut seen, "a delivery below the cap", 10).await,
            (id, attempt)
        );
    }
    let moved = format!(
        "id = {id} AND queue = 'mail_dead' AND locked_until IS NULL AND attempt = {}",
        moved_attempt::<DB, F>(3)
    );
    ctx.wait_count(&t, &moved, 1, 10).await;
    assert_eq!(
        ctx.payload(&t, id).await,
        payload,
        "the payload, byte for byte"
    );
    wait_for(
        "one dead letter counted",
        Duration::from_secs(5),
        || async { running.stats().dead_lettered == 1 },
    )
    .await;
    // Not claimed again: a later row is delivered next.
    let later = DB::enqueue(&ctx.pool, &table, Job::new("later").group("mail"))
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the later row", 10).await, (later, 1));

    let counts = declared.counts(&ctx.pool).await.unwrap();
    assert_eq!(counts.dead, 1, "{counts:?}");
    fixed.store(true, Ordering::SeqCst);
    assert_eq!(declared.requeue_dead(&ctx.pool).await.unwrap(), 1);
    assert_eq!(recv(&mut seen, "the re-queued row", 10).await, (id, 1));
    ctx.wait_none(&t, &format!("id = {id}"), 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn the_nth_failure_moves_the_row_to_a_table_byte_for_byte<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let dead_table = ctx.table(Spec::lease()).await;
    let table = Table::new(&t).retry_after("retry_after");
    let payloads: Vec<Vec<u8>> = vec![
        Vec::new(),
        vec![0xc3, 0x28, 0x00, 0xff],
        (0..=255u8).cycle().take(1024).collect(),
    ];
    let mut ids = Vec::new();
    for payload in &payloads {
        ids.push(
            DB::enqueue(&ctx.pool, &table, Job::new(payload))
                .await
                .unwrap(),
        );
    }
    let (tx, mut seen) = mpsc::unbounded_channel();
    let fixed = Arc::new(AtomicBool::new(false));
    let dead = DeadLetter::table(&dead_table);
    let (declared, mount) =
        failing::<DB, F>(table.clone(), None, 2, dead.clone(), Arc::clone(&fixed), tx);
    let running = mount(runner(&ctx.pool)).start().await.unwrap();

    for _ in 0..6 {
        recv(&mut seen, "the six deliveries below and at the cap", 10).await;
    }
    ctx.wait_none(&t, "1 = 1", 10).await;
    ctx.wait_count(&dead_table, "1 = 1", 3, 10).await;
    for (id, payload) in ids.iter().zip(&payloads) {
        assert_eq!(&ctx.payload(&dead_table, *id).await, payload, "row {id}");
        let same = format!(
            "id = {id} AND locked_until IS NULL AND retry_after IS NULL AND attempt = {}",
            moved_attempt::<DB, F>(2)
        );
        assert_eq!(ctx.count(&dead_table, &same).await, 1, "row {id}'s columns");
    }
    fixed.store(true, Ordering::SeqCst);
    assert_eq!(declared.requeue_dead(&ctx.pool).await.unwrap(), 3);
    assert_eq!(ctx.count(&dead_table, "1 = 1").await, 0);
    for id in &ids {
        assert_eq!(recv(&mut seen, "a re-queued row", 10).await, (*id, 1));
    }
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn max_attempts_one_moves_at_the_first_failure_and_retry_after_obeys_the_cap<
    DB: TestDb,
    F: Form<DB>,
>() {
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
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x").group("mail"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(table).named("mail"))
        .attempt("attempt")
        .max_attempts(1)
        .dead_letter(DeadLetter::group("mail_dead"))
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.attempt());
            async { Outcome::retry_after(Duration::from_secs(3600)) }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the only delivery", 10).await, 1);
    ctx.wait_count(
        &t,
        &format!("id = {id} AND queue = 'mail_dead' AND retry_after IS NULL"),
        1,
        10,
    )
    .await;
    running.shutdown().await.unwrap();
    assert!(seen.try_recv().is_err(), "delivered once");
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_past_its_cap_is_moved_without_reaching_the_handler<
    DB: TestDb,
    F: Form<DB>,
>() {
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
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x").group("mail"))
        .await
        .unwrap();
    // Three deliveries ended unsettled (a crashing handler, say) and were counted.
    ctx.exec(&format!("UPDATE {t} SET attempt = 4 WHERE id = {id}"))
        .await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(table).named("mail"))
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::group("mail_dead"))
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            async { Outcome::ack() }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    ctx.wait_count(&t, &format!("id = {id} AND queue = 'mail_dead'"), 1, 10)
        .await;
    running.shutdown().await.unwrap();
    assert!(seen.try_recv().is_err(), "the handler never saw it");
    ctx.drop_tables().await;
}

pub(crate) async fn a_custom_ack_runs_instead_of_the_crates_statement<DB: TestDb, F: Form<DB>>() {
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
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x").group("mail"))
        .await
        .unwrap();
    let queue = F::apply(Queue::table(table).named("mail"))
        .attempt("attempt")
        .custom(
            Event::Ack,
            format!(
                "UPDATE {t} SET queue = 'acked', locked_until = NULL \
                 WHERE id = :id AND queue = :group"
            ),
        )
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    ctx.wait_count(&t, &format!("id = {id} AND queue = 'acked'"), 1, 10)
        .await;
    wait_for("the custom ack counted", Duration::from_secs(5), || async {
        running.stats().acked == 1
    })
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
