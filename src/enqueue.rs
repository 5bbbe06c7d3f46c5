//! Enqueueing jobs through the table description, on any sqlx connection or transaction, so a
//! job commits with the data it serves — and waking the queues of its table in this process.
//!
//! What an insert refuses, and what a server's refusal means, is apart in `refuse`; the
//! in-process wake-ups are apart in `wake`, where the runner registers its queues too.

mod cancel;
mod headers;
mod refuse;
mod tick;
mod transaction;
mod unique;
mod unique_job;
mod wake;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{AssertSqlSafe, Executor, SqlSafeStr as _};

use crate::backend::{self, Backend, Clock, InsertFailed};
use crate::dialect::{self, Args, EnqueueSql, Names};
use crate::error::{Error, Result};
use crate::table::{Dialect, Table, Value};

pub use cancel::Cancellation;
pub(crate) use tick::{Fired, Ticks};
pub use unique_job::{Enqueued, OnDuplicate, UniqueJob};
pub(crate) use wake::{wake, wakes};

/// Statements of a bulk enqueue take at most this many bound values (every database allows
/// more than 30,000).
const MAX_VALUES: usize = 30_000;

/// The enqueue statement of each table and database, rendered once.
static RENDERED: Mutex<Option<Rendered>> = Mutex::new(None);

type Rendered = HashMap<(Dialect, Table), Arc<EnqueueSql>>;

/// How many tables' statements are kept (names made at run time could otherwise grow it forever).
const RENDERED_MAX: usize = 1024;

fn rendered(dialect: Dialect, table: &Table) -> Result<Arc<EnqueueSql>> {
    let mut cache = RENDERED.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    let key = (dialect, table.clone());
    if let Some(sql) = cache.get(&key) {
        return Ok(Arc::clone(sql));
    }
    let names = Names::of_table(dialect, table)?;
    let sql = Arc::new(dialect::enqueue(&names));
    if cache.len() >= RENDERED_MAX {
        cache.clear();
    }
    cache.insert(key, Arc::clone(&sql));
    Ok(sql)
}

/// `stmt` with `args` bound, prepared unless the statement runs unprepared.
fn bound<DB: Backend>(stmt: &dialect::Stmt, args: &Args<'_>) -> backend::Q<DB> {
    backend::query::<DB>(stmt.sql(), stmt.values(args)).persistent(!stmt.unprepared)
}

/// A job to enqueue: its payload, the group (queue) it is for, an optional delay, and its
/// [headers](Job::header).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::Job;
///
/// let job = Job::new("alice@example.com").group("signups").delay(Duration::from_secs(60));
/// assert_eq!(job.payload(), b"alice@example.com");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a job does nothing until it is enqueued"]
pub struct Job<'a> {
    payload: Cow<'a, [u8]>,
    group: Option<Cow<'a, str>>,
    delay: Option<Duration>,
    priority: i64,
    headers: BTreeMap<Cow<'a, str>, Cow<'a, str>>,
}

impl<'a> Job<'a> {
    /// A job carrying `payload`'s bytes (a `&str`, `&[u8]`, `&Vec<u8>`, `b"..."`).
    pub fn new<P: AsRef<[u8]> + ?Sized>(payload: &'a P) -> Self {
        Job {
            payload: Cow::Borrowed(payload.as_ref()),
            group: None,
            delay: None,
            priority: 0,
            headers: BTreeMap::new(),
        }
    }

    /// A job owning its payload.
    pub fn from_vec(payload: Vec<u8>) -> Job<'static> {
        Job {
            payload: Cow::Owned(payload),
            group: None,
            delay: None,
            priority: 0,
            headers: BTreeMap::new(),
        }
    }

    /// A job whose payload is `value` as JSON.
    ///
    /// # Errors
    ///
    /// `value` cannot be serialized.
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<Job<'static>> {
        Ok(Job::from_vec(serde_json::to_vec(value)?))
    }

    /// The group the job is for: the [`named`](crate::Queue::named) value of the queue that
    /// should take it. Needed on a table with a group column.
    pub fn group(mut self, group: impl Into<Cow<'a, str>>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Makes the job claimable only after `delay` (needs a `retry_after` column).
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// The job's priority on a table with a [priority](Table::priority) column: smaller first
    /// (default 0).
    pub fn priority(mut self, priority: i64) -> Self {
        self.priority = priority;
        self
    }

    /// The job's payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

impl Table {
    /// Inserts one job and returns its id. Pass the caller's transaction (`&mut *tx`) to make the
    /// job commit with the data it serves; a pool or a connection works too. Queues of this
    /// table and group running in this process are woken at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn signup(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx_queue::{Job, Table};
    ///
    /// let jobs = Table::new("signup_jobs");
    /// let mut tx = pool.begin().await?;
    /// sqlx::query("INSERT INTO accounts (email) VALUES ('alice@example.com')")
    ///     .execute(&mut *tx)
    ///     .await?;
    /// jobs.enqueue(&mut *tx, Job::new("alice@example.com")).await?;
    /// tx.commit().await?; // the account and its job commit together
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`] for a name that cannot be quoted (on MySQL/MariaDB, also one with
    /// a character beyond the Basic Multilingual Plane); [`Error::InvalidJob`] for a job the
    /// table cannot hold (no group on a table with a group column, a group, a delay or headers
    /// the table has no column for, a header with a NUL character); [`Error::PayloadTooLarge`] for a statement larger than
    /// MySQL/MariaDB's `max_allowed_packet`; [`Error::Schema`] for a SQLite table qualified by a
    /// name that is not an attached database (`public.jobs`: SQLite's is `main.jobs`);
    /// [`Error::IdOutOfRange`] for a MySQL/MariaDB id beyond `i64` (the job was inserted);
    /// [`Error::Database`] from the insert.
    pub async fn enqueue<'c, DB, E>(&self, executor: E, job: Job<'_>) -> Result<i64>
    where
        DB: Backend,
        E: Executor<'c, Database = DB>,
    {
        self.check(&job)?;
        let sql = rendered(DB::DIALECT, self)?;
        let headers = job.headers_text();
        let args = Args {
            payload: &job.payload,
            headers: headers.as_deref(),
            group: job.group.as_deref(),
            at: job.delay.map(|delay| Clock::default().after(delay)),
            priority: job.priority,
            notify_table: sql.notify_table.as_deref(),
            notify_payload: job.group.as_deref(),
            ..Args::default()
        };
        let bytes = sql.insert.text().len()
            + job.payload.len()
            + job.group.as_deref().map_or(0, str::len)
            + headers.as_deref().map_or(0, str::len);
        self.refuse_too_large::<DB>(bytes)?;
        // Behind a transaction pooler, unnamed: prepared statements do not outlive the caller's
        // transaction there.
        let insert = backend::query::<DB>(sql.insert.sql(), sql.insert.values(&args))
            .persistent(!sql.insert.unprepared);
        let id = DB::insert_id(executor, insert, sql.returning)
            .await
            .map_err(|failed| self.insert_failed::<DB>(failed, sql.insert.text(), bytes))?;
        wake(&self.name, job.group.as_deref());
        Ok(id)
    }

    /// Inserts many jobs with one statement, returning how many were inserted. One statement
    /// binds at most 30,000 values — a value per job for its payload, and one for each of its
    /// group, `retry_after`, priority and headers columns the table has: [`Table::max_batch`] jobs. Call
    /// it once per slice of a longer list, inside one transaction to commit them together.
    ///
    /// # Errors
    ///
    /// As [`enqueue`](Table::enqueue), for any of the jobs ([`Error::PayloadTooLarge`] for the
    /// statement's bytes together); [`Error::InvalidJob`] for more jobs than one statement
    /// takes. Nothing is inserted then.
    pub async fn enqueue_many<'c, DB, E>(&self, executor: E, jobs: &[Job<'_>]) -> Result<u64>
    where
        DB: Backend,
        E: Executor<'c, Database = DB>,
    {
        let names = Names::of_table(DB::DIALECT, self)?;
        for job in jobs {
            self.check(job)?;
        }
        if jobs.is_empty() {
            return Ok(0);
        }
        if jobs.len() > self.max_batch() {
            return Err(Error::invalid_job(
                &self.name,
                format!(
                    "{} jobs do not fit one statement: enqueue_many takes at most {} on this \
                     table; call it once per slice, inside one transaction",
                    jobs.len(),
                    self.max_batch()
                ),
            ));
        }
        let clock = Clock::default();
        let headers: Vec<Option<String>> = jobs.iter().map(Job::headers_text).collect();
        let mut values = Vec::with_capacity(jobs.len() * self.values_per_job());
        for (job, headers) in jobs.iter().zip(&headers) {
            values.push(Value::Bytes(&job.payload));
            if names.group.is_some() {
                values.push(Value::Text(job.group.as_deref()));
            }
            if names.retry_after.is_some() {
                values.push(Value::Time(job.delay.map(|delay| clock.after(delay))));
            }
            if names.priority.is_some() {
                values.push(Value::I64(job.priority));
            }
            if names.headers.is_some() {
                values.push(Value::Text(headers.as_deref()));
            }
        }
        let notifying = names.notify && DB::DIALECT == Dialect::Postgres;
        if notifying {
            // One notification for the whole list: every queue of the table looks.
            values.push(Value::Text(Some(&names.table)));
            values.push(Value::Text(Some("")));
        }
        let text = dialect::enqueue_many(&names, jobs.len());
        let bytes = text.len() + values.iter().map(Value::size).sum::<usize>();
        self.refuse_too_large::<DB>(bytes)?;
        let sql = AssertSqlSafe(text.as_str()).into_sql_str();
        let q = backend::query::<DB>(sql, values).persistent(!names.unprepared);
        let inserted = if notifying {
            DB::insert_id(executor, q, true)
                .await
                .map(|n| u64::try_from(n).unwrap_or(0))
        } else {
            DB::execute_on(executor, q)
                .await
                .map_err(InsertFailed::from)
        }
        .map_err(|failed| self.insert_failed::<DB>(failed, &text, bytes))?;
        let mut woken: Vec<Option<&str>> = Vec::new();
        for job in jobs {
            let group = job.group.as_deref();
            if !woken.contains(&group) {
                wake(&self.name, group);
                woken.push(group);
            }
        }
        Ok(inserted)
    }

    /// The PostgreSQL channel of this table's notifications, as the session of `executor`
    /// resolves the table: `sqlxq_` and the first 16 hex digits of the MD5 of the table's resolved
    /// name — its bare name in the `public` schema, else `schema.table` — so every spelling of one
    /// table (`jobs`, `public.jobs`, `"public"."jobs"`, or a bare name found through
    /// `search_path`) has one channel. A producer outside this crate (a trigger, say) can
    /// `NOTIFY` it with the job's group as payload (empty: every queue of the table).
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`] for a name that cannot be quoted, [`Error::Schema`] when the table
    /// does not exist, [`Error::Database`].
    #[cfg(feature = "postgres")]
    pub async fn notify_channel<'c, E>(&self, executor: E) -> Result<String>
    where
        E: Executor<'c, Database = sqlx::Postgres>,
    {
        let quoted = Dialect::Postgres.quote_table(&self.name)?;
        let identity = dialect::identity(Dialect::Postgres, &self.name, &quoted)?;
        let query = backend::query::<sqlx::Postgres>(
            sqlx::SqlStr::from_static(identity.sql),
            identity.values,
        );
        match query.fetch_optional(executor).await? {
            Some(row) => Ok(sqlx::Row::try_get(&row, 1)?),
            None => Err(Error::schema(
                &self.name,
                &self.name,
                None,
                "the table does not exist",
            )),
        }
    }

    /// The most jobs one [`enqueue_many`](Table::enqueue_many) inserts: one statement binds at
    /// most 30,000 values.
    pub fn max_batch(&self) -> usize {
        MAX_VALUES / self.values_per_job()
    }

    fn values_per_job(&self) -> usize {
        1 + usize::from(self.group.is_some())
            + usize::from(self.retry_after.is_some())
            + usize::from(self.priority.is_some())
            + usize::from(self.headers.is_some())
    }
}
