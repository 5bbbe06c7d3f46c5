//! The baseline on SQLite: the lease form as a server-less database runs it, and the advisory
//! form with its keys in the process, as the crate keeps them.

use sqlx::Sqlite;
use sqlx::sqlite::SqliteQueryResult;

use super::shared::Worker;
use super::{Baseline, Claimed, settled, sql};
use crate::grid::Form;
use crate::sql::sqlite as text;

impl Baseline for Sqlite {
    async fn work(mut worker: Worker<'_, Self>) -> sqlx::Result<()> {
        let plan = worker.plan;
        match plan.form {
            Form::RowLock => unreachable!("SQLite has no row lock"),
            Form::Lease => {
                let claim = plan.text(text::lease_claim);
                worker.lease(&claim, &plan.texts(text::lease_delete)).await
            }
            Form::Advisory => advisory(&mut worker).await,
        }
    }

    fn changed(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// Candidates, keys locked in the process, take, handle, `DELETE`, keys released.
async fn advisory(worker: &mut Worker<'_, Sqlite>) -> sqlx::Result<()> {
    let (plan, progress) = (worker.plan, worker.progress);
    let candidates = plan.text(text::advisory_candidates);
    let take = plan.texts(text::advisory_take);
    let delete = plan.texts(text::delete);
    // Enough candidates for a full batch even when every other worker holds one.
    let listed = (plan.batch * plan.workers) as i64;
    while !progress.stopped() {
        let ids: Vec<i64> = sqlx::query_scalar(sql(&candidates))
            .bind(listed)
            .fetch_all(&mut *worker.conn)
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
            .fetch_all(&mut *worker.conn)
            .await?;
        let handled = worker.delete_handled(&rows, &delete).await?;
        let mut held = plan.held.lock().unwrap_or_else(|e| e.into_inner());
        for id in &locked {
            held.remove(id);
        }
        drop(held);
        settled(progress, &handled);
    }
    Ok(())
}
