//! A pooled connection a delivery holds while it is in work.

use std::fmt;
use std::ops::{Deref, DerefMut};

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
    conn: PoolConnection<DB>,
    /// The keys this connection's deliveries hold (one, or a batch's).
    keys: Vec<Key>,
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
            conn,
            keys: Vec::new(),
        }
    }

    /// Opens a transaction, or a savepoint inside one; `statement` replaces the `BEGIN`.
    pub(crate) async fn begin(&mut self, statement: Option<&'static str>) -> sqlx::Result<()> {
        DB::TransactionManager::begin(&mut self.conn, statement.map(SqlStr::from_static)).await
    }

    /// Commits the innermost transaction (or releases the innermost savepoint).
    pub(crate) async fn commit(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::commit(&mut self.conn).await
    }

    /// Rolls the innermost transaction back (or back to the innermost savepoint).
    pub(crate) async fn rollback(&mut self) -> sqlx::Result<()> {
        DB::TransactionManager::rollback(&mut self.conn).await
    }

    /// How many transactions and savepoints are open.
    pub(crate) fn depth(&self) -> usize {
        DB::TransactionManager::get_transaction_depth(&self.conn)
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
        &self.conn
    }
}

impl<DB: Backend> DerefMut for HeldConn<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.conn
    }
}

impl<DB: Backend> Drop for HeldConn<DB> {
    fn drop(&mut self) {
        for key in std::mem::take(&mut self.keys) {
            match key {
                Key::InProcess(table, id) => release_in_process(table, id),
                Key::Session(_) => self.conn.close_on_drop(),
            }
        }
        if self.depth() > 0 {
            self.conn.close_on_drop();
        }
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
