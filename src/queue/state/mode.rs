//! The transactional mode's gates: which queues have transactions to configure, and which
//! settings each database's transactions take.

use super::sealed::Sealed;
use crate::config::{Isolation, SqliteMode};
use crate::delivery::{Isolated, Mode, Plain, Transactional};

/// A transactional queue (for its transactions' settings).
#[diagnostic::on_unimplemented(
    message = "only a transactional queue has transactions to configure",
    label = "call `.transactional()` first"
)]
pub trait TransactionalQueue: Mode {}
impl TransactionalQueue for Transactional {}
impl<L: 'static> TransactionalQueue for Isolated<L> {}

/// A setting of a transactional queue's transactions: an [`Isolation`] level (PostgreSQL,
/// MySQL/MariaDB) or a [`SqliteMode`] (SQLite).
pub trait TransactionSetting: Sealed + Send + Sync + 'static {
    #[doc(hidden)]
    fn set(self, isolation: &mut Option<Isolation>, sqlite_mode: &mut Option<SqliteMode>);
}
impl Sealed for Isolation {}
impl Sealed for SqliteMode {}
impl TransactionSetting for Isolation {
    fn set(self, isolation: &mut Option<Isolation>, sqlite_mode: &mut Option<SqliteMode>) {
        (*isolation, *sqlite_mode) = (Some(self), None);
    }
}
impl TransactionSetting for SqliteMode {
    fn set(self, isolation: &mut Option<Isolation>, sqlite_mode: &mut Option<SqliteMode>) {
        (*isolation, *sqlite_mode) = (None, Some(self));
    }
}

/// A transactions' setting the database `DB` takes.
#[diagnostic::on_unimplemented(
    message = "`{DB}` transactions do not take `{Self}` (`.isolation(..)`)",
    label = "this queue's transactions are set for another database",
    note = "PostgreSQL and MySQL/MariaDB take an `Isolation` level (`.isolation(Isolation::..)`); \
            SQLite takes a `SqliteMode` (`.isolation(SqliteMode::Immediate)`)"
)]
pub trait SettingOn<DB>: TransactionSetting {}
#[cfg(feature = "postgres")]
impl SettingOn<sqlx::Postgres> for Isolation {}
#[cfg(feature = "mysql")]
impl SettingOn<sqlx::MySql> for Isolation {}
#[cfg(feature = "sqlite")]
impl SettingOn<sqlx::Sqlite> for SqliteMode {}

/// A queue mode the database `DB` can run: plain, transactional, or transactional with a
/// setting `DB` takes ([`SettingOn`]).
pub trait ModeOn<DB>: Sealed {}
impl Sealed for Plain {}
impl Sealed for Transactional {}
impl<L> Sealed for Isolated<L> {}
impl<DB> ModeOn<DB> for Plain {}
impl<DB> ModeOn<DB> for Transactional {}
impl<DB, L: SettingOn<DB>> ModeOn<DB> for Isolated<L> {}

/// A queue that is not transactional.
#[diagnostic::on_unimplemented(
    message = "a transactional queue serves single deliveries, not batches",
    label = "this queue is `.transactional()`",
    note = "remove `.transactional()` or the batch (`.batch(n)`, `.batch_handler(f)`)"
)]
pub trait NotTransactional: Mode {}
impl NotTransactional for Plain {}
