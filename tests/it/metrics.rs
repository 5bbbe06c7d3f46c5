// Metrics (the `metrics` feature): what a runner records for a known sequence of outcomes, for one
// database `DB` and one form `F`.
//
// Each test reads a debugging recorder of its own, set for the test's thread while the runner
// starts: the runner registers its instruments then, and its deliveries record through them on
// any thread. No global recorder is installed, so the tests of this binary do not see each
// other's figures.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Utc};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Running, Table};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs` writes
/// them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(metrics<$db, $form>:
            every_outcome_is_counted_and_timed,
            a_batch_counts_each_row_and_times_each_call,
        );
    };
}
pub(crate) use tests;

/// What a test's recorder holds. A snapshot of the debugging recorder takes what it reads (it
/// sets counters and gauges back to zero and empties histograms), so the readings are added up
/// here: counters, and the gauges the runner moves by increments once it has set them (in work,
/// free workers), by `name{labels}`; every value each histogram recorded; and each gauge's value
/// in the last reading (the depth gauges, which the runner sets at each reading).
pub(crate) struct Recorded {
    snapshotter: Snapshotter,
    values: HashMap<String, f64>,
    last: HashMap<String, f64>,
    histograms: HashMap<String, Vec<f64>>,
}

impl Recorded {
    /// Starts `runner` with a recorder of its own set for this thread, and returns both.
    pub(crate) async fn start<DB: TestDb>(runner: Runner<DB>) -> (Running, Recorded) {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let running = {
            let _local = metrics::set_default_local_recorder(&recorder);
            runner.start().await.unwrap()
        };
        let recorded = Recorded {
            snapshotter,
            values: HashMap::new(),
            last: HashMap::new(),
            histograms: HashMap::new(),
        };
        (running, recorded)
    }

    /// Reads what was recorded since the last reading.
    pub(crate) fn read(&mut self) -> &mut Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(n) => {
                    *self.values.entry(name).or_default() += n as f64;
                }
                DebugValue::Gauge(x) => {
                    *self.values.entry(name.clone()).or_default() += x.0;
                    self.last.insert(name, x.0);
                }
                DebugValue::Histogram(xs) => {
                    let kept = self.histograms.entry(name).or_default();
                    kept.extend(xs.into_iter().map(|x| x.0));
                }
            }
        }
        self
    }

    /// The counter or gauge `name` of queue `queue` (and outcome `outcome`), so far.
    pub(crate) fn value(&self, name: &str, queue: &str, outcome: Option<&str>) -> f64 {
        let labels = match outcome {
            Some(outcome) => format!("outcome={outcome},queue={queue}"),
            None => format!("queue={queue}"),
        };
        let key = format!("{name}{{{labels}}}");
        *self
            .values
            .get(&key)
            .unwrap_or_else(|| panic!("{key} was never recorded: {:#?}", self.values))
    }

    /// Gauge `name` of queue `queue` in the last reading: what the runner set since the one
    /// before (0 when it set nothing).
    pub(crate) fn last(&self, name: &str, queue: &str) -> Option<f64> {
        self.last.get(&format!("{name}{{queue={queue}}}")).copied()
    }

    /// Every value histogram `name` of queue `queue` recorded so far.
    pub(crate) fn histogram(&self, name: &str, queue: &str) -> &[f64] {
        self.histograms
            .get(&format!("{name}{{queue={queue}}}"))
            .map_or(&[], Vec::as_slice)
    }
}

/// A grouped lease table (`Spec::lease` and `queue`) whose rows have a `created_at`.
async fn observed_table<DB: TestDb>(ctx: &mut Ctx<DB>) -> String {
    ctx.table(Spec {
        group: true,
        created_at: true,
        ..Spec::lease()
    })
    .await
}

fn jobs(t: &str) -> Table {
    Table::new(t)
        .group("queue")
        .retry_after("retry_after")
        .created_at("created_at")
}

const QUEUE: &str = "observed";

/// Makes every row of `t` created `ago` ago, so that each first delivery's pickup latency is at
/// least that.
async fn created_ago<DB: TestDb>(ctx: &Ctx<DB>, t: &str, ago: TimeDelta) {
    ctx.exec_time(&format!("UPDATE {t} SET created_at = ?"), Utc::now() - ago)
        .await;
}

/// The handler of `every_outcome_is_counted_and_timed`, by payload: `ack`, `drop`, `retry` (then
/// ack), `dead` (retried to the cap), `panic` (then ack), `hold` (acks once released), `lose` (its
/// lease taken, then ack).
fn outcome_of(payload: &[u8], attempt: u32) -> Outcome {
    match (payload, attempt) {
        (b"drop", _) => Outcome::drop(),
        (b"retry", 1) | (b"dead", _) => Outcome::retry(),
        (b"panic", 1) => panic!("the handler panics on its first attempt"),
        _ => Outcome::ack(),
    }
}

pub(crate) async fn every_outcome_is_counted_and_timed<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = observed_table(&mut ctx).await;
    let lease = F::NAME == "lease";
    let mut payloads = vec!["ack", "drop", "retry", "dead", "panic", "hold"];
    if lease {
        payloads.push("lose");
    }
    let batch: Vec<Job<'_>> = payloads.iter().map(|p| Job::new(p).group(QUEUE)).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    created_ago(&ctx, &t, TimeDelta::seconds(10)).await;

    let (started, mut hold_started) = mpsc::unbounded_channel();
    let release = Arc::new(Semaphore::new(0));
    let (pool, release_hold) = (ctx.pool.clone(), Arc::clone(&release));
    let lose = format!("UPDATE {t} SET locked_until = ? WHERE id = ");
    let queue = F::apply(Queue::table(jobs(&t)).named(QUEUE))
        .attempt("attempt")
        .max_attempts(2)
        .dead_letter(DeadLetter::group("observed_dead"))
        .workers(2)
        .handler(move |d: Delivery<DB>| {
            let (pool, release, started) =
                (pool.clone(), Arc::clone(&release_hold), started.clone());
            let lose = format!("{lose}{}", d.id());
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                match (d.payload(), d.attempt()) {
                    (b"hold", _) => {
                        let _ = started.send(());
                        let _ = release.acquire().await.unwrap();
                    }
                    // Another claim's lease (already expired: the row comes again at once).
                    (b"lose", 1) => {
                        let past = Utc::now() - TimeDelta::days(1);
                        DB::exec_time(&pool, &lose, past).await.unwrap();
                    }
                    _ => {}
                }
                outcome_of(d.payload(), d.attempt())
            }
        });
    let runner = Runner::new(ctx.pool.clone()).poll_interval(Duration::from_millis(50));
    let (running, mut recorded) = Recorded::start(runner.mount(queue)).await;

    // While `hold` is in work and everything else settled: one delivery in work, one worker free.
    let lost = f64::from(u8::from(lease));
    let (acks, drops, retries, dead) = (3.0 + lost, 1.0, 3.0, 1.0);
    let settled = acks + drops + retries + dead;
    recv(&mut hold_started, "the held delivery", 20).await;
    let count = |recorded: &mut Recorded, outcome| {
        recorded
            .read()
            .value("sqlx_queue_deliveries_total", QUEUE, Some(outcome))
    };
    wait_for(
        "every delivery but the held one settled",
        Duration::from_secs(30),
        || {
            let n: f64 = ["ack", "drop", "retry", "dead_letter"]
                .into_iter()
                .map(|outcome| count(&mut recorded, outcome))
                .sum();
            async move { n == settled }
        },
    )
    .await;
    wait_for(
        "one delivery in work, one worker free",
        Duration::from_secs(10),
        || {
            let r = recorded.read();
            let in_work = r.value("sqlx_queue_deliveries_in_work", QUEUE, None);
            let free = r.value("sqlx_queue_workers_free", QUEUE, None);
            async move { (in_work, free) == (1.0, 1.0) }
        },
    )
    .await;

    release.add_permits(1);
    ctx.wait_none(&t, &format!("queue = '{QUEUE}'"), 20).await;
    wait_for("the held delivery's ack", Duration::from_secs(10), || {
        let acked = count(&mut recorded, "ack");
        async move { acked == acks + 1.0 }
    })
    .await;
    // A claim that fails: the table is gone.
    ctx.exec(&format!("DROP TABLE {t}")).await;
    wait_for("a failed claim", Duration::from_secs(10), || {
        let failed = recorded
            .read()
            .value("sqlx_queue_claim_errors_total", QUEUE, None);
        async move { failed >= 1.0 }
    })
    .await;
    running.shutdown().await.unwrap();

    let r = recorded.read();
    let value = |name: &str| r.value(name, QUEUE, None);
    let deliveries = payloads.len() as f64 + 3.0 + lost; // retry, dead, panic (and lose) twice
    assert_eq!(value("sqlx_queue_deliveries_started_total"), deliveries);
    for (outcome, n) in [
        ("ack", acks + 1.0),
        ("drop", drops),
        ("retry", retries),
        ("dead_letter", dead),
    ] {
        assert_eq!(
            r.value("sqlx_queue_deliveries_total", QUEUE, Some(outcome)),
            n,
            "{outcome}"
        );
    }
    assert_eq!(value("sqlx_queue_lease_lost_total"), lost);
    assert_eq!(value("sqlx_queue_panics_total"), 1.0);
    assert_eq!(value("sqlx_queue_settlement_errors_total"), 0.0);
    assert_eq!(value("sqlx_queue_deliveries_in_work"), 0.0);
    assert_eq!(value("sqlx_queue_workers_free"), 2.0);

    // A handler call and a settlement per delivery; a pickup per job, each at least 10 s.
    let handler = r.histogram("sqlx_queue_handler_duration_seconds", QUEUE);
    assert_eq!(handler.len() as f64, deliveries);
    assert!(handler.iter().all(|&s| s >= 0.02), "{handler:?}");
    let settlement = r.histogram("sqlx_queue_settlement_duration_seconds", QUEUE);
    assert_eq!(settlement.len() as f64, deliveries);
    let pickup = r.histogram("sqlx_queue_pickup_latency_seconds", QUEUE);
    assert_eq!(pickup.len(), payloads.len(), "{pickup:?}");
    assert!(
        pickup.iter().all(|&s| (9.9..40.0).contains(&s)),
        "created 10 s before: {pickup:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_batch_counts_each_row_and_times_each_call<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = observed_table(&mut ctx).await;
    let payloads = ["ack", "drop", "retry", "dead"];
    let batch: Vec<Job<'_>> = payloads.iter().map(|p| Job::new(p).group(QUEUE)).collect();
    DB::enqueue_many(&ctx.pool, &jobs(&t), &batch)
        .await
        .unwrap();
    created_ago(&ctx, &t, TimeDelta::seconds(10)).await;
    let (calls, mut called) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)).named(QUEUE))
        .attempt("attempt")
        .max_attempts(2)
        .dead_letter(DeadLetter::group("observed_dead"))
        .batch(4)
        .batch_handler(move |rows: Vec<Delivery<DB>>| {
            let _ = calls.send(rows.len());
            let outcomes = rows
                .iter()
                .map(|d| outcome_of(d.payload(), d.attempt()))
                .collect();
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                outcomes
            }
        });
    let runner = Runner::new(ctx.pool.clone()).poll_interval(Duration::from_millis(50));
    let (running, mut recorded) = Recorded::start(runner.mount(queue)).await;
    // Four rows, then `retry` and `dead` again.
    let mut rows = 0;
    let mut batches = 0;
    while rows < 6 {
        rows += recv(&mut called, "a batch", 20).await;
        batches += 1;
    }
    ctx.wait_none(&t, &format!("queue = '{QUEUE}'"), 20).await;
    wait_for("every settlement recorded", Duration::from_secs(10), || {
        let n = recorded
            .read()
            .histogram("sqlx_queue_settlement_duration_seconds", QUEUE)
            .len();
        async move { n == batches }
    })
    .await;
    running.shutdown().await.unwrap();
    let r = recorded.read();
    assert_eq!(
        r.value("sqlx_queue_deliveries_started_total", QUEUE, None),
        6.0
    );
    for (outcome, n) in [
        ("ack", 2.0),
        ("drop", 1.0),
        ("retry", 2.0),
        ("dead_letter", 1.0),
    ] {
        assert_eq!(
            r.value("sqlx_queue_deliveries_total", QUEUE, Some(outcome)),
            n,
            "{outcome}"
        );
    }
    assert_eq!(r.value("sqlx_queue_deliveries_in_work", QUEUE, None), 0.0);
    assert_eq!(r.value("sqlx_queue_workers_free", QUEUE, None), 1.0);
    let handler = r.histogram("sqlx_queue_handler_duration_seconds", QUEUE);
    assert_eq!(handler.len(), batches, "one per call");
    assert!(handler.iter().all(|&s| s >= 0.02), "{handler:?}");
    let pickup = r.histogram("sqlx_queue_pickup_latency_seconds", QUEUE);
    assert_eq!(pickup.len(), 4, "one per job: {pickup:?}");
    assert!(
        pickup.iter().all(|&s| (9.9..40.0).contains(&s)),
        "{pickup:?}"
    );
    ctx.drop_tables().await;
}
