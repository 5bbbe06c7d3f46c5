//! A queue's claim loop: claims as many rows as it has free workers, in one round trip, and
//! hands each to a delivery task.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::deliver::deliver;
use super::launch::CallHandler;
use super::{Counters, QueueReport, QueueRuntime};
use crate::backend::Backend;
use crate::queue::state::Mode;

/// After a wake-up finds nothing (the enqueue's transaction had not committed yet), the queue
/// looks again after these delays before falling back to its poll interval.
pub(super) const RECHECKS: [Duration; 4] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(250),
];

/// The most rows one claim takes.
pub(crate) const MAX_CLAIM: usize = 1000;

/// Waits after a failed claim, doubling from 50 ms up to 5 s.
#[derive(Debug)]
pub(super) struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(Backoff::FIRST)
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(5);

    pub(super) fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }

    pub(super) fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

pub(super) async fn run<DB, M, H>(q: Arc<QueueRuntime<DB>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    let workers = Arc::new(Semaphore::new(q.workers));
    let deliveries = TaskTracker::new();
    let mut backoff = Backoff::default();
    let mut recheck: Option<usize> = None;
    let mut report = QueueReport::default();

    loop {
        // Wait for one free worker, then take every other free one: one claim fills them all.
        let mut permits = tokio::select! {
            biased;
            () = q.stop.cancelled() => break,
            permit = Arc::clone(&workers).acquire_many_owned(1) => {
                permit.expect("the semaphore is never closed")
            }
        };
        let free = workers.available_permits().min(MAX_CLAIM - 1);
        if let Ok(more) = Arc::clone(&workers).try_acquire_many_owned(free as u32) {
            permits.merge(more);
        }
        let want = permits.num_permits();

        // A claim in flight is never cancelled: its rows would stay claimed until their lease
        // expired. It is awaited, and its rows released if the runner stopped meanwhile.
        let claimed = match q.form.claim(&q.pool, want).await {
            Ok(claimed) => claimed,
            Err(error) => {
                drop(permits);
                let wait = backoff.next();
                tracing::warn!(queue = %q.label, %error, ?wait, "claim failed; retrying");
                tokio::select! {
                    biased;
                    () = q.stop.cancelled() => break,
                    () = tokio::time::sleep(wait) => continue,
                }
            }
        };
        backoff.reset();
        let got = claimed.len();
        Counters::add(&q.stats.claimed, got as u64);

        if q.stop.is_cancelled() {
            for (row, hold) in claimed {
                if q.form.release(&q.pool, row.id, hold).await {
                    report.released += 1;
                    Counters::add(&q.stats.released, 1);
                    q.note_unlock();
                }
            }
            break;
        }
        for (row, hold) in claimed {
            let permit = permits.split(1).expect("one permit per claimed row");
            let (q, handler) = (Arc::clone(&q), Arc::clone(&handler));
            q.stats.in_work.fetch_add(1, Ordering::Relaxed);
            deliveries.spawn(async move {
                deliver::<DB, M, H>(&q, &*handler, row, hold).await;
                q.stats.in_work.fetch_sub(1, Ordering::Relaxed);
                drop(permit);
            });
        }
        drop(permits);
        if got == want {
            // Every free worker got a row: there may be more.
            recheck = None;
            continue;
        }

        // The queue is drained for now: wait for a wake-up, a recheck or the poll.
        let wait = match recheck {
            Some(i) if i < RECHECKS.len() => {
                recheck = Some(i + 1);
                RECHECKS[i]
            }
            _ => {
                recheck = None;
                q.poll_interval
            }
        };
        tokio::select! {
            biased;
            () = q.stop.cancelled() => break,
            () = q.wake.notified() => recheck = Some(0),
            () = tokio::time::sleep(wait) => {}
        }
    }

    deliveries.close();
    deliveries.wait().await;
    report.cancelled = q.cancelled.load(Ordering::Relaxed);
    report.released += q.cancelled_released.load(Ordering::Relaxed);
    report.keys_released = q.unlocked_after_stop.load(Ordering::Relaxed);
    report
}
