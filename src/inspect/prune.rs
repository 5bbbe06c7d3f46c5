//! Pruning: finished rows and dead rows deleted by age, in bounded batches.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;
use sqlx::Acquire;

use super::{Inspect, dead_group, query};
use crate::backend::driver::Driver as _;
use crate::backend::{self, Backend, Clock};
use crate::dialect::{self, Args, Names, PruneSql, Pruned};
use crate::error::{Error, Result};
use crate::table::Table;

/// The largest batch a prune deletes in one statement.
pub const MAX_PRUNE_BATCH: u32 = 10_000;

impl Table {
    /// Deletes the rows finished more than `older_than` ago — acked or dropped on a table that
    /// keeps them ([`processed_at`](Table::processed_at) set before then) — and returns how
    /// many. Rows not finished (ready, delayed, in work, dead) are never touched.
    ///
    /// It deletes `batch` rows at a time (at least 1, at most [`MAX_PRUNE_BATCH`]), each batch
    /// one short statement of its own (MySQL/MariaDB: a locking read and a delete in one short
    /// transaction), until a batch finds fewer; no statement holds more than a batch's rows, and
    /// none locks the table. Batches pass over rows another session holds (`SKIP LOCKED` on
    /// PostgreSQL and MySQL/MariaDB; SQLite runs them one writer at a time), so every process
    /// may prune at once: each deletes rows the others did not take, and a row passed over is
    /// pruned next time. Pass the pool, not a transaction (every batch would then wait for its
    /// end). The time is this host's clock; `processed_at` is written with the runner's
    /// estimate of the server's.
    ///
    /// The batches find their rows by `processed_at`: on a large table, an index on it (partial
    /// on finished rows where the database has partial indexes) keeps each batch from reading
    /// the table up to its rows.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> sqlx_queue::Result<()> {
    /// use std::time::Duration;
    /// use sqlx_queue::Table;
    ///
    /// let jobs = Table::new("signup_jobs").processed_at("processed_at");
    /// let week = Duration::from_secs(7 * 24 * 3600);
    /// let deleted = jobs.prune(&pool, week, 1000).await?;
    /// # let _ = deleted;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Declaration`] for a table without a `processed_at` column (it deletes finished
    /// rows: nothing else marks them), [`Error::Identifier`], [`Error::Database`] (the rows of
    /// the batches before it are deleted).
    pub fn prune<'e, 'c: 'e, A>(
        &'e self,
        conn: A,
        older_than: Duration,
        batch: u32,
    ) -> BoxFuture<'e, Result<u64>>
    where
        A: Acquire<'c> + Send + 'e,
        A::Database: Backend,
    {
        // Boxed, as `cancel`'s: an opaque future generic over the connection's lifetimes is not
        // seen `Send` in general (rust-lang/rust#100013).
        Box::pin(self.prune_in(conn, older_than, batch))
    }

    async fn prune_in<'c, A>(&self, conn: A, older_than: Duration, batch: u32) -> Result<u64>
    where
        A: Acquire<'c>,
        A::Database: Backend,
    {
        let mut conn = conn.acquire().await?;
        let names = Names::of_table(A::Database::DIALECT, self)?;
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let sql = dialect::prune(&names, Pruned::Finished, batch as usize)
            .map_err(|reason| Error::declaration(&self.name, reason))?;
        let Some(before) = cutoff(older_than) else {
            return Ok(0);
        };
        let args = Args {
            at: Some(before),
            ..Args::default()
        };
        in_batches::<A::Database>(&mut conn, &sql, args, batch).await
    }

    /// Deletes the dead rows of a queue (from its dead-letter group, or of its group in its
    /// dead-letter table: [`Inspect::dead_letter`]) created more than `older_than` ago, in
    /// batches, as [`prune`](Table::prune) does, and returns how many. A dead row is dated by
    /// the table's [`created_at`](Table::created_at) column, the time its job was enqueued (a
    /// move to the dead letter keeps every column as it was, and marks no time): a row is
    /// pruned once its job is older than `older_than`, however recently it died.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> sqlx_queue::Result<()> {
    /// use std::time::Duration;
    /// use sqlx_queue::{DeadLetter, Inspect, Table};
    ///
    /// let jobs = Table::new("jobs").group("queue").created_at("created_at");
    /// let dead = DeadLetter::group("signups_dead");
    /// let signups = Inspect::queue().group("signups").dead_letter(&dead);
    /// let month = Duration::from_secs(30 * 24 * 3600);
    /// let deleted = jobs.prune_dead(&pool, signups, month, 1000).await?;
    /// # let _ = deleted;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Declaration`] when `queue` has no dead letter, or the table no `created_at`
    /// column; otherwise as [`prune`](Table::prune).
    pub fn prune_dead<'e, 'c: 'e, A>(
        &'e self,
        conn: A,
        queue: Inspect<'e>,
        older_than: Duration,
        batch: u32,
    ) -> BoxFuture<'e, Result<u64>>
    where
        A: Acquire<'c> + Send + 'e,
        A::Database: Backend,
    {
        // Boxed, as `cancel`'s: an opaque future generic over the connection's lifetimes is not
        // seen `Send` in general (rust-lang/rust#100013).
        Box::pin(self.prune_dead_in(conn, queue, older_than, batch))
    }

    async fn prune_dead_in<'c, A>(
        &self,
        conn: A,
        queue: Inspect<'_>,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64>
    where
        A: Acquire<'c>,
        A::Database: Backend,
    {
        let mut conn = conn.acquire().await?;
        let (names, target) = self.resolve::<A::Database>(&mut conn, queue).await?;
        let Some(target) = target else {
            return Err(Error::declaration(
                queue.group.unwrap_or(&self.name),
                "prune_dead needs the queue's dead letter: `Inspect::dead_letter(..)`",
            ));
        };
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let sql = dialect::prune(&names, Pruned::Dead(&target), batch as usize)
            .map_err(|reason| Error::declaration(&self.name, reason))?;
        let Some(before) = cutoff(older_than) else {
            return Ok(0);
        };
        let args = Args {
            at: Some(before),
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        in_batches::<A::Database>(&mut conn, &sql, args, batch).await
    }
}

/// `older_than` before now; `None` when that is before any time a row can have.
fn cutoff(older_than: Duration) -> Option<DateTime<Utc>> {
    let ago = TimeDelta::from_std(older_than).ok()?;
    Clock::default().now().checked_sub_signed(ago)
}

/// Runs `sql`'s batches until one deletes fewer than `batch` rows; how many it deleted.
async fn in_batches<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &PruneSql,
    args: Args<'_>,
    batch: u32,
) -> Result<u64> {
    let args = Args {
        limit: i64::from(batch),
        ..args
    };
    let mut deleted = 0;
    loop {
        let n = match sql {
            PruneSql::One(stmt) => DB::execute(conn, query(stmt, &args)).await?,
            PruneSql::SelectThenDelete {
                begin,
                select,
                delete,
            } => {
                let mut tx = sqlx::Connection::begin_with(&mut *conn, *begin).await?;
                let ids = backend::fetch_i64s::<DB>(&mut tx, query(select, &args)).await?;
                if !ids.is_empty() {
                    let args = Args { ids: &ids, ..args };
                    DB::execute(&mut tx, query(delete.for_len(ids.len()), &args)).await?;
                }
                tx.commit().await?;
                ids.len() as u64
            }
        };
        deleted += n;
        if n < u64::from(batch) {
            return Ok(deleted);
        }
    }
}
