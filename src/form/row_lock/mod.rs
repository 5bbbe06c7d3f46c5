//! The row lock form: each delivery is claimed in a transaction of its own, on a connection of its
//! own (`SELECT .. FOR UPDATE SKIP LOCKED`; on MySQL/MariaDB at READ COMMITTED), which holds the
//! row while the handler runs; the settlement runs in that transaction, and its commit is the
//! settlement. A transactional handler writes in a savepoint of it. On PostgreSQL a full batch's
//! settlement carries the next batch's claim in its round trip (`together.rs`).

use super::{
    Checked, ClaimFailed, Conns, Form, Held, Returned, Settled, SettledAndClaimed, fetch_claimed,
    fetch_i64, on_conn,
};
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::config::QueueConfig;
use crate::delivery::Outcome;
use crate::dialect::{self, Args, RowLockSql};
use crate::error::{Error, Result};
use crate::table::Dialect;

mod fifo;
mod settle;
mod together;

/// The row lock form of one mounted queue.
#[derive(Debug)]
pub(crate) struct RowLockForm {
    sql: RowLockSql,
    checked: Checked,
}

impl<DB: Backend> Form<DB> for RowLockForm {
    type Hold = Held<DB>;
    type Batch = HeldConn<DB>;
    const ONE_CLAIM: bool = false;
    const CLAIMS_WITH_SETTLEMENT: bool = matches!(DB::DIALECT, Dialect::Postgres);

    async fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> Result<Self> {
        let mut sql = dialect::row_lock(&checked.names);
        if config.transactional {
            // The handler's transaction is the claim's: it begins at the queue's isolation.
            sql.begin = dialect::begin_delivery(
                DB::DIALECT,
                config.isolation,
                config.sqlite_mode,
                checked.server.checks_connection,
            );
        }
        let mut statements = vec![&sql.claim, &sql.claim_excluding, &sql.next, &sql.finish];
        statements.extend(&sql.guard);
        statements.extend(sql.retry.iter().chain(&sql.retry_after));
        statements.extend(sql.finish_many.iter());
        statements.extend(sql.retry_many.iter().flatten());
        super::schema::prepare_all::<DB>(conn, config, &statements).await?;
        Ok(RowLockForm { sql, checked })
    }

    async fn claim(
        &self,
        conns: &Conns<DB>,
        _: usize,
        _: (usize, usize),
        excluded: &(dyn Fn() -> Vec<i64> + Sync),
    ) -> Result<Vec<(ClaimedRow, Held<DB>)>, ClaimFailed> {
        let (mut rows, conn) = self.claim_rows::<DB>(conns, 1, &excluded()).await?;
        Ok(match rows.pop() {
            Some(row) => {
                let session = row.session;
                vec![(row, Held::new(conn, session))]
            }
            None => {
                conns.put_held(conn);
                Vec::new()
            }
        })
    }

    async fn claim_batch(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), ClaimFailed> {
        Ok(self.claim_rows::<DB>(conns, size, excluded).await?)
    }

    async fn next(&self, conns: &Conns<DB>, excluded: &[i64]) -> Result<Option<i64>, sqlx::Error> {
        let args = Args {
            now: Some(self.checked.clock.now()),
            group: self.checked.group.as_deref(),
            excluded,
            ..Args::default()
        };
        on_conn(conns, async |conn| {
            fetch_i64::<DB>(conn, &self.sql.next, &args).await
        })
        .await
    }

    async fn session_lost(&self, id: i64, hold: &mut Held<DB>) -> bool {
        hold.lost(id).await
    }

    async fn lend(&self, _: &Conns<DB>, hold: &mut Held<DB>) -> Result<HeldConn<DB>> {
        // A savepoint in the claim's transaction.
        hold.lend(None, &self.checked.queue).await
    }

    async fn take_back(
        &self,
        _: &Conns<DB>,
        hold: &mut Held<DB>,
        mut conn: HeldConn<DB>,
        ack: bool,
    ) -> Result<Option<HeldConn<DB>>, sqlx::Error> {
        // An ack releases the savepoint into the claim's transaction, which commits with the
        // settlement (where the table records cancel requests, the settlement releases it, once
        // it found none: `settle_on`); any other outcome rolls back to it.
        if !ack {
            conn.rollback().await?;
        } else if self.checked.requests.is_none() {
            conn.commit().await?;
        }
        hold.conn = Some(conn);
        Ok(None)
    }

    async fn read_row(
        &self,
        _: &Conns<DB>,
        hold: &mut Held<DB>,
        tx: Option<&mut HeldConn<DB>>,
        id: i64,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        hold.read_row(tx, &self.checked.row, id).await
    }

    async fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Held<DB>,
        outcome: Outcome,
        _: Option<HeldConn<DB>>,
    ) -> Result<Settled> {
        let mut conn = hold.into_conn(&self.checked.queue, id)?;
        let settled = self.settle_on::<DB>(&mut conn, id, outcome).await;
        // Dropped unsettled if the transaction is still open: the server rolls it back.
        conns.put_held(conn);
        settled
    }

    async fn settle_batch(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        mut conn: HeldConn<DB>,
        one_by_one: bool,
    ) -> Result<Vec<Result<()>>, (Option<i64>, Error)> {
        let applied = if one_by_one {
            self.apply_each::<DB>(&mut conn, settlements).await
        } else {
            self.apply_sets::<DB>(&mut conn, settlements).await
        };
        let failed = match applied {
            Ok(()) => conn
                .commit()
                .await
                .err()
                .map(|error| (None, Error::from(error))),
            Err(failed) => {
                // Dropped unsettled if the rollback fails: the server rolls back.
                let _ = conn.rollback().await;
                Some(failed)
            }
        };
        conns.put_held(conn);
        match failed {
            None => Ok(settlements.iter().map(|_| Ok(())).collect()),
            Some((row, error)) => Err((row, self.rolled_back(settlements.len(), error))),
        }
    }

    async fn settle_batch_and_claim(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        batch: HeldConn<DB>,
        one_by_one: bool,
        next: usize,
    ) -> SettledAndClaimed<DB, Self> {
        match self
            .settle_and_claim::<DB>(conns, settlements, batch, next)
            .await
        {
            Ok(together) => together,
            Err(batch) => {
                let settled =
                    <Self as Form<DB>>::settle_batch(self, conns, settlements, batch, one_by_one)
                        .await;
                (settled, None)
            }
        }
    }

    async fn release(&self, conns: &Conns<DB>, id: i64, hold: Held<DB>) -> bool {
        // A connection still lent is closed by whoever holds it: the server rolls back.
        let Some(conn) = hold.conn else { return true };
        rollback(conns, id, conn).await
    }

    async fn release_batch(&self, conns: &Conns<DB>, ids: &[i64], conn: HeldConn<DB>) -> u64 {
        if ids.is_empty() {
            // A claim that found nothing: its transaction ended already.
            conns.put_held(conn);
            return 0;
        }
        let rows = ids.len() as u64;
        if rollback(conns, ids.first().copied().unwrap_or(0), conn).await {
            rows
        } else {
            0
        }
    }

    async fn abandon(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Held<DB>,
        _: Option<Held<DB>>,
    ) -> Returned {
        hold.abandon(conns, async |conn| rollback(conns, id, conn).await)
            .await
    }
}

/// Rolls the claim's transaction back: the row returns as it was. Whether the rollback was
/// confirmed (else the connection is closed, and the server rolls back).
async fn rollback<DB: Backend>(conns: &Conns<DB>, id: i64, mut conn: HeldConn<DB>) -> bool {
    match conn.rollback().await {
        Ok(()) => {
            conns.put_held(conn);
            true
        }
        Err(error) => {
            tracing::warn!(%error, id, "could not roll back a claim; its connection is closed");
            false
        }
    }
}

impl RowLockForm {
    /// Settles row `id` by `outcome` in the claim's transaction on `conn`, and commits it. A
    /// transactional ack's savepoint is still open where the table records cancel requests:
    /// the row's request is reserved in it first, and a request found there rolls it back and
    /// removes the row instead (`form::requests`); so does one found by a plain delivery's
    /// settlement that would leave the row.
    async fn settle_on<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        id: i64,
        outcome: Outcome,
    ) -> Result<Settled> {
        let kept = conn.depth() > 1;
        let reserved = match &self.checked.requests {
            Some(requests) if kept || !self.checked.finishes(outcome) => {
                if requests.cancelled::<DB>(conn, id).await? {
                    if kept {
                        conn.rollback().await?;
                    }
                    self.apply::<DB>(conn, id, Outcome::drop()).await?;
                    conn.commit().await?;
                    return Ok(Settled::Cancelled);
                }
                Some(requests)
            }
            _ => None,
        };
        if kept {
            conn.commit().await?;
        }
        if self.apply::<DB>(conn, id, outcome).await? {
            if let Some(requests) = reserved {
                requests.release::<DB>(conn, id).await?;
            }
            conn.commit().await?;
        } else {
            // A retry without an attempt column leaves the row as it was (its reservation too).
            conn.rollback().await?;
        }
        Ok(Settled::AsAsked)
    }

    /// Claims up to `limit` rows in one transaction on one connection, which then holds them.
    async fn claim_rows<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        limit: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), sqlx::Error> {
        let checked = &self.checked;
        let mut conn = HeldConn::new(conns.get().await?);
        conn.begin(self.sql.begin).await?;
        let args = self.claim_args(limit, excluded);
        let claim = match excluded {
            [] => &self.sql.claim,
            _ => &self.sql.claim_excluding,
        };
        let rows = fetch_claimed::<DB>(&mut conn, claim, &args, checked.columns).await?;
        let rows = self.claimed::<DB>(&mut conn, &args, rows).await?;
        Ok((rows, conn))
    }

    /// The values of a claim of up to `limit` rows passing over `excluded`, from the claims'
    /// floor now.
    fn claim_args<'a>(&'a self, limit: usize, excluded: &'a [i64]) -> Args<'a> {
        let checked = &self.checked;
        Args {
            now: Some(checked.clock.now()),
            group: checked.group.as_deref(),
            limit: i64::try_from(limit).unwrap_or(i64::MAX),
            floor: checked.floor.start(),
            excluded,
            ..Args::default()
        }
    }

    /// `rows`, claimed on `conn` with `args` (a floor, a limit): the claims' floor told, the
    /// rows whose FIFO group is guarded elsewhere passed over, sorted by id; with none left,
    /// the transaction ended.
    async fn claimed<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        args: &Args<'_>,
        rows: Vec<ClaimedRow>,
    ) -> Result<Vec<ClaimedRow>, sqlx::Error> {
        let checked = &self.checked;
        let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
        checked
            .floor
            .claimed(args.floor, limit, rows.iter().map(|row| row.id));
        let mut rows = fifo::guarded::<DB>(conn, &self.sql, args, rows, checked.columns).await?;
        if rows.is_empty() && conn.depth() > 0 {
            conn.rollback().await?;
        }
        rows.sort_unstable_by_key(|row| row.id);
        Ok(rows)
    }

    /// The error of a batch whose transaction rolled back.
    fn rolled_back(&self, rows: usize, error: Error) -> Error {
        Error::BatchRolledBack {
            queue: self.checked.queue.to_string(),
            rows,
            source: Box::new(error),
        }
    }
}
