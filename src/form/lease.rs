//! The lease form: the claim writes a token (the lease's expiry) and commits at once; every
//! later statement on the row is guarded by that token.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Connection as _;
use tokio::time::Instant;

use super::held::{Conns, HeldConn};
use super::row_lock::no_retry_after;
use super::{Clock, Custom, Dead, no_dead_letter};
use crate::backend::{Backend, ClaimedRow, query};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, Claim, FinishMany, LeaseSql, MAX_FINISH, Stmt, mysql_begin};
use crate::error::{Error, Result};

/// A claim's rows, in id order, and the lease token they all carry.
#[derive(Debug)]
pub(crate) struct Claimed {
    pub(crate) rows: Vec<ClaimedRow>,
    pub(crate) token: DateTime<Utc>,
    /// When the token was taken: extensions are due from here.
    pub(crate) taken: Instant,
}

/// The lease form of one mounted queue.
#[derive(Debug)]
pub(crate) struct LeaseForm {
    pub(crate) sql: LeaseSql,
    /// The most rows one claim takes (the MySQL claim's updates are rendered up to it).
    pub(crate) max_claim: usize,
    pub(crate) duration: Duration,
    pub(crate) group: Option<Arc<str>>,
    pub(crate) with_attempt: bool,
    pub(crate) clock: Clock,
    pub(crate) queue: Arc<str>,
    pub(crate) table: Arc<str>,
    pub(crate) dead: Option<Dead>,
    pub(crate) custom: Custom,
    pub(crate) begin_write: Option<&'static str>,
}

impl LeaseForm {
    /// Claims up to `limit` rows in one committed step, counting their attempt, passing over
    /// the `excluded` ids.
    pub(crate) async fn claim<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        limit: usize,
        excluded: &[i64],
    ) -> Result<Claimed, sqlx::Error> {
        // The token is taken once the connection is: a wait for it does not shorten the lease.
        let mut conn = conns.get().await?;
        let taken = Instant::now();
        let now = self.clock.now();
        let token = self.clock.after(self.duration);
        let args = Args {
            now: Some(now),
            new_token: Some(token),
            group: self.group.as_deref(),
            limit: i64::try_from(limit.min(self.max_claim)).unwrap_or(i64::MAX),
            excluded,
            ..Args::default()
        };
        let claim = match excluded {
            [] => &self.sql.claim,
            _ => &self.sql.claim_excluding,
        };
        let claimed = async {
            Ok(match claim {
                Claim::Returning(stmt) => {
                    DB::fetch_claimed(&mut *conn, query(stmt, &args), self.with_attempt).await?
                }
                Claim::SelectThenUpdate { select, updates } => {
                    let mut tx = conn.begin_with(mysql_begin()).await?;
                    let rows = DB::fetch_claimed(&mut *tx, query(select, &args), self.with_attempt)
                        .await?;
                    if !rows.is_empty() {
                        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
                        let args = Args { ids: &ids, ..args };
                        DB::execute(
                            &mut *tx,
                            query(Claim::update_for(updates, ids.len()), &args),
                        )
                        .await?;
                    }
                    tx.commit().await?;
                    rows
                }
            })
        };
        let mut rows = conns.checked(claimed.await)?;
        conns.put(conn);
        rows.sort_unstable_by_key(|row| row.id);
        Ok(Claimed { rows, token, taken })
    }

    /// The id a claim passing over `excluded` would take next (the row a claim that failed for a
    /// reason of its own failed on), if any.
    pub(crate) async fn next<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        excluded: &[i64],
    ) -> Result<Option<i64>, sqlx::Error> {
        let args = Args {
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            excluded,
            ..Args::default()
        };
        let mut conn = conns.get().await?;
        let next = conns.checked(DB::fetch_i64(&mut conn, query(&self.sql.next, &args)).await)?;
        conns.put(conn);
        Ok(next)
    }

    /// Extends the lease of row `id` from `token`: the new token, or `None` when the lease was
    /// lost.
    pub(crate) async fn extend<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        token: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        self.extend_to(conns, id, token, self.next_token()).await
    }

    /// The token an extension made now writes.
    pub(crate) fn next_token(&self) -> DateTime<Utc> {
        self.clock.after(self.duration)
    }

    /// Extends the lease of row `id` from `token` to `new_token` (from [`next_token`], known
    /// before the statement is sent, so that a release can fence an extension whose outcome is
    /// unknown).
    ///
    /// [`next_token`]: LeaseForm::next_token
    pub(crate) async fn extend_to<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        token: DateTime<Utc>,
        new_token: DateTime<Utc>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let args = Args {
            id,
            token: Some(token),
            new_token: Some(new_token),
            ..Args::default()
        };
        let changed = self.run(conns, &self.sql.extend, &args).await?;
        Ok((changed == 1).then_some(new_token))
    }

    /// Settles row `id` by `outcome`, on `tx` — the delivery's own transaction, committed with
    /// the settlement — or on a connection of the pool.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the row no longer carries `token`; nothing was changed, and
    /// `tx` was rolled back.
    pub(crate) async fn settle<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        token: DateTime<Utc>,
        outcome: Outcome,
        tx: Option<HeldConn<DB>>,
    ) -> Result<()> {
        let mut args = Args {
            id,
            token: Some(token),
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            dead_group: self.dead.as_ref().and_then(|dead| dead.group.as_deref()),
            ..Args::default()
        };
        if let Settle::RetryAfter(delay) = outcome.0 {
            args.at = Some(self.clock.after(delay));
        }
        let mut conn = match tx {
            Some(tx) => tx,
            None => HeldConn::new(conns.get().await?),
        };
        let settled = match (self.custom.get(outcome.0), &self.dead, outcome.0) {
            (Some(custom), _, _) => {
                // The lease first: confirmed and locked in the transaction the custom SQL runs in.
                if conn.depth() == 0 {
                    conn.begin(self.begin_write).await?;
                }
                let held = DB::fetch_i64(&mut conn, query(&self.sql.confirm, &args))
                    .await?
                    .is_some();
                if held {
                    DB::execute(&mut conn, query(custom, &args)).await?;
                }
                held
            }
            (None, Some(dead), Settle::DeadLetter) => dead.run(&mut conn, &args).await?,
            (None, _, settle) => {
                let stmt = self.statement(settle, id);
                DB::execute(&mut conn, query(stmt, &args)).await? > 0
            }
        };
        if conn.depth() > 0 {
            if settled {
                conn.commit().await?;
            } else {
                conn.rollback().await?;
            }
        }
        conns.put_held(conn);
        if settled { Ok(()) } else { Err(self.lost(id)) }
    }

    /// The crate's own statement for `settle` (a move to a dead letter runs apart).
    fn statement(&self, settle: Settle, id: i64) -> &Stmt {
        match settle {
            Settle::DeadLetter => {
                no_dead_letter(&self.table, id);
                &self.sql.finish
            }
            Settle::Ack | Settle::Drop | Settle::Undecodable => &self.sql.finish,
            Settle::Retry => &self.sql.release,
            Settle::RetryAfter(delay) => match &self.sql.retry_after {
                Some(stmt) => stmt,
                None => {
                    no_retry_after(&self.table, delay);
                    &self.sql.release
                }
            },
        }
    }

    /// Acknowledges many rows with one statement (at most [`MAX_FINISH`]), each guarded by its own
    /// token: whether each row still carried its token and was settled.
    pub(crate) async fn finish_many<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        items: &[(i64, DateTime<Utc>)],
    ) -> Result<Vec<bool>, sqlx::Error> {
        debug_assert!(!items.is_empty() && items.len() <= MAX_FINISH);
        if let [(id, token)] = items {
            // One row: its own guarded statement, one round trip (not a transaction's four on
            // MySQL), with no arrays to build.
            let args = Args {
                id: *id,
                token: Some(*token),
                now: Some(self.clock.now()),
                ..Args::default()
            };
            return Ok(vec![self.run(conns, &self.sql.finish, &args).await? > 0]);
        }
        let ids: Vec<i64> = items.iter().map(|(id, _)| *id).collect();
        let tokens: Vec<DateTime<Utc>> = items.iter().map(|(_, token)| *token).collect();
        let size = |n: usize| n.next_power_of_two().trailing_zeros() as usize;
        let args = Args {
            ids: &ids,
            tokens: &tokens,
            now: Some(self.clock.now()),
            ..Args::default()
        };
        let mut conn = conns.get().await?;
        let settled = async {
            Ok(match &self.sql.finish_many {
                FinishMany::Returning(statements) => {
                    DB::fetch_i64s(&mut conn, query(&statements[size(ids.len())], &args)).await?
                }
                FinishMany::LockThenFinish { held, finish } => {
                    let mut tx = conn.begin_with(mysql_begin()).await?;
                    let held =
                        DB::fetch_i64s(&mut tx, query(&held[size(ids.len())], &args)).await?;
                    if !held.is_empty() {
                        let args = Args { ids: &held, ..args };
                        DB::execute(&mut tx, query(&finish[size(held.len())], &args)).await?;
                    }
                    tx.commit().await?;
                    held
                }
            })
        };
        let settled = conns.checked(settled.await)?;
        conns.put(conn);
        Ok(ids.iter().map(|id| settled.contains(id)).collect())
    }

    /// Releases the lease of row `id` (a delivery that will not be settled): the row is
    /// claimable again at once. Returns whether the lease was still held.
    pub(crate) async fn release<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        token: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            id,
            token: Some(token),
            ..Args::default()
        };
        Ok(self.run(conns, &self.sql.release, &args).await? == 1)
    }

    /// Releases the lease of row `id` whether it carries `token` or `extended`, the token of an
    /// extension whose outcome is unknown. Returns whether either was still held.
    pub(crate) async fn release_either<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        token: DateTime<Utc>,
        extended: DateTime<Utc>,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            id,
            token: Some(token),
            new_token: Some(extended),
            ..Args::default()
        };
        Ok(self.run(conns, &self.sql.release_either, &args).await? == 1)
    }

    pub(crate) fn lost(&self, id: i64) -> Error {
        Error::LeaseLost {
            queue: self.queue.to_string(),
            table: self.table.to_string(),
            id,
        }
    }

    async fn run<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        stmt: &Stmt,
        args: &Args<'_>,
    ) -> Result<u64, sqlx::Error> {
        let mut conn = conns.get().await?;
        let changed = conns.checked(DB::execute(&mut *conn, query(stmt, args)).await)?;
        conns.put(conn);
        Ok(changed)
    }
}
