//! The connection a delivery holds from its claim to its settlement, and the keys it holds
//! there: apart from the driver calls, as it is the one stateful piece of this layer (what it
//! holds decides whether the connection may go back to the pool).

use std::fmt;
use std::ops::{Deref, DerefMut};

use sqlx::SqlStr;
use sqlx::pool::PoolConnection;
use sqlx_core::transaction::TransactionManager;

use super::Backend;

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
    /// Keys a statement may have taken whose answer was not read yet: if it never is, which
    /// keys the session holds is unknown, and the connection must not be reused.
    Pending,
}

/// Keys held in this process (the advisory form on SQLite).
pub(crate) mod in_process {
    use std::collections::HashSet;
    use std::sync::{Mutex, MutexGuard};

    static KEYS: Mutex<Option<HashSet<(u64, i64)>>> = Mutex::new(None);

    fn keys() -> MutexGuard<'static, Option<HashSet<(u64, i64)>>> {
        KEYS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a key; `false` when it is held already.
    pub(crate) fn take(table: u64, id: i64) -> bool {
        keys()
            .get_or_insert_with(Default::default)
            .insert((table, id))
    }

    /// How many keys of `table` are held.
    pub(crate) fn count(table: u64) -> usize {
        keys()
            .as_ref()
            .map_or(0, |keys| keys.iter().filter(|(t, _)| *t == table).count())
    }

    pub(super) fn release(table: u64, id: i64) {
        if let Some(keys) = keys().as_mut() {
            keys.remove(&(table, id));
        }
    }

    /// A key taken for a while (a cancellation's transaction), not for a delivery: released
    /// when dropped, also on an error or when the future holding it is dropped.
    #[derive(Debug)]
    pub(crate) struct Taken {
        table: u64,
        id: i64,
    }

    /// Takes a key until the guard is dropped; `None` when it is held already.
    pub(crate) fn take_for_now(table: u64, id: i64) -> Option<Taken> {
        // Built only once taken: a guard dropped releases its key.
        take(table, id).then(|| Taken { table, id })
    }

    impl Drop for Taken {
        fn drop(&mut self) {
            release(self.table, self.id);
        }
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

    /// The keys this connection's deliveries hold.
    pub(crate) fn keys(&self) -> &[Key] {
        &self.keys
    }

    /// Whether this connection's deliveries hold any key (a [`Key::Pending`] too).
    pub(crate) fn holds_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Records that `key` was released (an in-process key is released here).
    pub(crate) fn release_key(&mut self, key: Key) {
        if let Some(i) = self.keys.iter().position(|k| *k == key) {
            self.keys.swap_remove(i);
            if let Key::InProcess(table, id) = key {
                in_process::release(table, id);
            }
        }
    }

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

impl<DB: Backend> Drop for HeldConn<DB> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        let mut close = DB::TransactionManager::get_transaction_depth(conn) > 0;
        for key in std::mem::take(&mut self.keys) {
            match key {
                Key::InProcess(table, id) => in_process::release(table, id),
                Key::Session(_) | Key::Pending => close = true,
            }
        }
        if close {
            conn.close_on_drop();
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
