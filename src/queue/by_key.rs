//! Per-key order inside one process: the builder's side.

use super::Queue;
use crate::config::ByKey;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// `n` workers, each row going to the worker its key hashes to: within this process the
    /// rows of one key start one after the other, in the order they were claimed (id order),
    /// never two at once, while rows of other keys run in parallel on the other workers. The key
    /// is the table's [group](crate::Table::group) column (the queue then stays unnamed and
    /// serves every group), or the column named by [`key_column`](Queue::key_column).
    ///
    /// It costs nothing on the database: the claim is the form's own, and reads the key column
    /// with the row. It promises nothing across processes (use [`fifo`](Queue::fifo) for that).
    /// Two keys that hash to one worker share it, so a slow key delays the keys of its worker
    /// only; the others keep flowing. A retried row runs when it is due and claimed again,
    /// after the rows of its key claimed meanwhile. The README's "Per-key order inside one
    /// process" says what is and is not guaranteed, per form.
    ///
    /// Refused at [`Runner::start`](crate::Runner::start)
    /// ([`Error::Declaration`](crate::Error::Declaration)): with
    /// [`batch`](Queue::batch), with [`fifo`](Queue::fifo) or [`per_group`](Queue::per_group),
    /// on a table without a group column and no `key_column`, and on a named queue keyed by
    /// its group (every row would share one key).
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx::Postgres;
    /// use sqlx_queue::{Delivery, Outcome, Queue, Table};
    ///
    /// // One account's jobs one after the other, eight accounts at once.
    /// let queue = Queue::table(Table::new("jobs"))
    ///     .lease("locked_until")
    ///     .workers_by_key(8)
    ///     .key_column("account_id")
    ///     .handler(|_: Delivery<Postgres>| async { Outcome::ack() });
    /// # let _ = queue;
    /// ```
    ///
    /// # Panics
    ///
    /// `n` is 0 or more than 10,000 (as [`workers`](Queue::workers)).
    #[track_caller]
    pub fn workers_by_key(mut self, n: usize) -> Self {
        self = self.workers(n);
        self.by_key.get_or_insert_with(ByKey::default);
        self
    }

    /// The column [`workers_by_key`](Queue::workers_by_key) reads each row's key from (default:
    /// the table's group column): any type the database casts to text; rows whose key is NULL
    /// share one key.
    ///
    /// # Panics
    ///
    /// No [`workers_by_key`](Queue::workers_by_key) was declared before.
    #[track_caller]
    pub fn key_column(mut self, column: impl Into<String>) -> Self {
        let by_key = self
            .by_key
            .as_mut()
            .expect("key_column needs a `.workers_by_key(n)` first");
        by_key.column = Some(column.into());
        self
    }
}
