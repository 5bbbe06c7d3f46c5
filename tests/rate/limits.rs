//! Rate limits across runners: starts per second, bursts, statements, refusals.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};
use tokio::time::Instant;

use crate::support::{AdvisoryForm, Ctx, Form, RowLockForm, Spec, TestDb, report, unique};

/// The start times the handlers record, since the test's start.
type Starts = Arc<Mutex<Vec<Duration>>>;

/// `CREATE TABLE` of a limiter table on `DB` (the guide's DDL, docs/guide/order.md).
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

/// How late a handler may record a start after the limiter granted its token: the grant is
/// taken on the database's clock, then the claim runs and the handler is spawned, and only then
/// does the handler read this host's clock. On a loaded CI machine (every test of the binary
/// at once on 2 cores) that took up to ~80 ms; a start recorded late bunches with later ones.
pub(crate) const JITTER: Duration = Duration::from_millis(150);

/// Whether `starts` keep to a token bucket of `burst` tokens refilled at `per_second`, full at
/// the first start, with each start recorded up to `jitter` after its grant: for every stretch
/// from start `i` to start `j` (sorted), `j - i + 1 <= burst + per_second * (t_j - t_i +
/// jitter)` (a bucket full at the start admits exactly the sequences that keep to this). A
/// queue that stalled and then caught up with the tokens it saved keeps to it; one that started
/// more than its tokens does not. `Err` names the worst stretch.
pub(crate) fn within_bucket(
    starts: &[Duration],
    burst: u32,
    per_second: f64,
    jitter: Duration,
) -> Result<(), String> {
    let mut starts = starts.to_vec();
    starts.sort();
    // For each j, the worst i <= j maximises (j + 1 - rate t_j) + (rate t_i - i): keep the best
    // (rate t_i - i) so far.
    let mut best: Option<(f64, usize)> = None;
    let mut worst: Option<(f64, usize, usize)> = None;
    #[allow(clippy::cast_precision_loss, reason = "counts of a few thousand")]
    for (j, at) in starts.iter().enumerate() {
        let here = per_second * at.as_secs_f64() - j as f64;
        if best.is_none_or(|(b, _)| here > b) {
            best = Some((here, j));
        }
        let (b, i) = best.expect("set above");
        let excess = (j as f64 + 1.0 - per_second * at.as_secs_f64()) + b
            - f64::from(burst)
            - per_second * jitter.as_secs_f64();
        if worst.is_none_or(|(w, _, _)| excess > w) {
            worst = Some((excess, i, j));
        }
    }
    match worst {
        Some((excess, i, j)) if excess > 1e-9 => Err(format!(
            "{} starts from {:?} to {:?}: the bucket ({burst} + {per_second}/s, {jitter:?} of \
             recording delay) allows {:.1}",
            j - i + 1,
            starts[i],
            starts[j],
            f64::from(burst) + per_second * ((starts[j] - starts[i]) + jitter).as_secs_f64()
        )),
        _ => Ok(()),
    }
}

#[test]
fn the_bucket_check_admits_a_catch_up_and_refuses_a_start_too_many() {
    let ms = Duration::from_millis;
    // Burst 2, 10 a second, no jitter: two at once, then one every 100 ms.
    let paced = [ms(0), ms(0), ms(100), ms(200), ms(300)];
    assert_eq!(within_bucket(&paced, 2, 10.0, Duration::ZERO), Ok(()));
    // A stall saves at most the bucket's two tokens, spent at once after it; not three.
    let caught_up = [ms(0), ms(0), ms(400), ms(400)];
    assert_eq!(within_bucket(&caught_up, 2, 10.0, Duration::ZERO), Ok(()));
    let beyond = [ms(0), ms(0), ms(400), ms(400), ms(400)];
    assert!(within_bucket(&beyond, 2, 10.0, Duration::ZERO).is_err());
    // Three at once: one more than the bucket.
    let error = within_bucket(&[ms(0), ms(0), ms(0)], 2, 10.0, Duration::ZERO).unwrap_err();
    assert!(error.starts_with("3 starts"), "{error}");
    // A late start: admitted with its jitter, not without.
    let late = [ms(0), ms(0), ms(60), ms(200)];
    assert!(within_bucket(&late, 2, 10.0, Duration::ZERO).is_err());
    assert_eq!(within_bucket(&late, 2, 10.0, ms(50)), Ok(()));
    // Twice the rate, over a second: refused even with the jitter the tests allow.
    let twice: Vec<_> = (0..20).map(|i| ms(50 * i)).collect();
    assert!(within_bucket(&twice, 2, 10.0, JITTER).is_err());
}

async fn drop_limits<DB: TestDb>(ctx: Ctx<DB>, l: &str) {
    ctx.exec(&format!("DROP TABLE {l}")).await;
    ctx.drop_tables().await;
}

/// Three runners, each on a pool of its own with eight lease workers, serve one table of 2,000
/// jobs under `rate_limit(200, 1 s)` for five seconds (the scenario, not a wait). The starts
/// keep to the bucket ([`within_bucket`]: 200 at once, then 200 a second, with [`JITTER`]); the
/// throughput of seconds 1 to 5 is within 10 % of 200 a second (a stall of the loaded machine
/// is caught up from the tokens it saved, up to the bucket's 200). A second after a stall may
/// start more than 200: the bucket allows it.
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
            .rate_limit(sqlx_queue::RateLimit::new(200, Duration::from_secs(1)))
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
    if let Err(beyond) = within_bucket(&starts, 200, 200.0, JITTER) {
        panic!("{beyond} ({per_second:?})");
    }
    assert!(
        (720..=880).contains(&after_burst),
        "throughput after the first second {:.1}/s, not within 10 % of 200 ({per_second:?})",
        after_burst as f64 / 4.0
    );
    let statements: u64 = statements.iter().sum();
    assert!(
        statements < 1500,
        "{statements} limiter statements for {total} starts"
    );
    drop_limits(ctx, &l).await;
}

/// Two runners of batches of five (lease form) under `rate_limit(50, 1 s)` with a burst of 5
/// get 60 rows at once, three times, 1.5 s apart: the starts keep to the bucket
/// ([`within_bucket`]: 5 at once, then 50 a second, with [`JITTER`]), so each burst takes at
/// least 1.1 s less the jitter; and the limiter ran about one statement per batch (a busy poll
/// would run thousands).
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
            .rate_limit(sqlx_queue::RateLimit::new(50, Duration::from_secs(1)).burst(5))
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
    let last = starts.iter().max().copied().unwrap_or_default();
    let kept = within_bucket(&starts, 5, 50.0, JITTER);
    report(&format!(
        "{}: bursts of 60 under rate_limit(50, 1 s) burst 5, batches of 5: {} starts, last at \
         {last:?}, {statements} limiter statements, the bucket: {kept:?}",
        DB::LABEL,
        starts.len()
    ));
    assert_eq!(starts.len(), 180);
    if let Err(beyond) = kept {
        panic!("{beyond}");
    }
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
            .rate_limit(sqlx_queue::RateLimit::new(100, Duration::from_secs(1)).burst(10))
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
    let (first, last) = (
        starts.iter().min().copied().unwrap_or_default(),
        starts.iter().max().copied().unwrap_or_default(),
    );
    let kept = within_bucket(&starts, 10, 100.0, JITTER);
    report(&format!(
        "{} {}: 250 rows under rate_limit(100, 1 s) burst 10: {:?} from first to last, \
         {statements} limiter statements, the bucket: {kept:?}",
        DB::LABEL,
        F::NAME,
        last - first
    ));
    assert_eq!(starts.len(), 250);
    if let Err(beyond) = kept {
        panic!("{}: {beyond}", F::NAME);
    }
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
                .rate_limit(sqlx_queue::RateLimit::new(5, Duration::from_secs(1)))
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
                .rate_limit(sqlx_queue::RateLimit::new(5, Duration::from_secs(1)))
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
        Queue::table(Table::new(&t))
            .rate_limit(sqlx_queue::RateLimit::new(0, Duration::from_secs(1)))
    });
    let panic = zero.expect_err("n = 0 accepted");
    assert!(panic.downcast_ref::<&str>().unwrap().contains("at least 1"));
    let zero = std::panic::catch_unwind(|| {
        Queue::table(Table::new(&t)).rate_limit(sqlx_queue::RateLimit::new(5, Duration::ZERO))
    });
    assert!(zero.is_err(), "a zero period accepted");
    let zero =
        std::panic::catch_unwind(|| sqlx_queue::RateLimit::new(5, Duration::from_secs(1)).burst(0));
    let panic = zero.expect_err("a burst of 0 accepted");
    assert!(panic.downcast_ref::<&str>().unwrap().contains("at least 1"));
    drop_limits(ctx, &l).await;
}
