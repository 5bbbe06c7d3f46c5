//! The row lock form: the claim's transaction holds the row (`FOR UPDATE SKIP LOCKED`) while its
//! handler runs; the settlement runs in that transaction, and its commit is the settlement.

use std::sync::Arc;

use super::held::{Conns, HeldConn};
use super::{Clock, Custom, Dead, no_dead_letter};
use crate::backend::{Backend, ClaimedRow, query};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, RowLockSql};
use crate::error::Result;

/// The row lock form of one mounted queue.
#[derive(Debug)]
pub(crate) struct RowLockForm {
    pub(crate) sql: RowLockSql,
    pub(crate) group: Option<Arc<str>>,
    pub(crate) with_attempt: bool,
    pub(crate) clock: Clock,
    pub(crate) table: Arc<str>,
    pub(crate) dead: Option<Dead>,
    pub(crate) custom: Custom,
}

impl RowLockForm {
    /// Claims one row in a transaction of its own, on a connection of its own: the
    /// transaction holds the row until the delivery settles.
    pub(crate) async fn claim_one<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        excluded: &[i64],
    ) -> Result<Option<(ClaimedRow, HeldConn<DB>)>, sqlx::Error> {
        let mut conn = HeldConn::new(conns.get().await?);
        conn.begin(self.sql.begin).await?;
        let args = Args {
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            limit: 1,
            excluded,
            ..Args::default()
        };
        let claim = match excluded {
            [] => &self.sql.claim,
            _ => &self.sql.claim_excluding,
        };
        let claimed = DB::fetch_claimed(&mut conn, query(claim, &args), self.with_attempt)
            .await?
            .pop();
        match claimed {
            Some(row) => Ok(Some((row, conn))),
            None => {
                conn.rollback().await?;
                conns.put_held(conn);
                Ok(None)
            }
        }
    }

    /// Claims up to `limit` rows in one transaction on one connection: a row lock batch, which
    /// settles all together.
    pub(crate) async fn claim_batch<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        limit: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), sqlx::Error> {
        let mut conn = HeldConn::new(conns.get().await?);
        conn.begin(self.sql.begin).await?;
        let args = Args {
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            excluded,
            ..Args::default()
        };
        let claim = match excluded {
            [] => &self.sql.claim,
            _ => &self.sql.claim_excluding,
        };
        let mut rows = DB::fetch_claimed(&mut conn, query(claim, &args), self.with_attempt).await?;
        if rows.is_empty() {
            conn.rollback().await?;
        }
        rows.sort_unstable_by_key(|row| row.id);
        Ok((rows, conn))
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

    /// Settles row `id` in its claim's transaction, and commits (retry without an attempt column:
    /// rolls back, which returns the row as it was).
    pub(crate) async fn settle<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<()> {
        if self.apply(conn, id, outcome).await? {
            conn.commit().await?;
        } else {
            conn.rollback().await?;
        }
        Ok(())
    }

    /// Runs row `id`'s settlement statement in the claim's transaction, without ending it:
    /// `false` when the outcome has none (a retry without an attempt column leaves the row as
    /// it was).
    pub(crate) async fn apply<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<bool> {
        let mut args = Args {
            id,
            now: Some(self.clock.now()),
            group: self.group.as_deref(),
            dead_group: self.dead.as_ref().and_then(|dead| dead.group.as_deref()),
            ..Args::default()
        };
        if let Settle::RetryAfter(delay) = outcome.0 {
            args.at = Some(self.clock.after(delay));
        }
        if let Some(custom) = self.custom.get(outcome.0) {
            DB::execute(conn, query(custom, &args)).await?;
            return Ok(true);
        }
        let stmt = match outcome.0 {
            Settle::DeadLetter => match &self.dead {
                Some(dead) => {
                    dead.run(conn, &args).await?;
                    return Ok(true);
                }
                None => {
                    no_dead_letter(&self.table, id);
                    Some(&self.sql.finish)
                }
            },
            Settle::Ack | Settle::Drop | Settle::Undecodable => Some(&self.sql.finish),
            Settle::Retry => self.sql.retry.as_ref(),
            Settle::RetryAfter(delay) => match &self.sql.retry_after {
                Some(stmt) => Some(stmt),
                None => {
                    no_retry_after(&self.table, delay);
                    self.sql.retry.as_ref()
                }
            },
        };
        match stmt {
            Some(stmt) => {
                DB::execute(conn, query(stmt, &args)).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// Warns that `retry_after(delay)` is taken as a retry on a table without the column.
pub(crate) fn no_retry_after(table: &str, delay: std::time::Duration) {
    tracing::warn!("table `{table}` has no retry_after column: retry_after({delay:?}) is a retry");
}
