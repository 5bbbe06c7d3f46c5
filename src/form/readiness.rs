//! A queue's depth as its runner reports it (`metrics`): the rows claimable now and how long ago
//! the oldest of them was created, read by one statement through the claim's index.

use std::sync::Arc;
use std::time::Duration;

use sqlx::Pool;

use super::Checked;
use crate::backend::{self, Backend, Clock};
use crate::dialect::{self, Args, Stmt};
use crate::error::Result;

/// What one reading found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub(crate) ready: u64,
    /// The oldest ready row's age (`None` without a creation time column, or without a ready
    /// row).
    pub(crate) oldest_age: Option<Duration>,
}

/// The statement that reads a queue's depth, and what it binds.
#[derive(Debug)]
pub(crate) struct Readiness<DB: Backend> {
    pool: Pool<DB>,
    stmt: Stmt,
    group: Option<Arc<str>>,
    clock: Clock,
    ages: bool,
}

impl<DB: Backend> Readiness<DB> {
    /// The depth of `checked`'s queue, read on `pool`: its rows claimable now, whatever their
    /// FIFO group (every row that is due and not in work).
    pub(crate) fn new(pool: &Pool<DB>, checked: &Checked) -> Self {
        let mut names = checked.names.clone();
        names.fifo = None;
        Readiness {
            pool: pool.clone(),
            stmt: dialect::ready(&names),
            group: checked.group.clone(),
            clock: checked.clock.clone(),
            ages: names.created_at.is_some(),
        }
    }

    /// Whether a reading has the oldest row's age (the table has a creation time column).
    pub(crate) fn ages(&self) -> bool {
        self.ages
    }

    /// Reads the depth now.
    pub(crate) async fn read(&self) -> Result<Reading> {
        let now = self.clock.now();
        let args = Args {
            now: Some(now),
            group: self.group.as_deref(),
            ..Args::default()
        };
        let query = backend::query::<DB>(self.stmt.sql(), self.stmt.values(&args))
            .persistent(!self.stmt.unprepared);
        let mut conn = self.pool.acquire().await?;
        let (ready, oldest) = backend::fetch_ready::<DB>(&mut conn, query).await?;
        Ok(Reading {
            ready,
            oldest_age: oldest.map(|at| (now - at).to_std().unwrap_or_default()),
        })
    }
}
