//! The pooled connections a queue keeps between its statements.

use std::fmt;
use std::time::{Duration, Instant};

use sqlx::Pool;
use sqlx::pool::PoolConnection;

use crate::backend::{Backend, HeldConn};

/// The pooled connections a queue keeps between statements. sqlx tests a connection with a
/// round trip each time it goes back to the pool (and, by default, when it is acquired): kept
/// here, a connection is reused at once. At most `keep` are kept, and only while the pool has a
/// connection to give others (the application, other queues) — one idle, or room for one more;
/// none is kept longer than [`Conns::MAX_KEPT`] (the pool's tests then see it again), after a
/// failure (`clear`: they may be as broken as the one that failed) or once the pool is closed.
/// A task of this queue waiting on the pool takes a connection kept meanwhile, and an idle queue
/// gives its kept connections back.
pub(crate) struct Conns<DB: Backend> {
    pub(crate) pool: Pool<DB>,
    spare: std::sync::Mutex<Vec<(PoolConnection<DB>, Instant)>>,
    kept: tokio::sync::Notify,
    keep: usize,
}

impl<DB: Backend> Conns<DB> {
    /// The longest a connection stays kept unused.
    pub(crate) const MAX_KEPT: Duration = Duration::from_secs(5);

    pub(crate) fn new(pool: Pool<DB>, keep: usize) -> Self {
        let keep = keep.min((pool.options().get_max_connections() as usize).saturating_sub(1));
        Conns {
            pool,
            spare: std::sync::Mutex::new(Vec::with_capacity(keep)),
            kept: tokio::sync::Notify::new(),
            keep,
        }
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection<DB>, Instant)>> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently kept connection, if one was kept recently enough.
    fn pop(&self) -> Option<PoolConnection<DB>> {
        let mut spare = self.spare();
        let (conn, at) = spare.pop()?;
        if at.elapsed() <= Self::MAX_KEPT && !self.pool.is_closed() {
            return Some(conn);
        }
        // The others were kept earlier still.
        let stale = std::mem::take(&mut *spare);
        drop(spare);
        drop((conn, stale));
        None
    }

    /// A kept connection, or one of the pool's (or one kept while waiting for the pool's).
    pub(crate) async fn get(&self) -> sqlx::Result<PoolConnection<DB>> {
        if let Some(conn) = self.pop() {
            return Ok(conn);
        }
        if self.keep == 0 {
            return self.pool.acquire().await;
        }
        let acquire = self.pool.acquire();
        tokio::pin!(acquire);
        loop {
            let kept = self.kept.notified();
            tokio::pin!(kept);
            kept.as_mut().enable();
            if let Some(conn) = self.pop() {
                return Ok(conn);
            }
            tokio::select! {
                conn = &mut acquire => return conn,
                () = &mut kept => {}
            }
        }
    }

    /// Keeps `conn` for the next statement, or gives it back to the pool: when enough are kept,
    /// when the pool has none left for others, or when it is closed.
    pub(crate) fn put(&self, conn: PoolConnection<DB>) {
        let pool = &self.pool;
        let others_served =
            pool.num_idle() > 0 || pool.size() < pool.options().get_max_connections();
        let mut spare = self.spare();
        if spare.len() < self.keep && others_served && !pool.is_closed() {
            spare.push((conn, Instant::now()));
            drop(spare);
            self.kept.notify_one();
        }
    }

    /// Gives every kept connection back to the pool: after a failure, and when the queue goes
    /// idle.
    pub(crate) fn clear(&self) {
        let spare = std::mem::take(&mut *self.spare());
        drop(spare);
    }

    /// `result`, after giving the kept connections back when it failed.
    pub(crate) fn checked<T>(&self, result: sqlx::Result<T>) -> sqlx::Result<T> {
        if result.is_err() {
            self.clear();
        }
        result
    }

    /// Keeps a delivery's connection once it holds nothing (else it is dropped as it is).
    pub(crate) fn put_held(&self, conn: HeldConn<DB>) {
        if let Some(conn) = conn.into_clean() {
            self.put(conn);
        }
    }
}

impl<DB: Backend> fmt::Debug for Conns<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conns")
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}
