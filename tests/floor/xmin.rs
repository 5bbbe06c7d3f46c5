//! A drain while a transaction holds PostgreSQL's `xmin`: no entry of a settled row can be
//! removed or marked dead, so a claim that read the claim index from the queue's start would
//! walk every row drained before it — about `ROWS² / (2 × rows per claim)` entries over the
//! drain. Claims from the floor read each settled entry a few times. Counted by the server
//! (`pg_stat_user_indexes.idx_tup_read` of the table's indexes), not timed.

use std::time::Duration;

use sqlx::Connection as _;
use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Form, Spec, TestDb, as_pg, wait_for};

const ROWS: usize = 2_000;
const WORKERS: usize = 4;
/// Index entries read per row at most: its claim, settlement and re-read, a few versions each.
const READS_PER_ROW: usize = 20;

pub(crate) async fn a_drain_with_xmin_held_reads_few_settled_entries<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let pg = as_pg(&ctx.pool).expect("a PostgreSQL test");
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t);
    let jobs: Vec<Job<'_>> = (0..ROWS).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
        .execute(&pg)
        .await
        .unwrap();

    // A transaction that read the table and stays open for the whole drain.
    let url = ctx.url.clone().expect("a server URL");
    let mut holder = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT COUNT(*) FROM {t}"
    )))
    .execute(&mut holder)
    .await
    .unwrap();

    let reads_sql = format!(
        "SELECT CAST(COALESCE(SUM(idx_tup_read), 0) AS BIGINT) FROM pg_stat_user_indexes \
         WHERE relid = '{t}'::regclass"
    );
    let reads = async || -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(reads_sql.clone()))
            .fetch_one(&pg)
            .await
            .unwrap()
    };
    let before = reads().await;

    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&handled);
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .workers(WORKERS)
        .handler(move |_: Delivery<DB>| {
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::future::ready(Outcome::ack())
        });
    let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for("every row handled", Duration::from_secs(120), || async {
        handled.load(std::sync::atomic::Ordering::Relaxed) >= ROWS
    })
    .await;
    running.shutdown().await.unwrap();
    // Sessions that end send their statistics.
    pool.close().await;
    let least = before + i64::try_from(ROWS).unwrap();
    wait_for(
        "the drain's index reads counted",
        Duration::from_secs(20),
        || async { reads().await >= least },
    )
    .await;
    let read = usize::try_from(reads().await - before).unwrap();
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .unwrap();
    holder.close().await.unwrap();

    crate::support::report(&format!(
        "{}: {ROWS} rows drained with xmin held: {read} index entries read ({:.1} per row)",
        F::NAME,
        read as f64 / ROWS as f64
    ));
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "every row settled");
    assert!(
        read <= READS_PER_ROW * ROWS,
        "{read} index entries read draining {ROWS} rows with xmin held: claims walk the entries \
         of the rows settled before them"
    );
    ctx.drop_tables().await;
}
