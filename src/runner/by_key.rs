//! Per-key order inside one process (`Queue::by_key`): the queue's workers are lanes,
//! and each claimed row goes to the lane its key hashes to, where it waits for the rows before
//! it. A lane runs one delivery at a time, in the order its rows came, so the rows of one key
//! start in claim order and never two at once; other lanes go on meanwhile.
//!
//! One loop claims for every lane, so claims take turns and rows reach their lanes in claim
//! order. It claims while a lane is idle, up to [`BY_KEY_IN_HAND_PER_WORKER`] rows per lane in
//! hand: rows of a slow key wait in its lane without holding back the claims for the others,
//! until the queue's rows in hand reach that bound. The forms that hold a connection per row
//! (row lock, transactional advisory) keep at most a row per worker in hand (their
//! connections); a plain advisory claim's session stays open while one of its rows waits. A
//! lease that a waiting row held for half its duration is given back, with the rows after it in
//! its lane (so the key's order stays), rather than extended in the lane. Rows still waiting
//! when the runner stops are released unstarted. (A rate limit is refused at start: a row
//! waiting in its lane would start later than its token.)

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash as _, Hasher as _};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::ahead::Seat;
use super::claim::{Pace, release};
use super::deliver::deliver;
use super::queue::Live;
use super::requests::Entered;
use super::stats::{Counters, QueueReport};
use crate::backend::{Backend, ClaimedRow};
use crate::config::{BY_KEY_CLAIM_PER_WORKER, BY_KEY_IN_HAND_PER_WORKER};
use crate::form::Form;
use crate::form::lease::MAX_CLAIM;
use crate::handler::CallOne;

/// A row waiting in its lane: entered in the queue's deliveries in work at its claim, so that a
/// cancel request for it is seen (its handler is then never called).
type Waiting<H> = (ClaimedRow, H, Entered);

/// One worker: the rows routed to it, in claim order.
#[derive(Debug)]
struct Lane<H> {
    rows: Mutex<VecDeque<Waiting<H>>>,
    /// Rows in hand: waiting here, or in work.
    load: AtomicUsize,
    /// A row was added.
    added: Notify,
}

impl<H> Lane<H> {
    fn rows(&self) -> MutexGuard<'_, VecDeque<Waiting<H>>> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The lanes of a queue, and what its claim loop waits for.
#[derive(Debug)]
struct Lanes<H> {
    lanes: Vec<Lane<H>>,
    /// A row in hand ended (settled, released or given back).
    ended: Arc<Notify>,
    /// Rows were routed (the give-back of stale leases looks again).
    routed: Notify,
    /// Held by a claim until its rows are routed, and by a give-back until its rows are all
    /// released: a claim never sees part of a give-back, which would take the later rows of a
    /// key before its earlier ones.
    claiming: tokio::sync::Mutex<()>,
    released: AtomicU64,
}

impl<H> Lanes<H> {
    fn new(n: usize) -> Self {
        Lanes {
            lanes: (0..n)
                .map(|_| Lane {
                    rows: Mutex::default(),
                    load: AtomicUsize::new(0),
                    added: Notify::new(),
                })
                .collect(),
            ended: Arc::new(Notify::new()),
            routed: Notify::new(),
            claiming: tokio::sync::Mutex::new(()),
            released: AtomicU64::new(0),
        }
    }

    fn in_hand(&self) -> usize {
        self.lanes
            .iter()
            .map(|l| l.load.load(Ordering::Acquire))
            .sum()
    }

    fn idle(&self) -> usize {
        let idle = |l: &&Lane<H>| l.load.load(Ordering::Acquire) == 0;
        self.lanes.iter().filter(idle).count()
    }

    /// The lane of a row's key: a NULL key (or one that did not decode) is a key of its own.
    fn of(&self, key: Option<&[u8]>) -> &Lane<H> {
        let mut hasher = DefaultHasher::new();
        key.hash(&mut hasher);
        let n = self.lanes.len() as u64;
        let lane = usize::try_from(hasher.finish() % n).expect("below the lanes' count");
        &self.lanes[lane]
    }

    fn route(&self, row: ClaimedRow, hold: H, entered: Entered) {
        let lane = self.of(row.key.as_deref());
        lane.load.fetch_add(1, Ordering::AcqRel);
        lane.rows().push_back((row, hold, entered));
        lane.added.notify_one();
    }

    fn end(&self, lane: &Lane<H>) {
        lane.load.fetch_sub(1, Ordering::AcqRel);
        self.ended.notify_one();
    }
}

/// Runs a by-key queue of single deliveries until the runner stops; what it released.
pub(super) async fn run<DB, F, H>(q: Arc<Live<DB, F>>, handler: Arc<H>) -> QueueReport
where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let lanes = Arc::new(Lanes::<F::Hold>::new(q.workers));
    // The forms that hold a connection per row keep one row in hand per worker.
    let (most, per_claim) = match F::ONE_CLAIM {
        true => (
            q.workers * BY_KEY_IN_HAND_PER_WORKER,
            q.workers * BY_KEY_CLAIM_PER_WORKER,
        ),
        false => (q.workers, 1),
    };
    let tasks = TaskTracker::new();
    for lane in 0..q.workers {
        let (q, handler, lanes) = (Arc::clone(&q), Arc::clone(&handler), Arc::clone(&lanes));
        tasks.spawn(work(q, handler, lanes, lane, tasks.clone()));
    }
    tasks.spawn(give_back_stale(Arc::clone(&q), Arc::clone(&lanes)));
    let mut pace = Pace::default();
    loop {
        let room = most.saturating_sub(lanes.in_hand());
        let want = room.min(per_claim).min(MAX_CLAIM);
        // Claim for an idle lane only: rows for busy ones would wait, and the claim does not
        // know which lanes its rows go to before it takes them.
        if want == 0 || lanes.idle() == 0 {
            tokio::select! {
                biased;
                () = q.shared.stop.cancelled() => break,
                () = lanes.ended.notified() => continue,
            }
        }
        let claiming = lanes.claiming.lock().await;
        let excluded = || q.quarantine.excluded();
        let claimed = match q
            .form
            .claim(&q.conns, want, (0, q.workers), &excluded)
            .await
        {
            Ok(claimed) => claimed,
            Err(failed) => {
                drop(claiming);
                if pace.failed(&q, failed).await {
                    continue;
                }
                break;
            }
        };
        let got = claimed.len();
        Counters::add(&q.stats().claimed, got as u64);
        if q.stopping() {
            for (row, hold) in claimed {
                let released = release(&q, &row, hold).await;
                lanes.released.fetch_add(released, Ordering::Relaxed);
            }
            break;
        }
        for (row, hold) in claimed {
            let entered = q.requests.enter(row.id);
            lanes.route(row, hold, entered);
        }
        drop(claiming);
        lanes.routed.notify_one();
        let idle = lanes.in_hand() == 0;
        if !pace.claimed(&q, got == want, idle).await {
            break;
        }
    }
    tasks.close();
    tasks.wait().await;
    // Rows routed as the lanes stopped.
    for lane in &lanes.lanes {
        let left: Vec<_> = lane.rows().drain(..).collect();
        for (row, hold, _) in left {
            let released = release(&q, &row, hold).await;
            lanes.released.fetch_add(released, Ordering::Relaxed);
        }
    }
    q.report(lanes.released.load(Ordering::Relaxed))
}

/// One lane: its rows one at a time, in the order they came, until the runner stops (the rows
/// still waiting then go back unstarted). The lane's worker goes to its next row once the
/// handler is done: an ack grouped with others' commits meanwhile, as in a queue without keys.
async fn work<DB, F, H>(
    q: Arc<Live<DB, F>>,
    handler: Arc<H>,
    lanes: Arc<Lanes<F::Hold>>,
    index: usize,
    tasks: TaskTracker,
) where
    DB: Backend,
    F: Form<DB>,
    H: CallOne<DB>,
{
    let lane = &lanes.lanes[index];
    let worker = Arc::new(Semaphore::new(1));
    loop {
        let permit = tokio::select! {
            biased;
            () = q.shared.stop.cancelled() => return,
            permit = Arc::clone(&worker).acquire_owned() => permit.expect("never closed"),
        };
        let next = lane.rows().pop_front();
        let Some((row, hold, entered)) = next else {
            drop(permit);
            tokio::select! {
                biased;
                () = q.shared.stop.cancelled() => return,
                () = lane.added.notified() => continue,
            }
        };
        if q.stopping() {
            let released = release(&q, &row, hold).await;
            lanes.released.fetch_add(released, Ordering::Relaxed);
            lanes.end(lane);
            return;
        }
        let seat = Seat::of_lane(permit, Arc::clone(&lanes.ended));
        let (q, handler, lanes) = (Arc::clone(&q), Arc::clone(&handler), Arc::clone(&lanes));
        tasks.spawn(async move {
            q.stats().in_work.fetch_add(1, Ordering::Relaxed);
            deliver(&q, &*handler, row, hold, Some(seat), entered).await;
            q.stats().in_work.fetch_sub(1, Ordering::Relaxed);
            lanes.end(&lanes.lanes[index]);
        });
    }
}

/// Gives back the rows that waited in their lane half their lease, each with the rows after it
/// in its lane, their attempts uncounted, until the runner stops: the lease would expire before
/// the row starts, and a claim (this runner's too) would take it again, out of its key's order.
/// No claim runs until every row given back is released. (A hold without a lease never goes
/// stale.)
async fn give_back_stale<DB, F>(q: Arc<Live<DB, F>>, lanes: Arc<Lanes<F::Hold>>)
where
    DB: Backend,
    F: Form<DB>,
{
    let stale_at = |hold: &F::Hold| {
        q.form
            .extend_every(hold)
            .map(|(every, since)| since + every)
    };
    loop {
        let first = lanes
            .lanes
            .iter()
            .filter_map(|lane| lane.rows().iter().filter_map(|(_, h, _)| stale_at(h)).min())
            .min();
        let wait = async {
            match first {
                Some(at) => tokio::time::sleep_until(at).await,
                None => lanes.routed.notified().await,
            }
        };
        tokio::select! {
            biased;
            () = q.shared.stop.cancelled() => return,
            () = wait => {}
        }
        let now = Instant::now();
        let _claiming = lanes.claiming.lock().await;
        for lane in &lanes.lanes {
            let stale: Vec<_> = {
                let mut rows = lane.rows();
                match rows
                    .iter()
                    .position(|(_, hold, _)| stale_at(hold).is_some_and(|at| at <= now))
                {
                    Some(from) => rows.drain(from..).collect(),
                    None => continue,
                }
            };
            for (row, hold, _) in stale {
                tracing::debug!(
                    queue = %q.label,
                    id = row.id,
                    "a row waited half its lease for its key's worker: given back"
                );
                release(&q, &row, hold).await;
                lanes.end(lane);
            }
        }
    }
}
