//! `.workers(8).by_key(..)`: within one runner the rows of a key start in id order and never two at
//! once, as the handlers see it, while different keys run at the same instant; and a slow key
//! holds back none of the others.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::time::Instant;

use crate::support::{Ctx, Form, Spec, TestDb, wait_for};

pub(crate) const KEYS: [&str; 4] = ["k0", "k1", "k2", "k3"];
/// Each job's payload: its key's index.
const PAYLOADS: [[u8; 1]; 4] = [[0], [1], [2], [3]];
const ROWS_PER_KEY: usize = 50;
const WORKERS: usize = 8;
/// How long a handler waits, at most, for what it waits for (another key in work, the other
/// keys drained): past it, the test fails.
pub(crate) const BOUND: Duration = Duration::from_secs(30);

/// One delivery, as its handler saw it.
#[derive(Debug, Clone, Copy)]
struct Run {
    key: usize,
    id: i64,
    /// The delivery's attempt: above 1, the row was claimed before (a lease given back or
    /// expired), which says how a row came late.
    attempt: u32,
    start: Instant,
    end: Instant,
}

/// What the handlers see: the rows in work per key, whether two keys were ever in work at the
/// same instant, whether a key ever had two in work, and every run.
#[derive(Default)]
struct Seen {
    in_work: [AtomicUsize; 4],
    keys_in_work: AtomicUsize,
    overlapped: AtomicBool,
    two_of_a_key: AtomicBool,
    runs: Mutex<Vec<Run>>,
}

impl Seen {
    fn start(&self, key: usize) {
        if self.in_work[key].fetch_add(1, Ordering::SeqCst) > 0 {
            self.two_of_a_key.store(true, Ordering::SeqCst);
            return;
        }
        if self.keys_in_work.fetch_add(1, Ordering::SeqCst) >= 1 {
            self.overlapped.store(true, Ordering::SeqCst);
        }
    }

    fn end(&self, key: usize, id: i64, attempt: u32, start: Instant) {
        self.runs.lock().unwrap().push(Run {
            key,
            id,
            attempt,
            start,
            end: Instant::now(),
        });
        if self.in_work[key].fetch_sub(1, Ordering::SeqCst) == 1 {
            self.keys_in_work.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Per key: strictly increasing ids in start order, each run ended before the next began.
    fn check_order(&self) {
        assert!(
            !self.two_of_a_key.load(Ordering::SeqCst),
            "a handler started while another row of its key was in work"
        );
        let mut runs = self.runs.lock().unwrap().clone();
        runs.sort_by_key(|r| r.start);
        let first = runs.first().map(|r| r.start);
        let at = |r: &Run| first.map(|f| r.start - f).unwrap_or_default();
        for key in 0..KEYS.len() {
            let of_key: Vec<&Run> = runs.iter().filter(|r| r.key == key).collect();
            assert_eq!(of_key.len(), ROWS_PER_KEY, "key {key}: every row ran once");
            for pair in of_key.windows(2) {
                assert!(
                    pair[0].id < pair[1].id,
                    "key {key}: row {} (attempt {}, at {:?}) started after row {} (attempt {}, \
                     at {:?})",
                    pair[1].id,
                    pair[1].attempt,
                    at(pair[1]),
                    pair[0].id,
                    pair[0].attempt,
                    at(pair[0]),
                );
                assert!(
                    pair[0].end <= pair[1].start,
                    "key {key}: rows {} and {} were in work at once",
                    pair[0].id,
                    pair[1].id
                );
            }
        }
    }
}

/// A job per key index of `order`, of that key (its group), its payload the index.
pub(crate) async fn enqueue<DB: TestDb>(
    ctx: &Ctx<DB>,
    t: &str,
    order: impl Iterator<Item = usize>,
) {
    let table = Table::new(t).group("queue").retry_after("retry_after");
    let jobs: Vec<Job<'_>> = order
        .map(|key| Job::new(&PAYLOADS[key]).group(KEYS[key]))
        .collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
}

/// Waits, at most [`BOUND`], until `done`; `false` if it timed out.
async fn bounded(done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + BOUND;
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

/// 4 keys × 50 rows, interleaved, on a table whose key column is declared on the queue
/// (`key_column`, the table description naming no group): per key in id order, never two at
/// once; two keys in work at one instant.
pub(crate) async fn by_key_keeps_each_key_in_order<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    enqueue(
        &ctx,
        &t,
        (0..ROWS_PER_KEY * KEYS.len()).map(|i| i % KEYS.len()),
    )
    .await;

    let seen = Arc::new(Seen::default());
    let first = Arc::new(AtomicBool::new(true));
    let handler = {
        let seen = Arc::clone(&seen);
        move |d: Delivery<DB>| {
            let (seen, first) = (Arc::clone(&seen), Arc::clone(&first));
            async move {
                let (key, id, attempt, start) = (
                    usize::from(d.payload()[0]),
                    d.id(),
                    d.attempt(),
                    Instant::now(),
                );
                seen.start(key);
                // The very first delivery waits for another key to be in work with it.
                if first.swap(false, Ordering::SeqCst) {
                    bounded(|| seen.overlapped.load(Ordering::SeqCst)).await;
                }
                // Random-ish short work: 0 to 3 ms.
                let work = u64::try_from(id.rem_euclid(7)).unwrap() / 2;
                tokio::time::sleep(Duration::from_millis(work)).await;
                seen.end(key, id, attempt, start);
                Outcome::ack()
            }
        }
    };
    let queue = F::apply(Queue::table(Table::new(&t).retry_after("retry_after")))
        .workers(WORKERS)
        .by_key(sqlx_queue::ByKey::column("queue"))
        .handler(handler);
    let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for(
        "every row to be handled",
        Duration::from_secs(60),
        || async { ctx.count(&t, "1 = 1").await == 0 },
    )
    .await;
    running.shutdown().await.unwrap();
    pool.close().await;
    seen.check_order();
    assert!(
        seen.overlapped.load(Ordering::SeqCst),
        "no two keys were ever in work at the same instant"
    );
    ctx.drop_tables().await;
}

/// 4 keys × 50 rows, the slow key's rows first (a claim in id order alone would fill the
/// workers with them): its handler waits until the other keys' 150 rows are all done.
pub(crate) async fn a_slow_key_holds_back_no_other<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let others = (0..ROWS_PER_KEY * 3).map(|i| 1 + i % 3);
    enqueue(&ctx, &t, std::iter::repeat_n(0, ROWS_PER_KEY).chain(others)).await;

    let seen = Arc::new(Seen::default());
    let others_done = Arc::new(AtomicUsize::new(0));
    let timed_out = Arc::new(AtomicBool::new(false));
    let handler = {
        let (seen, others_done, timed_out) = (
            Arc::clone(&seen),
            Arc::clone(&others_done),
            Arc::clone(&timed_out),
        );
        move |d: Delivery<DB>| {
            let (seen, others_done, timed_out) = (
                Arc::clone(&seen),
                Arc::clone(&others_done),
                Arc::clone(&timed_out),
            );
            async move {
                let (key, id, attempt, start) = (
                    usize::from(d.payload()[0]),
                    d.id(),
                    d.attempt(),
                    Instant::now(),
                );
                seen.start(key);
                if key == 0 {
                    let drained = || others_done.load(Ordering::SeqCst) == 3 * ROWS_PER_KEY;
                    if !bounded(drained).await {
                        timed_out.store(true, Ordering::SeqCst);
                    }
                } else {
                    others_done.fetch_add(1, Ordering::SeqCst);
                }
                seen.end(key, id, attempt, start);
                Outcome::ack()
            }
        }
    };
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let queue = F::apply(Queue::table(table))
        .workers(WORKERS)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler);
    let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for(
        "the other keys' rows, while the slow key's first row is in work",
        BOUND,
        || async { others_done.load(Ordering::SeqCst) == 3 * ROWS_PER_KEY },
    )
    .await;
    wait_for("every row to be handled", BOUND, || async {
        ctx.count(&t, "1 = 1").await == 0
    })
    .await;
    running.shutdown().await.unwrap();
    pool.close().await;
    assert!(
        !timed_out.load(Ordering::SeqCst),
        "the slow key's handler waited {BOUND:?} for the other keys: they were held back"
    );
    seen.check_order();
    ctx.drop_tables().await;
}
