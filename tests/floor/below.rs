//! A row that becomes claimable below the floor while a backlog keeps the claims at the floor —
//! here the hundredth row delivered, retried by its handler 200 ms later — is delivered again within the floor's
//! rescan (a second), long before the backlog ends: claims read from the queue's start again
//! at least that often.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Form, Spec, TestDb, wait_for};

/// Rows, each handled in [`WORK`] by one of [`WORKERS`]: a backlog of about four seconds.
const ROWS: usize = 1_600;
const WORKERS: usize = 2;
const WORK: Duration = Duration::from_millis(5);
/// The delivery, in start order, whose row is retried.
const RETRIED: usize = 100;

pub(crate) async fn rows_due_again_below_the_floor_are_delivered<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    // The retry is due a little later, once the claims' floor has passed its row.
    let table = Table::new(&t).retry_after("retry_after");
    let jobs: Vec<Job<'_>> = (0..ROWS).map(|_| Job::new("x")).collect();
    DB::enqueue_many(&ctx.pool, &table, &jobs).await.unwrap();

    let started = Arc::new(Mutex::new(Vec::<i64>::with_capacity(ROWS + 1)));
    let seen = Arc::clone(&started);
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .workers(WORKERS)
        .handler(move |d: Delivery<DB>| {
            let (id, attempt) = (d.id(), d.attempt());
            let retry = {
                let mut started = seen.lock().unwrap();
                started.push(id);
                // The hundredth row delivered, on its first attempt: the floor is past it.
                started.len() == RETRIED && attempt <= 1
            };
            async move {
                if retry {
                    return Outcome::retry_after(Duration::from_millis(200));
                }
                tokio::time::sleep(WORK).await;
                Outcome::ack()
            }
        });
    let pool = ctx.pool(u32::try_from(WORKERS).unwrap() + 2).await;
    let running = Runner::new(pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    wait_for("every row delivered", Duration::from_secs(60), || async {
        started.lock().unwrap().len() > ROWS
    })
    .await;
    running.shutdown().await.unwrap();
    pool.close().await;

    let started = started.lock().unwrap().clone();
    assert_eq!(
        started.len(),
        ROWS + 1,
        "each row once, the retried one twice"
    );
    let retried = started[RETRIED - 1];
    let again = started
        .iter()
        .skip(RETRIED)
        .position(|id| *id == retried)
        .expect("the retried row delivered again");
    let after = started.len() - RETRIED - 1 - again;
    crate::support::report(&format!(
        "{}: the retried row came back with {after} of {ROWS} rows left",
        F::NAME
    ));
    assert!(
        after >= ROWS / 4,
        "the retried row came back with {after} of {ROWS} rows left: claims kept to the floor \
         past its rescan"
    );
    let mut ids = started;
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), ROWS, "every row delivered");
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "every row settled");
    ctx.drop_tables().await;
}
