//! The baseline on PostgreSQL.

use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, PgConnection, Postgres};

use super::{Claimed, Plan, expect, handle, now_and_token, settled, sql};
use crate::drain::Progress;
use crate::grid::Form;
use crate::sql::postgres as text;

pub(crate) async fn worker(
    mut conn: PoolConnection<Postgres>,
    plan: &Plan,
    progress: &Progress,
) -> sqlx::Result<()> {
    match plan.form {
        Form::RowLock => row_lock(&mut conn, plan, progress).await,
        Form::Lease => lease(&mut conn, plan, progress).await,
        Form::Advisory => advisory(&mut conn, plan, progress).await,
    }
}

/// `BEGIN`, claim, handle, `DELETE`, `COMMIT`.
async fn row_lock(conn: &mut PgConnection, plan: &Plan, progress: &Progress) -> sqlx::Result<()> {
    let claim = plan.text(text::row_lock_claim);
    let delete = plan.text(text::delete);
    while !progress.stopped() {
        let mut tx = conn.begin().await?;
        let rows: Vec<Claimed> = sqlx::query_as(sql(&claim))
            .bind(plan.limit())
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            return tx.commit().await;
        }
        let handled = handle(&rows);
        let ids = &handled.ids;
        let deleted = sqlx::query(sql(&delete))
            .bind(ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        expect(deleted, ids, "DELETE")?;
        tx.commit().await?;
        settled(progress, &handled);
    }
    Ok(())
}

/// Claim, handle, `DELETE`.
async fn lease(conn: &mut PgConnection, plan: &Plan, progress: &Progress) -> sqlx::Result<()> {
    let claim = plan.text(text::lease_claim);
    let delete = plan.text(text::lease_delete);
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
        let deleted = sqlx::query(sql(&delete))
            .bind(ids)
            .bind(token)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        expect(deleted, ids, "DELETE")?;
        settled(progress, &handled);
    }
    Ok(())
}

/// Lock, take, handle, `DELETE`, unlock.
async fn advisory(conn: &mut PgConnection, plan: &Plan, progress: &Progress) -> sqlx::Result<()> {
    let lock = plan.text(text::advisory_lock);
    let take = plan.text(text::advisory_take);
    let delete = plan.text(text::delete);
    let unlock = plan.text(|_| text::advisory_unlock());
    while !progress.stopped() {
        let locked: Vec<i64> = sqlx::query_scalar(sql(&lock))
            .bind(plan.key_class)
            .bind(plan.limit())
            .fetch_all(&mut *conn)
            .await?;
        if locked.is_empty() {
            return Ok(());
        }
        let rows: Vec<Claimed> = sqlx::query_as(sql(&take))
            .bind(&locked)
            .fetch_all(&mut *conn)
            .await?;
        let handled = handle(&rows);
        let ids = &handled.ids;
        if !ids.is_empty() {
            let deleted = sqlx::query(sql(&delete))
                .bind(ids)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            expect(deleted, ids, "DELETE")?;
        }
        let released: Option<bool> = sqlx::query_scalar(sql(&unlock))
            .bind(plan.key_class)
            .bind(&locked)
            .fetch_one(&mut *conn)
            .await?;
        if released != Some(true) {
            return Err(sqlx::Error::Protocol(format!(
                "unlock of {locked:?}: a key was not held"
            )));
        }
        settled(progress, &handled);
    }
    Ok(())
}
