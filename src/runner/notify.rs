//! Wake-ups across processes on PostgreSQL: a dedicated connection listens on the tables'
//! channels, and each notification wakes the queues of its table and group in this process — or,
//! a cancel request's, cancels the delivery in work it names (`requests`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backend::Listener;
use crate::enqueue::wake;

/// Relays notifications to the in-process wake-ups until `stop`. A lost listening connection is
/// re-established by the listener (which listens again on every channel); notifications sent
/// meanwhile are lost, so every listening queue then looks once.
pub(super) async fn relay(
    mut listener: Box<dyn Listener>,
    channels: Vec<(String, String)>,
    stop: CancellationToken,
) {
    let wake_all = || {
        for (_, table) in &channels {
            wake(table, None);
        }
    };
    let mut backoff = Duration::from_millis(50);
    loop {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            received = listener.recv() => received,
        };
        match received {
            Ok(Some((channel, payload))) => {
                backoff = Duration::from_millis(50);
                let table = channels
                    .iter()
                    .find(|(listened, _)| *listened == channel)
                    .map(|(_, table)| table);
                if let Some(table) = table
                    && !super::requests::notified(table, &payload)
                {
                    let group = Some(payload.as_str()).filter(|group| !group.is_empty());
                    wake(table, group);
                }
            }
            Ok(None) => {
                tracing::warn!("the listening connection was lost; listening again");
                wake_all();
            }
            Err(error) => {
                tracing::warn!(%error, ?backoff, "listening failed; trying again");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                wake_all();
            }
        }
    }
}
