//! What a table is declared with beside its columns: where dead rows go, and the pooler in
//! front of the database.

/// Where a row goes when it reaches its queue's `max_attempts`.
///
/// # Examples
///
/// ```
/// use sqlx_queue::DeadLetter;
///
/// let to_group = DeadLetter::group("signups_dead"); // the table needs a group column
/// let to_table = DeadLetter::table("signup_jobs_dead"); // same columns as the queue table
/// # let _ = (to_group, to_table);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetter {
    /// Another group of the same table: the move is one `UPDATE` of the row's group.
    Group(String),
    /// Another table with the same columns: the row is moved there.
    Table(String),
}

impl DeadLetter {
    /// Dead-letters into the group `name` of the queue's own table.
    pub fn group(name: impl Into<String>) -> Self {
        DeadLetter::Group(name.into())
    }

    /// Dead-letters into the table `name`, which has the queue table's columns.
    ///
    /// A row moves with every column of the queue table (the lease cleared), so
    /// [`Runner::start`](crate::Runner::start) refuses, as an [`Error::Schema`](crate::Error::Schema) naming the table
    /// and the column, a dead-letter table that could not take it:
    ///
    /// - a column of the queue table it lacks, or holds in another type: the same type is
    ///   needed (spelled as the catalog spells it: `VARCHAR(64)` and `TEXT` differ), except that
    ///   an integer type at least as wide passes (a `BIGINT` attempt column for an `INT` one),
    ///   and on SQLite any type of the same affinity (SQLite converts values by affinity alone);
    /// - a column that takes NULL in the queue table but not here, or that this table computes
    ///   (a generated column, PostgreSQL's `GENERATED ALWAYS` identity);
    /// - a `NOT NULL` column of its own without a default. Columns of its own that fill
    ///   themselves — a default, a serial or identity, `AUTO_INCREMENT`, SQLite's rowid alias —
    ///   are fine, say a key of its own and the time the row died.
    ///
    /// `CREATE TABLE jobs_dead (LIKE jobs)` (PostgreSQL) and `CREATE TABLE jobs_dead LIKE jobs`
    /// (MySQL/MariaDB) make one.
    pub fn table(name: impl Into<String>) -> Self {
        DeadLetter::Table(name.into())
    }
}

/// What stands between the application and the database server: a connection pooler that hands
/// a client a server session for one transaction at a time changes what the crate may rely on
/// (a session lock, a listening connection, a statement prepared on the session).
/// [`Table::pooler`](crate::Table::pooler) says it, once for every call and runner on the table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Pooler {
    /// A connection of its own to the server, or a pooler that lends a client one server
    /// session for as long as it is connected (PgBouncer's `pool_mode = session`): the default.
    #[default]
    None,
    /// A pooler that lends a client a server session for one transaction at a time
    /// (PgBouncer's `pool_mode = transaction`), PostgreSQL only. Between two transactions the
    /// session may be another client's, so:
    ///
    /// - what needs one session across transactions is refused by
    ///   [`Runner::start`](crate::Runner::start): the advisory lock form (its keys are session
    ///   locks) and [`listen_notify`](crate::Queue::listen_notify) (`LISTEN` holds a session).
    ///   The lease and row lock forms and transactional queues work (a row lock claim and its
    ///   settlement are one transaction);
    /// - the crate prepares no statement the session keeps: every statement runs unprepared
    ///   (an unnamed statement, which sqlx parses and executes in two exchanges), inside a
    ///   transaction — its own when it is not in one (`BEGIN`, the statement, `COMMIT`: three
    ///   round trips more than a cached prepared statement needs). PgBouncer before 1.21 keeps
    ///   no prepared statement across transactions, and 1.21+ only with `max_prepared_statements`;
    ///   this works with both;
    /// - an enqueue runs on the caller's executor, which the crate cannot open a transaction
    ///   on: enqueue through such a pooler in a transaction (`&mut *tx`), never on the pool
    ///   itself, where the pooler may hand the statement's second exchange to another session;
    /// - the handler's own statements in `d.tx()` are the application's: through PgBouncer before
    ///   1.21, run them with `.persistent(false)` (sqlx's default keeps them prepared on a session
    ///   the next transaction may not have).
    Transaction,
}
