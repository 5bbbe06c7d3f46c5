//! Failed deliveries back off, a binary of its own (the `it` binary takes many minutes to
//! build): an `Err` from a handler, `Outcome::fail()` and a panic return the row after the
//! queue's backoff, written into its `retry_after`, not at once — so an outage of what a handler
//! calls does not use up its attempts and dead-letter the backlog.
//!
//! On every form of every database: a handler failing for 10 s with `max_attempts(5)` and the
//! default backoff (2 s doubling) dead-letters nothing, and every row is acked once the outage
//! ends (with `Backoff::none()`, the same outage dead-letters every row within a second:
//! the default is what holds); failures are counted apart from explicit retries.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx_queue::{Backoff, DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table};

use support::{Ctx, Form, Spec, TestDb, report, wait_for};

/// How long the tests' outage lasts.
const OUTAGE: Duration = Duration::from_secs(10);
/// Rows enqueued before the outage.
const ROWS: usize = 4;

/// Each row's deliveries: the moment each started, and its attempt.
type Seen = Arc<Mutex<HashMap<i64, Vec<(Instant, u32)>>>>;

/// A queue of form `F` on a fresh table with a dead-letter table, `max_attempts(5)`, the
/// backoff given, whose handler fails (`Err`) until `OUTAGE` has passed since `start`, and
/// acks after; `ROWS` rows enqueued. Returns the runner's `Running`, the tables and what the
/// handler saw.
async fn outage<DB: TestDb, F: Form<DB>>(
    ctx: &mut Ctx<DB>,
    backoff: Option<Backoff>,
) -> (sqlx_queue::Running, String, String, Seen) {
    let t = ctx.table(Spec::lease()).await;
    let dead = ctx.table(Spec::lease()).await;
    let table = Table::new(&t).retry_after("retry_after");
    let seen: Seen = Arc::default();
    let start = Instant::now();
    let handler = {
        let seen = Arc::clone(&seen);
        move |d: Delivery<DB>| {
            let seen = Arc::clone(&seen);
            async move {
                let now = Instant::now();
                seen.lock()
                    .unwrap()
                    .entry(d.id())
                    .or_default()
                    .push((now, d.attempt()));
                if now.duration_since(start) < OUTAGE {
                    Err("the partner is down")
                } else {
                    Ok(())
                }
            }
        }
    };
    let queue = F::apply(Queue::table(table.clone()))
        .workers(2)
        .attempt("attempt")
        .max_attempts(5)
        .dead_letter(DeadLetter::table(&dead));
    let queue = match backoff {
        Some(backoff) => queue.backoff(backoff),
        None => queue,
    };
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(100))
        .mount(queue.handler(handler))
        .start()
        .await
        .unwrap();
    // In one statement: SQLite would give a dead-lettered row's id to a row enqueued after,
    // which its dead-letter table (keyed by id) would then refuse.
    let payloads: Vec<String> = (0..ROWS).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    (running, t, dead, seen)
}

/// The default backoff outlasts a 10 s outage within five attempts: nothing is dead-lettered,
/// every row is acked after the outage, its deliveries at most five and their gaps at least
/// the backoff's lower bounds (1 s, 2 s, 4 s, 8 s).
async fn an_outage_dead_letters_nothing<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (running, t, dead, seen) = outage::<DB, F>(&mut ctx, None).await;
    ctx.wait_none(&t, "1 = 1", 60).await;
    wait_for("the last ack counted", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.acked == ROWS as u64 }
    })
    .await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&dead, "1 = 1").await, 0, "nothing dead-lettered");
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), ROWS);
    for (id, deliveries) in &seen {
        assert!(
            deliveries.len() >= 2 && deliveries.len() <= 5,
            "row {id}: {deliveries:?}"
        );
        for (n, pair) in deliveries.windows(2).enumerate() {
            let gap = pair[1].0 - pair[0].0;
            let least = Duration::from_secs(1 << n) - Duration::from_millis(50);
            assert!(gap >= least, "row {id}, retry {}: after {gap:?}", n + 1);
        }
    }
    assert_eq!(stats.acked, ROWS as u64);
    assert_eq!(stats.dead_lettered, 0);
    let failed: usize = seen.values().map(|d| d.len() - 1).sum();
    assert_eq!(stats.failures, failed as u64, "{stats:?}");
    report(&format!(
        "backoff, {} {}: a 10 s outage, {ROWS} rows, {} deliveries, none dead-lettered",
        DB::LABEL,
        F::NAME,
        failed + ROWS
    ));
    ctx.drop_tables().await;
}

/// Without a backoff (`Backoff::none()`), the same outage dead-letters every row, each after
/// its five deliveries, in less time than the default backoff's five attempts take at the least
/// (15 s).
async fn without_backoff_an_outage_dead_letters_all<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let started = Instant::now();
    let (running, t, dead, seen) = outage::<DB, F>(&mut ctx, Some(Backoff::none())).await;
    ctx.wait_none(&t, "1 = 1", 30).await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&dead, "1 = 1").await, ROWS as i64);
    let seen = seen.lock().unwrap().clone();
    assert!(seen.values().all(|d| d.len() == 5), "{seen:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    ctx.drop_tables().await;
}

/// `Stats` tells failures from explicit retries: each row is retried once (`Outcome::retry`),
/// then fails once (a panic on one row, an `Err` on the others), then is acked.
async fn failures_are_counted_apart_from_retries<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    support::intended_panics_without_backtrace();
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t).retry_after("retry_after");
    let seen: Arc<Mutex<HashMap<i64, u32>>> = Arc::default();
    let queue = F::apply(Queue::table(table.clone()))
        .backoff(Backoff::new(
            Duration::from_millis(20),
            Duration::from_millis(40),
        ))
        .handler({
            let seen = Arc::clone(&seen);
            move |d: Delivery<DB>| {
                let n = {
                    let mut seen = seen.lock().unwrap();
                    let n = seen.entry(d.id()).or_default();
                    *n += 1;
                    *n
                };
                async move {
                    match n {
                        1 => Ok(Outcome::retry()),
                        2 if d.payload() == b"panics" => panic!("intended: a failing handler"),
                        2 => Err("failed"),
                        _ => Ok(Outcome::ack()),
                    }
                }
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    for payload in ["panics", "errs", "errs"] {
        DB::enqueue(&ctx.pool, &table, Job::new(payload))
            .await
            .unwrap();
    }
    ctx.wait_none(&t, "1 = 1", 30).await;
    wait_for("the last ack counted", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.acked == 3 }
    })
    .await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    assert_eq!(stats.failures, 3, "{stats:?}");
    assert_eq!(stats.panicked, 1, "{stats:?}");
    assert_eq!(
        stats.retried, 6,
        "three explicit retries and three failures: {stats:?}"
    );
    ctx.drop_tables().await;
}

/// One module per database; the outage tests of its forms run at once in one `#[tokio::test]`
/// (each waits out the outage, idle), the others one per form.
macro_rules! per_database {
    ($($db:ident => $ty:ty { $($form:ident => $f:ident),+ $(,)? });* $(;)?) => {$(
        mod $db {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_outage_dead_letters_nothing_on_any_form() {
                crate::support::on_server_of(module_path!(), async {
                    tokio::join!($(
                        crate::an_outage_dead_letters_nothing::<$ty, crate::support::$f>()
                    ),+);
                })
                .await;
            }

            $(
                mod $form {
                    forms!($ty, crate::support::$f:
                        without_backoff_an_outage_dead_letters_all,
                        failures_are_counted_apart_from_retries,
                    );
                }
            )+
        }
    )*};
}

macro_rules! forms {
    ($db:ty, $form:ty: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::$test::<$db, $form>()).await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite {
        lease => LeaseForm,
        advisory => AdvisoryForm,
    };
    postgres => sqlx::Postgres {
        lease => LeaseForm,
        row_lock => RowLockForm,
        advisory => AdvisoryForm,
    };
    postgres18 => sqlx::Postgres {
        lease => LeaseForm,
        row_lock => RowLockForm,
        advisory => AdvisoryForm,
    };
    mysql => sqlx::MySql {
        lease => LeaseForm,
        row_lock => RowLockForm,
        advisory => AdvisoryForm,
    };
}
