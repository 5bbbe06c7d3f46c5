//! Grouped acks on the advisory form's sessions: what each settles, and what a session the
//! server ends leaves to another runner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Pool;
use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Semaphore, mpsc};

use crate::ahead::{gated, rows_of};
use crate::keys;
use crate::support::{Ctx, Spec, TestDb, recv};

const WORKERS: usize = 8;
/// The pool of a runner of `WORKERS` workers, and room for more.
const POOL: u32 = 10;

/// Deliveries per row id.
type Seen = Arc<Mutex<HashMap<i64, u32>>>;

/// A runner on `pool` with a plain advisory queue of `WORKERS` workers on `t` (its attempts
/// counted when `attempt`), whose handler records each delivery in `seen` and acks.
fn acking<DB: TestDb>(pool: &Pool<DB>, t: &str, attempt: bool, seen: &Seen) -> Runner<DB> {
    let seen = Arc::clone(seen);
    let handler = move |d: Delivery<DB>| {
        *seen.lock().unwrap().entry(d.id()).or_default() += 1;
        async { Outcome::ack() }
    };
    let queue = Queue::table(Table::new(t)).advisory_lock().workers(WORKERS);
    let runner = Runner::new(pool.clone()).poll_interval(Duration::from_millis(50));
    if attempt {
        runner.mount(queue.attempt("attempt").handler(handler))
    } else {
        runner.mount(queue.handler(handler))
    }
}

/// Two runners of 8 workers (as two processes, each with its own pool) drain 400 rows: each row
/// is delivered once, and no key is left once they stop — with an attempt column (the claim's
/// re-read is then an `UPDATE` on PostgreSQL and SQLite) and without. An ack's key goes in the
/// statement that deletes its row: a claim that took it before that statement committed would
/// deliver the row again.
pub(crate) async fn each_row_once_across_two_runners_and_no_key_left<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    for attempt in [true, false] {
        let t = ctx
            .table(Spec {
                attempt,
                ..Spec::default()
            })
            .await;
        let payloads: Vec<String> = (0..400).map(|i| format!("job {i}")).collect();
        let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
        DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
            .await
            .unwrap();
        let seen = Seen::default();
        let (one, other) = (ctx.pool(POOL).await, ctx.pool(POOL).await);
        let one = acking(&one, &t, attempt, &seen).start().await.unwrap();
        let other = acking(&other, &t, attempt, &seen).start().await.unwrap();
        ctx.wait_none(&t, "1 = 1", 60).await;
        one.shutdown().await.unwrap();
        other.shutdown().await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
        assert!(
            twice.is_empty(),
            "rows delivered more than once (attempt column: {attempt}): {twice:?}"
        );
        assert_eq!(
            seen.len(),
            400,
            "every row delivered (attempt column: {attempt})"
        );
        assert_eq!(
            keys::held(&ctx, &t).await,
            0,
            "no key left (attempt column: {attempt})"
        );
    }
    ctx.drop_tables().await;
}

/// Rows of every outcome, interleaved so that each claim's session holds several kinds: acks and
/// drops go to the grouped acks (one statement per session), retries, dead letters and delays
/// settle on the same session meanwhile, row by row. Each ends as its outcome says, and no key
/// is left.
pub(crate) async fn retries_drops_and_dead_letters_among_grouped_acks_settle<DB: TestDb>() {
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
    const KINDS: [&str; 5] = ["ack", "drop", "retry", "dead", "later"];
    let jobs: Vec<Job<'_>> = (0..80)
        .map(|i| Job::new(KINDS[i % KINDS.len()]).group("mail"))
        .collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(table)
        .named("mail")
        .advisory_lock()
        .workers(WORKERS)
        .attempt("attempt")
        .max_attempts(5)
        .dead_letter(DeadLetter::group("mail_dead"))
        .handler(move |d: Delivery<DB>| {
            let kind = String::from_utf8_lossy(d.payload()).into_owned();
            let outcome = match (kind.as_str(), d.attempt()) {
                ("drop", _) => Outcome::drop(),
                ("retry", 1) => Outcome::retry(),
                ("later", 1) => Outcome::retry_after(Duration::from_millis(200)),
                ("dead", _) => Outcome::dead_letter(),
                _ => Outcome::ack(),
            };
            let _ = tx.send((kind, d.attempt()));
            async move { outcome }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "queue = 'mail'", 60).await;
    running.shutdown().await.unwrap();
    let mut deliveries: HashMap<(String, u32), usize> = HashMap::new();
    while let Ok(delivery) = seen.try_recv() {
        *deliveries.entry(delivery).or_default() += 1;
    }
    let expected: HashMap<(String, u32), usize> = [
        (("ack".to_owned(), 1), 16),
        (("drop".to_owned(), 1), 16),
        (("retry".to_owned(), 1), 16),
        (("retry".to_owned(), 2), 16),
        (("dead".to_owned(), 1), 16),
        (("later".to_owned(), 1), 16),
        (("later".to_owned(), 2), 16),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        deliveries, expected,
        "each row delivered as its outcome says, once each time"
    );
    assert_eq!(
        ctx.count(&t, "queue = 'mail_dead'").await,
        16,
        "the dead letters moved"
    );
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        16,
        "nothing left but the dead letters"
    );
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// A runner's handlers hold four rows when the server ends the session holding their keys: a
/// second runner delivers them meanwhile, and the first runner's acks, once its handlers end,
/// settle none of them (the rows stay for the second runner's acks, which settle them).
pub(crate) async fn a_killed_session_frees_its_rows_and_its_acks_settle_none<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        // Keys held in the process: no session to end.
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_of(&mut ctx, &["a", "b", "c", "d"]).await;
    let (first_gate, second_gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let (first, mut first_started) = gated(ctx.pool(6).await, &t, 4, &first_gate).await;
    let mut first_ids = Vec::new();
    for _ in 0..4 {
        first_ids.push(
            recv(&mut first_started, "the first runner's four deliveries", 30)
                .await
                .0,
        );
    }
    assert!(
        keys::end_sessions(&ctx, &t).await > 0,
        "a session held the keys"
    );
    let (second, mut second_started) = gated(ctx.pool(6).await, &t, 4, &second_gate).await;
    let mut second_ids = Vec::new();
    for _ in 0..4 {
        second_ids.push(
            recv(&mut second_started, "the freed rows delivered again", 30)
                .await
                .0,
        );
    }
    first_ids.sort_unstable();
    second_ids.sort_unstable();
    assert_eq!(
        first_ids, second_ids,
        "the killed session's rows, delivered again"
    );
    // The first runner's handlers end: their acks fail, the rows stay (in work elsewhere).
    first_gate.add_permits(4);
    first.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        4,
        "the acks of a session the server ended settle none of its rows"
    );
    second_gate.add_permits(4);
    ctx.wait_none(&t, "1 = 1", 30).await;
    second.shutdown().await.unwrap();
    assert_eq!(keys::held(&ctx, &t).await, 0, "no key left");
    ctx.drop_tables().await;
}

/// The server ends the session holding the keys of two rows in work (as a restart would): the
/// rows are claimable again at once, and their handlers, which nothing stops, are told —
/// `Delivery::cancelled()` fires within a few poll intervals (the runner pings a session whose
/// handlers work longer than one). Before, nothing told them: a handler that went on overlapped
/// the row's next delivery unaware.
pub(crate) async fn handlers_on_an_ended_session_are_told<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        // Keys held in the process: no session to end.
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = rows_of(&mut ctx, &["a", "b"]).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .workers(2)
        .handler(move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(("started", d.id()));
                let told = tokio::time::timeout(Duration::from_secs(20), d.cancelled()).await;
                let _ = tx.send((if told.is_ok() { "told" } else { "never told" }, d.id()));
                Outcome::retry()
            }
        });
    let running = Runner::new(ctx.pool(6).await)
        .poll_interval(Duration::from_millis(100))
        .mount(queue)
        .start()
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            recv(&mut seen, "two handlers to start", 30).await.0,
            "started"
        );
    }
    assert!(
        keys::end_sessions(&ctx, &t).await > 0,
        "a session held the keys"
    );
    let ended = tokio::time::Instant::now();
    for _ in 0..2 {
        let (what, id) = recv(&mut seen, "the handlers to be told", 30).await;
        assert_eq!(what, "told", "row {id}, after {:?}", ended.elapsed());
    }
    assert!(
        ended.elapsed() < Duration::from_secs(5),
        "told within a few poll intervals: {:?}",
        ended.elapsed()
    );
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
