//! What the databases' baselines run alike, each on its own statements
//! (`benches/sql/baseline.rs`): the row lock form (PostgreSQL, MySQL/MariaDB), the lease form in
//! two statements (PostgreSQL, SQLite), and the advisory form's settlement (every database).
//! What differs is how a statement takes a list of ids ([`Baseline::on_ids`]).

use chrono::{DateTime, Utc};
use sqlx::{Connection as _, Database, Encode, Executor, FromRow, IntoArguments, Type};

use super::{Baseline, Claimed, Handled, Plan, Text, expect, handle, now_and_token, settled, sql};
use crate::drain::Progress;

/// A baseline worker: its connection, and the drain's plan and progress. Its methods are the
/// loops, and the advisory form's step, that more than one database runs alike.
pub(crate) struct Worker<'a, DB: Database> {
    pub(super) conn: &'a mut DB::Connection,
    pub(super) plan: &'a Plan,
    pub(super) progress: &'a Progress,
}

impl<'a, DB: Database> Worker<'a, DB> {
    pub(super) fn new(
        conn: &'a mut DB::Connection,
        plan: &'a Plan,
        progress: &'a Progress,
    ) -> Self {
        Worker {
            conn,
            plan,
            progress,
        }
    }
}

impl<DB> Worker<'_, DB>
where
    DB: Baseline,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    Claimed: for<'r> FromRow<'r, DB::Row>,
    i64: for<'q> Encode<'q, DB> + Type<DB>,
    DateTime<Utc>: for<'q> Encode<'q, DB> + Type<DB>,
{
    /// Row lock: per batch a transaction, `BEGIN`, claim (`claim`, up to a batch of rows
    /// locked), handle, `DELETE` (`delete`, see [`Baseline::on_ids`]), `COMMIT`. A transaction
    /// the server rolled back runs again whole (MySQL/MariaDB: a deadlock, when the `DELETE`
    /// scans past rows other workers hold).
    pub(super) async fn row_lock(&mut self, claim: &Text, delete: &[Text]) -> sqlx::Result<()> {
        while !self.progress.stopped() {
            let batch = retried!(self.progress, self.row_lock_batch(claim, delete).await)?;
            let Some(handled) = batch else {
                return Ok(());
            };
            settled(self.progress, &handled);
        }
        Ok(())
    }

    /// One transaction of [`Worker::row_lock`]; `None`: nothing left to claim.
    async fn row_lock_batch(
        &mut self,
        claim: &Text,
        delete: &[Text],
    ) -> sqlx::Result<Option<Handled>> {
        let mut tx = self.conn.begin().await?;
        let rows: Vec<Claimed> = sqlx::query_as(sql(claim))
            .bind(self.plan.limit())
            .fetch_all(&mut *tx)
            .await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(None);
        }
        let handled = handle(&rows);
        let deleted = DB::on_ids(delete, &handled.ids).execute(&mut *tx).await?;
        expect(DB::changed(&deleted), &handled.ids, "DELETE")?;
        tx.commit().await?;
        Ok(Some(handled))
    }

    /// Lease in two statements: claim (`claim`: up to a batch of rows free now, leased until
    /// the token, attempt counted), handle, `DELETE` fenced by the token (`delete`, see
    /// [`Baseline::on_ids`]; the token bound last).
    pub(super) async fn lease(&mut self, claim: &Text, delete: &[Text]) -> sqlx::Result<()> {
        while !self.progress.stopped() {
            let (now, token) = now_and_token();
            let rows: Vec<Claimed> = sqlx::query_as(sql(claim))
                .bind(token)
                .bind(now)
                .bind(self.plan.limit())
                .fetch_all(&mut *self.conn)
                .await?;
            if rows.is_empty() {
                return Ok(());
            }
            let handled = handle(&rows);
            let deleted = DB::on_ids(delete, &handled.ids)
                .bind(token)
                .execute(&mut *self.conn)
                .await?;
            expect(DB::changed(&deleted), &handled.ids, "DELETE")?;
            settled(self.progress, &handled);
        }
        Ok(())
    }

    /// The advisory form's settlement of `rows`, its locked rows still there: handled, then
    /// deleted (`delete`, see [`Baseline::on_ids`]); none when each was settled elsewhere
    /// meanwhile.
    pub(super) async fn delete_handled(
        &mut self,
        rows: &[Claimed],
        delete: &[Text],
    ) -> sqlx::Result<Handled> {
        let handled = handle(rows);
        if !handled.ids.is_empty() {
            let deleted = DB::on_ids(delete, &handled.ids)
                .execute(&mut *self.conn)
                .await?;
            expect(DB::changed(&deleted), &handled.ids, "DELETE")?;
        }
        Ok(handled)
    }
}
