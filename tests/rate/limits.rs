//! Rate limits across runners: starts per second, bursts, statements, refusals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};
use tokio::time::Instant;

use crate::support::{AdvisoryForm, Ctx, Form, RowLockForm, Spec, TestDb, report, unique};

/// The start times the handlers record, since the test's start.
type Starts = Arc<Mutex<Vec<Duration>>>;

/// `CREATE TABLE` of a limiter table on `DB` (the README's DDL).
pub(crate) fn limits_ddl<DB: TestDb>(name: &str) -> String {
    match DB::LABEL {
        "sqlite" => format!(
            "CREATE TABLE {name} (name TEXT PRIMARY KEY, tokens REAL NOT NULL, \
             refilled_at REAL NOT NULL, granted INTEGER NOT NULL)"
        ),
        "mysql" => format!(
            "CREATE TABLE {name} (name VARCHAR(255) PRIMARY KEY, tokens DOUBLE NOT NULL, \
             refilled_at DOUBLE NOT NULL, granted BIGINT NOT NULL)"
        ),
        _ => format!(
            "CREATE TABLE {name} (name TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL, \
             refilled_at DOUBLE PRECISION NOT NULL, granted BIGINT NOT NULL)"
        ),
    }
}

/// A jobs table and a limiter table of their own.
async fn tables<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, String) {
    let t = ctx.table(Spec::lease()).await;
    let l = format!("l_{}", unique());
    ctx.exec(&limits_ddl::<DB>(&l)).await;
    (t, l)
}

pub(crate) async fn enqueue<DB: TestDb>(ctx: &Ctx<DB>, t: &str, n: usize) {
    let payloads: Vec<String> = (0..n).map(|i| format!("job {i}")).collect();
    for chunk in payloads.chunks(500) {
        let jobs: Vec<Job<'_>> = chunk.iter().map(Job::new).collect();
        DB::enqueue_many(&ctx.pool, &Table::new(t), &jobs)
            .await
            .unwrap();
    }
}

/// A handler that records its start and acks.
fn recording<DB: TestDb>(
    starts: &Starts,
    t0: Instant,
) -> impl Fn(Delivery<DB>) -> std::future::Ready<Outcome> + Send + Sync + Clone + 'static {
    let starts = Arc::clone(starts);
    move |_d: Delivery<DB>| {
        starts.lock().unwrap().push(t0.elapsed());
        std::future::ready(Outcome::ack())
    }
}

/// The most starts within any stretch of `window`.
pub(crate) fn most_within(starts: &[Duration], window: Duration) -> usize {
    let mut starts = starts.to_vec();
    starts.sort();
    let mut most = 0;
    let mut first = 0;
    for (last, at) in starts.iter().enumerate() {
        while *at - starts[first] >= window {
            first += 1;
        }
        most = most.max(last + 1 - first);
    }
    most
}

async fn drop_limits<DB: TestDb>(ctx: Ctx<DB>, l: &str) {
    ctx.exec(&format!("DROP TABLE {l}")).await;
    ctx.drop_tables().await;
}

/// Three runners, each on a pool of its own with eight lease workers, serve one table of 2,000
/// jobs under `rate_limit(200, 1 s)` for five seconds (the scenario, not a wait). Tolerances:
/// the first second may start the burst (200, the bucket is full at start) and its refill (200)
/// and 5 % more; every later second at most 210 (the token bucket allows 200, plus the few
/// tokens a second's edge splits); the throughput of seconds 1 to 5 within 10 % of 200 a
/// second; the five seconds together at most burst + 5 × 200 + 5 %.
pub(crate) async fn three_runners_keep_to_two_hundred_a_second<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, l) = tables(&mut ctx).await;
    enqueue(&ctx, &t, 2000).await;
    let starts: Starts = Arc::default();
    let t0 = Instant::now();
    let mut runners = Vec::new();
    for _ in 0..3 {
        let queue = Queue::table(Table::new(&t).limits(&l))
            .lease("locked_until")
            .workers(8)
            .rate_limit(200, Duration::from_secs(1))
            .handler(recording::<DB>(&starts, t0));
        runners.push(
            Runner::new(ctx.pool(10).await)
                .mount(queue)
                .start()
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep_until(t0 + Duration::from_secs(5)).await;
    let mut statements = Vec::new();
    for runner in runners {
        statements.push(runner.stats().rate_statements);
        runner.shutdown().await.unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let mut per_second = [0_usize; 5];
    for at in &starts {
        if let Some(n) = usize::try_from(at.as_secs())
            .ok()
            .and_then(|second| per_second.get_mut(second))
        {
            *n += 1;
        }
    }
    let after_burst: usize = per_second[1..].iter().sum();
    let total: usize = per_second.iter().sum();
    report(&format!(
        "{}: three runners, rate_limit(200, 1 s), 5 s: starts per second {per_second:?}, \
         {:.1}/s after the first second, limiter statements per runner {statements:?}",
        DB::LABEL,
        after_burst as f64 / 4.0
    ));
    assert!(per_second[0] <= 420, "the first second: {per_second:?}");
    for (second, n) in per_second.iter().enumerate().skip(1) {
        assert!(*n <= 210, "second {second}: {n} starts ({per_second:?})");
    }
    assert!(
        (720..=880).contains(&after_burst),
        "throughput after the first second {:.1}/s, not within 10 % of 200 ({per_second:?})",
        after_burst as f64 / 4.0
    );
    assert!(
        total <= 1260,
        "five seconds: {total} starts ({per_second:?})"
    );
    let statements: u64 = statements.iter().sum();
    assert!(
        statements < 1500,
        "{statements} limiter statements for {total} starts"
    );
    drop_limits(ctx, &l).await;
}

/// Two runners of batches of five (lease form) under `rate_limit(50, 1 s)` with a burst of 5
/// get 60 rows at once, three times, 1.5 s apart: no stretch of a second starts more than the
/// bucket allows (5 + 50, and 3 more for a start recorded by the handler on this host, some
/// milliseconds after its grant on the database's clock), nor any 200 ms more than 5 + 10 + 3;
/// and the limiter ran about one
/// statement per batch (a busy poll would run thousands).
pub(crate) async fn bursts_of_rows_never_exceed_the_bucket_and_nothing_polls<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, l) = tables(&mut ctx).await;
    let starts: Starts = Arc::default();
    let t0 = Instant::now();
    let mut runners = Vec::new();
    for _ in 0..2 {
        let recorded = Arc::clone(&starts);
        let queue = Queue::table(Table::new(&t).limits(&l))
            .lease("locked_until")
            .workers(2)
            .rate_limit(50, Duration::from_secs(1))
            .rate_burst(5)
            .batch(5)
            .batch_handler(move |rows: Vec<Delivery<DB>>| {
                let at = t0.elapsed();
                recorded
                    .lock()
                    .unwrap()
                    .extend(std::iter::repeat_n(at, rows.len()));
                std::future::ready(vec![Outcome::ack(); rows.len()])
            });
        runners.push(
            Runner::new(ctx.pool(6).await)
                .mount(queue)
                .start()
                .await
                .unwrap(),
        );
    }
    for burst in 0..3 {
        tokio::time::sleep_until(t0 + Duration::from_millis(1500) * burst).await;
        enqueue(&ctx, &t, 60).await;
    }
    ctx.wait_none(&t, "1 = 1", 20).await;
    let statements: u64 = runners.iter().map(|r| r.stats().rate_statements).sum();
    for runner in runners {
        runner.shutdown().await.unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let (second, fifth) = (
        most_within(&starts, Duration::from_secs(1)),
        most_within(&starts, Duration::from_millis(200)),
    );
    let last = starts.iter().max().copied().unwrap_or_default();
    report(&format!(
        "{}: bursts of 60 under rate_limit(50, 1 s) burst 5, batches of 5: {} starts, at most \
         {second} in a second, {fifth} in 200 ms, last at {last:?}, {statements} limiter \
         statements",
        DB::LABEL,
        starts.len()
    ));
    assert_eq!(starts.len(), 180);
    assert!(second <= 58, "{second} starts within a second");
    assert!(fifth <= 18, "{fifth} starts within 200 ms");
    assert!(
        statements <= 150,
        "{statements} limiter statements for 36 batches: the queue polls its limiter"
    );
    drop_limits(ctx, &l).await;
}

/// The row lock form claims a row per worker (as the advisory lock form does): four workers in each of two
/// runners under `rate_limit(100, 1 s)`, burst 10, take 250 rows no faster than the bucket
/// allows (10 + 100 within a second, 3 more for a start recorded on this host), so the last
/// starts at least 2.3 s after the first.
pub(crate) async fn the_row_lock_form_keeps_to_the_limit<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    a_claim_per_worker::<DB, RowLockForm>().await;
}

/// As [`the_row_lock_form_keeps_to_the_limit`], on the advisory lock form (SQLite: within one
/// process).
pub(crate) async fn the_advisory_form_keeps_to_the_limit<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    a_claim_per_worker::<DB, AdvisoryForm>().await;
}

async fn a_claim_per_worker<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, l) = tables(&mut ctx).await;
    enqueue(&ctx, &t, 250).await;
    let starts: Starts = Arc::default();
    let t0 = Instant::now();
    let mut runners = Vec::new();
    for _ in 0..2 {
        let queue = F::apply(Queue::table(Table::new(&t).limits(&l)))
            .workers(4)
            .rate_limit(100, Duration::from_secs(1))
            .rate_burst(10)
            .handler(recording::<DB>(&starts, t0));
        runners.push(
            Runner::new(ctx.pool(8).await)
                .mount(queue)
                .start()
                .await
                .unwrap(),
        );
    }
    ctx.wait_none(&t, "1 = 1", 20).await;
    let statements: u64 = runners.iter().map(|r| r.stats().rate_statements).sum();
    for runner in runners {
        runner.shutdown().await.unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let second = most_within(&starts, Duration::from_secs(1));
    let (first, last) = (
        starts.iter().min().copied().unwrap_or_default(),
        starts.iter().max().copied().unwrap_or_default(),
    );
    report(&format!(
        "{} {}: 250 rows under rate_limit(100, 1 s) burst 10: at most {second} starts in a \
         second, {:?} from first to last, {statements} limiter statements",
        DB::LABEL,
        F::NAME,
        last - first
    ));
    assert_eq!(starts.len(), 250);
    assert!(second <= 113, "{} {second} starts within a second", F::NAME);
    assert!(
        last - first >= Duration::from_millis(2300),
        "{}: 250 starts within {:?}",
        F::NAME,
        last - first
    );
    assert!(statements <= 1000, "{statements} limiter statements");
    drop_limits(ctx, &l).await;
}

/// A rate limit on a table without a limiter table is refused at start, naming the call to
/// add; a limiter table that does not exist is a schema error naming it; `n = 0` and a zero
/// period panic at the builder's call.
pub(crate) async fn a_limit_without_its_table_is_refused_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, l) = tables(&mut ctx).await;
    let ack = |_d: Delivery<DB>| std::future::ready(Outcome::ack());
    let started = Runner::new(ctx.pool(2).await)
        .mount(
            Queue::table(Table::new(&t))
                .lease("locked_until")
                .rate_limit(5, Duration::from_secs(1))
                .handler(ack),
        )
        .start()
        .await;
    match started {
        Err(Error::Declaration { reason, .. }) => {
            assert!(reason.contains(".limits("), "{reason}");
        }
        other => panic!("not refused: {other:?}"),
    }
    let missing = format!("l_{}", unique());
    let started = Runner::new(ctx.pool(2).await)
        .mount(
            Queue::table(Table::new(&t).limits(&missing))
                .lease("locked_until")
                .rate_limit(5, Duration::from_secs(1))
                .handler(ack),
        )
        .start()
        .await;
    match started {
        Err(error @ Error::Schema(_)) => {
            assert!(error.to_string().contains(&missing), "{error}");
        }
        other => panic!("not refused: {other:?}"),
    }
    let zero = std::panic::catch_unwind(|| {
        Queue::table(Table::new(&t)).rate_limit(0, Duration::from_secs(1))
    });
    let panic = zero.expect_err("n = 0 accepted");
    assert!(panic.downcast_ref::<&str>().unwrap().contains("at least 1"));
    let zero =
        std::panic::catch_unwind(|| Queue::table(Table::new(&t)).rate_limit(5, Duration::ZERO));
    assert!(zero.is_err(), "a zero period accepted");
    drop_limits(ctx, &l).await;
}
