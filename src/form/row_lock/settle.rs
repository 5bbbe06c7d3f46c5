//! The row lock form's settlement statements, run in the claim's transaction (the caller
//! commits): a row's own, or a batch's with one statement per outcome kind.

use super::RowLockForm;
use crate::backend::{Backend, HeldConn};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, MAX_FINISH, Stmt};
use crate::error::{Error, Result};
use crate::form::{execute, no_dead_letter, no_retry_after, settlement_args};

impl RowLockForm {
    /// Runs each row's settlement statement in the claim's transaction: the first that fails
    /// names its row.
    pub(super) async fn apply_each<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
    ) -> Result<(), (Option<i64>, Error)> {
        for &(id, outcome) in settlements {
            self.apply::<DB>(conn, id, outcome)
                .await
                .map_err(|error| (Some(id), error))?;
        }
        Ok(())
    }

    /// Runs a batch's settlements in the claim's transaction with one statement per outcome
    /// kind — acks and drops, retries — for up to [`MAX_FINISH`] rows each; the rest (a delay, a
    /// dead letter, a custom statement) row by row. A set statement that fails names no row.
    pub(super) async fn apply_sets<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
    ) -> Result<(), (Option<i64>, Error)> {
        let checked = &self.checked;
        let (mut finish, mut retry, mut each) = (Vec::new(), Vec::new(), Vec::new());
        for &(id, outcome) in settlements {
            match outcome.0 {
                _ if checked.custom.get(outcome.0).is_some() => each.push((id, outcome)),
                Settle::Ack | Settle::Drop | Settle::Undecodable => finish.push(id),
                Settle::DeadLetter if checked.dead.is_none() => {
                    no_dead_letter(&checked.table, id);
                    finish.push(id);
                }
                // Without an attempt column a retry leaves the row as it was.
                Settle::Retry | Settle::Fail if self.sql.retry_many.is_none() => {}
                Settle::Retry | Settle::Fail => retry.push(id),
                Settle::DeadLetter | Settle::RetryAfter(_) => each.push((id, outcome)),
            }
        }
        let now = Some(checked.clock.now());
        let sets = [
            (finish, Some(&self.sql.finish_many)),
            (retry, self.sql.retry_many.as_ref()),
        ];
        for (ids, statements) in sets {
            let Some(statements) = statements else {
                continue;
            };
            for chunk in ids.chunks(MAX_FINISH) {
                let stmt = statements.for_len(chunk.len());
                let args = Args {
                    ids: chunk,
                    now,
                    ..Args::default()
                };
                execute::<DB>(conn, stmt, &args)
                    .await
                    .map_err(|error| (None, Error::from(error)))?;
            }
        }
        self.apply_each::<DB>(conn, &each).await
    }

    /// Runs row `id`'s settlement statement in the claim's transaction, without ending it:
    /// `false` when the outcome has none (a retry without an attempt column leaves the row as
    /// it was: a rollback).
    pub(super) async fn apply<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<bool> {
        let checked = &self.checked;
        let args = settlement_args(checked, id, outcome);
        if let Some(custom) = checked.custom.get(outcome.0) {
            execute::<DB>(conn, custom, &args).await?;
            return Ok(true);
        }
        let stmt: Option<&Stmt> = match outcome.0 {
            Settle::DeadLetter => match &checked.dead {
                Some(dead) => {
                    dead.run(conn, &args).await?;
                    return Ok(true);
                }
                None => {
                    no_dead_letter(&checked.table, id);
                    Some(&self.sql.finish)
                }
            },
            Settle::Ack | Settle::Drop | Settle::Undecodable => Some(&self.sql.finish),
            Settle::Retry | Settle::Fail => self.sql.retry.as_ref(),
            Settle::RetryAfter(delay) => match &self.sql.retry_after {
                Some(stmt) => Some(stmt),
                None => {
                    no_retry_after(&checked.table, delay);
                    self.sql.retry.as_ref()
                }
            },
        };
        match stmt {
            Some(stmt) => {
                execute::<DB>(conn, stmt, &args).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
