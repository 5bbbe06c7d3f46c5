//! A delivery of one row to its handler, and the outcome the handler settles it with.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

mod cancel;

use crate::backend::{Backend, HeldConn};
use crate::table::Headers;
pub(crate) use cancel::Cancel;

mod sealed {
    pub trait Sealed {}
}

/// The default mode: the handler gets the row, not the transaction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Plain;

/// Transactional mode: the handler writes through its delivery's transaction, which commits
/// with the acknowledgement or not at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct Transactional;

/// Transactional mode whose transactions' isolation the queue sets
/// ([`Queue::isolation`](crate::Queue::isolation)): `L` is [`Isolation`](crate::Isolation) or
/// [`SqliteMode`](crate::SqliteMode), checked against the database at mount.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Isolated<L>(std::marker::PhantomData<fn() -> L>);

impl sealed::Sealed for Plain {}
impl sealed::Sealed for Transactional {}
impl<L> sealed::Sealed for Isolated<L> {}

/// A delivery mode: [`Plain`] or [`Transactional`].
pub trait Mode: sealed::Sealed + Send + Sync + 'static {
    #[doc(hidden)]
    const TRANSACTIONAL: bool;
}
impl Mode for Plain {
    const TRANSACTIONAL: bool = false;
}
impl Mode for Transactional {
    const TRANSACTIONAL: bool = true;
}
impl<L: 'static> Mode for Isolated<L> {
    const TRANSACTIONAL: bool = true;
}

/// A queue whose deliveries carry their transaction.
#[diagnostic::on_unimplemented(
    message = "`tx()` needs a transactional queue",
    label = "this delivery's queue has no transaction to lend",
    note = "add `.transactional()` to the queue, and take `Delivery<DB, Transactional>` in the handler"
)]
pub trait TransactionalMode: Mode {}
impl TransactionalMode for Transactional {}

/// The slot a transactional delivery's transaction lives in. The runner keeps the other handle:
/// when the handler ends it takes the transaction back, and finds it still lent if the delivery
/// (or a [`Tx`]) escaped into another task.
pub(crate) type TxSlot<DB> = Arc<tokio::sync::Mutex<Option<HeldConn<DB>>>>;

/// One row handed to a handler: its id, payload, attempt count and [headers](Delivery::headers),
/// owned, so the handler's future can be spawned.
///
/// `M` is the queue's mode: [`Plain`] (the default) or
/// [`Transactional`](crate::Transactional), whose deliveries lend their transaction through
/// [`tx`](Delivery::tx).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx::Sqlite;
/// use sqlx_queue::{Delivery, Outcome};
///
/// async fn resize(image: Delivery<Sqlite>) -> Outcome {
///     match image.payload() {
///         [] => Outcome::drop(), // nothing to resize: leave the queue
///         _ if image.attempt() < 5 => Outcome::retry_after(Duration::from_secs(30)),
///         _ => Outcome::ack(),
///     }
/// }
/// ```
pub struct Delivery<DB: Backend, M: Mode = Plain> {
    pub(crate) id: i64,
    pub(crate) payload: Vec<u8>,
    pub(crate) attempt: u32,
    pub(crate) group: Option<Arc<str>>,
    pub(crate) headers: Headers,
    pub(crate) tx: Option<TxSlot<DB>>,
    pub(crate) cancel: Cancel,
    pub(crate) mode: PhantomData<fn() -> M>,
}

impl<DB: Backend, M: Mode> Delivery<DB, M> {
    pub(crate) fn new(
        id: i64,
        payload: Vec<u8>,
        attempt: u32,
        group: Option<Arc<str>>,
        headers: Headers,
        tx: Option<TxSlot<DB>>,
        cancel: Cancel,
    ) -> Self {
        Delivery {
            id,
            payload,
            attempt,
            group,
            headers,
            tx,
            cancel,
            mode: PhantomData,
        }
    }

    /// The row's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The row's payload, byte for byte.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Takes the payload out of the delivery.
    pub fn into_payload(self) -> Vec<u8> {
        self.payload
    }

    /// Which delivery of the row this is: 1 on the first, 2 on the first retry, and so on.
    ///
    /// Counted in the row's attempt column (`.attempt(..)`); always 1 on a queue without one.
    /// The crate keeps no backoff policy: a handler computes its own from this count.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The queue's group value (its [`named`](crate::Queue::named) value), on a table with a group
    /// column.
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Completes when the delivery is cancelled: its job was cancelled
    /// ([`Queue::cancel`](crate::Queue::cancel)), its lease was lost, or the runner's shutdown
    /// timeout passed with the handler still running. Owned (it borrows nothing of the
    /// delivery), so a handler can `select!` on it while it writes through
    /// [`tx`](Delivery::tx), or move it into a task it spawns.
    ///
    /// When it completes, the delivery's settlement will change nothing — the row is gone, or
    /// belongs to another claim or the next one — and in transactional mode nothing the handler
    /// wrote commits: stop and return. When it fires and how soon:
    ///
    /// | cause | when |
    /// |---|---|
    /// | the job cancelled, lease form | PostgreSQL, a runner listening (`.listen_notify()`): at once; else at the lease's next renewal: within half the lease duration |
    /// | the job cancelled, row lock and advisory forms | PostgreSQL: at once; else at the runner's next read of requests (its poll interval) |
    /// | the lease lost | at the renewal that finds it lost |
    /// | shutdown timeout | at the timeout, just before the handler's future is dropped: what the handler spawned can stop on it |
    ///
    /// Each delivery of a batch has its own: a cancelled row's fires alone (all of them at the
    /// shutdown timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// use sqlx::Sqlite;
    /// use sqlx_queue::{Delivery, Outcome};
    ///
    /// async fn render(d: Delivery<Sqlite>) -> Outcome {
    ///     let work = async { /* a long render */ };
    ///     tokio::select! {
    ///         () = work => Outcome::ack(),
    ///         () = d.cancelled() => Outcome::retry(), // changes nothing: the job was cancelled
    ///     }
    /// }
    /// ```
    pub fn cancelled(&self) -> impl Future<Output = ()> + Send + 'static {
        self.cancel.cancelled()
    }

    /// Whether the delivery is cancelled already (see [`cancelled`](Delivery::cancelled)).
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The value of the job's header `key` ([`Job::header`](crate::Job::header)), byte for byte
    /// as enqueued; `None` when the job did not carry it or the table has no
    /// [headers](crate::Table::headers) column.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.get(key)
    }

    /// All the job's headers, in key order (empty when it carried none).
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Decodes the payload as JSON.
    ///
    /// # Errors
    ///
    /// The payload is not JSON of type `T`.
    #[cfg(feature = "json")]
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.payload)
    }

    /// Lends the delivery's transaction: `&mut *d.tx()` is an executor wherever sqlx takes one.
    /// What the handler writes through it commits with the acknowledgement, or not at all.
    ///
    /// Exists only on a [`.transactional()`](crate::Queue::transactional) queue's deliveries.
    ///
    /// Keep the [`Tx`] (and the delivery) inside the handler: a delivery still held elsewhere
    /// when the handler's future ends — moved into a spawned task, say — makes the settlement
    /// fail with [`Error::TransactionHeld`](crate::Error::TransactionHeld), and nothing commits.
    ///
    /// # Panics
    ///
    /// The transaction is gone: the delivery escaped its handler and the runner has taken the
    /// transaction back to roll it back.
    pub fn tx(&mut self) -> Tx<'_, DB>
    where
        M: TransactionalMode,
    {
        let slot = self
            .tx
            .as_ref()
            .expect("a transactional delivery carries its transaction");
        let guard = slot
            .try_lock()
            .expect("the runner holds the transaction only after the handler ended");
        assert!(
            guard.is_some(),
            "the delivery outlived its handler: its transaction was rolled back"
        );
        Tx { guard }
    }
}

impl<DB: Backend, M: Mode> fmt::Debug for Delivery<DB, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.id)
            .field("attempt", &self.attempt)
            .field("group", &self.group)
            .field("payload_len", &self.payload.len())
            .field("headers", &self.headers.len())
            .field("transactional", &M::TRANSACTIONAL)
            .finish()
    }
}

/// A transactional delivery's transaction, lent to the handler: it dereferences to the
/// database's connection, so `&mut *tx` runs statements inside the transaction.
pub struct Tx<'d, DB: Backend> {
    guard: tokio::sync::MutexGuard<'d, Option<HeldConn<DB>>>,
}

impl<DB: Backend> Deref for Tx<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.guard.as_ref().expect("checked when lent")
    }
}

impl<DB: Backend> DerefMut for Tx<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.as_mut().expect("checked when lent")
    }
}

impl<DB: Backend> fmt::Debug for Tx<'_, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tx")
    }
}

/// How a delivery is settled: the handler's verdict on its row.
///
/// | outcome | the row |
/// |---|---|
/// | [`ack`](Outcome::ack) | deleted, or marked `processed_at` |
/// | [`drop`](Outcome::drop) | the same as ack: a poison message leaves the queue |
/// | [`retry`](Outcome::retry) | returned to the queue at once, its attempt counted |
/// | [`retry_after`](Outcome::retry_after) | returned, claimable again after the delay |
/// | [`dead_letter`](Outcome::dead_letter) | moved to the queue's dead letter |
/// | [`fail`](Outcome::fail) (an `Err`, a panic) | returned after the queue's [backoff](crate::Queue::backoff) |
///
/// At the queue's `max_attempts`, a retry, retry_after or fail moves the row to its dead letter
/// instead.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sqlx_queue::{Backoff, Outcome};
///
/// let sent = false;
/// let attempt = 3;
/// let outcome = if sent { Outcome::ack() } else { Outcome::retry_after(Backoff::default().delay(attempt)) };
/// assert_ne!(outcome, Outcome::ack());
/// assert_eq!(Outcome::retry_after(Duration::ZERO), Outcome::retry_after(Duration::ZERO));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an outcome settles a delivery only when the handler returns it"]
pub struct Outcome(pub(crate) Settle);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    Ack,
    Drop,
    Retry,
    RetryAfter(Duration),
    DeadLetter,
    /// The payload (or, in row mode, the row) did not decode: dead letter where the queue has
    /// one, else drop.
    Undecodable,
    /// The delivery failed (its handler returned an error, or panicked): retried after the
    /// queue's backoff, or moved to its dead letter at the cap — the policy turns it into one
    /// of those before any form settles it (a form treats it as a retry at once).
    Fail,
}

impl Outcome {
    /// The row is done: delete it, or mark it processed.
    pub fn ack() -> Self {
        Outcome(Settle::Ack)
    }

    /// The row cannot be handled and should not be retried: it leaves the queue as with ack.
    pub fn drop() -> Self {
        Outcome(Settle::Drop)
    }

    /// Return the row to the queue at once; its attempt is counted.
    pub fn retry() -> Self {
        Outcome(Settle::Retry)
    }

    /// Return the row to the queue, claimable again after `delay` (a column of the row, so the
    /// delay survives a restart). On a table without a `retry_after` column this is
    /// [`retry`](Outcome::retry), with a warning.
    pub fn retry_after(delay: Duration) -> Self {
        Outcome(Settle::RetryAfter(delay))
    }

    /// Move the row to the queue's dead letter now, whatever its attempt (a queue without a dead
    /// letter drops it, with an error in the log).
    pub fn dead_letter() -> Self {
        Outcome(Settle::DeadLetter)
    }

    /// The delivery failed: return the row after the queue's
    /// [backoff](crate::Queue::backoff) — 2 s after the first delivery, doubling up to an hour,
    /// with jitter, by default — or move it to its dead letter at `max_attempts`. What an
    /// `Err` from a handler and a panic become. On a table without a `retry_after` column the
    /// row returns at once (`Runner::start` warns of it).
    pub fn fail() -> Self {
        Outcome(Settle::Fail)
    }

    pub(crate) fn name(self) -> &'static str {
        match self.0 {
            Settle::Ack => "ack",
            Settle::Drop => "drop",
            Settle::Retry => "retry",
            Settle::RetryAfter(_) => "retry_after",
            Settle::DeadLetter => "dead_letter",
            Settle::Undecodable => "undecodable",
            Settle::Fail => "fail",
        }
    }
}
