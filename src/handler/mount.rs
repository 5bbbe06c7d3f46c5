//! Where a runner takes a queue: a complete queue gives its plain configuration and its handler.
//! The trait sits with the handler traits, above the configuration, because its handler's bound
//! is part of it: a queue returned as `impl Mount<DB>` mounts without naming that bound.

use super::Handling;
use crate::backend::Backend;
use crate::config::QueueConfig;

pub(crate) mod sealed {
    /// Sealed: only this crate's queues are mounted.
    pub trait Sealed {}
}

/// A queue ready to mount on a [`Runner`](crate::Runner) of database `DB`: implemented by a
/// [`Queue`](crate::Queue) whose declaration is complete — one claim form the database has, a
/// handler of its deliveries, a dead letter where it has `max_attempts`. The runner takes a
/// queue through it and never sees the builder's states.
#[diagnostic::on_unimplemented(
    message = "this queue cannot be mounted on a `{DB}` runner",
    label = "an incomplete queue, or one for another database",
    note = "a queue needs one claim form the database has, a handler taking `Delivery<{DB}, ..>`, \
            and a dead letter where it has `max_attempts`"
)]
pub trait Mount<DB: Backend>: sealed::Sealed {
    /// The queue's handler.
    #[doc(hidden)]
    type Handler: Handling<DB>;

    /// The queue's configuration and its handler.
    #[doc(hidden)]
    fn into_parts(self) -> (QueueConfig, Self::Handler);
}
