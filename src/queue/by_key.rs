//! Per-key order inside one process: the builder's side.

use super::Queue;
use crate::config::ByKey;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// Routes each row to the worker its key hashes to ([`ByKey`]: the table's group column, or
    /// a column of the rows' own): within this process the rows of one key start one after the
    /// other, in the order they were claimed (id order), never two at once, while rows of other
    /// keys run in parallel on the queue's other [`workers`](Queue::workers) (default 1: give
    /// it `.workers(n)`, or every key shares one lane).
    ///
    /// It costs nothing on the database: the claim is the form's own, and reads the key column
    /// with the row. It promises nothing across processes (use [`fifo`](Queue::fifo) for that).
    /// Two keys that hash to one worker share it, so a slow key delays the keys of its worker
    /// only; the others keep flowing. A retried row runs when it is due and claimed again,
    /// after the rows of its key claimed meanwhile. The guide's [per-key order inside one
    /// process](crate::guide::order#per-key-order-inside-one-process) says what is and is not guaranteed, per form.
    ///
    /// Refused at [`Runner::start`](crate::Runner::start)
    /// ([`Error::Declaration`](crate::Error::Declaration)): with
    /// [`batch`](Queue::batch), with [`fifo`](Queue::fifo) or [`per_group`](Queue::per_group),
    /// with a [`rate_limit`](Queue::rate_limit), by the group on a table without a group
    /// column, and by the group on a named queue (every row would share one key).
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx::Postgres;
    /// use sqlx_queue::{ByKey, Delivery, Outcome, Queue, Table};
    ///
    /// // One account's jobs one after the other, eight accounts at once.
    /// let queue = Queue::table(Table::new("jobs"))
    ///     .lease("locked_until")
    ///     .workers(8)
    ///     .by_key(ByKey::column("account_id"))
    ///     .handler(|_: Delivery<Postgres>| async { Outcome::ack() });
    /// # let _ = queue;
    /// ```
    pub fn by_key(mut self, key: ByKey) -> Self {
        self.by_key = Some(key);
        self
    }
}
