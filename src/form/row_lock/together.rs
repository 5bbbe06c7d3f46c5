//! The row lock form's settlement of a full batch joined with the claim of the next, on
//! PostgreSQL: the batch's `DELETE`, its `COMMIT`, the next batch's `BEGIN` and its claim
//! (`SELECT .. FOR UPDATE SKIP LOCKED`) go to the server as one text, values written in
//! ([`Stmt::inlined`](crate::dialect::Stmt::inlined)): one round trip a batch where a
//! settlement and a claim take four. The batch commits as it would on its own, before the next
//! transaction begins; the next batch is held by that transaction on the same connection.
//! `benches/throughput` (PostgreSQL, row lock batches) measures it against the hand-written
//! loop's four round trips.
//!
//! The server runs the statements in order and stops at the first that fails: the sets it
//! reported done tell how far the text went. Up to the `COMMIT`, the batch is rolled back, as
//! when its own settlement fails; past it, the batch is settled, and only the claim failed: its
//! transaction is rolled back and the worker claims as usual.

use super::RowLockForm;
use crate::backend::{Backend, HeldConn, claimed_rows};
use crate::delivery::Outcome;
use crate::dialect::{Args, MAX_FINISH};
use crate::error::Error;
use crate::form::{Conns, Form, SettledAndClaimed};

/// The sets a joined text reports when it ran whole: the `DELETE`, `COMMIT`, `BEGIN`, the claim.
const SETS: usize = 4;

impl RowLockForm {
    /// Settles `settlements` (the rows `conn`'s transaction holds) and claims up to `next` rows
    /// in one round trip, where that can be: PostgreSQL, `next` > 0, every outcome one that the
    /// grouped `DELETE` settles, at most [`MAX_FINISH`] rows, the transaction open without a
    /// savepoint. `Err(conn)` where it cannot: the caller settles the batch on its own.
    pub(super) async fn settle_and_claim<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        mut conn: HeldConn<DB>,
        next: usize,
    ) -> Result<SettledAndClaimed<DB, Self>, HeldConn<DB>> {
        let checked = &self.checked;
        let joined = <Self as Form<DB>>::CLAIMS_WITH_SETTLEMENT
            && next > 0
            && (1..=MAX_FINISH).contains(&settlements.len())
            && conn.depth() == 1
            && settlements
                .iter()
                .all(|(_, outcome)| checked.finishes(*outcome));
        if !joined {
            return Err(conn);
        }
        let ids: Vec<i64> = settlements.iter().map(|(id, _)| *id).collect();
        let claim = self.claim_args(next, &[]);
        let finish = Args {
            ids: &ids,
            now: claim.now,
            ..Args::default()
        };
        let sql = format!(
            "{}; COMMIT; {}; {}",
            self.sql
                .finish_many
                .for_len(ids.len())
                .inlined(DB::DIALECT, &finish),
            self.sql.begin.unwrap_or("BEGIN"),
            self.sql.claim.inlined(DB::DIALECT, &claim),
        );
        let (mut sets, done) = DB::fetch_sets_until(&mut conn, sql).await;
        let settled = sets.len() >= 2;
        let claimed = match done {
            Ok(()) if sets.len() == SETS => {
                claimed_rows::<DB>(&sets.pop().unwrap_or_default(), checked.columns)
            }
            Ok(()) => Err(sqlx::Error::Protocol(format!(
                "{} results to a batch's settlement with the next claim, not {SETS}",
                sets.len()
            ))),
            Err(error) => Err(error),
        };
        let claimed = match claimed {
            Ok(rows) => self.claimed::<DB>(&mut conn, &claim, rows).await,
            Err(error) => Err(error),
        };
        let error = match claimed {
            Ok(rows) => {
                let results = ids.iter().map(|_| Ok(())).collect();
                return Ok((Ok(results), Some((rows, conn))));
            }
            Err(error) => error,
        };
        // Whichever transaction is open, the batch's or the next one's, it ends; a connection
        // whose rollback fails is closed, and the server rolls back.
        if conn.rollback().await.is_ok() {
            conns.put_held(conn);
        }
        if settled {
            tracing::warn!(%error, "the claim joined with a batch's settlement failed");
            let results = ids.iter().map(|_| Ok(())).collect();
            return Ok((Ok(results), None));
        }
        let error = self.rolled_back(ids.len(), Error::from(error));
        Ok((Err((None, error)), None))
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests;
