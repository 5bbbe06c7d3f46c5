//! One schedule's loop on one runner: wait for the next tick by the database's clock, and fire
//! it through the Enqueue layer (which keeps it to one job across every runner). Ticks missed
//! while no runner of the schedule ran are dealt with at start by the schedule's [`Missed`]
//! policy; a tick this runner reaches only after the ticks that follow it (a pause, a stall)
//! gives way to the latest of them, fired late.
//!
//! A tick is due once, for every runner: the first transaction to move the schedules table's
//! `last_tick` to it enqueues its job, any other finds it fired (logged at info). No lock is held
//! between ticks and no runner leads: a runner that stops or stalls leaves the ticks to the
//! others.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Pool;
use tokio_util::sync::CancellationToken;

use super::{Missed, Schedule};
use crate::backend::{Backend, Clock};
use crate::enqueue::{Enqueued, Fired, Job, Ticks};
use crate::error::{Error, Result};
use crate::runner::stats::Counters;
use crate::table::Table;

/// What builds a schedule's job for a tick.
pub(super) type JobFn = Arc<dyn Fn(DateTime<Utc>) -> Job<'static> + Send + Sync>;

/// The tick a schedule's loop waits for, shared with `Running::next_tick`.
pub(super) type NextTick = Arc<Mutex<Option<DateTime<Utc>>>>;

/// How many missed ticks are counted at most (a cron schedule's one by one: at start, after a
/// long downtime of a schedule of seconds, this bounds the search).
const COUNT_MAX: u64 = 10_000;

/// The first wait after a tick failed for the database's reason; it doubles up to `RETRY_MAX`.
const RETRY_MIN: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// One schedule on one runner.
pub(super) struct Loop<DB: Backend> {
    pub(super) pool: Pool<DB>,
    pub(super) name: Arc<str>,
    pub(super) schedule: Schedule,
    pub(super) table: Table,
    pub(super) job: JobFn,
    pub(super) ticks: Arc<Ticks>,
    pub(super) clock: Clock,
    pub(super) stats: Arc<Counters>,
    /// The tick the loop waits for, for `Running::next_tick`.
    pub(super) next: NextTick,
}

impl<DB: Backend> Loop<DB> {
    /// At start: the schedule's row (inserted with the time now for a new schedule, which has
    /// missed nothing), and the ticks after its last tick up to now, missed while no runner of
    /// it ran. The loop goes on from the time returned.
    pub(super) async fn begin(&self) -> Result<DateTime<Utc>> {
        let now = self.clock.now();
        let last = {
            let mut conn = self.pool.acquire().await?;
            self.ticks.last::<DB>(&mut conn, &self.name, now).await?
        };
        if let Some(last) = last
            && let Some(latest) = self.schedule.last_until(now).filter(|t| *t > last)
        {
            let missed = self.schedule.between(last, latest, COUNT_MAX) + 1;
            self.missed(missed, latest).await?;
        }
        Ok(now)
    }

    /// Fires each tick after `from` when it comes, until `stop`; a tick in work when `abort`
    /// comes is rolled back.
    pub(super) async fn run(
        self,
        from: DateTime<Utc>,
        stop: CancellationToken,
        abort: CancellationToken,
    ) {
        let mut target = self.schedule.next_after(from);
        let mut retry = RETRY_MIN;
        loop {
            *self.next.lock().unwrap_or_else(|e| e.into_inner()) = target;
            let Some(tick) = target else {
                return stop.cancelled().await;
            };
            if !self.wait_for(tick, &stop).await {
                return;
            }
            // Reached after the ticks that follow it (a pause, a stall): the latest of them is
            // fired, late, and the ones before it are missed.
            let now = self.clock.now();
            let tick = match self
                .schedule
                .last_until(now)
                .filter(|latest| *latest > tick)
            {
                Some(latest) => {
                    let missed = self.schedule.between(tick, latest, COUNT_MAX) + 1;
                    tracing::info!(schedule = %self.name, missed, %latest, "ticks missed while this runner could not keep up: skipped; the latest fired late");
                    Counters::add(&self.stats.ticks_missed, missed);
                    latest
                }
                None => tick,
            };
            let done = tokio::select! {
                done = self.fire(tick) => done.map(|_| tick),
                () = abort.cancelled() => return,
            };
            match done {
                Ok(fired) => {
                    target = self.schedule.next_after(fired);
                    retry = RETRY_MIN;
                }
                // The same tick again after a while, unless it is missed by then.
                Err(error) => {
                    tracing::warn!(schedule = %self.name, %tick, %error, "a tick failed; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(retry) => {}
                        () = stop.cancelled() => return,
                    }
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// Sleeps until `tick` by the database's clock: false when `stop` came first.
    async fn wait_for(&self, tick: DateTime<Utc>, stop: &CancellationToken) -> bool {
        loop {
            let Ok(wait) = (tick - self.clock.now()).to_std() else {
                return true;
            };
            if wait.is_zero() {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => return false,
            }
        }
    }

    /// Deals with `missed` ticks up to `latest`, missed while no runner of the schedule ran, by
    /// its policy: skipped, or the latest fired (unless another runner fired it meanwhile).
    async fn missed(&self, missed: u64, latest: DateTime<Utc>) -> Result<()> {
        let name = &self.name;
        match self.schedule.on_missed() {
            Missed::Skip => {
                tracing::info!(schedule = %name, missed, %latest, "ticks missed while no runner of the schedule ran: skipped");
                Counters::add(&self.stats.ticks_missed, missed);
            }
            Missed::CatchUp => {
                tracing::info!(schedule = %name, missed, %latest, "ticks missed while no runner of the schedule ran: the latest caught up");
                Counters::add(&self.stats.ticks_missed, missed - 1);
                self.fire(latest).await?;
            }
        }
        Ok(())
    }

    /// Fires `tick`: enqueues its job unless another runner did.
    async fn fire(&self, tick: DateTime<Utc>) -> Result<Fired> {
        let name = &self.name;
        let make = || {
            std::panic::catch_unwind(AssertUnwindSafe(|| (self.job)(tick)))
                .map_err(|_| tracing::error!(schedule = %name, %tick, "the job function panicked: no job for this tick"))
                .ok()
        };
        let fired = {
            let mut conn = self.pool.acquire().await?;
            self.table
                .enqueue_tick::<DB>(&mut conn, &self.ticks, name, tick, make)
                .await
        };
        let fired = match fired {
            Ok(fired) => fired,
            Err(error @ Error::Database(_)) => return Err(error),
            // A job the table refuses is refused at every tick: said, and the schedule goes on.
            Err(error) => {
                tracing::error!(schedule = %name, %tick, %error, "the tick's job was refused");
                return Ok(Fired::NoJob);
            }
        };
        let count = |counter: &AtomicU64| Counters::add(counter, 1);
        match fired {
            Fired::Enqueued(Enqueued::New(id)) => {
                tracing::debug!(schedule = %name, %tick, id, "tick: job enqueued");
                count(&self.stats.ticks_fired);
            }
            Fired::Enqueued(other) => {
                let id = other.id();
                tracing::info!(schedule = %name, %tick, id, "duplicate tick: its job is still unfinished");
                count(&self.stats.ticks_fired_elsewhere);
            }
            Fired::Already => {
                tracing::info!(schedule = %name, %tick, "duplicate tick: fired by another runner");
                count(&self.stats.ticks_fired_elsewhere);
            }
            Fired::NoJob => {}
        }
        Ok(fired)
    }
}
