//! The advisory lock form: a session lock on the row's key holds the row while its handler runs,
//! on a connection of the delivery's own ([`keys`] says what a key is made of).
//!
//! A claim is one query that takes the keys of up to `n` claimable rows without waiting (the
//! lock in the query: a key another session holds is passed over), and one that reads those rows
//! again (another session may have settled one since the query's snapshot) and counts their
//! attempts. Each settlement statement commits on its own on that session (or with a
//! transactional delivery's transaction on it), then the key is released: on PostgreSQL, acks
//! and drops outside a transaction in the same statement (its transaction keeps each key until
//! it commits); elsewhere a batch settles its acks and drops with one statement and releases
//! its keys with one more.
//!
//! The form's type, its [`Form`] impl and its settlement of one row are here; taking and
//! releasing a key (`take`), reading the rows taken (`reread`), the settlement of many rows
//! (`sets`) and a batch's settlement joined with the next claim (`together`) are beside it.

pub(crate) mod grouped;
mod keys;
mod reread;
mod sets;
mod take;
mod together;

use keys::Keys;
pub(crate) use keys::fnv1a_32;

use super::requests::Requests;
use super::{
    Checked, ClaimFailed, Conns, Form, Held, Returned, Settled, SettledAndClaimed, execute,
    no_dead_letter, no_retry_after, settlement_args,
};
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::config::QueueConfig;
use crate::delivery::{Outcome, Settle};
use crate::dialect::{self, AdvisorySql, Args, Dialect, Stmt};
use crate::error::{Error, Result};

/// Reserves row `id`'s request for a settlement in a transaction on `conn` — the delivery's, or
/// one begun here: `true` when the job was cancelled in work, the transaction then rolled back
/// (a transactional delivery's writes with it).
async fn reserve<DB: Backend>(
    conn: &mut HeldConn<DB>,
    id: i64,
    requests: &Requests,
) -> Result<bool, sqlx::Error> {
    if conn.depth() == 0 {
        conn.begin(None).await?;
    }
    let cancelled = requests.cancelled::<DB>(conn, id).await;
    if !matches!(cancelled, Ok(false)) {
        conn.rollback().await?;
    }
    cancelled
}

/// The advisory lock form of one mounted queue.
#[derive(Debug)]
pub(crate) struct AdvisoryForm {
    sql: AdvisorySql,
    keys: Keys,
    checked: Checked,
    /// How many claimable rows a claim looks at for free keys, so that rows in work in this and
    /// other runners seldom hide free ones (a claim that finds none waits for the next poll or
    /// wake-up). PostgreSQL reads the window lazily, as keys are tried: four times the rows
    /// this queue holds at most, and at least 256. MySQL/MariaDB materialise it first: twice
    /// what the queue holds, and 16 more (a fixed window of 256 cost the advisory cells of
    /// `benches/throughput` on MariaDB most of their rate for batches at eight workers).
    window: i64,
    /// What opens a transactional delivery's transaction on the key's session.
    begin_delivery: Option<&'static str>,
}

impl<DB: Backend> Form<DB> for AdvisoryForm {
    type Hold = Held<DB>;
    type Batch = HeldConn<DB>;
    const ONE_CLAIM: bool = false;
    const HOLDS_KEYS: bool = true;
    const CLAIMS_WITH_SETTLEMENT: bool = !matches!(DB::DIALECT, Dialect::Postgres);

    async fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> Result<Self> {
        let held = config.workers.saturating_mul(config.batch.unwrap_or(1));
        Self::prepare_for::<DB>(conn, config, checked, held).await
    }
    /// Takes one row, on a connection that then holds its key.
    async fn claim(
        &self,
        conns: &Conns<DB>,
        _: usize,
        _: (usize, usize),
        excluded: &(dyn Fn() -> Vec<i64> + Sync),
    ) -> Result<Vec<(ClaimedRow, Held<DB>)>, ClaimFailed> {
        let mut conn = HeldConn::new(conns.get().await?);
        match self.take::<DB>(&mut conn, 1, &excluded()).await?.pop() {
            Some(row) => {
                let session = row.session;
                Ok(vec![(row, Held::new(conn, session))])
            }
            None => {
                conns.put_held(conn);
                Ok(Vec::new())
            }
        }
    }

    /// Takes up to `size` rows on one connection, which holds all their keys.
    async fn claim_batch(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), ClaimFailed> {
        let mut conn = HeldConn::new(conns.get().await?);
        let rows = self.take::<DB>(&mut conn, size, excluded).await?;
        Ok((rows, conn))
    }

    async fn next(&self, _: &Conns<DB>, _: &[i64]) -> Result<Option<i64>, sqlx::Error> {
        // A take that fails names its row.
        Ok(None)
    }

    async fn session_lost(&self, id: i64, hold: &mut Held<DB>) -> bool {
        hold.lost(id).await
    }

    async fn lend(&self, _: &Conns<DB>, hold: &mut Held<DB>) -> Result<HeldConn<DB>> {
        // A transaction on the session that holds the key.
        hold.lend(self.begin_delivery, &self.checked.queue).await
    }

    async fn take_back(
        &self,
        _: &Conns<DB>,
        hold: &mut Held<DB>,
        mut conn: HeldConn<DB>,
        ack: bool,
    ) -> Result<Option<HeldConn<DB>>, sqlx::Error> {
        // An ack commits with the settlement, before the unlock; any other outcome rolls back.
        if !ack {
            conn.rollback().await?;
        }
        hold.conn = Some(conn);
        Ok(None)
    }

    async fn read_row(
        &self,
        _: &Conns<DB>,
        hold: &mut Held<DB>,
        tx: Option<&mut HeldConn<DB>>,
        id: i64,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        hold.read_row(tx, &self.checked.row, id).await
    }

    async fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Held<DB>,
        outcome: Outcome,
        _: Option<HeldConn<DB>>,
    ) -> Result<Settled> {
        let mut conn = hold.into_conn(&self.checked.queue, id)?;
        let settled = self.settle_on::<DB>(&mut conn, id, outcome, false).await;
        conns.put_held(conn);
        settled
    }

    async fn settle_batch(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        mut conn: HeldConn<DB>,
        _: bool,
    ) -> Result<Vec<Result<()>>, (Option<i64>, Error)> {
        let results = self.settle_sets::<DB>(&mut conn, settlements, false).await;
        conns.put_held(conn);
        Ok(results)
    }

    async fn settle_batch_and_claim(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        mut conn: HeldConn<DB>,
        one_by_one: bool,
        next: usize,
    ) -> SettledAndClaimed<DB, Self> {
        match self
            .settle_and_claim::<DB>(&mut conn, settlements, next)
            .await
        {
            // The connection holds the next batch's keys.
            Some((settled, rows)) => (Ok(settled), Some((rows, conn))),
            None => {
                let settled =
                    <Self as Form<DB>>::settle_batch(self, conns, settlements, conn, one_by_one)
                        .await;
                (settled, None)
            }
        }
    }

    async fn release(&self, conns: &Conns<DB>, id: i64, hold: Held<DB>) -> bool {
        // A connection still lent is closed by whoever holds it: the server releases the key.
        let Some(mut conn) = hold.conn else {
            return true;
        };
        let released = self.unlock::<DB>(&mut conn, id).await;
        conns.put_held(conn);
        released.map_or_else(
            |error| {
                tracing::warn!(%error, id, "could not release a key; its connection is closed");
                false
            },
            |()| true,
        )
    }

    async fn release_unstarted(
        &self,
        conns: &Conns<DB>,
        id: i64,
        attempt: Option<i64>,
        mut hold: Held<DB>,
    ) -> bool {
        if let (Some(conn), Some(attempt)) = (hold.conn.as_mut(), attempt) {
            self.uncount::<DB>(conn, id, attempt).await;
        }
        <Self as Form<DB>>::release(self, conns, id, hold).await
    }

    async fn release_batch(&self, conns: &Conns<DB>, ids: &[i64], mut conn: HeldConn<DB>) -> u64 {
        let released = match self.unlock_many::<DB>(&mut conn, ids).await {
            Ok(lost) => ids.len() - lost.len(),
            Err(error) => {
                tracing::warn!(%error, "could not release a batch's keys; its connection is closed");
                0
            }
        };
        conns.put_held(conn);
        released as u64
    }

    async fn abandon(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Held<DB>,
        _: Option<Held<DB>>,
    ) -> Returned {
        hold.abandon(conns, async |mut conn| {
            let released = self.unlock::<DB>(&mut conn, id).await.is_ok();
            conns.put_held(conn);
            released
        })
        .await
    }
}

impl AdvisoryForm {
    /// Renders and prepares the form's statements for a queue holding at most `held` rows at
    /// once (which sizes the claim's window).
    async fn prepare_for<DB: Backend>(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
        held: usize,
    ) -> Result<Self> {
        let mut sql = dialect::advisory(&checked.names);
        let keys = Keys::of(DB::DIALECT, &checked.identity.key);
        // Acks release keys by the names the client writes, where they need no hash.
        if keys.names_fit() && sql.finish_unlock_many.is_some() {
            sql.finish_unlock_many = Some(dialect::finish_unlock_named(&checked.names));
        }
        let mut statements = vec![&sql.take, &sql.finish];
        match (&sql.lock_many, &sql.lock_many_excluding) {
            (Some(lock), Some(excluding)) => statements.extend([lock, excluding]),
            _ => statements.extend([&sql.candidates, &sql.candidates_excluding]),
        }
        statements.extend(sql.unlock.iter().chain(&sql.count).chain(&sql.retry_after));
        statements.extend(sql.take_many.iter().chain(sql.finish_many.iter()));
        statements.extend(sql.unlock_many.iter().flatten());
        statements.extend(sql.finish_unlock_many.iter().flatten());
        statements.extend(sql.count_many.iter().flatten());
        statements.extend(sql.take_count_many.iter().flatten());
        statements.extend(sql.restore_attempt.iter());
        super::schema::prepare_all::<DB>(conn, config, &statements).await?;
        Ok(AdvisoryForm {
            window: i64::try_from(match DB::DIALECT {
                Dialect::MySql => held.saturating_mul(2).saturating_add(16),
                _ => held.saturating_mul(4).max(256),
            })
            .unwrap_or(i64::MAX),
            keys,
            begin_delivery: dialect::begin_delivery(
                DB::DIALECT,
                config.isolation,
                config.sqlite_mode,
                checked.server.checks_connection,
            ),
            sql,
            checked,
        })
    }

    /// Sets row `id`'s attempt back to `attempt` (the count its claim read): a row claimed but
    /// never delivered. A failure leaves it counted, which is logged.
    async fn uncount<DB: Backend>(&self, conn: &mut HeldConn<DB>, id: i64, attempt: i64) {
        let Some(stmt) = &self.sql.restore_attempt else {
            return;
        };
        let args = Args {
            id,
            attempt,
            ..Args::default()
        };
        if let Err(error) = execute::<DB>(conn, stmt, &args).await {
            tracing::warn!(%error, id, "could not uncount the attempt of a row never delivered");
        }
    }

    /// Settles row `id` on the session holding its key (each statement commits on its own, or
    /// with the delivery's transaction when `conn` is in one), then releases the key. A
    /// statement that fails still releases the key, and the row returns as it was — unless
    /// `keep_failed`: the key is then kept for the caller to release (see `grouped`).
    ///
    /// Where the table records cancel requests, a transactional ack, and a plain settlement that
    /// would leave the row, reserve the row's request first, in the transaction they commit in
    /// (a plain one begins one): a request found there rolls it back and removes the row
    /// instead (`form::requests`).
    pub(super) async fn settle_on<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
        keep_failed: bool,
    ) -> Result<Settled> {
        let checked = &self.checked;
        let reserved = match &checked.requests {
            Some(requests) if conn.depth() > 0 || !checked.finishes(outcome) => {
                match reserve::<DB>(conn, id, requests).await {
                    Ok(false) => Some(requests),
                    Ok(true) => {
                        let drop = Outcome::drop();
                        let dropped = self.settle_as::<DB>(conn, id, drop, keep_failed, None);
                        return dropped.await.map(|()| Settled::Cancelled);
                    }
                    Err(error) => {
                        if !keep_failed {
                            let _ = self.unlock::<DB>(conn, id).await;
                        }
                        return Err(error.into());
                    }
                }
            }
            _ => None,
        };
        let settled = self.settle_as::<DB>(conn, id, outcome, keep_failed, reserved);
        settled.await.map(|()| Settled::AsAsked)
    }

    /// [`settle_on`](Self::settle_on) by `outcome`, with the row's request `reserved` in the
    /// transaction `conn` is in, where one was (a batch's rows reserve none: a row retried as a
    /// cancellation is answered returns with its request).
    pub(super) async fn settle_as<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
        keep_failed: bool,
        reserved: Option<&Requests>,
    ) -> Result<()> {
        let checked = &self.checked;
        let args = settlement_args(checked, id, outcome);
        let mut changes_row = true;
        let mut settled = match (checked.custom.get(outcome.0), &checked.dead, outcome.0) {
            (Some(custom), _, _) => execute::<DB>(conn, custom, &args).await.map(drop),
            (None, Some(dead), Settle::DeadLetter) => dead.run(conn, &args).await.map(drop),
            (None, _, settle) => match self.statement(settle, id) {
                // Settled and released in one statement, outside a delivery's transaction.
                Some(stmt)
                    if std::ptr::eq(stmt, &self.sql.finish)
                        && conn.depth() == 0
                        && self.finishes_unlocking(conn) =>
                {
                    return match self.finish_unlock::<DB>(conn, &[id]).await {
                        Ok(lost) if lost.is_empty() => Ok(()),
                        Ok(_) => Err(self.key_lost(id)),
                        Err(error) if keep_failed => Err(error),
                        Err(error) => {
                            let _ = self.unlock::<DB>(conn, id).await;
                            Err(error)
                        }
                    };
                }
                Some(stmt) => execute::<DB>(conn, stmt, &args).await.map(drop),
                None => {
                    changes_row = false;
                    Ok(())
                }
            },
        };
        // A retry (no statement) leaves the row as it was: its key goes back before the
        // reservation's commit, so that a cancellation waiting for that commit finds the row
        // free and removes it. A settlement that changed the row keeps its key until the
        // commit: a claim reading the row before would find it as it was.
        let mut unlocked = None;
        if let (Some(requests), Ok(())) = (reserved, &settled) {
            settled = requests.release::<DB>(conn, id).await;
            if settled.is_ok() && !changes_row {
                unlocked = Some(self.unlock::<DB>(conn, id).await);
            }
        }
        // A transactional ack settles in the delivery's transaction: it ends before the unlock.
        if conn.depth() > 0 {
            settled = match settled {
                Ok(()) => conn.commit().await,
                Err(error) => conn.rollback().await.and(Err(error)),
            };
        }
        if keep_failed
            && unlocked.is_none()
            && let Err(error) = settled
        {
            return Err(error.into());
        }
        let unlocked = match unlocked {
            Some(unlocked) => unlocked,
            None => self.unlock::<DB>(conn, id).await,
        };
        settled?;
        unlocked
    }

    /// The crate's own statement for `settle` (a move to a dead letter runs apart).
    fn statement(&self, settle: Settle, id: i64) -> Option<&Stmt> {
        match settle {
            Settle::DeadLetter => {
                no_dead_letter(&self.checked.table, id);
                Some(&self.sql.finish)
            }
            Settle::Ack | Settle::Drop | Settle::Undecodable => Some(&self.sql.finish),
            Settle::Retry | Settle::Fail => None,
            Settle::RetryAfter(delay) => {
                if self.sql.retry_after.is_none() {
                    no_retry_after(&self.checked.table, delay);
                }
                self.sql.retry_after.as_ref()
            }
        }
    }
}
