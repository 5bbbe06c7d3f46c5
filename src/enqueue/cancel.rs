//! Cancelling a job through the table description, on any executor: a job not in work is removed
//! at once; a leased job in work loses its lease (removed too), which its runner learns at its
//! next renewal (on PostgreSQL, notified at commit where it listens); a job a row lock claim (or
//! an advisory key) holds gets a cancel request, where the table has their table, which its
//! runner reads — and on PostgreSQL is notified of at commit.
//!
//! Each cancellation is one transaction (a savepoint inside the caller's): the row is removed
//! where no claim holds it, or locked and read first (MySQL/MariaDB) — never read, then removed
//! by a statement a claim could come before. SQLite's advisory keys are held in the process:
//! the cancellation takes the row's key there before its removal and gives it back after its
//! commit, as PostgreSQL's statement takes it for its transaction.

use futures::future::BoxFuture;
use sqlx::{Acquire, SqlStr};

use super::bound;
use crate::backend::{self, Backend, Clock, in_process};
use crate::dialect::{self, Args, CANCEL_NOTICE, CancelSql, KeysAt, Names, Stmt};
use crate::error::{Error, Result};
use crate::table::Table;

/// What a cancellation found, and did.
///
/// # Examples
///
/// ```no_run
/// # async fn example(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
/// use sqlx_queue::{Cancellation, Table};
///
/// let jobs = Table::new("jobs").lease("locked_until");
/// match jobs.cancel(&pool, 42).await? {
///     Cancellation::Cancelled(id) => println!("job {id} will not run"),
///     Cancellation::Requested(id) => println!("job {id} is running; its handler is told"),
///     Cancellation::NotFound => println!("finished already (or never queued)"),
///     _ => {}
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancellation {
    /// The job was not in work: its row is deleted (or marked `processed_at`), and it will not
    /// be delivered.
    Cancelled(i64),
    /// The job is in work. On a table with a [lease column](Table::lease) its lease is taken
    /// away — the row is deleted (or marked) already — and its handler's
    /// [`Delivery::cancelled`](crate::Delivery::cancelled) fires at the runner's next renewal
    /// (PostgreSQL, a runner listening on the table's channel: at once, and a row claimed ahead
    /// of its worker never starts); its settlement changes nothing. A row a row lock claim or an
    /// advisory key holds gets a request where the table has a
    /// [cancel requests' table](Table::cancel_requests): its runner fires `cancelled()`
    /// (PostgreSQL at once, else within its poll interval), and removes the row when the
    /// handler returns, its writes rolled back (SQLite's advisory form too: a cancellation
    /// from the process that runs it sees its keys). Without that table the job runs on to its
    /// end.
    Requested(i64),
    /// No unfinished job has this id (or key): it finished, was cancelled before, or never was.
    NotFound,
}

impl Cancellation {
    /// The job's id, unless none was found.
    pub fn id(self) -> Option<i64> {
        match self {
            Cancellation::Cancelled(id) | Cancellation::Requested(id) => Some(id),
            Cancellation::NotFound => None,
        }
    }
}

impl Table {
    /// Cancels job `id`: removes it at once if it is not in work, else takes its lease away
    /// (see [`Cancellation`]). Pass a pool, a connection, or the caller's transaction
    /// (`&mut *tx`): the cancellation then commits, or not, with it.
    ///
    /// Which jobs are in work is read from the table: a live lease in its
    /// [lease column](Table::lease) (declare it: a table without one does not know its leases),
    /// or, on PostgreSQL and MySQL/MariaDB, a row lock claim's hold on the row, and, where the
    /// table has a [cancel requests' table](Table::cancel_requests), a runner's advisory key on
    /// it (passed over: the cancellation never waits for either). SQLite's advisory keys are
    /// held in the process, which is the one process the form serves per database file: there
    /// the cancellation takes the row's key while it removes the row, so that no claim takes
    /// it meanwhile. The README's "Cancellation" says when the handler learns of it, per form
    /// and database.
    ///
    /// On SQLite inside the caller's transaction, that key is the cancellation's until its own
    /// savepoint ends, not until the caller commits: an advisory runner whose table has no
    /// attempt column (its claim then writes nothing) may claim the row in between, and the
    /// handler would find the row gone at its settlement. Cancel on a pool or a connection
    /// there, or commit at once.
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`] for a name that cannot be quoted; [`Error::Database`].
    pub fn cancel<'e, 'c: 'e, DB, A>(
        &'e self,
        conn: A,
        id: i64,
    ) -> BoxFuture<'e, Result<Cancellation>>
    where
        DB: Backend,
        A: Acquire<'c, Database = DB> + Send + 'e,
    {
        Box::pin(async move {
            let names = Names::of_table(DB::DIALECT, self)?;
            let sql = dialect::cancel(&names);
            let mut conn = conn.acquire().await?;
            self.cancel_in_tx::<DB>(&mut conn, &names, &sql, Target::Id(id))
                .await
        })
    }

    /// Cancels the unfinished job that holds unique key `key` (see [`cancel`](Table::cancel));
    /// [`Cancellation::NotFound`] when no unfinished job holds it.
    ///
    /// # Errors
    ///
    /// As [`cancel`](Table::cancel); [`Error::InvalidJob`] on a table without a
    /// [unique key column](Table::unique_key).
    pub fn cancel_unique<'e, 'c: 'e, DB, A>(
        &'e self,
        conn: A,
        key: &'e str,
    ) -> BoxFuture<'e, Result<Cancellation>>
    where
        DB: Backend,
        A: Acquire<'c, Database = DB> + Send + 'e,
    {
        Box::pin(async move {
            let names = Names::of_table(DB::DIALECT, self)?;
            let sql = dialect::cancel(&names);
            let Some(by_key) = &sql.by_key else {
                return Err(Error::invalid_job(
                    &self.name,
                    format!(
                        "cancel_unique needs a unique key column: declare it with \
                         `Table::unique_key(..)` on table `{}`",
                        self.name
                    ),
                ));
            };
            let mut conn = conn.acquire().await?;
            let target = Target::Unique { by_key, key };
            self.cancel_in_tx::<DB>(&mut conn, &names, &sql, target)
                .await
        })
    }
}

/// The job a cancellation names.
enum Target<'a> {
    Id(i64),
    /// The unfinished job holding unique key `key`, read by `by_key` inside the cancellation's
    /// transaction.
    Unique {
        by_key: &'a Stmt,
        key: &'a str,
    },
}

/// Opens a cancellation's transaction on `conn` (a savepoint inside the caller's). SQLite's
/// takes the write lock at once (`BEGIN IMMEDIATE`): a cancellation that reads whether the row
/// is there before it records a request would otherwise fail to write on a snapshot another
/// writer outdated.
async fn begin<DB: Backend>(conn: &mut DB::Connection) -> Result<sqlx::Transaction<'_, DB>> {
    Ok(match dialect::begin_write(DB::DIALECT) {
        Some(begin) if !backend::in_transaction::<DB>(conn) => {
            sqlx::Connection::begin_with(conn, begin).await?
        }
        _ => sqlx::Connection::begin(conn).await?,
    })
}

impl Table {
    /// Cancels the job `target` names in a transaction of its own on `conn` (a savepoint inside
    /// the caller's), and commits it.
    async fn cancel_in_tx<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        target: Target<'_>,
    ) -> Result<Cancellation> {
        let identity = self.keys_identity::<DB>(conn, sql).await?;
        let mut tx = begin::<DB>(conn).await?;
        let id = match target {
            Target::Id(id) => Some(id),
            Target::Unique { by_key, key } => {
                let args = Args {
                    unique_key: Some(key),
                    ..Args::default()
                };
                backend::fetch_i64::<DB>(&mut tx, bound::<DB>(by_key, &args)).await?
            }
        };
        let (done, taken) = match id {
            Some(id) => {
                self.cancel_on::<DB>(&mut tx, names, sql, identity.as_deref(), id)
                    .await?
            }
            None => (Cancellation::NotFound, None),
        };
        tx.commit().await?;
        // SQLite: the row's key, taken in the process, is free once the removal committed.
        drop(taken);
        Ok(done)
    }

    /// Cancels row `id` inside a transaction of `conn`, whose table's advisory keys (where
    /// `sql` tests them) are made of `identity`. SQLite: returns the row's key too, taken in the
    /// process while the row is removed, which the caller releases once it committed (or, on an
    /// error, dropped at once: the transaction then rolls back, its removal never seen).
    async fn cancel_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        identity: Option<&str>,
        id: i64,
    ) -> Result<(Cancellation, Option<in_process::Taken>)> {
        let (key, held) = match (sql.keys, identity) {
            (Some(KeysAt::Process), Some(identity)) => {
                match in_process::take_for_now(dialect::fnv1a_64(identity), id) {
                    Some(key) => (Some(key), false),
                    // A runner holds it: the job is in work (or being claimed, then delivered
                    // and told at the runner's first read of requests).
                    None => (None, true),
                }
            }
            _ => (None, false),
        };
        let server = match sql.keys {
            Some(KeysAt::Server) => identity,
            _ => None,
        };
        let done = self
            .cancel_row::<DB>(conn, names, sql, server, held, id)
            .await?;
        Ok((done, key))
    }

    /// [`cancel_on`](Self::cancel_on)'s statements: the keys of `server` (its identity) taken on
    /// the server, the row passed over as in work when `held` (a key this process holds).
    async fn cancel_row<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        server: Option<&str>,
        held: bool,
        id: i64,
    ) -> Result<Cancellation> {
        let class = server.map(dialect::fnv1a_32);
        let prefix = server.map(|key| format!("{key}:"));
        let notice = format!("{CANCEL_NOTICE}{id}");
        let args = Args {
            id,
            now: Some(Clock::default().now()),
            key_class: class.map_or(0, i64::from),
            key_prefix: prefix.as_deref(),
            notify_table: Some(&names.table),
            notify_payload: Some(&notice),
            ..Args::default()
        };
        let leased = match &sql.probe {
            // MySQL/MariaDB: the row locked and read first (and its advisory key taken, where
            // asked); no row is a finished one, or one a row lock claim holds.
            Some(probe) => {
                let rows = DB::fetch_all(conn, bound::<DB>(probe, &args)).await?;
                match rows.first() {
                    None => None,
                    Some(row) => {
                        let key_free = server.is_none() || DB::get_i64(row, 1)? == 1;
                        if key_free {
                            DB::execute(conn, bound::<DB>(&sql.remove, &args)).await?;
                        }
                        if let (true, Some(release)) = (key_free, &sql.release) {
                            DB::execute(conn, bound::<DB>(release, &args)).await?;
                        }
                        key_free.then(|| DB::get_i64(row, 0)).transpose()?
                    }
                }
            }
            None if held => None,
            None => backend::fetch_i64::<DB>(conn, bound::<DB>(&sql.remove, &args)).await?,
        };
        let Some(leased) = leased else {
            let held = backend::fetch_i64::<DB>(conn, bound::<DB>(&sql.exists, &args)).await?;
            if held.is_none() {
                return Ok(Cancellation::NotFound);
            }
            if let Some(request) = &sql.request {
                DB::execute(conn, bound::<DB>(request, &args)).await?;
            }
            if let Some(notify) = &sql.notify {
                DB::execute(conn, bound::<DB>(notify, &args)).await?;
            }
            return Ok(Cancellation::Requested(id));
        };
        if let Some(unlease) = &sql.unlease {
            DB::execute(conn, bound::<DB>(unlease, &args)).await?;
        }
        if leased != 1 {
            return Ok(Cancellation::Cancelled(id));
        }
        // PostgreSQL: a runner listening on the table's channel learns of it at commit.
        if let Some(notify) = &sql.notify {
            DB::execute(conn, bound::<DB>(notify, &args)).await?;
        }
        Ok(Cancellation::Requested(id))
    }

    /// What the table's advisory keys are made of (see `dialect::identity_key`), where `sql`
    /// tests them: read before the cancellation's transaction begins (SQLite's would otherwise
    /// begin as a read).
    async fn keys_identity<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        sql: &CancelSql,
    ) -> Result<Option<String>> {
        if sql.keys.is_none() {
            return Ok(None);
        }
        let quoted = DB::DIALECT.quote_table(&self.name)?;
        let identity = dialect::identity(DB::DIALECT, &self.name, &quoted)?;
        let query = backend::query::<DB>(SqlStr::from_static(identity.sql), identity.values)
            .persistent(false);
        let found = backend::fetch_texts::<DB, 4>(conn, query).await?;
        let Some(row) = found.into_iter().next() else {
            return Err(Error::schema(
                &self.name,
                &self.name,
                None,
                "the table does not exist",
            ));
        };
        Ok(Some(dialect::identity_key(DB::DIALECT, &row)))
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests;
