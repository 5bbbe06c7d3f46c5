//! What a runner counts while it runs, and what its shutdown reports.

use std::sync::atomic::{AtomicU64, Ordering};

/// What [`Running::shutdown`](crate::Running::shutdown) found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Deliveries in work when `shutdown` was called (finished and settled, unless cancelled).
    pub in_work: u64,
    /// Handlers cancelled at the shutdown timeout.
    pub cancelled: u64,
    /// Rows released unsettled: claimed but not started, or cancelled.
    pub released: u64,
    /// Rows of cancelled handlers whose release could not be confirmed within the grace after
    /// the timeout (a release blocked by another session's lock, a database that stopped
    /// answering): each returns when its lease expires, or when the server ends its connection.
    pub unreleased: u64,
    /// Advisory keys released at shutdown: those of the deliveries in work when it began
    /// (settled or cancelled) and of the rows claimed but not started — every key the runner
    /// held.
    pub keys_released: u64,
}

/// What one queue's task reports when it ends.
#[derive(Debug, Default)]
pub(super) struct QueueReport {
    pub(super) cancelled: u64,
    pub(super) released: u64,
    pub(super) unreleased: u64,
    pub(super) keys_released: u64,
}

impl ShutdownReport {
    pub(super) fn add(&mut self, queue: &QueueReport) {
        self.cancelled += queue.cancelled;
        self.released += queue.released;
        self.unreleased += queue.unreleased;
        self.keys_released += queue.keys_released;
    }
}

/// Counts of what a runner has done, from [`Running::stats`](crate::Running::stats).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Rows claimed.
    pub claimed: u64,
    /// Deliveries settled by ack.
    pub acked: u64,
    /// Deliveries settled by drop.
    pub dropped: u64,
    /// Deliveries returned to the queue (retry and retry_after).
    pub retried: u64,
    /// Rows moved to their dead letter.
    pub dead_lettered: u64,
    /// Settlements that found their lease taken by a later claim.
    pub lease_lost: u64,
    /// Settlements that failed for another reason (the row is delivered again later).
    pub failed: u64,
    /// Deliveries that failed: their handler returned an `Err` or
    /// [`Outcome::fail`](crate::Outcome::fail), or panicked. Each row returns after the queue's
    /// [backoff](crate::Queue::backoff) (counted in `retried` too), or at its cap moves to its
    /// dead letter (counted in `dead_lettered`).
    pub failures: u64,
    /// Handlers that panicked (their deliveries failed: counted in `failures` too).
    pub panicked: u64,
    /// Rows released unsettled (shutdown, cancellation).
    pub released: u64,
    /// Ticks of this runner's schedules whose job this runner enqueued.
    pub ticks_fired: u64,
    /// Ticks this runner reached that another runner had fired (logged at info).
    pub ticks_fired_elsewhere: u64,
    /// Ticks this runner passed over: missed while no runner of their schedule ran and skipped
    /// by its policy, or reached by this runner only after a later tick (another runner may
    /// have fired those); at most 10,000 at a time.
    pub ticks_missed: u64,
    /// Statements run by the queues' rate limiters ([`Queue::rate_limit`](crate::Queue::rate_limit)):
    /// grants of tokens and give-backs of unused ones.
    pub rate_statements: u64,
}

/// The runner's counters, shared by its queues.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Deliveries in work now (a gauge).
    pub(super) in_work: AtomicU64,
    pub(super) claimed: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    pub(super) lease_lost: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) panicked: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) ticks_fired: AtomicU64,
    pub(super) ticks_fired_elsewhere: AtomicU64,
    pub(super) ticks_missed: AtomicU64,
    pub(super) rate_statements: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            claimed: get(&self.claimed),
            acked: get(&self.acked),
            dropped: get(&self.dropped),
            retried: get(&self.retried),
            dead_lettered: get(&self.dead_lettered),
            lease_lost: get(&self.lease_lost),
            failed: get(&self.failed),
            failures: get(&self.failures),
            panicked: get(&self.panicked),
            released: get(&self.released),
            ticks_fired: get(&self.ticks_fired),
            ticks_fired_elsewhere: get(&self.ticks_fired_elsewhere),
            ticks_missed: get(&self.ticks_missed),
            rate_statements: get(&self.rate_statements),
        }
    }
}
