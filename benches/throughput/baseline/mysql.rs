//! The baseline on MySQL and MariaDB.

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlQueryResult;
use sqlx::{Connection as _, MySql, MySqlConnection};

use super::shared::Worker;
use super::{Baseline, Claimed, Plan, Text, expect, handle, now_and_token, settled, sql};
use crate::drain::Progress;
use crate::grid::Form;
use crate::sql::mysql as text;

impl Baseline for MySql {
    async fn work(mut worker: Worker<'_, Self>) -> sqlx::Result<()> {
        let plan = worker.plan;
        if plan.form != Form::Advisory {
            sqlx::query(text::SESSION)
                .execute(&mut *worker.conn)
                .await?;
        }
        match plan.form {
            Form::RowLock => {
                let claim = plan.text(text::row_lock_claim);
                worker.row_lock(&claim, &plan.texts(text::delete)).await
            }
            Form::Lease => lease(worker.conn, plan, worker.progress).await,
            Form::Advisory => advisory(&mut worker).await,
        }
    }

    fn changed(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// `BEGIN`, claim, `UPDATE`, `COMMIT`, handle, `DELETE`; the claim's transaction and the
/// `DELETE`, each rolled back by a deadlock, run again.
async fn lease(conn: &mut MySqlConnection, plan: &Plan, progress: &Progress) -> sqlx::Result<()> {
    let claim = plan.text(text::lease_claim);
    let update = plan.texts(text::lease_update);
    let delete = plan.texts(text::lease_delete);
    while !progress.stopped() {
        let (now, token) = now_and_token();
        let rows = retried!(
            progress,
            lease_claim(conn, plan, &claim, &update, now, token).await
        )?;
        if rows.is_empty() {
            return Ok(());
        }
        let handled = handle(&rows);
        let ids = &handled.ids;
        let deleted = retried!(
            progress,
            MySql::on_ids(&delete, ids)
                .bind(token)
                .execute(&mut *conn)
                .await
        )?
        .rows_affected();
        expect(deleted, ids, "DELETE")?;
        settled(progress, &handled);
    }
    Ok(())
}

/// The lease form's claim: `BEGIN`, claim, `UPDATE`, `COMMIT`; no rows: nothing left.
async fn lease_claim(
    conn: &mut MySqlConnection,
    plan: &Plan,
    claim: &Text,
    update: &[Text],
    now: DateTime<Utc>,
    token: DateTime<Utc>,
) -> sqlx::Result<Vec<Claimed>> {
    let mut tx = conn.begin().await?;
    let rows: Vec<Claimed> = sqlx::query_as(sql(claim))
        .bind(now)
        .bind(plan.limit())
        .fetch_all(&mut *tx)
        .await?;
    if !rows.is_empty() {
        let ids: Vec<i64> = rows.iter().map(|row| row.0).collect();
        let leased = bind_ids!(sqlx::query(sql(&update[ids.len() - 1])).bind(token), ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        expect(leased, &ids, "UPDATE")?;
    }
    tx.commit().await?;
    Ok(rows)
}

/// Lock, count, take, handle, `DELETE`, unlock. No retry: each statement is a transaction of
/// its own that locks only rows its worker's named locks hold, or, scanning, rows in id order
/// one at a time, as every other statement of the form does, so no two wait on each other.
async fn advisory(worker: &mut Worker<'_, MySql>) -> sqlx::Result<()> {
    let (plan, progress) = (worker.plan, worker.progress);
    let lock = plan.text(text::advisory_lock);
    let count = plan.texts(text::advisory_count);
    let take = plan.texts(text::advisory_take);
    let delete = plan.texts(text::delete);
    let unlock = plan.texts(|_, n| text::advisory_unlock(n));
    // Enough candidates for a full batch even when every other worker holds one.
    let candidates = (plan.batch * plan.workers) as i64;
    while !progress.stopped() {
        let locked: Vec<i64> = sqlx::query_scalar(sql(&lock))
            .bind(candidates)
            .bind(plan.key_prefix.as_str())
            .bind(plan.limit())
            .fetch_all(&mut *worker.conn)
            .await?;
        if locked.is_empty() {
            return Ok(());
        }
        let n = locked.len();
        bind_ids!(sqlx::query(sql(&count[n - 1])), locked)
            .execute(&mut *worker.conn)
            .await?;
        let rows: Vec<Claimed> = bind_ids!(sqlx::query_as(sql(&take[n - 1])), locked)
            .fetch_all(&mut *worker.conn)
            .await?;
        let handled = worker.delete_handled(&rows, &delete).await?;
        let names = locked.iter().map(|id| format!("{}{id}", plan.key_prefix));
        let released: Option<i64> = names
            .fold(sqlx::query_scalar(sql(&unlock[n - 1])), |q, name| {
                q.bind(name)
            })
            .fetch_one(&mut *worker.conn)
            .await?;
        if released != Some(n as i64) {
            return Err(sqlx::Error::Protocol(format!(
                "unlock of {locked:?}: {released:?} keys released"
            )));
        }
        settled(progress, &handled);
    }
    Ok(())
}
