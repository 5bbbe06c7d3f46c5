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
use crate::form::FormRuntime;
use crate::queue::state::Mode;

/// After a wake-up finds nothing (the enqueue's transaction had not committed yet), the queue
/// looks again after these delays before falling back to its poll interval.
const RECHECKS: [Duration; 4] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(250),
];

/// Waits after a failed claim, doubling from 50 ms up to 5 s.
#[derive(Debug)]
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(5);

    fn next(&mut self) -> Duration {
        let wait = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        wait
    }

    fn reset(&mut self) {
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
    let mut backoff = Backoff(Backoff::FIRST);
    let mut recheck: Option<usize> = None;
    let mut report = QueueReport::default();
    let FormRuntime::Lease(lease) = &q.form;

    loop {
        // Wait for one free worker, then take every other free one: one claim fills them all.
        let mut permits = tokio::select! {
            permit = Arc::clone(&workers).acquire_many_owned(1) => {
                permit.expect("the semaphore is never closed")
            }
            () = q.stop.cancelled() => break,
        };
        if let Ok(more) = Arc::clone(&workers)
            .try_acquire_many_owned(u32::try_from(workers.available_permits()).unwrap_or(u32::MAX))
        {
            permits.merge(more);
        }
        let want = permits.num_permits();

        // A claim in flight is never cancelled: its rows would stay claimed until their lease
        // expired. It is awaited, and its rows released if the runner stopped meanwhile.
        let claimed = match lease.claim(&q.pool, want).await {
            Ok(claimed) => claimed,
            Err(error) => {
                drop(permits);
                let wait = backoff.next();
                tracing::warn!(queue = %q.label, %error, ?wait, "claim failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(wait) => continue,
                    () = q.stop.cancelled() => break,
                }
            }
        };
        backoff.reset();
        let got = claimed.rows.len();
        Counters::add(&q.stats.claimed, got as u64);

        if q.stop.is_cancelled() {
            for row in &claimed.rows {
                if let Ok(true) = lease.release(&q.pool, row.id, claimed.token).await {
                    report.released += 1;
                    Counters::add(&q.stats.released, 1);
                }
            }
            break;
        }
        for row in claimed.rows {
            let permit = permits.split(1).expect("one permit per claimed row");
            let (q, handler) = (Arc::clone(&q), Arc::clone(&handler));
            deliveries.spawn(async move {
                deliver::<DB, M, H>(&q, &*handler, row, claimed.token).await;
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
            () = q.wake.notified() => recheck = Some(0),
            () = tokio::time::sleep(wait) => {}
            () = q.stop.cancelled() => break,
        }
    }

    report.in_work = (q.workers - workers.available_permits()) as u64;
    deliveries.close();
    deliveries.wait().await;
    report.cancelled = q.cancelled.load(Ordering::Relaxed);
    report.released += q.cancelled_released.load(Ordering::Relaxed);
    report
}
