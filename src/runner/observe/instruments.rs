//! The `metrics` feature: each queue's instruments in the `metrics` facade, registered once when
//! the queue starts (with the recorder installed then) and updated through their handles, so a
//! delivery looks up no name. Names and labels follow Prometheus' conventions (`_total` counters,
//! `_seconds` durations, one `queue` label: the queue's group value, else its table's name); the
//! guide lists them (`docs/guide/observability.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics::{Counter, Gauge, Histogram, Unit};
use tokio_util::sync::CancellationToken;

use crate::delivery::{Outcome, Settle};
use crate::form::Readiness;

const STARTED: &str = "sqlx_queue_deliveries_started_total";
const SETTLED: &str = "sqlx_queue_deliveries_total";
const LEASE_LOST: &str = "sqlx_queue_lease_lost_total";
const SETTLEMENT_ERRORS: &str = "sqlx_queue_settlement_errors_total";
const PANICS: &str = "sqlx_queue_panics_total";
const FAILURES: &str = "sqlx_queue_failures_total";
const CLAIM_ERRORS: &str = "sqlx_queue_claim_errors_total";
const HANDLER: &str = "sqlx_queue_handler_duration_seconds";
const SETTLEMENT: &str = "sqlx_queue_settlement_duration_seconds";
const PICKUP: &str = "sqlx_queue_pickup_latency_seconds";
const IN_WORK: &str = "sqlx_queue_deliveries_in_work";
const FREE: &str = "sqlx_queue_workers_free";
const READY: &str = "sqlx_queue_ready_jobs";
const AGE: &str = "sqlx_queue_oldest_ready_age_seconds";

/// A queue's instruments.
#[derive(Debug)]
pub(super) struct Instruments {
    started: Counter,
    /// Settled by ack, drop, retry (and retry_after), dead letter.
    settled: [Counter; 4],
    lease_lost: Counter,
    settlement_errors: Counter,
    panics: Counter,
    failures: Counter,
    claim_errors: Counter,
    handler: Histogram,
    settlement: Histogram,
    pickup: Histogram,
    in_work: Gauge,
    free: Gauge,
}

/// When something began: read again when it ends.
#[derive(Debug, Clone, Copy)]
pub(in crate::runner) struct Timer(Instant);

impl Timer {
    pub(super) fn start() -> Self {
        Timer(Instant::now())
    }
}

impl Instruments {
    pub(super) fn new(label: &str, workers: usize) -> Self {
        describe();
        let queue = label.to_owned();
        let settled = ["ack", "drop", "retry", "dead_letter"].map(
            |outcome| metrics::counter!(SETTLED, "queue" => queue.clone(), "outcome" => outcome),
        );
        let instruments = Instruments {
            started: metrics::counter!(STARTED, "queue" => queue.clone()),
            settled,
            lease_lost: metrics::counter!(LEASE_LOST, "queue" => queue.clone()),
            settlement_errors: metrics::counter!(SETTLEMENT_ERRORS, "queue" => queue.clone()),
            panics: metrics::counter!(PANICS, "queue" => queue.clone()),
            failures: metrics::counter!(FAILURES, "queue" => queue.clone()),
            claim_errors: metrics::counter!(CLAIM_ERRORS, "queue" => queue.clone()),
            handler: metrics::histogram!(HANDLER, "queue" => queue.clone()),
            settlement: metrics::histogram!(SETTLEMENT, "queue" => queue.clone()),
            pickup: metrics::histogram!(PICKUP, "queue" => queue.clone()),
            in_work: metrics::gauge!(IN_WORK, "queue" => queue.clone()),
            free: metrics::gauge!(FREE, "queue" => queue),
        };
        instruments.in_work.set(0.0);
        instruments.free.set(workers as f64);
        instruments
    }

    pub(super) fn started(&self, rows: u64) {
        self.started.increment(rows);
        self.in_work.increment(rows as f64);
        self.free.decrement(1.0);
    }

    pub(super) fn picked_up(&self, waited: Duration) {
        self.pickup.record(waited);
    }

    pub(super) fn handled(&self, since: Timer) {
        self.handler.record(since.0.elapsed());
    }

    pub(super) fn settled_in(&self, since: Timer) {
        self.settlement.record(since.0.elapsed());
    }

    pub(super) fn settled(&self, outcome: Outcome) {
        let i = match outcome.0 {
            Settle::Ack => 0,
            Settle::Drop | Settle::Undecodable => 1,
            Settle::Retry | Settle::RetryAfter(_) | Settle::Fail => 2,
            Settle::DeadLetter => 3,
        };
        self.settled[i].increment(1);
    }

    pub(super) fn lease_lost(&self) {
        self.lease_lost.increment(1);
    }

    pub(super) fn settlement_failed(&self, n: u64) {
        self.settlement_errors.increment(n);
    }

    pub(super) fn panicked(&self) {
        self.panics.increment(1);
    }

    pub(super) fn failed_delivery(&self) {
        self.failures.increment(1);
    }

    pub(super) fn claim_failed(&self) {
        self.claim_errors.increment(1);
    }

    pub(super) fn worker_free(&self) {
        self.free.increment(1.0);
    }

    pub(super) fn finished(&self, rows: u64) {
        self.in_work.decrement(rows as f64);
    }
}

/// Describes every instrument to the recorder (units, and the help text Prometheus shows).
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        STARTED,
        Unit::Count,
        "Deliveries started (rows handed to a handler, or settled before one by the policy)."
    );
    describe_counter!(
        SETTLED,
        Unit::Count,
        "Deliveries settled, by outcome: ack, drop, retry (and retry_after), dead_letter."
    );
    describe_counter!(
        LEASE_LOST,
        Unit::Count,
        "Settlements that found their lease taken by a later claim."
    );
    describe_counter!(
        SETTLEMENT_ERRORS,
        Unit::Count,
        "Deliveries whose settlement failed (the row is delivered again later)."
    );
    describe_counter!(
        PANICS,
        Unit::Count,
        "Handlers that panicked (their deliveries failed)."
    );
    describe_counter!(
        FAILURES,
        Unit::Count,
        "Deliveries that failed (an error, Outcome::fail or a panic): retried after the queue's backoff, or dead-lettered at the cap."
    );
    describe_counter!(CLAIM_ERRORS, Unit::Count, "Claims that failed.");
    describe_histogram!(
        HANDLER,
        Unit::Seconds,
        "How long a handler (or a batch handler) ran."
    );
    describe_histogram!(
        SETTLEMENT,
        Unit::Seconds,
        "How long a settlement (a delivery's, or a batch's) took."
    );
    describe_histogram!(
        PICKUP,
        Unit::Seconds,
        "From a job's created_at to its first delivery's start, on the server's clock."
    );
    describe_gauge!(
        IN_WORK,
        Unit::Count,
        "Deliveries in work (started, not settled yet)."
    );
    describe_gauge!(FREE, Unit::Count, "Workers free for the next claim.");
    describe_gauge!(
        READY,
        Unit::Count,
        "Jobs claimable now (Runner::queue_gauges)."
    );
    describe_gauge!(
        AGE,
        Unit::Seconds,
        "Age of the oldest claimable job, from its created_at (Runner::queue_gauges)."
    );
}

/// What sets queue `label`'s depth and oldest-age gauges from `readiness` every `every`, until
/// `stop`: one statement per reading; a reading that fails is logged and the gauges keep their
/// values. The gauges are registered now, with the recorder installed now; the future reads.
pub(in crate::runner) fn gauges<DB: crate::backend::Backend>(
    label: Arc<str>,
    readiness: Readiness<DB>,
    every: Duration,
    stop: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let ready = metrics::gauge!(READY, "queue" => label.to_string());
    let age = readiness
        .ages()
        .then(|| metrics::gauge!(AGE, "queue" => label.to_string()));
    async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match readiness.read().await {
                Ok(reading) => {
                    ready.set(reading.ready as f64);
                    if let Some(age) = &age {
                        age.set(reading.oldest_age.map_or(0.0, |a| a.as_secs_f64()));
                    }
                }
                Err(error) => {
                    tracing::warn!(queue = %label, %error, "could not read the queue's depth");
                }
            }
        }
    }
}
