//! A queue's transactions: transactional mode, its isolation, and statements of the service's
//! own in place of the crate's settlements.

use super::Queue;
use super::state::*;
use crate::config::Event;
#[cfg(doc)]
use crate::config::{Isolation, SqliteMode};
use crate::delivery::{Isolated, Transactional};

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// Transactional mode: the handler gets its delivery's transaction
    /// ([`Delivery::tx`](crate::Delivery::tx)); ack commits the handler's writes with the
    /// settlement, any other outcome rolls them back first. Called again, it clears an
    /// [`isolation`](Queue::isolation) setting (whose database the mount would no longer check).
    pub fn transactional(self) -> Queue<F, A, C, Transactional, B, H>
    where
        B: NotBatched,
        H: NoHandlerYet,
    {
        let mut queue = self.with(|f| f, |a| a, |c| c, |b| b, |h| h);
        (queue.isolation, queue.sqlite_mode) = (None, None);
        queue
    }

    /// Runs the service's own SQL for `event` in place of the crate's statement: in the claim's
    /// transaction (row lock), on the session holding the key before it is released (advisory
    /// lock), or — lease form — in a transaction that first confirms the row still carries the
    /// delivery's token (else the settlement fails with [`Error::LeaseLost`](crate::Error) and
    /// nothing runs).
    ///
    /// The statement takes the markers `:id` (the row's id), `:token` (the lease token),
    /// `:at` (the `retry_after` time of a retry_after), `:dead` (the dead-letter group), `:now`
    /// and `:group` (the queue's group), each bound as a parameter. It replaces the crate's
    /// statement entirely: an ack should delete or mark the row, and in the lease form a retry
    /// should clear the lease, or the row stays held until its lease expires. It is one
    /// statement (one trailing `;` is dropped); a `;` or a marker inside a string, a quoted name
    /// or a comment is text. A second statement, an unknown marker, or a statement the database
    /// will not prepare is an error at [`Runner::start`](crate::Runner::start)
    /// ([`Error::Declaration`](crate::Error::Declaration) naming the event, or
    /// [`Error::Schema`](crate::Error::Schema)).
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx_queue::{Event, Queue, Table};
    ///
    /// let queue = Queue::table(Table::new("jobs"))
    ///     .lease("locked_until")
    ///     .custom(Event::Ack, "UPDATE jobs SET done_at = :now, locked_until = NULL WHERE id = :id");
    /// # let _ = queue;
    /// ```
    pub fn custom(mut self, event: Event, sql: impl Into<String>) -> Self {
        self.custom.retain(|(e, _)| *e != event);
        self.custom.push((event, sql.into()));
        self
    }

    /// How the deliveries' transactions run: on PostgreSQL and MySQL/MariaDB an [`Isolation`]
    /// level (default [`Isolation::ReadCommitted`]), on SQLite a [`SqliteMode`] (default
    /// [`SqliteMode::Deferred`]). The setting's type is checked against the handler's database
    /// when the queue is mounted: an `Isolation` on SQLite, or a `SqliteMode` elsewhere, does not
    /// compile. Called again, the last setting holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx::Sqlite;
    /// use sqlx_queue::{Delivery, Outcome, Queue, SqliteMode, Table, Transactional};
    ///
    /// let queue = Queue::table(Table::new("jobs"))
    ///     .lease("locked_until")
    ///     .transactional()
    ///     .isolation(SqliteMode::Immediate)
    ///     .handler(|_: Delivery<Sqlite, Transactional>| async { Outcome::ack() });
    /// # let _ = queue;
    /// ```
    pub fn isolation<L>(self, setting: L) -> Queue<F, A, C, Isolated<L>, B, H>
    where
        M: TransactionalQueue,
        L: TransactionSetting,
    {
        let mut queue = self.with(|f| f, |a| a, |c| c, |b| b, |h| h);
        setting.set(&mut queue.isolation, &mut queue.sqlite_mode);
        queue
    }
}
