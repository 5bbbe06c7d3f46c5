//! Inspection and repair for operators: how many rows a queue has in each state, and dead rows
//! brought back.

mod prune;

use std::time::Duration;

use sqlx::SqlStr;

use crate::backend::{self, Backend, Clock, Q};
use crate::dialect::{self, Args, DeadSql, DeadTarget, Names, Stmt};
use crate::error::{Error, Result};
use crate::table::{DeadLetter, Pooler, Table};

/// The query of `stmt` with `args` (unprepared behind a transaction pooler, where the backend
/// runs it in a transaction of its own).
fn query<DB: Backend>(stmt: &Stmt, args: &Args<'_>) -> Q<DB> {
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}

/// Which queue of a table to inspect or repair, as its `Queue` declares it: its group, lease
/// and attempt columns, and its dead letter.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Inspect<'a> {
    pub(crate) group: Option<&'a str>,
    pub(crate) lease: Option<&'a str>,
    pub(crate) attempt: Option<&'a str>,
    pub(crate) dead_letter: Option<&'a DeadLetter>,
}

/// How many rows a queue has in each state, from [`Queue::counts`](crate::Queue::counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Counts {
    /// Claimable now.
    pub ready: u64,
    /// How long ago the oldest ready row was created (its [`created_at`](Table::created_at),
    /// against this host's clock; zero if that time is ahead of it): the first figure to watch
    /// on a queue that falls behind. `None` when the table declares no creation time column, or
    /// when no row is ready.
    pub oldest_ready_age: Option<Duration>,
    /// Waiting for their `retry_after`.
    pub delayed: u64,
    /// Held by a live lease (the lease form; rows held by a row lock or an advisory key cannot be
    /// counted without taking locks, and count as ready).
    pub in_work: u64,
    /// In the dead letter.
    pub dead: u64,
}

impl Table {
    /// Counts `queue`'s rows on `conn` ([`Queue::counts`](crate::Queue::counts)).
    pub(crate) async fn counts_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        queue: Inspect<'_>,
    ) -> Result<Counts> {
        let (names, target) = self.resolve::<DB>(conn, queue).await?;
        let sql = dialect::inspect(&names, target.as_ref());
        let now = Clock::default().now();
        let args = Args {
            now: Some(now),
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        let (ready, oldest) = backend::fetch_ready::<DB>(conn, query(&sql.ready, &args)).await?;
        let mut count = async |stmt: Option<&crate::dialect::Stmt>| -> Result<u64> {
            let Some(stmt) = stmt else { return Ok(0) };
            let n = backend::fetch_i64::<DB>(conn, query(stmt, &args)).await?;
            Ok(n.unwrap_or(0).try_into().unwrap_or(0))
        };
        Ok(Counts {
            ready,
            oldest_ready_age: oldest.map(|at| (now - at).to_std().unwrap_or_default()),
            delayed: count(sql.delayed.as_ref()).await?,
            in_work: count(sql.in_work.as_ref()).await?,
            dead: count(sql.dead.as_ref()).await?,
        })
    }

    /// Moves `queue`'s dead rows back to it on `conn`
    /// ([`Queue::requeue_dead`](crate::Queue::requeue_dead)).
    pub(crate) async fn requeue_dead_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        queue: Inspect<'_>,
    ) -> Result<u64> {
        let (names, target) = self.resolve::<DB>(conn, queue).await?;
        if matches!(target, Some(DeadTarget::Group { .. })) && queue.group.is_none() {
            return Err(Error::declaration(
                &self.name,
                "requeue_dead from a dead-letter group needs the queue's group to return the rows \
                 to: name the queue (`.named(..)`)",
            ));
        }
        let Some(target) = target else {
            return Err(Error::declaration(
                queue.group.unwrap_or(&self.name),
                "requeue_dead needs the queue's dead letter: `.max_attempts(n).dead_letter(..)`",
            ));
        };
        let args = Args {
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        match dialect::requeue(&names, &target) {
            DeadSql::One(stmt) => Ok(DB::execute(conn, query(&stmt, &args)).await?),
            DeadSql::CopyDelete { copy, delete } => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                let copied = DB::execute(&mut tx, query(&copy, &args)).await?;
                DB::execute(&mut tx, query(&delete, &args)).await?;
                tx.commit().await?;
                Ok(copied)
            }
        }
    }

    /// The queue's quoted names and its dead letter, reading the table's columns for a
    /// dead-letter table.
    async fn resolve<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        queue: Inspect<'_>,
    ) -> Result<(Names, Option<DeadTarget>)> {
        let dialect = DB::DIALECT;
        let mut names = Names::of_table(dialect, self)?;
        names.lease = queue.lease.map(|c| dialect.quote(c)).transpose()?;
        names.attempt = queue.attempt.map(|c| dialect.quote(c)).transpose()?;
        names.one_group = names.group.is_some() && queue.group.is_some();
        let target = match queue.dead_letter {
            None => None,
            Some(DeadLetter::Group(_)) => match &names.group {
                Some(column) => Some(DeadTarget::Group {
                    column: column.clone(),
                }),
                None => {
                    return Err(Error::declaration(
                        &self.name,
                        "a group dead letter needs the table's group column",
                    ));
                }
            },
            Some(DeadLetter::Table(dead)) => {
                // The queue table's columns, which the requeue copies back.
                let quoted = dialect.quote_table(&self.name)?;
                let catalog = dialect::catalog(dialect, &self.name, &quoted)?;
                let query = backend::query::<DB>(SqlStr::from_static(catalog.sql), catalog.values)
                    .persistent(self.pooler != Pooler::Transaction);
                let columns = backend::fetch_texts::<DB, 4>(conn, query).await?;
                Some(DeadTarget::Table {
                    table: dialect.quote_table(dead)?,
                    columns: columns
                        .iter()
                        .map(|[name, ..]| dialect.quote(name))
                        .collect::<Result<_>>()?,
                })
            }
        };
        Ok((names, target))
    }
}

fn dead_group<'a>(queue: Inspect<'a>) -> Option<&'a str> {
    match queue.dead_letter {
        Some(DeadLetter::Group(group)) => Some(group),
        _ => None,
    }
}
