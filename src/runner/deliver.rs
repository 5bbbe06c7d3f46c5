//! One delivery: run the handler (keeping a lease while it works), settle by its outcome.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use tokio::time::Instant;
use tracing::Instrument as _;

use super::launch::CallHandler;
use super::{Counters, QueueRuntime};
use crate::backend::{Backend, ClaimedRow};
use crate::delivery::{Delivery, Outcome, Settle};
use crate::error::Error;
use crate::form::lease::LeaseForm;
use crate::form::{FormRuntime, Hold};
use crate::queue::state::Mode;

/// What the handler's future gave: its outcome, or the payload of its panic.
type Handled = std::thread::Result<Outcome>;

/// Runs one delivery to its settlement, in a span naming the queue, row and attempt.
pub(super) async fn deliver<DB, M, H>(
    q: &Arc<QueueRuntime<DB>>,
    handler: &H,
    row: ClaimedRow,
    hold: Hold<DB>,
) where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    let attempt = row
        .attempt
        .map_or(1, |a| u32::try_from(a.max(1)).unwrap_or(u32::MAX));
    let span = tracing::info_span!(
        "delivery",
        queue = %q.label,
        id = row.id,
        attempt,
        outcome = tracing::field::Empty,
    );
    run::<DB, M, H>(q, handler, row, attempt, hold)
        .instrument(span)
        .await;
}

async fn run<DB, M, H>(
    q: &Arc<QueueRuntime<DB>>,
    handler: &H,
    row: ClaimedRow,
    attempt: u32,
    mut hold: Hold<DB>,
) where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    let id = row.id;
    if let Some(max) = q.max_attempts
        && attempt > max
    {
        // Earlier deliveries ended unsettled (a crash, say) and counted their attempts.
        tracing::warn!(
            queue = %q.label,
            id,
            attempt,
            max_attempts = max,
            "row past max_attempts without a settlement: moved to the dead letter unhandled"
        );
        settle(q, id, hold, Outcome::dead_letter()).await;
        return;
    }
    let delivery = Delivery::<DB, M>::new(id, row.payload, attempt, q.group.clone());
    // The call itself runs inside the guard too: a handler may panic before its first await.
    let handled = AssertUnwindSafe(async move { handler.call(delivery).await }).catch_unwind();
    tokio::pin!(handled);

    let result = match (&q.form, &mut hold) {
        (FormRuntime::Lease(lease), Hold::Lease(token, taken)) => {
            keep_lease(q, lease, id, token, *taken, handled).await
        }
        _ => tokio::select! {
            biased;
            result = &mut handled => Some(result),
            () = q.abort.cancelled() => None,
        },
    };

    let Some(result) = result else {
        // Cancelled at the shutdown timeout: the row goes back unsettled, at once.
        q.cancelled.fetch_add(1, Ordering::Relaxed);
        if q.form.release(&q.pool, id, hold).await {
            q.cancelled_released.fetch_add(1, Ordering::Relaxed);
            Counters::add(&q.stats.released, 1);
            q.note_unlock();
        }
        tracing::warn!("handler cancelled at the shutdown timeout; its row was released");
        return;
    };
    let outcome = match result {
        Ok(outcome) => outcome,
        Err(panic) => {
            Counters::add(&q.stats.panicked, 1);
            tracing::error!(
                panic = panic_message(&*panic),
                "handler panicked; the delivery is retried"
            );
            Outcome::retry()
        }
    };
    let outcome = match (outcome.0, q.max_attempts) {
        (Settle::Undecodable, Some(_)) => Outcome::dead_letter(),
        (Settle::Undecodable, None) => Outcome::drop(),
        (Settle::Retry | Settle::RetryAfter(_), Some(max)) if attempt >= max => {
            tracing::warn!(
                queue = %q.label,
                id,
                attempt,
                max_attempts = max,
                "row reached max_attempts: moved to the dead letter"
            );
            Outcome::dead_letter()
        }
        _ => outcome,
    };
    settle(q, id, hold, outcome).await;
}

/// Settles a delivery and counts the result.
async fn settle<DB: Backend>(q: &QueueRuntime<DB>, id: i64, hold: Hold<DB>, outcome: Outcome) {
    tracing::Span::current().record("outcome", outcome.name());
    let settled = q.form.settle(&q.pool, id, hold, outcome).await;
    q.note_unlock();
    match settled {
        Ok(()) => {
            let counter = match outcome.0 {
                Settle::Ack => &q.stats.acked,
                Settle::Drop => &q.stats.dropped,
                Settle::Retry | Settle::RetryAfter(_) => &q.stats.retried,
                Settle::DeadLetter => &q.stats.dead_lettered,
                Settle::Undecodable => unreachable!("mapped to dead letter or drop"),
            };
            Counters::add(counter, 1);
        }
        Err(Error::LeaseLost { .. }) => {
            Counters::add(&q.stats.lease_lost, 1);
            tracing::warn!("lease lost: the row belongs to a later claim; nothing was settled");
        }
        Err(error) => {
            Counters::add(&q.stats.failed, 1);
            tracing::error!(
                %error,
                "settlement failed; the row returns to the queue unsettled"
            );
        }
    }
}

/// Awaits the handler while extending its lease every half lease (the handler is polled during
/// an extension too, so a slow statement never stalls it). `None` when cancelled at the
/// shutdown timeout.
async fn keep_lease<DB: Backend>(
    q: &QueueRuntime<DB>,
    lease: &LeaseForm,
    id: i64,
    token: &mut DateTime<Utc>,
    taken: Instant,
    mut handled: Pin<&mut impl Future<Output = Handled>>,
) -> Option<Handled> {
    let half = lease.duration / 2;
    let mut next_extension = taken + half;
    let mut lost = false;
    loop {
        tokio::select! {
            biased;
            result = &mut handled => return Some(result),
            () = q.abort.cancelled() => return None,
            () = tokio::time::sleep_until(next_extension), if !lost => {}
        }
        let extension = lease.extend(&q.pool, id, *token);
        tokio::pin!(extension);
        let mut finished = None;
        let extended = loop {
            tokio::select! {
                extended = &mut extension => break extended,
                result = &mut handled, if finished.is_none() => finished = Some(result),
                () = q.abort.cancelled(), if finished.is_none() => return None,
            }
        };
        match extended {
            Ok(Some(new_token)) => {
                *token = new_token;
                next_extension = Instant::now() + half;
            }
            Ok(None) => {
                lost = true;
                tracing::warn!(
                    "lease lost while the handler was running: its settlement will fail"
                );
            }
            Err(error) => {
                let retry_in = (half / 4).max(Duration::from_millis(5));
                tracing::warn!(%error, ?retry_in, "lease extension failed; trying again");
                next_extension = Instant::now() + retry_in;
            }
        }
        if finished.is_some() {
            return finished;
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(message) = panic.downcast_ref::<&str>() {
        message
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message
    } else {
        "(not a string)"
    }
}
