//! The DDL of every table a runner's queues and schedules need.

use super::Runner;
use crate::backend::Backend;
use crate::dialect::schema::Plan;
use crate::enqueue::Schema;
use crate::error::Result;

impl<DB: Backend> Runner<DB> {
    /// The statements that create every table this runner's queues and schedules need on `DB`,
    /// each once: a table several queues share gets one `CREATE TABLE` with the columns of all
    /// their roles; then the dead-letter tables, the cancel requests' and limiter tables, the
    /// schedules table ([`schedules_table`](Runner::schedules_table)) and each schedule's job
    /// table (with its unique key). See [`Schema`].
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> sqlx_queue::Result<()> {
    /// use sqlx::{Sqlite, sqlite::SqlitePoolOptions};
    /// use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
    ///
    /// async fn send(_: Delivery<Sqlite>) -> Outcome {
    ///     Outcome::ack()
    /// }
    ///
    /// let pool = SqlitePoolOptions::new().max_connections(4).connect("sqlite::memory:").await?;
    /// let emails = Queue::table(Table::new("email_jobs")).lease("locked_until");
    /// let runner = Runner::new(pool.clone()).mount(emails.clone().handler(send));
    /// runner.schema()?.create(&pool).await?;
    /// emails.enqueue(&pool, Job::new("alice@example.com")).await?;
    /// let running = runner.start().await?;
    /// running.shutdown().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Queue::schema`](crate::Queue::schema): [`Error::Identifier`](crate::Error::Identifier)
    /// for a name that cannot be quoted, [`Error::Declaration`](crate::Error::Declaration) for a
    /// column named in two roles of different types (by two queues of one table, say).
    pub fn schema(&self) -> Result<Schema> {
        let mut plan = Plan::default();
        for (config, _) in &self.queues {
            plan.mounted(config)?;
        }
        for scheduled in &self.schedules {
            plan.queue(scheduled.table(), None, None)?;
        }
        if !self.schedules.is_empty() {
            plan.schedules(&self.schedules_table)?;
        }
        Schema::of(DB::DIALECT, &plan)
    }
}
