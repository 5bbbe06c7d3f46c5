//! The claim loop of the forms whose one claim serves every worker (the lease form, and the
//! advisory form's plain deliveries): one claim fills every free worker, and claims rows ahead
//! of them while handlers are quick, so that a worker that finishes takes its next row at once
//! instead of waiting for a claim's round trip.
//!
//! A queue keeps in work or waiting for a worker at most its workers and three rows per worker
//! more (none on a table with priorities: `QueueConfig::ahead_per_worker`), and as many as its
//! workers again waiting for their grouped ack (the advisory form: three times as many,
//! `Form::ACKS_IN_HAND`, so that a claim finds a place for every free worker while the acks of
//! earlier claims commit). How many it claims ahead follows how long a worker stays busy with
//! a delivery: the rows ahead are what the workers finish within [`AHEAD_FOR`], so a row waits
//! about that long for its worker however slow the handlers are (a queue of handlers slower
//! than that claims none ahead). Rows start in claim order. A lease that a row waited past the
//! half of is renewed before its handler starts, and an advisory key whose session has not
//! answered lately is confirmed ([`keeper::confirm`](super::keeper::confirm)); a row whose
//! lease or key was lost meanwhile is not delivered, nor one whose job a notification said
//! cancelled while it waited (PostgreSQL, a queue listening on its table's channel): that one
//! is removed at once, its handler never called. Rows still waiting when the runner stops are
//! released unstarted, their attempt uncounted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::claim::{Pace, release};
use super::deliver::{deliver, drop_unstarted};
use super::queue::Live;
use super::requests::Entered;
use super::stats::{Counters, QueueReport};
use crate::backend::{Backend, ClaimedRow};
use crate::form::Form;
use crate::form::lease::MAX_CLAIM;
use crate::handler::CallOne;

/// How long the rows claimed ahead keep the workers busy, at most (see the module's docs).
const AHEAD_FOR: Duration = Duration::from_millis(10);

/// How long a worker stays busy with one delivery: a moving mean, over about the last 8.
#[derive(Debug, Default)]
struct Busy {
    /// Nanoseconds; 0 before the first delivery (rows are then claimed ahead).
    mean: AtomicU64,
}

impl Busy {
    fn record(&self, busy: Duration) {
        let busy = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX).max(1);
        let mean = self.mean.load(Ordering::Relaxed);
        let mean = match mean {
            0 => busy,
            _ => mean - mean / 8 + busy / 8,
        };
        self.mean.store(mean.max(1), Ordering::Relaxed);
    }

    /// How many rows `workers` finish within [`AHEAD_FOR`], at most `per_worker` each.
    fn ahead(&self, workers: usize, per_worker: usize) -> usize {
        let most = workers * per_worker;
        let mean = u128::from(self.mean.load(Ordering::Relaxed));
        if mean == 0 {
            return most;
        }
        let rows = workers as u128 * AHEAD_FOR.as_nanos() / mean;
        usize::try_from(rows).unwrap_or(usize::MAX).min(most)
    }
}

/// A delivery's place: one of the rows in hand until it is settled, and, once it starts, a
/// worker, which a delivery whose ack goes to the grouped acks gives back as soon as its handler
/// is done ([`Seat::free_worker`]).
#[derive(Debug)]
pub(super) struct Seat {
    /// Its place in hand (none where the queue counts its rows in hand otherwise: by key).
    _in_hand: Option<OwnedSemaphorePermit>,
    worker: Option<OwnedSemaphorePermit>,
    started: Instant,
    /// Where its worker's busy time is recorded (none by key, which claims nothing ahead).
    busy: Option<Arc<Busy>>,
    /// The claim loop, waiting for rows in hand to end.
    ended: Arc<Notify>,
}

impl Seat {
    /// The seat of a by-key lane's delivery: `worker` is the lane's, given to the lane's next
    /// row once the handler is done; `ended` wakes the claim loop.
    pub(super) fn of_lane(worker: OwnedSemaphorePermit, ended: Arc<Notify>) -> Self {
        Seat {
            _in_hand: None,
            worker: Some(worker),
            started: Instant::now(),
            busy: None,
            ended,
        }
    }

    /// Gives the worker to the next row, the delivery still in hand.
    pub(super) fn free_worker(&mut self) {
        if self.worker.take().is_some() {
            if let Some(busy) = &self.busy {
                busy.record(self.started.elapsed());
            }
            self.ended.notify_one();
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.free_worker();
        // Its place in hand is free now too.
        self.ended.notify_one();
    }
}

/// A row claimed that waits for a worker: its hold, its place in hand, and its entry in the
/// queue's deliveries in work (a cancellation notified meanwhile cancels it).
type Ahead<H> = (ClaimedRow, H, OwnedSemaphorePermit, Entered);

/// Rows claimed that wait for a worker, in claim order.
type Waiting<H> = Mutex<VecDeque<Ahead<H>>>;

fn lock<H>(waiting: &Waiting<H>) -> MutexGuard<'_, VecDeque<Ahead<H>>> {
    waiting.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs a queue of single deliveries whose one claim serves every worker until the runner
/// stops; what it released.
pub(super) async fn run<DB, F, H>(q: Arc<Live<DB, F>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    // In work or waiting for a worker: the workers and the rows ahead; and waiting for their
    // grouped ack: as many as the workers again (the advisory form: more, `ACKS_IN_HAND`).
    let most = q.workers * (1 + F::ACKS_IN_HAND + q.ahead_per_worker);
    let in_hand = Arc::new(Semaphore::new(most));
    let workers = Arc::new(Semaphore::new(q.workers));
    let busy = Arc::new(Busy::default());
    let ended = Arc::new(Notify::new());
    let released = Arc::new(AtomicU64::new(0));
    // Rows claimed that wait for a worker, in claim order, each with its place in hand.
    let waiting: Arc<Waiting<F::Hold>> = Arc::default();
    let deliveries = TaskTracker::new();
    let mut pace = Pace::default();
    // Rows that waited half their lease for a worker go back.
    let added = Arc::new(Notify::new());
    deliveries.spawn(give_back_stale(
        Arc::clone(&q),
        Arc::clone(&waiting),
        Arc::clone(&busy),
        Arc::clone(&added),
    ));

    loop {
        // Wait for a row in hand to end, then take every other place free: one claim fills them.
        let mut permits = tokio::select! {
            biased;
            () = q.shared.stop.cancelled() => break,
            permit = Arc::clone(&in_hand).acquire_many_owned(1) => {
                permit.expect("the semaphore is never closed")
            }
        };
        // The deliveries that ended with this one give their places back in the same instant:
        // let them, so that one claim takes them all.
        tokio::task::yield_now().await;
        let free = u32::try_from(in_hand.available_permits()).unwrap_or(0);
        if let Ok(more) = Arc::clone(&in_hand).try_acquire_many_owned(free) {
            permits.merge(more);
        }
        // In work or waiting after the claim: the workers, and the rows they finish soon.
        // Unless a worker waits for a row, a claim waits until it can take half of those:
        // claims of many rows commit once for many.
        let (free, waiting_now) = (workers.available_permits(), lock(&waiting).len());
        let active = q.workers - free + waiting_now;
        let target = q.workers + busy.ahead(q.workers, q.ahead_per_worker);
        let want = target
            .saturating_sub(active)
            .min(permits.num_permits())
            .min(MAX_CLAIM);
        // A free worker with no row waiting is never kept waiting for others to free: the
        // deliveries still in work may be slow whatever the mean says (a wait for half the
        // workers of quick queues starved a free worker behind handlers that did not end).
        let starved = free > 0 && waiting_now == 0;
        if want == 0 || (!starved && want < target.div_ceil(2)) {
            drop(permits);
            tokio::select! {
                biased;
                () = q.shared.stop.cancelled() => break,
                () = ended.notified() => continue,
            }
        }
        // A rate limit grants up to `want` tokens, waiting while it grants none.
        let Some(want) = super::rate::tokens(&q, want).await else {
            break;
        };
        if permits.num_permits() > want {
            drop(permits.split(permits.num_permits() - want));
        }

        // A claim in flight is never cancelled: its rows would stay claimed until their lease
        // expired. It is awaited, and its rows released if the runner stopped meanwhile.
        let claimed = match q
            .form
            .claim(&q.conns, want, (0, q.workers), &|| q.quarantine.excluded())
            .await
        {
            Ok(claimed) => claimed,
            Err(failed) => {
                drop(permits);
                super::rate::unused(&q, want, 0).await;
                if pace.failed(&q, failed).await {
                    continue;
                }
                break;
            }
        };
        let got = claimed.len();
        Counters::add(&q.stats().claimed, got as u64);
        super::rate::unused(&q, want, got).await;

        if q.stopping() {
            for (row, hold) in claimed {
                released.fetch_add(release(&q, &row, hold).await, Ordering::Relaxed);
            }
            break;
        }
        // Rows start in claim order: each task takes the first row waiting once it has a
        // worker (tasks get their workers in any order).
        lock(&waiting).extend(claimed.into_iter().map(|(row, hold)| {
            let entered = q.requests.enter(row.id);
            let in_hand = permits.split(1).expect("a permit per row");
            (row, hold, in_hand, entered)
        }));
        added.notify_one();
        for _ in 0..got {
            let (q, handler, workers) =
                (Arc::clone(&q), Arc::clone(&handler), Arc::clone(&workers));
            let (busy, ended, released) =
                (Arc::clone(&busy), Arc::clone(&ended), Arc::clone(&released));
            let waiting = Arc::clone(&waiting);
            deliveries.spawn(async move {
                let worker = tokio::select! {
                    biased;
                    worker = workers.acquire_owned() => Some(worker.expect("never closed")),
                    () = q.shared.stop.cancelled() => None,
                };
                let Some((row, hold, in_hand, entered)) = lock(&waiting).pop_front() else {
                    return;
                };
                let (Some(worker), false) = (worker, q.stopping()) else {
                    released.fetch_add(release(&q, &row, hold).await, Ordering::Relaxed);
                    return;
                };
                let seat = Seat {
                    _in_hand: Some(in_hand),
                    worker: Some(worker),
                    started: Instant::now(),
                    busy: Some(busy),
                    ended,
                };
                q.stats().in_work.fetch_add(1, Ordering::Relaxed);
                deliver(&q, &*handler, row, hold, Some(seat), entered).await;
                q.stats().in_work.fetch_sub(1, Ordering::Relaxed);
            });
        }
        drop(permits);
        let idle = in_hand.available_permits() == most;
        if !pace.claimed(&q, got == want, idle).await {
            break;
        }
    }

    deliveries.close();
    deliveries.wait().await;
    q.report(released.load(Ordering::Relaxed))
}

/// Gives back the rows that waited too long for a worker ([`Form::given_back_at`]: half their
/// lease; an advisory key, [`GIVEN_BACK_AFTER`](crate::form::advisory::grouped::GIVEN_BACK_AFTER)),
/// their attempt uncounted, until the runner stops: a lease would expire before they start, and
/// another runner's claim would count their attempt a second time; a key would keep its row
/// from the workers of other runners. Workers that slow claim no rows ahead: the wait counts as
/// a worker's busy time. Rows whose job a notification cancelled meanwhile never start: they
/// are removed at once.
async fn give_back_stale<DB, F>(
    q: Arc<Live<DB, F>>,
    waiting: Arc<Waiting<F::Hold>>,
    busy: Arc<Busy>,
    added: Arc<Notify>,
) where
    DB: Backend,
    F: Form<DB>,
{
    let stale_at = |hold: &F::Hold| q.form.given_back_at(hold);
    loop {
        let first = lock(&waiting)
            .iter()
            .filter_map(|(_, hold, _, _)| stale_at(hold))
            .map(|(at, _)| at)
            .min();
        let changed = q.requests.changed.notified();
        match first {
            None => tokio::select! {
                biased;
                () = q.shared.stop.cancelled() => return,
                () = added.notified() => continue,
                () = changed => {}
            },
            Some(at) => tokio::select! {
                biased;
                () = q.shared.stop.cancelled() => return,
                () = tokio::time::sleep_until(at) => {}
                () = changed => {}
            },
        }
        let now = Instant::now();
        let (cancelled, stale): (VecDeque<_>, VecDeque<_>) = {
            let mut rows = lock(&waiting);
            let (out, kept) = rows.drain(..).partition(|(_, hold, _, entered)| {
                entered.entry.requested() || stale_at(hold).is_some_and(|(at, _)| at <= now)
            });
            *rows = kept;
            out.into_iter()
                .partition(|(_, _, _, entered)| entered.entry.requested())
        };
        for (row, hold, in_hand, entered) in cancelled {
            drop_unstarted(&q, row.id, hold, entered).await;
            drop(in_hand);
        }
        for (row, hold, in_hand, entered) in stale {
            if let Some((_, every)) = stale_at(&hold) {
                busy.record(every);
            }
            tracing::debug!(
                queue = %q.label,
                id = row.id,
                "a row claimed ahead waited too long for a worker: given back"
            );
            release(&q, &row, hold).await;
            drop((in_hand, entered));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_handlers_claim_a_row_ahead_per_worker_and_slow_ones_none() {
        let busy = Busy::default();
        assert_eq!(busy.ahead(8, 3), 24, "before any delivery");
        for _ in 0..64 {
            busy.record(Duration::from_micros(100));
        }
        assert_eq!(busy.ahead(8, 3), 24);
        for _ in 0..64 {
            busy.record(Duration::from_millis(40));
        }
        assert_eq!(
            busy.ahead(8, 3),
            2,
            "8 workers finish 2 rows of 40 ms within 10 ms"
        );
        for _ in 0..64 {
            busy.record(Duration::from_secs(1));
        }
        assert_eq!(busy.ahead(8, 3), 0);
    }
}
