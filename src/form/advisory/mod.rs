//! The advisory lock form: a session lock on the row's key holds the row while its handler runs,
//! on a connection of the delivery's own ([`keys`] says what a key is made of).
//!
//! One query lists claimable rows whose keys no session holds (PostgreSQL reads `pg_locks`,
//! MySQL `IS_USED_LOCK`); a worker locks the next one without waiting, then reads the row again
//! (another session may have settled it meanwhile) and counts its attempt. Each settlement
//! statement commits on its own on that session (or with a transactional delivery's transaction
//! on it), then the key is released.
//!
//! The form's type, its [`Form`] impl and its settlement are here; taking and releasing a key
//! (`take`) is beside it.

mod keys;
mod take;

use keys::Keys;
pub(crate) use keys::fnv1a_32;

use super::{
    Checked, ClaimFailed, Conns, Form, Held, Returned, execute, fetch_row, no_dead_letter,
    no_retry_after, settlement_args,
};
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::config::QueueConfig;
use crate::delivery::{Outcome, Settle};
use crate::dialect::{self, AdvisorySql, Stmt};
use crate::error::{Error, Result};

/// The advisory lock form of one mounted queue.
#[derive(Debug)]
pub(crate) struct AdvisoryForm {
    sql: AdvisorySql,
    keys: Keys,
    checked: Checked,
    /// What opens a transactional delivery's transaction on the key's session.
    begin_delivery: Option<&'static str>,
}

impl<DB: Backend> Form<DB> for AdvisoryForm {
    type Hold = Held<DB>;
    type Batch = HeldConn<DB>;
    const ONE_CLAIM: bool = false;
    const HOLDS_KEYS: bool = true;

    async fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> Result<Self> {
        let sql = dialect::advisory(&checked.names);
        let mut statements = vec![
            &sql.candidates,
            &sql.candidates_excluding,
            &sql.take,
            &sql.finish,
        ];
        statements.extend(sql.lock.iter().chain(&sql.unlock));
        statements.extend(sql.count.iter().chain(&sql.retry_after));
        super::schema::prepare_all::<DB>(conn, config, &statements).await?;
        Ok(AdvisoryForm {
            keys: Keys::of(DB::DIALECT, &checked.identity.key),
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

    /// Takes one row, on a connection that then holds its key: the claim of worker `index` of
    /// `workers`. The workers list the same candidates (twice as many as there are workers);
    /// each starts at its own place in the list, so they seldom race for one key.
    async fn claim(
        &self,
        conns: &Conns<DB>,
        _: usize,
        (index, workers): (usize, usize),
        excluded: &[i64],
    ) -> Result<Vec<(ClaimedRow, Held<DB>)>, ClaimFailed> {
        let now = self.checked.clock.now();
        let mut conn = HeldConn::new(conns.get().await?);
        let mut candidates = self
            .candidates::<DB>(&mut conn, workers, now, excluded)
            .await?;
        if !candidates.is_empty() {
            let start = index % candidates.len();
            candidates.rotate_left(start);
        }
        match self.take::<DB>(&mut conn, &mut candidates, now).await? {
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
        let now = self.checked.clock.now();
        let mut conn = HeldConn::new(conns.get().await?);
        let mut candidates = self
            .candidates::<DB>(&mut conn, size, now, excluded)
            .await?;
        let mut rows = Vec::with_capacity(size);
        while rows.len() < size {
            match self.take::<DB>(&mut conn, &mut candidates, now).await? {
                Some(row) => rows.push(row),
                None => break,
            }
        }
        Ok((rows, conn))
    }

    async fn next(&self, _: &Conns<DB>, _: &[i64]) -> Result<Option<i64>, sqlx::Error> {
        // A take that fails names its row.
        Ok(None)
    }

    async fn lend(&self, _: &Conns<DB>, hold: &mut Held<DB>) -> Result<HeldConn<DB>> {
        // A transaction on the session that holds the key.
        match hold.lend(self.begin_delivery).await {
            Some(lent) => Ok(lent?),
            None => Err(Error::TransactionHeld {
                queue: self.checked.queue.to_string(),
                id: 0,
            }),
        }
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
        match tx.or(hold.conn.as_mut()) {
            Some(conn) => fetch_row::<DB>(conn, &self.checked.row, id).await,
            None => Ok(None),
        }
    }

    async fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Held<DB>,
        outcome: Outcome,
        _: Option<HeldConn<DB>>,
    ) -> Result<()> {
        let Some(mut conn) = hold.conn else {
            return Err(Error::TransactionHeld {
                queue: self.checked.queue.to_string(),
                id,
            });
        };
        let settled = self.settle_on::<DB>(&mut conn, id, outcome).await;
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
        let mut results = Vec::with_capacity(settlements.len());
        for &(id, outcome) in settlements {
            results.push(self.settle_on::<DB>(&mut conn, id, outcome).await);
        }
        conns.put_held(conn);
        Ok(results)
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

    async fn release_batch(&self, conns: &Conns<DB>, ids: &[i64], mut conn: HeldConn<DB>) -> u64 {
        let mut released = 0;
        for &id in ids {
            if self.unlock::<DB>(&mut conn, id).await.is_ok() {
                released += 1;
            }
        }
        conns.put_held(conn);
        released
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
    /// Settles row `id` on the session holding its key (each statement commits on its own, or
    /// with the delivery's transaction when `conn` is in one), then releases the key. A
    /// statement that fails still releases the key, and the row returns as it was.
    async fn settle_on<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<()> {
        let checked = &self.checked;
        let args = settlement_args(checked, id, outcome);
        let mut settled = match (checked.custom.get(outcome.0), &checked.dead, outcome.0) {
            (Some(custom), _, _) => execute::<DB>(conn, custom, &args).await.map(drop),
            (None, Some(dead), Settle::DeadLetter) => dead.run(conn, &args).await.map(drop),
            (None, _, settle) => match self.statement(settle, id) {
                Some(stmt) => execute::<DB>(conn, stmt, &args).await.map(drop),
                None => Ok(()),
            },
        };
        // A transactional ack settles in the delivery's transaction: it ends before the unlock.
        if conn.depth() > 0 {
            settled = match settled {
                Ok(()) => conn.commit().await,
                Err(error) => conn.rollback().await.and(Err(error)),
            };
        }
        let unlocked = self.unlock::<DB>(conn, id).await;
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
            Settle::Retry => None,
            Settle::RetryAfter(delay) => {
                if self.sql.retry_after.is_none() {
                    no_retry_after(&self.checked.table, delay);
                }
                self.sql.retry_after.as_ref()
            }
        }
    }
}
