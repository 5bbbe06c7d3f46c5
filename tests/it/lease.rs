// The lease form's settlement table, one outcome at a time (DESIGN.md §3), and its lease.
//
// Where a test must show that a row was *not* delivered again, it enqueues a second row and
// waits for that one: claims take rows in id order, so the later row's delivery proves the
// earlier one was passed over.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::state::Mount;
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Running, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(lease<$db>:
            ack_deletes_the_row,
            drop_deletes_the_row,
            ack_and_drop_mark_processed_at_and_clear_the_lease,
            retry_clears_the_lease_and_counts_the_attempt,
            retry_after_sets_the_delay_and_clears_the_lease,
            retry_after_without_its_column_is_a_retry,
            an_ack_that_finds_another_token_is_lease_lost_and_changes_nothing,
            a_marking_ack_that_finds_another_token_is_lease_lost,
            a_retry_that_finds_another_token_is_lease_lost,
            a_retry_after_that_finds_another_token_is_lease_lost,
            a_batch_whose_row_lost_its_lease_settles_the_others,
            a_marking_batch_whose_row_lost_its_lease_settles_the_others,
            a_batch_whose_row_another_session_deleted_settles_the_others,
            a_handler_longer_than_its_lease_keeps_its_row,
            attempt_is_one_without_an_attempt_column,
            a_killed_consumer_process_returns_its_row_when_the_lease_expires,
            a_custom_settlement_confirms_the_lease_first,
            a_payload_that_does_not_decode_is_dead_lettered_or_dropped,
            a_shutdown_during_a_lease_extension_releases_the_token_the_row_carries,
            a_shutdown_that_cannot_release_a_row_in_time_says_so,
        );
    };
}
pub(crate) use tests;

type Seen = mpsc::UnboundedReceiver<(i64, u32)>;

fn jobs(table: &str) -> Table {
    Table::new(table).retry_after("retry_after")
}

/// A lease queue whose handler reports each delivery as `(id, attempt)` and settles it with
/// `outcome(attempt)`.
fn reporting<DB: TestDb>(
    table: Table,
    outcome: impl Fn(u32) -> Outcome + Send + Sync + 'static,
) -> (impl Mount<DB>, Seen) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .lease("locked_until")
        .lease_duration(Duration::from_secs(3600))
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            let outcome = outcome(d.attempt());
            async move { outcome }
        });
    (queue, rx)
}

fn runner<DB: TestDb>(ctx: &Ctx<DB>) -> Runner<DB> {
    Runner::new(ctx.pool.clone()).poll_interval(Duration::from_millis(50))
}

pub(crate) async fn ack_deletes_the_row<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("a"))
        .await
        .unwrap();
    let (queue, mut seen) = reporting(jobs(&t), |_| Outcome::ack());
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_none(&t, "1 = 1", 10).await;
    wait_for("one ack counted", Duration::from_secs(5), || async {
        running.stats().acked == 1
    })
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn drop_deletes_the_row<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("poison"))
        .await
        .unwrap();
    let (queue, mut seen) = reporting(jobs(&t), |_| Outcome::drop());
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_none(&t, "1 = 1", 10).await;
    wait_for("one drop counted", Duration::from_secs(5), || async {
        running.stats().dropped == 1
    })
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn ack_and_drop_mark_processed_at_and_clear_the_lease<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            processed_at: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).processed_at("processed_at");
    let acked = DB::enqueue(&ctx.pool, &table, Job::new("ack me"))
        .await
        .unwrap();
    let dropped = DB::enqueue(&ctx.pool, &table, Job::new("drop me"))
        .await
        .unwrap();
    let (queue, mut seen) = reporting(table.clone(), {
        let acked = AtomicFirst::default();
        move |_| {
            if acked.first() {
                Outcome::ack()
            } else {
                Outcome::drop()
            }
        }
    });
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (acked, 1));
    assert_eq!(
        recv(&mut seen, "the second delivery", 10).await,
        (dropped, 1)
    );
    ctx.wait_count(
        &t,
        "processed_at IS NOT NULL AND locked_until IS NULL",
        2,
        10,
    )
    .await;
    // Marked rows are not claimed again: a later row is delivered next.
    let later = DB::enqueue(&ctx.pool, &table, Job::new("later"))
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the later row", 10).await, (later, 1));
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&t, "1 = 1").await, 3, "marked rows are kept");
    ctx.drop_tables().await;
}

pub(crate) async fn retry_clears_the_lease_and_counts_the_attempt<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("flaky"))
        .await
        .unwrap();
    // The lease lasts an hour: only a cleared lease lets the row come back at once.
    let (queue, mut seen) = reporting(jobs(&t), |attempt| {
        if attempt < 3 {
            Outcome::retry()
        } else {
            Outcome::ack()
        }
    });
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    for attempt in 1..=3 {
        assert_eq!(recv(&mut seen, "a delivery", 10).await, (id, attempt));
    }
    ctx.wait_none(&t, "1 = 1", 10).await;
    wait_for("two retries and an ack", Duration::from_secs(5), || async {
        let stats = running.stats();
        stats.retried == 2 && stats.acked == 1
    })
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn retry_after_sets_the_delay_and_clears_the_lease<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("later"))
        .await
        .unwrap();
    let (queue, mut seen) = reporting(jobs(&t), |_| {
        Outcome::retry_after(Duration::from_secs(3600))
    });
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_count(
        &t,
        &format!("id = {id} AND retry_after IS NOT NULL AND locked_until IS NULL AND attempt = 2"),
        1,
        10,
    )
    .await;
    // Not claimable for an hour: the next row is delivered, the delayed one is not.
    let next = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("next"))
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the next row", 10).await, (next, 1));
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn retry_after_without_its_column_is_a_retry<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            retry_after: false,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t);
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x")).await.unwrap();
    let (queue, mut seen) = reporting(table, |attempt| {
        if attempt == 1 {
            Outcome::retry_after(Duration::from_secs(3600))
        } else {
            Outcome::ack()
        }
    });
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (id, 1));
    assert_eq!(recv(&mut seen, "the retry, at once", 10).await, (id, 2));
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// A lease table, keeping finished rows (`processed_at`) or deleting them: its name, and the
/// table as the queue declares it.
async fn lease_table<DB: TestDb>(ctx: &mut Ctx<DB>, processed_at: bool) -> (String, Table) {
    let t = ctx
        .table(Spec {
            processed_at,
            ..Spec::lease()
        })
        .await;
    let table = if processed_at {
        jobs(&t).processed_at("processed_at")
    } else {
        jobs(&t)
    };
    (t, table)
}

/// Runs one delivery whose row another claim takes while the handler works, settled with
/// `outcome`: the settlement must find the other token, count a lost lease and change nothing.
async fn lease_lost_on<DB: TestDb>(outcome: Outcome, processed_at: bool) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, table) = lease_table(&mut ctx, processed_at).await;
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x")).await.unwrap();
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let (tx, mut seen) = mpsc::unbounded_channel();
    let pool = ctx.pool.clone();
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = {id}");
    let queue = Queue::table(table)
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let (pool, steal, tx) = (pool.clone(), steal.clone(), tx.clone());
            async move {
                // Another claim takes the row while this handler works.
                DB::exec_time(&pool, &steal, later_claim).await.unwrap();
                let _ = tx.send(d.id());
                outcome
            }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();

    assert_eq!(recv(&mut seen, "the delivery", 10).await, id);
    wait_for(
        "the lost lease counted",
        Duration::from_secs(10),
        || async { running.stats().lease_lost == 1 },
    )
    .await;
    let stats = running.stats();
    assert_eq!((stats.acked, stats.dropped, stats.retried), (0, 0, 0));
    // The row is untouched: it belongs to the later claim.
    let untouched = format!(
        "id = {id} AND locked_until IS NOT NULL AND retry_after IS NULL AND attempt = 2{}",
        if processed_at {
            " AND processed_at IS NULL"
        } else {
            ""
        }
    );
    assert_eq!(ctx.count(&t, &untouched).await, 1, "{outcome:?}");
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn an_ack_that_finds_another_token_is_lease_lost_and_changes_nothing<
    DB: TestDb,
>() {
    lease_lost_on::<DB>(Outcome::ack(), false).await;
}

pub(crate) async fn a_marking_ack_that_finds_another_token_is_lease_lost<DB: TestDb>() {
    lease_lost_on::<DB>(Outcome::drop(), true).await;
}

pub(crate) async fn a_retry_that_finds_another_token_is_lease_lost<DB: TestDb>() {
    lease_lost_on::<DB>(Outcome::retry(), false).await;
}

pub(crate) async fn a_retry_after_that_finds_another_token_is_lease_lost<DB: TestDb>() {
    lease_lost_on::<DB>(Outcome::retry_after(Duration::from_secs(60)), false).await;
}

/// Enqueues four rows on `table` and runs a lease queue of batches of four whose handler first
/// runs `interfere(ids)` on another session (`at` bound to its `?` when given), then acks all
/// four; once the handler ran and the batch settled (acked or lost): the runner, the ids, and
/// the receiver of the batches delivered after the first.
async fn batch_acked_after<DB: TestDb>(
    ctx: &Ctx<DB>,
    table: Table,
    interfere: impl FnOnce(&[i64]) -> String,
    at: Option<chrono::DateTime<chrono::Utc>>,
) -> (Running, Vec<i64>, mpsc::UnboundedReceiver<Vec<i64>>) {
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(DB::enqueue(&ctx.pool, &table, Job::new("x")).await.unwrap());
    }
    let interfere = interfere(&ids);
    let (tx, mut seen) = mpsc::unbounded_channel();
    let pool = ctx.pool.clone();
    let queue = Queue::table(table)
        .lease("locked_until")
        .attempt("attempt")
        .batch(4)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            let (pool, interfere, tx) = (pool.clone(), interfere.clone(), tx.clone());
            let got: Vec<i64> = batch.iter().map(|d| d.id()).collect();
            async move {
                match at {
                    Some(at) => DB::exec_time(&pool, &interfere, at).await.unwrap(),
                    None => DB::exec(&pool, &interfere).await.unwrap(),
                };
                let _ = tx.send(got);
                batch.iter().map(|_| Outcome::ack()).collect()
            }
        });
    let running = runner(ctx).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the batch", 10).await, ids);
    wait_for("the batch settled", Duration::from_secs(10), || async {
        let stats = running.stats();
        stats.acked + stats.lease_lost == 4
    })
    .await;
    (running, ids, seen)
}

/// A batch of four rows, one claim and one token, whose third row another claim takes while
/// the handler works; the handler acks all four in one statement (`id IN (..) AND lease = ?`
/// returning the ids it settled on PostgreSQL and SQLite; MySQL/MariaDB's `(id, lease)` pairs):
/// the three rows still held are settled, the taken one counts a lost lease and is left as the
/// later claim wrote it.
async fn batch_with_a_lost_lease<DB: TestDb>(processed_at: bool) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, table) = lease_table(&mut ctx, processed_at).await;
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    // Another claim takes one row while the handler works.
    let steal = |ids: &[i64]| {
        format!(
            "UPDATE {t} SET locked_until = ?, attempt = attempt + 1 WHERE id = {}",
            ids[2]
        )
    };
    let (running, ids, mut seen) = batch_acked_after(&ctx, table, steal, Some(later_claim)).await;
    let taken = ids[2];
    let stats = running.stats();
    assert_eq!(
        (stats.acked, stats.lease_lost, stats.failed),
        (3, 1, 0),
        "{stats:?}"
    );
    // The taken row is as the later claim wrote it; the three others are settled.
    let untouched = format!(
        "id = {taken} AND locked_until IS NOT NULL AND attempt = 3{}",
        if processed_at {
            " AND processed_at IS NULL"
        } else {
            ""
        }
    );
    assert_eq!(ctx.count(&t, &untouched).await, 1);
    let left = if processed_at {
        "processed_at IS NULL"
    } else {
        "1 = 1"
    };
    assert_eq!(ctx.count(&t, left).await, 1, "only the taken row is left");
    if processed_at {
        let marked = format!("processed_at IS NOT NULL AND locked_until IS NULL AND id <> {taken}");
        assert_eq!(ctx.count(&t, &marked).await, 3);
    }
    running.shutdown().await.unwrap();
    assert!(seen.try_recv().is_err(), "a row was delivered again");
    ctx.drop_tables().await;
}

pub(crate) async fn a_batch_whose_row_lost_its_lease_settles_the_others<DB: TestDb>() {
    batch_with_a_lost_lease::<DB>(false).await;
}

pub(crate) async fn a_marking_batch_whose_row_lost_its_lease_settles_the_others<DB: TestDb>() {
    batch_with_a_lost_lease::<DB>(true).await;
}

/// A batch of four rows whose third row another session deletes while the handler works; the
/// handler acks all four in one statement, which settles the three still there (PostgreSQL and
/// SQLite count the rows it deleted, and find which of the four are gone; MySQL/MariaDB lock
/// the rows first and count the deleted one a lost lease): none fails, the table is empty, and
/// no row is delivered again.
pub(crate) async fn a_batch_whose_row_another_session_deleted_settles_the_others<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, table) = lease_table(&mut ctx, false).await;
    let delete = |ids: &[i64]| format!("DELETE FROM {t} WHERE id = {}", ids[2]);
    let (running, _, mut seen) = batch_acked_after(&ctx, table, delete, None).await;
    let stats = running.stats();
    assert_eq!(stats.failed, 0, "{stats:?}");
    assert!(stats.acked >= 3, "{stats:?}");
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "every row gone");
    running.shutdown().await.unwrap();
    assert!(seen.try_recv().is_err(), "a row was delivered again");
    ctx.drop_tables().await;
}

pub(crate) async fn a_handler_longer_than_its_lease_keeps_its_row<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("slow"))
        .await
        .unwrap();
    let deliveries = Arc::new(Mutex::new(Vec::new()));
    let slow = |deliveries: Arc<Mutex<Vec<i64>>>| {
        Queue::table(jobs(&t))
            .lease("locked_until")
            .lease_duration(Duration::from_millis(1200))
            .attempt("attempt")
            .handler(move |d: Delivery<DB>| {
                deliveries.lock().unwrap().push(d.id());
                async move {
                    // Work for three leases; the runner extends the lease meanwhile.
                    tokio::time::sleep(Duration::from_millis(3600)).await;
                    Outcome::ack()
                }
            })
    };
    // A second runner polls all the while, and would take the row if its lease expired.
    let first = runner(&ctx)
        .mount(slow(Arc::clone(&deliveries)))
        .start()
        .await
        .unwrap();
    let second = runner(&ctx)
        .mount(slow(Arc::clone(&deliveries)))
        .start()
        .await
        .unwrap();

    ctx.wait_none(&t, "1 = 1", 20).await;
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
    assert_eq!(*deliveries.lock().unwrap(), vec![id], "delivered once");
    ctx.drop_tables().await;
}

pub(crate) async fn attempt_is_one_without_an_attempt_column<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            attempt: false,
            ..Spec::lease()
        })
        .await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            async move {
                if d.attempt() == 1 {
                    Outcome::ack()
                } else {
                    Outcome::drop()
                }
            }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the delivery", 10).await, (id, 1));
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

/// `true` the first time only.
#[derive(Default)]
struct AtomicFirst(std::sync::atomic::AtomicBool);

impl AtomicFirst {
    fn first(&self) -> bool {
        !self.0.swap(true, std::sync::atomic::Ordering::SeqCst)
    }
}

pub(crate) async fn a_killed_consumer_process_returns_its_row_when_the_lease_expires<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let database = ctx.url.clone().expect("a database");
    let lease = Duration::from_millis(1500);
    let mut consumer =
        crate::support::Consumer::spawn(&database, &t, "lease", "hang", &["1", "1500"]);
    // The consumer prints `running` once its runner started, and the runner's queue may claim
    // (and print `started`) before that line is written: the two in either order.
    let mut lines = [consumer.line(30).await, consumer.line(30).await];
    lines.sort();
    assert_eq!(lines, ["running".to_owned(), format!("started {id}")]);
    let started = tokio::time::Instant::now();
    consumer.kill().await;
    let killed = tokio::time::Instant::now();

    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            async { Outcome::ack() }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    assert_eq!(
        recv(&mut seen, "the killed consumer's row", 10).await,
        (id, 2)
    );
    let back = killed.elapsed();
    // Not before its lease ran out (it was taken before `started` was printed), nor long after.
    assert!(
        started.elapsed() >= lease - Duration::from_millis(100),
        "{back:?}"
    );
    assert!(back < lease + Duration::from_secs(3), "back after {back:?}");
    crate::support::report(&format!(
        "{}: lease: a row held by a killed process delivered again {back:?} after the kill \
         (lease {lease:?})",
        DB::LABEL
    ));
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_custom_settlement_confirms_the_lease_first<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).group("queue");
    let id = DB::enqueue(&ctx.pool, &table, Job::new("x").group("mail"))
        .await
        .unwrap();
    let later_claim = chrono::Utc::now() + chrono::TimeDelta::days(1);
    let pool = ctx.pool.clone();
    let steal = format!("UPDATE {t} SET locked_until = ? WHERE id = {id}");
    let queue = Queue::table(table)
        .named("mail")
        .lease("locked_until")
        .custom(
            sqlx_queue::Event::Ack,
            format!("UPDATE {t} SET queue = 'acked' WHERE id = :id"),
        )
        .handler(move |_: Delivery<DB>| {
            let (pool, steal) = (pool.clone(), steal.clone());
            async move {
                DB::exec_time(&pool, &steal, later_claim).await.unwrap();
                Outcome::ack()
            }
        });
    let running = runner(&ctx).mount(queue).start().await.unwrap();
    wait_for(
        "the lost lease counted",
        Duration::from_secs(10),
        || async { running.stats().lease_lost == 1 },
    )
    .await;
    assert_eq!(
        ctx.count(&t, "queue = 'acked'").await,
        0,
        "the custom SQL did not run"
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}

#[derive(serde::Deserialize)]
struct Signup {
    email: String,
}

pub(crate) async fn a_payload_that_does_not_decode_is_dead_lettered_or_dropped<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t).group("queue");
    for group in ["capped", "uncapped"] {
        DB::enqueue(&ctx.pool, &table, Job::new("not json").group(group))
            .await
            .unwrap();
        let good = Job::json(&serde_json::json!({ "email": "a@example.com" })).unwrap();
        DB::enqueue(&ctx.pool, &table, good.group(group))
            .await
            .unwrap();
    }
    let (tx, mut seen) = mpsc::unbounded_channel();
    let handler = move |signup: Signup, d: Delivery<DB>| {
        let _ = tx.send((d.group().map(str::to_owned), signup.email));
        async { Outcome::ack() }
    };
    let capped = Queue::table(table.clone())
        .named("capped")
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(sqlx_queue::DeadLetter::group("dead"))
        .json_handler(handler.clone());
    let uncapped = Queue::table(table)
        .named("uncapped")
        .lease("locked_until")
        .json_handler(handler);
    let running = runner(&ctx)
        .mount(capped)
        .mount(uncapped)
        .start()
        .await
        .unwrap();
    for _ in 0..2 {
        let (_, email) = recv(&mut seen, "the decoded payloads", 10).await;
        assert_eq!(email, "a@example.com");
    }
    // The undecodable rows: moved to the dead letter where there is one, dropped elsewhere.
    ctx.wait_count(&t, "queue = 'dead'", 1, 10).await;
    ctx.wait_count(&t, "1 = 1", 1, 10).await;
    running.shutdown().await.unwrap();
    assert!(
        seen.try_recv().is_err(),
        "the handler saw only decoded payloads"
    );
    ctx.drop_tables().await;
}

/// Sends once when dropped: the runner dropped the handler's future.
struct Dropped(mpsc::UnboundedSender<()>);

impl Drop for Dropped {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

pub(crate) async fn a_shutdown_during_a_lease_extension_releases_the_token_the_row_carries<
    DB: TestDb,
>() {
    shutdown_during_an_extension::<DB>(false).await;
}

pub(crate) async fn a_shutdown_that_cannot_release_a_row_in_time_says_so<DB: TestDb>() {
    shutdown_during_an_extension::<DB>(true).await;
}

/// A shutdown that cancels a handler while its lease extension waits for another session's
/// lock on the row. That session lets go at once (the release goes through with the token the
/// extension wrote), or, `past_grace`, only after the shutdown returned: the row could not be
/// released in time, and the report says so.
async fn shutdown_during_an_extension<DB: TestDb>(past_grace: bool) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x"))
        .await
        .unwrap();
    let (started, mut seen) = mpsc::unbounded_channel();
    let (dropped, mut gone) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .lease_duration(Duration::from_secs(1))
        .handler(move |_: Delivery<DB>| {
            let _ = started.send(tokio::time::Instant::now());
            let guard = Dropped(dropped.clone());
            async move {
                let _guard = guard;
                std::future::pending::<Outcome>().await
            }
        });
    let pool = ctx.pool(4).await;
    let running = Runner::new(pool.clone())
        .shutdown_timeout(Duration::from_millis(200))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let began = recv(&mut seen, "the handler's start", 10).await;

    // Another session holds the row, so the extension due at half the lease waits for it.
    let mut holder = ctx.pool.begin().await.unwrap();
    DB::query_on(
        &mut *holder,
        &format!("UPDATE {t} SET payload = payload WHERE id = {id}"),
    )
    .await
    .unwrap();
    match DB::LABEL {
        "postgres" => {
            let waiting = format!(
                "(SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE 'UPDATE \"{t}\" SET \"locked_until\"%') AS w"
            );
            ctx.wait_count(&waiting, "1 = 1", 1, 10).await;
        }
        "mysql" => {
            let waiting = format!(
                "(SELECT 1 FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'UPDATE `{t}` SET `locked_until`%') AS w"
            );
            ctx.wait_count(&waiting, "1 = 1", 1, 10).await;
        }
        // SQLite shows no statement in flight: wait past the extension's due time instead.
        _ => tokio::time::sleep_until(began + Duration::from_millis(800)).await,
    }

    // Shutdown cancels the handler while its extension is in flight; the extension then
    // commits its new token once the other session lets it.
    let asked = tokio::time::Instant::now();
    let shutdown = tokio::spawn(running.shutdown());
    recv(&mut gone, "the handler cancelled", 10).await;
    let holder = if past_grace {
        Some(holder)
    } else {
        holder.rollback().await.unwrap();
        None
    };
    let report = tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown returns")
        .unwrap()
        .unwrap();
    let took = asked.elapsed();
    if past_grace {
        // The timeout (0.2 s), then 1 s for the extension in flight and 1 s for the release.
        assert!(took < Duration::from_millis(3500), "shutdown took {took:?}");
        assert_eq!(
            (report.cancelled, report.released, report.unreleased),
            (1, 0, 1),
            "a row still held elsewhere is reported unreleased: {report:?}"
        );
        holder.expect("held").rollback().await.unwrap();
        // The extension wrote its token once the other session let go: the row returns when
        // that lease (1 s) expires, to a runner started afterwards.
        let again = Queue::table(jobs(&t))
            .lease("locked_until")
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        let running = Runner::new(pool.clone())
            .poll_interval(Duration::from_millis(50))
            .mount(again)
            .start()
            .await
            .unwrap();
        ctx.wait_none(&t, &format!("id = {id}"), 10).await;
        running.shutdown().await.unwrap();
    } else {
        assert_eq!(
            (report.cancelled, report.released, report.unreleased),
            (1, 1, 0),
            "{report:?}"
        );
        assert_eq!(
            ctx.count(&t, &format!("id = {id} AND locked_until IS NULL"))
                .await,
            1,
            "no lease left behind after shutdown returned"
        );
    }
    pool.close().await;
    ctx.drop_tables().await;
}
