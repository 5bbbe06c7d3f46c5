//! The hold of the forms that keep a connection per delivery, and the end of a cancelled
//! delivery's session: shared by the row lock and advisory forms, so it lives beside them rather
//! than in either.

use super::{Conns, GRACE, Returned};
use crate::backend::{Backend, HeldConn};
use crate::dialect::Stmt;
use crate::error::{Error, Result};

/// What holds a row of the forms that hold a connection per delivery: that connection (the
/// claim's transaction, the row's key) — away while a transactional handler has it — and its
/// server session, where the claim read it (to end it if the delivery is cancelled).
#[derive(Debug)]
pub(crate) struct Held<DB: Backend> {
    pub(super) conn: Option<HeldConn<DB>>,
    pub(super) session: Option<i64>,
}

impl<DB: Backend> Held<DB> {
    /// Reads row `id` whole (row mode) where the delivery holds it: in the handler's
    /// transaction `tx` when one is lent, else on the held connection.
    pub(super) async fn read_row(
        &mut self,
        tx: Option<&mut HeldConn<DB>>,
        row: &Stmt,
        id: i64,
    ) -> Result<Option<DB::Row>, sqlx::Error> {
        match tx.or(self.conn.as_mut()) {
            Some(conn) => super::fetch_row::<DB>(conn, row, id).await,
            None => Ok(None),
        }
    }

    /// Whether the session holding the row is gone: it does not answer a ping (a session lent
    /// to a transactional handler is not asked: `false`).
    pub(super) async fn lost(&mut self, id: i64) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return false;
        };
        match sqlx::Connection::ping(&mut **conn).await {
            Ok(()) => false,
            Err(error) => {
                tracing::warn!(
                    %error,
                    id,
                    "the session holding a row in work does not answer: the row may be claimed \
                     again; its handler is told (`Delivery::cancelled`)"
                );
                true
            }
        }
    }

    pub(super) fn new(conn: HeldConn<DB>, session: Option<i64>) -> Self {
        Held {
            conn: Some(conn),
            session,
        }
    }

    /// Lends the connection to a transactional handler of `queue`, its transaction (or
    /// savepoint) begun by `begin`; [`Error::TransactionHeld`] if it is lent already.
    pub(super) async fn lend(
        &mut self,
        begin: Option<&'static str>,
        queue: &str,
    ) -> Result<HeldConn<DB>> {
        let Some(mut conn) = self.conn.take() else {
            return Err(transaction_held(queue, 0));
        };
        if let Err(error) = conn.begin(begin).await {
            self.conn = Some(conn);
            return Err(error.into());
        }
        conn.lend();
        Ok(conn)
    }

    /// The connection to settle row `id` of `queue` on; [`Error::TransactionHeld`] if a
    /// transactional handler's transaction never came back.
    pub(super) fn into_conn(self, queue: &str, id: i64) -> Result<HeldConn<DB>> {
        self.conn.ok_or_else(|| transaction_held(queue, id))
    }

    /// Returns a row of a delivery cancelled at the shutdown timeout. A connection lent to the
    /// handler was closed (the server rolls back and releases what it held): its server session
    /// is ended, so that a statement still running there ends too. Otherwise `release` (a
    /// rollback, an unlock) runs on it within [`GRACE`]; past it, the connection is closed.
    pub(super) async fn abandon(
        self,
        conns: &Conns<DB>,
        release: impl AsyncFnOnce(HeldConn<DB>) -> bool,
    ) -> Returned {
        match (self.conn, self.session) {
            (None, session) => {
                if let Some(session) = session {
                    end_session(conns, session).await;
                }
                Returned::Released
            }
            (Some(conn), _) => match tokio::time::timeout(GRACE, release(conn)).await {
                Ok(true) => Returned::Released,
                Ok(false) | Err(_) => Returned::Unconfirmed,
            },
        }
    }
}

/// The delivery's transaction is held elsewhere (a delivery that escaped its handler).
fn transaction_held(queue: &str, id: i64) -> Error {
    Error::TransactionHeld {
        queue: queue.to_string(),
        id,
    }
}

/// Ends a cancelled delivery's server session from another connection, within the grace.
async fn end_session<DB: Backend>(conns: &Conns<DB>, session: i64) {
    let ended = tokio::time::timeout(GRACE, async {
        let mut conn = conns.pool.acquire().await?;
        DB::end_session(&mut conn, session).await
    })
    .await;
    match ended {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, session, "could not end a cancelled delivery's session");
        }
        Err(_) => tracing::warn!(
            session,
            "could not end a cancelled delivery's session in time"
        ),
    }
}
