//! What [`Runner::start`](super::Runner::start) returns: the started queues, their stats, and the
//! shutdown that stops them and waits for their deliveries in work.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::schedule::Started;
use super::stats::{Counters, QueueReport, ShutdownReport, Stats};
use crate::error::Result;

/// Started queues. [`shutdown`](Running::shutdown) stops them and waits; dropping this without
/// it stops claiming, and lets deliveries in work finish in the background.
#[must_use = "dropping `Running` stops its queues; call `shutdown().await` to wait for them"]
pub struct Running {
    /// The clock's measurements and the notification listener.
    pub(super) background: Vec<JoinHandle<()>>,
    pub(super) stop: CancellationToken,
    pub(super) abort: CancellationToken,
    pub(super) tasks: Vec<JoinHandle<QueueReport>>,
    pub(super) schedules: Started,
    pub(super) stats: Arc<Counters>,
    pub(super) shutdown_timeout: Duration,
}

impl Running {
    /// Counts of what the runner has done so far, over all its queues.
    pub fn stats(&self) -> Stats {
        self.stats.snapshot()
    }

    /// Stops claiming, lets the deliveries in work finish and settle (cancelling those still
    /// running after the runner's `shutdown_timeout`, whose rows are released unsettled), and
    /// releases rows claimed but not started. No lease or lock is left behind.
    ///
    /// It returns at most `shutdown_timeout` plus two seconds after it is called, whatever the
    /// handlers are blocked on: a cancelled delivery's connection is closed rather than rolled
    /// back on (a statement of its handler's may still run there), and each statement that
    /// returns its row (a lease extension in flight, the release, ending its server session)
    /// gets one second. A row whose release could not be confirmed is counted in
    /// [`ShutdownReport::unreleased`].
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for failures to report.
    pub async fn shutdown(mut self) -> Result<ShutdownReport> {
        let mut report = ShutdownReport {
            in_work: self.stats.in_work.load(Ordering::Relaxed),
            ..ShutdownReport::default()
        };
        self.stop.cancel();
        let tasks = std::mem::take(&mut self.tasks);
        let abort = self.abort.clone();
        let timeout = self.shutdown_timeout;
        let deadline = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            abort.cancel();
        });
        self.schedules.stopped().await;
        for task in tasks {
            match task.await {
                Ok(queue) => report.add(&queue),
                // A queue task that panicked has nothing left to release.
                Err(error) => tracing::error!(%error, "a queue's task failed"),
            }
        }
        deadline.abort();
        Ok(report)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.cancel();
        for task in &self.background {
            task.abort();
        }
    }
}

impl fmt::Debug for Running {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Running")
            .field("queues", &self.tasks.len())
            .field("schedules", &self.schedules.names())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
