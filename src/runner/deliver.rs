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
use crate::backend::{Backend, ClaimedRow, query};
use crate::delivery::{Delivery, Outcome, Settle, TxSlot};
use crate::dialect::Args;
use crate::error::Error;
use crate::form::held::{Conns, HeldConn};
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
    if let Some(why) = &row.undecodable {
        // The decode policy, as for a payload a JSON handler cannot decode.
        tracing::error!(error = %why, "the claimed row does not decode: it never reaches the handler");
        let outcome = match q.max_attempts {
            Some(_) => Outcome::dead_letter(),
            None => Outcome::drop(),
        };
        settle(q, id, hold, outcome, None).await;
        return;
    }
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
        settle(q, id, hold, Outcome::dead_letter(), None).await;
        return;
    }
    // A transactional delivery gets a transaction (see `lend`).
    let slot = if M::TRANSACTIONAL {
        match lend(q, &mut hold).await {
            Ok(slot) => Some(slot),
            Err(error) => {
                tracing::warn!(%error, "could not open the delivery's transaction; row released");
                q.form.release(&q.conns, id, hold).await;
                return;
            }
        }
    } else {
        None
    };
    // A row mode handler gets the row whole, read where the form holds it (in the delivery's
    // transaction, when it has one).
    let whole = if H::ROW {
        let read = read_row(q, &mut hold, slot.as_ref(), id).await;
        let failed = match read {
            Ok(Some(whole)) => Ok(whole),
            Ok(None) => {
                Err("the claimed row is gone (deleted by another hand); skipped".to_owned())
            }
            Err(error) => Err(format!(
                "could not read the row for its handler ({error}); released"
            )),
        };
        match failed {
            Ok(whole) => Some(whole),
            Err(reason) => {
                Counters::add(&q.stats.failed, 1);
                tracing::warn!("{reason}");
                if let Some(slot) = slot
                    && let Ok(conn) = take_back(slot).await
                {
                    let _ = restore(&q.conns, &mut hold, conn, false).await;
                }
                if !matches!(hold, Hold::Lent) {
                    q.form.release(&q.conns, id, hold).await;
                }
                return;
            }
        }
    } else {
        None
    };
    let delivery = Delivery::<DB, M>::new(id, row.payload, attempt, q.group.clone(), slot.clone());

    // The handler's future lives in this block only: when it ends, what it held is dropped.
    // `extending`: the token of a lease extension in flight when the delivery was cancelled.
    let mut extending = None;
    let result = {
        // The call itself runs inside the guard too: a handler may panic before its first await.
        let handled =
            AssertUnwindSafe(async move { handler.call(delivery, whole).await }).catch_unwind();
        tokio::pin!(handled);
        match (&q.form, &mut hold) {
            (FormRuntime::Lease(lease), Hold::Lease(token, taken)) => {
                keep_lease(q, lease, id, token, *taken, &mut extending, handled).await
            }
            _ => tokio::select! {
                biased;
                result = &mut handled => Some(result),
                () = q.abort.cancelled() => None,
            },
        }
    };

    let Some(result) = result else {
        cancel(q, id, slot, hold, row.session, extending).await;
        return;
    };

    // Take the transaction back: a delivery that escaped its handler still holds it.
    let tx = match slot {
        None => None,
        Some(slot) => match take_back(slot).await {
            Ok(conn) => Some(conn),
            Err(conn) => {
                Counters::add(&q.stats.failed, 1);
                let error = Error::TransactionHeld {
                    queue: q.label.to_string(),
                    id,
                };
                tracing::error!(%error, "nothing was committed; the row is released");
                if let Some(conn) = conn {
                    let _ = restore(&q.conns, &mut hold, conn, false).await;
                }
                // A connection still lent is closed when the escaped delivery drops it.
                if !matches!(hold, Hold::Lent) {
                    q.form.release(&q.conns, id, hold).await;
                }
                q.settled(Outcome::retry());
                return;
            }
        },
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

    // Transactional: an ack commits the handler's writes with the settlement; any other outcome
    // rolls them back first, then settles as a plain delivery would.
    let mut lease_tx = None;
    if let Some(conn) = tx {
        let ack = outcome.0 == Settle::Ack;
        match restore(&q.conns, &mut hold, conn, ack).await {
            Ok(Some(conn)) => lease_tx = Some(conn),
            Ok(None) => {}
            Err(error) => {
                Counters::add(&q.stats.failed, 1);
                tracing::error!(%error, "could not end the handler's transaction; row released");
                if !matches!(hold, Hold::Lent) {
                    q.form.release(&q.conns, id, hold).await;
                }
                return;
            }
        }
    }
    settle(q, id, hold, outcome, lease_tx).await;
}

/// How long a delivery cancelled at the shutdown timeout waits for each statement that returns
/// its row (a lease extension in flight, the release, ending its server session) before it gives
/// up on it: [`Running::shutdown`](crate::Running::shutdown) returns at most twice this after the
/// timeout.
pub(crate) const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// A delivery cancelled at the shutdown timeout: its handler's future is gone, and its row goes
/// back unsettled at once, whatever the delivery's connection is doing. A transactional delivery's
/// connection is closed, never rolled back on (a statement of the handler's may still run there,
/// for as long as it likes): the server rolls the transaction back. MySQL/MariaDB also end its
/// session (`KILL`), and PostgreSQL 14+ ends it within 250 ms of the close
/// (`client_connection_check_interval`), so a row lock or a key it held is released at once.
async fn cancel<DB: Backend>(
    q: &QueueRuntime<DB>,
    id: i64,
    slot: Option<TxSlot<DB>>,
    hold: Hold<DB>,
    session: Option<i64>,
    extending: Option<DateTime<Utc>>,
) {
    q.cancelled.fetch_add(1, Ordering::Relaxed);
    // Closed when dropped: it is in a transaction. A `Tx` escaped into another task keeps it
    // until that task drops it; the session is ended below all the same.
    let lent = slot.and_then(|slot| slot.try_lock().ok().and_then(|mut lent| lent.take()));
    let transactional = lent.is_some();
    drop(lent);
    if let Some(session) = session {
        end_session(q, session).await;
    }
    let released = match hold {
        // The connection holding the row (its transaction or its key) is closed, and its session
        // ended: the server released the row.
        Hold::Lent => Some(true),
        hold => {
            let release = async {
                match (&q.form, hold, extending) {
                    (FormRuntime::Lease(lease), Hold::Lease(token, _), Some(extended)) => lease
                        .release_either(&q.conns, id, token, extended)
                        .await
                        .unwrap_or(false),
                    (_, hold, _) => q.form.release(&q.conns, id, hold).await,
                }
            };
            // Past the grace, the release is dropped: a connection holding the row closes.
            tokio::time::timeout(CANCEL_GRACE, release).await.ok()
        }
    };
    match released {
        Some(true) => {
            q.cancelled_released.fetch_add(1, Ordering::Relaxed);
            Counters::add(&q.stats.released, 1);
            q.note_unlock();
            tracing::warn!(
                transactional,
                "handler cancelled at the shutdown timeout; its row was released"
            );
        }
        Some(false) => tracing::warn!(
            "handler cancelled at the shutdown timeout; its row was no longer held (its lease \
             lost)"
        ),
        None => {
            q.cancelled_unreleased.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                ?CANCEL_GRACE,
                "handler cancelled at the shutdown timeout; its row could not be released in \
                 time: it returns when its lease expires or its connection closes"
            );
        }
    }
}

/// Ends a cancelled delivery's server session from another connection, within the grace.
async fn end_session<DB: Backend>(q: &QueueRuntime<DB>, session: i64) {
    let ended = tokio::time::timeout(CANCEL_GRACE, async {
        let mut conn = q.conns.pool.acquire().await?;
        DB::end_session(&mut conn, session).await
    })
    .await;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, session, "could not end a cancelled delivery's session")
        }
        Err(_) => tracing::warn!(
            session,
            "could not end a cancelled delivery's session in time"
        ),
    }
}

/// Reads row `id` whole (row mode): in the delivery's transaction where it has one, else on the
/// connection that holds the row, or one of the queue's.
async fn read_row<DB: Backend>(
    q: &QueueRuntime<DB>,
    hold: &mut Hold<DB>,
    slot: Option<&TxSlot<DB>>,
    id: i64,
) -> Result<Option<DB::Row>, sqlx::Error> {
    let stmt = q.row_sql.as_ref().expect("rendered for every queue");
    let args = Args {
        id,
        ..Args::default()
    };
    let read = || query(stmt, &args);
    if let Some(slot) = slot {
        let mut lent = slot.lock().await;
        let conn = lent.as_mut().expect("lent, not yet handed to the handler");
        return DB::fetch_row(conn, read()).await;
    }
    match hold {
        Hold::Conn(conn) => DB::fetch_row(conn, read()).await,
        _ => {
            let mut conn = q.conns.get().await?;
            let row = q.conns.checked(DB::fetch_row(&mut conn, read()).await)?;
            q.conns.put(conn);
            Ok(row)
        }
    }
}

/// Lends a transactional delivery its transaction: row lock — a savepoint in the claim's
/// transaction; advisory lock — a transaction on the session holding the key; lease — a
/// transaction of the delivery's own, on a connection of the pool.
async fn lend<DB: Backend>(
    q: &QueueRuntime<DB>,
    hold: &mut Hold<DB>,
) -> Result<TxSlot<DB>, sqlx::Error> {
    let conn = match hold {
        Hold::Lease(..) => {
            let mut conn = HeldConn::new(q.conns.get().await?);
            conn.begin(q.tx_begin).await?;
            conn
        }
        Hold::Conn(conn) => {
            let begin = if conn.depth() > 0 { None } else { q.tx_begin };
            conn.begin(begin).await?;
            let Hold::Conn(conn) = std::mem::replace(hold, Hold::Lent) else {
                unreachable!("matched above");
            };
            conn
        }
        Hold::Lent => unreachable!("lent once"),
    };
    let mut conn = conn;
    conn.lend();
    Ok(Arc::new(tokio::sync::Mutex::new(Some(conn))))
}

/// Takes the transaction back from its slot: `Err` when the delivery escaped its handler (with
/// the transaction, if it could be taken from the escaped delivery within 5 s).
async fn take_back<DB: Backend>(slot: TxSlot<DB>) -> Result<HeldConn<DB>, Option<HeldConn<DB>>> {
    match Arc::try_unwrap(slot) {
        Ok(slot) => slot.into_inner().ok_or(None),
        Err(shared) => Err(tokio::time::timeout(Duration::from_secs(5), shared.lock())
            .await
            .ok()
            .and_then(|mut slot| slot.take())),
    }
}

/// Ends the handler's part of a transaction: kept for the settlement on `ack` (a row lock's
/// savepoint released into the claim's transaction), rolled back otherwise. The connection goes
/// back to `hold` where the form holds one; a lease delivery's transaction is returned for an
/// ack's settlement.
async fn restore<DB: Backend>(
    conns: &Conns<DB>,
    hold: &mut Hold<DB>,
    mut conn: HeldConn<DB>,
    ack: bool,
) -> Result<Option<HeldConn<DB>>, sqlx::Error> {
    let lent = matches!(hold, Hold::Lent);
    match (ack, lent, conn.depth()) {
        // Row lock: release the savepoint; the claim's transaction commits with the settlement.
        (true, true, depth) if depth > 1 => conn.commit().await?,
        (true, _, _) => {}
        (false, _, _) => conn.rollback().await?,
    }
    if lent {
        *hold = Hold::Conn(conn);
        Ok(None)
    } else if ack {
        Ok(Some(conn))
    } else {
        // A lease delivery's own transaction, rolled back: its connection is clean again.
        conns.put_held(conn);
        Ok(None)
    }
}

/// Settles a delivery and counts the result.
async fn settle<DB: Backend>(
    q: &QueueRuntime<DB>,
    id: i64,
    hold: Hold<DB>,
    outcome: Outcome,
    tx: Option<HeldConn<DB>>,
) {
    tracing::Span::current().record("outcome", outcome.name());
    let token = match &hold {
        Hold::Lease(token, _) => Some(*token),
        _ => None,
    };
    let settled = match (&q.acks, &q.form, &hold, outcome.0) {
        (
            Some(acks),
            FormRuntime::Lease(lease),
            Hold::Lease(token, _),
            Settle::Ack | Settle::Drop,
        ) if lease.custom.get(outcome.0).is_none() && tx.is_none() => {
            super::acks::acknowledge(acks, id, *token, outcome).await
        }
        _ => None,
    };
    let settled = match settled {
        Some(settled) => settled,
        None => q.form.settle(&q.conns, id, hold, outcome, tx).await,
    };
    q.note_unlock();
    let held_back = count_settled(q, id, outcome, settled);
    q.settled(outcome);
    if let (Some(delay), Some(token), FormRuntime::Lease(lease)) = (held_back, token, &q.form) {
        // The row stays leased for the delay, so that no runner takes it again before.
        let until = lease.clock.after(delay);
        if let Err(error) = lease.extend_to(&q.conns, id, token, until).await {
            tracing::warn!(%error, "could not hold the lease for the delay");
        }
    }
}

/// Counts a settlement's result, and logs a failed one. A settlement that failed for the row
/// (not a lost lease) holds the row back, for longer at each failure: the delay.
pub(super) fn count_settled<DB: Backend>(
    q: &QueueRuntime<DB>,
    id: i64,
    outcome: Outcome,
    settled: crate::error::Result<()>,
) -> Option<Duration> {
    match settled {
        Ok(()) => {
            q.quarantine.release(id);
            let counter = match outcome.0 {
                Settle::Ack => &q.stats.acked,
                Settle::Drop => &q.stats.dropped,
                Settle::Retry | Settle::RetryAfter(_) => &q.stats.retried,
                Settle::DeadLetter => &q.stats.dead_lettered,
                Settle::Undecodable => unreachable!("mapped to dead letter or drop"),
            };
            Counters::add(counter, 1);
            None
        }
        Err(Error::LeaseLost { id, .. }) => {
            Counters::add(&q.stats.lease_lost, 1);
            tracing::warn!(
                id,
                "lease lost: the row belongs to a later claim; nothing was settled"
            );
            None
        }
        Err(error) => {
            Counters::add(&q.stats.failed, 1);
            let what = format!("its settlement ({})", outcome.name());
            Some(q.quarantine.hold_back(&q.label, id, &what, &error))
        }
    }
}

/// Awaits the handler while extending its lease every half lease (the handler is polled during
/// an extension too, so a slow statement never stalls it). `None` when cancelled at the
/// shutdown timeout; `extending` is then the token of an extension in flight whose outcome is
/// unknown (it may have committed): the release fences both tokens.
async fn keep_lease<DB: Backend>(
    q: &QueueRuntime<DB>,
    lease: &LeaseForm,
    id: i64,
    token: &mut DateTime<Utc>,
    taken: Instant,
    extending: &mut Option<DateTime<Utc>>,
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
        let new_token = lease.next_token();
        let extension = lease.extend_to(&q.conns, id, *token, new_token);
        tokio::pin!(extension);
        let mut finished = None;
        let extended = loop {
            tokio::select! {
                extended = &mut extension => break extended,
                result = &mut handled, if finished.is_none() => {
                    if q.abandon_extension {
                        return Some(result);
                    }
                    finished = Some(result);
                }
                () = q.abort.cancelled(), if finished.is_none() => {
                    // The extension may commit the new token after all: learn which the row
                    // carries, or fence both.
                    match tokio::time::timeout(CANCEL_GRACE, &mut extension).await {
                        Ok(Ok(Some(new_token))) => *token = new_token,
                        Ok(Ok(None)) => {}
                        Ok(Err(_)) | Err(_) => *extending = Some(new_token),
                    }
                    return None;
                }
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

pub(super) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(message) = panic.downcast_ref::<&str>() {
        message
    } else if let Some(message) = panic.downcast_ref::<String>() {
        message
    } else {
        "(not a string)"
    }
}
