//! A runner's schedules from [`Runner::schedule`](crate::Runner::schedule) to their loops: the
//! checks at start (names, the schedules table, each schedule's job table), the first look at
//! each schedule's row (the ticks missed while no runner of it ran), and what `Running` keeps of
//! them: the next tick of each, and the tasks that shutdown waits for.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;

use super::Schedule;
use super::run::{JobFn, Loop, NextTick};
use crate::backend::{self, Backend, Clock};
use crate::enqueue::{Job, Ticks};
use crate::error::{Error, Result};
use crate::runner::Runner;
use crate::runner::queue::Shared;
use crate::table::{Pooler, Table};

/// The longest name a schedule takes: its jobs' unique key is the name and a tick time (up to 33
/// characters) after an `@`.
const MAX_NAME: usize = 200;

/// A schedule a runner carries, waiting for the runner to start.
pub(in crate::runner) struct Scheduled {
    name: String,
    schedule: Schedule,
    table: Table,
    job: JobFn,
}

impl Scheduled {
    pub(in crate::runner) fn new<F>(name: String, schedule: Schedule, table: Table, job: F) -> Self
    where
        F: Fn(DateTime<Utc>) -> Job<'static> + Send + Sync + 'static,
    {
        Scheduled {
            name,
            schedule,
            table,
            job: Arc::new(job),
        }
    }

    pub(in crate::runner) fn label(&self) -> String {
        format!("schedule `{}`", self.name)
    }

    /// The table its jobs go into.
    pub(in crate::runner) fn table(&self) -> &Table {
        &self.table
    }
}

impl<DB: Backend> Runner<DB> {
    /// Refuses schedules that cannot work — a name that cannot be a schedule's or that the
    /// runner carries twice — and checks the schedules table and each schedule's job table on
    /// the database: the statements a tick runs are prepared, so a missing table or column is an
    /// [`Error::Schema`] at start. The schedules table's statements (`None` without schedules).
    pub(in crate::runner) async fn check_schedules(&mut self) -> Result<Option<Ticks>> {
        check_names(&self.schedules)?;
        let Some(first) = self.schedules.first().map(Scheduled::label) else {
            return Ok(None);
        };
        let pooled = self.pooler == Pooler::Transaction;
        let ticks = Ticks::new(DB::DIALECT, &self.schedules_table, pooled)?;
        let mut conn = self.pool.acquire().await?;
        // Behind a transaction pooler the checks run in one transaction, on one server session.
        if pooled {
            backend::pin_checks::<DB>(&mut conn).await?;
        }
        let checked = async {
            ticks.check::<DB>(&mut conn, &first).await?;
            for s in &self.schedules {
                s.table.check_ticks::<DB>(&mut conn, &s.label()).await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if pooled {
            backend::unpin_checks::<DB>(conn, checked.is_ok()).await?;
        }
        checked.map(|()| Some(ticks))
    }
}

fn check_names(schedules: &[Scheduled]) -> Result<()> {
    for (i, s) in schedules.iter().enumerate() {
        let name = &s.name;
        let reason = if name.is_empty() {
            "a schedule needs a name"
        } else if name.chars().count() > MAX_NAME {
            "a schedule's name is at most 200 characters (its jobs' unique key adds a tick time)"
        } else if name.contains('\0') {
            "a schedule's name cannot hold a NUL character"
        } else if schedules[..i].iter().any(|other| other.name == *name) {
            "the runner carries two schedules of this name: a name is one schedule"
        } else {
            continue;
        };
        return Err(Error::declaration(&s.label(), reason));
    }
    Ok(())
}

/// A runner's started schedules: the next tick of each, and their loops.
#[derive(Debug, Default)]
pub(in crate::runner) struct Started {
    next: Vec<(String, NextTick)>,
    tasks: Vec<JoinHandle<()>>,
}

impl Started {
    /// Looks at each schedule's row (inserting it for a new schedule) and deals with the ticks
    /// missed while no runner of it ran, by its policy; then starts its loop.
    pub(in crate::runner) async fn start<DB: Backend>(
        schedules: Vec<Scheduled>,
        ticks: Option<Ticks>,
        shared: &Shared<DB>,
        clock: &Clock,
    ) -> Result<Started> {
        let Some(ticks) = ticks else {
            return Ok(Started::default());
        };
        let ticks = Arc::new(ticks);
        let mut loops = Vec::with_capacity(schedules.len());
        for s in schedules {
            let next = Arc::new(Mutex::new(None));
            let each = Loop {
                pool: shared.pool.clone(),
                name: s.name.as_str().into(),
                schedule: s.schedule,
                table: s.table,
                job: s.job,
                ticks: Arc::clone(&ticks),
                clock: clock.clone(),
                stats: Arc::clone(&shared.stats),
                next: Arc::clone(&next),
            };
            let from = each.begin().await?;
            *next.lock().unwrap_or_else(|e| e.into_inner()) = each.schedule.next_after(from);
            loops.push((s.name, next, each, from));
        }
        let mut started = Started::default();
        for (name, next, each, from) in loops {
            let (stop, abort) = (shared.stop.clone(), shared.abort.clone());
            started
                .tasks
                .push(tokio::spawn(each.run(from, stop, abort)));
            started.next.push((name, next));
        }
        Ok(started)
    }

    pub(in crate::runner) fn next_tick(&self, name: &str) -> Option<DateTime<Utc>> {
        let (_, next) = self.next.iter().find(|(n, _)| n == name)?;
        *next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for the loops, which end at the runner's stop (a tick in work is finished, or
    /// rolled back at the shutdown timeout).
    pub(in crate::runner) async fn stopped(&mut self) {
        for task in self.tasks.drain(..) {
            if let Err(error) = task.await {
                tracing::error!(%error, "a schedule's task failed");
            }
        }
    }

    pub(in crate::runner) fn names(&self) -> Vec<&str> {
        self.next.iter().map(|(name, _)| name.as_str()).collect()
    }
}
