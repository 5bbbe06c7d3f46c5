//! The advisory form's re-read of the rows a take locked: those still claimable (another session
//! may have settled one since the statement that took its key saw it), their attempts counted,
//! in one round trip where the database allows it; the keys of the others given back.

use chrono::{DateTime, Utc};

use super::AdvisoryForm;
use crate::backend::{Backend, ClaimedRow, HeldConn, claimed_rows, is_row_error};
use crate::dialect::{Args, MAX_FINISH};
use crate::form::{ClaimFailed, execute, fetch_claimed, fetch_sets};

impl AdvisoryForm {
    /// Reads rows `taken` again (whose keys `conn` now holds), those still claimable, their
    /// attempts counted, and gives back the keys of the others. A read that fails for a reason
    /// of one row's own releases every key of the claim (`all`) and names the row; the rows the
    /// claim read before (`read`, and this call's own), delivered none, go back with the
    /// attempts they had.
    pub(super) async fn read_taken<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        taken: &[i64],
        all: &[i64],
        read: &[ClaimedRow],
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimedRow>, ClaimFailed> {
        let mut rows = Vec::with_capacity(taken.len());
        for chunk in taken.chunks(MAX_FINISH) {
            match self.reread::<DB>(conn, chunk, now).await {
                Ok(read) => rows.extend(read),
                Err(error) if is_row_error(&error) => {
                    // One statement names no row: row by row to find it.
                    let named = self.reread_each::<DB>(conn, chunk, now).await;
                    for row in read.iter().chain(&rows) {
                        if let Some(attempt) = row.attempt {
                            self.uncount::<DB>(conn, row.id, attempt).await;
                        }
                    }
                    self.unlock_many::<DB>(conn, all).await?;
                    return Err(named.err().unwrap_or(ClaimFailed {
                        row: None,
                        error: error.into(),
                    }));
                }
                Err(error) => return Err(error.into()),
            }
        }
        // Rows settled by another session since the claim's snapshot: their keys go back.
        let stale: Vec<i64> = taken
            .iter()
            .copied()
            .filter(|id| !rows.iter().any(|row| row.id == *id))
            .collect();
        if !stale.is_empty() {
            self.unlock_many::<DB>(conn, &stale).await?;
        }
        Ok(rows)
    }

    /// Reads rows `ids` (whose keys `conn` holds) again, those still claimable, and counts their
    /// attempts.
    async fn reread<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        let args = Args {
            ids,
            now: Some(now),
            group: self.checked.group.as_deref(),
            ..Args::default()
        };
        let columns = self.checked.columns;
        if let Some(take_count) = &self.sql.take_count_many {
            // Counted and read in one round trip.
            let sets = fetch_sets::<DB>(conn, take_count.for_len(ids.len()), &args).await?;
            let read = sets.last().map(Vec::as_slice).unwrap_or_default();
            return claimed_rows::<DB>(read, columns);
        }
        let take = self.sql.take_many.for_len(ids.len());
        let rows = fetch_claimed::<DB>(&mut *conn, take, &args, columns).await?;
        if let (false, Some(count)) = (rows.is_empty(), &self.sql.count_many) {
            let read: Vec<i64> = rows.iter().map(|row| row.id).collect();
            let args = Args { ids: &read, ..args };
            execute::<DB>(&mut *conn, count.for_len(read.len()), &args).await?;
        }
        Ok(rows)
    }

    /// [`reread`](Self::reread) row by row, to name the row whose statement fails, in a
    /// transaction rolled back at the end: it counts no attempt of the rows before that one
    /// (the claim is given up, none of them delivered).
    async fn reread_each<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        ids: &[i64],
        now: DateTime<Utc>,
    ) -> Result<(), ClaimFailed> {
        let unnamed = |error: sqlx::Error| ClaimFailed {
            row: None,
            error: error.into(),
        };
        conn.begin(None).await.map_err(unnamed)?;
        let mut named = Ok(());
        for &id in ids {
            let args = Args {
                id,
                now: Some(now),
                group: self.checked.group.as_deref(),
                ..Args::default()
            };
            let columns = self.checked.columns;
            let taken = async {
                let read = fetch_claimed::<DB>(&mut *conn, &self.sql.take, &args, columns).await?;
                if let (false, Some(count)) = (read.is_empty(), &self.sql.count) {
                    execute::<DB>(&mut *conn, count, &args).await?;
                }
                Ok::<_, sqlx::Error>(())
            };
            if let Err(error) = taken.await {
                named = Err(ClaimFailed {
                    row: Some(id),
                    error: error.into(),
                });
                break;
            }
        }
        // A rollback that fails leaves the transaction open: the connection is then closed.
        conn.rollback().await.map_err(unnamed)?;
        named
    }
}
