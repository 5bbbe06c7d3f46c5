//! The advisory form's settlement of many rows on the session holding their keys (a batch, or
//! the grouped acks of a claim's rows): acks and drops with one round trip that also releases
//! their keys where the database allows it (`finish_unlock_many`: PostgreSQL; MySQL/MariaDB
//! outside a transaction), else with one statement and one release; retries with the release
//! alone; every other outcome row by row.

use super::AdvisoryForm;
use crate::backend::{Backend, HeldConn, Key};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, MAX_FINISH};
use crate::error::Result;
use crate::form::{execute, fetch_i64s, fetch_sets, no_dead_letter};

impl AdvisoryForm {
    /// Settles a batch on the session holding its keys: acks and drops with one statement (row
    /// by row if it fails, so each row's own statement says how it went), retries with none, and
    /// their keys released with it or with one more; a delay, a dead letter or a custom
    /// statement row by row, as a single delivery. One result per row, in order. `keep_failed`:
    /// as [`settle_as`](Self::settle_as)'s.
    pub(super) async fn settle_sets<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        settlements: &[(i64, Outcome)],
        keep_failed: bool,
    ) -> Vec<Result<()>> {
        let checked = &self.checked;
        let mut results: Vec<Option<Result<()>>> = settlements.iter().map(|_| None).collect();
        let (mut finish, mut unlock_only) = (Vec::new(), Vec::new());
        for (i, &(id, outcome)) in settlements.iter().enumerate() {
            match outcome.0 {
                _ if checked.custom.get(outcome.0).is_some() => {}
                Settle::Ack | Settle::Drop | Settle::Undecodable => finish.push((i, id)),
                Settle::DeadLetter if checked.dead.is_none() => {
                    no_dead_letter(&checked.table, id);
                    finish.push((i, id));
                }
                Settle::Retry | Settle::Fail => unlock_only.push((i, id)),
                Settle::DeadLetter | Settle::RetryAfter(_) => {}
            }
        }
        let mut failed = Vec::new();
        for chunk in finish.chunks(MAX_FINISH) {
            let ids: Vec<i64> = chunk.iter().map(|(_, id)| *id).collect();
            let settled = match self.finishes_unlocking(conn) {
                true => self.finish_unlock::<DB>(conn, &ids).await.map(|lost| {
                    for &(i, id) in chunk {
                        let lost = lost.contains(&id).then(|| self.key_lost(id));
                        results[i] = Some(lost.map_or(Ok(()), Err));
                    }
                }),
                false => self.finish::<DB>(conn, &ids).await.map(|()| {
                    unlock_only.extend_from_slice(chunk);
                }),
            };
            // Row by row below: each row's statement fails or not on its own, and names its row.
            if let Err(error) = settled {
                tracing::debug!(%error, rows = ids.len(), "a batch's acks fall back to one per row");
                failed.extend_from_slice(chunk);
            }
        }
        let ids: Vec<i64> = unlock_only.iter().map(|(_, id)| *id).collect();
        match self.unlock_many::<DB>(conn, &ids).await {
            Ok(lost) => {
                for &(i, id) in &unlock_only {
                    let lost = lost.contains(&id).then(|| self.key_lost(id));
                    results[i].get_or_insert(lost.map_or(Ok(()), Err));
                }
            }
            Err(error) => {
                tracing::warn!(%error, "could not release a batch's keys; its connection is closed");
                for &(i, _) in &unlock_only {
                    results[i].get_or_insert(Ok(()));
                }
            }
        }
        for (i, &(id, outcome)) in settlements.iter().enumerate() {
            if results[i].is_none() || failed.iter().any(|(f, _)| *f == i) {
                let settled = self.settle_as::<DB>(conn, id, outcome, keep_failed, None);
                results[i] = Some(settled.await);
            }
        }
        results.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    /// Acks and drops rows `ids` (at most [`MAX_FINISH`]) with one statement, their keys kept.
    pub(super) async fn finish<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
    ) -> Result<()> {
        let args = Args {
            ids,
            now: Some(self.checked.clock.now()),
            ..Args::default()
        };
        execute::<DB>(conn, self.sql.finish_many.for_len(ids.len()), &args).await?;
        Ok(())
    }

    /// Whether acks release their keys in the same round trip (`finish_unlock_many`):
    /// PostgreSQL's one statement anywhere, MySQL/MariaDB's two outside a transaction only (the
    /// release must follow the settlement's commit).
    pub(super) fn finishes_unlocking<DB: Backend>(&self, conn: &HeldConn<DB>) -> bool {
        let Some(stmt) = &self.sql.finish_unlock_many else {
            return false;
        };
        conn.depth() == 0 || !stmt.for_len(1).multi()
    }

    /// Acks and drops rows `ids` (at most [`MAX_FINISH`]) and releases their keys in one round
    /// trip (`finish_unlock_many`; see [`finishes_unlocking`](Self::finishes_unlocking)): the
    /// ids whose key was not held (lost with a session the server ended; their rows are
    /// settled all the same, as by a `DELETE` and an unlock), or the error, which leaves every
    /// key held (they are released once the rows are settled; on MySQL/MariaDB the settlement
    /// may have committed).
    pub(super) async fn finish_unlock<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
    ) -> Result<Vec<i64>> {
        let Some(stmt) = &self.sql.finish_unlock_many else {
            return Ok(ids.to_vec());
        };
        let names = self.keys.lock_names(ids);
        let args = Args {
            ids,
            now: Some(self.checked.clock.now()),
            lock_names: names.as_deref().unwrap_or_default(),
            ..self.keys.args(0)
        };
        let stmt = stmt.for_len(ids.len());
        let released = match stmt.multi() {
            true => {
                let sets = fetch_sets::<DB>(conn, stmt, &args).await?;
                self.released::<DB>(&sets, ids, names.is_some())?
            }
            false => fetch_i64s::<DB>(conn, stmt, &args).await?,
        };
        Ok(self.forget_released(conn, ids, &released))
    }

    /// The ids of `ids` whose keys the release of a two-statement `finish_unlock_many` gave
    /// back, from its result `sets`: `named`, one row of one column, `1` at each name's place
    /// whose key was held (the client wrote the names); else the released ids as rows.
    pub(super) fn released<DB: Backend>(
        &self,
        sets: &[Vec<DB::Row>],
        ids: &[i64],
        named: bool,
    ) -> Result<Vec<i64>> {
        let Some(rows) = sets.get(1) else {
            return Ok(Vec::new());
        };
        let mut released = Vec::with_capacity(ids.len());
        match (named, rows.first()) {
            (true, Some(row)) => {
                let held = DB::get_bytes(row, 0)?;
                for (i, &id) in ids.iter().enumerate() {
                    if held.get(i) == Some(&b'1') {
                        released.push(id);
                    }
                }
            }
            (true, None) => {}
            (false, _) => {
                for row in rows {
                    released.push(DB::get_i64(row, 0)?);
                }
            }
        }
        Ok(released)
    }

    /// Records the keys of `released` as given back on `conn`: the ids of `ids` whose key was
    /// not held (lost with a session the server ended).
    pub(super) fn forget_released<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
        released: &[i64],
    ) -> Vec<i64> {
        let mut lost = Vec::new();
        for &id in ids {
            if released.contains(&id) {
                conn.release_key(Key::Session(id));
            } else {
                lost.push(id);
            }
        }
        lost
    }
}
