//! The crate's one error type.

/// The result of this crate's fallible operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when declaring, starting or running a queue.
///
/// Each variant names the queue, table and, where there is one, the statement it concerns, so a
/// log line is enough to find the cause.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lease settlement found another token on the row: the lease expired and another claim
    /// took the row, which now belongs to that claim. Nothing was changed.
    #[error("queue `{queue}`: the lease on row {id} of `{table}` was lost to a later claim")]
    LeaseLost {
        /// The queue the delivery came from.
        queue: String,
        /// The queue table.
        table: String,
        /// The row's id.
        id: i64,
    },

    /// The delivery's transaction was still held elsewhere (a `Delivery` or its `Tx` moved into
    /// another task) when the handler's future ended. Nothing was committed.
    #[error(
        "queue `{queue}`: the transaction of row {id} was still held when its handler ended; \
         nothing was committed"
    )]
    TransactionHeld {
        /// The queue the delivery came from.
        queue: String,
        /// The row's id.
        id: i64,
    },

    /// The database does not have what the queue declares: a missing table or column, a column of
    /// the wrong type, or a statement the database refused to prepare.
    #[error(transparent)]
    Schema(Box<SchemaError>),

    /// The queue's declaration cannot work: for example a group column without a queue name, a
    /// dead letter group on a table without groups, or a custom statement that does not render.
    #[error("queue `{queue}`: {reason}")]
    Declaration {
        /// The queue concerned.
        queue: String,
        /// What is wrong, in words.
        reason: String,
    },

    /// A table or column name that cannot be used as an SQL identifier.
    #[error("invalid identifier {name:?}: {reason}")]
    Identifier {
        /// The name as given.
        name: String,
        /// Why it is refused.
        reason: &'static str,
    },

    /// A row lock batch's settlement failed: its transaction was rolled back, and every row of
    /// the batch returns to the queue as it was.
    #[error("queue `{queue}`: a batch of {rows} rows was rolled back: {source}")]
    BatchRolledBack {
        /// The queue the batch came from.
        queue: String,
        /// How many rows the batch had.
        rows: usize,
        /// The error of the statement that failed.
        #[source]
        source: Box<Error>,
    },

    /// The database server is older than the claim needs (no `SKIP LOCKED`).
    #[error("{server} {found} is too old: this queue needs {needed} or later")]
    ServerTooOld {
        /// The server product.
        server: String,
        /// The version found.
        found: String,
        /// The oldest version that works.
        needed: String,
    },

    /// A job the database would not receive: MySQL and MariaDB take a statement of at most their
    /// `max_allowed_packet` setting's bytes (by default 16 MiB on MariaDB, 64 MiB on MySQL 8;
    /// 1 GiB at most), and close the connection on a larger one. Nothing was inserted: enqueue
    /// fewer jobs at once, raise the setting, or keep large payloads out of the queue table.
    #[error(
        "table `{table}`: a statement of {bytes} bytes is more than the server takes in one \
         (its `{setting}`); nothing was inserted"
    )]
    PayloadTooLarge {
        /// The table the jobs were for.
        table: String,
        /// The statement's size: its text and the values it binds (the jobs' payloads).
        bytes: u64,
        /// The server setting that bounds it: `max_allowed_packet`.
        setting: &'static str,
        /// The driver's error, when the server refused it (none when the statement is larger
        /// than the setting can ever be, and was not sent).
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The pool cannot serve the mounted queues: the row lock and advisory lock forms and
    /// transactional queues hold a pooled connection per delivery in work, and the runner needs
    /// one more for claims and settlements. Raise the pool's `max_connections` to `needed`, or
    /// lower the queues' `workers`.
    #[error(
        "queues {queues}: their deliveries in work hold {held} pooled connections and the runner \
         needs one more for claims and settlements, {needed} in all, but the pool has at most \
         {max}; raise the pool's max_connections to {needed} or lower `workers` (a handler that \
         also writes through the pool needs one more per worker)"
    )]
    PoolTooSmall {
        /// The queues that hold connections, by name.
        queues: String,
        /// The connections their workers hold at most.
        held: u32,
        /// The connections the pool needs: `held` + 1.
        needed: u32,
        /// The pool's `max_connections`.
        max: u32,
    },

    /// A job the table cannot hold, refused before any statement ran: no group on a table with a
    /// group column (or a group on one without), a delay without a `retry_after` column, a text
    /// payload that is not UTF-8 without NUL bytes, or more jobs than one statement takes.
    #[error("table `{table}`: {reason}")]
    InvalidJob {
        /// The table the job was for.
        table: String,
        /// What is wrong, in words.
        reason: String,
    },

    /// A unique job's key is held by a row the enqueue could not see however often it looked: a
    /// row committed after the snapshot of the caller's `REPEATABLE READ` (or `SERIALIZABLE`)
    /// transaction. Nothing was inserted or changed; retry in a new transaction.
    #[error(
        "table `{table}`: unique key {key:?} is held by a row this transaction cannot see; retry in a new transaction"
    )]
    UniqueKeyHidden {
        /// The table the job was for.
        table: String,
        /// The job's unique key.
        key: String,
    },

    /// A declaration this database does not support: `.listen_notify()` off PostgreSQL, an
    /// isolation level on SQLite or a SQLite mode elsewhere, an isolation level the row lock
    /// form cannot claim at on MySQL/MariaDB, FIFO off the lease form.
    #[error("queue `{queue}`: {reason}")]
    Unsupported {
        /// The queue concerned.
        queue: String,
        /// What is not supported, and what to use instead.
        reason: String,
    },

    /// An advisory key the delivery held was not held when it was released: the session that
    /// held it was lost (killed, or its server restarted), so another runner may hold the row
    /// now. Its connection is closed.
    #[error(
        "queue `{queue}`: the advisory key of row {id} of `{table}` was not held at its release"
    )]
    KeyLost {
        /// The queue the delivery came from.
        queue: String,
        /// The queue table.
        table: String,
        /// The row's id.
        id: i64,
    },

    /// The queue stopped before it settled the delivery (its settlement task ended): the row
    /// returns to the queue unsettled.
    #[error("queue `{queue}`: stopped before the row was settled")]
    Stopped {
        /// The queue concerned.
        queue: String,
    },

    /// The id the database gave an inserted row does not fit in an `i64`: MySQL/MariaDB's ids
    /// are unsigned, and a `BIGINT UNSIGNED` id column may count past `i64::MAX`. The job was
    /// inserted (in the caller's transaction, where the insert ran in one); only its id cannot
    /// be returned.
    #[error(
        "table `{table}`: the inserted row's id {id} does not fit in an i64; the job was inserted"
    )]
    #[non_exhaustive]
    IdOutOfRange {
        /// The table the job was inserted into.
        table: String,
        /// The id the database gave it.
        id: u64,
    },

    /// A periodic job's schedule that does not parse: a cron expression (or the time zone it is
    /// read in) that [`Schedule::cron`](crate::Schedule::cron) or
    /// [`Schedule::cron_in`](crate::Schedule::cron_in) refused.
    #[error("schedule {expression:?}: {reason}")]
    InvalidSchedule {
        /// The expression as given.
        expression: String,
        /// What is wrong with it, in words.
        reason: String,
    },

    /// An error from the database driver.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// What [`Error::Schema`] names: the queue, the table and, where there is one, the column or the
/// statement the database refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
#[error("{}", self.describe())]
pub struct SchemaError {
    /// The queue being checked.
    pub queue: String,
    /// The table concerned.
    pub table: String,
    /// The column concerned, when one is.
    pub column: Option<String>,
    /// The statement the database refused, when one did.
    pub statement: Option<String>,
    /// What is wrong, in words.
    pub reason: String,
    /// The statements that would create what is missing, as the declaration needs it, when the
    /// crate can write them: a missing table's `CREATE TABLE` (and its indexes), a missing
    /// column's `ALTER TABLE .. ADD COLUMN`, a missing unique index's `CREATE UNIQUE INDEX`
    /// (see [`Schema`](crate::Schema)). Each ends in `;`.
    pub fix: Option<String>,
    /// The database's own error, when there is one.
    #[source]
    pub source: Option<sqlx::Error>,
}

impl SchemaError {
    fn describe(&self) -> String {
        let mut text = format!("queue `{}`: table `{}`", self.queue, self.table);
        if let Some(column) = &self.column {
            text.push_str(&format!(", column `{column}`"));
        }
        text.push_str(": ");
        text.push_str(&self.reason);
        if let Some(source) = &self.source {
            text.push_str(&format!(" ({source})"));
        }
        if let Some(statement) = &self.statement {
            text.push_str(&format!("; statement: {statement}"));
        }
        if let Some(fix) = &self.fix {
            text.push_str(&format!("; create it with: {fix}"));
        }
        text
    }
}

impl Error {
    pub(crate) fn schema(
        queue: &str,
        table: &str,
        column: Option<&str>,
        reason: impl Into<String>,
    ) -> Self {
        Error::Schema(Box::new(SchemaError {
            queue: queue.to_owned(),
            table: table.to_owned(),
            column: column.map(str::to_owned),
            statement: None,
            reason: reason.into(),
            fix: None,
            source: None,
        }))
    }

    /// This error with `fix` as its [`SchemaError::fix`] (other errors as they are).
    pub(crate) fn with_fix(mut self, fix: Option<String>) -> Self {
        if let Error::Schema(schema) = &mut self {
            schema.fix = fix;
        }
        self
    }

    pub(crate) fn declaration(queue: &str, reason: impl Into<String>) -> Self {
        Error::Declaration {
            queue: queue.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(queue: &str, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            queue: queue.to_owned(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid_job(table: &str, reason: impl Into<String>) -> Self {
        Error::InvalidJob {
            table: table.to_owned(),
            reason: reason.into(),
        }
    }
}
