//! Batches: one claim takes up to `n` rows for one worker, the batch handler gets them together
//! and returns one outcome per row, and each row is settled as a single delivery's would be
//! (row lock: all in one transaction, all or nothing).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::claim::Pace;
use super::deliver::{count_settled, panic_message};
use super::launch::CallBatch;
use super::{Counters, QueueReport, QueueRuntime};
use crate::backend::{Backend, ClaimedRow};
use crate::delivery::{Delivery, Outcome, Settle};
use crate::form::{FormRuntime, Hold};

/// A queue's claim loop in batch mode: each free worker takes one batch of up to `size` rows.
pub(super) async fn run<DB, H>(
    q: Arc<QueueRuntime<DB>>,
    handler: Arc<H>,
    size: usize,
) -> QueueReport
where
    DB: Backend,
    H: CallBatch<DB>,
{
    let workers = Arc::new(Semaphore::new(q.workers));
    let batches = TaskTracker::new();
    let mut pace = Pace::default();
    let mut report = QueueReport::default();

    loop {
        let permit = tokio::select! {
            biased;
            () = q.stop.cancelled() => break,
            permit = Arc::clone(&workers).acquire_owned() => {
                permit.expect("the semaphore is never closed")
            }
        };
        // A batch never waits to be full: it takes what is claimable now.
        let excluded = q.quarantine.excluded();
        let (rows, hold) = match q.form.claim_batch(&q.conns, size, &excluded).await {
            Ok(claimed) => claimed,
            Err(failed) => {
                drop(permit);
                if pace.failed(&q, failed).await {
                    continue;
                }
                break;
            }
        };
        let got = rows.len();
        Counters::add(&q.stats.claimed, got as u64);
        if q.stop.is_cancelled() {
            let held = lease_tokens(&rows, &hold);
            let released = q.form.release_batch(&q.conns, &held, hold).await;
            report.released += released;
            Counters::add(&q.stats.released, released);
            break;
        }
        if got == 0 {
            q.form.recycle(&q.conns, hold);
        } else {
            let (q, handler) = (Arc::clone(&q), Arc::clone(&handler));
            q.stats.in_work.fetch_add(got as u64, Ordering::Relaxed);
            batches.spawn(async move {
                deliver(&q, &*handler, rows, hold).await;
                q.stats.in_work.fetch_sub(got as u64, Ordering::Relaxed);
                drop(permit);
            });
        }
        let idle = got == 0 && workers.available_permits() + 1 == q.workers;
        if !pace.claimed(&q, got == size, idle).await {
            break;
        }
    }

    batches.close();
    batches.wait().await;
    report.cancelled = q.cancelled.load(Ordering::Relaxed);
    report.released += q.cancelled_released.load(Ordering::Relaxed);
    report.unreleased = q.cancelled_unreleased.load(Ordering::Relaxed);
    report
}

/// Each row's id and lease token (the lease form; others have none).
fn lease_tokens<DB: Backend>(rows: &[ClaimedRow], hold: &Hold<DB>) -> Vec<(i64, DateTime<Utc>)> {
    let token = match hold {
        Hold::Lease(token, _) => *token,
        _ => DateTime::<Utc>::MIN_UTC,
    };
    rows.iter().map(|row| (row.id, token)).collect()
}

/// Runs one batch to its settlement.
async fn deliver<DB, H>(q: &QueueRuntime<DB>, handler: &H, rows: Vec<ClaimedRow>, hold: Hold<DB>)
where
    DB: Backend,
    H: CallBatch<DB>,
{
    let span = tracing::info_span!("batch", queue = %q.label, rows = rows.len());
    run_batch(q, handler, rows, hold).instrument(span).await;
}

async fn run_batch<DB, H>(q: &QueueRuntime<DB>, handler: &H, rows: Vec<ClaimedRow>, hold: Hold<DB>)
where
    DB: Backend,
    H: CallBatch<DB>,
{
    let attempts: Vec<u32> = rows
        .iter()
        .map(|row| {
            row.attempt
                .map_or(1, |a| u32::try_from(a.max(1)).unwrap_or(u32::MAX))
        })
        .collect();
    let mut tokens = lease_tokens(&rows, &hold);
    // Rows past their cap without a settlement go to the dead letter, not to the handler; rows
    // that do not decode are settled by the decode policy.
    let over_cap = |attempt: u32| q.max_attempts.is_some_and(|max| attempt > max);
    let undecodable: Vec<bool> = rows.iter().map(|row| row.undecodable.is_some()).collect();
    for row in &rows {
        if let Some(why) = &row.undecodable {
            tracing::error!(id = row.id, error = %why, "the claimed row does not decode: it never reaches the handler");
        }
    }
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    let deliveries: Vec<Delivery<DB>> = rows
        .into_iter()
        .zip(&attempts)
        .filter(|(row, attempt)| !over_cap(**attempt) && row.undecodable.is_none())
        .map(|(row, attempt)| Delivery::new(row.id, row.payload, *attempt, q.group.clone(), None))
        .collect();
    let handed = deliveries.len();

    let result = {
        let handled =
            AssertUnwindSafe(async move { handler.call(deliveries).await }).catch_unwind();
        tokio::pin!(handled);
        let half = match (&q.form, &hold) {
            (FormRuntime::Lease(lease), _) => Some(lease.duration / 2),
            _ => None,
        };
        let mut next_extension = match &hold {
            Hold::Lease(_, taken) => *taken + half.unwrap_or_default(),
            _ => Instant::now(),
        };
        loop {
            tokio::select! {
                biased;
                result = &mut handled => break Some(result),
                () = q.abort.cancelled() => break None,
                () = tokio::time::sleep_until(next_extension), if half.is_some() => {}
            }
            // Extend every row's lease; the handler waits meanwhile.
            let (FormRuntime::Lease(lease), Some(half)) = (&q.form, half) else {
                unreachable!("extensions are due in the lease form only");
            };
            for (id, token) in &mut tokens {
                match lease.extend(&q.conns, *id, *token).await {
                    Ok(Some(new)) => *token = new,
                    Ok(None) => tracing::warn!(id = *id, "lease lost while the batch was running"),
                    Err(error) => tracing::warn!(id = *id, %error, "lease extension failed"),
                }
            }
            next_extension = Instant::now() + half.max(Duration::from_millis(5));
        }
    };

    let Some(result) = result else {
        q.cancelled.fetch_add(1, Ordering::Relaxed);
        // Past the grace, the release is dropped: a connection holding the rows closes.
        let release = q.form.release_batch(&q.conns, &tokens, hold);
        let released = tokio::time::timeout(super::deliver::CANCEL_GRACE, release).await;
        let released = released.unwrap_or_else(|_| {
            q.cancelled_unreleased
                .fetch_add(tokens.len() as u64, Ordering::Relaxed);
            0
        });
        q.cancelled_released.fetch_add(released, Ordering::Relaxed);
        Counters::add(&q.stats.released, released);
        tracing::warn!(
            released,
            rows = tokens.len(),
            "batch cancelled at the shutdown timeout; its rows were released"
        );
        return;
    };
    let mut outcomes = match result {
        Ok(outcomes) => outcomes,
        Err(panic) => {
            Counters::add(&q.stats.panicked, 1);
            tracing::error!(
                panic = panic_message(&*panic),
                "batch handler panicked; its rows are retried"
            );
            vec![Outcome::retry(); handed]
        }
    };
    if outcomes.len() != handed {
        tracing::error!(
            rows = handed,
            outcomes = outcomes.len(),
            "the batch handler returned one outcome per row in the wrong number: rows without \
             one are retried"
        );
        outcomes.resize(handed, Outcome::retry());
    }
    let mut outcomes = outcomes.into_iter();
    let settlements: Vec<(i64, Outcome)> = ids
        .iter()
        .zip(&attempts)
        .zip(&undecodable)
        .map(|((&id, &attempt), &undecodable)| {
            let outcome = match (undecodable, q.max_attempts) {
                (true, Some(_)) => Outcome::dead_letter(),
                (true, None) => Outcome::drop(),
                _ if over_cap(attempt) => Outcome::dead_letter(),
                _ => outcomes.next().unwrap_or_else(Outcome::retry),
            };
            (id, capped(q, id, attempt, outcome))
        })
        .collect();
    let tokens: Vec<DateTime<Utc>> = tokens.into_iter().map(|(_, token)| token).collect();
    match q
        .form
        .settle_batch(&q.conns, &settlements, &tokens, hold)
        .await
    {
        Ok(results) => {
            for (&(id, outcome), result) in settlements.iter().zip(results) {
                count_settled(q, id, outcome, result);
                q.settled(outcome);
            }
        }
        Err((row, error)) => {
            Counters::add(&q.stats.failed, settlements.len() as u64);
            tracing::error!(%error, "the batch returns to the queue as it was");
            // The row whose statement failed is held back; the others come again at once.
            if let Some(id) = row {
                q.quarantine
                    .hold_back(&q.label, id, "its settlement in a batch", &error);
            }
        }
    }
}

/// A retry at the cap becomes a move to the dead letter.
fn capped<DB: Backend>(q: &QueueRuntime<DB>, id: i64, attempt: u32, outcome: Outcome) -> Outcome {
    match (outcome.0, q.max_attempts) {
        (Settle::Retry | Settle::RetryAfter(_), Some(max)) if attempt >= max => {
            tracing::warn!(queue = %q.label, id, attempt, max_attempts = max,
                "row reached max_attempts: moved to the dead letter");
            Outcome::dead_letter()
        }
        _ => outcome,
    }
}
