//! One delivery: run the handler, keep its lease while it works, settle by its outcome.

use std::any::Any;
use std::panic::AssertUnwindSafe;
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
use crate::form::FormRuntime;
use crate::queue::state::Mode;

/// Runs one delivery to its settlement, in a span naming the queue, row and attempt.
pub(super) async fn deliver<DB, M, H>(
    q: &Arc<QueueRuntime<DB>>,
    handler: &H,
    row: ClaimedRow,
    token: DateTime<Utc>,
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
    run::<DB, M, H>(q, handler, row, attempt, token)
        .instrument(span)
        .await;
}

async fn run<DB, M, H>(
    q: &Arc<QueueRuntime<DB>>,
    handler: &H,
    row: ClaimedRow,
    attempt: u32,
    mut token: DateTime<Utc>,
) where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    let FormRuntime::Lease(lease) = &q.form;
    let id = row.id;
    let delivery = Delivery::<DB, M>::new(id, row.payload, attempt, q.group.clone());
    let handled = AssertUnwindSafe(handler.call(delivery)).catch_unwind();
    tokio::pin!(handled);

    // The lease is extended every half lease while the handler runs; the handler is polled
    // during the extension too, so a slow statement never stalls it.
    let half = lease.duration / 2;
    let mut next_extension = Instant::now() + half;
    let mut lost = false;
    let result = loop {
        tokio::select! {
            biased;
            result = &mut handled => break Some(result),
            () = q.abort.cancelled() => break None,
            () = tokio::time::sleep_until(next_extension), if !lost => {}
        }
        let extension = lease.extend(&q.pool, id, token);
        tokio::pin!(extension);
        let mut finished = None;
        let extended = loop {
            tokio::select! {
                extended = &mut extension => break extended,
                result = &mut handled, if finished.is_none() => finished = Some(result),
            }
        };
        match extended {
            Ok(Some(new_token)) => {
                token = new_token;
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
        if let Some(result) = finished {
            break Some(result);
        }
    };

    let Some(result) = result else {
        // Cancelled at the shutdown timeout: the row goes back unsettled, at once.
        q.cancelled.fetch_add(1, Ordering::Relaxed);
        match lease.release(&q.pool, id, token).await {
            Ok(true) => {
                q.cancelled_released.fetch_add(1, Ordering::Relaxed);
                Counters::add(&q.stats.released, 1);
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "could not release a cancelled delivery"),
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
    tracing::Span::current().record("outcome", outcome.name());
    match lease.settle(&q.pool, id, token, outcome).await {
        Ok(()) => {
            let counter = match outcome.0 {
                Settle::Ack => &q.stats.acked,
                Settle::Drop => &q.stats.dropped,
                Settle::Retry | Settle::RetryAfter(_) => &q.stats.retried,
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
                "settlement failed; the row is delivered again when its lease expires"
            );
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
