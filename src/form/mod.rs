//! The claim forms: how a row is claimed, held while its handler works, and settled — one type
//! per form behind [`Form`], each form's whole story in its own file, from the statements it
//! prepares at start to the release of a cancelled delivery's row.
//!
//! | | [`LeaseForm`](lease::LeaseForm) | [`RowLockForm`](row_lock::RowLockForm) | [`AdvisoryForm`](advisory::AdvisoryForm) |
//! |---|---|---|---|
//! | a row is held by ([`Form::Hold`]) | its lease token | the claim's transaction | a session lock on its key |
//! | a claim takes | a row for every free worker | one row, for one worker | one row, for one worker |
//! | a transactional handler writes in | a transaction of its own | a savepoint of the claim's | a transaction on the key's session |

pub(crate) mod advisory;
mod catalog;
mod conns;
mod dead_table;
pub(crate) mod lease;
pub(crate) mod row_lock;
mod schema;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection as _;
use tokio::time::Instant;

use crate::backend::{self, Backend, ClaimedRow, HeldConn};
use crate::config::{Event, QueueConfig};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, DeadSql, Stmt};
use crate::error::{Error, Result};

pub(crate) use catalog::Identity;
pub(crate) use conns::Conns;
pub(crate) use schema::{Checked, Server, check, measure_server};

/// How long a delivery cancelled at the shutdown timeout waits for each statement that returns
/// its row (a lease extension in flight, the release, ending its server session) before it gives
/// up on it: [`Running::shutdown`](crate::Running::shutdown) returns at most twice this after the
/// timeout.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// A claim form of a mounted queue, with its rendered statements.
pub(crate) trait Form<DB: Backend>: Sized + Send + Sync + 'static {
    /// What holds one claimed row until its delivery settles.
    type Hold: Send + 'static;
    /// What holds the rows of one batch.
    type Batch: Send + 'static;

    /// One claim serves every free worker (the lease form); else each worker claims its own row,
    /// on a connection that then holds it.
    const ONE_CLAIM: bool;
    /// Acks and drops of many deliveries settle together ([`Form::settle_many`]).
    const GROUPS_ACKS: bool = false;
    /// A row is held by a key its release unlocks (counted at shutdown).
    const HOLDS_KEYS: bool = false;

    /// Renders the form's statements and prepares them on `conn`, once the checks every form
    /// shares passed.
    fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> impl Future<Output = Result<Self>> + Send;

    /// Claims up to `want` rows (one, unless [`Form::ONE_CLAIM`]) for worker `worker` of
    /// `workers`, passing over the `excluded` ids; each row with its hold.
    fn claim(
        &self,
        conns: &Conns<DB>,
        want: usize,
        worker: (usize, usize),
        excluded: &[i64],
    ) -> impl Future<Output = Result<Vec<(ClaimedRow, Self::Hold)>, ClaimFailed>> + Send;

    /// Claims up to `size` rows held together, for one batch.
    fn claim_batch(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> impl Future<Output = Result<(Vec<ClaimedRow>, Self::Batch), ClaimFailed>> + Send;

    /// The row a claim that failed for a reason of its own failed on, where the claim does not
    /// say (an advisory take does): the id it would take next, passing over `excluded`.
    fn next(
        &self,
        conns: &Conns<DB>,
        excluded: &[i64],
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;

    /// How often a hold must be extended while its handler works, and from when: `None` for a
    /// hold that does not expire.
    fn extend_every(&self, hold: &Self::Hold) -> Option<(Duration, Instant)> {
        let _ = hold;
        None
    }

    /// The hold an extension of `hold` made now writes, known before it is sent (so that the
    /// release of a delivery cancelled meanwhile can fence both); `None` for a hold that does
    /// not expire.
    fn extension(&self, hold: &Self::Hold) -> Option<Self::Hold> {
        let _ = hold;
        None
    }

    /// Extends row `id`'s hold from `from` to `to`: whether it was still held.
    fn extend(
        &self,
        conns: &Conns<DB>,
        id: i64,
        from: &Self::Hold,
        to: &Self::Hold,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send {
        let _ = (conns, id, from, to);
        async { Ok(true) }
    }

    /// How often a batch's holds must be extended while its handler works, and from when.
    fn extend_batch_every(&self, batch: &Self::Batch) -> Option<(Duration, Instant)> {
        let _ = batch;
        None
    }

    /// Extends the holds of a batch's rows `ids`.
    fn extend_batch(
        &self,
        conns: &Conns<DB>,
        ids: &[i64],
        batch: &mut Self::Batch,
    ) -> impl Future<Output = ()> + Send {
        let _ = (conns, ids, batch);
        async {}
    }

    /// Lends a transactional delivery its transaction.
    fn lend(
        &self,
        conns: &Conns<DB>,
        hold: &mut Self::Hold,
    ) -> impl Future<Output = Result<HeldConn<DB>>> + Send;

    /// Ends the handler's part of its transaction, taken back from the handler: kept for the
    /// settlement on `ack`, rolled back otherwise. Returns the transaction where the settlement
    /// needs it apart from the hold (the lease form's own transaction, on an ack).
    fn take_back(
        &self,
        conns: &Conns<DB>,
        hold: &mut Self::Hold,
        conn: HeldConn<DB>,
        ack: bool,
    ) -> impl Future<Output = Result<Option<HeldConn<DB>>, sqlx::Error>> + Send;

    /// Reads row `id` whole (row mode): in the delivery's transaction `tx` where it has one,
    /// else where the form holds the row.
    fn read_row(
        &self,
        conns: &Conns<DB>,
        hold: &mut Self::Hold,
        tx: Option<&mut HeldConn<DB>>,
        id: i64,
    ) -> impl Future<Output = Result<Option<DB::Row>, sqlx::Error>> + Send;

    /// Settles row `id` by `outcome`, where the form holds it; `tx` is a transactional lease
    /// delivery's own transaction, which an ack commits with the settlement.
    fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Self::Hold,
        outcome: Outcome,
        tx: Option<HeldConn<DB>>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Settles many single deliveries' acks and drops together (one statement on the lease
    /// form; the others one by one): one result per row, in order.
    fn settle_many(
        &self,
        conns: &Conns<DB>,
        rows: Vec<(i64, Self::Hold, Outcome)>,
    ) -> impl Future<Output = Vec<Result<()>>> + Send {
        async move {
            let mut settled = Vec::with_capacity(rows.len());
            for (id, hold, outcome) in rows {
                settled.push(self.settle(conns, id, hold, outcome, None).await);
            }
            settled
        }
    }

    /// Settles a batch: one result per row, in order, or the batch's rollback and the row whose
    /// statement failed, where one did. A form may settle rows of one outcome with one
    /// statement; `one_by_one` asks for a statement per row, which names the row that fails
    /// (after a batch whose set statement failed).
    fn settle_batch(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        batch: Self::Batch,
        one_by_one: bool,
    ) -> impl Future<Output = Result<Vec<Result<()>>, (Option<i64>, Error)>> + Send;

    /// Releases row `id` unsettled, at once: whether it was still held. A connection whose
    /// release fails is closed, and the server releases what it held.
    fn release(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Self::Hold,
    ) -> impl Future<Output = bool> + Send;

    /// Releases a batch's rows unsettled: how many were still held.
    fn release_batch(
        &self,
        conns: &Conns<DB>,
        ids: &[i64],
        batch: Self::Batch,
    ) -> impl Future<Output = u64> + Send;

    /// What a delivery keeps of its hold past its settlement, to hold the row for a delay if
    /// the settlement fails ([`Form::hold_for`]): the lease form's token; `None` elsewhere.
    fn keep(&self, hold: &Self::Hold) -> Option<Self::Hold> {
        let _ = hold;
        None
    }

    /// After a settlement of row `id` failed for the row's own reason: keeps it held for
    /// `delay` where the form can (the lease form keeps its lease), so that no runner takes it
    /// again before. `kept`: what [`Form::keep`] kept.
    fn hold_for(
        &self,
        conns: &Conns<DB>,
        id: i64,
        kept: Self::Hold,
        delay: Duration,
    ) -> impl Future<Output = ()> + Send {
        let _ = (conns, id, kept, delay);
        async {}
    }

    /// Returns the row of a delivery cancelled at the shutdown timeout, whatever its connection
    /// is doing (a lent connection was closed already): within [`GRACE`] per statement.
    /// `extending`: the hold of an extension in flight, whose outcome is unknown.
    fn abandon(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Self::Hold,
        extending: Option<Self::Hold>,
    ) -> impl Future<Output = Returned> + Send;
}

/// What holds a row of the forms that hold a connection per delivery: that connection (the
/// claim's transaction, the row's key) — away while a transactional handler has it — and its
/// server session, where the claim read it (to end it if the delivery is cancelled).
#[derive(Debug)]
pub(crate) struct Held<DB: Backend> {
    conn: Option<HeldConn<DB>>,
    session: Option<i64>,
}

impl<DB: Backend> Held<DB> {
    fn new(conn: HeldConn<DB>, session: Option<i64>) -> Self {
        Held {
            conn: Some(conn),
            session,
        }
    }

    /// Lends the connection to a transactional handler, its transaction (or savepoint) begun by
    /// `begin`; `None` if it is lent already.
    async fn lend(
        &mut self,
        begin: Option<&'static str>,
    ) -> Option<Result<HeldConn<DB>, sqlx::Error>> {
        let mut conn = self.conn.take()?;
        if let Err(error) = conn.begin(begin).await {
            self.conn = Some(conn);
            return Some(Err(error));
        }
        conn.lend();
        Some(Ok(conn))
    }

    /// Returns a row of a delivery cancelled at the shutdown timeout. A connection lent to the
    /// handler was closed (the server rolls back and releases what it held): its server session
    /// is ended, so that a statement still running there ends too. Otherwise `release` (a
    /// rollback, an unlock) runs on it within [`GRACE`]; past it, the connection is closed.
    async fn abandon(
        self,
        conns: &Conns<DB>,
        release: impl AsyncFnOnce(HeldConn<DB>) -> bool,
    ) -> Returned {
        match (self.conn, self.session) {
            (None, session) => {
                if let Some(session) = session {
                    end_session(conns, session).await;
                }
                Returned::Released
            }
            (Some(conn), _) => match tokio::time::timeout(GRACE, release(conn)).await {
                Ok(true) => Returned::Released,
                Ok(false) | Err(_) => Returned::Unconfirmed,
            },
        }
    }
}

/// Ends a cancelled delivery's server session from another connection, within the grace.
async fn end_session<DB: Backend>(conns: &Conns<DB>, session: i64) {
    let ended = tokio::time::timeout(GRACE, async {
        let mut conn = conns.pool.acquire().await?;
        DB::end_session(&mut conn, session).await
    })
    .await;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, session, "could not end a cancelled delivery's session");
        }
        Err(_) => tracing::warn!(
            session,
            "could not end a cancelled delivery's session in time"
        ),
    }
}

/// What became of a cancelled delivery's row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Returned {
    /// Released (or its session ended, which releases it).
    Released,
    /// No longer held by the delivery (its lease was lost).
    NotHeld,
    /// Not confirmed in time: it returns when its lease expires or its connection closes.
    Unconfirmed,
}

/// A claim that failed, and the row it failed on where the form knows it (an advisory take).
#[derive(Debug)]
pub(crate) struct ClaimFailed {
    pub(crate) row: Option<i64>,
    pub(crate) error: Error,
}

impl ClaimFailed {
    /// Whether it failed for a reason of one row's own (see [`backend::is_row_error`]).
    pub(crate) fn is_row_error(&self) -> bool {
        matches!(&self.error, Error::Database(error) if backend::is_row_error(error))
    }
}

impl From<sqlx::Error> for ClaimFailed {
    fn from(error: sqlx::Error) -> Self {
        ClaimFailed {
            row: None,
            error: error.into(),
        }
    }
}

impl From<Error> for ClaimFailed {
    fn from(error: Error) -> Self {
        ClaimFailed { row: None, error }
    }
}

/// A queue's dead letter, rendered for its form.
#[derive(Debug)]
pub(crate) struct Dead {
    pub(crate) sql: DeadSql,
    /// The dead-letter group, for a group dead letter.
    pub(crate) group: Option<Arc<str>>,
}

impl Dead {
    /// Moves the row `args` names on `conn`: whether it was moved (a lease form's move finds no
    /// row when the lease was lost). A copy-then-delete runs in the transaction `conn` is in, or
    /// in one of its own, committed only when the delete removed the row.
    pub(crate) async fn run<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        args: &Args<'_>,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            dead_group: self.group.as_deref(),
            ..*args
        };
        match &self.sql {
            DeadSql::One(stmt) => Ok(execute::<DB>(conn, stmt, &args).await? > 0),
            DeadSql::CopyDelete { copy, delete } => {
                let own = conn.depth() == 0;
                if own {
                    conn.begin(None).await?;
                }
                execute::<DB>(conn, copy, &args).await?;
                let moved = execute::<DB>(conn, delete, &args).await? > 0;
                if own {
                    if moved {
                        conn.commit().await?;
                    } else {
                        conn.rollback().await?;
                    }
                }
                Ok(moved)
            }
        }
    }
}

/// A queue's own settlement statements ([`Queue::custom`](crate::Queue::custom)).
#[derive(Debug, Default)]
pub(crate) struct Custom(Vec<(Event, Stmt)>);

impl Custom {
    pub(crate) fn new(statements: Vec<(Event, Stmt)>) -> Self {
        Custom(statements)
    }

    /// The statement that replaces the crate's for `settle`, if the queue has one.
    pub(crate) fn get(&self, settle: Settle) -> Option<&Stmt> {
        let event = match settle {
            Settle::Ack => Event::Ack,
            Settle::Drop | Settle::Undecodable => Event::Drop,
            Settle::Retry => Event::Retry,
            Settle::RetryAfter(_) => Event::RetryAfter,
            Settle::DeadLetter => Event::DeadLetter,
        };
        self.0
            .iter()
            .find_map(|(e, stmt)| (*e == event).then_some(stmt))
    }

    pub(crate) fn statements(&self) -> impl Iterator<Item = &Stmt> {
        self.0.iter().map(|(_, stmt)| stmt)
    }
}

/// The values of a settlement of row `id` by `outcome`: the time, the delay, the groups.
pub(crate) fn settlement_args<'a>(checked: &'a Checked, id: i64, outcome: Outcome) -> Args<'a> {
    let at = match outcome.0 {
        Settle::RetryAfter(delay) => Some(checked.clock.after(delay)),
        _ => None,
    };
    Args {
        id,
        now: Some(checked.clock.now()),
        at,
        group: checked.group.as_deref(),
        dead_group: checked.dead.as_ref().and_then(|dead| dead.group.as_deref()),
        ..Args::default()
    }
}

/// Runs `stmt` with `args` on `conn`: the rows it changed.
pub(crate) async fn execute<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<u64, sqlx::Error> {
    DB::execute(conn, backend::query::<DB>(stmt.sql(), stmt.values(args))).await
}

/// Runs `stmt` with `args` on `conn`, reading its first column as integers.
pub(crate) async fn fetch_i64s<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Vec<i64>, sqlx::Error> {
    backend::fetch_i64s::<DB>(conn, backend::query::<DB>(stmt.sql(), stmt.values(args))).await
}

/// Runs `stmt` with `args` on `conn`, reading its first row's first column as an integer.
pub(crate) async fn fetch_i64<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
) -> Result<Option<i64>, sqlx::Error> {
    backend::fetch_i64::<DB>(conn, backend::query::<DB>(stmt.sql(), stmt.values(args))).await
}

/// Runs the claim `stmt` with `args` on `conn`, reading its rows.
pub(crate) async fn fetch_claimed<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    args: &Args<'_>,
    with_attempt: bool,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let query = backend::query::<DB>(stmt.sql(), stmt.values(args));
    backend::fetch_claimed::<DB>(conn, query, with_attempt).await
}

/// Reads a row whole by `stmt` (row mode), without keeping the statement prepared.
pub(crate) async fn fetch_row<DB: Backend>(
    conn: &mut DB::Connection,
    stmt: &Stmt,
    id: i64,
) -> Result<Option<DB::Row>, sqlx::Error> {
    let args = Args {
        id,
        ..Args::default()
    };
    DB::fetch_transient(conn, backend::query::<DB>(stmt.sql(), stmt.values(&args))).await
}

/// Runs `work` on a connection of `conns`: the connection is kept for the next statement, or
/// given back with the others after a failure.
pub(crate) async fn on_conn<DB: Backend, T>(
    conns: &Conns<DB>,
    work: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut conn = conns.get().await?;
    let done = conns.checked(work(&mut conn).await)?;
    conns.put(conn);
    Ok(done)
}

/// Begins a transaction on `conn` with `begin` (a plain `BEGIN` when `None`), as sqlx's
/// `Connection::begin_with` does, for the MySQL/MariaDB statements that need one.
pub(crate) async fn in_transaction<DB: Backend, T>(
    conn: &mut DB::Connection,
    begin: &'static str,
    work: impl AsyncFnOnce(&mut DB::Connection) -> Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    let mut tx = conn.begin_with(begin).await?;
    let done = work(&mut tx).await?;
    tx.commit().await?;
    Ok(done)
}

/// Logs that a row asked to be dead-lettered on a queue without a dead letter: it is dropped.
pub(crate) fn no_dead_letter(table: &str, id: i64) {
    tracing::error!(
        "row {id} of `{table}` was settled with dead_letter() but its queue has no dead letter: \
         dropped"
    );
}

/// Warns that `retry_after(delay)` is taken as a retry on a table without the column.
pub(crate) fn no_retry_after(table: &str, delay: Duration) {
    tracing::warn!("table `{table}` has no retry_after column: retry_after({delay:?}) is a retry");
}
