//! The calls on a declared queue — enqueue, cancel, counts, repair — read what the queue
//! declares: its table, its group (`named`), its claim form (which tells a job in work), its
//! attempt column and its dead letter. Each is stated once, in the chain; a handler is not
//! needed (a producer declares the queue it enqueues into without one), and a queue is `Clone`,
//! so the one declaration serves the runner (`.clone().handler(f)`) and the calls.
//!
//! Every call takes the same kind of connection — `&pool`, `&mut *tx` (the caller's
//! transaction: the call commits, or not, with it) or `&mut conn` — and returns a boxed `Send`
//! future; a bulk call answers per job, as the single call does.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::Acquire;

use super::Queue;
use super::state::{AttemptState, CapState, FormState, HasDeadLetter, KnowsItsForm, UniqueForm};
use crate::backend::Backend;
use crate::enqueue::{Cancellation, Enqueued, Job, UniqueJob};
use crate::error::Result;
use crate::inspect::{Counts, Inspect};
use crate::table::Table;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H>
where
    F: FormState,
    A: AttemptState,
    C: CapState,
{
    /// Enqueues `job` into this queue, returning its id: inserted into the queue's table, in the
    /// queue's group (a job of a named queue needs none; one naming another group is an
    /// [`Error::InvalidJob`](crate::Error::InvalidJob)). Pass the caller's transaction
    /// (`&mut *tx`) to make the job commit with the data it serves, a connection, or a pool.
    /// Queues of the table and group running in this process are woken at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn signup(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx_queue::{Job, Queue, Table};
    ///
    /// let signups = Queue::table(Table::new("signup_jobs")).lease("locked_until");
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO accounts (email) VALUES ('alice@example.com')")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// signups.enqueue(&mut *tx, Job::new("alice@example.com")).await?;
    /// tx.commit().await?; // the account and its job commit together
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`](crate::Error::Identifier) for a name that cannot be quoted (on
    /// MySQL/MariaDB, also one with a character beyond the Basic Multilingual Plane);
    /// [`Error::InvalidJob`](crate::Error::InvalidJob) for a job the table cannot hold (no
    /// group on a table with a group column, a group, a delay or headers the table has no
    /// column for, a header with a NUL character, another group than the queue's);
    /// [`Error::PayloadTooLarge`](crate::Error::PayloadTooLarge) for a statement larger than
    /// MySQL/MariaDB's `max_allowed_packet`; [`Error::Schema`](crate::Error::Schema) for a
    /// SQLite table qualified by a name that is not an attached database;
    /// [`Error::IdOutOfRange`](crate::Error::IdOutOfRange) for a MySQL/MariaDB id beyond `i64`
    /// (the job was inserted); [`Error::Database`](crate::Error::Database).
    pub fn enqueue<'e, 'c: 'e, DB, X>(&'e self, conn: X, job: Job<'e>) -> BoxFuture<'e, Result<i64>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
    {
        // What the future needs of the queue, taken here: a queue with a handler need not be
        // `Sync`.
        let (table, job) = (&self.table, self.in_group(job));
        Box::pin(async move {
            let job = job?;
            let mut conn = conn.acquire().await?;
            table.enqueue_on::<DB>(&mut conn, job).await
        })
    }

    /// Enqueues many jobs into this queue with one statement, returning their ids in order. One
    /// statement binds at most 30,000 values — a value per job for its payload, and one for each
    /// of its group, `retry_after`, priority and headers columns the table has:
    /// [`max_batch`](Queue::max_batch) jobs. Call it once per slice of a longer list, inside one
    /// transaction to commit them together.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Queue::enqueue), for any of the jobs (`PayloadTooLarge` for the
    /// statement's bytes together); [`Error::InvalidJob`](crate::Error::InvalidJob) for more
    /// jobs than one statement takes. Nothing is inserted then.
    pub fn enqueue_many<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        jobs: &'e [Job<'_>],
    ) -> BoxFuture<'e, Result<Vec<i64>>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
    {
        let table = &self.table;
        let jobs = jobs
            .iter()
            .map(|job| self.in_group(job.clone()))
            .collect::<Result<Vec<_>>>();
        Box::pin(async move {
            let jobs = jobs?;
            let mut conn = conn.acquire().await?;
            table.enqueue_many_on::<DB>(&mut conn, &jobs).await
        })
    }

    /// Inserts a unique job unless an unfinished job of the queue's table holds its key, and says
    /// what happened: skip (the default), replace or debounce (see [`UniqueJob`]). A replace or
    /// debounce leaves a job in work alone: the queue's claim form says which are. Pass the
    /// caller's transaction (`&mut *tx`) to make the job commit with the data it serves (a
    /// rollback leaves the key free), or a pool: there it runs in a transaction of the crate's
    /// own, run again when the database ends it for a deadlock or a serialization failure
    /// (inside the caller's transaction such an error is the caller's to retry).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx_queue::{Enqueued, Job, Queue, Table};
    ///
    /// // CREATE TABLE jobs (.., dedupe TEXT UNIQUE)
    /// let jobs = Queue::table(Table::new("jobs").unique_key("dedupe")).lease("locked_until");
    /// match jobs.enqueue_unique(&pool, Job::new("hi").unique("welcome:42")).await? {
    ///     Enqueued::New(id) => println!("queued {id}"),
    ///     other => println!("already queued: {}", other.id()),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Queue::enqueue); [`Error::InvalidJob`](crate::Error::InvalidJob) on a
    /// table without a unique key column, or a debounce without `retry_after` and `created_at`
    /// columns; [`Error::UniqueKeyHidden`](crate::Error::UniqueKeyHidden) when the key's row
    /// stays out of the caller's transaction's sight.
    pub fn enqueue_unique<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        job: UniqueJob<'e>,
    ) -> BoxFuture<'e, Result<Enqueued>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        F: UniqueForm,
    {
        let (table, job) = (self.jobs_table(), self.unique_in_group(job));
        Box::pin(async move {
            let job = job?;
            let mut conn = conn.acquire().await?;
            let done = table
                .many_unique_on::<DB>(&mut conn, std::slice::from_ref(&job))
                .await?;
            Ok(done[0])
        })
    }

    /// Enqueues many unique jobs, each by its own policy, in order (a key given twice meets the
    /// job the first made), returning what happened to each. Jobs whose keys are free take one
    /// insert together (at most [`max_batch`](Queue::max_batch)); the others a read of the rows
    /// that hold their keys, and one update each for a replace or debounce. On a pool the call
    /// is one transaction: an error leaves none of its jobs.
    ///
    /// # Errors
    ///
    /// As [`enqueue_unique`](Queue::enqueue_unique) and [`enqueue_many`](Queue::enqueue_many).
    pub fn enqueue_many_unique<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        jobs: &'e [UniqueJob<'_>],
    ) -> BoxFuture<'e, Result<Vec<Enqueued>>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        F: UniqueForm,
    {
        let table = self.jobs_table();
        let jobs = jobs
            .iter()
            .map(|job| self.unique_in_group(job.clone()))
            .collect::<Result<Vec<_>>>();
        Box::pin(async move {
            let jobs = jobs?;
            let mut conn = conn.acquire().await?;
            table.many_unique_on::<DB>(&mut conn, &jobs).await
        })
    }

    /// Cancels job `id` of this queue: removes it at once if it is not in work, else tells its
    /// runner (see [`Cancellation`]). The queue's claim form says how a job in work is held: a
    /// live lease (the lease form), or a row lock claim and an advisory key, which get a request
    /// where the table declares a [cancel requests' table](Table::cancel_requests) (passed
    /// over: the cancellation never waits for either). Pass a pool, a connection, or the caller's
    /// transaction (`&mut *tx`): the cancellation then commits, or not, with it.
    ///
    /// The cancellation inserts its request before it tries the row, and a settlement that
    /// would commit anything but the row's removal reserves the request for itself first: each
    /// waits for the other's commit, so a `Requested` answer holds (a cancellation inside your
    /// transaction keeps that job's settlement waiting until you commit). On a pool it is a
    /// transaction of the crate's own, run again when the database ends it for a deadlock.
    ///
    /// On SQLite, and on MySQL/MariaDB's advisory form, inside the caller's transaction the
    /// row's key is the cancellation's until its own savepoint ends, not until the caller
    /// commits: an advisory runner whose queue counts no attempts may claim the row in between,
    /// and the handler would find the row gone at its settlement. Cancel on a pool or a
    /// connection there, or commit at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx_queue::{Cancellation, Queue, Table};
    ///
    /// let jobs = Queue::table(Table::new("jobs")).lease("locked_until");
    /// match jobs.cancel(&pool, 42).await? {
    ///     Cancellation::Cancelled(id) => println!("job {id} will not run"),
    ///     Cancellation::Requested(id) => println!("job {id} is running; its handler is told"),
    ///     Cancellation::NotFound => println!("finished already (or never queued)"),
    ///     _ => {}
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`](crate::Error::Identifier) for a name that cannot be quoted;
    /// [`Error::Database`](crate::Error::Database).
    pub fn cancel<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        id: i64,
    ) -> BoxFuture<'e, Result<Cancellation>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        F: KnowsItsForm,
    {
        let table = self.jobs_table();
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table.cancel_on_conn::<DB>(&mut conn, id).await
        })
    }

    /// Cancels the unfinished job of this queue's table that holds unique key `key` (see
    /// [`cancel`](Queue::cancel)); [`Cancellation::NotFound`] when no unfinished job holds it.
    ///
    /// # Errors
    ///
    /// As [`cancel`](Queue::cancel); [`Error::InvalidJob`](crate::Error::InvalidJob) on a table
    /// without a [unique key column](Table::unique_key).
    pub fn cancel_unique<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        key: &'e str,
    ) -> BoxFuture<'e, Result<Cancellation>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        F: KnowsItsForm,
    {
        let table = self.jobs_table();
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table.cancel_unique_on_conn::<DB>(&mut conn, key).await
        })
    }

    /// Counts this queue's rows: ready, delayed, in work (live leases, on the lease form) and
    /// dead; and the age of the oldest ready row, where the table has a
    /// [`created_at`](Table::created_at) column (read by the same statement as the ready rows,
    /// through the claim's index).
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`](crate::Error::Identifier) for a name that cannot be quoted,
    /// [`Error::Declaration`](crate::Error::Declaration) for a group dead letter on a table
    /// without a group column, [`Error::Database`](crate::Error::Database).
    pub fn counts<'e, 'c: 'e, DB, X>(&'e self, conn: X) -> BoxFuture<'e, Result<Counts>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
    {
        let (table, queue) = (&self.table, self.inspect());
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table.counts_on::<DB>(&mut conn, queue).await
        })
    }

    /// Moves every dead row of this queue back to it — from its dead-letter group, or out of its
    /// dead-letter table — with its attempt reset to 1 and no delay, and returns how many. One
    /// statement, except a dead-letter table on MySQL/MariaDB and SQLite: a copy and a delete in
    /// one transaction.
    ///
    /// # Errors
    ///
    /// As [`counts`](Queue::counts).
    pub fn requeue_dead<'e, 'c: 'e, DB, X>(&'e self, conn: X) -> BoxFuture<'e, Result<u64>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        C: HasDeadLetter,
    {
        let (table, queue) = (&self.table, self.inspect());
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table.requeue_dead_on::<DB>(&mut conn, queue).await
        })
    }

    /// Deletes up to `batch` finished rows of this queue's table (`processed_at` older than
    /// `older_than`) per statement until none is left, and returns how many: the upkeep of a
    /// table that keeps finished rows. `batch` is taken between 1 and 10,000.
    ///
    /// # Errors
    ///
    /// [`Error::Declaration`](crate::Error::Declaration) for a table without a `processed_at`
    /// column (it deletes finished rows: nothing else marks them),
    /// [`Error::Identifier`](crate::Error::Identifier),
    /// [`Error::Database`](crate::Error::Database) (the rows of the batches before it are
    /// deleted).
    pub fn prune<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        older_than: Duration,
        batch: u32,
    ) -> BoxFuture<'e, Result<u64>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
    {
        let table = &self.table;
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table.prune_on::<DB>(&mut conn, older_than, batch).await
        })
    }

    /// Deletes this queue's dead rows older than `older_than` (by their `created_at`), up to
    /// `batch` per statement, and returns how many.
    ///
    /// # Errors
    ///
    /// [`Error::Declaration`](crate::Error::Declaration) when the table has no `created_at`
    /// column; otherwise as [`prune`](Queue::prune).
    pub fn prune_dead<'e, 'c: 'e, DB, X>(
        &'e self,
        conn: X,
        older_than: Duration,
        batch: u32,
    ) -> BoxFuture<'e, Result<u64>>
    where
        DB: Backend,
        X: Acquire<'c, Database = DB> + Send + 'e,
        C: HasDeadLetter,
    {
        let (table, queue) = (&self.table, self.inspect());
        Box::pin(async move {
            let mut conn = conn.acquire().await?;
            table
                .prune_dead_on::<DB>(&mut conn, queue, older_than, batch)
                .await
        })
    }

    /// The most jobs one [`enqueue_many`](Queue::enqueue_many) or
    /// [`enqueue_many_unique`](Queue::enqueue_many_unique) takes on this queue's table.
    pub fn max_batch(&self) -> usize {
        self.table.max_batch()
    }

    /// The queue's table as its calls see it: with the lease column of its form, which tells a
    /// job in work (and the DDL that creates it).
    pub(super) fn jobs_table(&self) -> Table {
        let mut table = self.table.clone();
        table.lease = self.form.lease_column().map(str::to_owned);
        table
    }

    /// What the queue's counts and repairs read of it.
    fn inspect(&self) -> Inspect<'_> {
        Inspect {
            group: self.name.as_deref(),
            lease: self.form.lease_column(),
            attempt: self.attempt.column(),
            dead_letter: self.cap.dead_letter(),
        }
    }

    /// `job` in this queue's group: a named queue's job carries its name (or none).
    fn in_group<'j>(&self, job: Job<'j>) -> Result<Job<'j>> {
        match &self.name {
            None => Ok(job),
            Some(name) => job.in_group(&self.table.name, name),
        }
    }

    /// [`in_group`](Self::in_group) for a unique job.
    fn unique_in_group<'j>(&self, job: UniqueJob<'j>) -> Result<UniqueJob<'j>> {
        match &self.name {
            None => Ok(job),
            Some(name) => job.in_group(&self.table.name, name),
        }
    }
}
