//! The lease form: the claim writes a token (the lease's expiry) into the lease column and
//! commits at once; every later statement on the row is guarded by that token, and a statement
//! that finds another token changes nothing ([`Error::LeaseLost`]).
//!
//! A claim takes a row for every free worker in one statement (PostgreSQL: `UPDATE` over a
//! `FOR UPDATE SKIP LOCKED` selection; MySQL/MariaDB: a locking `SELECT` and an `UPDATE` of the
//! ids in one READ COMMITTED transaction; SQLite: one `UPDATE .. RETURNING`). Acks and drops of
//! many deliveries settle in one statement, each row still guarded by its own token.
//!
//! The form's type and its [`Form`] impl are here; the claim (`claim`) and the settlement
//! statements (`settle`) are beside it.

mod claim;
mod settle;
mod together;

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

use super::{
    Checked, ClaimFailed, Conns, Form, GRACE, Returned, Settled, SettledAndClaimed, execute,
    fetch_i64, fetch_row, on_conn, settlement_args,
};
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::config::{FormKind, QueueConfig};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{self, Args, Dialect, LeaseSql, MAX_FINISH};
use crate::error::{Error, Result};

/// What holds a leased row: its token (the lease's expiry), and when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    pub(crate) token: DateTime<Utc>,
    taken: Instant,
}

/// The lease form of one mounted queue.
#[derive(Debug)]
pub(crate) struct LeaseForm {
    sql: LeaseSql,
    /// The most rows one claim takes (the MySQL claim's updates are rendered up to it).
    max_claim: usize,
    duration: Duration,
    checked: Checked,
    /// What opens the transaction a custom settlement runs in.
    begin_write: Option<&'static str>,
    /// What opens a transactional delivery's own transaction.
    begin_delivery: Option<&'static str>,
}

/// The most rows one claim takes.
pub(crate) const MAX_CLAIM: usize = 1000;

impl<DB: Backend> Form<DB> for LeaseForm {
    const CLAIMS_WITH_SETTLEMENT: bool = matches!(DB::DIALECT, Dialect::Sqlite);
    type Hold = Token;
    type Batch = Vec<Token>;
    const ONE_CLAIM: bool = true;
    const GROUPS_ACKS: bool = true;

    async fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> Result<Self> {
        // `launch` prepares this form for lease queues only, whose names carry the lease column.
        let (FormKind::Lease { duration, .. }, Some(lease)) =
            (&config.form, checked.names.lease.as_deref())
        else {
            return Err(Error::declaration(
                config.label(),
                "the lease form needs a lease column: `.lease(..)`",
            ));
        };
        let duration = *duration;
        let max_claim = config.max_claim().min(MAX_CLAIM);
        let sql = dialect::lease(&checked.names, lease, max_claim);
        super::schema::prepare_all::<DB>(conn, config, &sql.statements()).await?;
        Ok(LeaseForm {
            max_claim,
            duration,
            begin_write: dialect::begin_write(DB::DIALECT),
            begin_delivery: dialect::begin_delivery(
                DB::DIALECT,
                config.isolation,
                config.sqlite_mode,
                checked.server.checks_connection,
            ),
            sql,
            checked,
        })
    }

    async fn claim(
        &self,
        conns: &Conns<DB>,
        want: usize,
        _: (usize, usize),
        excluded: &(dyn Fn() -> Vec<i64> + Sync),
    ) -> Result<Vec<(ClaimedRow, Token)>, ClaimFailed> {
        let (rows, tokens) = self.claim_each::<DB>(conns, want, &excluded()).await?;
        Ok(rows.into_iter().zip(tokens).collect())
    }

    async fn claim_batch(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, Vec<Token>), ClaimFailed> {
        Ok(self.claim_each::<DB>(conns, size, excluded).await?)
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

    fn extend_every(&self, hold: &Token) -> Option<(Duration, Instant)> {
        Some((self.duration / 2, hold.taken))
    }

    fn extension(&self, _: &Token) -> Option<Token> {
        Some(Token {
            token: self.checked.clock.after(self.duration),
            taken: Instant::now(),
        })
    }

    async fn extend(
        &self,
        conns: &Conns<DB>,
        id: i64,
        from: &Token,
        to: &Token,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            id,
            token: Some(from.token),
            new_token: Some(to.token),
            ..Args::default()
        };
        let changed = on_conn(conns, async |conn| {
            execute::<DB>(conn, &self.sql.extend, &args).await
        })
        .await?;
        Ok(changed == 1)
    }

    fn extend_batch_every(&self, tokens: &Vec<Token>) -> Option<(Duration, Instant)> {
        let taken = tokens.first()?.taken;
        Some((self.duration / 2, taken))
    }

    async fn extend_batch(
        &self,
        conns: &Conns<DB>,
        ids: &[i64],
        tokens: &mut Vec<Token>,
    ) -> Vec<i64> {
        let mut lost = Vec::new();
        for (id, token) in ids.iter().zip(tokens.iter_mut()) {
            let to = Token {
                token: self.checked.clock.after(self.duration),
                taken: Instant::now(),
            };
            match <Self as Form<DB>>::extend(self, conns, *id, token, &to).await {
                Ok(true) => *token = to,
                Ok(false) => lost.push(*id),
                Err(error) => tracing::warn!(id, %error, "lease extension failed"),
            }
        }
        lost
    }

    async fn lend(&self, conns: &Conns<DB>, _: &mut Token) -> Result<HeldConn<DB>> {
        let mut conn = HeldConn::new(conns.get().await?);
        conn.begin(self.begin_delivery).await?;
        conn.lend();
        Ok(conn)
    }

    async fn take_back(
        &self,
        conns: &Conns<DB>,
        _: &mut Token,
        mut conn: HeldConn<DB>,
        ack: bool,
    ) -> Result<Option<HeldConn<DB>>, sqlx::Error> {
        if ack {
            // Committed with the ack's settlement, guarded by the token.
            return Ok(Some(conn));
        }
        conn.rollback().await?;
        conns.put_held(conn);
        Ok(None)
    }

    async fn read_row(
        &self,
        conns: &Conns<DB>,
        _: &mut Token,
        tx: Option<&mut HeldConn<DB>>,
        id: i64,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        let stmt = &self.checked.row;
        match tx {
            Some(tx) => fetch_row::<DB>(tx, stmt, id).await,
            None => on_conn(conns, async |conn| fetch_row::<DB>(conn, stmt, id).await).await,
        }
    }

    async fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Token,
        outcome: Outcome,
        tx: Option<HeldConn<DB>>,
    ) -> Result<Settled> {
        let args = Args {
            token: Some(hold.token),
            ..settlement_args(&self.checked, id, outcome)
        };
        let mut conn = match tx {
            Some(tx) => tx,
            None => HeldConn::new(conns.get().await?),
        };
        let settled = match (
            self.checked.custom.get(outcome.0),
            &self.checked.dead,
            outcome.0,
        ) {
            (Some(custom), _, _) => {
                // The lease first: confirmed and locked in the transaction the custom SQL runs in.
                if conn.depth() == 0 {
                    conn.begin(self.begin_write).await?;
                }
                let held = fetch_i64::<DB>(&mut conn, &self.sql.confirm, &args)
                    .await?
                    .is_some();
                if held {
                    execute::<DB>(&mut conn, custom, &args).await?;
                }
                held
            }
            (None, Some(dead), Settle::DeadLetter) => dead.run(&mut conn, &args).await?,
            (None, _, settle) => {
                execute::<DB>(&mut conn, self.statement(settle, id), &args).await? > 0
            }
        };
        if conn.depth() > 0 {
            if settled {
                conn.commit().await?;
            } else {
                conn.rollback().await?;
            }
        }
        conns.put_held(conn);
        if settled {
            Ok(Settled::AsAsked)
        } else {
            Err(self.lost(id))
        }
    }

    async fn settle_many(
        &self,
        conns: &Conns<DB>,
        rows: Vec<(i64, Token, Outcome)>,
    ) -> Vec<Result<()>> {
        // Acks and drops without a statement of the service's own in one statement each 64
        // rows, each guarded by its own token; the rest row by row.
        let grouped = |outcome: Outcome| self.grouped(outcome);
        // Per row, once its group's statement answered: whether it still carried its token.
        let mut grouped_settled: Vec<Option<bool>> = vec![None; rows.len()];
        let chunk = rows.len().min(MAX_FINISH);
        let (mut at, mut ids, mut tokens) = (
            Vec::with_capacity(chunk),
            Vec::with_capacity(chunk),
            Vec::with_capacity(chunk),
        );
        let mut next = 0;
        loop {
            at.clear();
            ids.clear();
            tokens.clear();
            while next < rows.len() && at.len() < MAX_FINISH {
                let (id, hold, outcome) = &rows[next];
                if grouped(*outcome) {
                    at.push(next);
                    ids.push(*id);
                    tokens.push(hold.token);
                }
                next += 1;
            }
            if at.is_empty() {
                break;
            }
            match self.finish_many::<DB>(conns, &ids, &tokens).await {
                Ok(settled) => {
                    for (&i, settled) in at.iter().zip(settled) {
                        grouped_settled[i] = Some(settled);
                    }
                }
                Err(error) => {
                    // Each row again on its own, so each gets its own answer.
                    tracing::warn!(%error, rows = ids.len(), "grouped acknowledgement failed");
                }
            }
        }
        let mut settled = Vec::with_capacity(rows.len());
        for ((id, hold, outcome), grouped) in rows.into_iter().zip(grouped_settled) {
            settled.push(match grouped {
                Some(true) => Ok(()),
                Some(false) => Err(self.lost(id)),
                None => <Self as Form<DB>>::settle(self, conns, id, hold, outcome, None)
                    .await
                    .map(drop),
            });
        }
        settled
    }

    async fn settle_batch(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        tokens: Vec<Token>,
        _: bool,
    ) -> Result<Vec<Result<()>>, (Option<i64>, Error)> {
        let rows = settlements
            .iter()
            .zip(tokens)
            .map(|(&(id, outcome), token)| (id, token, outcome))
            .collect();
        Ok(<Self as Form<DB>>::settle_many(self, conns, rows).await)
    }

    async fn settle_batch_and_claim(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        tokens: Vec<Token>,
        one_by_one: bool,
        next: usize,
    ) -> SettledAndClaimed<DB, Self> {
        match self
            .settle_and_claim::<DB>(conns, settlements, tokens, next)
            .await
        {
            Ok((settled, claimed)) => (Ok(settled), Some(claimed)),
            Err(tokens) => {
                let settled =
                    <Self as Form<DB>>::settle_batch(self, conns, settlements, tokens, one_by_one)
                        .await;
                (settled, None)
            }
        }
    }

    async fn release(&self, conns: &Conns<DB>, id: i64, hold: Token) -> bool {
        self.release_either::<DB>(conns, id, hold, None)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, id, "could not release a row; it is released when its \
                    lease expires");
                false
            })
    }

    async fn release_unstarted(
        &self,
        conns: &Conns<DB>,
        id: i64,
        attempt: Option<i64>,
        hold: Token,
    ) -> bool {
        let (Some(stmt), Some(attempt)) = (&self.sql.release_unstarted, attempt) else {
            return <Self as Form<DB>>::release(self, conns, id, hold).await;
        };
        let args = Args {
            id,
            token: Some(hold.token),
            attempt,
            ..Args::default()
        };
        let released = on_conn(conns, async |conn| execute::<DB>(conn, stmt, &args).await).await;
        released.map_or_else(
            |error| {
                tracing::warn!(%error, id, "could not release a row; it is released when its \
                    lease expires");
                false
            },
            |changed| changed == 1,
        )
    }

    async fn release_batch(&self, conns: &Conns<DB>, ids: &[i64], tokens: Vec<Token>) -> u64 {
        let mut released = 0;
        for (&id, token) in ids.iter().zip(tokens) {
            if <Self as Form<DB>>::release(self, conns, id, token).await {
                released += 1;
            }
        }
        released
    }

    fn keep(&self, hold: &Token) -> Option<Token> {
        Some(*hold)
    }

    async fn hold_for(&self, conns: &Conns<DB>, id: i64, hold: Token, delay: Duration) {
        let until = Token {
            token: self.checked.clock.after(delay),
            taken: Instant::now(),
        };
        if let Err(error) = <Self as Form<DB>>::extend(self, conns, id, &hold, &until).await {
            tracing::warn!(%error, "could not keep the lease for the delay");
        }
    }

    async fn abandon(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Token,
        extending: Option<Token>,
    ) -> Returned {
        let release = self.release_either::<DB>(conns, id, hold, extending);
        match tokio::time::timeout(GRACE, release).await {
            Ok(Ok(true)) => Returned::Released,
            Ok(Ok(false)) => Returned::NotHeld,
            Ok(Err(_)) | Err(_) => Returned::Unconfirmed,
        }
    }
}
