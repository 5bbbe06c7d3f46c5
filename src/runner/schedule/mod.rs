//! Periodic jobs: a [`Schedule`] says when its ticks fall, and each runner that carries it
//! enqueues the job of each tick through the Enqueue layer's `enqueue_tick`, which keeps a tick
//! to one job however many runners reach it (a compare-and-set on the schedules table's row, in
//! the enqueue's transaction). The ticks' times are here; when a runner fires them, and what it
//! does with ticks it missed, is `run`; the checks and the first look at the schedules table at
//! start are `start`; cron expressions (the `cron` feature) are `cron`.

#[cfg(feature = "cron")]
mod cron;
mod run;
mod start;
#[cfg(test)]
mod tests;

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{Runner, Running};
use crate::backend::Backend;
use crate::enqueue::Job;
use crate::table::Table;

pub(super) use start::{Scheduled, Started};

/// The schedules table's name when [`Runner::schedules_table`] does not name one.
pub(crate) const DEFAULT_SCHEDULES_TABLE: &str = "sqlx_queue_schedules";

/// When a periodic job's ticks fall: every fixed period ([`Schedule::every`]) or by a cron
/// expression ([`Schedule::cron`], the `cron` feature), and what a runner does with ticks that
/// passed while no runner of the schedule ran ([`Missed`]). Mounted with [`Runner::schedule`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::{Missed, Schedule};
///
/// let heartbeat = Schedule::every(Duration::from_secs(60));
/// let tick = "2026-03-29T00:00:30Z".parse().unwrap();
/// assert_eq!(heartbeat.next_after(tick), "2026-03-29T00:01:00Z".parse().ok());
/// let report = Schedule::every(Duration::from_secs(3600)).missed(Missed::CatchUp);
/// assert_eq!(report.on_missed(), Missed::CatchUp);
/// ```
#[derive(Clone)]
#[must_use = "a schedule does nothing until a runner carries it: `Runner::schedule`"]
pub struct Schedule {
    ticks: Ticks,
    missed: Missed,
}

/// How a schedule's ticks are computed.
#[derive(Clone)]
enum Ticks {
    /// Every `n` microseconds, counted from the Unix epoch.
    Every(i64),
    #[cfg(feature = "cron")]
    Cron(Box<cron::Cron>),
}

/// What a runner does with the ticks of a schedule that passed while no runner of it ran (or
/// while it could not keep up: stopped, paused, stalled past the next tick).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Missed {
    /// Enqueue nothing for them: the schedule goes on with the next tick (the default).
    #[default]
    Skip,
    /// Enqueue the most recent of them, once, as soon as a runner finds them missed; the
    /// others are skipped.
    CatchUp,
}

impl Schedule {
    /// A tick every `period`, at the multiples of `period` since the Unix epoch: every runner
    /// computes the same ticks without talking to the others. `every(Duration::from_secs(60))`
    /// ticks at each whole minute, `every(Duration::from_secs(3600))` on the hour (UTC); for
    /// times of a day in a time zone use [`Schedule::cron_in`].
    ///
    /// # Panics
    ///
    /// `period` is less than a millisecond, or more than 100 years.
    #[track_caller]
    pub fn every(period: Duration) -> Schedule {
        const CENTURY: Duration = Duration::from_secs(100 * 366 * 86_400);
        assert!(
            period >= Duration::from_millis(1) && period <= CENTURY,
            "Schedule::every takes a period of at least a millisecond and at most 100 years, \
             not {period:?}"
        );
        let micros = i64::try_from(period.as_micros()).expect("at most 100 years");
        Schedule {
            ticks: Ticks::Every(micros),
            missed: Missed::Skip,
        }
    }

    /// What a runner does with ticks missed while no runner of the schedule ran (default
    /// [`Missed::Skip`]).
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// The policy for missed ticks.
    pub fn on_missed(&self) -> Missed {
        self.missed
    }

    /// The schedule's first tick after `time`, if it has one.
    pub fn next_after(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Every(period) => {
                let micros = time.timestamp_micros();
                let next = micros
                    .div_euclid(*period)
                    .checked_add(1)?
                    .checked_mul(*period)?;
                DateTime::from_timestamp_micros(next)
            }
            #[cfg(feature = "cron")]
            Ticks::Cron(cron) => cron.next_after(time),
        }
    }

    /// The schedule's last tick at or before `time`, if it has one.
    pub fn last_until(&self, time: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.ticks {
            Ticks::Every(period) => {
                let last = time
                    .timestamp_micros()
                    .div_euclid(*period)
                    .checked_mul(*period)?;
                DateTime::from_timestamp_micros(last)
            }
            #[cfg(feature = "cron")]
            Ticks::Cron(cron) => cron.last_until(time),
        }
    }

    /// How many ticks fall after `after` and before `before` (both excluded), counting at most
    /// `cap`.
    fn between(&self, after: DateTime<Utc>, before: DateTime<Utc>, cap: u64) -> u64 {
        match &self.ticks {
            Ticks::Every(period) => {
                let first = after.timestamp_micros().div_euclid(*period) + 1;
                let last = (before.timestamp_micros() - 1).div_euclid(*period);
                u64::try_from(last - first + 1).unwrap_or(0).min(cap)
            }
            #[cfg(feature = "cron")]
            Ticks::Cron(_) => {
                let (mut n, mut at) = (0, after);
                while n < cap {
                    match self.next_after(at) {
                        Some(next) if next < before => (n, at) = (n + 1, next),
                        _ => break,
                    }
                }
                n
            }
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("Schedule");
        match &self.ticks {
            Ticks::Every(micros) => s.field("every", &TimeDelta::microseconds(*micros)),
            #[cfg(feature = "cron")]
            Ticks::Cron(cron) => s.field("cron", cron),
        };
        s.field("missed", &self.missed).finish()
    }
}

impl<DB: Backend> Runner<DB> {
    /// Carries a periodic job: at each tick of `schedule`, enqueues the job `job` builds for the
    /// tick's time into `table`, which needs a [unique key column](Table::unique_key). Any
    /// number of runners, in any number of processes, may carry the same schedule (by `name`):
    /// each tick makes one job, enqueued by the first runner to reach it, with the unique key
    /// `name@tick` (`nightly@2026-03-29T01:00:00Z`). The schedules table
    /// ([`schedules_table`](Runner::schedules_table)) records each schedule's last tick.
    ///
    /// `job` is called once per tick, by the runner that fires it, inside the tick's
    /// transaction: keep it quick and free of side effects. One that panics leaves the tick
    /// without a job (logged at error), as a job the table refuses does.
    ///
    /// A name that cannot be a schedule's (empty, longer than 200 characters, with a NUL
    /// character) or that the runner carries twice is refused by [`start`](Runner::start), as a
    /// table without a unique key column is.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use std::time::Duration;
    /// use sqlx_queue::{Job, Missed, Runner, Schedule, Table};
    ///
    /// let jobs = Table::new("jobs").unique_key("dedupe");
    /// let every_minute = Schedule::every(Duration::from_secs(60)).missed(Missed::CatchUp);
    /// let running = Runner::new(pool)
    ///     .schedule("cleanup", every_minute, jobs, |tick| {
    ///         Job::from_vec(format!("clean up until {tick}").into_bytes())
    ///     })
    ///     .start()
    ///     .await?;
    /// println!("next cleanup at {:?}", running.next_tick("cleanup"));
    /// # Ok(())
    /// # }
    /// ```
    pub fn schedule<F>(
        mut self,
        name: impl Into<String>,
        schedule: Schedule,
        table: Table,
        job: F,
    ) -> Self
    where
        F: Fn(DateTime<Utc>) -> Job<'static> + Send + Sync + 'static,
    {
        self.schedules
            .push(Scheduled::new(name.into(), schedule, table, job));
        self
    }

    /// The table where this runner's schedules record their last tick (default
    /// `sqlx_queue_schedules`): `name` a text primary key,
    /// `last_tick` a time, as the guide's [periodic jobs](crate::guide::periodic) shows. Every runner of a schedule
    /// must name the same table.
    pub fn schedules_table(mut self, table: impl Into<String>) -> Self {
        self.schedules_table = table.into();
        self
    }
}

impl Running {
    /// The next tick of schedule `name` this runner waits for; `None` for a name the runner does
    /// not carry, or a schedule without another tick.
    pub fn next_tick(&self, name: &str) -> Option<DateTime<Utc>> {
        self.schedules.next_tick(name)
    }
}
