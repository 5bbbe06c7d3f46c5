//! Cancellations racing settlements on the forms that hold their rows (row lock, advisory lock),
//! counted against a ledger: 200 jobs a round, three rounds, four workers with handlers of 0–3
//! ms, and a cancellation sent for jobs as their handlers start (and for others at random), so
//! that many arrive while a delivery settles. Every answer is recorded with the moment it came
//! back, every handler start with its moment, on one clock.
//!
//! - Transactional acks: each handler writes an effect row through its transaction and acks. A
//!   job answered `Requested` or `Cancelled` has no effect row; no handler starts after a job's
//!   `Cancelled`; every job has its effect or one of those answers; nothing is left.
//! - Plain retries at once: each handler retries its row at once, so that only a cancellation
//!   ends a job. No handler starts after its job was answered `Requested` or `Cancelled` — a
//!   retry that crossed the request would return the row, and its next delivery would start.
//!
//! Before the settlements reserved their requests (`form::requests`), the first failed on
//! PostgreSQL and MariaDB (transactional writes committed after `Requested`), the second
//! everywhere (rows back in the queue after `Requested`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{AdvisoryForm, Ctx, Form, RowLockForm, Spec, TestDb, report};

const ROUNDS: usize = 3;
const ROWS: usize = 200;

pub(crate) async fn requested_row_lock_jobs_commit_nothing<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    race::<DB, RowLockForm>(Work::TransactionalAck).await;
}

pub(crate) async fn requested_advisory_jobs_commit_nothing<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    race::<DB, AdvisoryForm>(Work::TransactionalAck).await;
}

pub(crate) async fn requested_row_lock_jobs_never_start_again<DB: TestDb>()
where
    RowLockForm: Form<DB>,
{
    race::<DB, RowLockForm>(Work::PlainRetry).await;
}

pub(crate) async fn requested_advisory_jobs_never_start_again<DB: TestDb>()
where
    AdvisoryForm: Form<DB>,
{
    race::<DB, AdvisoryForm>(Work::PlainRetry).await;
}

/// What the handlers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Write an effect row through the delivery's transaction, then ack.
    TransactionalAck,
    /// Retry at once: only a cancellation ends a job.
    PlainRetry,
}

/// When each job's handler started, by job.
type Starts = HashMap<i64, Vec<Instant>>;
/// Each cancellation's job, answer, and when the answer came back.
type Answers = Vec<(i64, Cancellation, Instant)>;

/// Handler starts and cancellation answers, by job, on one clock.
#[derive(Default)]
struct Ledger {
    starts: Mutex<Starts>,
    answers: Mutex<Answers>,
    errors: Mutex<Vec<String>>,
}

impl Ledger {
    fn started(&self, id: i64) {
        let mut starts = self.starts.lock().unwrap();
        starts.entry(id).or_default().push(Instant::now());
    }

    fn answered(&self, id: i64, answer: sqlx_queue::Result<Cancellation>) {
        match answer {
            Ok(answer) => self
                .answers
                .lock()
                .unwrap()
                .push((id, answer, Instant::now())),
            Err(error) => self.errors.lock().unwrap().push(format!("{id}: {error}")),
        }
    }
}

impl Ledger {
    /// Empties the ledger for the next round (SQLite gives a deleted row's id again).
    fn take(&self) -> (Starts, Answers) {
        let starts = std::mem::take(&mut *self.starts.lock().unwrap());
        let answers = std::mem::take(&mut *self.answers.lock().unwrap());
        (starts, answers)
    }
}

/// A handler's time: from none to 1.75 times what a cancellation takes (`took`), spread over
/// the jobs, so that cancellations sent as handlers start come back before, during and after
/// their settlements.
fn pause(id: i64, took: Duration) -> Duration {
    let eighths = u32::try_from(id.unsigned_abs().wrapping_mul(7919) % 8).unwrap();
    took * eighths / 4
}

async fn race<DB: TestDb, F: Form<DB>>(work: Work) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let (effects, cancels) = (format!("{t}_effects"), format!("{t}_cancels"));
    ctx.exec(&format!("CREATE TABLE {effects} (job BIGINT NOT NULL)"))
        .await;
    ctx.exec(&format!("CREATE TABLE {cancels} (id BIGINT PRIMARY KEY)"))
        .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .cancel_requests(&cancels);
    let declared = F::apply(Queue::table(table.clone()));
    let ledger = Arc::new(Ledger::default());
    let cancelling = ctx.pool(8).await;
    let mut took = Vec::new();
    for _ in 0..5 {
        let asked = Instant::now();
        declared.cancel(&cancelling, -1).await.unwrap();
        took.push(asked.elapsed());
    }
    took.sort();
    let took = took[2];
    let (started_tx, mut started) = mpsc::unbounded_channel::<i64>();
    let queue = declared.clone().workers(4);
    // A poll interval longer than the test: the runner learns of requests by notification
    // (PostgreSQL) or not at all, so that settlements meet requests they were not told of.
    let runner = Runner::new(ctx.pool.clone()).poll_interval(Duration::from_secs(60));
    let running = match work {
        Work::TransactionalAck => {
            let (ledger, effects) = (Arc::clone(&ledger), effects.clone());
            let queue = queue
                .transactional()
                .handler(move |mut d: Delivery<DB, Transactional>| {
                    let (ledger, started_tx) = (Arc::clone(&ledger), started_tx.clone());
                    let sql = format!("INSERT INTO {effects} (job) VALUES ({})", d.id());
                    async move {
                        ledger.started(d.id());
                        let _ = started_tx.send(d.id());
                        DB::query_on(&mut *d.tx(), &sql).await.unwrap();
                        tokio::time::sleep(pause(d.id(), took)).await;
                        Outcome::ack()
                    }
                });
            runner.mount(queue).start().await.unwrap()
        }
        Work::PlainRetry => {
            let ledger = Arc::clone(&ledger);
            let queue = queue.handler(move |d: Delivery<DB>| {
                let (ledger, started_tx) = (Arc::clone(&ledger), started_tx.clone());
                async move {
                    ledger.started(d.id());
                    let _ = started_tx.send(d.id());
                    tokio::time::sleep(pause(d.id(), took)).await;
                    Outcome::retry()
                }
            });
            runner.mount(queue).start().await.unwrap()
        }
    };
    let mut counts: HashMap<&'static str, usize> = HashMap::new();
    for round in 0..ROUNDS {
        // The last round's starts are checked: SQLite gives its ids again.
        while started.try_recv().is_ok() {}
        // In one transaction: SQLite would give the id of a row settled meanwhile again.
        let mut ids = Vec::with_capacity(ROWS);
        let mut tx = ctx.pool.begin().await.unwrap();
        for _ in 0..ROWS {
            ids.push(
                DB::enqueue_on(&mut tx, &table, Job::new("x"))
                    .await
                    .unwrap(),
            );
        }
        tx.commit().await.unwrap();
        // Each job cancelled once: as its handler starts (every job when only a cancellation
        // ends one; every other one when handlers ack), or at random for a fifth of the rest.
        let round_ids: HashSet<i64> = ids.iter().copied().collect();
        let mut asked: HashSet<i64> = HashSet::new();
        let slots = Arc::new(Semaphore::new(8));
        let mut tasks = tokio::task::JoinSet::new();
        let cancel = |id: i64, tasks: &mut tokio::task::JoinSet<()>| {
            let (pool, declared) = (cancelling.clone(), declared.clone());
            let (ledger, slots) = (Arc::clone(&ledger), Arc::clone(&slots));
            tasks.spawn(async move {
                let _slot = slots.acquire_owned().await.unwrap();
                let answer = declared.cancel(&pool, id).await;
                ledger.answered(id, answer);
            });
        };
        for (i, &id) in ids.iter().enumerate() {
            if i % 10 == 3 && work == Work::TransactionalAck {
                asked.insert(id);
                cancel(id, &mut tasks);
            }
        }
        // A round drains in a few seconds; one whose rows keep coming back is checked at 20 s
        // (its answers against its starts first: they say why).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if tokio::time::Instant::now() > deadline {
                break;
            }
            let id = match tokio::time::timeout(Duration::from_millis(100), started.recv()).await {
                Ok(id) => id.expect("the handlers keep the channel open"),
                Err(_) if ctx.count(&t, "1 = 1").await == 0 => break,
                Err(_) => continue,
            };
            let targeted = work == Work::PlainRetry || id % 2 == 0;
            if round_ids.contains(&id) && targeted && asked.insert(id) {
                cancel(id, &mut tasks);
            }
        }
        while tasks.join_next().await.is_some() {}
        let errors = ledger.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "cancellations failed: {errors:?}");
        let (starts, answers) = ledger.take();
        let ended = check_round::<DB, F>(&starts, &answers, &mut counts, round);
        assert_eq!(
            ctx.count(&t, "1 = 1").await,
            0,
            "round {round} of {} on {}: rows left after 20 s",
            F::NAME,
            DB::LABEL
        );

        // `0`: no job has that id, and the list is never empty.
        let listed: Vec<String> = ended.iter().chain([&0]).map(i64::to_string).collect();
        if work == Work::TransactionalAck {
            let committed = ctx
                .count(&effects, &format!("job IN ({})", listed.join(", ")))
                .await;
            assert_eq!(
                committed,
                0,
                "round {round}: effects committed for jobs answered Requested or Cancelled on {} {}",
                F::NAME,
                DB::LABEL
            );
            let effects_n = ctx.count(&effects, "1 = 1").await;
            assert_eq!(
                usize::try_from(effects_n).unwrap() + ended.len(),
                ROWS,
                "round {round}: each job has its effect once, or was ended by a cancellation"
            );
            ctx.exec(&format!("DELETE FROM {effects}")).await;
        } else {
            assert_eq!(
                ended.len(),
                ROWS,
                "round {round}: only cancellations end jobs"
            );
        }
        // Each request removed with its row.
        ctx.wait_none(&cancels, "1 = 1", 10).await;
    }
    running.shutdown().await.unwrap();
    report(&format!(
        "cancel races, {} {} {work:?}: {} jobs, a cancellation {took:?}: {counts:?}",
        DB::LABEL,
        F::NAME,
        ROUNDS * ROWS,
    ));
    assert!(
        counts.get("Requested").copied().unwrap_or(0) > 0,
        "no cancellation met a job in work: the race was not run"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    ctx.exec(&format!("DROP TABLE {effects}")).await;
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}

/// Checks one round's answers against its handler starts, counting the answers: no handler
/// starts after its job was answered `Cancelled`, nor more than once after `Requested` (a row
/// claimed before the answer and not started then — claimed ahead of a worker, or between its
/// claim and its handler — starts once: its settlement then removes it). The jobs ended by an
/// answer.
fn check_round<DB: TestDb, F: Form<DB>>(
    starts: &Starts,
    answers: &Answers,
    counts: &mut HashMap<&'static str, usize>,
    round: usize,
) -> HashSet<i64> {
    let mut ended = HashSet::new();
    for &(id, answer, at) in answers {
        let (name, allowed) = match answer {
            Cancellation::Requested(_) => ("Requested", 1),
            Cancellation::Cancelled(_) => ("Cancelled", 0),
            Cancellation::NotFound => ("NotFound", usize::MAX),
            Cancellation::InWork(_) => panic!("job {id} said in work: the table records requests"),
            _ => ("other", usize::MAX),
        };
        *counts.entry(name).or_default() += 1;
        if allowed == usize::MAX {
            continue;
        }
        ended.insert(id);
        let late = starts
            .get(&id)
            .map_or(0, |s| s.iter().filter(|s| **s > at).count());
        assert!(
            late <= allowed,
            "round {round}: job {id} answered {answer:?} started {late} times after the answer on {} {}",
            F::NAME,
            DB::LABEL
        );
    }
    ended
}
