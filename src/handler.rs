//! What a queue calls with its deliveries: the handler shapes a service writes, each one bound
//! written once — a trait with a blanket impl for the matching functions and closures — and the
//! calls the runner makes through them, decoding included.
//!
//! | shape | entry point | the service writes |
//! |---|---|---|
//! | [`Handler`] | [`Queue::handler`](crate::Queue::handler) | `async fn(Delivery<DB, M>) -> impl IntoOutcome` |
//! | [`JsonHandler`] | [`Queue::json_handler`](crate::Queue::json_handler) | `async fn(T, Delivery<DB, M>) -> impl IntoOutcome`, `T: Deserialize` |
//! | [`RowHandler`] | [`Queue::row_handler`](crate::Queue::row_handler) | `async fn(T, Delivery<DB, M>) -> impl IntoOutcome`, `T: FromRow` |
//! | [`BatchHandler`] | [`Queue::batch_handler`](crate::Queue::batch_handler) | `async fn(Vec<Delivery<DB>>) -> Vec<Outcome>` |
//!
//! The handler states a queue holds, and their calls, are apart in `states`.

mod mount;
mod states;

use std::fmt;
use std::future::Future;

use crate::backend::Backend;
use crate::delivery::{Delivery, Mode, Outcome, Plain};

pub use mount::Mount;
pub(crate) use mount::sealed as mount_sealed;
#[cfg(feature = "json")]
pub use states::HandlesJson;
pub use states::{Handles, HandlesBatches, HandlesRows};

/// What a handler may return: an [`Outcome`], or a value that converts into one.
///
/// | returned | outcome |
/// |---|---|
/// | `Outcome` | itself |
/// | `()` | ack |
/// | `Ok(())` | ack |
/// | `Ok(outcome)` | `outcome` |
/// | `Err(e)` | [`Outcome::fail`]: retried after the queue's [backoff](crate::Queue::backoff), `e` logged as a warning |
pub trait IntoOutcome {
    /// Converts into the outcome that settles the delivery.
    fn into_outcome(self) -> Outcome;
}

impl IntoOutcome for Outcome {
    fn into_outcome(self) -> Outcome {
        self
    }
}

impl IntoOutcome for () {
    fn into_outcome(self) -> Outcome {
        Outcome::ack()
    }
}

impl<E: fmt::Display> IntoOutcome for Result<(), E> {
    fn into_outcome(self) -> Outcome {
        self.map(|()| Outcome::ack()).into_outcome()
    }
}

impl<E: fmt::Display> IntoOutcome for Result<Outcome, E> {
    fn into_outcome(self) -> Outcome {
        match self {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(%error, "handler failed; the delivery is retried after the queue's backoff");
                Outcome::fail()
            }
        }
    }
}

/// A handler of single deliveries: an `async fn(Delivery<DB, M>)` (or a closure returning an
/// `async move` block) whose output is [`IntoOutcome`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler of `Delivery<{DB}, {M}>`",
    label = "not an `async fn(Delivery<{DB}, {M}>) -> Outcome`",
    note = "a handler takes one delivery and returns a future of an `Outcome`, `()` or a \
            `Result` (see `IntoOutcome`); it must be `Send + Sync + 'static`, and so must its \
            future"
)]
pub trait Handler<DB: Backend, M: Mode>: Send + Sync + 'static {
    #[doc(hidden)]
    fn call(&self, delivery: Delivery<DB, M>) -> impl Future<Output = Outcome> + Send + 'static;
}

#[diagnostic::do_not_recommend]
impl<DB, M, F, Fut> Handler<DB, M> for F
where
    DB: Backend,
    M: Mode,
    F: Fn(Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn call(&self, delivery: Delivery<DB, M>) -> impl Future<Output = Outcome> + Send + 'static {
        let future = self(delivery);
        async move { future.await.into_outcome() }
    }
}

/// A handler of JSON payloads: an `async fn(T, Delivery<DB, M>)` that gets each payload decoded
/// into `T` first.
#[cfg(feature = "json")]
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler of `{T}` and `Delivery<{DB}, {M}>`",
    label = "not an `async fn({T}, Delivery<{DB}, {M}>) -> Outcome`",
    note = "a JSON handler takes the decoded payload and its delivery, and returns a future of \
            an `Outcome`, `()` or a `Result`; `T` must be `DeserializeOwned + Send + 'static`"
)]
pub trait JsonHandler<DB: Backend, M: Mode, T>: Send + Sync + 'static {
    #[doc(hidden)]
    fn call(
        &self,
        value: T,
        delivery: Delivery<DB, M>,
    ) -> impl Future<Output = Outcome> + Send + 'static;
}

#[cfg(feature = "json")]
#[diagnostic::do_not_recommend]
impl<DB, M, T, F, Fut> JsonHandler<DB, M, T> for F
where
    DB: Backend,
    M: Mode,
    T: serde::de::DeserializeOwned + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn call(
        &self,
        value: T,
        delivery: Delivery<DB, M>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let future = self(value, delivery);
        async move { future.await.into_outcome() }
    }
}

/// A handler in row mode: an `async fn(T, Delivery<DB, M>)` that gets the claimed row whole, as
/// the service's own [`sqlx::FromRow`] type `T`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler of `{T}` and `Delivery<{DB}, {M}>`",
    label = "not an `async fn({T}, Delivery<{DB}, {M}>) -> Outcome`",
    note = "a row handler takes the row, as a `sqlx::FromRow` type, and its delivery, and \
            returns a future of an `Outcome`, `()` or a `Result`"
)]
pub trait RowHandler<DB: Backend, M: Mode, T>: Send + Sync + 'static {
    #[doc(hidden)]
    fn call(
        &self,
        row: T,
        delivery: Delivery<DB, M>,
    ) -> impl Future<Output = Outcome> + Send + 'static;
}

#[diagnostic::do_not_recommend]
impl<DB, M, T, F, Fut> RowHandler<DB, M, T> for F
where
    DB: Backend,
    M: Mode,
    T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
    F: Fn(T, Delivery<DB, M>) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: IntoOutcome,
{
    fn call(
        &self,
        row: T,
        delivery: Delivery<DB, M>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let future = self(row, delivery);
        async move { future.await.into_outcome() }
    }
}

/// A handler of batches: an `async fn(Vec<Delivery<DB>>) -> Vec<Outcome>` that gets the rows of
/// one claim together and returns one outcome per row, in the same order.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler of batches of `Delivery<{DB}>`",
    label = "not an `async fn(Vec<Delivery<{DB}>>) -> Vec<Outcome>`",
    note = "a batch handler takes the deliveries of one claim and returns one outcome per \
            delivery, in order; batches are never transactional"
)]
pub trait BatchHandler<DB: Backend>: Send + Sync + 'static {
    #[doc(hidden)]
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static;
}

#[diagnostic::do_not_recommend]
impl<DB, F, Fut> BatchHandler<DB> for F
where
    DB: Backend,
    F: Fn(Vec<Delivery<DB>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Outcome>> + Send + 'static,
{
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static {
        self(deliveries)
    }
}

/// A mounted queue's handler of single deliveries, as the runner calls it.
pub trait CallOne<DB: Backend>: Send + Sync + 'static {
    /// The mode of the deliveries it takes.
    type Mode: Mode;
    /// Whether it takes the whole row (row mode): the runner reads it and passes it.
    const ROW: bool;

    fn call(
        &self,
        delivery: Delivery<DB, Self::Mode>,
        row: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static;
}

/// A mounted queue's handler of batches, as the runner calls it.
pub trait CallBatch<DB: Backend>: Send + Sync + 'static {
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static;
}

/// The handler of a queue ready to mount: single deliveries or batches, which the runner serves
/// with claim loops of their own. Sealed; implemented by the handler states the builder holds.
#[diagnostic::on_unimplemented(
    message = "the queue has no handler for a `{DB}` runner",
    label = "call `.handler(f)` (or `.batch(n).batch_handler(f)`) with a handler that takes \
             `Delivery<{DB}, ..>` before mounting"
)]
pub trait Handling<DB: Backend>: sealed::Sealed + Send + 'static {
    /// The mode of the deliveries the handler takes. The queue checks it against its own at
    /// mount ([`Serves`]), not when the handler is set: there rustc would settle a closure's mode
    /// from the queue's before reading a function's signature, and report a raw signature
    /// mismatch (E0631) instead of naming `.transactional()`.
    #[doc(hidden)]
    type Mode: Mode;
    #[doc(hidden)]
    fn accept<V: sealed::Visit<DB>>(self, visit: V) -> V::Output;
}

pub(crate) mod sealed {
    use super::{Backend, CallBatch, CallOne};

    pub trait Sealed {}

    /// What the runner does with a handler of each kind.
    pub trait Visit<DB: Backend> {
        type Output;
        #[allow(private_bounds)]
        fn one<H: CallOne<DB>>(self, handler: H) -> Self::Output;
        #[allow(private_bounds)]
        fn batch<H: CallBatch<DB>>(self, handler: H) -> Self::Output;
    }
}

/// A handler mode that serves a queue of mode `Self`: the same mode.
#[diagnostic::on_unimplemented(
    message = "this handler takes `Delivery<_, {H}>`, but the queue's deliveries are \
               `Delivery<_, {Self}>`",
    label = "the handler's deliveries are not this queue's",
    note = "a handler of `Delivery<DB, Transactional>` needs `.transactional()` on the queue \
            (before the handler); a handler of `Delivery<DB>` needs a queue without it"
)]
pub trait Serves<H: Mode>: Mode {}
impl Serves<Plain> for Plain {}
impl Serves<crate::delivery::Transactional> for crate::delivery::Transactional {}
impl<L: 'static> Serves<crate::delivery::Transactional> for crate::delivery::Isolated<L> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_convert() {
        assert_eq!(Ok::<(), String>(()).into_outcome(), Outcome::ack());
        assert_eq!(Err::<(), _>("boom").into_outcome(), Outcome::fail());
        assert_eq!(
            Ok::<_, String>(Outcome::drop()).into_outcome(),
            Outcome::drop()
        );
        assert_eq!(().into_outcome(), Outcome::ack());
    }
}
