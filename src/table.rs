//! The queue table: its name and the roles of its columns.

use chrono::{DateTime, Utc};

mod headers;
mod ident;
mod options;

pub use headers::Headers;
pub(crate) use headers::encode as encode_headers;
pub use options::{DeadLetter, Pooler};

pub(crate) use ident::table_parts;

/// A queue table: its name and which column plays which role.
///
/// Only names are held here; nothing connects. Every name is validated and quoted in the
/// database's own way when a statement is rendered (at [`Runner::start`](crate::Runner::start) or
/// at the first enqueue), so a bad name is an
/// [`Error::Identifier`](crate::Error::Identifier), never SQL.
///
/// A table name may be schema-qualified (`"jobs.signups"`: schema `jobs`, table `signups`; on
/// MySQL/MariaDB the first part is the database, on SQLite the attached database: `main.jobs`,
/// and a name that is not attached, such as PostgreSQL's `public`, is an
/// [`Error::Schema`](crate::Error::Schema) that says so). MySQL/MariaDB names hold characters of
/// the Basic Multilingual Plane only.
///
/// # Examples
///
/// ```
/// use sqlx_queue::Table;
///
/// let jobs = Table::new("signup_jobs")
///     .group("queue")
///     .retry_after("retry_after")
///     .processed_at("processed_at");
/// assert_eq!(jobs.name(), "signup_jobs");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[must_use = "a table description does nothing until a queue is mounted on it or a job enqueued"]
pub struct Table {
    pub(crate) name: String,
    pub(crate) id: String,
    pub(crate) payload: String,
    pub(crate) payload_type: PayloadType,
    pub(crate) group: Option<String>,
    pub(crate) retry_after: Option<String>,
    pub(crate) processed_at: Option<String>,
    pub(crate) priority: Option<String>,
    pub(crate) unique_key: Option<String>,
    /// The lease column of the lease form, set from the queue's declaration (`Queue::lease`)
    /// where a call needs to tell a job in work: never stated on the table.
    pub(crate) lease: Option<String>,
    pub(crate) created_at: Option<String>,
    pub(crate) cancel_requests: Option<String>,
    pub(crate) headers: Option<String>,
    pub(crate) limits: Option<String>,
    pub(crate) notify: bool,
    pub(crate) pooler: Pooler,
}

impl Table {
    /// Describes the table `name`, with the id column `id` and the payload column `payload`.
    pub fn new(name: impl Into<String>) -> Self {
        Table {
            name: name.into(),
            id: "id".to_owned(),
            payload: "payload".to_owned(),
            payload_type: PayloadType::Bytes,
            group: None,
            retry_after: None,
            processed_at: None,
            priority: None,
            unique_key: None,
            lease: None,
            created_at: None,
            cancel_requests: None,
            headers: None,
            limits: None,
            notify: false,
            pooler: Pooler::None,
        }
    }

    /// The lease column, as a lease queue's mount sets it (the crate's unit tests of statements).
    #[cfg(test)]
    pub(crate) fn lease(mut self, column: impl Into<String>) -> Self {
        self.lease = Some(column.into());
        self
    }

    /// The id column (default `id`): an integer primary key, read as `i64`.
    pub fn id(mut self, column: impl Into<String>) -> Self {
        self.id = column.into();
        self
    }

    /// The payload column (default `payload`): bytes (`BYTEA`, `BLOB`/`LONGBLOB`, `BLOB`), or
    /// text or JSON with [`payload_type`](Table::payload_type).
    pub fn payload(mut self, column: impl Into<String>) -> Self {
        self.payload = column.into();
        self
    }

    /// The payload column's type (default [`PayloadType::Bytes`]). A text or JSON payload is
    /// still handed to handlers as bytes (its UTF-8 text: `d.payload()`, `d.json()`), and jobs
    /// for it are bytes that must be UTF-8 without NUL bytes (else the enqueue is refused), and
    /// for JSON valid JSON (PostgreSQL and MySQL/MariaDB check it; SQLite does not). On
    /// MySQL/MariaDB a text column should be `utf8mb4`: text is read as UTF-8 from any character
    /// set, but a character the column's set lacks is refused by the database at enqueue.
    ///
    /// A declaration that does not match the column is an [`Error::Schema`](crate::Error::Schema) at
    /// [`Runner::start`](crate::Runner::start), but not at enqueue, which has only the caller's
    /// connection for one statement. There a bytes job (`PayloadType::Bytes`, the default) in a
    /// text column fares as the database makes it: PostgreSQL stores the bytes' hex text
    /// (`\x706c..`, by an assignment cast), MySQL/MariaDB store bytes that are UTF-8 as text and
    /// refuse others ("Incorrect string value"), SQLite stores a `BLOB` value in the `TEXT`
    /// column.
    ///
    /// ```
    /// use sqlx_queue::{PayloadType, Table};
    /// // CREATE TABLE events (id BIGSERIAL PRIMARY KEY, body JSONB NOT NULL, ..)
    /// let events = Table::new("events").payload("body").payload_type(PayloadType::Jsonb);
    /// # let _ = events;
    /// ```
    pub fn payload_type(mut self, payload_type: PayloadType) -> Self {
        self.payload_type = payload_type;
        self
    }

    /// A group column: several queues share the table, each serving the rows whose group is its
    /// [`named`](crate::Queue::named) value.
    pub fn group(mut self, column: impl Into<String>) -> Self {
        self.group = Some(column.into());
        self
    }

    /// A `retry_after` column: a row is not claimable before this time. Needed for
    /// [`Outcome::retry_after`](crate::Outcome::retry_after) and delayed jobs.
    pub fn retry_after(mut self, column: impl Into<String>) -> Self {
        self.retry_after = Some(column.into());
        self
    }

    /// A `processed_at` column: ack and drop mark the row with the time instead of deleting it.
    pub fn processed_at(mut self, column: impl Into<String>) -> Self {
        self.processed_at = Some(column.into());
        self
    }

    /// A priority column (an integer): claims take rows of smaller priority first, then the
    /// earliest due (a row never delayed first), then the smallest id.
    pub fn priority(mut self, column: impl Into<String>) -> Self {
        self.priority = Some(column.into());
        self
    }

    /// A unique key column (text, with a unique index): [`Job::unique`](crate::Job::unique) jobs
    /// carry a key, and the index keeps one unfinished job per key; what an enqueue of a key
    /// already taken does is the job's policy (skip, replace, debounce). A finished row frees its
    /// key: an ack or drop deletes it, or on a table that keeps finished rows
    /// ([`processed_at`](Table::processed_at)) the index is partial on unfinished rows
    /// (PostgreSQL, SQLite) or the settlement clears the key (MySQL/MariaDB, which has no
    /// partial index). The [unique jobs](crate::guide::unique) page shows the index per database.
    pub fn unique_key(mut self, column: impl Into<String>) -> Self {
        self.unique_key = Some(column.into());
        self
    }

    /// A creation time column (a timestamp with a database default, such as
    /// `DEFAULT CURRENT_TIMESTAMP`), never written by the crate: a debounced unique job is never
    /// pushed later than its `max` after this time.
    pub fn created_at(mut self, column: impl Into<String>) -> Self {
        self.created_at = Some(column.into());
        self
    }

    /// The table of cancel requests for this table's jobs in work on the row lock and advisory
    /// lock forms, whose rows [`cancel`](crate::Queue::cancel) cannot touch while a claim holds them:
    /// one column, `id` (the job's id, a primary key), created by the application (the
    /// [cancellation](crate::guide::cancellation) page shows it per database). With it, [`cancel`](crate::Queue::cancel) also tells a job held by an
    /// advisory lock from a queued one, records a request for a job in work, and (PostgreSQL)
    /// notifies its runner at once; runners of queues on this table learn of requests for
    /// their deliveries in work (a batch's too), cancel them, and remove their rows, and sweep
    /// the requests that name no unfinished row (at start and every 60 poll intervals).
    pub fn cancel_requests(mut self, table: impl Into<String>) -> Self {
        self.cancel_requests = Some(table.into());
        self
    }

    /// A headers column: each job's [headers](crate::Job::header), string keys and values stored
    /// as a JSON object, which deliveries read back byte for byte
    /// ([`Delivery::header`](crate::Delivery::header)) — a W3C `traceparent`, say, to continue
    /// the enqueuing request's trace in the handler. A job without headers writes NULL, so the
    /// column must take NULL.
    ///
    /// | | PostgreSQL | MySQL/MariaDB | SQLite |
    /// |---|---|---|---|
    /// | column type | `JSONB`, `JSON`, `TEXT` | `JSON`, `TEXT` (utf8mb4) | `TEXT` |
    ///
    /// A job with headers enqueued into a table without this column is refused
    /// ([`Error::InvalidJob`](crate::Error::InvalidJob)), never stored without them.
    ///
    /// ```
    /// use sqlx_queue::Table;
    /// // CREATE TABLE jobs (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL, headers JSONB, ..)
    /// let jobs = Table::new("jobs").headers("headers");
    /// # let _ = jobs;
    /// ```
    pub fn headers(mut self, column: impl Into<String>) -> Self {
        self.headers = Some(column.into());
        self
    }

    /// The limiter table of the queues on this table with a
    /// [`rate_limit`](crate::Queue::rate_limit): one row per queue, its token bucket, which
    /// every runner's claims take tokens from. Its columns have fixed names; the
    /// [rate limits](crate::guide::order#rate-limits) page gives its DDL for each database. Several job tables may share one.
    ///
    /// ```
    /// use sqlx_queue::Table;
    /// // CREATE TABLE job_limits (name TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL,
    /// //   refilled_at DOUBLE PRECISION NOT NULL, granted BIGINT NOT NULL)
    /// let jobs = Table::new("jobs").limits("job_limits");
    /// # let _ = jobs;
    /// ```
    pub fn limits(mut self, table: impl Into<String>) -> Self {
        self.limits = Some(table.into());
        self
    }

    /// On PostgreSQL, every enqueue through this table also sends a `NOTIFY` on the table's
    /// channel ([`notify_channel`](Table::notify_channel)), carrying the job's group, in the same statement
    /// and so the same transaction (PostgreSQL delivers it at commit, and sends one for many
    /// identical notifications of a transaction). Queues mounted with
    /// [`listen_notify`](crate::Queue::listen_notify) in other processes wake at once. Other
    /// databases ignore it.
    pub fn notify(mut self) -> Self {
        self.notify = true;
        self
    }

    /// Says what stands between this process and the database server (default
    /// [`Pooler::None`]), for every statement on this table: its queues' enqueues, inspection
    /// and runners. Behind [`Pooler::Transaction`] (PgBouncer's `pool_mode = transaction`) on
    /// PostgreSQL every statement runs unprepared, in a transaction; an enqueue must run in the
    /// caller's transaction (`&mut *tx`); [`Runner::start`](crate::Runner::start) refuses what
    /// needs one server session (the advisory lock form, `.listen_notify()`), and a runner
    /// whose tables (its queues' and its schedules') say it differently: one pool has one way
    /// to the server. See [`Pooler::Transaction`].
    pub fn pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }

    /// The table's name as given.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The database a statement is written for: how its names are quoted, and which statements it
/// takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    Postgres,
    MySql,
    Sqlite,
}

impl Dialect {
    /// Whether two column names are one column: PostgreSQL's quoted names are case-sensitive,
    /// MySQL's and SQLite's columns are not.
    pub(crate) fn same_column(self, a: &str, b: &str) -> bool {
        match self {
            Dialect::Postgres => a == b,
            Dialect::MySql | Dialect::Sqlite => a.eq_ignore_ascii_case(b),
        }
    }

    /// The product name, for messages.
    pub(crate) fn product(self) -> &'static str {
        match self {
            Dialect::Postgres => "PostgreSQL",
            Dialect::MySql => "MySQL/MariaDB",
            Dialect::Sqlite => "SQLite",
        }
    }
}

/// A value bound to a statement's placeholder: what the table's columns take.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    I64(i64),
    Bytes(&'a [u8]),
    Text(Option<&'a str>),
    Time(Option<DateTime<Utc>>),
}

impl Value<'_> {
    /// About how many bytes the value takes in a statement sent to the server.
    pub(crate) fn size(&self) -> usize {
        match self {
            Value::I64(_) | Value::Time(_) => 8,
            Value::Bytes(bytes) => bytes.len(),
            Value::Text(text) => text.map_or(0, str::len),
        }
    }
}

/// The type of a placeholder, for the databases that prepare statements with typed parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    I64,
    Bytes,
    Text,
    Time,
}

#[cfg(test)]
mod tests;

/// The type of a table's payload column: what the statements convert to and from bytes.
///
/// | | PostgreSQL | MySQL/MariaDB | SQLite |
/// |---|---|---|---|
/// | `Bytes` | `BYTEA` | `BLOB`, `LONGBLOB`, `VARBINARY` | `BLOB` |
/// | `Text` | `TEXT`, `VARCHAR` | `TEXT`, `VARCHAR` (utf8mb4) | `TEXT` |
/// | `Json` | `JSON` | `JSON` (MariaDB: `LONGTEXT`) | `TEXT` (not `JSON`: numeric affinity) |
/// | `Jsonb` | `JSONB` | as `Json` | as `Json` |
///
/// Bytes round-trip byte for byte. Text round-trips its UTF-8 text. JSON is stored as the
/// database keeps it: PostgreSQL's `JSONB` and MySQL's `JSON` normalise spacing and key order,
/// so a handler reads the same value, not always the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum PayloadType {
    /// A binary column (the default).
    #[default]
    Bytes,
    /// A text column: payloads must be UTF-8.
    Text,
    /// A JSON column (PostgreSQL `JSON`): payloads must be UTF-8 JSON.
    Json,
    /// PostgreSQL's `JSONB` (elsewhere the same as `Json`).
    Jsonb,
}
