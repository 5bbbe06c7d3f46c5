//! A queue's rate limit, across every runner: the builder's side.

use super::Queue;
use crate::config::RateLimit;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// At most `limit.n` deliveries started per `limit.per` ([`RateLimit`]), counted by the
    /// database for every runner and process serving this queue: a token bucket in one row of
    /// the table's limiter table ([`Table::limits`](crate::Table::limits)), refilled at
    /// `n / per` by the database's clock and holding at most the limit's burst of tokens. Each
    /// claim first takes up to as many tokens as it would take rows, in one statement, and
    /// claims no more rows than it got; tokens of rows it did not find go back. With none
    /// granted, the queue sleeps until the tokens are due. Every claim form and batches (a
    /// batch takes a token per row).
    ///
    /// A missing limiter table is an [`Error::Declaration`](crate::Error::Declaration) at
    /// [`Runner::start`](crate::Runner::start), a table without the columns an
    /// [`Error::Schema`](crate::Error::Schema); the queue's row is created on first use.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqlx_queue::{Queue, RateLimit, Table};
    ///
    /// let queue = Queue::table(Table::new("email_jobs").limits("job_limits"))
    ///     .lease("locked_until")
    ///     .rate_limit(RateLimit::new(200, Duration::from_secs(1)).burst(10));
    /// # let _ = queue;
    /// ```
    pub fn rate_limit(mut self, limit: RateLimit) -> Self {
        self.rate = Some(limit);
        self
    }
}
