//! The queue builder: a typestate chain that only lets valid queues be mounted. The typestate
//! ends at mount: [`Mount`](crate::state::Mount) hands the runner a plain configuration and a handler.

mod by_key;
mod handlers;
mod jobs;
mod mount;
mod rate;
mod schema;
pub mod state;
mod transactions;

use std::marker::PhantomData;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::config::{ByKey, DEFAULT_LEASE, Event, Isolation, MAX_WORKERS, RateLimit, SqliteMode};
use crate::delivery::Plain;
use crate::table::{DeadLetter, Table};
use state::*;

/// A queue, declared on a [`Table`] by a chain of calls, then mounted on a
/// [`Runner`](crate::Runner).
///
/// Exactly one claim form — [`row_lock`](Queue::row_lock), [`lease`](Queue::lease) or
/// [`advisory_lock`](Queue::advisory_lock) — and a handler are needed; the rest is optional.
/// Combinations that cannot work do not compile, and the error names the missing call:
/// `max_attempts` without an attempt column, a cap without a dead letter, a transactional queue
/// with batches, two claim forms, a row lock on SQLite.
///
/// The type parameters are the builder's states ([`state`]); you never write them.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx::Sqlite;
/// use sqlx_queue::{DeadLetter, Delivery, Outcome, Queue, Table};
///
/// async fn send(d: Delivery<Sqlite>) -> Outcome {
///     if d.payload().is_empty() { Outcome::drop() } else { Outcome::ack() }
/// }
///
/// let emails = Queue::table(Table::new("email_jobs"))
///     .lease("locked_until")
///     .lease_duration(Duration::from_secs(60))
///     .attempt("attempt")
///     .max_attempts(5)
///     .dead_letter(DeadLetter::table("email_jobs_dead"))
///     .workers(4)
///     .handler(send);
/// # let _ = emails;
/// ```
#[must_use = "a queue does nothing until it is mounted on a Runner"]
pub struct Queue<F = NoForm, A = NoAttempt, C = NoCap, M = Plain, B = Single, H = NoHandler> {
    table: Table,
    name: Option<String>,
    workers: usize,
    custom: Vec<(Event, String)>,
    isolation: Option<Isolation>,
    sqlite_mode: Option<SqliteMode>,
    per_group: Option<u32>,
    listen_notify: bool,
    rate: Option<RateLimit>,
    by_key: Option<ByKey>,
    backoff: Backoff,
    form: F,
    attempt: A,
    cap: C,
    mode: PhantomData<fn() -> M>,
    batch: B,
    handler: H,
}

/// A queue declaration is a value: clone it to mount it (`.clone().handler(f)`) and keep
/// enqueueing, cancelling and counting through it. A queue with a handler clones where its
/// handler does.
impl<F: Clone, A: Clone, C: Clone, M, B: Clone, H: Clone> Clone for Queue<F, A, C, M, B, H> {
    fn clone(&self) -> Self {
        Queue {
            table: self.table.clone(),
            name: self.name.clone(),
            workers: self.workers,
            custom: self.custom.clone(),
            isolation: self.isolation,
            sqlite_mode: self.sqlite_mode,
            per_group: self.per_group,
            listen_notify: self.listen_notify,
            rate: self.rate,
            by_key: self.by_key.clone(),
            backoff: self.backoff,
            form: self.form.clone(),
            attempt: self.attempt.clone(),
            cap: self.cap.clone(),
            mode: PhantomData,
            batch: self.batch.clone(),
            handler: self.handler.clone(),
        }
    }
}

impl Queue {
    /// Starts a queue on `table`.
    pub fn table(table: Table) -> Self {
        Queue {
            table,
            name: None,
            workers: 1,
            custom: Vec::new(),
            isolation: None,
            sqlite_mode: None,
            per_group: None,
            listen_notify: false,
            rate: None,
            by_key: None,
            backoff: Backoff::default(),
            form: NoForm,
            attempt: NoAttempt,
            cap: NoCap,
            mode: PhantomData,
            batch: Single,
            handler: NoHandler,
        }
    }
}

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// Rebuilds the queue with one state changed; every builder method is written once, here.
    fn with<F2, A2, C2, M2, B2, H2>(
        self,
        form: impl FnOnce(F) -> F2,
        attempt: impl FnOnce(A) -> A2,
        cap: impl FnOnce(C) -> C2,
        batch: impl FnOnce(B) -> B2,
        handler: impl FnOnce(H) -> H2,
    ) -> Queue<F2, A2, C2, M2, B2, H2> {
        Queue {
            table: self.table,
            name: self.name,
            workers: self.workers,
            custom: self.custom,
            isolation: self.isolation,
            sqlite_mode: self.sqlite_mode,
            per_group: self.per_group,
            listen_notify: self.listen_notify,
            rate: self.rate,
            by_key: self.by_key,
            backoff: self.backoff,
            form: form(self.form),
            attempt: attempt(self.attempt),
            cap: cap(self.cap),
            mode: PhantomData,
            batch: batch(self.batch),
            handler: handler(self.handler),
        }
    }

    fn form<F2>(self, form: F2) -> Queue<F2, A, C, M, B, H> {
        self.with(|_| form, |a| a, |c| c, |b| b, |h| h)
    }

    /// The group value this queue serves, on a table with a [group](Table::group) column; it is
    /// also the queue's name in logs.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The row lock form: the claim's transaction holds each row (`FOR UPDATE SKIP LOCKED`) while
    /// its handler runs, and the settlement commits with it. PostgreSQL and MySQL/MariaDB; each
    /// delivery in work holds a pooled connection.
    pub fn row_lock(self) -> Queue<RowLock, A, C, M, B, H>
    where
        F: NoFormYet,
    {
        self.form(RowLock)
    }

    /// The lease form: the claim writes a lease token into `column` (the lease's expiry) and
    /// commits at once; the runner extends the lease while the handler works, and every
    /// settlement is guarded by the token. All three databases.
    pub fn lease(self, column: impl Into<String>) -> Queue<Lease, A, C, M, B, H>
    where
        F: NoFormYet,
    {
        self.form(Lease {
            column: column.into(),
            duration: DEFAULT_LEASE,
        })
    }

    /// How long a lease lasts before another claim may take the row (default 30 s). The runner
    /// extends the lease of a delivery still in work every half lease.
    ///
    /// # Panics
    ///
    /// `duration` is shorter than 10 ms.
    #[track_caller]
    pub fn lease_duration(mut self, duration: Duration) -> Self
    where
        F: HasLease,
    {
        assert!(
            duration >= Duration::from_millis(10),
            "lease_duration must be at least 10 ms, got {duration:?}"
        );
        self.form.set_duration(duration);
        self
    }

    /// The advisory lock form: a session lock on the row's key holds the row while its handler
    /// runs. PostgreSQL and MySQL/MariaDB; SQLite within one process.
    pub fn advisory_lock(self) -> Queue<AdvisoryLock, A, C, M, B, H>
    where
        F: NoFormYet,
    {
        self.form(AdvisoryLock)
    }

    /// The attempt column: an integer, `NOT NULL DEFAULT 1`, that counts the row's deliveries.
    /// Counting stops at the column type's largest value.
    pub fn attempt(self, column: impl Into<String>) -> Queue<F, AttemptColumn, C, M, B, H>
    where
        A: NoAttemptYet,
    {
        let column = AttemptColumn(column.into());
        self.with(|f| f, |_| column, |c| c, |b| b, |h| h)
    }

    /// The cap: a retry of a row whose attempt has reached `n` moves it to the dead letter
    /// instead. Needs [`attempt`](Queue::attempt) before and [`dead_letter`](Queue::dead_letter)
    /// after.
    ///
    /// The attempt column must count to `n + 1` in the lease and advisory lock forms (they count
    /// an attempt when they take the row), to `n` in the row lock form: a narrower column is an
    /// [`Error::Declaration`](crate::Error::Declaration) at [`Runner::start`](crate::Runner::start).
    ///
    /// # Panics
    ///
    /// `n` is 0.
    #[track_caller]
    pub fn max_attempts(self, n: u32) -> Queue<F, A, MaxAttempts, M, B, H>
    where
        A: HasAttemptColumn,
        C: NoCapYet,
    {
        assert!(n > 0, "max_attempts must be at least 1");
        self.with(|f| f, |a| a, |_| MaxAttempts(n), |b| b, |h| h)
    }

    /// Where a row goes at the cap: another group of the table, or another table.
    pub fn dead_letter(self, to: DeadLetter) -> Queue<F, A, DeadLettered, M, B, H>
    where
        C: HasMaxAttempts,
    {
        let with = |c: C| DeadLettered {
            max_attempts: c.max_attempts(),
            to,
        };
        self.with(|f| f, |a| a, with, |b| b, |h| h)
    }

    /// FIFO groups (the lease and row lock forms, on a table with a [group](Table::group)
    /// column): within a group one row is in work at a time, in id order, across every runner.
    /// A row waiting for its `retry_after` lets later rows that are due go first. Unnamed, the
    /// queue serves every group of the table, each in its own order, groups in parallel; named,
    /// it serves its group one row at a time. The row lock form guards each group with a lock on
    /// its first unfinished row, taken in the claim's transaction (one more statement per
    /// claim), and refuses it above READ COMMITTED; the advisory form refuses it at start. The
    /// same as [`per_group(1)`](Queue::per_group).
    pub fn fifo(self) -> Self {
        self.per_group(1)
    }

    /// At most `n` rows of one group in work at once (the lease and row lock forms, on a table
    /// with a [group](Table::group) column), across every runner and process, counted by the
    /// claim statement. A group at its limit holds back none of the others. Within a group the
    /// rows start in id order, the first `n` due at once. The lease form counts the group's rows
    /// under a live lease (a crashed holder frees its slot when its lease expires), and a row
    /// waiting for its `retry_after` lets later rows that are due go first. The row lock form,
    /// whose rows in work other claims cannot see, takes a row only while fewer than `n`
    /// unfinished rows of its group come before it (a crashed holder's slot is free when the
    /// server ends its session), so a row waiting for its `retry_after` keeps its slot: it holds
    /// back the rows after it in its group. `per_group(1)` is [`fifo`](Queue::fifo) (on the row
    /// lock form with a guard instead). Unnamed, the queue serves every group of the table.
    /// The advisory form is refused at start.
    ///
    /// # Panics
    ///
    /// `n` is 0 (no row would ever be claimed), as [`workers`](Queue::workers).
    #[track_caller]
    pub fn per_group(mut self, n: u32) -> Self {
        assert!(n > 0, "per_group must be at least 1, got 0");
        self.per_group = Some(n);
        self
    }

    /// Wakes the queue at once when a job is enqueued in another process (PostgreSQL): the runner
    /// keeps one dedicated connection listening on the table's
    /// [`notify_channel`](Table::notify_channel), which enqueues through a
    /// [`Table::notify`] table signal at commit. A lost listening connection is re-established
    /// and the queue looks once. Polling stays the fallback. MySQL/MariaDB and SQLite runners
    /// refuse it at start.
    pub fn listen_notify(mut self) -> Self {
        self.listen_notify = true;
        self
    }

    /// How long a failed delivery's row waits before it is claimable again: a delivery whose
    /// handler returned an `Err` or [`Outcome::fail`](crate::Outcome::fail), or panicked
    /// (default [`Backoff::default`]: 2 s after the first delivery, doubling up to an hour, with
    /// jitter). [`Backoff::none`] returns it at once. The delay is written into the table's
    /// [`retry_after`](Table::retry_after) column, so it survives a restart; on a table without
    /// one a failed row returns at once, and [`Runner::start`](crate::Runner::start) warns of
    /// it. At `max_attempts` a failed row goes to its dead letter instead.
    /// [`Outcome::retry`](crate::Outcome::retry) is still "at once" and
    /// [`Outcome::retry_after`](crate::Outcome::retry_after) exact: they are the handler's own
    /// choices.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqlx::Sqlite;
    /// use sqlx_queue::{Backoff, Delivery, Queue, Table};
    ///
    /// async fn call_partner(d: Delivery<Sqlite>) -> Result<(), String> {
    ///     if d.payload().is_empty() { Err("the partner is down".into()) } else { Ok(()) }
    /// }
    ///
    /// // Failures come back after 10 s, 20 s, 40 s … up to 10 minutes.
    /// let queue = Queue::table(Table::new("jobs").retry_after("retry_after"))
    ///     .lease("locked_until")
    ///     .backoff(Backoff::new(Duration::from_secs(10), Duration::from_secs(600)))
    ///     .handler(call_partner);
    /// # let _ = queue;
    /// ```
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How many deliveries are in work at once (default 1). One claim takes as many rows as there
    /// are free workers, up to 1,000.
    ///
    /// # Panics
    ///
    /// `n` is 0 or more than 10,000.
    #[track_caller]
    pub fn workers(mut self, n: usize) -> Self {
        assert!(
            (1..=MAX_WORKERS).contains(&n),
            "workers must be between 1 and {MAX_WORKERS}, got {n}"
        );
        self.workers = n;
        self
    }

    /// Claims up to `n` rows at once and hands them to a
    /// [`batch_handler`](Queue::batch_handler) together.
    ///
    /// # Panics
    ///
    /// `n` is 0.
    #[track_caller]
    pub fn batch(self, n: usize) -> Queue<F, A, C, M, Batched, H>
    where
        M: NotTransactional,
        H: NoHandlerYet,
    {
        assert!(n > 0, "batch must be at least 1");
        self.with(|f| f, |a| a, |c| c, |_| Batched(n), |h| h)
    }
}
