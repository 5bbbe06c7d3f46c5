//! A queue's claim loop: claims as many rows as it has free workers, in one round trip, and
//! hands each to a delivery task.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use std::sync::atomic::AtomicUsize;

use tokio::sync::{Notify, Semaphore};
use tokio_util::task::TaskTracker;

use super::deliver::deliver;
use super::launch::CallHandler;
use super::{Counters, QueueReport, QueueRuntime};
use crate::backend::Backend;
use crate::backend::is_row_error;
use crate::form::{ClaimFailed, FormRuntime};
use crate::queue::state::Mode;

/// After a wake-up finds nothing (the enqueue's transaction had not committed yet), the queue
/// looks again after these delays before falling back to its poll interval.
const RECHECKS: [Duration; 4] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(250),
];

/// The most rows one claim takes.
pub(crate) const MAX_CLAIM: usize = 1000;

/// What a claim loop waits for between claims: after a failed claim, a back-off (50 ms doubling
/// to 5 s); after a claim that did not fill its workers, a wake-up, a recheck or the poll.
#[derive(Debug)]
pub(super) struct Pace {
    backoff: Duration,
    /// Rows isolated since the last claim that did not fail.
    isolated: u32,
    recheck: Option<usize>,
    /// A worker loop's siblings: one that found a row wakes one that waits (no rechecks follow:
    /// the row it saw was committed).
    siblings: Option<Arc<Notify>>,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            backoff: Pace::FIRST_BACKOFF,
            isolated: 0,
            recheck: None,
            siblings: None,
        }
    }
}

impl Pace {
    const FIRST_BACKOFF: Duration = Duration::from_millis(50);
    const MAX_BACKOFF: Duration = Duration::from_secs(5);

    /// How many rows a streak of failed claims isolates before it backs off the whole queue (a
    /// row named by the read of the next claimable one may be another runner's, held since).
    const MAX_ISOLATED: u32 = 32;

    /// After a failed claim: a claim that failed for a reason of one row's own holds that row
    /// back and goes on at once; any other failure waits (a back-off). `false` when the runner
    /// stops meanwhile.
    pub(super) async fn failed<DB: Backend>(
        &mut self,
        q: &QueueRuntime<DB>,
        failed: ClaimFailed,
    ) -> bool {
        let error = &failed.error;
        if is_row_error(error) && self.isolated < Self::MAX_ISOLATED {
            let row = match failed.row {
                Some(id) => Some(id),
                None => q
                    .form
                    .next(&q.conns, &q.quarantine.excluded())
                    .await
                    .ok()
                    .flatten(),
            };
            if let Some(id) = row {
                self.isolated += 1;
                q.quarantine.hold_back(&q.label, id, "its claim", error);
                return !q.stop.is_cancelled();
            }
        }
        q.conns.clear();
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
        tracing::warn!(queue = %q.label, %error, ?wait, "claim failed; retrying");
        tokio::select! {
            biased;
            () = q.stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// After a claim: goes on at once when it filled every worker it could (there may be more),
    /// else waits for a wake-up, a recheck or the poll. `idle`: nothing of the queue is in work,
    /// so a wait for the poll gives the kept connections back to the pool. `false` when the
    /// runner stops meanwhile.
    pub(super) async fn claimed<DB: Backend>(
        &mut self,
        q: &QueueRuntime<DB>,
        full: bool,
        idle: bool,
    ) -> bool {
        self.backoff = Self::FIRST_BACKOFF;
        self.isolated = 0;
        if full {
            self.recheck = None;
            return true;
        }
        let wait = match self.recheck {
            Some(i) if i < RECHECKS.len() => {
                self.recheck = Some(i + 1);
                RECHECKS[i]
            }
            _ => {
                // Idle until the poll: the kept connections go back to the pool meanwhile.
                self.recheck = None;
                if idle {
                    q.conns.clear();
                }
                q.poll_interval
            }
        };
        let siblings = async {
            match &self.siblings {
                Some(siblings) => siblings.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = q.stop.cancelled() => false,
            () = q.wake.notified() => {
                self.recheck = Some(0);
                true
            }
            () = siblings => {
                self.recheck = None;
                true
            }
            () = q.settled.notified() => {
                self.recheck = None;
                true
            }
            () = tokio::time::sleep(wait) => true,
        }
    }
}

pub(super) async fn run<DB, M, H>(q: Arc<QueueRuntime<DB>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    if !matches!(q.form, FormRuntime::Lease(_)) {
        return run_workers::<DB, M, H>(q, handler).await;
    }
    let workers = Arc::new(Semaphore::new(q.workers));
    let deliveries = TaskTracker::new();
    let mut pace = Pace::default();
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
        let excluded = q.quarantine.excluded();
        let claimed = match q.form.claim(&q.conns, want, &excluded).await {
            Ok(claimed) => claimed,
            Err(failed) => {
                drop(permits);
                if pace.failed(&q, failed).await {
                    continue;
                }
                break;
            }
        };
        let got = claimed.len();
        Counters::add(&q.stats.claimed, got as u64);

        if q.stop.is_cancelled() {
            for (row, hold) in claimed {
                if q.form.release(&q.conns, row.id, hold).await {
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
        let idle = workers.available_permits() == q.workers;
        if !pace.claimed(&q, got == want, idle).await {
            break;
        }
    }

    deliveries.close();
    deliveries.wait().await;
    report.cancelled = q.cancelled.load(Ordering::Relaxed);
    report.released += q.cancelled_released.load(Ordering::Relaxed);
    report.unreleased = q.cancelled_unreleased.load(Ordering::Relaxed);
    report.keys_released = q.unlocked_after_stop.load(Ordering::Relaxed);
    report
}

/// The forms that hold a connection per delivery claim one row per worker: each worker is a
/// loop of its own — claim, deliver, claim again — so a worker never waits for another's claim.
/// A worker that finds a row wakes one idle sibling, so a backlog spreads across the workers at
/// once; a worker that finds none waits for a wake-up, a recheck or the poll.
async fn run_workers<DB, M, H>(q: Arc<QueueRuntime<DB>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    M: Mode,
    H: CallHandler<DB, M>,
{
    let siblings = Arc::new(Notify::new());
    let busy = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for index in 0..q.workers {
        let (q, handler) = (Arc::clone(&q), Arc::clone(&handler));
        let (siblings, busy) = (Arc::clone(&siblings), Arc::clone(&busy));
        workers.spawn(async move {
            let mut pace = Pace {
                siblings: Some(Arc::clone(&siblings)),
                ..Pace::default()
            };
            let mut released = 0;
            loop {
                if q.stop.is_cancelled() {
                    break;
                }
                // A claim in flight is awaited, and its row released if the runner stopped.
                let excluded = q.quarantine.excluded();
                let claimed = q.form.claim_one(&q.conns, index, q.workers, &excluded);
                let (row, hold) = match claimed.await {
                    Ok(Some(claimed)) => claimed,
                    Ok(None) => {
                        let idle = busy.load(Ordering::Relaxed) == 0;
                        if pace.claimed(&q, false, idle).await {
                            continue;
                        }
                        break;
                    }
                    Err(failed) => {
                        if pace.failed(&q, failed).await {
                            continue;
                        }
                        break;
                    }
                };
                Counters::add(&q.stats.claimed, 1);
                if q.stop.is_cancelled() {
                    if q.form.release(&q.conns, row.id, hold).await {
                        released += 1;
                        Counters::add(&q.stats.released, 1);
                        q.note_unlock();
                    }
                    break;
                }
                siblings.notify_one();
                busy.fetch_add(1, Ordering::Relaxed);
                q.stats.in_work.fetch_add(1, Ordering::Relaxed);
                deliver::<DB, M, H>(&q, &*handler, row, hold).await;
                q.stats.in_work.fetch_sub(1, Ordering::Relaxed);
                busy.fetch_sub(1, Ordering::Relaxed);
                // Found one: look again at once.
                pace.claimed(&q, true, false).await;
            }
            released
        });
    }
    let mut released = 0;
    while let Some(worker) = workers.join_next().await {
        match worker {
            Ok(n) => released += n,
            Err(error) => {
                tracing::error!(queue = %q.label, %error, "a worker loop ended abnormally")
            }
        }
    }
    QueueReport {
        cancelled: q.cancelled.load(Ordering::Relaxed),
        released: released + q.cancelled_released.load(Ordering::Relaxed),
        unreleased: q.cancelled_unreleased.load(Ordering::Relaxed),
        keys_released: q.unlocked_after_stop.load(Ordering::Relaxed),
    }
}
