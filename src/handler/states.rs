//! The handler states a queue holds once its handler is set, one per shape, and how each one is
//! called: the decoding handlers decode here, and a value that does not decode never reaches the
//! service. Apart from the traits a service writes against, which read best without them.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;

#[cfg(feature = "json")]
use super::JsonHandler;
use super::{BatchHandler, CallBatch, CallOne, Handler, Handling, RowHandler, sealed};
use crate::backend::Backend;
use crate::delivery::{Delivery, Mode, Outcome, Plain, Settle};

/// The types a handler state is of: the database, the mode, and a decoded value's type.
type Of<DB, M, T = ()> = PhantomData<fn() -> (DB, M, T)>;

/// A handler of single deliveries, as a queue holds it.
pub struct Handles<DB, M, F> {
    f: F,
    types: Of<DB, M>,
}

/// A handler of JSON payloads, as a queue holds it.
#[cfg(feature = "json")]
pub struct HandlesJson<DB, M, T, F> {
    f: F,
    types: Of<DB, M, T>,
}

/// A handler in row mode, as a queue holds it.
pub struct HandlesRows<DB, M, T, F> {
    f: F,
    types: Of<DB, M, T>,
}

/// A handler of batches, as a queue holds it.
pub struct HandlesBatches<DB, F> {
    f: F,
    types: PhantomData<fn() -> DB>,
}

impl<DB, M, F> Handles<DB, M, F> {
    pub(crate) fn new(f: F) -> Self {
        Handles {
            f,
            types: PhantomData,
        }
    }
}

#[cfg(feature = "json")]
impl<DB, M, T, F> HandlesJson<DB, M, T, F> {
    pub(crate) fn new(f: F) -> Self {
        HandlesJson {
            f,
            types: PhantomData,
        }
    }
}

impl<DB, M, T, F> HandlesRows<DB, M, T, F> {
    pub(crate) fn new(f: F) -> Self {
        HandlesRows {
            f,
            types: PhantomData,
        }
    }
}

impl<DB, F> HandlesBatches<DB, F> {
    pub(crate) fn new(f: F) -> Self {
        HandlesBatches {
            f,
            types: PhantomData,
        }
    }
}

macro_rules! debug_as {
    ($name:literal, $ty:ident < $($p:ident),* >) => {
        impl<$($p),*> fmt::Debug for $ty<$($p),*> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($name)
            }
        }
        impl<$($p),*> sealed::Sealed for $ty<$($p),*> {}
    };
}
debug_as!("Handles", Handles<DB, M, F>);
#[cfg(feature = "json")]
debug_as!("HandlesJson", HandlesJson<DB, M, T, F>);
debug_as!("HandlesRows", HandlesRows<DB, M, T, F>);
debug_as!("HandlesBatches", HandlesBatches<DB, F>);

impl<DB: Backend, M: Mode, F: Handler<DB, M>> CallOne<DB> for Handles<DB, M, F> {
    type Mode = M;
    const ROW: bool = false;

    fn call(
        &self,
        delivery: Delivery<DB, M>,
        _: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        self.f.call(delivery)
    }
}

#[cfg(feature = "json")]
impl<DB, M, T, F> CallOne<DB> for HandlesJson<DB, M, T, F>
where
    DB: Backend,
    M: Mode,
    T: serde::de::DeserializeOwned + Send + 'static,
    F: JsonHandler<DB, M, T>,
{
    type Mode = M;
    const ROW: bool = false;

    fn call(
        &self,
        delivery: Delivery<DB, M>,
        _: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let decoded = serde_json::from_slice::<T>(delivery.payload());
        decoded_or_not(
            decoded,
            "the payload is not the handler's JSON type",
            |value| self.f.call(value, delivery),
        )
    }
}

impl<DB, M, T, F> CallOne<DB> for HandlesRows<DB, M, T, F>
where
    DB: Backend,
    M: Mode,
    T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
    F: RowHandler<DB, M, T>,
{
    type Mode = M;
    const ROW: bool = true;

    fn call(
        &self,
        delivery: Delivery<DB, M>,
        row: Option<DB::Row>,
    ) -> impl Future<Output = Outcome> + Send + 'static {
        let decoded = match &row {
            Some(row) => T::from_row(row).map_err(|error| error.to_string()),
            None => Err("no row was read for it".to_owned()),
        };
        decoded_or_not(
            decoded,
            "the row is not the handler's FromRow type",
            |value| self.f.call(value, delivery),
        )
    }
}

impl<DB: Backend, F: BatchHandler<DB>> CallBatch<DB> for HandlesBatches<DB, F> {
    fn call(
        &self,
        deliveries: Vec<Delivery<DB>>,
    ) -> impl Future<Output = Vec<Outcome>> + Send + 'static {
        self.f.call(deliveries)
    }
}

impl<DB: Backend, M: Mode, F: Handler<DB, M>> Handling<DB> for Handles<DB, M, F> {
    type Mode = M;
    fn accept<V: sealed::Visit<DB>>(self, visit: V) -> V::Output {
        visit.one(self)
    }
}

#[cfg(feature = "json")]
impl<DB, M, T, F> Handling<DB> for HandlesJson<DB, M, T, F>
where
    DB: Backend,
    M: Mode,
    T: serde::de::DeserializeOwned + Send + 'static,
    F: JsonHandler<DB, M, T>,
{
    type Mode = M;
    fn accept<V: sealed::Visit<DB>>(self, visit: V) -> V::Output {
        visit.one(self)
    }
}

impl<DB, M, T, F> Handling<DB> for HandlesRows<DB, M, T, F>
where
    DB: Backend,
    M: Mode,
    T: for<'r> sqlx::FromRow<'r, DB::Row> + Send + 'static,
    F: RowHandler<DB, M, T>,
{
    type Mode = M;
    fn accept<V: sealed::Visit<DB>>(self, visit: V) -> V::Output {
        visit.one(self)
    }
}

impl<DB: Backend, F: BatchHandler<DB>> Handling<DB> for HandlesBatches<DB, F> {
    type Mode = Plain;
    fn accept<V: sealed::Visit<DB>>(self, visit: V) -> V::Output {
        visit.batch(self)
    }
}

/// Calls a decoding handler with its decoded value. A value that did not decode never reaches
/// it: logged as `what`, the delivery is settled as undecodable (the decode policy: dead letter,
/// else drop).
fn decoded_or_not<T, E, Fut>(
    decoded: Result<T, E>,
    what: &'static str,
    call: impl FnOnce(T) -> Fut,
) -> impl Future<Output = Outcome> + Send + 'static
where
    E: fmt::Display,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let future = match decoded {
        Ok(value) => Some(call(value)),
        Err(error) => {
            tracing::error!(%error, "{what}");
            None
        }
    };
    async move {
        match future {
            Some(future) => future.await,
            None => Outcome(Settle::Undecodable),
        }
    }
}
