//! The DDL of a declared queue's tables.

use super::Queue;
use super::state::{AttemptState, CapState, FormState};
use crate::backend::Backend;
use crate::dialect::schema::Plan;
use crate::enqueue::Schema;
use crate::error::Result;

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H>
where
    F: FormState,
    A: AttemptState,
    C: CapState,
{
    /// The statements that create this queue's tables on `DB` as it is declared: the queue
    /// table with a column for each role the table, the claim form (the lease column) and the
    /// attempt count declare, and the claim's and unique key's indexes; its dead-letter table
    /// (the same columns); the cancel requests' and limiter tables its table names. See
    /// [`Schema`]; [`Runner::schema`](crate::Runner::schema) gives every table of a runner's
    /// queues and schedules.
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx::Postgres;
    /// use sqlx_queue::{DeadLetter, Queue, Table};
    ///
    /// let jobs = Table::new("signup_jobs").group("queue").retry_after("retry_after");
    /// let signups = Queue::table(jobs)
    ///     .named("signups")
    ///     .lease("locked_until")
    ///     .attempt("attempt")
    ///     .max_attempts(5)
    ///     .dead_letter(DeadLetter::table("signup_jobs_dead"));
    /// let schema = signups.schema::<Postgres>()?;
    /// assert!(schema.statements()[0].starts_with(r#"CREATE TABLE IF NOT EXISTS "signup_jobs" ("#));
    /// assert_eq!(schema.statements().len(), 3); // the table, its claim index, the dead letter
    /// # Ok::<(), sqlx_queue::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Identifier`](crate::Error::Identifier) for a name that cannot be quoted (an
    /// index name too: the table's bare name and `_claim`, or `_` and the unique key column);
    /// [`Error::Declaration`](crate::Error::Declaration) for a column named in two roles of
    /// different types.
    pub fn schema<DB: Backend>(&self) -> Result<Schema> {
        let mut plan = Plan::default();
        plan.queue(
            &self.jobs_table(),
            self.attempt.column(),
            self.cap.dead_letter(),
        )?;
        Schema::of(DB::DIALECT, &plan)
    }
}
