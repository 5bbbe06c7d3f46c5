//! The baseline on SQLite: the lease form as a server-less database runs it, and the advisory
//! form with its keys in the process, as the crate keeps them.

use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection};

use super::{Claimed, Plan, expect, handle, now_and_token, settled, sql};
use crate::drain::Progress;
use crate::grid::Form;
use crate::sql::sqlite as text;

pub(crate) async fn worker(
    mut conn: PoolConnection<Sqlite>,
    plan: &Plan,
    progress: &Progress,
) -> sqlx::Result<()> {
    match plan.form {
        Form::RowLock => unreachable!("SQLite has no row lock"),
        Form::Lease => lease(&mut conn, plan, progress).await,
        Form::Advisory => advisory(&mut conn, plan, progress).await,
    }
}

/// Binds each id, in order.
macro_rules! bind_ids {
    ($query:expr, $ids:expr) => {
        $ids.iter().fold($query, |query, id| query.bind(*id))
    };
}

/// Claim, handle, `DELETE`.
async fn lease(conn: &mut SqliteConnection, plan: &Plan, progress: &Progress) -> sqlx::Result<()> {
    let claim = plan.text(text::lease_claim);
    let delete = plan.texts(text::lease_delete);
    while !progress.stopped() {
        let (now, token) = now_and_token();
        let rows: Vec<Claimed> = sqlx::query_as(sql(&claim))
            .bind(token)
            .bind(now)
            .bind(plan.limit())
            .fetch_all(&mut *conn)
            .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let handled = handle(&rows);
        let ids = &handled.ids;
        let deleted = bind_ids!(sqlx::query(sql(&delete[ids.len() - 1])), ids)
            .bind(token)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        expect(deleted, ids, "DELETE")?;
        settled(progress, &handled);
    }
    Ok(())
}

/// Candidates, keys locked in the process, take, handle, `DELETE`, keys released.
async fn advisory(
    conn: &mut SqliteConnection,
    plan: &Plan,
    progress: &Progress,
) -> sqlx::Result<()> {
    let candidates = plan.text(text::advisory_candidates);
    let take = plan.texts(text::advisory_take);
    let delete = plan.texts(text::delete);
    // Enough candidates for a full batch even when every other worker holds one.
    let listed = (plan.batch * plan.workers) as i64;
    while !progress.stopped() {
        let ids: Vec<i64> = sqlx::query_scalar(sql(&candidates))
            .bind(listed)
            .fetch_all(&mut *conn)
            .await?;
        let locked = {
            let mut held = plan.held.lock().unwrap_or_else(|e| e.into_inner());
            let mut locked = Vec::with_capacity(plan.batch);
            for id in ids {
                if locked.len() == plan.batch {
                    break;
                }
                if held.insert(id) {
                    locked.push(id);
                }
            }
            locked
        };
        if locked.is_empty() {
            return Ok(());
        }
        let rows: Vec<Claimed> = bind_ids!(sqlx::query_as(sql(&take[locked.len() - 1])), locked)
            .fetch_all(&mut *conn)
            .await?;
        let handled = handle(&rows);
        let ids = &handled.ids;
        if !ids.is_empty() {
            let deleted = bind_ids!(sqlx::query(sql(&delete[ids.len() - 1])), ids)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            expect(deleted, ids, "DELETE")?;
        }
        let mut held = plan.held.lock().unwrap_or_else(|e| e.into_inner());
        for id in &locked {
            held.remove(id);
        }
        drop(held);
        settled(progress, &handled);
    }
    Ok(())
}
