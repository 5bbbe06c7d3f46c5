//! The transaction a unique enqueue or a cancellation runs in: a savepoint inside the caller's
//! transaction, or, on a connection outside one (a pool), a transaction of the crate's own —
//! which it runs again when the database ended it for a deadlock or a serialization failure,
//! since nothing the caller holds depends on it. Inside the caller's transaction such an error
//! is the caller's (MySQL/MariaDB have rolled the whole transaction back).

use std::time::Duration;

use crate::backend::{self, Backend};
use crate::dialect;
use crate::error::{Error, Result};

/// How many times a transaction of the crate's own is run again after a deadlock or a
/// serialization failure, before the error is returned.
const RETRIES: u32 = 5;

/// The runs of one transaction on a connection. Inside the caller's transaction: once, in it —
/// or in a savepoint of it where the work asks for one (`savepoint`; a deadlock on
/// MySQL/MariaDB ends the caller's transaction with its savepoints, which then cannot be rolled
/// back to). Outside one: a transaction of the crate's own (`dialect::begin_own`), run again up
/// to [`RETRIES`] times, a few milliseconds apart, while the database ends it for a deadlock or
/// a serialization failure. The caller loops: [`begin`](Runs::begin), its statements on the
/// [`Run`], [`end`](Runs::end) — until `end` gives the outcome. A run dropped unended (its future
/// dropped) rolls back, as sqlx's transactions do.
pub(super) struct Runs {
    own: bool,
    savepoint: bool,
    retried: u32,
}

/// One run: the connection, in the run's transaction (or savepoint) where it has one.
pub(super) enum Run<'c, DB: Backend> {
    Transaction(sqlx::Transaction<'c, DB>),
    Bare(&'c mut DB::Connection),
}

impl<DB: Backend> std::ops::Deref for Run<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match self {
            Run::Transaction(tx) => tx,
            Run::Bare(conn) => conn,
        }
    }
}

impl<DB: Backend> std::ops::DerefMut for Run<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        match self {
            Run::Transaction(tx) => tx,
            Run::Bare(conn) => conn,
        }
    }
}

impl Runs {
    /// The runs of a transaction on `conn`, as it is now (inside the caller's transaction, or
    /// not); `savepoint`: inside the caller's, in a savepoint of it.
    pub(super) fn on<DB: Backend>(conn: &DB::Connection, savepoint: bool) -> Self {
        Runs {
            own: !backend::in_transaction::<DB>(conn),
            savepoint,
            retried: 0,
        }
    }

    /// Opens the next run on `conn`, in its transaction (or savepoint) where it has one.
    pub(super) async fn begin<'c, DB: Backend>(
        &self,
        conn: &'c mut DB::Connection,
    ) -> Result<Run<'c, DB>> {
        Ok(match (self.own, self.savepoint) {
            (true, _) => {
                let begin = dialect::begin_own(DB::DIALECT);
                Run::Transaction(sqlx::Connection::begin_with(conn, begin).await?)
            }
            (false, true) => Run::Transaction(sqlx::Connection::begin(conn).await?),
            (false, false) => Run::Bare(conn),
        })
    }

    /// Ends `run`: commits its transaction (or savepoint) when its statements did what they
    /// should (`done`), else rolls it back. The outcome, or `None` when the database ended the
    /// crate's own transaction for a deadlock or a serialization failure and it is to run again
    /// (after a pause).
    pub(super) async fn end<DB: Backend, T>(
        &mut self,
        run: Run<'_, DB>,
        done: Result<T>,
    ) -> Option<Result<T>> {
        let Run::Transaction(tx) = run else {
            return Some(done);
        };
        let done = match done {
            Ok(done) => tx.commit().await.map(|()| done).map_err(Error::from),
            Err(error) => {
                // After a deadlock MySQL/MariaDB have rolled back already; a rollback that fails
                // there leaves nothing open.
                let _ = tx.rollback().await;
                Err(error)
            }
        };
        match done {
            Err(error) if self.own && self.retried < RETRIES && is_transient(&error) => {
                self.retried += 1;
                let retried = self.retried;
                tracing::debug!(%error, retried, "the crate's own transaction runs again");
                tokio::time::sleep(pause(retried)).await;
                None
            }
            done => Some(done),
        }
    }
}

/// Whether the database ended the transaction for a deadlock or a serialization failure
/// (SQLSTATE 40001 — MySQL/MariaDB's deadlock 1213 among them — or PostgreSQL's 40P01): running
/// it again may succeed.
fn is_transient(error: &Error) -> bool {
    match error {
        Error::Database(sqlx::Error::Database(db)) => {
            matches!(db.code().as_deref(), Some("40001" | "40P01"))
        }
        _ => false,
    }
}

/// The pause before the `retried`th run: 5 ms doubling, and a part of it again as jitter, so
/// that two transactions that deadlocked do not meet again in step.
fn pause(retried: u32) -> Duration {
    let base = Duration::from_millis(5) * 2u32.pow(retried.min(6));
    let jitter = u64::from(std::process::id() ^ chrono::Utc::now().timestamp_subsec_nanos());
    let span = u64::try_from(base.as_micros()).unwrap_or(u64::MAX).max(1);
    base + Duration::from_micros(jitter % span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_with_at_most_their_own_length_of_jitter() {
        for retried in 1..=RETRIES {
            let base = Duration::from_millis(5) * 2u32.pow(retried);
            let pause = pause(retried);
            assert!(pause >= base && pause < base * 2, "{retried}: {pause:?}");
        }
    }
}
