//! The builder's entry points for handlers, one per shape, each gated on the queue's state and
//! bound by its handler trait ([`crate::handler`]).

use super::Queue;
use super::state::{BatchedDeliveries, NoHandlerYet, NotTransactional, SingleDeliveries};
use crate::backend::Backend;
use crate::delivery::Mode;
use crate::handler::{BatchHandler, Handler, Handles, HandlesBatches, HandlesRows, RowHandler};
#[cfg(feature = "json")]
use crate::handler::{HandlesJson, JsonHandler};

impl<F, A, C, M, B, H> Queue<F, A, C, M, B, H> {
    /// The handler: an `async fn(Delivery<DB, M>) -> Outcome` (or a closure returning an
    /// `async move` block), called once per delivery ([`Handler`]). It may return anything that
    /// is [`IntoOutcome`](crate::state::IntoOutcome), such as `Result<(), E>`. Its deliveries are the
    /// queue's: `Delivery<DB>` on a plain queue, `Delivery<DB, Transactional>` on a
    /// [`transactional`](Queue::transactional) one.
    pub fn handler<DB, HM, Fun>(self, f: Fun) -> Queue<F, A, C, M, B, Handles<DB, HM, Fun>>
    where
        DB: Backend,
        HM: Mode,
        B: SingleDeliveries,
        H: NoHandlerYet,
        Fun: Handler<DB, HM>,
    {
        self.with(|f| f, |a| a, |c| c, |b| b, |_| Handles::new(f))
    }

    /// A handler of JSON payloads: each payload is decoded into `T` first, and the handler gets
    /// the value and its delivery. A payload that does not decode never reaches the handler: it
    /// is logged as an error and moved to the queue's dead letter, or dropped when the queue has
    /// none (its delivery counted its attempt like any other).
    #[cfg(feature = "json")]
    pub fn json_handler<DB, HM, T, Fun>(
        self,
        f: Fun,
    ) -> Queue<F, A, C, M, B, HandlesJson<DB, HM, T, Fun>>
    where
        DB: Backend,
        HM: Mode,
        B: SingleDeliveries,
        H: NoHandlerYet,
        T: serde::de::DeserializeOwned + Send + 'static,
        Fun: JsonHandler<DB, HM, T>,
    {
        self.with(|f| f, |a| a, |c| c, |b| b, |_| HandlesJson::new(f))
    }

    /// A handler in row mode: the runner reads the claimed row whole (`SELECT *` by id, one more
    /// round trip per delivery, where the form holds the row, and in a transactional delivery's
    /// transaction) and decodes it into the service's own [`sqlx::FromRow`] type `T`
    /// (`#[derive(sqlx::FromRow)]` with sqlx's `derive` feature, or by hand); the handler gets
    /// the value and its delivery. A row that does not decode is settled as an undecodable JSON
    /// payload is: logged as an error and moved to the queue's dead letter, or dropped when the
    /// queue has none.
    ///
    /// The row is as the claim left it: its attempt column may already count this delivery
    /// (lease form; advisory on PostgreSQL and SQLite) or not yet (row lock):
    /// [`Delivery::attempt`](crate::Delivery::attempt) is the delivery's number on every form.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::SqlitePool) -> sqlx_queue::Result<()> {
    /// use sqlx::Row as _;
    /// use sqlx::sqlite::SqliteRow;
    /// use sqlx_queue::{Delivery, Outcome, Queue, Runner, Table};
    ///
    /// struct Email {
    ///     id: i64,
    ///     recipient: String, // a column of the service's own
    /// }
    ///
    /// impl sqlx::FromRow<'_, SqliteRow> for Email {
    ///     fn from_row(row: &SqliteRow) -> sqlx::Result<Self> {
    ///         Ok(Email { id: row.try_get("id")?, recipient: row.try_get("recipient")? })
    ///     }
    /// }
    ///
    /// let queue = Queue::table(Table::new("emails"))
    ///     .lease("locked_until")
    ///     .row_handler(|email: Email, _: Delivery<sqlx::Sqlite>| async move {
    ///         println!("row {} to {}", email.id, email.recipient);
    ///         Outcome::ack()
    ///     });
    /// let running = Runner::new(pool).mount(queue).start().await?;
    /// # running.shutdown().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn row_handler<DB, HM, T, Fun>(
        self,
        f: Fun,
    ) -> Queue<F, A, C, M, B, HandlesRows<DB, HM, T, Fun>>
    where
        DB: Backend,
        HM: Mode,
        B: SingleDeliveries,
        H: NoHandlerYet,
        T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
        Fun: RowHandler<DB, HM, T>,
    {
        self.with(|f| f, |a| a, |c| c, |b| b, |_| HandlesRows::new(f))
    }

    /// The batch handler: takes the rows of one claim together and returns one outcome per row,
    /// in the same order.
    pub fn batch_handler<DB, Fun>(self, f: Fun) -> Queue<F, A, C, M, B, HandlesBatches<DB, Fun>>
    where
        DB: Backend,
        M: NotTransactional,
        B: BatchedDeliveries,
        H: NoHandlerYet,
        Fun: BatchHandler<DB>,
    {
        self.with(|f| f, |a| a, |c| c, |b| b, |_| HandlesBatches::new(f))
    }
}
