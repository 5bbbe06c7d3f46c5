//! The claim forms: how a row is claimed, held while its handler works, and settled — one type
//! per form behind [`Form`], each form's whole story in its own file, from the statements it
//! prepares at start to the release of a cancelled delivery's row.
//!
//! | | [`LeaseForm`](lease::LeaseForm) | [`RowLockForm`](row_lock::RowLockForm) | [`AdvisoryForm`](advisory::AdvisoryForm) |
//! |---|---|---|---|
//! | a row is held by ([`Form::Hold`]) | its lease token | the claim's transaction | a session lock on its key |
//! | a claim takes | a row for every free worker | one row, for one worker | one row, for one worker |
//! | a transactional handler writes in | a transaction of its own | a savepoint of the claim's | a transaction on the key's session |
//!
//! What several forms share sits beside them: [`Held`] (the connection of a form that keeps one
//! per delivery), the settlement's pieces (`settle`), running a statement (`exec`), and the
//! checks and catalog reads at start (`schema`, `catalog`).

pub(crate) mod advisory;
mod catalog;
mod conns;
mod dead_table;
mod exec;
mod floor;
mod held;
pub(crate) mod lease;
pub(crate) mod rate;
#[cfg(feature = "metrics")]
mod readiness;
mod requests;
pub(crate) mod row_lock;
mod schema;
mod settle;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{self, Backend, ClaimedRow, HeldConn};
use crate::config::QueueConfig;
use crate::delivery::Outcome;
use crate::error::{Error, Result};

pub(crate) use catalog::Identity;
pub(crate) use conns::Conns;
pub(crate) use exec::{
    execute, fetch_all, fetch_claimed, fetch_i64, fetch_i64s, fetch_row, fetch_sets,
    in_transaction, on_conn,
};
pub(crate) use held::Held;
#[cfg(feature = "metrics")]
pub(crate) use readiness::Readiness;
pub(crate) use schema::{Checked, Server, check, custom_statements, measure_server};
pub(crate) use settle::{Custom, Dead, no_dead_letter, no_retry_after, settlement_args};

/// How long a delivery cancelled at the shutdown timeout waits for each statement that returns
/// its row (a lease extension in flight, the release, ending its server session) before it gives
/// up on it: [`Running::shutdown`](crate::Running::shutdown) returns at most twice this after the
/// timeout.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

/// A batch as a claim took it: its rows, and what holds them.
pub(crate) type ClaimedBatch<DB, F> = (Vec<ClaimedRow>, <F as Form<DB>>::Batch);

/// What [`Form::settle_batch_and_claim`] gives: the settlement's results (or the batch's
/// rollback and the row whose statement failed), and the next batch when it claimed one.
pub(crate) type SettledAndClaimed<DB, F> = (
    Result<Vec<Result<()>>, (Option<i64>, Error)>,
    Option<ClaimedBatch<DB, F>>,
);

/// What a settlement did, where it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// What its outcome asked.
    AsAsked,
    /// The row was removed instead: the job had been cancelled while in work, which the
    /// settlement found in its transaction (`requests`), and nothing of its handler's committed.
    Cancelled,
}

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
    /// Rows per worker a queue of single deliveries keeps waiting for their grouped ack, beyond
    /// its rows in work or waiting for a worker (one claim serves every free worker).
    const ACKS_IN_HAND: usize = 1;
    /// A row is held by a key its release unlocks (counted at shutdown).
    const HOLDS_KEYS: bool = false;
    /// A batch's settlement can claim the next batch with it
    /// ([`Form::settle_batch_and_claim`]): the lease form on SQLite, the advisory form on SQLite
    /// and MySQL/MariaDB, the row lock form on PostgreSQL.
    const CLAIMS_WITH_SETTLEMENT: bool = false;

    /// Renders the form's statements and prepares them on `conn`, once the checks every form
    /// shares passed.
    fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> impl Future<Output = Result<Self>> + Send;

    /// Claims up to `want` rows (one, unless [`Form::ONE_CLAIM`]) for worker `worker` of
    /// `workers`, passing over the ids `excluded` gives (asked once the claim has what it runs
    /// on, so that a row held back while it waited is passed over); each row with its hold.
    fn claim(
        &self,
        conns: &Conns<DB>,
        want: usize,
        worker: (usize, usize),
        excluded: &(dyn Fn() -> Vec<i64> + Sync),
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

    /// When a row claimed ahead of the workers that still waits for one goes back, released
    /// unstarted, and the wait that records as a worker's busy time: a lease at half its lease
    /// (`extend_every`), before it expires; `None`: it waits for a worker however long.
    fn given_back_at(&self, hold: &Self::Hold) -> Option<(Instant, Duration)> {
        self.extend_every(hold)
            .map(|(every, since)| (since + every, every))
    }

    /// Whether row `id`, which waited for a worker since its claim, is still held, asked before
    /// its handler starts (a hold that expires is renewed instead: `extend_every`). `true` but
    /// where a hold can go unseen: the advisory form's plain deliveries, whose session the
    /// server may have ended while the row waited.
    fn still_held(&self, id: i64, hold: &Self::Hold) -> impl Future<Output = bool> + Send {
        let _ = (id, hold);
        async { true }
    }

    /// Whether the server session holding row `id` (its transaction, its key) is gone — the
    /// server ended it, or restarted — so that the row may be claimed again while its handler
    /// runs: asked every poll interval while a handler runs on a hold that does not expire.
    /// `false` where the form cannot tell without disturbing the handler (a session lent to a
    /// transactional handler: its own statements find out) or holds nothing on a session.
    fn session_lost(&self, id: i64, hold: &mut Self::Hold) -> impl Future<Output = bool> + Send {
        let _ = (id, hold);
        async { false }
    }

    /// How often a batch's holds must be extended while its handler works, and from when.
    fn extend_batch_every(&self, batch: &Self::Batch) -> Option<(Duration, Instant)> {
        let _ = batch;
        None
    }

    /// Extends the holds of a batch's rows `ids`: the ids whose hold was lost (a lease taken
    /// away: the job cancelled, or its lease expired and taken).
    fn extend_batch(
        &self,
        conns: &Conns<DB>,
        ids: &[i64],
        batch: &mut Self::Batch,
    ) -> impl Future<Output = Vec<i64>> + Send {
        let _ = (conns, ids, batch);
        async { Vec::new() }
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
    /// delivery's own transaction, which an ack commits with the settlement. The row lock and
    /// advisory forms, where the table records cancel requests, remove the row instead when
    /// its job was cancelled in work and the outcome would commit anything else
    /// ([`Settled::Cancelled`]).
    fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Self::Hold,
        outcome: Outcome,
        tx: Option<HeldConn<DB>>,
    ) -> impl Future<Output = Result<Settled>> + Send;

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
                let done = self.settle(conns, id, hold, outcome, None).await;
                settled.push(done.map(drop));
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

    /// Settles a batch as [`settle_batch`](Form::settle_batch) does and, where the form can
    /// join the two, claims the next batch of up to `next` rows with it (the lease and
    /// advisory forms on SQLite, in the same transaction: one commit, one wait for the WAL's
    /// fsync, where a settlement and a claim take two; the advisory form on MySQL/MariaDB, the
    /// claim's first statement in the settlement's round trip; the row lock form on
    /// PostgreSQL, the batch's `DELETE` and `COMMIT` and the next batch's `BEGIN` and claim in
    /// one round trip). The settlement's results, and
    /// the next batch when this claimed one (`None`: the caller claims as usual). The caller
    /// asks for none (`next` 0) with a batch settled `one_by_one`.
    fn settle_batch_and_claim(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        batch: Self::Batch,
        one_by_one: bool,
        next: usize,
    ) -> impl Future<Output = SettledAndClaimed<DB, Self>> + Send {
        let _ = next;
        async move {
            let settled = self
                .settle_batch(conns, settlements, batch, one_by_one)
                .await;
            (settled, None)
        }
    }

    /// Releases row `id` unsettled, at once: whether it was still held. A connection whose
    /// release fails is closed, and the server releases what it held.
    fn release(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Self::Hold,
    ) -> impl Future<Output = bool> + Send;

    /// Releases a row claimed but never delivered (the runner stopped before a worker took it)
    /// as [`Form::release`] does, and uncounts its attempt where the claim counted it and the
    /// release cannot undo it: `attempt` is the count the claim read.
    fn release_unstarted(
        &self,
        conns: &Conns<DB>,
        id: i64,
        attempt: Option<i64>,
        hold: Self::Hold,
    ) -> impl Future<Output = bool> + Send {
        let _ = attempt;
        self.release(conns, id, hold)
    }

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
