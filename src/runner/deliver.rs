//! One delivery, top to bottom: lend its transaction (transactional mode), read its row (row
//! mode), call the handler while its hold is kept, take the transaction back, settle by the
//! policy's outcome — or, cancelled at the shutdown timeout, return the row at once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::FutureExt as _;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument as _;

use super::keeper::{Kept, keep};
use super::policy;
use super::queue::Live;
use super::stats::Counters;
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::delivery::{Delivery, Mode, Outcome, Settle, TxSlot};
use crate::error::Error;
use crate::form::{Form, Returned};
use crate::handler::CallOne;

/// Runs one delivery to its settlement, in a span naming the queue, row and attempt. `worker`,
/// where the queue counts its workers by permits, is given back when the delivery ends, or as
/// soon as its handler is done when its ack goes to the queue's grouped acks.
pub(super) async fn deliver<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    row: ClaimedRow,
    hold: F::Hold,
    worker: Option<OwnedSemaphorePermit>,
) where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let attempt = policy::attempt(&row);
    let span = tracing::info_span!(
        "delivery",
        queue = %q.label,
        id = row.id,
        attempt,
        outcome = tracing::field::Empty,
    );
    run(q, handler, row, attempt, hold, worker)
        .instrument(span)
        .await;
}

async fn run<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    row: ClaimedRow,
    attempt: u32,
    mut hold: F::Hold,
    worker: Option<OwnedSemaphorePermit>,
) where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let id = row.id;
    if let Some(outcome) = policy::before_handler(q, &row, attempt) {
        settle(q, id, hold, outcome, None, worker).await;
        return;
    }
    // A transactional delivery gets its transaction; the runner keeps the other end of its slot.
    let slot = match H::Mode::TRANSACTIONAL {
        false => None,
        true => match q.form.lend(&q.conns, &mut hold).await {
            Ok(conn) => Some(Arc::new(tokio::sync::Mutex::new(Some(conn)))),
            Err(error) => {
                tracing::warn!(%error, "could not open the delivery's transaction; row released");
                release(q, id, hold).await;
                return;
            }
        },
    };
    // A row mode handler gets the row whole, read where the form holds it (in the delivery's
    // transaction, when it has one).
    let whole = match H::ROW {
        false => None,
        true => match read_row(q, &mut hold, slot.as_ref(), id).await {
            Ok(whole) => Some(whole),
            Err(reason) => {
                Counters::add(&q.stats().failed, 1);
                tracing::warn!("{reason}");
                if let Some(conn) = slot.and_then(|slot| take_back(slot).ok()) {
                    let _ = q.form.take_back(&q.conns, &mut hold, conn, false).await;
                }
                release(q, id, hold).await;
                return;
            }
        },
    };
    let delivery =
        Delivery::<DB, H::Mode>::new(id, row.payload, attempt, q.group.clone(), slot.clone());

    // The handler's future lives in this block only: when it ends, what it held is dropped. The
    // call itself runs inside the guard too: a handler may panic before its first await.
    let kept = {
        let handled =
            AssertUnwindSafe(async move { handler.call(delivery, whole).await }).catch_unwind();
        tokio::pin!(handled);
        keep(q, id, &mut hold, handled).await
    };
    let Kept { result, extending } = kept;
    let Some(handled) = result else {
        cancel(q, id, slot, hold, extending).await;
        return;
    };

    // Take the transaction back: a delivery that escaped its handler still holds it.
    let tx = match slot.map(take_back) {
        None => None,
        Some(Ok(conn)) => Some(conn),
        Some(Err(())) => {
            Counters::add(&q.stats().failed, 1);
            let error = Error::TransactionHeld {
                queue: q.label.to_string(),
                id,
            };
            tracing::error!(%error, "nothing was committed; the row is released");
            // A connection still lent is closed when the escaped delivery drops it.
            release(q, id, hold).await;
            q.after_settlement(Outcome::retry());
            return;
        }
    };
    let outcome = policy::outcome(q, id, attempt, handled);

    // Transactional: an ack commits the handler's writes with the settlement; any other outcome
    // rolls them back first, then settles as a plain delivery would.
    let mut own_tx = None;
    if let Some(conn) = tx {
        match q
            .form
            .take_back(&q.conns, &mut hold, conn, outcome.0 == Settle::Ack)
            .await
        {
            Ok(conn) => own_tx = conn,
            Err(error) => {
                Counters::add(&q.stats().failed, 1);
                tracing::error!(%error, "could not end the handler's transaction; row released");
                release(q, id, hold).await;
                return;
            }
        }
    }
    settle(q, id, hold, outcome, own_tx, worker).await;
}

/// Reads row `id` whole for its row mode handler.
async fn read_row<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    hold: &mut F::Hold,
    slot: Option<&TxSlot<DB>>,
    id: i64,
) -> Result<DB::Row, String> {
    let read = match slot {
        Some(slot) => {
            let mut lent = slot.lock().await;
            q.form.read_row(&q.conns, hold, lent.as_mut(), id).await
        }
        None => q.form.read_row(&q.conns, hold, None, id).await,
    };
    match read {
        Ok(Some(row)) => Ok(row),
        Ok(None) => Err("the claimed row is gone (deleted by another hand); skipped".to_owned()),
        Err(error) => Err(format!(
            "could not read the row for its handler ({error}); released"
        )),
    }
}

/// Takes the transaction back from its slot: `Err` when the delivery escaped its handler (the
/// transaction is then closed by the escaped delivery, whoever drops it last).
fn take_back<DB: Backend>(slot: TxSlot<DB>) -> Result<HeldConn<DB>, ()> {
    Arc::try_unwrap(slot)
        .ok()
        .and_then(tokio::sync::Mutex::into_inner)
        .ok_or(())
}

/// Settles a delivery, and counts it by the policy: acks and drops of plain queues that group
/// them go through the queue's ack grouping, their worker given to the next row meanwhile; a
/// settlement that failed for the row keeps it held for the policy's delay where the form can.
async fn settle<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: F::Hold,
    outcome: Outcome,
    tx: Option<HeldConn<DB>>,
    worker: Option<OwnedSemaphorePermit>,
) {
    tracing::Span::current().record("outcome", outcome.name());
    let kept = q.form.keep(&hold);
    let grouped = matches!(outcome.0, Settle::Ack | Settle::Drop) && tx.is_none();
    let settled = match (&q.acks, grouped) {
        (Some(acks), true) => {
            // The claim of the next row overlaps this ack's statement: both commit for many.
            let _in_flight = q.acks_in_flight.acquire().await;
            drop(worker);
            super::acks::settle(acks, &q.label, id, hold, outcome).await
        }
        _ => q.form.settle(&q.conns, id, hold, outcome, tx).await,
    };
    q.note_unlock();
    if let (Some(delay), Some(kept)) = (policy::settled(q, id, outcome, settled), kept) {
        q.form.hold_for(&q.conns, id, kept, delay).await;
    }
}

/// Releases a delivery's row unsettled (it was not handled to the end), and says so.
async fn release<DB: Backend, F: Form<DB>>(q: &Live<DB, F>, id: i64, hold: F::Hold) {
    if q.form.release(&q.conns, id, hold).await {
        q.after_settlement(Outcome::retry());
    }
}

/// A delivery cancelled at the shutdown timeout: its handler's future is gone, and its row goes
/// back unsettled at once, whatever the delivery's connection is doing. A transactional
/// delivery's connection is closed, never rolled back on (a statement of the handler's may
/// still run there, for as long as it likes): the server rolls the transaction back.
/// MySQL/MariaDB also end its session (`KILL`, when the claim read it), and PostgreSQL 14+ ends
/// it within 250 ms of the close (`client_connection_check_interval`), so a row lock or a key it
/// held is released at once.
async fn cancel<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    slot: Option<TxSlot<DB>>,
    hold: F::Hold,
    extending: Option<F::Hold>,
) {
    q.cancelled.fetch_add(1, Ordering::Relaxed);
    // Closed when dropped: it is in a transaction. A `Tx` escaped into another task keeps it
    // until that task drops it; the session is ended all the same.
    let lent = slot.and_then(|slot| slot.try_lock().ok().and_then(|mut lent| lent.take()));
    let transactional = lent.is_some();
    drop(lent);
    match q.form.abandon(&q.conns, id, hold, extending).await {
        Returned::Released => {
            q.cancelled_released.fetch_add(1, Ordering::Relaxed);
            Counters::add(&q.stats().released, 1);
            q.note_unlock();
            tracing::warn!(
                transactional,
                "handler cancelled at the shutdown timeout; its row was released"
            );
        }
        Returned::NotHeld => tracing::warn!(
            "handler cancelled at the shutdown timeout; its row was no longer held (its lease \
             lost)"
        ),
        Returned::Unconfirmed => {
            q.cancelled_unreleased.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                grace = ?crate::form::GRACE,
                "handler cancelled at the shutdown timeout; its row could not be released in \
                 time: it returns when its lease expires or its connection closes"
            );
        }
    }
}
