//! The advisory form's settlement of a batch and claim of the next in one transaction, on
//! SQLite, as the lease form's (`lease::together`): the batch's `DELETE`, the next rows' keys
//! (held in this process) and their re-read that counts their attempts commit together, so
//! that a batch waits for one WAL fsync (`synchronous = FULL`) instead of two.
//!
//! The batch's keys stay held until the commit. Its rows are deleted in the transaction, but a
//! rollback gives them back: a key released before would let another claim take and deliver a
//! row that the batch's own settlement, run again on its own, then removes.

use super::AdvisoryForm;
use super::keys::Keys;
use crate::backend::{Backend, ClaimedRow, HeldConn, Key};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{self, MAX_FINISH};
use crate::error::{Error, Result};

/// A batch settled and the next taken: each row's result, and the rows taken.
pub(super) type Together = (Vec<Result<()>>, Vec<ClaimedRow>);

impl AdvisoryForm {
    /// Settles `settlements` (the rows of one batch, whose keys `conn` holds) and takes up to
    /// `next` rows on `conn`, in one `BEGIN IMMEDIATE` .. `COMMIT`, where that can be: SQLite,
    /// `next` > 0, every outcome an ack or a drop of the crate's own statement, at most
    /// [`MAX_FINISH`] rows. Once committed, `conn` holds the keys of the rows taken, no longer
    /// the batch's. `None` where it cannot be, and when the transaction failed (rolled back:
    /// nothing settled, the keys it took released, the batch's still held): the caller then
    /// settles the batch on its own.
    pub(super) async fn settle_and_claim<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
        next: usize,
    ) -> Option<Together> {
        let together = matches!(self.keys, Keys::InProcess { .. })
            && next > 0
            && conn.depth() == 0
            && (1..=MAX_FINISH).contains(&settlements.len())
            && settlements
                .iter()
                .all(|(_, outcome)| self.finishes(*outcome));
        let begin = dialect::begin_write(DB::DIALECT).filter(|_| together)?;
        let ids: Vec<i64> = settlements.iter().map(|(id, _)| *id).collect();
        let held: Vec<Key> = conn.keys().to_vec();
        let done = async {
            conn.begin(Some(begin)).await?;
            self.finish::<DB>(conn, &ids).await?;
            let rows = self
                .take_after::<DB>(conn, next, &[], ids.len())
                .await
                .map_err(|failed| failed.error)?;
            conn.commit().await?;
            Ok::<_, Error>(rows)
        };
        match done.await {
            Ok(rows) => {
                for &id in &ids {
                    conn.release_key(self.keys.key_of(id));
                }
                Some((ids.iter().map(|_| Ok(())).collect(), rows))
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    rows = ids.len(),
                    "a batch's settlement with the next claim failed: it settles on its own"
                );
                // A rollback that fails leaves the transaction open: the connection is closed
                // when dropped, and the settlement on its own fails with it.
                if conn.depth() > 0
                    && let Err(error) = conn.rollback().await
                {
                    tracing::warn!(%error, "could not roll back a batch's settlement");
                }
                // The keys the claim took go back; the batch's stay held for its settlement.
                let taken: Vec<Key> = conn
                    .keys()
                    .iter()
                    .filter(|key| !held.contains(key))
                    .copied()
                    .collect();
                for key in taken {
                    conn.release_key(key);
                }
                None
            }
        }
    }

    /// Whether `outcome` settles by the grouped `DELETE` (`finish_many`).
    fn finishes(&self, outcome: Outcome) -> bool {
        matches!(outcome.0, Settle::Ack | Settle::Drop | Settle::Undecodable)
            && self.checked.custom.get(outcome.0).is_none()
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests;
