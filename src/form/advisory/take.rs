//! The advisory form's take and release: locking keys without waiting (the rows read again
//! beside it, `reread`), and unlocking them — the key handling, apart from the form's trait
//! impl, which says when each runs. A take is two statements for one row or many (three on MySQL/MariaDB with an
//! attempt column, the last two sent together; one on PostgreSQL with an attempt column, on a
//! session holding no key yet); a release is one.

use chrono::{DateTime, Utc};

use super::AdvisoryForm;
use super::keys::Keys;
use crate::backend::{Backend, ClaimedRow, HeldConn, Key, claimed_row, in_process, is_row_error};
use crate::dialect::{Args, MAX_EXCLUDED, MAX_FINISH, Stmt};
use crate::error::{Error, Result};
use crate::form::{ClaimFailed, execute, fetch_all, fetch_i64, fetch_i64s};

/// A take under way: what it asks for, and when and where it started.
pub(super) struct Taking<'a> {
    want: usize,
    excluded: &'a [i64],
    /// See [`AdvisoryForm::take_after`].
    deleted: usize,
    pub(super) now: DateTime<Utc>,
    pub(super) floor: Option<i64>,
}

impl AdvisoryForm {
    /// Takes up to `want` rows on `conn`, which then holds their keys: their keys first, without
    /// waiting, then the rows still claimable, their attempts counted. A take that fails for a
    /// reason of one row's own releases every key and names the row.
    pub(super) async fn take<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        want: usize,
        excluded: &[i64],
    ) -> Result<Vec<ClaimedRow>, ClaimFailed> {
        self.take_after::<DB>(conn, want, excluded, 0).await
    }

    /// [`take`](Self::take) in a transaction that deleted `deleted` rows whose keys `conn` still
    /// holds (see `together`): SQLite's listing, which passes over the keys held in the
    /// process, does not count theirs (the transaction no longer sees those rows).
    pub(super) async fn take_after<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        want: usize,
        excluded: &[i64],
        deleted: usize,
    ) -> Result<Vec<ClaimedRow>, ClaimFailed> {
        let t = self.taking(want, excluded, deleted);
        // One statement takes every key: keys are re-entrant on PostgreSQL and MySQL/MariaDB, so
        // a second statement would take again the keys of rows the first took, still claimable.
        let first = match self.lock_take_stmt(conn.holds_keys(), excluded) {
            Some(stmt) => {
                let (ids, rows) = self
                    .lock_take::<DB>(conn, stmt, want, t.now, t.floor, excluded)
                    .await?;
                let full = ids.len() == want;
                (ids, rows, full)
            }
            None => {
                let (ids, full) = self
                    .lock::<DB>(conn, want, t.now, t.floor, excluded, deleted)
                    .await?;
                let rows = self.read_taken::<DB>(conn, &ids, &ids, &[], t.now).await?;
                (ids, rows, full)
            }
        };
        self.take_rest::<DB>(conn, &t, first).await
    }

    /// A take of up to `want` rows starting now, from the claims' floor.
    pub(super) fn taking<'a>(
        &self,
        want: usize,
        excluded: &'a [i64],
        deleted: usize,
    ) -> Taking<'a> {
        Taking {
            want,
            excluded,
            deleted,
            now: self.checked.clock.now(),
            floor: self.checked.floor.start(),
        }
    }

    /// The rest of take `t` once its first statement took keys and read rows (`first`: the ids
    /// whose keys it took, the rows still claimable, and whether it found as many as it
    /// looked for): places left by rows settled since are filled again; the rows in claim
    /// order.
    pub(super) async fn take_rest<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        t: &Taking<'_>,
        first: (Vec<i64>, Vec<ClaimedRow>, bool),
    ) -> Result<Vec<ClaimedRow>, ClaimFailed> {
        let (mut ids, mut rows, mut full) = first;
        let (want, excluded, now, floor) = (t.want, t.excluded, t.now, t.floor);
        self.checked.floor.claimed(floor, want, ids.iter().copied());
        // Rows settled by another session since the statement's snapshot (or, SQLite, rows
        // whose keys another claim of this process took since it counted them) leave places a
        // claim that found enough rows fills again, passing over every row whose key it took —
        // those it holds, whose keys are re-entrant, and those settled, whose keys it gave back
        // (a claim short of its rows would make its queue wait for the poll with rows ready): by
        // their ids, or, a list too long for the statement, from above the largest (claims in
        // id order: the rows below it not taken were another session's, or not claimable).
        for _ in 0..Self::REFILLS {
            let short = want - rows.len();
            if !full || short == 0 {
                break;
            }
            let mut skip = excluded.to_vec();
            skip.extend(&ids);
            let (skip, from) = match ids.iter().max() {
                _ if skip.len() <= usize::from(MAX_EXCLUDED) => (skip, floor),
                Some(largest) if self.checked.floor.enabled() => {
                    (excluded.to_vec(), Some(largest + 1))
                }
                _ => break,
            };
            let more;
            (more, full) = self
                .lock::<DB>(conn, short, now, from, &skip, t.deleted)
                .await?;
            ids.extend(&more);
            let read = self.read_taken::<DB>(conn, &more, &ids, &rows, now).await?;
            rows.extend(read);
        }
        // In claim order, as the keys were taken.
        rows.sort_by_key(|row| ids.iter().position(|id| *id == row.id));
        Ok(rows)
    }

    /// How many times a claim takes more keys for rows settled since its snapshot.
    const REFILLS: usize = 2;

    /// The statement that takes a claim's first keys and rows at once
    /// ([`AdvisorySql::lock_take`]), where the form has it and the session holds no key yet
    /// (`held`): `None`, two statements take them.
    fn lock_take_stmt(&self, held: bool, excluded: &[i64]) -> Option<&Stmt> {
        let stmt = match excluded {
            [] => self.sql.lock_take.as_ref(),
            _ => self.sql.lock_take_excluding.as_ref(),
        };
        stmt.filter(|_| !held)
    }

    /// Takes up to `want` keys and their rows by `stmt` ([`lock_take_stmt`](Self::lock_take_stmt))
    /// on `conn`, which holds no key before: the ids whose keys it took, and the rows still
    /// claimable, whose keys `conn` now holds (the others' keys the statement released). When
    /// the statement fails for a reason of one row's own, the keys it took are released and
    /// two statements take them instead, which name the row.
    async fn lock_take<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        stmt: &Stmt,
        want: usize,
        now: DateTime<Utc>,
        floor: Option<i64>,
        excluded: &[i64],
    ) -> Result<(Vec<i64>, Vec<ClaimedRow>), ClaimFailed> {
        let args = self.lock_args(want, now, floor, excluded);
        // Marked first: if the answer is lost, the connection is closed, not reused.
        conn.hold_key(Key::Pending);
        let rows = match fetch_all::<DB>(&mut *conn, stmt, &args).await {
            Ok(rows) => rows,
            Err(error) if is_row_error(&error) => {
                self.unlock_all::<DB>(conn).await?;
                conn.release_key(Key::Pending);
                let (ids, _) = self.lock::<DB>(conn, want, now, floor, excluded, 0).await?;
                let rows = self.read_taken::<DB>(conn, &ids, &ids, &[], now).await?;
                return Ok((ids, rows));
            }
            Err(error) => return Err(error.into()),
        };
        let mut ids = Vec::with_capacity(rows.len());
        let mut taken = Vec::with_capacity(rows.len());
        for row in &rows {
            let last = sqlx::Row::len(row) - 1;
            let id = DB::get_i64(row, 0)?;
            ids.push(id);
            // 0: the row, its key held; 1 (2): its key released (was not held).
            if DB::get_i64(row, last)? == 0 {
                taken.push(claimed_row::<DB>(row, self.checked.columns, last)?);
                conn.hold_key(Key::Session(id));
            }
        }
        conn.release_key(Key::Pending);
        Ok((ids, taken))
    }

    /// Releases every key of `conn`'s session, after a statement that took an unknown part of
    /// them failed (the session held none before it).
    async fn unlock_all<DB: Backend>(&self, conn: &mut HeldConn<DB>) -> Result<(), sqlx::Error> {
        if let Some(unlock_all) = &self.sql.unlock_all {
            execute::<DB>(&mut *conn, unlock_all, &Args::default()).await?;
        }
        Ok(())
    }

    /// Takes the keys of up to `want` claimable rows without waiting, from id `floor` up
    /// ([`Floor`](crate::form::floor::Floor)): the ids whose keys `conn` now holds, and whether
    /// more rows may be claimable than it took (it found as many as it looked for: `false`
    /// when it took fewer than `want` because there were no more). `deleted`: as
    /// [`take_after`](Self::take_after)'s.
    async fn lock<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        want: usize,
        now: DateTime<Utc>,
        floor: Option<i64>,
        excluded: &[i64],
        deleted: usize,
    ) -> Result<(Vec<i64>, bool), sqlx::Error> {
        let args = self.lock_args(want, now, floor, excluded);
        match self.keys {
            Keys::InProcess { table } => {
                // SQLite's keys are held in this process: `want` rows past those it holds keys
                // of have `want` free ones, unless another claim took some since the count (the
                // list then came back full: the caller lists again). Each row listed costs the
                // client ~2,700 instructions: twice as many made a batch of 16 cost 8% more.
                let limit = want + in_process::count(table).saturating_sub(deleted);
                let args = Args {
                    limit: i64::try_from(limit).unwrap_or(i64::MAX),
                    ..args
                };
                let candidates = match excluded {
                    [] => &self.sql.candidates,
                    _ => &self.sql.candidates_excluding,
                };
                let listed = fetch_i64s::<DB>(conn, candidates, &args).await?;
                let mut taken = Vec::with_capacity(want);
                for &id in &listed {
                    if taken.len() == want {
                        break;
                    }
                    if in_process::take(table, id) {
                        conn.hold_key(Key::InProcess(table, id));
                        taken.push(id);
                    }
                }
                Ok((taken, listed.len() == limit))
            }
            _ => {
                let lock = match excluded {
                    [] => self.sql.lock_many.as_ref(),
                    _ => self.sql.lock_many_excluding.as_ref(),
                };
                let Some(lock) = lock else {
                    return Ok((Vec::new(), false));
                };
                // Marked first: if the answer is lost, the connection is closed, not reused.
                conn.hold_key(Key::Pending);
                let ids = fetch_i64s::<DB>(conn, lock, &args).await?;
                for id in &ids {
                    conn.hold_key(Key::Session(*id));
                }
                conn.release_key(Key::Pending);
                let full = ids.len() == want;
                Ok((ids, full))
            }
        }
    }

    /// The arguments of a statement that takes the keys of up to `want` rows.
    pub(super) fn lock_args<'a>(
        &'a self,
        want: usize,
        now: DateTime<Utc>,
        floor: Option<i64>,
        excluded: &'a [i64],
    ) -> Args<'a> {
        Args {
            now: Some(now),
            group: self.checked.group.as_deref(),
            limit: i64::try_from(want).unwrap_or(i64::MAX),
            floor,
            window: self.window,
            excluded,
            ..self.keys.args(0)
        }
    }

    /// Releases row `id`'s key. An unlock the server does not confirm is an error: the
    /// connection, whose lock state is then unknown, is closed when it is dropped.
    pub(super) async fn unlock<DB: Backend>(&self, conn: &mut HeldConn<DB>, id: i64) -> Result<()> {
        if let Some(unlock) = &self.sql.unlock {
            let released = fetch_i64::<DB>(conn, unlock, &self.keys.args(id)).await?;
            if released != Some(1) {
                return Err(self.key_lost(id));
            }
        }
        conn.release_key(self.keys.key_of(id));
        Ok(())
    }

    /// Releases the keys of rows `ids`: the ids whose key was not held (lost with a session the
    /// server ended), or the statement's error. Either leaves the connection holding a key it
    /// does not know of, so it is closed when dropped.
    pub(super) async fn unlock_many<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
    ) -> Result<Vec<i64>> {
        let mut lost = Vec::new();
        if let Some(unlock) = &self.sql.unlock_many {
            for chunk in ids.chunks(MAX_FINISH) {
                let args = Args {
                    ids: chunk,
                    ..self.keys.args(0)
                };
                let released = fetch_i64s::<DB>(conn, unlock.for_len(chunk.len()), &args).await?;
                for &id in chunk {
                    if released.contains(&id) {
                        conn.release_key(Key::Session(id));
                    } else {
                        lost.push(id);
                    }
                }
            }
        } else {
            for &id in ids {
                conn.release_key(self.keys.key_of(id));
            }
        }
        Ok(lost)
    }

    pub(super) fn key_lost(&self, id: i64) -> Error {
        Error::KeyLost {
            queue: self.checked.queue.to_string(),
            table: self.checked.table.to_string(),
            id,
        }
    }
}
