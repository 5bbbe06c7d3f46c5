//! Side B: the baseline, `workers` independent tokio tasks, each on a connection of its own,
//! looping claim → handle → settle with the fewest statements each claim form allows, in the
//! bench's own SQL text (`benches/sql/baseline.rs`), a batch of up to `batch` rows at a time.
//!
//! A transaction the server rolls back as a deadlock victim (MariaDB/MySQL's row lock and lease
//! forms, whose statements can scan past rows other workers hold) runs again, as a hand-written
//! worker would run it; its rows count as handled once, when their settlement has committed.

/// `$transaction`, an expression that runs one transaction to its result, run again while
/// [`again`] says so.
macro_rules! retried {
    ($progress:expr, $transaction:expr) => {{
        let mut tries = 0;
        loop {
            match $transaction {
                Err(e) if $crate::baseline::again(&e, &mut tries, $progress) => {}
                result => break result,
            }
        }
    }};
}

/// Binds each id, in order (`IN (?, ?, …)`).
macro_rules! bind_ids {
    ($query:expr, $ids:expr) => {
        $ids.iter().fold($query, |query, id| query.bind(*id))
    };
}

mod mysql;
mod postgres;
mod shared;
mod sqlite;

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Database, Encode, Type};

use self::shared::Worker;
use crate::count;
use crate::db::{Ctx, Db};
use crate::drain::{Progress, cpu_ticks, wait_settled};
use crate::grid::{Cell, Form, Sample};

/// The lease the baseline writes (the crate's default).
const LEASE: TimeDelta = TimeDelta::seconds(30);

/// Times in a row a transaction runs again after a deadlock before its worker fails.
const RETRIES: u32 = 20;

/// A statement's text, built once per drain.
type Text = Arc<str>;

/// A claimed row: id, payload, attempt.
type Claimed = (i64, Vec<u8>, i32);

/// What the workers of one drain share.
#[derive(Debug)]
pub(crate) struct Plan {
    form: Form,
    table: String,
    batch: usize,
    workers: usize,
    /// PostgreSQL's advisory keys are `(key_class << 32) | id`.
    key_class: i64,
    /// MySQL/MariaDB's lock names are `key_prefix` and the id.
    key_prefix: String,
    /// SQLite's advisory keys, held in this process.
    held: Mutex<HashSet<i64>>,
}

impl Plan {
    fn new(ctx: &Ctx, cell: Cell) -> Self {
        // FNV-1a of the table's name, in 31 bits.
        let hash = ctx.table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        Plan {
            form: cell.form,
            table: ctx.table.clone(),
            batch: cell.batch,
            workers: cell.workers,
            key_class: (hash & 0x7fff_ffff) as i64,
            key_prefix: format!("{}.{}.", ctx.database, ctx.table),
            held: Mutex::new(HashSet::new()),
        }
    }

    /// The batch size as the statements bind it.
    fn limit(&self) -> i64 {
        self.batch as i64
    }

    /// One text per id list length, 1 to `batch`: `texts[n - 1]`.
    fn texts(&self, text: impl Fn(&str, usize) -> String) -> Vec<Text> {
        (1..=self.batch)
            .map(|n| Arc::from(text(&self.table, n)))
            .collect()
    }

    fn text(&self, text: impl Fn(&str) -> String) -> Text {
        Arc::from(text(&self.table))
    }
}

/// A statement's text, as sqlx takes it.
fn sql(text: &Text) -> AssertSqlSafe<Text> {
    AssertSqlSafe(Arc::clone(text))
}

/// The token of a lease claimed now: when the lease ends, to the microsecond (the precision
/// of the MySQL column).
fn now_and_token() -> (DateTime<Utc>, DateTime<Utc>) {
    let now = Utc::now().trunc_subsecs(6);
    (now, now + LEASE)
}

/// A batch the handler took: its ids, and when.
struct Handled {
    ids: Vec<i64>,
    at: Instant,
}

/// The handler of a batch: a no-op on each row. Its rows count as handled once their
/// settlement committed ([`settled`]): a transaction the server rolled back hands them to the
/// handler again when it runs again, and they count once.
fn handle(rows: &[Claimed]) -> Handled {
    Handled {
        ids: rows.iter().map(|&(id, _, _)| id).collect(),
        at: Instant::now(),
    }
}

/// Whether a transaction that failed with `error` runs again: the server rolled it back as a
/// deadlock victim or a serialization failure (SQLSTATE 40001, which MariaDB/MySQL's deadlock,
/// error 1213, carries; PostgreSQL's deadlock is 40P01), and a hand-written worker retries
/// that, here up to [`RETRIES`] times in a row (`tries`). Each retry is counted.
fn again(error: &sqlx::Error, tries: &mut u32, progress: &Progress) -> bool {
    let rolled_back = error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| matches!(&*code, "40001" | "40P01"));
    if !rolled_back || *tries == RETRIES {
        return false;
    }
    *tries += 1;
    progress.retries.fetch_add(1, Ordering::Relaxed);
    true
}

/// Checks a settlement changed one row per id.
fn expect(changed: u64, ids: &[i64], what: &str) -> sqlx::Result<()> {
    if changed == ids.len() as u64 {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "{what} changed {changed} of {} rows",
            ids.len()
        )))
    }
}

/// A batch settled and committed: its claim, its rows handled, and their settlements counted.
fn settled(progress: &Progress, handled: &Handled) {
    progress.batch();
    progress.handled(&handled.ids, handled.at);
    progress
        .settled
        .fetch_add(handled.ids.len() as u64, Ordering::Relaxed);
}

/// A database's baseline: its worker, and how its statements take a list of ids.
pub(crate) trait Baseline: Database {
    /// One worker: claim → handle → settle on its connection until nothing is left.
    fn work(worker: Worker<'_, Self>) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The statement of `texts` on `ids`, bound: MySQL/MariaDB and SQLite have one text per
    /// list length (`IN (?, ?, …)`, `texts[n - 1]`), which takes each id; PostgreSQL has one,
    /// which takes the ids as one array (`= ANY($1)`).
    fn on_ids(texts: &[Text], ids: &[i64]) -> Query<'static, Self, Self::Arguments>
    where
        i64: for<'q> Encode<'q, Self> + Type<Self>,
    {
        bind_ids!(sqlx::query(sql(&texts[ids.len() - 1])), ids)
    }

    /// The rows a statement changed.
    fn changed(result: &Self::QueryResult) -> u64;
}

/// One drain by the baseline; `counted`: with its statements counted (and its rate not kept).
pub(crate) async fn run<DB: Db>(ctx: &Ctx, cell: Cell, counted: bool) -> Result<Sample, String> {
    let plan = Arc::new(Plan::new(ctx, cell));
    let min_id = ctx.fill::<DB>(cell.rows).await?;
    let size = u32::try_from(cell.workers + 1)
        .map_err(|_| format!("{} workers: too many for a pool", cell.workers))?;
    let pool = ctx.pool::<DB>(size, counted).await?;
    let progress = Arc::new(Progress::new(min_id, cell.rows));
    let cpu = cpu_ticks();
    let window = counted.then(|| count::Window::open(ctx.proxy.is_some()));
    let tasks: Vec<_> = (0..cell.workers)
        .map(|_| {
            let (pool, plan, progress) = (pool.clone(), Arc::clone(&plan), Arc::clone(&progress));
            tokio::spawn(async move {
                let mut conn = pool.acquire().await?;
                DB::work(Worker::new(&mut *conn, &plan, &progress)).await
            })
        })
        .collect();
    let end = wait_settled(
        ctx.cap,
        &progress,
        window,
        || progress.settled.load(Ordering::Relaxed),
        || {
            tasks
                .iter()
                .all(|t| t.is_finished())
                .then(|| "every baseline worker ended".to_owned())
        },
    )
    .await;
    let cpu = cpu.zip(cpu_ticks()).map(|(a, b)| b - a);
    progress.stop.store(true, Ordering::Relaxed);
    let mut errors = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e.to_string()),
            Err(e) => errors.push(e.to_string()),
        }
    }
    pool.close().await;
    if let Some(error) = errors.into_iter().next() {
        return Err(format!("baseline worker: {error}"));
    }
    let end = end?;
    progress.verify(end)?;
    let scans = if end.settled < cell.rows as u64 {
        None
    } else {
        ctx.after::<DB>(cell.rows).await?
    };
    progress.sample(end, cpu, scans)
}
