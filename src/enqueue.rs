//! Enqueueing jobs through the table description, on any sqlx connection or transaction, so a
//! job commits with the data it serves — and waking the queues of its table in this process.
//!
//! In-process wake-ups find queues by their table's bare name, case folded: `jobs`,
//! `public.jobs` and `"public"."jobs"` wake each other. Two tables of one name in two schemas
//! wake each other too, which costs a claim that finds nothing, never a missed row.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::{AssertSqlSafe, Executor, SqlSafeStr as _};
use tokio::sync::Notify;

use crate::backend::{self, Backend, Clock};
use crate::dialect::{self, Args, EnqueueSql, Names};
use crate::error::{Error, Result, SchemaError};
use crate::table::{Dialect, PayloadType, Table, Value, table_parts};

/// Statements of a bulk enqueue take at most this many bound values (every database allows
/// more than 30,000).
const MAX_VALUES: usize = 30_000;

/// The largest `max_allowed_packet` of MySQL/MariaDB: 1 GiB.
const MYSQL_MAX_PACKET: usize = 1 << 30;

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

/// A job to enqueue: its payload, the group (queue) it is for, and an optional delay.
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
}

impl<'a> Job<'a> {
    /// A job carrying `payload`'s bytes (a `&str`, `&[u8]`, `&Vec<u8>`, `b"..."`).
    pub fn new<P: AsRef<[u8]> + ?Sized>(payload: &'a P) -> Self {
        Job {
            payload: Cow::Borrowed(payload.as_ref()),
            group: None,
            delay: None,
            priority: 0,
        }
    }

    /// A job owning its payload.
    pub fn from_vec(payload: Vec<u8>) -> Job<'static> {
        Job {
            payload: Cow::Owned(payload),
            group: None,
            delay: None,
            priority: 0,
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
    /// table cannot hold (no group on a table with a group column, a group or a delay the table
    /// has no column for); [`Error::PayloadTooLarge`] for a statement larger than
    /// MySQL/MariaDB's `max_allowed_packet`; [`Error::Schema`] for a SQLite table qualified by a
    /// name that is not an attached database (`public.jobs`: SQLite's is `main.jobs`);
    /// [`Error::Database`] from the insert.
    pub async fn enqueue<'c, DB, E>(&self, executor: E, job: Job<'_>) -> Result<i64>
    where
        DB: Backend,
        E: Executor<'c, Database = DB>,
    {
        self.check(&job)?;
        let sql = rendered(DB::DIALECT, self)?;
        let args = Args {
            payload: &job.payload,
            group: job.group.as_deref(),
            at: job.delay.map(|delay| Clock::default().after(delay)),
            priority: job.priority,
            notify_table: sql.notify_table.as_deref(),
            notify_payload: job.group.as_deref(),
            ..Args::default()
        };
        let bytes =
            sql.insert.text().len() + job.payload.len() + job.group.as_deref().map_or(0, str::len);
        self.refuse_too_large::<DB>(bytes)?;
        let insert = backend::query::<DB>(sql.insert.sql(), sql.insert.values(&args));
        let id = DB::insert_id(executor, insert, sql.returning)
            .await
            .map_err(|error| self.explain::<DB>(error, sql.insert.text(), bytes))?;
        wake(&self.name, job.group.as_deref());
        Ok(id)
    }

    /// Inserts many jobs with one statement, returning how many were inserted. One statement
    /// binds at most 30,000 values — a value per job for its payload, and one for each of its
    /// group, `retry_after` and priority columns the table has: [`Table::max_batch`] jobs. Call
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
        let mut values = Vec::with_capacity(jobs.len() * self.values_per_job());
        for job in jobs {
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
        let q = backend::query::<DB>(sql, values);
        let inserted = if notifying {
            DB::insert_id(executor, q, true)
                .await
                .map(|n| u64::try_from(n).unwrap_or(0))
        } else {
            DB::execute_on(executor, q).await
        }
        .map_err(|error| self.explain::<DB>(error, &text, bytes))?;
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
    }

    /// Refuses, before sending it, a statement of `bytes` that MySQL/MariaDB could never take:
    /// `max_allowed_packet` is at most 1 GiB.
    fn refuse_too_large<DB: Backend>(&self, bytes: usize) -> Result<()> {
        if DB::DIALECT == Dialect::MySql && bytes > MYSQL_MAX_PACKET {
            return Err(Error::PayloadTooLarge {
                table: self.name.clone(),
                bytes: bytes as u64,
                setting: "max_allowed_packet",
                source: None,
            });
        }
        Ok(())
    }

    /// The insert's error, or a clearer one where the driver's words would not say what is
    /// wrong.
    ///
    /// The executor is the caller's (often its transaction) and the insert consumes it, so
    /// nothing can be asked of the server first (its `max_allowed_packet`, SQLite's attached
    /// databases); the server's answer is read instead. A statement larger than
    /// `max_allowed_packet` gets error 1153 or a closed connection from MySQL/MariaDB, where the
    /// driver says "Connection reset by peer" ([`Backend`]'s `too_large` says which answers are
    /// taken for it); a table qualified PostgreSQL's way (`public.jobs`) gets "no such table" or
    /// "unknown database" from SQLite.
    fn explain<DB: Backend>(&self, error: sqlx::Error, statement: &str, bytes: usize) -> Error {
        if let Some(setting) = DB::too_large(&error, bytes) {
            return Error::PayloadTooLarge {
                table: self.name.clone(),
                bytes: bytes as u64,
                setting,
                source: Some(error),
            };
        }
        let qualified = match (DB::DIALECT, table_parts(&self.name)) {
            (Dialect::Sqlite, Ok((Some(schema), bare))) => Some((schema, bare)),
            _ => None,
        };
        let message = match &error {
            sqlx::Error::Database(e) => e.message(),
            _ => "",
        };
        let Some((schema, bare)) = qualified else {
            return Error::Database(error);
        };
        let reason = if message.starts_with("unknown database") {
            dialect::sqlite_qualified(schema, bare, Some(&[]))
        } else if message == format!("no such table: {schema}.{bare}") {
            dialect::sqlite_qualified(schema, bare, None)
        } else {
            return Error::Database(error);
        };
        Error::Schema(Box::new(SchemaError {
            queue: self.name.clone(),
            table: self.name.clone(),
            column: None,
            statement: Some(statement.to_owned()),
            reason,
            source: Some(error),
        }))
    }

    /// Refuses a job this table cannot hold.
    fn check(&self, job: &Job<'_>) -> Result<()> {
        let refuse = |reason: String| Err(Error::invalid_job(&self.name, reason));
        match (&self.group, &job.group) {
            (Some(column), None) => refuse(format!(
                "table `{}` has the group column `{column}`: give the job its group with \
                 `Job::group(..)`",
                self.name
            )),
            (None, Some(group)) => refuse(format!(
                "the job is for group {group:?}, but table `{}` has no group column",
                self.name
            )),
            _ if job.delay.is_some() && self.retry_after.is_none() => refuse(format!(
                "a delayed job needs a retry_after column, and table `{}` has none",
                self.name
            )),
            _ if self.payload_type != PayloadType::Bytes
                && (std::str::from_utf8(&job.payload).is_err() || job.payload.contains(&0)) =>
            {
                refuse(format!(
                    "the payload column `{}` of table `{}` holds text ({:?}): the job's payload \
                     is not UTF-8 text without NUL bytes",
                    self.payload, self.name, self.payload_type
                ))
            }
            _ => Ok(()),
        }
    }
}

/// A running queue's entry in the wake-ups of this process.
struct Entry {
    table: Box<str>,
    group: Option<Box<str>>,
    notify: Weak<Notify>,
}

static QUEUES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Registers a running queue: it is woken for as long as the returned `Notify` lives.
pub(crate) fn wakes(table: &str, group: Option<&str>) -> Arc<Notify> {
    let notify = Arc::new(Notify::new());
    let table = bare(table);
    let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    queues.retain(|entry| entry.notify.strong_count() > 0);
    queues.push(Entry {
        table,
        group: group.map(Into::into),
        notify: Arc::downgrade(&notify),
    });
    notify
}

/// Wakes every queue of `table` serving `group` (every queue of the table when `group` is
/// `None`). A queue that is busy keeps the wake-up for its next wait.
pub(crate) fn wake(table: &str, group: Option<&str>) {
    let table = bare(table);
    let queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
    for entry in queues.iter() {
        let same_group = group.is_none() || entry.group.as_deref() == group;
        if *entry.table == *table
            && same_group
            && let Some(notify) = entry.notify.upgrade()
        {
            notify.notify_one();
        }
    }
}

/// The table's name without its schema and quotes, case folded.
fn bare(table: &str) -> Box<str> {
    let name = table.rsplit('.').next().unwrap_or(table);
    name.trim_matches(['"', '`']).to_lowercase().into()
}

#[cfg(all(test, feature = "mysql"))]
mod tests {
    use crate::backend::private::Driver as _;
    use crate::error::Error;
    use crate::table::Table;

    #[test]
    fn a_statement_larger_than_any_max_allowed_packet_is_not_sent() {
        let table = Table::new("jobs");
        table.refuse_too_large::<sqlx::MySql>(1 << 30).unwrap();
        let refused = table.refuse_too_large::<sqlx::MySql>((1 << 30) + 1);
        assert!(
            matches!(refused, Err(Error::PayloadTooLarge { bytes, source: None, .. }) if bytes == (1 << 30) + 1),
            "{refused:?}"
        );
        #[cfg(feature = "sqlite")]
        table
            .refuse_too_large::<sqlx::Sqlite>((1 << 30) + 1)
            .unwrap();
    }

    #[test]
    fn a_broken_connection_is_taken_for_a_large_statement_from_one_mebibyte() {
        use std::io::{Error as Io, ErrorKind};
        let reset = || sqlx::Error::Io(Io::from(ErrorKind::ConnectionReset));
        assert_eq!(
            sqlx::MySql::too_large(&reset(), 1 << 20),
            Some("max_allowed_packet")
        );
        assert_eq!(sqlx::MySql::too_large(&reset(), 1000), None);
        let refused = sqlx::Error::Io(Io::from(ErrorKind::ConnectionRefused));
        assert_eq!(sqlx::MySql::too_large(&refused, 1 << 20), None);
        #[cfg(feature = "sqlite")]
        assert_eq!(sqlx::Sqlite::too_large(&reset(), 1 << 20), None);
    }
}

#[cfg(test)]
mod wake_tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_wake_reaches_its_table_and_group_only() {
        let mail = wakes("wake_test_jobs", Some("mail"));
        let sms = wakes("wake_test_jobs", Some("sms"));
        wake("wake_test_jobs", Some("mail"));
        tokio::time::timeout(Duration::from_secs(1), mail.notified())
            .await
            .expect("the mail queue is woken");
        let woken = tokio::time::timeout(Duration::from_millis(20), sms.notified()).await;
        assert!(woken.is_err(), "the sms queue is not woken");
        wake("public.\"Wake_test_jobs\"", Some("sms"));
        tokio::time::timeout(Duration::from_secs(1), sms.notified())
            .await
            .expect("another spelling of the table wakes its queue");
    }
}
