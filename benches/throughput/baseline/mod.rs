//! Side B: the baseline, `workers` independent tokio tasks, each on a connection of its own,
//! looping claim → handle → settle with the fewest statements each claim form allows, in the
//! bench's own SQL text (`benches/sql/baseline.rs`), a batch of up to `batch` rows at a time.

pub(crate) mod mysql;
pub(crate) mod postgres;
pub(crate) mod sqlite;

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, SubsecRound as _, TimeDelta, Utc};
use sqlx::AssertSqlSafe;

use crate::count;
use crate::db::{Ctx, Db};
use crate::drain::{Progress, cpu_ticks, wait_settled};
use crate::grid::{Cell, Form, Sample};

/// The lease the baseline writes (the crate's default).
const LEASE: TimeDelta = TimeDelta::seconds(30);

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
    fn texts(&self, text: impl Fn(&str, usize) -> String) -> Vec<Arc<str>> {
        (1..=self.batch)
            .map(|n| Arc::from(text(&self.table, n)))
            .collect()
    }

    fn text(&self, text: impl Fn(&str) -> String) -> Arc<str> {
        Arc::from(text(&self.table))
    }
}

/// A statement's text, as sqlx takes it.
fn sql(text: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(text))
}

/// The token of a lease claimed now: when the lease ends, to the microsecond (the precision
/// of the MySQL column).
fn now_and_token() -> (DateTime<Utc>, DateTime<Utc>) {
    let now = Utc::now().trunc_subsecs(6);
    (now, now + LEASE)
}

/// The handler of a batch: each row handled, their ids returned.
fn handle(progress: &Progress, rows: &[Claimed]) -> Vec<i64> {
    progress.batch();
    rows.iter()
        .map(|&(id, _, _)| {
            progress.handle(id);
            id
        })
        .collect()
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

fn settled(progress: &Progress, ids: &[i64]) {
    progress
        .settled
        .fetch_add(ids.len() as u64, Ordering::Relaxed);
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
                let conn = pool.acquire().await?;
                DB::baseline(conn, plan, progress).await
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
