//! A started queue: its form, its connections, and what its tasks share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Pool;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::acks::Ack;
use super::observe::Observe;
use super::quarantine::Quarantine;
use super::requests::Requests;
use super::stats::Counters;
use crate::backend::{Backend, Clock};
use crate::backoff::Backoff;
use crate::config::QueueConfig;
use crate::delivery::{Outcome, Settle};
use crate::form::{Conns, Form};
use crate::table::Dialect;

/// What a runner's queues share: the pool, the signals to stop, the counters.
#[derive(Debug)]
pub(super) struct Shared<DB: Backend> {
    pub(super) pool: Pool<DB>,
    pub(super) poll_interval: Duration,
    /// Stop claiming; let deliveries in work finish.
    pub(super) stop: CancellationToken,
    /// Cancel the deliveries still in work (the shutdown timeout).
    pub(super) abort: CancellationToken,
    pub(super) stats: Arc<Counters>,
    /// The runner's clock: the server's time as this host reads it.
    pub(super) clock: Clock,
    /// How often the queues' depth gauges are read (`Runner::queue_gauges`).
    #[cfg(feature = "metrics")]
    pub(super) gauges: Option<Duration>,
}

impl<DB: Backend> Clone for Shared<DB> {
    fn clone(&self) -> Self {
        Shared {
            pool: self.pool.clone(),
            poll_interval: self.poll_interval,
            stop: self.stop.clone(),
            abort: self.abort.clone(),
            stats: Arc::clone(&self.stats),
            clock: self.clock.clone(),
            #[cfg(feature = "metrics")]
            gauges: self.gauges,
        }
    }
}

/// A started queue of form `F`: everything its claim loops and deliveries share.
#[derive(Debug)]
pub(super) struct Live<DB: Backend, F: Form<DB>> {
    pub(super) form: F,
    pub(super) conns: Conns<DB>,
    pub(super) label: Arc<str>,
    pub(super) group: Option<Arc<str>>,
    pub(super) workers: usize,
    /// The most rows a lease queue of single deliveries claims ahead of each worker.
    pub(super) ahead_per_worker: usize,
    pub(super) max_attempts: Option<u32>,
    /// How long a failed delivery's row waits before it returns (`Queue::backoff`): `None`
    /// where it returns at once — `Backoff::none`, or a table without a `retry_after` column.
    pub(super) backoff: Option<Backoff>,
    /// A transactional SQLite queue: its handlers' transactions hold the write lock, so a lease
    /// extension in flight when a handler ends is not awaited (it waits for that very lock; once
    /// the settlement committed, its token guard makes it change nothing).
    pub(super) abandon_extension: bool,
    /// Woken by enqueues through this crate in this process (and notifications).
    pub(super) wake: Arc<Notify>,
    /// Woken by this queue's own settlements that make a row claimable again (a retry, a FIFO
    /// group's head settled, a short `retry_after` come due): the claim loop looks at once, with
    /// no rechecks (the settlement has committed).
    pub(super) settled: Arc<Notify>,
    /// FIFO groups: any settlement lets the next row of its group go.
    fifo: bool,
    /// Per-key order inside this process: the workers are lanes of keys (`by_key`).
    pub(super) by_key: bool,
    /// Rows held back after a failure of their own.
    pub(super) quarantine: Quarantine,
    /// What the queue reports: the runner's counters, its metrics.
    pub(super) observe: Observe,
    pub(super) shared: Shared<DB>,
    /// Where plain deliveries send their acks and drops, grouped (see `acks`).
    pub(super) acks: Option<mpsc::UnboundedSender<Ack<F::Hold>>>,
    /// Deliveries of this queue cancelled at the shutdown timeout.
    pub(super) cancelled: AtomicU64,
    /// Of those, the ones whose row was released.
    pub(super) cancelled_released: AtomicU64,
    /// Of those, the ones whose release could not be confirmed in time.
    pub(super) cancelled_unreleased: AtomicU64,
    /// Keys released by deliveries that ended after the runner began to stop (advisory form).
    pub(super) unlocked_after_stop: AtomicU64,
    /// The deliveries in work, and the cancel requests read for them.
    pub(super) requests: Arc<Requests>,
    /// The queue's rate limit, if it has one (set once checked at start).
    pub(super) rate: Option<super::rate::Gate<DB>>,
}

impl<DB: Backend, F: Form<DB>> Live<DB, F> {
    /// A started queue of `config`, and the receiving end of its grouped acks, if it groups
    /// them: plain queues of the forms that settle many acks in one statement.
    pub(super) fn new(
        config: &QueueConfig,
        form: F,
        shared: Shared<DB>,
    ) -> (Self, Option<mpsc::UnboundedReceiver<Ack<F::Hold>>>) {
        let (acks, acks_rx) = if F::GROUPS_ACKS && !config.transactional {
            let (acks, acks_rx) = mpsc::unbounded_channel();
            (Some(acks), Some(acks_rx))
        } else {
            (None, None)
        };
        // Connections kept between uses: the claim's and the acks' in the lease form, every
        // worker's where each delivery holds one or runs its own claims and settlements (a
        // queue of batches: a claim loop per worker).
        let keep = if config.holds_connections() || config.batch.is_some() {
            config.workers + 1
        } else {
            2
        };
        let live = Live {
            form,
            conns: Conns::new(shared.pool.clone(), keep),
            label: config.label().into(),
            group: config.name.as_deref().map(Into::into),
            workers: config.workers,
            ahead_per_worker: config.ahead_per_worker(),
            max_attempts: config.max_attempts(),
            backoff: Some(config.backoff)
                .filter(|backoff| !backoff.is_none() && config.table.retry_after.is_some()),
            abandon_extension: config.transactional && DB::DIALECT == Dialect::Sqlite,
            wake: crate::enqueue::wakes(&config.table.name, config.name.as_deref()),
            settled: Arc::new(Notify::new()),
            fifo: config.per_group.is_some(),
            by_key: config.by_key.is_some(),
            quarantine: Quarantine::default(),
            observe: Observe::new(
                config.label(),
                config.workers,
                Arc::clone(&shared.stats),
                shared.clock.clone(),
            ),
            shared,
            acks,
            cancelled: AtomicU64::new(0),
            cancelled_released: AtomicU64::new(0),
            cancelled_unreleased: AtomicU64::new(0),
            unlocked_after_stop: AtomicU64::new(0),
            requests: Requests::new::<DB>(config),
            rate: None,
        };
        (live, acks_rx)
    }

    pub(super) fn stats(&self) -> &Counters {
        self.observe.stats()
    }

    pub(super) fn stopping(&self) -> bool {
        self.shared.stop.is_cancelled()
    }

    /// Wakes the claim loop when a settlement by `outcome` makes a row claimable again: at once
    /// for a retry (and any settlement of a FIFO queue, whose group's next row may go), when it
    /// is due for a `retry_after` shorter than the poll.
    pub(super) fn after_settlement(&self, outcome: Outcome) {
        match outcome.0 {
            Settle::Retry | Settle::Fail => self.settled.notify_one(),
            Settle::RetryAfter(delay) if delay.is_zero() => self.settled.notify_one(),
            Settle::RetryAfter(delay) if delay < self.shared.poll_interval => {
                let settled = Arc::clone(&self.settled);
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    settled.notify_one();
                });
            }
            _ if self.fifo => self.settled.notify_one(),
            _ => {}
        }
    }

    /// Counts a key released once the runner began to stop (the forms that hold keys).
    pub(super) fn note_unlock(&self) {
        if F::HOLDS_KEYS && self.stopping() {
            self.unlocked_after_stop.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the queue's tasks report when they end.
    pub(super) fn report(&self, released: u64) -> super::stats::QueueReport {
        super::stats::QueueReport {
            cancelled: self.cancelled.load(Ordering::Relaxed),
            released: released + self.cancelled_released.load(Ordering::Relaxed),
            unreleased: self.cancelled_unreleased.load(Ordering::Relaxed),
            keys_released: self.unlocked_after_stop.load(Ordering::Relaxed),
        }
    }
}
