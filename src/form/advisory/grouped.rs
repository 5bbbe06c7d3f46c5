//! The advisory lock form for plain single deliveries: a claim takes the keys of many rows on
//! one session, which then holds them for every delivery of that claim, and the grouped acks
//! settle them there together — one statement that deletes and unlocks (or one `DELETE` and one
//! unlock, see `sets`) for all the acks waiting on a session, where a session per delivery
//! would commit and unlock each row on its own.
//!
//! Every other settlement (a retry, a delay, a dead letter, a statement of the service's own)
//! runs row by row on the session, as on a session of the row's own; statements on one session
//! take turns. A session goes back to the pool once the last of its rows is settled or
//! released; at most one per worker is open, so a queue never holds more connections than a
//! session per delivery would. Transactional queues keep a session per delivery (a handler's
//! transaction is its own), as do batches (a batch is one claim already).
//!
//! A claim takes rows ahead of the workers, as the lease form's does (`ahead_per_worker`). A
//! row that waited starts only while its session is known to hold its key: the session
//! answered a statement (the claim, an ack's, a ping) within [`ANSWERED_FOR`], or answers a
//! ping now. A session the server ended took its keys with it, unseen until a statement runs
//! there, and another runner may have taken the row since: such a row is not delivered. A row
//! that waited [`GIVEN_BACK_AFTER`] goes back, its attempt uncounted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::AdvisoryForm;
use super::keys::Keys;
use crate::backend::{Backend, ClaimedRow, HeldConn};
use crate::config::QueueConfig;
use crate::delivery::Outcome;
use crate::error::{Error, Result};
use crate::form::{Checked, ClaimFailed, Conns, Form, GRACE, Returned, Settled};

/// How recently a session must have answered for a row of its claim to start without asking it
/// again (see the module's docs): about what a row waits for a worker when none was claimed
/// ahead.
pub(crate) const ANSWERED_FOR: Duration = Duration::from_millis(2);

/// How long a row claimed ahead waits for a worker before it goes back, its key released and
/// its attempt uncounted (a runner's workers slower than their mean said would keep it from
/// the workers of other runners): ten times what the runner means rows ahead to wait.
pub(crate) const GIVEN_BACK_AFTER: Duration = Duration::from_millis(100);

/// The advisory lock form of a plain queue of single deliveries.
#[derive(Debug)]
pub(crate) struct GroupedForm {
    inner: AdvisoryForm,
    /// Sessions open at once: one per worker at most.
    sessions: Arc<Semaphore>,
}

/// The session holding the keys of one claim's rows.
#[derive(Debug)]
pub(crate) struct Session<DB: Backend> {
    conn: Mutex<Option<HeldConn<DB>>>,
    /// Rows of the claim not settled or released yet: the last gives the connection back.
    left: AtomicUsize,
    /// When a statement last answered there, proving the session and its keys alive.
    answered: std::sync::Mutex<Instant>,
    /// When its claim took its keys.
    claimed: Instant,
    _open: OwnedSemaphorePermit,
}

impl<DB: Backend> Session<DB> {
    fn answered(&self) {
        *self.answered.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn answered_within(&self, within: Duration) -> bool {
        self.answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
            < within
    }
}

/// What holds a row of a grouped queue: the session its claim took its key on.
#[derive(Debug)]
pub(crate) struct OnSession<DB: Backend>(Arc<Session<DB>>);

impl<DB: Backend> OnSession<DB> {
    /// Runs `f` on the session's connection (none when it was lost).
    async fn with<T>(&self, f: impl AsyncFnOnce(Option<&mut HeldConn<DB>>) -> T) -> T {
        let mut conn = self.0.conn.lock().await;
        f(conn.as_mut()).await
    }

    /// This row is done with its session: the last one gives its connection back (closed if
    /// it still holds a key).
    fn done(self, conns: &Conns<DB>) {
        if self.0.left.fetch_sub(1, Ordering::AcqRel) == 1
            && let Ok(mut conn) = self.0.conn.try_lock()
            && let Some(conn) = conn.take()
        {
            conns.put_held(conn);
        }
    }

    fn is(&self, other: &OnSession<DB>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl GroupedForm {
    fn key_lost(&self, id: i64) -> Error {
        self.inner.key_lost(id)
    }
}

impl<DB: Backend> Form<DB> for GroupedForm {
    type Hold = OnSession<DB>;
    type Batch = HeldConn<DB>;
    const ONE_CLAIM: bool = true;
    const GROUPS_ACKS: bool = true;
    /// A claim finds places for the rows it takes (for the free workers and ahead of them)
    /// while the rows of earlier claims wait for their acks' statement.
    const ACKS_IN_HAND: usize = 3;
    const HOLDS_KEYS: bool = true;

    async fn prepare(
        conn: &mut DB::Connection,
        config: &QueueConfig,
        checked: Checked,
    ) -> Result<Self> {
        let inner =
            AdvisoryForm::prepare_for::<DB>(conn, config, checked, config.max_in_hand()).await?;
        Ok(GroupedForm {
            inner,
            sessions: Arc::new(Semaphore::new(config.workers)),
        })
    }

    /// Takes up to `want` rows on a session of their own, which holds all their keys.
    async fn claim(
        &self,
        conns: &Conns<DB>,
        want: usize,
        _: (usize, usize),
        excluded: &(dyn Fn() -> Vec<i64> + Sync),
    ) -> Result<Vec<(ClaimedRow, OnSession<DB>)>, ClaimFailed> {
        let open = Arc::clone(&self.sessions)
            .acquire_owned()
            .await
            .expect("never closed");
        let mut conn = HeldConn::new(conns.get().await?);
        let rows = self.inner.take::<DB>(&mut conn, want, &excluded()).await?;
        if rows.is_empty() {
            conns.put_held(conn);
            return Ok(Vec::new());
        }
        let session = Arc::new(Session {
            conn: Mutex::new(Some(conn)),
            left: AtomicUsize::new(rows.len()),
            answered: std::sync::Mutex::new(Instant::now()),
            claimed: Instant::now(),
            _open: open,
        });
        Ok(rows
            .into_iter()
            .map(|row| (row, OnSession(Arc::clone(&session))))
            .collect())
    }

    async fn claim_batch(
        &self,
        conns: &Conns<DB>,
        size: usize,
        excluded: &[i64],
    ) -> Result<(Vec<ClaimedRow>, HeldConn<DB>), ClaimFailed> {
        <AdvisoryForm as Form<DB>>::claim_batch(&self.inner, conns, size, excluded).await
    }

    async fn next(&self, _: &Conns<DB>, _: &[i64]) -> Result<Option<i64>, sqlx::Error> {
        // A take that fails names its row.
        Ok(None)
    }

    async fn lend(&self, _: &Conns<DB>, _: &mut OnSession<DB>) -> Result<HeldConn<DB>> {
        // Never asked: a transactional queue keeps a session per delivery.
        Err(Error::unsupported(
            &self.inner.checked.queue,
            "a transaction needs a session of the delivery's own",
        ))
    }

    async fn take_back(
        &self,
        _: &Conns<DB>,
        _: &mut OnSession<DB>,
        conn: HeldConn<DB>,
        _: bool,
    ) -> Result<Option<HeldConn<DB>>, sqlx::Error> {
        // Never lent (see `lend`): closed if it holds anything.
        drop(conn);
        Ok(None)
    }

    async fn read_row(
        &self,
        _: &Conns<DB>,
        hold: &mut OnSession<DB>,
        _: Option<&mut HeldConn<DB>>,
        id: i64,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        let row = &self.inner.checked.row;
        hold.with(async |conn| match conn {
            Some(conn) => crate::form::fetch_row::<DB>(conn, row, id).await,
            None => Ok(None),
        })
        .await
    }

    async fn settle(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: OnSession<DB>,
        outcome: Outcome,
        _: Option<HeldConn<DB>>,
    ) -> Result<Settled> {
        let settled = hold
            .with(async |conn| match conn {
                Some(conn) => self.inner.settle_on::<DB>(conn, id, outcome, true).await,
                None => Err(self.key_lost(id)),
            })
            .await;
        // A row whose settlement failed stays held until the runner has held it back
        // (`hold_for`), so that no claim takes it again before.
        if settled.is_ok() {
            hold.done(conns);
        }
        settled
    }

    async fn settle_many(
        &self,
        conns: &Conns<DB>,
        rows: Vec<(i64, OnSession<DB>, Outcome)>,
    ) -> Vec<Result<()>> {
        // Each session's rows together (by their place in `rows`), the sessions at once.
        let mut sessions: Vec<Vec<usize>> = Vec::new();
        for (i, (_, hold, _)) in rows.iter().enumerate() {
            match sessions
                .iter_mut()
                .find(|places| rows[places[0]].1.is(hold))
            {
                Some(places) => places.push(i),
                None => sessions.push(vec![i]),
            }
        }
        let settled = join_all(sessions.iter().map(async |places| {
            let settlements: Vec<(i64, Outcome)> =
                places.iter().map(|&i| (rows[i].0, rows[i].2)).collect();
            rows[places[0]]
                .1
                .with(async |conn| match conn {
                    Some(conn) => self.inner.settle_sets::<DB>(conn, &settlements, true).await,
                    None => settlements
                        .iter()
                        .map(|(id, _)| Err(self.key_lost(*id)))
                        .collect(),
                })
                .await
        }))
        .await;
        let mut results: Vec<Option<Result<()>>> = rows.iter().map(|_| None).collect();
        for (places, settled) in sessions.iter().zip(settled) {
            if settled.iter().any(Result::is_ok) {
                rows[places[0]].1.0.answered();
            }
            for (&i, result) in places.iter().zip(settled) {
                results[i] = Some(result);
            }
        }
        // As in `settle`: a row whose settlement failed stays held until `hold_for`.
        for ((_, hold, _), result) in rows.into_iter().zip(&results) {
            if matches!(result, Some(Ok(())) | None) {
                hold.done(conns);
            }
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or(Ok(())))
            .collect()
    }

    async fn settle_batch(
        &self,
        conns: &Conns<DB>,
        settlements: &[(i64, Outcome)],
        conn: HeldConn<DB>,
        one_by_one: bool,
    ) -> Result<Vec<Result<()>>, (Option<i64>, Error)> {
        <AdvisoryForm as Form<DB>>::settle_batch(&self.inner, conns, settlements, conn, one_by_one)
            .await
    }

    async fn release(&self, conns: &Conns<DB>, id: i64, hold: OnSession<DB>) -> bool {
        let released = hold.with(async |conn| self.unlock(conn, id).await).await;
        hold.done(conns);
        released
    }

    async fn release_unstarted(
        &self,
        conns: &Conns<DB>,
        id: i64,
        attempt: Option<i64>,
        hold: OnSession<DB>,
    ) -> bool {
        let released = hold
            .with(async |conn| {
                let Some(conn) = conn else {
                    return false;
                };
                if let Some(attempt) = attempt {
                    self.inner.uncount::<DB>(conn, id, attempt).await;
                }
                self.unlock(Some(conn), id).await
            })
            .await;
        hold.done(conns);
        released
    }

    async fn release_batch(&self, conns: &Conns<DB>, ids: &[i64], conn: HeldConn<DB>) -> u64 {
        <AdvisoryForm as Form<DB>>::release_batch(&self.inner, conns, ids, conn).await
    }

    fn given_back_at(&self, hold: &OnSession<DB>) -> Option<(Instant, Duration)> {
        Some((hold.0.claimed + GIVEN_BACK_AFTER, GIVEN_BACK_AFTER))
    }

    /// A row that waited for a worker: see the module's docs.
    async fn still_held(&self, id: i64, hold: &OnSession<DB>) -> bool {
        let session = &hold.0;
        if matches!(self.inner.keys, Keys::InProcess { .. })
            || session.answered_within(ANSWERED_FOR)
        {
            return true;
        }
        let mut conn = session.conn.lock().await;
        // Another row of the session may have asked meanwhile.
        if session.answered_within(ANSWERED_FOR) {
            return conn.is_some();
        }
        let Some(held) = conn.as_mut() else {
            return false;
        };
        match sqlx::Connection::ping(&mut **held).await {
            Ok(()) => {
                session.answered();
                true
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    id,
                    "the session holding rows claimed ahead did not answer: not delivered"
                );
                // Closed, not pooled: it may still hold keys.
                *conn = None;
                false
            }
        }
    }

    async fn session_lost(&self, id: i64, hold: &mut OnSession<DB>) -> bool {
        !<Self as Form<DB>>::still_held(self, id, hold).await
    }

    fn keep(&self, hold: &OnSession<DB>) -> Option<OnSession<DB>> {
        Some(OnSession(Arc::clone(&hold.0)))
    }

    /// The row's settlement failed and the runner holds it back now: its key, kept since, is
    /// released (the delay is the runner's to keep, by passing the row over).
    async fn hold_for(&self, conns: &Conns<DB>, id: i64, kept: OnSession<DB>, _: Duration) {
        kept.with(async |conn| self.unlock(conn, id).await).await;
        kept.done(conns);
    }

    async fn abandon(
        &self,
        conns: &Conns<DB>,
        id: i64,
        hold: OnSession<DB>,
        _: Option<OnSession<DB>>,
    ) -> Returned {
        let release = hold.with(async |conn| self.unlock(conn, id).await);
        let returned = match tokio::time::timeout(GRACE, release).await {
            Ok(true) => Returned::Released,
            Ok(false) | Err(_) => Returned::Unconfirmed,
        };
        hold.done(conns);
        returned
    }
}

impl GroupedForm {
    /// Releases row `id`'s key on its session: whether it was held. A release that fails leaves
    /// the session holding a key it does not know of: it is closed with its last row.
    async fn unlock<DB: Backend>(&self, conn: Option<&mut HeldConn<DB>>, id: i64) -> bool {
        let Some(conn) = conn else {
            return false;
        };
        match self.inner.unlock::<DB>(conn, id).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%error, id, "could not release a key; its session is closed");
                false
            }
        }
    }
}
