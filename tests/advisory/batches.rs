//! Queues of batches, whose workers each run their own claim loop: on each form, two runners of 8
//! workers side by side, each row delivered once, and a queue gone idle woken by an enqueue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Running, Table};

use crate::keys;
use crate::support::{Ctx, Form, Spec, TestDb};

const WORKERS: usize = 8;
const BATCH: usize = 4;
/// A runner's pool: a connection per worker (row lock and advisory batches hold one) and one
/// more.
const POOL: u32 = 10;

/// Deliveries per payload (SQLite gives the ids of a table emptied again), and the largest
/// batch seen.
#[derive(Default)]
struct Seen {
    deliveries: HashMap<Vec<u8>, u32>,
    largest: usize,
}

/// A runner on `pool` with a queue of batches of form `Fm` on `t`: `WORKERS` workers, batches of
/// up to `BATCH`, a handler that records each delivery in `seen` and acks.
fn batches<DB: TestDb, Fm: Form<DB>>(
    pool: &Pool<DB>,
    t: &str,
    seen: &Arc<Mutex<Seen>>,
) -> Runner<DB> {
    let seen = Arc::clone(seen);
    let handler = move |batch: Vec<Delivery<DB>>| {
        let mut seen = seen.lock().unwrap();
        seen.largest = seen.largest.max(batch.len());
        for delivery in &batch {
            *seen
                .deliveries
                .entry(delivery.payload().to_vec())
                .or_default() += 1;
        }
        std::future::ready(batch.iter().map(|_| Outcome::ack()).collect())
    };
    let queue = Fm::apply(Queue::table(Table::new(t)))
        .attempt("attempt")
        .workers(WORKERS)
        .batch(BATCH)
        .batch_handler(handler);
    // No poll within the test: an idle worker finds new rows only through a wake-up.
    Runner::new(pool.clone())
        .poll_interval(Duration::from_secs(3600))
        .mount(queue)
}

/// Two runners of 8 workers, each claiming batches of 4 on its own, drain 400 rows, each
/// delivered once; once the queues are idle (every worker waiting), 20 rows enqueued through the
/// crate wake them and drain within seconds (there is no poll: a worker woken by the enqueue
/// finds a full batch and wakes a sibling). Nothing is left held after shutdown.
pub(crate) async fn each_row_once_across_two_runners_and_an_idle_queue_woken<
    DB: TestDb,
    Fm: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let form = Fm::NAME;
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t);
    let payloads: Vec<String> = (0..400).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (one, other) = (ctx.pool(POOL).await, ctx.pool(POOL).await);
    let one = batches::<DB, Fm>(&one, &t, &seen).start().await.unwrap();
    let other = batches::<DB, Fm>(&other, &t, &seen).start().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 60).await;
    {
        let seen = seen.lock().unwrap();
        let twice: Vec<_> = seen.deliveries.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "{form}: rows delivered twice: {twice:?}");
        assert_eq!(seen.deliveries.len(), 400, "{form}: every row delivered");
        assert!(
            seen.largest > 1 && seen.largest <= BATCH,
            "{form}: batches of up to {BATCH} rows (largest {})",
            seen.largest
        );
    }
    // Not a synchronisation (the assertions below hold either way): the workers' rechecks after
    // their last short claims (2 + 10 + 50 + 250 ms) run out, so that only the enqueue's
    // wake-up reaches them.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let more: Vec<String> = (0..20).map(|i| format!("more {i}")).collect();
    let jobs: Vec<Job<'_>> = more.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    // A row is gone once its settlement committed; the runner counts it just after: wait (at
    // most 10 s) for the counts to catch up.
    let began = std::time::Instant::now();
    let mut stats = (one.stats(), other.stats());
    while stats.0.acked + stats.1.acked < 420 && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(5)).await;
        stats = (one.stats(), other.stats());
    }
    one.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(
            seen.deliveries.len(),
            420,
            "{form}: the rows enqueued later delivered too"
        );
        assert!(
            seen.deliveries.values().all(|n| *n == 1),
            "{form}: each row once"
        );
    }
    assert_eq!(
        stats.0.acked + stats.1.acked,
        420,
        "{form}: every row acked once ({stats:?})"
    );
    assert_eq!(keys::held(&ctx, &t).await, 0, "{form}: no key left");
    ctx.drop_tables().await;
}

/// What one worker's deliveries were: `(id, payload, attempt)` each.
type Deliveries = Arc<Mutex<Vec<(i64, Vec<u8>, u32)>>>;

/// A fresh table of `rows` rows (payloads `job 0` up) with an attempt column, `setup` run on it
/// (a statement its name makes), its statements watched, and a runner of one worker claiming
/// its advisory batches of 16, whose handler acks each row and records its delivery.
async fn one_worker_of_batches<DB: TestDb>(
    ctx: &mut Ctx<DB>,
    rows: usize,
    setup: impl FnOnce(&str) -> Option<String>,
) -> (String, Running, Deliveries) {
    let spec = Spec {
        attempt: true,
        ..Spec::default()
    };
    let t = ctx.table(spec).await;
    let payloads: Vec<String> = (0..rows).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
        .await
        .unwrap();
    if let Some(sql) = setup(&t) {
        ctx.exec(&sql).await;
    }
    crate::statements::watch(&t);
    let seen: Deliveries = Arc::default();
    let recorded = Arc::clone(&seen);
    let handler = move |batch: Vec<Delivery<DB>>| {
        let mut recorded = recorded.lock().unwrap();
        recorded.extend(
            batch
                .iter()
                .map(|d| (d.id(), d.payload().to_vec(), d.attempt())),
        );
        std::future::ready(batch.iter().map(|_| Outcome::ack()).collect())
    };
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .attempt("attempt")
        .workers(1)
        .batch(16)
        .batch_handler(handler);
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    (t, running, seen)
}

/// One worker drains 200 rows in batches of 16 (MySQL/MariaDB): each full batch's acks, the
/// release of its keys and the next claim's statement that takes keys go in one text (`DELETE
/// ..; SELECT .. RELEASE_LOCK ..; SELECT .. GET_LOCK ..`) — twelve full batches, twelve such
/// texts, and the last batch (of eight) acked on its own — each row delivered once at attempt
/// 1, and no key left.
pub(crate) async fn full_batches_send_their_acks_with_the_next_claim<DB: TestDb>() {
    if DB::LABEL != "mysql" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, running, seen) = one_worker_of_batches(&mut ctx, 200, |_| None).await;
    ctx.wait_none(&t, "1 = 1", 60).await;
    crate::support::wait_for("200 acks counted", Duration::from_secs(10), || async {
        running.stats().acked == 200
    })
    .await;
    assert_eq!(running.stats().failed, 0, "settlements that failed");
    running.shutdown().await.unwrap();
    let statements = crate::statements::statements(&t);
    let acks: Vec<&String> = statements
        .iter()
        .filter(|s| s.starts_with("DELETE"))
        .collect();
    let joined = acks.iter().filter(|s| s.contains("GET_LOCK(")).count();
    crate::support::report(&format!(
        "{}: 200 rows in {} batch acks, {joined} with the next claim",
        DB::LABEL,
        acks.len()
    ));
    assert_eq!(acks.len(), 13, "one ack statement a batch: {acks:#?}");
    assert_eq!(joined, 12, "each full batch's acks carry the next claim");
    let seen: Vec<(i64, u32)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _, a)| (*id, *a))
        .collect();
    crate::statements::each_once_at_attempt_one(seen);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// One worker, batches of 16, 40 rows (MySQL/MariaDB), a trigger refusing to delete the fifth:
/// the first batch's acks go with the next claim in one text, which fails at its `DELETE`; the
/// batch then settles on its own, row by row — the fifth row fails and is held back, the others
/// are settled — and the rest of the queue drains: each row delivered once but the refused one,
/// which stays, and no key is left.
pub(crate) async fn a_batch_whose_text_with_the_next_claim_fails_settles_on_its_own<DB: TestDb>() {
    if DB::LABEL != "mysql" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let refused = "CAST(payload AS CHAR) = 'job 4'";
    let (t, running, seen) = one_worker_of_batches(&mut ctx, 40, |t| {
        Some(format!(
            "CREATE TRIGGER {t}_no_one BEFORE DELETE ON {t} FOR EACH ROW IF {} \
             THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; END IF",
            refused.replace("payload", "OLD.payload")
        ))
    })
    .await;
    crate::support::wait_for("39 rows settled", Duration::from_secs(30), || async {
        running.stats().acked >= 39
    })
    .await;
    assert!(running.stats().failed >= 1, "{:?}", running.stats());
    running.shutdown().await.unwrap();
    let statements = crate::statements::statements(&t);
    assert!(
        statements
            .first()
            .is_some_and(|s| s.starts_with("SELECT") && s.contains("GET_LOCK(")),
        "the first claim: {statements:#?}"
    );
    assert!(
        statements
            .iter()
            .any(|s| s.starts_with("DELETE") && s.contains("GET_LOCK(")),
        "the first batch's acks went with the next claim: {statements:#?}"
    );
    let mut deliveries = HashMap::<Vec<u8>, u32>::new();
    for (_, payload, _) in seen.lock().unwrap().iter() {
        *deliveries.entry(payload.clone()).or_default() += 1;
    }
    let not_once: Vec<String> = (0..40)
        .map(|i| format!("job {i}"))
        .filter(|p| deliveries.get(p.as_bytes()) != Some(&1) && p != "job 4")
        .collect();
    assert!(not_once.is_empty(), "rows not delivered once: {not_once:?}");
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        1,
        "the refused row stays, the others are settled"
    );
    assert_eq!(ctx.count(&t, refused).await, 1);
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}
