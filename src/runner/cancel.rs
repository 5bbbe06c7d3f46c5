//! What the shutdown timeout leaves of a delivery or a batch whose handler it cancelled: its
//! rows go back unsettled at once, whatever its connection is doing, each kind's way written
//! once here.

use std::sync::atomic::Ordering;

use super::queue::Live;
use super::stats::Counters;
use crate::backend::Backend;
use crate::delivery::TxSlot;
use crate::form::{Form, GRACE, Returned};

/// A delivery cancelled at the shutdown timeout: its handler's future is gone, and its row goes
/// back unsettled at once, whatever the delivery's connection is doing. A transactional
/// delivery's connection is closed, never rolled back on (a statement of the handler's may
/// still run there, for as long as it likes): the server rolls the transaction back.
/// MySQL/MariaDB also end its session (`KILL`, when the claim read it), and PostgreSQL 14+ ends
/// it within 250 ms of the close (`client_connection_check_interval`), so a row lock or a key it
/// held is released at once.
pub(super) async fn delivery<DB: Backend, F: Form<DB>>(
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

/// A batch cancelled at the shutdown timeout: its rows `ids` are released within [`GRACE`]; past
/// it the release is dropped, and a connection holding the rows closes.
pub(super) async fn batch<DB: Backend, F: Form<DB>>(q: &Live<DB, F>, ids: &[i64], batch: F::Batch) {
    q.cancelled.fetch_add(1, Ordering::Relaxed);
    let release = q.form.release_batch(&q.conns, ids, batch);
    let released = tokio::time::timeout(GRACE, release).await;
    let released = released.unwrap_or_else(|_| {
        q.cancelled_unreleased
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        0
    });
    q.cancelled_released.fetch_add(released, Ordering::Relaxed);
    Counters::add(&q.stats().released, released);
    tracing::warn!(
        released,
        rows = ids.len(),
        "batch cancelled at the shutdown timeout; its rows were released"
    );
}
