//! The advisory form's take: listing the rows whose keys no session holds, locking a key without
//! waiting and reading its row again, and unlocking it — the key handling, apart from the form's
//! trait impl, which says when each runs.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};

use super::AdvisoryForm;
use super::keys::Keys;
use crate::backend::{Backend, ClaimedRow, HeldConn, Key, in_process, is_row_error};
use crate::dialect::Args;
use crate::error::{Error, Result};
use crate::form::{ClaimFailed, execute, fetch_claimed, fetch_i64, fetch_i64s};

impl AdvisoryForm {
    /// Ids of claimable rows whose keys no session holds, in claim order (twice what is wanted,
    /// as some may be taken meanwhile), passing over the `excluded` ids.
    pub(super) async fn candidates<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        want: usize,
        now: DateTime<Utc>,
        excluded: &[i64],
    ) -> Result<VecDeque<i64>, sqlx::Error> {
        // SQLite's keys are held in this process, not skipped by the query: list past them.
        let held = match self.keys {
            Keys::InProcess { table } => in_process::count(table),
            _ => 0,
        };
        let args = Args {
            now: Some(now),
            group: self.checked.group.as_deref(),
            limit: i64::try_from(want * 2 + 2 + held).unwrap_or(i64::MAX),
            excluded,
            ..self.keys.args(0)
        };
        let candidates = match excluded {
            [] => &self.sql.candidates,
            _ => &self.sql.candidates_excluding,
        };
        let ids = fetch_i64s::<DB>(conn, candidates, &args).await?;
        Ok(match self.keys {
            Keys::InProcess { table } => ids
                .into_iter()
                .filter(|id| !in_process::holds(table, *id))
                .collect(),
            _ => ids.into(),
        })
    }

    /// Takes the next candidate whose key `conn` gets, and holds it there. A take that fails
    /// for a reason of the row's own releases its key and names the row.
    pub(super) async fn take<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        candidates: &mut VecDeque<i64>,
        now: DateTime<Utc>,
    ) -> Result<Option<ClaimedRow>, ClaimFailed> {
        while let Some(id) = candidates.pop_front() {
            if !self.lock::<DB>(conn, id).await? {
                continue;
            }
            let args = Args {
                now: Some(now),
                group: self.checked.group.as_deref(),
                ..self.keys.args(id)
            };
            let with_attempt = self.checked.with_attempt;
            let taken = async {
                let row = fetch_claimed::<DB>(&mut *conn, &self.sql.take, &args, with_attempt)
                    .await?
                    .pop();
                if let (Some(_), Some(count)) = (&row, &self.sql.count) {
                    execute::<DB>(&mut *conn, count, &args).await?;
                }
                Ok::<_, sqlx::Error>(row)
            };
            match taken.await {
                Ok(Some(row)) => return Ok(Some(row)),
                // Settled by another session since the candidates were listed.
                Ok(None) => self.unlock::<DB>(conn, id).await?,
                Err(error) => {
                    if is_row_error(&error) {
                        self.unlock::<DB>(conn, id).await?;
                    }
                    return Err(ClaimFailed {
                        row: Some(id),
                        error: error.into(),
                    });
                }
            }
        }
        Ok(None)
    }

    /// Takes row `id`'s key on `conn` without waiting.
    pub(super) async fn lock<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
    ) -> Result<bool, sqlx::Error> {
        match (&self.keys, &self.sql.lock) {
            (Keys::InProcess { table }, _) => {
                let taken = in_process::take(*table, id);
                if taken {
                    conn.hold_key(Key::InProcess(*table, id));
                }
                Ok(taken)
            }
            (keys, Some(lock)) => {
                // Marked first: if the answer is lost, the connection is closed, not reused.
                conn.hold_key(Key::Session(id));
                let taken = fetch_i64::<DB>(conn, lock, &keys.args(id)).await? == Some(1);
                if !taken {
                    conn.release_key(Key::Session(id));
                }
                Ok(taken)
            }
            // The server databases' keys are rendered with their lock statement.
            (_, None) => Ok(false),
        }
    }

    /// Releases row `id`'s key. An unlock the server does not confirm is an error: the
    /// connection, whose lock state is then unknown, is closed when it is dropped.
    pub(super) async fn unlock<DB: Backend>(&self, conn: &mut HeldConn<DB>, id: i64) -> Result<()> {
        if let Some(unlock) = &self.sql.unlock {
            let released = fetch_i64::<DB>(conn, unlock, &self.keys.args(id)).await?;
            if released != Some(1) {
                return Err(Error::KeyLost {
                    queue: self.checked.queue.to_string(),
                    table: self.checked.table.to_string(),
                    id,
                });
            }
        }
        conn.release_key(self.keys.key_of(id));
        Ok(())
    }
}
