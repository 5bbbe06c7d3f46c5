//! The baseline on PostgreSQL.

use sqlx::Postgres;
use sqlx::postgres::{PgArguments, PgQueryResult};
use sqlx::query::Query;

use super::shared::Worker;
use super::{Baseline, Claimed, Text, settled, sql};
use crate::grid::Form;
use crate::sql::postgres as text;

impl Baseline for Postgres {
    async fn work(mut worker: Worker<'_, Self>) -> sqlx::Result<()> {
        let plan = worker.plan;
        match plan.form {
            Form::RowLock => {
                let claim = plan.text(text::row_lock_claim);
                worker.row_lock(&claim, &[plan.text(text::delete)]).await
            }
            Form::Lease => {
                let claim = plan.text(text::lease_claim);
                worker.lease(&claim, &[plan.text(text::lease_delete)]).await
            }
            Form::Advisory => advisory(&mut worker).await,
        }
    }

    fn on_ids(texts: &[Text], ids: &[i64]) -> Query<'static, Self, PgArguments> {
        sqlx::query(sql(&texts[0])).bind(ids)
    }

    fn changed(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// Lock, take, handle, `DELETE`, unlock.
async fn advisory(worker: &mut Worker<'_, Postgres>) -> sqlx::Result<()> {
    let (plan, progress) = (worker.plan, worker.progress);
    let lock = plan.text(text::advisory_lock);
    let take = plan.text(text::advisory_take);
    let delete = [plan.text(text::delete)];
    let unlock = plan.text(|_| text::advisory_unlock());
    while !progress.stopped() {
        let locked: Vec<i64> = sqlx::query_scalar(sql(&lock))
            .bind(plan.key_class)
            .bind(plan.limit())
            .fetch_all(&mut *worker.conn)
            .await?;
        if locked.is_empty() {
            return Ok(());
        }
        let rows: Vec<Claimed> = sqlx::query_as(sql(&take))
            .bind(&locked)
            .fetch_all(&mut *worker.conn)
            .await?;
        let handled = worker.delete_handled(&rows, &delete).await?;
        let released: Option<bool> = sqlx::query_scalar(sql(&unlock))
            .bind(plan.key_class)
            .bind(&locked)
            .fetch_one(&mut *worker.conn)
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
