//! The lease form's claim: one committed step that takes a row for every free worker and writes
//! their token, apart from the form's trait impl as the one statement family that differs most
//! between databases (one `UPDATE .. RETURNING`, or MySQL/MariaDB's select then update).

use tokio::time::Instant;

use super::{LeaseForm, Token};
use crate::backend::{Backend, ClaimedRow, is_row_error};
use crate::dialect::{self, Args, Claim};
use crate::form::{Conns, execute, fetch_claimed, in_transaction};

/// What a claim's statement took, before it committed.
pub(super) struct ClaimedRows {
    rows: Vec<ClaimedRow>,
    hold: Token,
    /// The floor it read from, and the rows it asked for ([`Floor::claimed`]).
    ///
    /// [`Floor::claimed`]: crate::form::floor::Floor::claimed
    floor: Option<i64>,
    asked: usize,
}

impl LeaseForm {
    /// Claims up to `limit` rows in one committed step, counting their attempt, passing over
    /// the `excluded` ids: the rows, in id order, and the token they all carry.
    pub(super) async fn claim_rows<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        limit: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, Token), sqlx::Error> {
        let mut conn = conns.get().await?;
        let claimed = self.claim_rows_on::<DB>(&mut conn, limit, excluded).await;
        let claimed = conns.checked(claimed)?;
        conns.put(conn);
        Ok(self.committed(claimed))
    }

    /// [`claim_rows`](Self::claim_rows)'s statement on `conn` (in a transaction of the
    /// caller's, where it settles a batch and claims the next together), which hands what it
    /// claimed to [`committed`](Self::committed) once that committed.
    pub(super) async fn claim_rows_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        limit: usize,
        excluded: &[i64],
    ) -> Result<ClaimedRows, sqlx::Error> {
        let checked = &self.checked;
        // The token is taken once the connection is: a wait for it does not shorten the lease.
        let hold = Token {
            token: checked.clock.after(self.duration),
            taken: Instant::now(),
        };
        let asked = limit.min(self.max_claim);
        let floor = checked.floor.start();
        let args = Args {
            now: Some(checked.clock.now()),
            new_token: Some(hold.token),
            group: checked.group.as_deref(),
            limit: i64::try_from(asked).unwrap_or(i64::MAX),
            floor,
            excluded,
            ..Args::default()
        };
        let claim = match excluded {
            [] => &self.sql.claim,
            _ => &self.sql.claim_excluding,
        };
        let mut rows = match claim {
            Claim::Returning(stmt) => fetch_claimed::<DB>(conn, stmt, &args, checked.columns).await,
            Claim::SelectThenUpdate { select, updates } => {
                let begin = dialect::mysql_begin();
                in_transaction::<DB, _>(conn, begin, async |tx| {
                    let rows = fetch_claimed::<DB>(tx, select, &args, checked.columns).await?;
                    if !rows.is_empty() {
                        let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
                        let args = Args { ids: &ids, ..args };
                        execute::<DB>(tx, updates.for_len(ids.len()), &args).await?;
                    }
                    Ok(rows)
                })
                .await
            }
        }?;
        rows.sort_unstable_by_key(|row| row.id);
        Ok(ClaimedRows {
            rows,
            hold,
            floor,
            asked,
        })
    }

    /// The rows of a claim that committed, and their token; the claims' floor moves past them
    /// (not before the commit: rows of a claim rolled back are claimable again).
    pub(super) fn committed(&self, claimed: ClaimedRows) -> (Vec<ClaimedRow>, Token) {
        let ClaimedRows {
            rows,
            hold,
            floor,
            asked,
        } = claimed;
        let ids = rows.iter().map(|row| row.id);
        self.checked.floor.claimed(floor, asked, ids);
        (rows, hold)
    }

    /// Claims up to `want` rows: the rows, and the token each carries (one claim's rows carry
    /// one). A claim of many rows that one row's own failure fails (a constraint refusing its
    /// attempt count) names no row, and the first row in claim order, which the runner would
    /// hold back, may be innocent: the rows are then claimed one at a time, so those ahead of
    /// the failing row are delivered, and the next claim, failing on its first row, names the
    /// right one.
    pub(super) async fn claim_each<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        want: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, Vec<Token>), sqlx::Error> {
        match self.claim_rows::<DB>(conns, want, excluded).await {
            Ok((rows, token)) => {
                let tokens = vec![token; rows.len()];
                Ok((rows, tokens))
            }
            Err(error) if want > 1 && is_row_error(&error) => {
                self.claim_one_by_one::<DB>(conns, want, excluded).await
            }
            Err(error) => Err(error),
        }
    }

    /// After a claim of many rows failed on one row's own error: up to `want` rows claimed
    /// one at a time, until a claim fails or finds none.
    async fn claim_one_by_one<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        want: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, Vec<Token>), sqlx::Error> {
        let (mut claimed, mut tokens) = (Vec::new(), Vec::new());
        while claimed.len() < want {
            match self.claim_rows::<DB>(conns, 1, excluded).await {
                Ok((rows, token)) if !rows.is_empty() => {
                    tokens.extend(rows.iter().map(|_| token));
                    claimed.extend(rows);
                }
                Ok(_) => break,
                Err(error) if claimed.is_empty() => return Err(error),
                Err(_) => break,
            }
        }
        Ok((claimed, tokens))
    }
}
