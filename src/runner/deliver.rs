//! One delivery, top to bottom: lend its transaction (transactional mode), read its row (row
//! mode), call the handler while its hold is kept, take the transaction back, settle by the
//! policy's outcome — or, cancelled at the shutdown timeout, return the row at once.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::FutureExt as _;
use tracing::Instrument as _;

use super::ahead::Seat;
use super::cancel;
use super::keeper::{self, Kept, keep};
use super::observe::Working;
use super::policy::{self, Handled};
use super::queue::Live;
use super::requests::Entered;
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::delivery::{Delivery, Mode, Outcome, Settle, TxSlot};
use crate::error::Error;
use crate::form::{Form, Settled};
use crate::handler::CallOne;

/// Runs one delivery to its settlement, in a span naming the queue, row and attempt. `worker`,
/// where the queue counts its rows in hand and its workers by seats, is given back when the
/// delivery ends; its worker as soon as its handler is done when its ack goes to the queue's
/// grouped acks. `entered`: the row's entry in the queue's deliveries in work, entered at its
/// claim — one cancelled already (a row claimed ahead) is removed, its handler never called.
pub(super) async fn deliver<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    row: ClaimedRow,
    hold: F::Hold,
    worker: Option<Seat>,
    entered: Entered,
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
    let worker = Worker {
        seat: worker,
        working: q.observe.start(&row, attempt),
    };
    run(q, handler, row, attempt, hold, worker, entered)
        .instrument(span)
        .await;
}

/// The worker a delivery runs on: its seat, where the queue counts its workers by seats, and
/// the delivery's place in the queue's reporting (in work, on a worker).
struct Worker<'a> {
    seat: Option<Seat>,
    working: Working<'a>,
}

/// Lend, read the row, call, take back, settle; every way that ends unsettled goes through
/// [`abandon`].
async fn run<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    row: ClaimedRow,
    attempt: u32,
    mut hold: F::Hold,
    worker: Worker<'_>,
    entered: Entered,
) where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let id = row.id;
    let cancelled = &entered.entry;
    if cancelled.requested() {
        drop(worker);
        drop_unstarted(q, id, hold, entered).await;
        return;
    }
    if !keeper::confirm(q, id, &mut hold).await {
        return;
    }
    if let Some(outcome) = policy::before_handler(q, &row, attempt) {
        settle(q, id, hold, outcome, None, worker).await;
        return;
    }
    // Whether the settlement's outcome is the request's (the row removed), not the handler's.
    let by_request = AtomicBool::new(false);
    let settlement = async {
        let mut slot = lend::<DB, F, H::Mode>(q, &mut hold).await?;
        let whole = match H::ROW {
            false => None,
            true => Some(read_row(q, &mut hold, &mut slot, id).await?),
        };
        let delivery = Delivery::<DB, H::Mode>::new(
            id,
            row.payload,
            attempt,
            q.group.clone(),
            row.headers,
            slot.clone(),
            cancelled.token.clone(),
        );
        let since = q.observe.timer();
        let Kept { result, extending } =
            call(q, handler, id, &mut hold, delivery, whole, &cancelled.token).await;
        let Some(handled) = result else {
            return Err(Unsettled::Cancelled { slot, extending });
        };
        q.observe.handled(since);
        take_back(q, id, &mut hold, slot, || {
            if cancelled.requested() {
                // Whatever the handler returned: its writes roll back, and its row goes.
                tracing::info!("job cancelled while in work; its row is removed");
                by_request.store(true, Ordering::Relaxed);
                Outcome::drop()
            } else {
                policy::outcome(q, id, attempt, handled)
            }
        })
        .await
    }
    .await;
    let removed = match settlement {
        Ok((outcome, tx)) => match settle(q, id, hold, outcome, tx, worker).await {
            Some(Settled::Cancelled) => true,
            Some(Settled::AsAsked) => by_request.load(Ordering::Relaxed),
            None => false,
        },
        Err(unsettled) => {
            abandon(q, id, hold, unsettled).await;
            false
        }
    };
    drop(entered);
    // A request stays while its row does (released unsettled, or settled by the handler's
    // outcome when the request came after it): the row's next delivery is cancelled.
    if removed {
        q.requests.forget(&q.shared.pool, id).await;
    }
}

/// How a delivery ends without a settlement.
enum Unsettled<DB: Backend, F: Form<DB>> {
    /// Its row goes back unsettled (why is logged where it was decided).
    Released,
    /// Cancelled at the shutdown timeout, with its transaction's slot and the hold of an
    /// extension in flight then.
    Cancelled {
        slot: Option<TxSlot<DB>>,
        extending: Option<F::Hold>,
    },
}

/// Lends a transactional delivery its transaction; the runner keeps the other end of its slot.
async fn lend<DB: Backend, F: Form<DB>, M: Mode>(
    q: &Live<DB, F>,
    hold: &mut F::Hold,
) -> Result<Option<TxSlot<DB>>, Unsettled<DB, F>> {
    if !M::TRANSACTIONAL {
        return Ok(None);
    }
    match q.form.lend(&q.conns, hold).await {
        Ok(conn) => Ok(Some(Arc::new(tokio::sync::Mutex::new(Some(conn))))),
        Err(error) => {
            tracing::warn!(%error, "could not open the delivery's transaction; row released");
            Err(Unsettled::Released)
        }
    }
}

/// Reads row `id` whole for its row mode handler, where the form holds it (in the delivery's
/// transaction, when it has one, which a failed read rolls back).
async fn read_row<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    hold: &mut F::Hold,
    slot: &mut Option<TxSlot<DB>>,
    id: i64,
) -> Result<DB::Row, Unsettled<DB, F>> {
    let read = match slot.as_ref() {
        Some(slot) => {
            let mut lent = slot.lock().await;
            q.form.read_row(&q.conns, hold, lent.as_mut(), id).await
        }
        None => q.form.read_row(&q.conns, hold, None, id).await,
    };
    let reason = match read {
        Ok(Some(row)) => return Ok(row),
        Ok(None) => "the claimed row is gone (deleted by another hand); skipped".to_owned(),
        Err(error) => format!("could not read the row for its handler ({error}); released"),
    };
    q.observe.failed(1);
    tracing::warn!("{reason}");
    if let Some(conn) = slot.take().and_then(|slot| unlent(slot).ok()) {
        let _ = q.form.take_back(&q.conns, hold, conn, false).await;
    }
    Err(Unsettled::Released)
}

/// Calls the handler with its delivery while `hold` is kept. The handler's future lives in this
/// call only: when it ends, what it held is dropped. The call itself runs inside the guard too:
/// a handler may panic before its first await.
async fn call<DB, F, H>(
    q: &Live<DB, F>,
    handler: &H,
    id: i64,
    hold: &mut F::Hold,
    delivery: Delivery<DB, H::Mode>,
    whole: Option<DB::Row>,
    cancel: &crate::delivery::Cancel,
) -> Kept<Handled, F::Hold>
where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let handled =
        AssertUnwindSafe(async move { handler.call(delivery, whole).await }).catch_unwind();
    tokio::pin!(handled);
    keep(q, id, hold, handled, cancel).await
}

/// Takes the transaction back from the handler and ends the handler's part of it by the outcome
/// (asked of the policy once the transaction is back): an ack keeps the handler's writes, to
/// commit with the settlement; any other outcome rolls them back first, then settles as a plain
/// delivery would. Returns the outcome, and the transaction the settlement runs in where it is
/// the delivery's own (the lease form's, on an ack).
async fn take_back<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: &mut F::Hold,
    slot: Option<TxSlot<DB>>,
    outcome: impl FnOnce() -> Outcome,
) -> Result<(Outcome, Option<HeldConn<DB>>), Unsettled<DB, F>> {
    let Some(slot) = slot else {
        return Ok((outcome(), None));
    };
    // A delivery that escaped its handler still holds it.
    let Ok(conn) = unlent(slot) else {
        q.observe.failed(1);
        let error = Error::TransactionHeld {
            queue: q.label.to_string(),
            id,
        };
        tracing::error!(%error, "nothing was committed; the row is released");
        // A connection still lent is closed when the escaped delivery drops it.
        q.after_settlement(Outcome::retry());
        return Err(Unsettled::Released);
    };
    let outcome = outcome();
    match q
        .form
        .take_back(&q.conns, hold, conn, outcome.0 == Settle::Ack)
        .await
    {
        Ok(own_tx) => Ok((outcome, own_tx)),
        Err(error) => {
            q.observe.failed(1);
            tracing::error!(%error, "could not end the handler's transaction; row released");
            Err(Unsettled::Released)
        }
    }
}

/// The transaction, out of its slot: `Err` when the delivery escaped its handler (the
/// transaction is then closed by the escaped delivery, whoever drops it last).
fn unlent<DB: Backend>(slot: TxSlot<DB>) -> Result<HeldConn<DB>, ()> {
    Arc::try_unwrap(slot)
        .ok()
        .and_then(tokio::sync::Mutex::into_inner)
        .ok_or(())
}

/// Returns the row of a delivery that ends unsettled: released at once, or, cancelled at the
/// shutdown timeout, whatever its connection is doing.
async fn abandon<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: F::Hold,
    unsettled: Unsettled<DB, F>,
) {
    match unsettled {
        Unsettled::Released => release(q, id, hold).await,
        Unsettled::Cancelled { slot, extending } => {
            cancel::delivery(q, id, slot, hold, extending).await;
        }
    }
}

/// Settles a delivery, and counts it by the policy: acks and drops of plain queues that group
/// them go through the queue's ack grouping, their worker given to the next row meanwhile; a
/// settlement that failed for the row keeps it held for the policy's delay where the form can.
/// What it did, unless it failed: a settlement that found its job cancelled in work removed the
/// row, counted as a drop.
async fn settle<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: F::Hold,
    outcome: Outcome,
    tx: Option<HeldConn<DB>>,
    worker: Worker<'_>,
) -> Option<Settled> {
    tracing::Span::current().record("outcome", outcome.name());
    let since = q.observe.timer();
    let kept = q.form.keep(&hold);
    let grouped = matches!(outcome.0, Settle::Ack | Settle::Drop) && tx.is_none();
    let Worker {
        mut seat,
        mut working,
    } = worker;
    let settled = match (&q.acks, grouped) {
        (Some(acks), true) => {
            // The next row's handler, and the claim of more, overlap this ack's statement: it
            // commits for many. The row stays in hand until it is settled.
            if let Some(seat) = seat.as_mut() {
                seat.free_worker();
            }
            working.worker_free();
            let settled = super::acks::settle(acks, &q.label, id, hold, outcome).await;
            settled.map(|()| Settled::AsAsked)
        }
        _ => q.form.settle(&q.conns, id, hold, outcome, tx).await,
    };
    q.observe.settlement_took(since);
    q.note_unlock();
    let done = settled.as_ref().ok().copied();
    let outcome = match done {
        Some(Settled::Cancelled) => {
            tracing::info!(
                "job cancelled while in work, found by its settlement; its row is removed"
            );
            tracing::Span::current().record("outcome", Outcome::drop().name());
            Outcome::drop()
        }
        _ => outcome,
    };
    let settled = settled.map(drop);
    if let (Some(delay), Some(kept)) = (policy::settled(q, id, outcome, settled), kept) {
        q.form.hold_for(&q.conns, id, kept, delay).await;
    }
    done
}

/// Removes row `id`, cancelled before its handler started (claimed ahead of its worker, and a
/// cancellation notified meanwhile): settled as a drop, its request with it. On the lease form
/// the cancellation took its lease away already (the drop finds it lost).
pub(super) async fn drop_unstarted<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    id: i64,
    hold: F::Hold,
    entered: Entered,
) {
    tracing::info!(
        id,
        "job cancelled before its handler started: not delivered"
    );
    let outcome = Outcome::drop();
    let settled = q.form.settle(&q.conns, id, hold, outcome, None).await;
    q.note_unlock();
    let removed = settled.is_ok();
    policy::settled(q, id, outcome, settled.map(drop));
    drop(entered);
    if removed {
        q.requests.forget(&q.shared.pool, id).await;
    }
}

/// Releases a delivery's row unsettled (it was not handled to the end), and says so.
async fn release<DB: Backend, F: Form<DB>>(q: &Live<DB, F>, id: i64, hold: F::Hold) {
    if q.form.release(&q.conns, id, hold).await {
        q.after_settlement(Outcome::retry());
    }
}
