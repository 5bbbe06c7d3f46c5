//! A queue's rate limit, across every runner: the builder's side.

use std::time::Duration;

use super::Queue;
use crate::config::RateLimit;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// At most `n` deliveries started per `per`, counted by the database for every runner and
    /// process serving this queue: a token bucket in one row of the table's limiter table
    /// ([`Table::limits`](crate::Table::limits)), refilled at `n / per` by the database's clock
    /// and holding at most `n` tokens (see [`rate_burst`](Queue::rate_burst)). Each claim first
    /// takes up to as many tokens as it would take rows, in one statement, and claims no more
    /// rows than it got; tokens of rows it did not find go back. With none granted, the queue
    /// sleeps until the tokens are due. Every claim form and batches (a batch takes a token per
    /// row).
    ///
    /// A missing limiter table is an [`Error::Declaration`](crate::Error::Declaration) at
    /// [`Runner::start`](crate::Runner::start), a table without the columns an
    /// [`Error::Schema`](crate::Error::Schema); the queue's row is created on first use.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sqlx_queue::{Queue, Table};
    ///
    /// let queue = Queue::table(Table::new("email_jobs").limits("job_limits"))
    ///     .lease("locked_until")
    ///     .rate_limit(200, Duration::from_secs(1));
    /// # let _ = queue;
    /// ```
    ///
    /// # Panics
    ///
    /// `n` is 0, or `per` is zero.
    #[track_caller]
    pub fn rate_limit(mut self, n: u32, per: Duration) -> Self {
        assert!(
            n > 0,
            "rate_limit needs at least 1 delivery per period, got 0"
        );
        assert!(!per.is_zero(), "rate_limit needs a period longer than zero");
        self.rate = Some(RateLimit::new(n, per));
        self
    }

    /// How many tokens a queue with a [`rate_limit`](Queue::rate_limit) may save while it is
    /// idle, to start at once later (default: `n`, one period's worth). Over any stretch of
    /// time `t` the queue starts at most `burst + n × t / per` deliveries; a burst of 1 spaces
    /// every start evenly.
    ///
    /// # Panics
    ///
    /// `burst` is 0, or no [`rate_limit`](Queue::rate_limit) was declared before.
    #[track_caller]
    pub fn rate_burst(mut self, burst: u32) -> Self {
        assert!(burst > 0, "rate_burst must be at least 1");
        let rate = self
            .rate
            .as_mut()
            .expect("rate_burst needs a `.rate_limit(n, per)` first");
        rate.burst = burst;
        self
    }
}
