//! The lease form's settlement of a batch and claim of the next in one transaction, on SQLite:
//! the acknowledgement of one batch and the claim of the next commit together, so that a batch
//! waits for one WAL fsync (`synchronous = FULL`) instead of two: `benches/throughput` (SQLite,
//! lease batches) measures it against a loop that commits each apart.

use chrono::{DateTime, Utc};

use super::{LeaseForm, Token};
use crate::backend::{Backend, ClaimedRow};
use crate::delivery::Outcome;
use crate::dialect::{self, MAX_FINISH};
use crate::error::Result;
use crate::form::{Conns, Form, in_transaction};

/// A batch settled and the next claimed: each row's result, and the rows claimed with the
/// token each carries.
pub(super) type Together = (Vec<Result<()>>, (Vec<ClaimedRow>, Vec<Token>));

impl LeaseForm {
    /// Settles `settlements` (the rows of one batch, leased by `tokens`) and claims up to
    /// `next` rows, in one `BEGIN IMMEDIATE` .. `COMMIT`, where that can be: SQLite, `next` > 0,
    /// every outcome one that the grouped acknowledgement settles, at most [`MAX_FINISH`] rows.
    /// `Err(tokens)` where it cannot, and when the transaction failed (rolled back: nothing
    /// settled, nothing claimed): the caller then settles the batch on its own.
    pub(super) async fn settle_and_claim<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        tokens: Vec<Token>,
        next: usize,
    ) -> Result<Together, Vec<Token>> {
        let begin = dialect::begin_write(DB::DIALECT);
        let together = <Self as Form<DB>>::CLAIMS_WITH_SETTLEMENT
            && next > 0
            && (1..=MAX_FINISH).contains(&settlements.len())
            && settlements
                .iter()
                .all(|(_, outcome)| self.grouped(*outcome));
        let (Some(begin), true) = (begin, together) else {
            return Err(tokens);
        };
        let Ok(mut conn) = conns.get().await else {
            return Err(tokens);
        };
        let ids: Vec<i64> = settlements.iter().map(|(id, _)| *id).collect();
        let leased: Vec<DateTime<Utc>> = tokens.iter().map(|hold| hold.token).collect();
        let done = in_transaction::<DB, _>(&mut conn, begin, async |tx| {
            let settled = self.finish_many_on::<DB>(tx, &ids, &leased).await?;
            let claimed = self.claim_rows_on::<DB>(tx, next, &[]).await?;
            Ok((settled, claimed))
        })
        .await;
        match conns.checked(done) {
            Ok((settled, claimed)) => {
                conns.put(conn);
                let (rows, token) = self.committed(claimed);
                let results = ids
                    .iter()
                    .zip(settled)
                    .map(|(&id, settled)| if settled { Ok(()) } else { Err(self.lost(id)) })
                    .collect();
                let tokens = vec![token; rows.len()];
                Ok((results, (rows, tokens)))
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    rows = ids.len(),
                    "a batch's settlement with the next claim failed: it settles on its own"
                );
                Err(tokens)
            }
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests;
