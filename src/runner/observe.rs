//! What a queue reports as it works, in one place: the runner's [`Stats`](super::Stats) (shared
//! by its queues) and, with the `metrics` feature, the queue's own instruments in the `metrics`
//! facade (`instruments`). Each event of a delivery — started, handled, settled, lost, failed,
//! panicked — and each failed claim is one call here, which counts it in both, so the two never
//! disagree and no other file names a metric.

#[cfg(feature = "metrics")]
mod instruments;

use std::sync::Arc;

use super::stats::Counters;
use crate::backend::{ClaimedRow, Clock};
use crate::delivery::{Outcome, Settle};
#[cfg(feature = "metrics")]
pub(super) use instruments::gauges;
use instruments::{Instruments, Timer};

#[cfg(feature = "metrics")]
impl<DB: crate::backend::Backend> super::Runner<DB> {
    /// Reads each queue's depth every `every` into two gauges (`metrics` feature): the jobs
    /// claimable now (`sqlx_queue_ready_jobs`) and the age of the oldest of them
    /// (`sqlx_queue_oldest_ready_age_seconds`, where the table has a
    /// [`created_at`](crate::Table::created_at) column; 0 when nothing is ready). One statement
    /// per queue and reading, `SELECT COUNT(*), MIN(created_at) .. WHERE <claimable>`, which the
    /// claim's index serves: its cost grows with the ready rows it counts. Off by default.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(pool: sqlx::SqlitePool) {
    /// use std::time::Duration;
    /// let runner = sqlx_queue::Runner::new(pool).queue_gauges(Duration::from_secs(15));
    /// # let _ = runner;
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// `every` is zero.
    #[cfg(feature = "metrics")]
    #[track_caller]
    pub fn queue_gauges(mut self, every: std::time::Duration) -> Self {
        assert!(
            !every.is_zero(),
            "queue_gauges needs an interval of more than zero"
        );
        self.gauges = Some(every);
        self
    }
}

/// One queue's reporting: the runner's counters and the queue's instruments.
#[derive(Debug)]
pub(super) struct Observe {
    stats: Arc<Counters>,
    /// The runner's clock (this host's corrected by its offset to the server's), which the pickup
    /// latency and the oldest ready job's age are read against.
    clock: Clock,
    instruments: Instruments,
}

impl Observe {
    /// The reporting of queue `label` of `workers` workers: its instruments are registered now,
    /// with the recorder installed then (a global one, or a local one on this thread).
    pub(super) fn new(label: &str, workers: usize, stats: Arc<Counters>, clock: Clock) -> Self {
        Observe {
            stats,
            clock,
            instruments: Instruments::new(label, workers),
        }
    }

    /// The runner's counters, for what only they count (claimed, released, in work).
    pub(super) fn stats(&self) -> &Counters {
        &self.stats
    }

    /// A delivery of `row` starts, on its `attempt`; it is in work until the guard drops.
    pub(super) fn start(&self, row: &ClaimedRow, attempt: u32) -> Working<'_> {
        self.start_batch(std::iter::once((row, attempt)))
    }

    /// A delivery of `rows` (each with its attempt) starts on one worker: a batch, or one row.
    pub(super) fn start_batch<'r>(
        &self,
        rows: impl IntoIterator<Item = (&'r ClaimedRow, u32)>,
    ) -> Working<'_> {
        let mut started = 0;
        for (row, attempt) in rows {
            started += 1;
            // Enqueue to first start: a later attempt waited for its retry too.
            if let (1, Some(created_at)) = (attempt, row.created_at) {
                let waited = (self.clock.now() - created_at).to_std().unwrap_or_default();
                self.instruments.picked_up(waited);
            }
        }
        self.instruments.started(started);
        Working {
            observe: self,
            rows: started,
            worker: true,
        }
    }

    /// A timer for [`handled`](Self::handled) or [`settlement_took`](Self::settlement_took).
    pub(super) fn timer(&self) -> Timer {
        Timer::start()
    }

    /// A handler (or a batch handler) ran from `since` until now.
    pub(super) fn handled(&self, since: Timer) {
        self.instruments.handled(since);
    }

    /// A settlement (one delivery's, or a batch's) ran from `since` until now, whatever came of
    /// it.
    pub(super) fn settlement_took(&self, since: Timer) {
        self.instruments.settled_in(since);
    }

    /// A delivery was settled by `outcome`.
    pub(super) fn settled(&self, outcome: Outcome) {
        let stats = &self.stats;
        let counter = match outcome.0 {
            Settle::Ack => &stats.acked,
            Settle::Drop | Settle::Undecodable => &stats.dropped,
            Settle::Retry | Settle::RetryAfter(_) | Settle::Fail => &stats.retried,
            Settle::DeadLetter => &stats.dead_lettered,
        };
        Counters::add(counter, 1);
        self.instruments.settled(outcome);
    }

    /// A settlement found the lease taken by a later claim.
    pub(super) fn lease_lost(&self) {
        Counters::add(&self.stats.lease_lost, 1);
        self.instruments.lease_lost();
    }

    /// `n` deliveries could not be settled (or their row read, or their transaction ended).
    pub(super) fn failed(&self, n: u64) {
        Counters::add(&self.stats.failed, n);
        self.instruments.settlement_failed(n);
    }

    /// A delivery failed (its handler returned an error or `Outcome::fail`, or panicked): it
    /// returns after the queue's backoff.
    pub(super) fn failed_delivery(&self) {
        Counters::add(&self.stats.failures, 1);
        self.instruments.failed_delivery();
    }

    /// A handler (or a batch handler) panicked.
    pub(super) fn panicked(&self) {
        Counters::add(&self.stats.panicked, 1);
        self.instruments.panicked();
    }

    /// A claim failed.
    pub(super) fn claim_failed(&self) {
        self.instruments.claim_failed();
    }
}

/// A delivery (or a batch) in work, on a worker: both are counted back when it drops, the
/// worker earlier where it is given to the next row before the delivery settles
/// ([`Working::worker_free`]).
#[derive(Debug)]
pub(super) struct Working<'a> {
    observe: &'a Observe,
    rows: u64,
    worker: bool,
}

impl Working<'_> {
    /// The delivery gave its worker to the next row (its ack waits in the queue's grouped acks).
    pub(super) fn worker_free(&mut self) {
        if std::mem::take(&mut self.worker) {
            self.observe.instruments.worker_free();
        }
    }
}

impl Drop for Working<'_> {
    fn drop(&mut self) {
        self.worker_free();
        self.observe.instruments.finished(self.rows);
    }
}

/// Without the `metrics` feature: instruments that record nothing, and cost nothing.
#[cfg(not(feature = "metrics"))]
mod instruments {
    use std::time::Duration;

    use crate::delivery::Outcome;

    #[derive(Debug)]
    pub(super) struct Instruments;

    /// A timer that reads no clock.
    #[derive(Debug, Clone, Copy)]
    pub(in crate::runner) struct Timer;

    impl Timer {
        pub(super) fn start() -> Self {
            Timer
        }
    }

    impl Instruments {
        pub(super) fn new(_: &str, _: usize) -> Self {
            Instruments
        }
        pub(super) fn started(&self, _: u64) {}
        pub(super) fn picked_up(&self, _: Duration) {}
        pub(super) fn handled(&self, _: Timer) {}
        pub(super) fn settled_in(&self, _: Timer) {}
        pub(super) fn settled(&self, _: Outcome) {}
        pub(super) fn lease_lost(&self) {}
        pub(super) fn settlement_failed(&self, _: u64) {}
        pub(super) fn panicked(&self) {}
        pub(super) fn failed_delivery(&self) {}
        pub(super) fn claim_failed(&self) {}
        pub(super) fn worker_free(&self) {}
        pub(super) fn finished(&self, _: u64) {}
    }
}
