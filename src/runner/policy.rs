//! The one settlement policy, for single deliveries and batches alike: which outcome settles a
//! delivery (an error or a panic is a failure, retried after the queue's backoff; an
//! undecodable row follows the decode policy; a retry or failure at the cap moves the row to its
//! dead letter), and what a settlement's result counts (a failure of the row's own holds the row
//! back).

use std::any::Any;
use std::time::Duration;

use super::queue::Live;
use crate::backend::{Backend, ClaimedRow};
use crate::delivery::{Outcome, Settle};
use crate::error::{Error, Result};
use crate::form::Form;

/// What a handler's future gave: its outcome, or the payload of its panic.
pub(super) type Handled<T = Outcome> = std::thread::Result<T>;

/// The delivery's number: 1 on the first (the claim returns the attempt before it counted it).
pub(super) fn attempt(row: &ClaimedRow) -> u32 {
    row.attempt
        .map_or(1, |a| u32::try_from(a.max(1)).unwrap_or(u32::MAX))
}

/// What settles a row before its handler sees it: an undecodable row by the decode policy, a
/// row past its cap (earlier deliveries ended unsettled, a crash say, and counted their
/// attempts) by its dead letter. `None`: the handler gets it.
pub(super) fn before_handler<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    row: &ClaimedRow,
    attempt: u32,
) -> Option<Outcome> {
    if let Some(why) = &row.undecodable {
        tracing::error!(
            id = row.id,
            error = %why,
            "the claimed row does not decode: it never reaches the handler"
        );
        return Some(undecodable(q));
    }
    let max = q.max_attempts?;
    (attempt > max).then(|| {
        tracing::warn!(
            queue = %q.label,
            id = row.id,
            attempt,
            max_attempts = max,
            "row past max_attempts without a settlement: moved to the dead letter unhandled"
        );
        Outcome::dead_letter()
    })
}

/// The decode policy: the dead letter where the queue has one, else drop.
fn undecodable<DB: Backend, F: Form<DB>>(q: &Live<DB, F>) -> Outcome {
    match q.max_attempts {
        Some(_) => Outcome::dead_letter(),
        None => Outcome::drop(),
    }
}

/// The outcome that settles row `id` on its `attempt`, from what its handler gave.
pub(super) fn outcome<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    attempt: u32,
    handled: Handled,
) -> Outcome {
    let outcome = unless_panicked(
        q,
        handled,
        "handler panicked; the delivery is retried after the queue's backoff",
        Outcome::fail,
    );
    if outcome.0 == Settle::Fail {
        q.observe.failed_delivery();
    }
    match (outcome.0, q.max_attempts) {
        (Settle::Undecodable, _) => undecodable(q),
        (Settle::Retry | Settle::RetryAfter(_) | Settle::Fail, Some(max)) if attempt >= max => {
            tracing::warn!(
                queue = %q.label,
                id,
                attempt,
                max_attempts = max,
                "row reached max_attempts: moved to the dead letter"
            );
            Outcome::dead_letter()
        }
        (Settle::Fail, _) => match q.backoff {
            Some(backoff) => Outcome::retry_after(backoff.delay(attempt)),
            None => Outcome::retry(),
        },
        _ => outcome,
    }
}

/// The panic policy, for a single delivery's handler and a batch's alike: a handler that
/// panicked retries what it was given (`retry`), counted, and logged as `what`.
pub(super) fn unless_panicked<DB: Backend, F: Form<DB>, T>(
    q: &Live<DB, F>,
    handled: Handled<T>,
    what: &str,
    retry: impl FnOnce() -> T,
) -> T {
    handled.unwrap_or_else(|panic| {
        q.observe.panicked();
        tracing::error!(panic = panic_message(&*panic), "{what}");
        retry()
    })
}

/// Counts a settlement's result, and logs a failed one. A settlement that failed for the row
/// (not a lost lease) holds the row back, for longer at each failure: the delay.
pub(super) fn settled<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    outcome: Outcome,
    settled: Result<()>,
) -> Option<Duration> {
    q.after_settlement(outcome);
    match settled {
        Ok(()) => {
            q.quarantine.release(id);
            q.observe.settled(outcome);
            None
        }
        Err(Error::LeaseLost { id, .. }) => {
            q.observe.lease_lost();
            tracing::warn!(
                id,
                "lease lost: the row belongs to a later claim; nothing was settled"
            );
            None
        }
        Err(error) => {
            q.observe.failed(1);
            let what = format!("its settlement ({})", outcome.name());
            Some(q.quarantine.hold_back(&q.label, id, &what, &error))
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
