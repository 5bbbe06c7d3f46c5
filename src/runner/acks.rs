//! Batched acknowledgements (the lease form): deliveries that end in ack or drop hand their row
//! to one task per queue, which settles every row waiting with one statement, each row still
//! guarded by its own token. A flush starts as soon as the previous one ended, with what queued
//! meanwhile (up to 64 rows): nothing waits for a timer, and under load the statements grow.

use std::sync::Weak;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};

use super::QueueRuntime;
use crate::backend::Backend;
use crate::delivery::Outcome;
use crate::dialect::MAX_FINISH;
use crate::error::{Error, Result};
use crate::form::FormRuntime;

/// One row to acknowledge, and where to say how it went.
#[derive(Debug)]
pub(crate) struct Ack {
    pub(crate) id: i64,
    pub(crate) token: DateTime<Utc>,
    pub(crate) outcome: Outcome,
    pub(crate) reply: oneshot::Sender<Result<()>>,
}

/// Settles what the queue's deliveries send, until they are all gone.
pub(crate) async fn run<DB: Backend>(
    q: Weak<QueueRuntime<DB>>,
    mut acks: mpsc::UnboundedReceiver<Ack>,
) {
    let mut waiting = Vec::with_capacity(MAX_FINISH);
    while let Some(first) = acks.recv().await {
        waiting.push(first);
        while waiting.len() < MAX_FINISH {
            match acks.try_recv() {
                Ok(ack) => waiting.push(ack),
                Err(_) => break,
            }
        }
        let Some(q) = q.upgrade() else { return };
        let FormRuntime::Lease(lease) = &q.form else {
            unreachable!("acknowledgements are batched in the lease form only");
        };
        let items: Vec<(i64, DateTime<Utc>)> =
            waiting.iter().map(|ack| (ack.id, ack.token)).collect();
        match lease.finish_many(&q.conns, &items).await {
            Ok(settled) => {
                for (ack, settled) in waiting.drain(..).zip(settled) {
                    // A row that no longer carried its token is a lost lease, reported alone.
                    let result = if settled {
                        Ok(())
                    } else {
                        Err(lease.lost(ack.id))
                    };
                    let _ = ack.reply.send(result);
                }
            }
            Err(error) => {
                // Each row again on its own, so each gets its own answer.
                tracing::warn!(%error, rows = waiting.len(), "batched acknowledgement failed");
                for ack in waiting.drain(..) {
                    let settled = lease
                        .settle(&q.conns, ack.id, ack.token, ack.outcome, None)
                        .await;
                    let _ = ack.reply.send(settled);
                }
            }
        }
    }
}

/// Sends a row to the batcher and waits for its settlement.
pub(crate) async fn acknowledge(
    acks: &mpsc::UnboundedSender<Ack>,
    id: i64,
    token: DateTime<Utc>,
    outcome: Outcome,
) -> Option<Result<()>> {
    let (reply, settled) = oneshot::channel();
    acks.send(Ack {
        id,
        token,
        outcome,
        reply,
    })
    .ok()?;
    Some(settled.await.unwrap_or_else(|_| {
        Err(Error::declaration(
            "acknowledgements",
            "the acknowledgement task ended before settling the row",
        ))
    }))
}
