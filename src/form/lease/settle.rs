//! The lease form's settlement statements: the crate's own per outcome, many acknowledgements in
//! one statement, and the release of a row either of two tokens may hold — apart from the form's
//! trait impl, which says when each runs.

use chrono::{DateTime, Utc};

use super::{LeaseForm, Token};
use crate::backend::Backend;
use crate::delivery::{Outcome, Settle};
use crate::dialect::{self, Args, FinishMany, MAX_FINISH, Stmt};
use crate::error::Error;
use crate::form::{
    Conns, execute, fetch_i64s, in_transaction, no_dead_letter, no_retry_after, on_conn,
};

/// Which rows of a settlement of many it settled.
enum SettledIds {
    /// Every one.
    All,
    /// These.
    These(Vec<i64>),
}

/// The ids of `args` that a settlement of one token without `RETURNING` settled, from the
/// count of rows it `changed` (a table that deletes its finished rows): every id when it
/// counted one row per id; else those gone from the table (`present` reads the others, which
/// carry another claim's token). A row another session deleted before the settlement is gone
/// too, counted as settled here: which of the gone rows those were is not known (logged).
async fn settled_by_count<DB: Backend>(
    conn: &mut DB::Connection,
    present: &Stmt,
    args: &Args<'_>,
    changed: u64,
) -> Result<SettledIds, sqlx::Error> {
    // A row is settled once: a count of one per id says every id was distinct and settled.
    if changed == args.ids.len() as u64 {
        return Ok(SettledIds::All);
    }
    let mut ids = args.ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    if changed == ids.len() as u64 {
        return Ok(SettledIds::These(ids));
    }
    let left = fetch_i64s::<DB>(conn, present, args).await?;
    ids.retain(|id| !left.contains(id));
    if changed < ids.len() as u64 {
        tracing::warn!(
            gone = ids.len() as u64 - changed,
            "rows of an acknowledgement were gone before it (settled by another session after \
             their lease ran out); they count as settled"
        );
    }
    Ok(SettledIds::These(ids))
}

impl LeaseForm {
    /// The crate's own statement for `settle` (a move to a dead letter runs apart).
    pub(super) fn statement(&self, settle: Settle, id: i64) -> &Stmt {
        match settle {
            Settle::DeadLetter => {
                no_dead_letter(&self.checked.table, id);
                &self.sql.finish
            }
            Settle::Ack | Settle::Drop | Settle::Undecodable => &self.sql.finish,
            Settle::Retry | Settle::Fail => &self.sql.release,
            Settle::RetryAfter(delay) => match &self.sql.retry_after {
                Some(stmt) => stmt,
                None => {
                    no_retry_after(&self.checked.table, delay);
                    &self.sql.release
                }
            },
        }
    }

    /// Acknowledges many rows with one statement (at most [`MAX_FINISH`]), each guarded by its
    /// own token: whether each row still carried its token and was settled.
    pub(super) async fn finish_many<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        ids: &[i64],
        tokens: &[DateTime<Utc>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        on_conn(conns, async |conn| {
            self.finish_many_on::<DB>(conn, ids, tokens).await
        })
        .await
    }

    /// [`finish_many`](Self::finish_many) on `conn` (in a transaction of the caller's, where it
    /// settles a batch and claims the next together).
    pub(super) async fn finish_many_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        ids: &[i64],
        tokens: &[DateTime<Utc>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        debug_assert!(!ids.is_empty() && ids.len() <= MAX_FINISH && ids.len() == tokens.len());
        let now = Some(self.checked.clock.now());
        if let ([id], [token]) = (ids, tokens) {
            // One row: its own guarded statement, one round trip (not a transaction's four on
            // MySQL), with no lists to build.
            let args = Args {
                id: *id,
                token: Some(*token),
                now,
                ..Args::default()
            };
            let changed = execute::<DB>(conn, &self.sql.finish, &args).await?;
            return Ok(vec![changed > 0]);
        }
        let args = Args {
            ids,
            tokens,
            now,
            ..Args::default()
        };
        // The rows of one claim carry one token: bound once.
        let one_token = match (&self.sql.finish_one_token, tokens) {
            (Some(statements), [first, rest @ ..]) if rest.iter().all(|t| t == first) => {
                Some((statements, *first))
            }
            _ => None,
        };
        let settled = match (&self.sql.finish_many, one_token) {
            (_, Some((one, token))) => {
                let args = Args {
                    token: Some(token),
                    ..args
                };
                let finish = one.finish.for_len(ids.len());
                match &one.present {
                    None => Ok(SettledIds::These(
                        fetch_i64s::<DB>(conn, finish, &args).await?,
                    )),
                    Some(present) => {
                        let changed = execute::<DB>(conn, finish, &args).await?;
                        settled_by_count::<DB>(conn, present.for_len(ids.len()), &args, changed)
                            .await
                    }
                }
            }
            (FinishMany::Returning(statements), None) => Ok(SettledIds::These(
                fetch_i64s::<DB>(conn, statements.for_len(ids.len()), &args).await?,
            )),
            (FinishMany::LockThenFinish { held, finish }, None) => {
                in_transaction::<DB, _>(conn, dialect::mysql_begin(), async |tx| {
                    let held = fetch_i64s::<DB>(tx, held.for_len(ids.len()), &args).await?;
                    if !held.is_empty() {
                        let args = Args { ids: &held, ..args };
                        execute::<DB>(tx, finish.for_len(held.len()), &args).await?;
                    }
                    Ok(SettledIds::These(held))
                })
                .await
            }
        }?;
        Ok(match settled {
            SettledIds::All => vec![true; ids.len()],
            SettledIds::These(mut these) => {
                these.sort_unstable();
                ids.iter()
                    .map(|id| these.binary_search(id).is_ok())
                    .collect()
            }
        })
    }

    /// Releases the lease of row `id` (a delivery that will not be settled): the row is
    /// claimable again at once. With `extended`, the token of an extension whose outcome is
    /// unknown, either token is released. Whether the lease was still held.
    pub(super) async fn release_either<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Token,
        extended: Option<Token>,
    ) -> Result<bool, sqlx::Error> {
        let (stmt, args) = match extended {
            Some(extended) => (
                &self.sql.release_either,
                Args {
                    id,
                    token: Some(hold.token),
                    new_token: Some(extended.token),
                    ..Args::default()
                },
            ),
            None => (
                &self.sql.release,
                Args {
                    id,
                    token: Some(hold.token),
                    ..Args::default()
                },
            ),
        };
        let changed = on_conn(conns, async |conn| execute::<DB>(conn, stmt, &args).await).await?;
        Ok(changed == 1)
    }

    /// Whether the grouped acknowledgement settles `outcome` (an ack or a drop without a
    /// statement of the service's own), in one statement for many rows.
    pub(super) fn grouped(&self, outcome: Outcome) -> bool {
        matches!(outcome.0, Settle::Ack | Settle::Drop)
            && self.checked.custom.get(outcome.0).is_none()
    }

    pub(super) fn lost(&self, id: i64) -> Error {
        Error::LeaseLost {
            queue: self.checked.queue.to_string(),
            table: self.checked.table.to_string(),
            id,
        }
    }
}
