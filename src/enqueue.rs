//! Enqueueing jobs through the table description, on any sqlx connection or transaction, so a
//! job commits with the data it serves — and waking the queues of its table in this process.
//!
//! What an insert refuses, and what a server's refusal means, is apart in `refuse`; the
//! in-process wake-ups are apart in `wake`, where the runner registers its queues too.

mod cancel;
mod headers;
mod refuse;
mod schema;
mod tick;
mod transaction;
mod unique;
mod unique_job;
mod wake;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{AssertSqlSafe, SqlSafeStr as _};

use crate::backend::{self, Backend, Clock, InsertFailed};
use crate::dialect::{self, Args, EnqueueSql, Names};
use crate::error::{Error, Result};
use crate::table::{Dialect, Table, Value};

pub use cancel::Cancellation;
pub use schema::Schema;
pub(crate) use tick::{Fired, Ticks};
pub use unique_job::{Enqueued, UniqueJob};
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
    /// should take it. A named queue's enqueues put their jobs in its group without it; an
    /// unnamed queue on a table with a group column needs it.
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

    /// This job in queue `name`'s group, on `table`: the group it has, or the queue's; another
    /// group is refused (the job would go to another queue).
    pub(crate) fn in_group(mut self, table: &str, name: &str) -> Result<Self> {
        match self.group.as_deref() {
            None => {
                self.group = Some(Cow::Owned(name.to_owned()));
                Ok(self)
            }
            Some(group) if group == name => Ok(self),
            Some(group) => Err(Error::invalid_job(
                table,
                format!(
                    "a job enqueued into queue `{name}` names the group `{group}`: enqueue it \
                     into that group's queue, or leave its group out"
                ),
            )),
        }
    }
}

impl Table {
    /// Inserts one job on `conn` and returns its id ([`Queue::enqueue`](crate::Queue::enqueue)),
    /// waking the queues of its table and group running in this process.
    pub(crate) async fn enqueue_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        job: Job<'_>,
    ) -> Result<i64> {
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
        let id = match sql.returning {
            true => backend::fetch_i64::<DB>(conn, insert)
                .await
                .map_err(InsertFailed::from)
                .and_then(|id| id.ok_or(InsertFailed::Driver(sqlx::Error::RowNotFound))),
            false => DB::insert_id_on(conn, insert).await,
        }
        .map_err(|failed| self.insert_failed::<DB>(failed, sql.insert.text(), bytes))?;
        wake(&self.name, job.group.as_deref());
        Ok(id)
    }

    /// Inserts many jobs on `conn` with one statement, returning their ids in order
    /// ([`Queue::enqueue_many`](crate::Queue::enqueue_many)).
    pub(crate) async fn enqueue_many_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        jobs: &[Job<'_>],
    ) -> Result<Vec<i64>> {
        let names = Names::of_table(DB::DIALECT, self)?;
        for job in jobs {
            self.check(job)?;
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
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
        let ids = backend::inserted_ids::<DB>(conn, q, jobs.len())
            .await
            .map_err(|failed| self.insert_failed::<DB>(failed, &text, bytes))?;
        let mut woken: Vec<Option<&str>> = Vec::new();
        for job in jobs {
            let group = job.group.as_deref();
            if !woken.contains(&group) {
                wake(&self.name, group);
                woken.push(group);
            }
        }
        Ok(ids)
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
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
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

    /// The most jobs one [`enqueue_many`](crate::Queue::enqueue_many) inserts: one statement
    /// binds at most 30,000 values.
    pub(crate) fn max_batch(&self) -> usize {
        MAX_VALUES / self.values_per_job()
    }

    fn values_per_job(&self) -> usize {
        1 + usize::from(self.group.is_some())
            + usize::from(self.retry_after.is_some())
            + usize::from(self.priority.is_some())
            + usize::from(self.headers.is_some())
    }
}
