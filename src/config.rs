//! What a queue is once mounted: the typestate of its builder erased into a plain configuration
//! that the runner, the forms and the statements read (a runner takes it, with the queue's
//! handler, through [`Mount`](crate::state::Mount)).

use std::time::Duration;

use crate::backoff::Backoff;
use crate::error::{Error, Result};
use crate::table::{DeadLetter, Dialect, Table};

mod by_key;

pub use by_key::ByKey;
pub(crate) use by_key::{BY_KEY_CLAIM_PER_WORKER, BY_KEY_IN_HAND_PER_WORKER};

/// The most deliveries one queue keeps in work at once.
pub(crate) const MAX_WORKERS: usize = 10_000;

/// The most rows a queue of single deliveries claims ahead of its workers, per worker (the lease
/// form and the advisory form's plain deliveries, while their handlers are quick: see the
/// runner's claim loop).
pub(crate) const AHEAD_PER_WORKER: usize = 3;

/// The lease duration when none is given.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A settlement whose statement a service can replace with its own SQL
/// ([`Queue::custom`](crate::Queue::custom)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Event {
    /// [`Outcome::ack`](crate::Outcome::ack).
    Ack,
    /// [`Outcome::drop`](crate::Outcome::drop).
    Drop,
    /// [`Outcome::retry`](crate::Outcome::retry).
    Retry,
    /// [`Outcome::retry_after`](crate::Outcome::retry_after).
    RetryAfter,
    /// The move to the dead letter (at the cap, or
    /// [`Outcome::dead_letter`](crate::Outcome::dead_letter)).
    DeadLetter,
}

/// The isolation level of a transactional queue's transactions, on PostgreSQL and
/// MySQL/MariaDB ([`Queue::isolation`](crate::Queue::isolation)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isolation {
    /// Each statement sees what was committed before it began (the default).
    ReadCommitted,
    /// The transaction sees one snapshot. On PostgreSQL a row lock claim may then fail with a
    /// serialization error under contention (the runner retries it); on MySQL/MariaDB locking
    /// reads take gap locks, so the row lock form refuses it.
    RepeatableRead,
    /// Transactions behave as if run one at a time; the database aborts the ones that cannot,
    /// and their deliveries fail their settlement and are delivered again. The row lock form
    /// refuses it on MySQL/MariaDB.
    Serializable,
}

/// How a transactional queue's transactions begin on SQLite
/// ([`Queue::isolation`](crate::Queue::isolation)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SqliteMode {
    /// `BEGIN DEFERRED` (the default): the write lock is taken at the first write.
    Deferred,
    /// `BEGIN IMMEDIATE`: the write lock is taken at once.
    Immediate,
    /// `BEGIN EXCLUSIVE`: no other connection reads or writes until the delivery settles.
    Exclusive,
}

/// A queue's rate limit ([`Queue::rate_limit`](crate::Queue::rate_limit)): at most `n`
/// deliveries started per `per`, from a bucket of at most `burst` tokens (default `n`).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::RateLimit;
///
/// // 200 a second, at most 10 at once after a quiet spell.
/// let limit = RateLimit::new(200, Duration::from_secs(1)).burst(10);
/// # let _ = limit;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub(crate) n: u32,
    pub(crate) per: Duration,
    pub(crate) burst: u32,
}

impl RateLimit {
    /// At most `n` deliveries started per `per`, with a burst of `n` (one period's worth).
    ///
    /// # Panics
    ///
    /// `n` is 0, or `per` is zero.
    #[track_caller]
    pub fn new(n: u32, per: Duration) -> Self {
        assert!(
            n > 0,
            "RateLimit::new needs at least 1 delivery per period, got 0"
        );
        assert!(
            !per.is_zero(),
            "RateLimit::new needs a period longer than zero"
        );
        RateLimit { n, per, burst: n }
    }

    /// How many tokens the queue may save while it is idle, to start at once later (default:
    /// `n`, one period's worth). Over any stretch of time `t` the queue starts at most
    /// `burst + n × t / per` deliveries; a burst of 1 spaces every start evenly.
    ///
    /// # Panics
    ///
    /// `burst` is 0.
    #[track_caller]
    pub fn burst(mut self, burst: u32) -> Self {
        assert!(burst > 0, "RateLimit::burst must be at least 1, got 0");
        self.burst = burst;
        self
    }

    /// Tokens refilled per second.
    pub(crate) fn per_second(&self) -> f64 {
        f64::from(self.n) / self.per.as_secs_f64()
    }
}

/// The claim form of a mounted queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormKind {
    RowLock,
    Lease { column: String, duration: Duration },
    Advisory,
}

/// Everything the runner, the forms and the statements need to know about a mounted queue.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct QueueConfig {
    pub(crate) table: Table,
    pub(crate) name: Option<String>,
    pub(crate) form: FormKind,
    pub(crate) attempt: Option<String>,
    /// The cap and its dead letter: they come together (the builder's typestate sees to it).
    pub(crate) cap: Option<(u32, DeadLetter)>,
    pub(crate) transactional: bool,
    pub(crate) batch: Option<usize>,
    pub(crate) workers: usize,
    pub(crate) custom: Vec<(Event, String)>,
    pub(crate) isolation: Option<Isolation>,
    pub(crate) sqlite_mode: Option<SqliteMode>,
    /// How many rows of one group are in work at once, across every runner (`Some(1)`: FIFO).
    pub(crate) per_group: Option<u32>,
    pub(crate) listen_notify: bool,
    pub(crate) rate: Option<RateLimit>,
    /// Per-key order inside one process: the workers are lanes, a key's rows go to one.
    pub(crate) by_key: Option<ByKey>,
    /// How long a failed delivery's row waits before it returns.
    pub(crate) backoff: Backoff,
}

impl QueueConfig {
    /// A queue of `form` on `table` with every option at its default.
    pub(crate) fn new(table: Table, form: FormKind) -> Self {
        QueueConfig {
            table,
            name: None,
            form,
            attempt: None,
            cap: None,
            transactional: false,
            batch: None,
            workers: 1,
            custom: Vec::new(),
            isolation: None,
            sqlite_mode: None,
            per_group: None,
            listen_notify: false,
            rate: None,
            by_key: None,
            backoff: Backoff::default(),
        }
    }

    /// The queue's name in messages: its group value, else its table's name.
    pub(crate) fn label(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.table.name)
    }

    pub(crate) fn max_attempts(&self) -> Option<u32> {
        self.cap.as_ref().map(|(max, _)| *max)
    }

    pub(crate) fn dead_letter(&self) -> Option<&DeadLetter> {
        self.cap.as_ref().map(|(_, to)| to)
    }

    /// The most rows one claim of this queue takes: a batch, or (single deliveries of the lease
    /// form) a row per worker and the rows claimed ahead of them.
    pub(crate) fn max_claim(&self) -> usize {
        match (self.batch, &self.by_key) {
            (Some(size), _) => size,
            (None, Some(_)) => self.workers.saturating_mul(BY_KEY_CLAIM_PER_WORKER),
            (None, None) => self.workers.saturating_mul(1 + self.ahead_per_worker()),
        }
    }

    /// The most rows of single deliveries one claim of this queue serves keeps in hand: its
    /// claim's, or a by-key queue's rows waiting for the worker of their key too.
    pub(crate) fn max_in_hand(&self) -> usize {
        match (self.batch, &self.by_key) {
            (None, Some(_)) => self.workers.saturating_mul(BY_KEY_IN_HAND_PER_WORKER),
            _ => self.max_claim(),
        }
    }

    /// The most rows a queue of single deliveries claims ahead of each worker (the lease form,
    /// and the advisory form's plain deliveries, whose claims serve every worker): none on a
    /// table with priorities, where a row claimed ahead would keep a more urgent job enqueued
    /// after it waiting, and where the rows of one claim would start in id order, not in
    /// priority order. (An advisory row that waited starts only while its session is known to
    /// hold its key: see `Form::still_held`.)
    pub(crate) fn ahead_per_worker(&self) -> usize {
        match (&self.form, &self.table.priority) {
            // A rate limit's token is a start: a row claimed ahead could start later, in a burst.
            _ if self.rate.is_some() => 0,
            (FormKind::Lease { .. }, None) => AHEAD_PER_WORKER,
            (FormKind::Advisory, None) if !self.transactional && self.batch.is_none() => {
                AHEAD_PER_WORKER
            }
            _ => 0,
        }
    }

    /// Whether a delivery in work holds a pooled connection: the row lock and advisory forms
    /// (its claim's transaction, its key), and transactional queues (their transaction).
    pub(crate) fn holds_connections(&self) -> bool {
        self.transactional || !matches!(self.form, FormKind::Lease { .. })
    }

    /// Refuses what cannot work on `dialect` or on the table as declared, before any statement
    /// runs.
    pub(crate) fn check(&self, dialect: Dialect) -> Result<()> {
        let queue = self.label();
        if self.listen_notify && dialect != Dialect::Postgres {
            return Err(Error::unsupported(
                queue,
                format!(
                    "`.listen_notify()` needs PostgreSQL's LISTEN/NOTIFY; {} has none (polling \
                     and in-process wake-ups remain)",
                    dialect.product()
                ),
            ));
        }
        let above_read_committed = !matches!(self.isolation, None | Some(Isolation::ReadCommitted));
        if dialect == Dialect::MySql && self.form == FormKind::RowLock && above_read_committed {
            return Err(Error::unsupported(
                queue,
                "the row lock form claims with a locking read, which above READ COMMITTED takes \
                 gap locks on MySQL/MariaDB that block inserts: keep `Isolation::ReadCommitted`, \
                 or use the lease or advisory lock form",
            ));
        }
        match (&self.form, self.per_group) {
            (FormKind::Lease { .. }, _) | (_, None) => {}
            (FormKind::RowLock, Some(1)) if above_read_committed => {
                return Err(Error::unsupported(
                    queue,
                    "FIFO on the row lock form guards each group by locking its first row in the \
                     claim's transaction, which above READ COMMITTED fails on rows settled since \
                     the transaction began: keep `Isolation::ReadCommitted`, or use the lease form",
                ));
            }
            (FormKind::RowLock, Some(_)) => {}
            (FormKind::Advisory, Some(_)) => {
                return Err(Error::unsupported(
                    queue,
                    "FIFO and `.per_group(..)` need the lease or row lock form: a row held by an \
                     advisory key is not visible to other claims, which would take the next row \
                     of its group",
                ));
            }
        }
        self.check_unique_key(queue)?;
        self.check_by_key(queue)?;
        if self.rate.is_some() && self.table.limits.is_none() {
            return Err(Error::declaration(
                queue,
                format!(
                    "`.rate_limit(..)` keeps its tokens in a limiter table: declare it with \
                     `Table::new({:?}).limits(\"job_limits\")` (`Queue::schema` creates it)",
                    self.table.name
                ),
            ));
        }
        if self.per_group.is_some() && self.table.group.is_none() {
            return Err(Error::declaration(
                queue,
                "FIFO and `.per_group(..)` count rows within a group: declare the table's group \
                 column with `Table::group(..)`",
            ));
        }
        if let (Some(DeadLetter::Group(group)), None) = (self.dead_letter(), &self.table.group) {
            return Err(Error::declaration(
                queue,
                format!(
                    "`DeadLetter::group({group:?})` needs a group column on table `{}`; declare \
                     it with `Table::group(..)`, or dead-letter into a table",
                    self.table.name
                ),
            ));
        }
        match (&self.table.group, &self.name) {
            // An unnamed FIFO, per-group or by-key queue serves every group, each within its
            // limit or in its own order.
            (Some(_), None) if self.per_group.is_some() || self.by_key.is_some() => Ok(()),
            (Some(column), None) => Err(Error::declaration(
                queue,
                format!(
                    "table `{}` has the group column `{column}`: name the group this queue \
                     serves with `.named(..)`",
                    self.table.name
                ),
            )),
            (None, Some(name)) => Err(Error::declaration(
                queue,
                format!(
                    "`.named({name:?})` selects a group, but table `{}` has no group column: \
                     declare it with `Table::group(..)`",
                    self.table.name
                ),
            )),
            _ => Ok(()),
        }
    }
}

impl QueueConfig {
    /// A table with a unique key must let enqueues see a job in work, so that a replace or
    /// debounce leaves it alone: the advisory form, whose keys no statement of another session
    /// sees, is refused (a lease queue's lease column is its table's, from its declaration).
    fn check_unique_key(&self, queue: &str) -> Result<()> {
        if self.table.unique_key.is_none() {
            return Ok(());
        }
        match &self.form {
            FormKind::Advisory => Err(Error::unsupported(
                queue,
                "a table with a unique key cannot be served by the advisory lock form: a unique \
                 job's replace or debounce cannot see a job held by an advisory key; use the row \
                 lock or lease form",
            )),
            _ => Ok(()),
        }
    }
}
