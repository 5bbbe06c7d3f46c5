//! Pruning: finished rows and dead rows deleted by age, in bounded batches.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use super::{Inspect, dead_group, query};
use crate::backend::{self, Backend, Clock};
use crate::dialect::{self, Args, Names, PruneSql, Pruned};
use crate::error::{Error, Result};
use crate::table::Table;

/// The largest batch a prune deletes in one statement.
pub(crate) const MAX_PRUNE_BATCH: u32 = 10_000;

impl Table {
    /// Deletes the rows finished more than `older_than` ago on `conn`, `batch` at a time
    /// ([`Queue::prune`](crate::Queue::prune)).
    pub(crate) async fn prune_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64> {
        let names = Names::of_table(DB::DIALECT, self)?;
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let sql = dialect::prune(&names, Pruned::Finished, batch as usize)
            .map_err(|reason| Error::declaration(&self.name, reason))?;
        let Some(before) = cutoff(older_than) else {
            return Ok(0);
        };
        let args = Args {
            at: Some(before),
            ..Args::default()
        };
        in_batches::<DB>(conn, &sql, args, batch).await
    }

    /// Deletes `queue`'s dead rows created more than `older_than` ago on `conn`, in batches
    /// ([`Queue::prune_dead`](crate::Queue::prune_dead)).
    pub(crate) async fn prune_dead_on<DB: Backend>(
        &self,
        conn: &mut DB::Connection,
        queue: Inspect<'_>,
        older_than: Duration,
        batch: u32,
    ) -> Result<u64> {
        let (names, target) = self.resolve::<DB>(conn, queue).await?;
        let Some(target) = target else {
            return Err(Error::declaration(
                queue.group.unwrap_or(&self.name),
                "prune_dead needs the queue's dead letter: `.max_attempts(n).dead_letter(..)`",
            ));
        };
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let sql = dialect::prune(&names, Pruned::Dead(&target), batch as usize)
            .map_err(|reason| Error::declaration(&self.name, reason))?;
        let Some(before) = cutoff(older_than) else {
            return Ok(0);
        };
        let args = Args {
            at: Some(before),
            group: queue.group,
            dead_group: dead_group(queue),
            ..Args::default()
        };
        in_batches::<DB>(conn, &sql, args, batch).await
    }
}

/// `older_than` before now; `None` when that is before any time a row can have.
fn cutoff(older_than: Duration) -> Option<DateTime<Utc>> {
    let ago = TimeDelta::from_std(older_than).ok()?;
    Clock::default().now().checked_sub_signed(ago)
}

/// Runs `sql`'s batches until one deletes fewer than `batch` rows; how many it deleted.
async fn in_batches<DB: Backend>(
    conn: &mut DB::Connection,
    sql: &PruneSql,
    args: Args<'_>,
    batch: u32,
) -> Result<u64> {
    let args = Args {
        limit: i64::from(batch),
        ..args
    };
    let mut deleted = 0;
    loop {
        let n = match sql {
            PruneSql::One(stmt) => DB::execute(conn, query(stmt, &args)).await?,
            PruneSql::SelectThenDelete {
                begin,
                select,
                delete,
            } => {
                let mut tx = sqlx::Connection::begin_with(&mut *conn, *begin).await?;
                let ids = backend::fetch_i64s::<DB>(&mut tx, query(select, &args)).await?;
                if !ids.is_empty() {
                    let args = Args { ids: &ids, ..args };
                    DB::execute(&mut tx, query(delete.for_len(ids.len()), &args)).await?;
                }
                tx.commit().await?;
                ids.len() as u64
            }
        };
        deleted += n;
        if n < u64::from(batch) {
            return Ok(deleted);
        }
    }
}
