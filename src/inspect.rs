//! Inspection and repair for operators: how many rows a queue has in each state, and dead rows
//! brought back.

mod prune;

pub use prune::MAX_PRUNE_BATCH;

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::Acquire;

use sqlx::SqlStr;

use crate::backend::driver::Driver as _;
use crate::backend::{self, Backend, Clock, Q};
use crate::dialect::{self, Args, DeadSql, DeadTarget, Names, Stmt};
use crate::error::{Error, Result};
use crate::table::{DeadLetter, Pooler, Table};

/// The query of `stmt` with `args` (unprepared behind a transaction pooler, where the backend
/// runs it in a transaction of its own).
fn query<DB: Backend>(stmt: &Stmt, args: &Args<'_>) -> Q<DB> {
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}

/// Which queue of a table to inspect or repair: its group, lease and attempt columns, and its
/// dead letter — what its `Queue` declares.
///
/// # Examples
///
/// ```
/// use sqlx_queue::{DeadLetter, Inspect};
///
/// let dead = DeadLetter::group("signups_dead");
/// let signups = Inspect::queue().group("signups").lease("locked_until").attempt("attempt")
///     .dead_letter(&dead);
/// # let _ = signups;
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use]
pub struct Inspect<'a> {
    group: Option<&'a str>,
    lease: Option<&'a str>,
    attempt: Option<&'a str>,
    dead_letter: Option<&'a DeadLetter>,
}

impl<'a> Inspect<'a> {
    /// A queue of the whole table (no group), without a lease, attempt column or dead letter.
    pub fn queue() -> Self {
        Inspect::default()
    }

    /// The queue's group value (its `named` value).
    pub fn group(mut self, group: &'a str) -> Self {
        self.group = Some(group);
        self
    }

    /// The queue's lease column (the lease form): live leases count as in work.
    pub fn lease(mut self, column: &'a str) -> Self {
        self.lease = Some(column);
        self
    }

    /// The queue's attempt column: re-queued rows start again at attempt 1.
    pub fn attempt(mut self, column: &'a str) -> Self {
        self.attempt = Some(column);
        self
    }

    /// The queue's dead letter.
    pub fn dead_letter(mut self, dead_letter: &'a DeadLetter) -> Self {
        self.dead_letter = Some(dead_letter);
        self
    }
}

/// How many rows a queue has in each state, from [`Table::counts`].
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
    /// Counts a queue's rows: ready, delayed, in work (live leases) and dead; and the age of the
    /// oldest ready row, where the table has a [`created_at`](Table::created_at) column (read
    /// by the same statement as the ready rows, through the claim's index).
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`] for a name that cannot be quoted, [`Error::Declaration`] for a group
    /// dead letter on a table without a group column, [`Error::Database`].
    pub fn counts<'e, 'c: 'e, A>(
        &'e self,
        conn: A,
        queue: Inspect<'e>,
    ) -> BoxFuture<'e, Result<Counts>>
    where
        A: Acquire<'c> + Send + 'e,
        A::Database: Backend,
    {
        // Boxed, as `cancel`'s: an opaque future generic over the connection's lifetimes is not
        // seen `Send` in general (rust-lang/rust#100013).
        Box::pin(self.counts_in(conn, queue))
    }

    async fn counts_in<'c, A>(&self, conn: A, queue: Inspect<'_>) -> Result<Counts>
    where
        A: Acquire<'c>,
        A::Database: Backend,
    {
        let mut conn = conn.acquire().await?;
        let (names, target) = self.resolve::<A::Database>(&mut conn, queue).await?;
        let sql = dialect::inspect(&names, target.as_ref());
        let now = Clock::default().now();
        let args = Args {
            now: Some(now),
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        let (ready, oldest) =
            backend::fetch_ready::<A::Database>(&mut conn, query(&sql.ready, &args)).await?;
        let mut count = async |stmt: Option<&crate::dialect::Stmt>| -> Result<u64> {
            let Some(stmt) = stmt else { return Ok(0) };
            let n = backend::fetch_i64::<A::Database>(&mut conn, query(stmt, &args)).await?;
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

    /// Moves every dead row of a queue back to it — from its dead-letter group, or out of its
    /// dead-letter table — with its attempt reset to 1 and no delay, and returns how many. One
    /// statement, except a dead-letter table on MySQL/MariaDB and SQLite: a copy and a delete in
    /// one transaction.
    ///
    /// # Errors
    ///
    /// As [`counts`](Table::counts); [`Error::Declaration`] when `queue` has no dead letter.
    pub fn requeue_dead<'e, 'c: 'e, A>(
        &'e self,
        conn: A,
        queue: Inspect<'e>,
    ) -> BoxFuture<'e, Result<u64>>
    where
        A: Acquire<'c> + Send + 'e,
        A::Database: Backend,
    {
        // Boxed, as `cancel`'s: an opaque future generic over the connection's lifetimes is not
        // seen `Send` in general (rust-lang/rust#100013).
        Box::pin(self.requeue_dead_in(conn, queue))
    }

    async fn requeue_dead_in<'c, A>(&self, conn: A, queue: Inspect<'_>) -> Result<u64>
    where
        A: Acquire<'c>,
        A::Database: Backend,
    {
        let mut conn = conn.acquire().await?;
        let (names, target) = self.resolve::<A::Database>(&mut conn, queue).await?;
        if matches!(target, Some(DeadTarget::Group { .. })) && queue.group.is_none() {
            return Err(Error::declaration(
                &self.name,
                "requeue_dead from a dead-letter group needs the queue's group to return the rows \
                 to: `Inspect::group(..)`",
            ));
        }
        let Some(target) = target else {
            return Err(Error::declaration(
                queue.group.unwrap_or(&self.name),
                "requeue_dead needs the queue's dead letter: `Inspect::dead_letter(..)`",
            ));
        };
        let args = Args {
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        match dialect::requeue(&names, &target) {
            DeadSql::One(stmt) => Ok(A::Database::execute(&mut conn, query(&stmt, &args)).await?),
            DeadSql::CopyDelete { copy, delete } => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                let copied = A::Database::execute(&mut tx, query(&copy, &args)).await?;
                A::Database::execute(&mut tx, query(&delete, &args)).await?;
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
