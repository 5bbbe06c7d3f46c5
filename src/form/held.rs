//! A pooled connection a delivery holds while it is in work.

use std::fmt;
use std::ops::{Deref, DerefMut};

use std::time::{Duration, Instant};

use sqlx::Pool;
use sqlx::SqlStr;
use sqlx::pool::PoolConnection;
use sqlx_core::transaction::TransactionManager;

use crate::backend::Backend;

/// A pooled connection a delivery keeps from its claim to its settlement: the claim's
/// transaction (row lock), the row's key (advisory lock), or the delivery's own transaction
/// (transactional mode).
///
/// Transactions are opened and ended through the driver's own transaction manager, so sqlx's
/// nesting (savepoints) stays right, and the connection outlives them (the advisory form unlocks
/// its key on the same session once the transaction ended).
///
/// Dropped while it still holds something — an open transaction or a key — the connection never
/// goes back to the pool as it is: it is closed, and the server rolls the transaction back and
/// releases the key (an in-process key is released at once).
pub(crate) struct HeldConn<DB: Backend> {
    /// Always `Some` but in `into_clean`.
    conn: Option<PoolConnection<DB>>,
    /// The keys this connection's deliveries hold (one, or a batch's).
    keys: Vec<Key>,
    /// Lent to a handler: it goes back to the pool (and its `after_release`), never kept.
    lent: bool,
}

/// A key a delivery holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// A session lock of the connection's on row `id` (PostgreSQL, MySQL/MariaDB).
    Session(i64),
    /// A key held in this process (SQLite): `(table, id)`.
    InProcess(u64, i64),
}

/// Keys of the advisory form on SQLite, held in this process.
static IN_PROCESS: std::sync::Mutex<Option<std::collections::HashSet<(u64, i64)>>> =
    std::sync::Mutex::new(None);

/// Takes an in-process key; `false` when it is held already.
pub(crate) fn take_in_process(table: u64, id: i64) -> bool {
    let mut keys = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    keys.get_or_insert_with(Default::default)
        .insert((table, id))
}

/// How many in-process keys of `table` are held.
pub(crate) fn held_in_process_count(table: u64) -> usize {
    let keys = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    keys.as_ref()
        .map_or(0, |keys| keys.iter().filter(|(t, _)| *t == table).count())
}

/// Whether an in-process key is held.
pub(crate) fn held_in_process(table: u64, id: i64) -> bool {
    let keys = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    keys.as_ref()
        .is_some_and(|keys| keys.contains(&(table, id)))
}

fn release_in_process(table: u64, id: i64) {
    let mut keys = IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(keys) = keys.as_mut() {
        keys.remove(&(table, id));
    }
}

impl<DB: Backend> HeldConn<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        HeldConn {
            conn: Some(conn),
            keys: Vec::new(),
            lent: false,
        }
    }

    /// Opens a transaction, or a savepoint inside one; `statement` replaces the `BEGIN`.
    pub(crate) async fn begin(&mut self, statement: Option<&'static str>) -> sqlx::Result<()> {
        DB::TransactionManager::begin(self, statement.map(SqlStr::from_static)).await
    }

    /// Commits the innermost transaction (or releases the innermost savepoint).
    pub(crate) async fn commit(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::commit(self).await
    }

    /// Rolls the innermost transaction back (or back to the innermost savepoint).
    pub(crate) async fn rollback(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::rollback(self).await
    }

    /// How many transactions and savepoints are open.
    pub(crate) fn depth(&self) -> usize {
        DB::TransactionManager::get_transaction_depth(self)
    }

    /// Records that this connection's delivery holds `key`.
    pub(crate) fn hold_key(&mut self, key: Key) {
        self.keys.push(key);
    }

    /// Records that `key` was released (an in-process key is released here).
    pub(crate) fn release_key(&mut self, key: Key) {
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            self.keys.swap_remove(i);
            if let Key::InProcess(table, id) = key {
                release_in_process(table, id);
            }
        }
    }
}

impl<DB: Backend> Deref for HeldConn<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("taken only when dropped")
    }
}

impl<DB: Backend> DerefMut for HeldConn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_mut().expect("taken only when dropped")
    }
}

impl<DB: Backend> HeldConn<DB> {
    /// Marks the connection lent to a handler (a transactional delivery's).
    pub(crate) fn lend(&mut self) {
        self.lent = true;
    }

    /// The pooled connection, when it holds nothing any more (no transaction, no key) and ran
    /// nothing of a handler's.
    pub(crate) fn into_clean(mut self) -> Option<PoolConnection<DB>> {
        if self.keys.is_empty() && self.depth() == 0 && !self.lent {
            self.conn.take()
        } else {
            None
        }
    }
}

impl<DB: Backend> Drop for HeldConn<DB> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut close = DB::TransactionManager::get_transaction_depth(conn) > 0;
        for key in std::mem::take(&mut self.keys) {
            match key {
                Key::InProcess(table, id) => release_in_process(table, id),
                Key::Session(_) => close = true,
            }
        }
        if close {
            conn.close_on_drop();
        }
    }
}

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

impl<DB: Backend> fmt::Debug for HeldConn<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldConn")
            .field("depth", &self.depth())
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}
