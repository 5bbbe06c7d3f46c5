//! Grouped acks (the forms that settle many in one statement: the lease form, and the advisory
//! form's plain deliveries): deliveries of a plain queue that end in ack or drop hand their row
//! to one task per queue, which settles every row waiting together ([`Form::settle_many`]), each
//! row still guarded by its own hold. A flush starts as soon as the previous one ended, with what
//! queued meanwhile (up to 64 rows) and what the deliveries ending in the same instant send after
//! one yield: nothing waits for a timer, and under load the statements grow.

use std::sync::Weak;

use tokio::sync::{mpsc, oneshot};

use super::queue::Live;
use crate::backend::Backend;
use crate::delivery::Outcome;
use crate::dialect::MAX_FINISH;
use crate::error::{Error, Result};
use crate::form::Form;

/// One row to settle, and where to say how it went.
#[derive(Debug)]
pub(super) struct Ack<H> {
    id: i64,
    hold: H,
    outcome: Outcome,
    reply: oneshot::Sender<Result<()>>,
}

/// Settles what the queue's deliveries send, until they are all gone.
pub(super) async fn run<DB: Backend, F: Form<DB>>(
    q: Weak<Live<DB, F>>,
    mut acks: mpsc::UnboundedReceiver<Ack<F::Hold>>,
) {
    let mut waiting = Vec::with_capacity(MAX_FINISH);
    while let Some(first) = acks.recv().await {
        waiting.push(first);
        // The deliveries that ended with this one send their acks in the same instant: let
        // them, so that one statement settles them all (a yield, not a timer: nothing waits).
        tokio::task::yield_now().await;
        while waiting.len() < MAX_FINISH {
            match acks.try_recv() {
                Ok(ack) => waiting.push(ack),
                Err(_) => break,
            }
        }
        let Some(q) = q.upgrade() else { return };
        let (rows, replies): (Vec<_>, Vec<_>) = waiting
            .drain(..)
            .map(|ack| ((ack.id, ack.hold, ack.outcome), ack.reply))
            .unzip();
        let settled = q.form.settle_many(&q.conns, rows).await;
        for (reply, settled) in replies.into_iter().zip(settled) {
            let _ = reply.send(settled);
        }
    }
}

/// Sends a row to the queue's ack task and waits for its settlement.
pub(super) async fn settle<H>(
    acks: &mpsc::UnboundedSender<Ack<H>>,
    queue: &str,
    id: i64,
    hold: H,
    outcome: Outcome,
) -> Result<()> {
    let (reply, settled) = oneshot::channel();
    let stopped = || Error::Stopped {
        queue: queue.to_owned(),
    };
    acks.send(Ack {
        id,
        hold,
        outcome,
        reply,
    })
    .map_err(|_| stopped())?;
    settled.await.unwrap_or_else(|_| Err(stopped()))
}
