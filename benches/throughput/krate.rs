//! Side A: the crate, a [`Runner`] with one queue of `workers` workers and a handler that acks
//! at once.

use std::sync::Arc;

use sqlx_queue::{Runner, Table};

use crate::count;
use crate::db::{Ctx, Db};
use crate::drain::{Progress, cpu_ticks, wait_settled};
use crate::grid::{Cell, Sample};

/// Mounts `$queue` (a claim form chosen, nothing else) on `$runner` with the attempt column
/// and `$cell.workers` workers: a handler of one delivery, or for a batch over 1,
/// `.batch(n).batch_handler(..)`. A macro, expanded where the database is concrete, so that
/// the bench names none of the crate's typestate.
macro_rules! mount {
    ($db:ty, $runner:expr, $queue:expr, $cell:expr, $progress:expr $(,)?) => {{
        let progress = ::std::sync::Arc::clone($progress);
        let queue = $queue.attempt("attempt").workers($cell.workers);
        if $cell.batch > 1 {
            $runner.mount(queue.batch($cell.batch).batch_handler(
                move |deliveries: Vec<::sqlx_queue::Delivery<$db>>| {
                    progress.batch();
                    for delivery in &deliveries {
                        progress.handle(delivery.id());
                    }
                    let outcomes = deliveries.iter().map(|_| ::sqlx_queue::Outcome::ack());
                    ::std::future::ready(outcomes.collect())
                },
            ))
        } else {
            $runner.mount(queue.handler(move |delivery: ::sqlx_queue::Delivery<$db>| {
                progress.batch();
                progress.handle(delivery.id());
                ::std::future::ready(::sqlx_queue::Outcome::ack())
            }))
        }
    }};
}
pub(crate) use mount;

/// One drain by the crate; `counted`: with its statements counted (and its rate not kept).
pub(crate) async fn run<DB: Db>(ctx: &Ctx, cell: Cell, counted: bool) -> Result<Sample, String> {
    let min_id = ctx.fill::<DB>(cell.rows).await?;
    let size = u32::try_from(cell.workers + 1)
        .map_err(|_| format!("{} workers: too many for a pool", cell.workers))?;
    let pool = ctx.pool::<DB>(size, counted).await?;
    let progress = Arc::new(Progress::new(min_id, cell.rows));
    let mut runner = Runner::new(pool.clone());
    if let Some(poll) = ctx.poll {
        runner = runner.poll_interval(poll);
    }
    let runner = DB::mount(runner, Table::new(ctx.table.as_str()), cell, &progress);
    let cpu = cpu_ticks();
    let window = counted.then(|| count::Window::open(ctx.proxy.is_some()));
    let running = runner.start().await.map_err(|e| format!("start: {e}"))?;
    let end = wait_settled(
        ctx.cap,
        &progress,
        window,
        || running.stats().acked,
        || {
            let stats = running.stats();
            (stats.failed + stats.lease_lost + stats.panicked > 0).then(|| format!("{stats:?}"))
        },
    )
    .await;
    let cpu = cpu.zip(cpu_ticks()).map(|(a, b)| b - a);
    let stats = running.stats();
    running
        .shutdown()
        .await
        .map_err(|e| format!("shutdown: {e}"))?;
    pool.close().await;
    let end = end?;
    progress.verify(end)?;
    let capped = end.settled < cell.rows as u64;
    if !capped && (stats.claimed != cell.rows as u64 || stats.acked != cell.rows as u64) {
        return Err(format!("runner stats {stats:?}"));
    }
    let scans = if capped {
        None
    } else {
        ctx.after::<DB>(cell.rows).await?
    };
    progress.sample(end, cpu, scans)
}
