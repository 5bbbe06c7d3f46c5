//! The claim forms: how a row is claimed, held and settled, on a connection of the pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, NaiveDate, SubsecRound, TimeDelta, Utc};

pub(crate) mod advisory;
pub(crate) mod held;
pub(crate) mod lease;
pub(crate) mod row_lock;

use crate::backend::{Backend, ClaimedRow, query};
use crate::delivery::{Outcome, Settle};
use crate::dialect::{Args, DeadSql, Stmt};
use crate::error::Result;
use crate::queue::Event;
use held::{Conns, HeldConn};

/// The claim form of a started queue, with its rendered statements.
#[derive(Debug)]
pub(crate) enum FormRuntime {
    Lease(lease::LeaseForm),
    RowLock(row_lock::RowLockForm),
    Advisory(advisory::AdvisoryForm),
}

/// A queue's dead letter, rendered for its form.
#[derive(Debug)]
pub(crate) struct Dead {
    pub(crate) sql: DeadSql,
    /// The dead-letter group, for a group dead letter.
    pub(crate) group: Option<Arc<str>>,
}

impl Dead {
    /// Moves the row `args` names on `conn`: whether it was moved (a lease form's move finds no
    /// row when the lease was lost). A copy-then-delete runs in the transaction `conn` is in, or
    /// in one of its own, committed only when the delete removed the row.
    pub(crate) async fn run<DB: Backend>(
        &self,
        conn: &mut HeldConn<DB>,
        args: &Args<'_>,
    ) -> Result<bool, sqlx::Error> {
        let args = Args {
            dead_group: self.group.as_deref(),
            ..*args
        };
        match &self.sql {
            DeadSql::One(stmt) => Ok(DB::execute(conn, query(stmt, &args)).await? > 0),
            DeadSql::CopyDelete { copy, delete } => {
                let own = conn.depth() == 0;
                if own {
                    conn.begin(None).await?;
                }
                DB::execute(conn, query(copy, &args)).await?;
                let moved = DB::execute(conn, query(delete, &args)).await? > 0;
                if own {
                    if moved {
                        conn.commit().await?;
                    } else {
                        conn.rollback().await?;
                    }
                }
                Ok(moved)
            }
        }
    }
}

/// A queue's own settlement statements ([`Queue::custom`](crate::Queue::custom)).
#[derive(Debug, Default)]
pub(crate) struct Custom(Vec<(Event, Stmt)>);

impl Custom {
    pub(crate) fn new(statements: Vec<(Event, Stmt)>) -> Self {
        Custom(statements)
    }

    /// The statement that replaces the crate's for `settle`, if the queue has one.
    pub(crate) fn get(&self, settle: Settle) -> Option<&Stmt> {
        let event = match settle {
            Settle::Ack => Event::Ack,
            Settle::Drop | Settle::Undecodable => Event::Drop,
            Settle::Retry => Event::Retry,
            Settle::RetryAfter(_) => Event::RetryAfter,
            Settle::DeadLetter => Event::DeadLetter,
        };
        self.0
            .iter()
            .find_map(|(e, stmt)| (*e == event).then_some(stmt))
    }

    pub(crate) fn statements(&self) -> impl Iterator<Item = &Stmt> {
        self.0.iter().map(|(_, stmt)| stmt)
    }
}

/// Logs that a row asked to be dead-lettered on a queue without a dead letter: it is dropped.
pub(crate) fn no_dead_letter(table: &str, id: i64) {
    tracing::error!(
        "row {id} of `{table}` was settled with dead_letter() but its queue has no dead letter: \
         dropped"
    );
}

/// What holds a claimed row until its delivery is settled.
#[derive(Debug)]
pub(crate) enum Hold<DB: Backend> {
    /// The lease token (the lease form), and when it was taken.
    Lease(DateTime<Utc>, tokio::time::Instant),
    /// The connection holding the claim's transaction (row lock) or the row's key (advisory).
    Conn(HeldConn<DB>),
    /// That connection, lent to a transactional handler for now.
    Lent,
}

/// A claim that failed, and the row it failed on where the form knows it (an advisory take).
#[derive(Debug)]
pub(crate) struct ClaimFailed {
    pub(crate) row: Option<i64>,
    pub(crate) error: sqlx::Error,
}

impl From<sqlx::Error> for ClaimFailed {
    fn from(error: sqlx::Error) -> Self {
        ClaimFailed { row: None, error }
    }
}

impl FormRuntime {
    /// Claims up to `want` rows for the lease form's workers, in one statement (the forms that
    /// hold a connection per delivery claim per worker: [`FormRuntime::claim_one`]), passing
    /// over the `excluded` ids.
    pub(crate) async fn claim<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        want: usize,
        excluded: &[i64],
    ) -> Result<Vec<(ClaimedRow, Hold<DB>)>, ClaimFailed> {
        let FormRuntime::Lease(lease) = self else {
            unreachable!("row lock and advisory workers claim one row each");
        };
        let claimed = lease.claim(conns, want, excluded).await?;
        let (token, taken) = (claimed.token, claimed.taken);
        Ok(claimed
            .rows
            .into_iter()
            .map(|row| (row, Hold::Lease(token, taken)))
            .collect())
    }

    /// Claims one row for worker `index` of `workers`, on a connection that then holds it (row
    /// lock, advisory).
    pub(crate) async fn claim_one<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        index: usize,
        workers: usize,
        excluded: &[i64],
    ) -> Result<Option<(ClaimedRow, Hold<DB>)>, ClaimFailed> {
        let claimed = match self {
            FormRuntime::RowLock(row_lock) => row_lock.claim_one(conns, excluded).await?,
            FormRuntime::Advisory(advisory) => {
                advisory.claim_one(conns, index, workers, excluded).await?
            }
            FormRuntime::Lease(_) => unreachable!("the lease form claims for every worker at once"),
        };
        Ok(claimed.map(|(row, conn)| (row, Hold::Conn(conn))))
    }

    /// Claims one batch of up to `size` rows, held together: lease — one claim, one token;
    /// row lock — one transaction; advisory — one connection holding every row's key.
    pub(crate) async fn claim_batch<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, Hold<DB>), ClaimFailed> {
        match self {
            FormRuntime::Lease(lease) => {
                let claimed = lease.claim(conns, size, excluded).await?;
                Ok((claimed.rows, Hold::Lease(claimed.token, claimed.taken)))
            }
            FormRuntime::RowLock(row_lock) => {
                let (rows, conn) = row_lock.claim_batch(conns, size, excluded).await?;
                Ok((rows, Hold::Conn(conn)))
            }
            FormRuntime::Advisory(advisory) => {
                let (rows, conn) = advisory.claim_batch(conns, size, excluded).await?;
                Ok((rows, Hold::Conn(conn)))
            }
        }
    }

    /// The row a claim that failed for a reason of its own failed on: the id it would take next
    /// passing over `excluded` (lease, row lock; an advisory take names its row).
    pub(crate) async fn next<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        excluded: &[i64],
    ) -> Result<Option<i64>, sqlx::Error> {
        match self {
            FormRuntime::Lease(lease) => lease.next(conns, excluded).await,
            FormRuntime::RowLock(row_lock) => row_lock.next(conns, excluded).await,
            FormRuntime::Advisory(_) => Ok(None),
        }
    }

    /// Settles a batch: lease and advisory row by row, each as a single delivery's would be;
    /// row lock all in the claim's transaction, committed together — a statement that fails
    /// rolls the whole batch back ([`Error::BatchRolledBack`](crate::Error::BatchRolledBack)),
    /// and every row returns as it was. One result per row, in order, or the batch's rollback
    /// and the row whose statement failed, where one did; `tokens` are the lease form's current
    /// tokens, per row.
    pub(crate) async fn settle_batch<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        tokens: &[DateTime<Utc>],
        hold: Hold<DB>,
    ) -> Result<Vec<Result<()>>, (Option<i64>, crate::Error)> {
        match (self, hold) {
            (FormRuntime::Lease(lease), Hold::Lease(..)) => {
                // The batch's acknowledgements in one statement each 64 rows; the rest row by row.
                let batched = |outcome: Outcome| {
                    matches!(outcome.0, Settle::Ack | Settle::Drop)
                        && lease.custom.get(outcome.0).is_none()
                };
                let acked: Vec<(i64, DateTime<Utc>)> = settlements
                    .iter()
                    .zip(tokens)
                    .filter(|((_, outcome), _)| batched(*outcome))
                    .map(|(&(id, _), &token)| (id, token))
                    .collect();
                let mut settled = Vec::with_capacity(acked.len());
                for chunk in acked.chunks(crate::dialect::MAX_FINISH) {
                    match lease.finish_many(conns, chunk).await {
                        Ok(rows) => settled.extend(chunk.iter().zip(rows).map(|((id, _), ok)| {
                            (*id, if ok { Ok(()) } else { Err(lease.lost(*id)) })
                        })),
                        Err(error) => {
                            tracing::warn!(%error, "batched acknowledgement failed; row by row");
                            break;
                        }
                    }
                }
                let mut results = Vec::with_capacity(settlements.len());
                for (&(id, outcome), &token) in settlements.iter().zip(tokens) {
                    let done = settled.iter().position(|(settled_id, _)| *settled_id == id);
                    results.push(match done {
                        Some(i) => settled.swap_remove(i).1,
                        None => lease.settle(conns, id, token, outcome, None).await,
                    });
                }
                Ok(results)
            }
            (FormRuntime::Advisory(advisory), Hold::Conn(mut conn)) => {
                let mut results = Vec::with_capacity(settlements.len());
                for &(id, outcome) in settlements {
                    results.push(advisory.settle(&mut conn, id, outcome).await);
                }
                conns.put_held(conn);
                Ok(results)
            }
            (FormRuntime::RowLock(row_lock), Hold::Conn(mut conn)) => {
                let mut failed = None;
                for &(id, outcome) in settlements {
                    if let Err(error) = row_lock.apply(&mut conn, id, outcome).await {
                        failed = Some((Some(id), error));
                        break;
                    }
                }
                let failed = match failed {
                    None => conn
                        .commit()
                        .await
                        .err()
                        .map(|error| (None, crate::Error::from(error))),
                    Some(failed) => {
                        // Dropped unsettled if the rollback fails: the server rolls back.
                        let _ = conn.rollback().await;
                        Some(failed)
                    }
                };
                conns.put_held(conn);
                match failed {
                    None => Ok(settlements.iter().map(|_| Ok(())).collect()),
                    Some((row, error)) => Err((
                        row,
                        crate::Error::BatchRolledBack {
                            queue: row_lock.table.to_string(),
                            rows: settlements.len(),
                            source: Box::new(error),
                        },
                    )),
                }
            }
            _ => unreachable!("each form claims its own hold"),
        }
    }

    /// Releases a batch's rows unsettled; returns how many were still held.
    pub(crate) async fn release_batch<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        rows: &[(i64, DateTime<Utc>)],
        hold: Hold<DB>,
    ) -> u64 {
        let mut released = 0;
        match (self, hold) {
            (FormRuntime::Lease(lease), Hold::Lease(..)) => {
                for &(id, token) in rows {
                    if let Ok(true) = lease.release(conns, id, token).await {
                        released += 1;
                    }
                }
            }
            (FormRuntime::RowLock(_), Hold::Conn(mut conn)) => {
                if conn.rollback().await.is_ok() {
                    released = rows.len() as u64;
                }
                conns.put_held(conn);
            }
            (FormRuntime::Advisory(advisory), Hold::Conn(mut conn)) => {
                for &(id, _) in rows {
                    if advisory.unlock(&mut conn, id).await.is_ok() {
                        released += 1;
                    }
                }
                conns.put_held(conn);
            }
            _ => unreachable!("each form claims its own hold"),
        }
        released
    }

    /// Takes back the connection of a claim that found nothing.
    pub(crate) fn recycle<DB: Backend>(&self, conns: &Conns<DB>, hold: Hold<DB>) {
        if let Hold::Conn(conn) = hold {
            conns.put_held(conn);
        }
    }

    /// Settles row `id` by `outcome`, where its form holds it. `tx` is a transactional lease
    /// delivery's own transaction, which an ack commits with the settlement (the other forms'
    /// transactions are on the connection they hold).
    pub(crate) async fn settle<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Hold<DB>,
        outcome: Outcome,
        tx: Option<HeldConn<DB>>,
    ) -> Result<()> {
        match (self, hold) {
            (FormRuntime::Lease(lease), Hold::Lease(token, _)) => {
                lease.settle(conns, id, token, outcome, tx).await
            }
            (FormRuntime::RowLock(row_lock), Hold::Conn(mut conn)) => {
                let settled = row_lock.settle(&mut conn, id, outcome).await;
                conns.put_held(conn);
                settled
            }
            (FormRuntime::Advisory(advisory), Hold::Conn(mut conn)) => {
                let settled = advisory.settle(&mut conn, id, outcome).await;
                conns.put_held(conn);
                settled
            }
            _ => unreachable!("each form claims its own hold"),
        }
    }

    /// Releases row `id` unsettled, at once: the lease cleared, the claim's transaction rolled
    /// back, the key released. Returns whether it was still held; a connection whose release
    /// fails is closed, and the server releases what it held.
    pub(crate) async fn release<DB: Backend>(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: Hold<DB>,
    ) -> bool {
        let released = match (self, hold) {
            (FormRuntime::Lease(lease), Hold::Lease(token, _)) => {
                lease.release(conns, id, token).await
            }
            (FormRuntime::RowLock(_), Hold::Conn(mut conn)) => {
                let released = conn.rollback().await.map(|()| true);
                conns.put_held(conn);
                released
            }
            (FormRuntime::Advisory(advisory), Hold::Conn(mut conn)) => {
                let released = advisory.unlock(&mut conn, id).await.map(|()| true);
                conns.put_held(conn);
                released
            }
            _ => unreachable!("each form claims its own hold"),
        };
        released.unwrap_or_else(|error| {
            tracing::warn!(%error, id, "could not release a row; it is released when its lease \
                expires or its connection closes");
            false
        })
    }
}

/// The time as the database sees it: this host's clock corrected by its offset to the server's
/// clock, measured at start and again every minute while the runner runs (so a step of this
/// host's clock does not shorten or lengthen leases for long), so that leases and delays written
/// by runners on several hosts agree. Times are kept to the microsecond, the precision PostgreSQL
/// and MySQL store, and never beyond the year 9999, the last MySQL and SQLite text order keep.
#[derive(Debug, Clone, Default)]
pub(crate) struct Clock {
    offset_micros: Arc<AtomicI64>,
}

impl Clock {
    /// Corrects the clock by `server_now`, read by a query that started at `sent` and answered
    /// at `received` (this host's times).
    pub(crate) fn measure(
        &self,
        sent: DateTime<Utc>,
        received: DateTime<Utc>,
        server_now: DateTime<Utc>,
    ) {
        let midpoint = sent + (received - sent) / 2;
        let offset = (server_now - midpoint).num_microseconds().unwrap_or(0);
        self.offset_micros.store(offset, Ordering::Relaxed);
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        let offset = TimeDelta::microseconds(self.offset_micros.load(Ordering::Relaxed));
        (Utc::now() + offset).trunc_subsecs(6)
    }

    /// `now` plus `delay`, to the microsecond.
    pub(crate) fn after(&self, delay: std::time::Duration) -> DateTime<Utc> {
        let last = NaiveDate::from_ymd_opt(9999, 12, 31)
            .and_then(|day| day.and_hms_opt(23, 59, 59))
            .expect("a valid date")
            .and_utc();
        TimeDelta::from_std(delay)
            .ok()
            .and_then(|delay| self.now().checked_add_signed(delay))
            .map_or(last, |at| at.min(last))
            .trunc_subsecs(6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike as _;

    #[test]
    fn the_clock_follows_the_server() {
        let sent = Utc::now();
        let received = sent + TimeDelta::milliseconds(10);
        let server = sent + TimeDelta::seconds(60);
        let clock = Clock::default();
        clock.measure(sent, received, server);
        let skew = clock.now() - Utc::now();
        assert!(skew > TimeDelta::seconds(59) && skew < TimeDelta::seconds(61));
        assert_eq!(clock.now().timestamp_subsec_nanos() % 1000, 0);
    }

    #[test]
    fn far_delays_stop_at_the_year_9999() {
        let clock = Clock::default();
        assert_eq!(clock.after(std::time::Duration::MAX).year(), 9999);
        let soon = clock.after(std::time::Duration::from_secs(1));
        assert!(soon > clock.now() && soon.year() < 9999);
    }
}
