//! A rate limit behind a transaction pooler: PgBouncer in `pool_mode = transaction` in front of
//! the PostgreSQL of `SQLX_QUEUE_PG_URL`, at `SQLX_QUEUE_PGBOUNCER_URL`. The limiter's
//! statements then run unprepared, each in a transaction of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Postgres;
use sqlx_queue::{Delivery, Outcome, Pooler, Queue, Runner, Table};
use tokio::time::Instant;

use crate::limits::{JITTER, enqueue, limits_ddl, within_bucket};
use crate::support::{Ctx, Spec, pooled, report, unique};

/// Two runners through the pooler under `rate_limit(100, 1 s)`, burst 10, take 200 rows no
/// faster than the bucket allows ([`within_bucket`]: 10 at once, then 100 a second, with
/// [`JITTER`]), the last at least 1.8 s after the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_behind_a_transaction_pooler() {
    let Some(mut ctx) = Ctx::<Postgres>::new().await else {
        return;
    };
    if pooled(1).await.is_none() {
        return;
    }
    let t = ctx.table(Spec::lease()).await;
    let l = format!("l_{}", unique());
    ctx.exec(&limits_ddl::<Postgres>(&l)).await;
    enqueue(&ctx, &t, 200).await;
    let starts = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let mut runners = Vec::new();
    for _ in 0..2 {
        let recorded = Arc::clone(&starts);
        let queue = Queue::table(Table::new(&t).limits(&l).pooler(Pooler::Transaction))
            .lease("locked_until")
            .workers(4)
            .rate_limit(sqlx_queue::RateLimit::new(100, Duration::from_secs(1)).burst(10))
            .handler(move |_d: Delivery<Postgres>| {
                recorded.lock().unwrap().push(t0.elapsed());
                std::future::ready(Outcome::ack())
            });
        let pool = pooled(4).await.expect("the pooler");
        runners.push(Runner::new(pool).mount(queue).start().await.unwrap());
    }
    ctx.wait_none(&t, "1 = 1", 20).await;
    let statements: u64 = runners.iter().map(|r| r.stats().rate_statements).sum();
    for runner in runners {
        runner.shutdown().await.unwrap();
    }
    let starts = starts.lock().unwrap().clone();
    let kept = within_bucket(&starts, 10, 100.0, JITTER);
    let spread = starts.iter().max().copied().unwrap_or_default()
        - starts.iter().min().copied().unwrap_or_default();
    report(&format!(
        "pgbouncer: 200 rows under rate_limit(100, 1 s) burst 10: {spread:?} from first to last, \
         {statements} limiter statements, the bucket: {kept:?}"
    ));
    assert_eq!(starts.len(), 200);
    if let Err(beyond) = kept {
        panic!("{beyond}");
    }
    assert!(
        spread >= Duration::from_millis(1800),
        "200 starts within {spread:?}"
    );
    ctx.exec(&format!("DROP TABLE {l}")).await;
    ctx.drop_tables().await;
}
