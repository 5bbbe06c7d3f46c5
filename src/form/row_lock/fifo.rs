//! FIFO on the row lock form: each row a claim takes must hold its group's guard (the group's
//! first unfinished row, locked in the claim's transaction: [`RowLockSql::guard`]). A row whose
//! guard another transaction holds — a row that waited for its `retry_after` while a later row
//! of its group went first, and is due now — is passed over: the claim rolls back and claims
//! again without it, so a guarded group never blocks the others.

use crate::backend::{Backend, ClaimColumns, ClaimedRow, HeldConn};
use crate::dialect::{Args, MAX_EXCLUDED, RowLockSql};
use crate::form::{fetch_claimed, fetch_i64};

/// How many times a claim starts again without the rows whose group was guarded elsewhere.
const AGAIN: usize = 4;

/// `rows`, claimed on `conn` with `args`, once each holds its group's guard: claimed again
/// without those that cannot. With no rows left, the transaction has ended.
pub(super) async fn guarded<DB: Backend>(
    conn: &mut HeldConn<DB>,
    sql: &RowLockSql,
    args: &Args<'_>,
    mut rows: Vec<ClaimedRow>,
    columns: ClaimColumns,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let Some(guard) = &sql.guard else {
        return Ok(rows);
    };
    let mut passed: Vec<i64> = args.excluded.to_vec();
    for again in 0..=AGAIN {
        let mut refused = Vec::new();
        for row in &rows {
            let of_row = Args {
                id: row.id,
                ..Args::default()
            };
            if fetch_i64::<DB>(conn, guard, &of_row).await?.is_none() {
                refused.push(row.id);
            }
        }
        if refused.is_empty() {
            return Ok(rows);
        }
        conn.rollback().await?;
        passed.extend(refused);
        if again == AGAIN || passed.len() > usize::from(MAX_EXCLUDED) {
            break;
        }
        conn.begin(sql.begin).await?;
        let without = Args {
            excluded: &passed,
            ..*args
        };
        rows = fetch_claimed::<DB>(conn, &sql.claim_excluding, &without, columns).await?;
    }
    Ok(Vec::new())
}
