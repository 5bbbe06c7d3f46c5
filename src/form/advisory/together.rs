//! The advisory form's settlement of a batch joined with the claim of the next.
//!
//! On SQLite, as the lease form's (`lease::together`), in one transaction: the batch's
//! `DELETE`, the next rows' keys (held in this process) and their re-read that counts their
//! attempts commit together, so that a batch waits for one WAL fsync (`synchronous = FULL`)
//! instead of two. The batch's keys stay held until the commit. Its rows are deleted in the
//! transaction, but a rollback gives them back: a key released before would let another claim
//! take and deliver a row that the batch's own settlement, run again on its own, then removes.
//!
//! On MySQL/MariaDB, in one round trip: the batch's acks, the release of its keys and the
//! statement that takes the next rows' keys go as one text of three statements (each commits
//! on its own, in that order, as when sent apart), then the re-read that counts the next rows'
//! attempts: two round trips a batch, where a settlement and a claim apart take three.

use super::AdvisoryForm;
use super::keys::Keys;
use crate::backend::{Backend, ClaimedRow, HeldConn, Key};
use crate::delivery::Outcome;
use crate::dialect::{self, Args, MAX_FINISH};
use crate::error::{Error, Result};

/// A batch settled and the next taken: each row's result, and the rows taken.
pub(super) type Together = (Vec<Result<()>>, Vec<ClaimedRow>);

impl AdvisoryForm {
    /// Settles `settlements` (the rows of one batch, whose keys `conn` holds) and takes up to
    /// `next` rows on `conn` with it (see the module's docs), where that can be: SQLite or
    /// MySQL/MariaDB, `next` > 0, outside a transaction, every outcome an ack or a drop of the
    /// crate's own statement, at most [`MAX_FINISH`] rows. Then `conn` holds the keys of the
    /// rows taken, no longer the batch's. `None` where it cannot be, and when the settlement
    /// failed: the caller then settles the batch on its own, whose keys `conn` still holds.
    pub(super) async fn settle_and_claim<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
        next: usize,
    ) -> Option<Together> {
        let together = next > 0
            && conn.depth() == 0
            && (1..=MAX_FINISH).contains(&settlements.len())
            && settlements
                .iter()
                .all(|(_, outcome)| self.checked.finishes(*outcome));
        if !together {
            return None;
        }
        match self.keys {
            Keys::InProcess { .. } => self.in_one_transaction::<DB>(conn, settlements, next).await,
            Keys::MySql { .. } => self.in_one_round_trip::<DB>(conn, settlements, next).await,
            Keys::Postgres { .. } => None,
        }
    }

    /// SQLite: see the module's docs. A transaction that fails is rolled back (nothing
    /// settled, the keys the claim took released, the batch's still held).
    async fn in_one_transaction<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
        next: usize,
    ) -> Option<Together> {
        let begin = dialect::begin_write(DB::DIALECT)?;
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

    /// MySQL/MariaDB: see the module's docs. The batch settles as `finish_unlock` settles it.
    /// A text that fails is a batch to settle on its own, on a connection closed afterwards
    /// (which keys it holds is unknown): where its `DELETE` and release ran before the failing
    /// statement (the claim's), the `DELETE` run again deletes nothing and the batch's keys
    /// are reported lost, its rows settled all the same. A claim that fails once the batch
    /// settled gives the batch's results and no next batch, its keys given back when the
    /// connection is closed.
    async fn in_one_round_trip<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
        next: usize,
    ) -> Option<Together> {
        let finish = self.sql.finish_unlock_many.as_ref()?;
        let lock = self.sql.lock_many.as_ref()?;
        let finish = finish.for_len(settlements.len());
        if !finish.multi() {
            return None;
        }
        let ids: Vec<i64> = settlements.iter().map(|(id, _)| *id).collect();
        let names = self.keys.lock_names(&ids);
        let t = self.taking(next, &[], 0);
        let args = Args {
            ids: &ids,
            now: Some(t.now),
            lock_names: names.as_deref().unwrap_or_default(),
            ..self.keys.args(0)
        };
        let sql = format!(
            "{}; {}",
            finish.inlined(DB::DIALECT, &args),
            lock.inlined(DB::DIALECT, &self.lock_args(next, t.now, t.floor, &[]))
        );
        // Marked first: if the answer is lost, the connection is closed, not reused.
        conn.hold_key(Key::Pending);
        let answered = DB::fetch_sets(conn, sql).await;
        let (released, locked) = match answered.map_err(Error::from).and_then(|sets| {
            let released = self.released::<DB>(&sets, &ids, names.is_some())?;
            let locked = match sets.get(2) {
                Some(rows) => rows
                    .iter()
                    .map(|row| DB::get_i64(row, 0))
                    .collect::<Result<Vec<i64>, _>>()?,
                None => Vec::new(),
            };
            Ok((released, locked))
        }) {
            Ok(answer) => answer,
            Err(error) => {
                tracing::warn!(
                    %error,
                    rows = ids.len(),
                    "a batch's settlement with the next claim failed: it settles on its own"
                );
                return None;
            }
        };
        for &id in &locked {
            conn.hold_key(Key::Session(id));
        }
        conn.release_key(Key::Pending);
        let lost = self.forget_released(conn, &ids, &released);
        let results = ids
            .iter()
            .map(|id| match lost.contains(id) {
                true => Err(self.key_lost(*id)),
                false => Ok(()),
            })
            .collect();
        let full = locked.len() == next;
        let taken = async {
            let rows = self
                .read_taken::<DB>(conn, &locked, &locked, &[], t.now)
                .await?;
            self.take_rest::<DB>(conn, &t, (locked, rows, full)).await
        };
        match taken.await {
            Ok(rows) => Some((results, rows)),
            Err(failed) => {
                tracing::warn!(error = %failed.error, "the claim joined with a batch's settlement failed");
                // Its keys, held or not: the connection is closed.
                conn.hold_key(Key::Pending);
                Some((results, Vec::new()))
            }
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod tests;
