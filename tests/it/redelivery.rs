// Redelivery: a settlement that makes a row claimable again wakes its queue's claim loop at once,
// whatever the number of workers: `redelivery_tests!(module, form(args))` for one form inside a
// database's module. The runner polls every second (the default), so a redelivery that waited
// for the poll would take about a second.

macro_rules! redelivery_tests {
    ($module:ident, $form:ident ( $($arg:expr)? )) => {
        mod $module {
            use std::time::Duration;

            use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
            use tokio::time::Instant;

            use super::*;

            /// How many times the row is retried before its ack.
            const RETRIES: u32 = 20;

            /// The times between one delivery of a row and the next, over `RETRIES` retries,
            /// with `workers` workers and `outcome` for every delivery but the last.
            async fn gaps(workers: usize, outcome: Outcome) -> Vec<Duration> {
                let Some(mut ctx) = Ctx::<Db>::new().await else { return Vec::new() };
                let t = ctx.table(Spec::lease()).await;
                let jobs = Table::new(&t).retry_after("retry_after");
                jobs.enqueue(&ctx.pool, Job::new("again")).await.unwrap();
                let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
                let queue = Queue::table(jobs)
                    .$form($($arg)?)
                    .attempt("attempt")
                    .workers(workers)
                    .handler(move |d: Delivery<Db>| {
                        let _ = tx.send(Instant::now());
                        let last = d.attempt() > RETRIES;
                        async move { if last { Outcome::ack() } else { outcome } }
                    });
                let running = Runner::new(ctx.pool.clone()).mount(queue).start().await.unwrap();
                let mut starts = Vec::new();
                for i in 0..=RETRIES {
                    starts.push(recv(&mut seen, &format!("delivery {}", i + 1), 10).await);
                }
                ctx.wait_none(&t, "1 = 1", 5).await;
                running.shutdown().await.unwrap();
                ctx.drop_tables().await;
                starts.windows(2).map(|pair| pair[1] - pair[0]).collect()
            }

            fn check(workers: usize, what: &str, mut gaps: Vec<Duration>) {
                if gaps.is_empty() {
                    return; // database skipped
                }
                gaps.sort();
                let (p50, p90, max) = (gaps[gaps.len() / 2], gaps[gaps.len() * 9 / 10], gaps[gaps.len() - 1]);
                crate::support::report(&format!(
                    "{}: {what} with {workers} workers: redelivery p50 {p50:?}, p90 {p90:?}, max {max:?}",
                    stringify!($module)
                ));
                // A redelivery that waited for the 1 s poll would take about a second.
                assert!(p90 < Duration::from_millis(100) && max < Duration::from_millis(500),
                    "{what} with {workers} workers: p50 {p50:?}, p90 {p90:?}, max {max:?}");
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_retried_row_returns_at_once_with_one_worker_or_eight() {
                for workers in [1, 8] {
                    check(workers, "retry", gaps(workers, Outcome::retry()).await);
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_short_retry_after_returns_when_due_not_at_the_poll() {
                let delay = Duration::from_millis(20);
                for workers in [1, 8] {
                    let gaps = gaps(workers, Outcome::retry_after(delay)).await;
                    assert!(gaps.iter().all(|gap| *gap >= delay), "not before it is due: {gaps:?}");
                    check(workers, "retry_after(20 ms)", gaps);
                }
            }
        }
    };
}
