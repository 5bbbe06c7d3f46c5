//! A queue of single deliveries: its claim loops, and how they pace themselves.
//!
//! The lease form claims for every free worker in one statement, from one loop (`ahead`); the
//! forms that hold a connection per delivery run one loop per worker — claim a row, deliver it, claim again
//! — so no worker waits for another's claim, and a worker that found a row wakes an idle sibling
//! so a backlog spreads at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

use super::deliver::deliver;
use super::queue::Live;
use super::stats::{Counters, QueueReport};
use crate::backend::{Backend, ClaimedRow};
use crate::form::{ClaimFailed, Form};
use crate::handler::CallOne;

/// After a wake-up finds nothing (the enqueue's transaction had not committed yet), the queue
/// looks again after these delays before falling back to its poll interval.
const RECHECKS: [Duration; 4] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(250),
];

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

    /// The pace of one of a queue's worker loops, which wake each other through `siblings`.
    pub(super) fn with_siblings(siblings: Arc<Notify>) -> Self {
        Pace {
            siblings: Some(siblings),
            ..Pace::default()
        }
    }

    /// Wakes a sibling worker loop that waits (this one found rows: there may be more).
    pub(super) fn wake_sibling(&self) {
        if let Some(siblings) = &self.siblings {
            siblings.notify_one();
        }
    }
    const MAX_BACKOFF: Duration = Duration::from_secs(5);

    /// How many rows a streak of failed claims isolates before it backs off the whole queue (a
    /// row named by the read of the next claimable one may be another runner's, held since).
    const MAX_ISOLATED: u32 = 32;

    /// After a failed claim: a claim that failed for a reason of one row's own holds that row
    /// back and goes on at once; any other failure waits (a back-off). `false` when the runner
    /// stops meanwhile.
    pub(super) async fn failed<DB: Backend, F: Form<DB>>(
        &mut self,
        q: &Live<DB, F>,
        failed: ClaimFailed,
    ) -> bool {
        q.observe.claim_failed();
        if failed.is_row_error() && self.isolated < Self::MAX_ISOLATED {
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
                q.quarantine
                    .hold_back(&q.label, id, "its claim", &failed.error);
                return !q.stopping();
            }
        }
        q.conns.clear();
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
        let error = &failed.error;
        tracing::warn!(queue = %q.label, %error, ?wait, "claim failed; retrying");
        tokio::select! {
            biased;
            () = q.shared.stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }

    /// After a claim: goes on at once when it filled every worker it could (there may be more),
    /// else waits for a wake-up, a settlement, a recheck or the poll. `idle`: nothing of the
    /// queue is in work, so a wait for the poll gives the kept connections back to the pool.
    /// `false` when the runner stops meanwhile.
    pub(super) async fn claimed<DB: Backend, F: Form<DB>>(
        &mut self,
        q: &Live<DB, F>,
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
                q.shared.poll_interval
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
            () = q.shared.stop.cancelled() => false,
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

/// Runs a queue of single deliveries until the runner stops, and reports what it released.
pub(super) async fn run<DB, F, H>(q: Arc<Live<DB, F>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    if q.by_key {
        super::by_key::run(q, handler).await
    } else if F::ONE_CLAIM {
        super::ahead::run(q, handler).await
    } else {
        a_claim_per_worker(q, handler).await
    }
}

/// The forms that hold a connection per delivery: a loop per worker.
async fn a_claim_per_worker<DB, F, H>(q: Arc<Live<DB, F>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let busy = Arc::new(AtomicUsize::new(0));
    worker_loops(&q, "a worker loop", |index, mut pace| {
        let (q, handler, busy) = (Arc::clone(&q), Arc::clone(&handler), Arc::clone(&busy));
        async move {
            let mut released = 0;
            while !q.stopping() {
                // A claim in flight is awaited, and its row released if the runner stopped.
                let excluded = || q.quarantine.excluded();
                if super::rate::tokens(&q, 1).await.is_none() {
                    break;
                }
                let claimed = q.form.claim(&q.conns, 1, (index, q.workers), &excluded);
                let claimed = claimed.await.map(|mut rows| rows.pop());
                if !matches!(claimed, Ok(Some(_))) {
                    super::rate::unused(&q, 1, 0).await;
                }
                let (row, hold) = match claimed {
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
                Counters::add(&q.stats().claimed, 1);
                if q.stopping() {
                    released += release(&q, &row, hold).await;
                    break;
                }
                pace.wake_sibling();
                busy.fetch_add(1, Ordering::Relaxed);
                q.stats().in_work.fetch_add(1, Ordering::Relaxed);
                let entered = q.requests.enter(row.id);
                deliver(&q, &*handler, row, hold, None, entered).await;
                q.stats().in_work.fetch_sub(1, Ordering::Relaxed);
                busy.fetch_sub(1, Ordering::Relaxed);
                // Found one: look again at once.
                pace.claimed(&q, true, false).await;
            }
            released
        }
    })
    .await
}

/// Runs one loop per worker of `q` — `each(index, pace)`, its pace waking its siblings' — until
/// every loop ended, and reports the rows they released. A loop that ended abnormally (a panic
/// outside a handler's own catch) is logged as `what`; the others go on.
pub(super) async fn worker_loops<DB, F, L, Fut>(q: &Live<DB, F>, what: &str, each: L) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    L: Fn(usize, Pace) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let siblings = Arc::new(Notify::new());
    let mut workers = tokio::task::JoinSet::new();
    for index in 0..q.workers {
        workers.spawn(each(index, Pace::with_siblings(Arc::clone(&siblings))));
    }
    let mut released = 0;
    while let Some(worker) = workers.join_next().await {
        match worker {
            Ok(n) => released += n,
            Err(error) => tracing::error!(queue = %q.label, %error, "{what} ended abnormally"),
        }
    }
    q.report(released)
}

/// Releases a row claimed but not started (the runner stopped meanwhile), as it was before its
/// claim: 1 when it was.
pub(super) async fn release<DB: Backend, F: Form<DB>>(
    q: &Live<DB, F>,
    row: &ClaimedRow,
    hold: F::Hold,
) -> u64 {
    let released = q
        .form
        .release_unstarted(&q.conns, row.id, row.attempt, hold);
    if !released.await {
        return 0;
    }
    Counters::add(&q.stats().released, 1);
    q.note_unlock();
    1
}
