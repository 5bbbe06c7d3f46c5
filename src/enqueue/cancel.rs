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

use sqlx::SqlStr;

use super::bound;
use super::transaction::Runs;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cancellation {
    /// The job was not in work: its row is deleted (or marked `processed_at`), and it will not
    /// be delivered.
    Cancelled(i64),
    /// The job is in work, and nothing its handler writes through its transaction will commit.
    ///
    /// On a lease queue its lease is taken away — the row is deleted (or marked) already — so
    /// its settlement, fenced by its lease, changes nothing;
    /// its handler's [`Delivery::cancelled`](crate::Delivery::cancelled) fires at the runner's
    /// next renewal (PostgreSQL, a runner listening on the table's channel: when the
    /// notification arrives, and a row claimed ahead that no worker has started by then never
    /// starts).
    ///
    /// A row a row lock claim or an advisory key holds gets a request in the table's
    /// [cancel requests' table](Table::cancel_requests): its runner fires `cancelled()`
    /// (PostgreSQL when the notification arrives, else within its poll interval) unless the
    /// handler has returned already, and its settlement removes the row whatever the handler
    /// returned: a single delivery's settlement that would commit anything else — a
    /// transactional ack's writes, a retry, a delay, a move to the dead letter — takes the
    /// row's request for itself first, in the transaction it commits in, and finds this one
    /// (the two wait for each other's commit: whichever commits first decides). A batch's row
    /// retried as this answer is given returns to the queue with its request, and its next
    /// delivery is cancelled.
    Requested(i64),
    /// No unfinished job has this id (or key): it finished, was cancelled before, or never was.
    NotFound,
    /// The job is in work, held by a row lock claim or an advisory key, on a table that declares
    /// no [cancel requests' table](Table::cancel_requests): nothing was changed, and it runs to
    /// its end (declare that table to cancel jobs in work on the row lock and advisory forms).
    InWork(i64),
}

impl Cancellation {
    /// The job's id, unless none was found.
    pub fn id(self) -> Option<i64> {
        match self {
            Cancellation::Cancelled(id)
            | Cancellation::Requested(id)
            | Cancellation::InWork(id) => Some(id),
            Cancellation::NotFound => None,
        }
    }
}

impl Table {
    /// Cancels job `id` on `conn` ([`Queue::cancel`](crate::Queue::cancel): the table carries
    /// the lease column of the queue's form, where it is the lease form).
    pub(crate) async fn cancel_on_conn<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        id: i64,
    ) -> Result<Cancellation> {
        let names = Names::of_table(DB::DIALECT, self)?;
        let sql = dialect::cancel(&names);
        self.cancel_in_tx::<DB>(conn, &names, &sql, Target::Id(id))
            .await
    }

    /// Cancels the unfinished job holding unique key `key` on `conn`
    /// ([`Queue::cancel_unique`](crate::Queue::cancel_unique)).
    pub(crate) async fn cancel_unique_on_conn<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        key: &str,
    ) -> Result<Cancellation> {
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
        let target = Target::Unique { by_key, key };
        self.cancel_in_tx::<DB>(conn, &names, &sql, target).await
    }
}

/// The values that make a table's server keys ([`KeysAt::Server`]) of its `identity`: their
/// class (PostgreSQL) and name prefix (MySQL/MariaDB).
fn server_key(identity: &str) -> (i64, String) {
    (
        i64::from(dialect::fnv1a_32(identity)),
        format!("{identity}:"),
    )
}

/// The job a cancellation names.
#[derive(Clone, Copy)]
enum Target<'a> {
    Id(i64),
    /// The unfinished job holding unique key `key`, read by `by_key` inside the cancellation's
    /// transaction.
    Unique {
        by_key: &'a Stmt,
        key: &'a str,
    },
}

impl Table {
    /// Cancels the job `target` names in a transaction of its own on `conn` (a savepoint inside
    /// the caller's; on a pool, run again after a deadlock), and commits it.
    async fn cancel_in_tx<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        target: Target<'_>,
    ) -> Result<Cancellation> {
        let identity = self.keys_identity::<DB>(conn, sql).await?;
        let identity = identity.as_deref();
        // MySQL/MariaDB: the row whose key the runs took on the server, and how many times (a
        // run ended by a deadlock keeps it: the next takes it again).
        let (mut key_of, mut times) = (None, 0);
        let mut runs = Runs::on::<DB>(conn, true);
        let cancelled = loop {
            let mut run = match runs.begin::<DB>(conn).await {
                Ok(run) => run,
                Err(error) => break Err(error),
            };
            let mut took = None;
            let once = self.cancel_once::<DB>(&mut run, names, sql, target, identity, &mut took);
            let cancelled = once.await;
            if took.is_some() {
                (key_of, times) = (took, times + 1);
            }
            if let Some(cancelled) = runs.end(run, cancelled).await {
                break cancelled;
            }
        };
        // SQLite: the row's key, taken in the process, is free once the removal committed (or
        // rolled back).
        let done = cancelled.map(|(done, _key)| done);
        // MySQL/MariaDB: the key goes back once the removal committed (inside the caller's
        // transaction, once its savepoint did), or rolled back: a claim that took it before
        // would read the row again as it was, and deliver it.
        if let (Some(id), Some(release), Some(identity)) = (key_of, &sql.release, identity) {
            let (class, prefix) = server_key(identity);
            let args = Args {
                id,
                key_class: class,
                key_prefix: Some(&prefix),
                ..Args::default()
            };
            for _ in 0..times {
                DB::execute(conn, bound::<DB>(release, &args)).await?;
            }
        }
        done
    }

    /// One run of a cancellation in its transaction `tx`: the job `target` names found, and
    /// cancelled. `took`: the row whose key it took on the server (MySQL/MariaDB).
    async fn cancel_once<DB: Backend>(
        &self,
        tx: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        target: Target<'_>,
        identity: Option<&str>,
        took: &mut Option<i64>,
    ) -> Result<(Cancellation, Option<in_process::Taken>)> {
        let id = match target {
            Target::Id(id) => Some(id),
            Target::Unique { by_key, key } => {
                let args = Args {
                    unique_key: Some(key),
                    ..Args::default()
                };
                backend::fetch_i64::<DB>(tx, bound::<DB>(by_key, &args)).await?
            }
        };
        let Some(id) = id else {
            return Ok((Cancellation::NotFound, None));
        };
        let mut key_taken = false;
        let cancelled = self
            .cancel_on::<DB>(tx, names, sql, identity, id, &mut key_taken)
            .await;
        if key_taken {
            *took = Some(id);
        }
        cancelled
    }

    /// Cancels row `id` inside a transaction of `conn`, whose table's advisory keys (where
    /// `sql` tests them) are made of `identity`. SQLite: returns the row's key too, taken in the
    /// process while the row is removed, which the caller releases once it committed (or, on an
    /// error, dropped at once: the transaction then rolls back, its removal never seen).
    /// MySQL/MariaDB: sets `key_taken` when it took the row's key on the server, which the
    /// caller releases once the transaction ended.
    async fn cancel_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        identity: Option<&str>,
        id: i64,
        key_taken: &mut bool,
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
            .cancel_row::<DB>(conn, names, sql, server, held, id, key_taken)
            .await?;
        Ok((done, key))
    }

    /// [`cancel_on`](Self::cancel_on)'s statements: the keys of `server` (its identity) taken on
    /// the server (`key_taken` set when taken, MySQL/MariaDB), the row passed over as in work
    /// when `held` (a key this process holds).
    #[allow(
        clippy::too_many_arguments,
        reason = "the cancellation's parts, read once each"
    )]
    async fn cancel_row<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        names: &Names,
        sql: &CancelSql,
        server: Option<&str>,
        held: bool,
        id: i64,
        key_taken: &mut bool,
    ) -> Result<Cancellation> {
        let (class, prefix) = server.map(server_key).unzip();
        let notice = format!("{CANCEL_NOTICE}{id}");
        let args = Args {
            id,
            now: Some(Clock::default().now()),
            key_class: class.unwrap_or(0),
            key_prefix: prefix.as_deref(),
            notify_table: Some(&names.table),
            notify_payload: Some(&notice),
            ..Args::default()
        };
        // The request first: a settlement that takes it for itself before committing what a
        // cancelled job must not (`form::requests`) waits for this transaction, or this one for
        // it — so a job found in work below is one whose settlement will find the request.
        if let Some(request) = &sql.request {
            DB::execute(conn, bound::<DB>(request, &args)).await?;
        }
        let leased = match &sql.probe {
            // MySQL/MariaDB: the row locked and read first (and its advisory key taken, where
            // asked); no row is a finished one, or one a row lock claim holds.
            Some(probe) => {
                let rows = DB::fetch_all(conn, bound::<DB>(probe, &args)).await?;
                match rows.first() {
                    None => None,
                    Some(row) => {
                        let key_free = server.is_none() || DB::get_i64(row, 1)? == 1;
                        *key_taken = server.is_some() && key_free;
                        if key_free {
                            DB::execute(conn, bound::<DB>(&sql.remove, &args)).await?;
                        }
                        key_free.then(|| DB::get_i64(row, 0)).transpose()?
                    }
                }
            }
            None if held => None,
            None => backend::fetch_i64::<DB>(conn, bound::<DB>(&sql.remove, &args)).await?,
        };
        let Some(leased) = leased else {
            let in_work = backend::fetch_i64::<DB>(conn, bound::<DB>(&sql.exists, &args))
                .await?
                .is_some();
            if !in_work {
                self.forget::<DB>(conn, sql, &args).await?;
                return Ok(Cancellation::NotFound);
            }
            if sql.request.is_none() {
                return Ok(Cancellation::InWork(id));
            }
            if let Some(notify) = &sql.notify {
                DB::execute(conn, bound::<DB>(notify, &args)).await?;
            }
            return Ok(Cancellation::Requested(id));
        };
        self.forget::<DB>(conn, sql, &args).await?;
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

    /// Removes the request this cancellation inserted first (or found), for a job that was not
    /// in work after all: removed, or finished.
    async fn forget<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        sql: &CancelSql,
        args: &Args<'_>,
    ) -> Result<()> {
        if let Some(forget) = &sql.forget {
            DB::execute(conn, bound::<DB>(forget, args)).await?;
        }
        Ok(())
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
