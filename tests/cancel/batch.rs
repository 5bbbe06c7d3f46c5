//! Cancelling a job whose row is in work in a batch: the batch's delivery of that row alone is
//! told (its own `cancelled()`), the batch's other rows settle by their handler's outcome, and
//! the cancelled row is removed whatever the handler returned for it — on the lease form at the
//! runner's next renewal (its lease taken away), on the row lock and advisory forms by a request
//! (PostgreSQL: notified at once; else read at the next poll), removed with the row.

use std::time::Duration;

use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::queued::enqueue;
use crate::support::{
    AdvisoryForm, Ctx, Form, LeaseForm, RowLockForm, Spec, TestDb, recv, wait_for,
};

/// What a batch handler saw: the ids it was given, then the id whose delivery was cancelled
/// and whether the batch's other delivery was cancelled too by then.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(Vec<i64>),
    Cancelled { id: i64, others_too: bool },
}

/// The lease of the lease form's batches: renewed every second.
const LEASE: Duration = Duration::from_secs(2);

pub(crate) async fn a_leased_batch_row_is_cancelled_alone<DB: TestDb>() {
    a_batch_row_is_cancelled_alone::<DB, LeaseForm>().await;
}

pub(crate) async fn a_row_lock_batch_row_is_cancelled_alone<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    a_batch_row_is_cancelled_alone::<DB, RowLockForm>().await;
}

pub(crate) async fn an_advisory_batch_row_is_cancelled_alone<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    a_batch_row_is_cancelled_alone::<DB, AdvisoryForm>().await;
}

/// Two jobs in work in one batch of form `F`; the first is cancelled: its delivery's
/// `cancelled()` fires within the form's bound and the other's does not; the handler acks both;
/// the cancelled row is gone (and its request), the other acked.
async fn a_batch_row_is_cancelled_alone<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let cancels = format!("{t}_cancels");
    let leased = F::NAME == "lease";
    let table = Table::new(&t).retry_after("retry_after");
    let table = if leased {
        table
    } else {
        ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
            .await;
        table.cancel_requests(&cancels)
    };
    let declared = F::apply_leasing(Queue::table(table), LEASE);
    let postgres = DB::LABEL.starts_with("postgres");
    // PostgreSQL's requests are notified: its poll is too slow to be what tells the handler.
    let poll = if postgres && !leased {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(200)
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queue = declared
        .clone()
        .batch(2)
        .batch_handler(move |batch: Vec<Delivery<DB>>| {
            let tx = tx.clone();
            async move {
                tx.send(Seen::Started(batch.iter().map(Delivery::id).collect()))
                    .unwrap();
                if let [a, b] = &batch[..] {
                    let cancelled = tokio::select! {
                        () = a.cancelled() => Some((a, b)),
                        () = b.cancelled() => Some((b, a)),
                        () = tokio::time::sleep(Duration::from_secs(30)) => None,
                    };
                    if let Some((cancelled, other)) = cancelled {
                        tx.send(Seen::Cancelled {
                            id: cancelled.id(),
                            others_too: other.is_cancelled(),
                        })
                        .unwrap();
                    }
                }
                // Would settle both, were one not cancelled.
                batch.iter().map(|_| Outcome::ack()).collect()
            }
        });
    let first = enqueue(&ctx, &declared, Job::new("a")).await;
    let second = enqueue(&ctx, &declared, Job::new("b")).await;
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(poll)
        .mount(queue)
        .start()
        .await
        .unwrap();
    let Seen::Started(mut ids) = recv(&mut rx, "the batch to start", 5).await else {
        panic!("the batch did not start first");
    };
    ids.sort_unstable();
    assert_eq!(ids, vec![first, second], "one batch of both");
    let asked = tokio::time::Instant::now();
    let answer = tokio::time::timeout(Duration::from_secs(3), declared.cancel(&ctx.pool, first))
        .await
        .expect("the cancellation does not wait for the batch's claim")
        .unwrap();
    assert_eq!(answer, Cancellation::Requested(first));
    let bound = match (leased, postgres) {
        (true, _) => LEASE / 2 + Duration::from_millis(750),
        (false, true) => Duration::from_secs(1),
        (false, false) => poll + Duration::from_secs(1),
    };
    let seen = tokio::time::timeout(bound, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the cancelled row's delivery was not told within {bound:?}"));
    assert_eq!(
        seen,
        Some(Seen::Cancelled {
            id: first,
            others_too: false
        }),
        "after {:?}",
        asked.elapsed()
    );
    ctx.wait_none(&t, "1 = 1", 5).await;
    if !leased {
        ctx.wait_none(&cancels, "1 = 1", 5).await;
    }
    if leased {
        wait_for(
            "the cancelled row's ack to find its lease lost",
            Duration::from_secs(5),
            || {
                let stats = running.stats();
                async move { stats.lease_lost >= 1 }
            },
        )
        .await;
    }
    running.shutdown().await.unwrap();
    assert_eq!(
        declared.cancel(&ctx.pool, first).await.unwrap(),
        Cancellation::NotFound
    );
    if !leased {
        ctx.exec(&format!("DROP TABLE {cancels}")).await;
    }
    ctx.drop_tables().await;
}
