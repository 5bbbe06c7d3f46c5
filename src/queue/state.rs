//! The states of the [`Queue`](crate::Queue) builder and the gates between them.
//!
//! Each state is a type carrying its own data; each builder method exists in every state and
//! is gated by a `where` bound on one of the sealed traits here, whose compile error names the
//! call that is missing. The traits shown here are the gates such an error names, the handler
//! traits a handler must meet and [`Mount`], the bound of [`Runner::mount`](crate::Runner::mount);
//! the state types themselves are hidden: you never name them unless you write a queue's full
//! type out.

use std::time::Duration;

use crate::config::FormKind;
use crate::table::DeadLetter;

mod mode;

pub use mode::*;

pub(crate) mod sealed {
    pub trait Sealed {}
}
use sealed::Sealed;

#[doc(hidden)]
pub use crate::delivery::Isolated;
pub use crate::delivery::{Mode, Plain, TransactionalMode};
#[cfg(feature = "json")]
#[doc(hidden)]
pub use crate::handler::HandlesJson;
#[cfg(feature = "json")]
pub use crate::handler::JsonHandler;
pub use crate::handler::{BatchHandler, Handler, IntoOutcome, Mount, RowHandler};
#[doc(hidden)]
pub use crate::handler::{Handles, HandlesBatches, HandlesRows};

// ---- claim form ------------------------------------------------------------------------------

/// No claim form chosen yet.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoForm;

/// The row lock form: `FOR UPDATE SKIP LOCKED`, the claim's transaction holds the row.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct RowLock;

/// The lease form: a `locked_until` token committed at once, extended while the handler works.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct Lease {
    pub(crate) column: String,
    pub(crate) duration: Duration,
}

/// The advisory lock form: a session lock on the row's key.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct AdvisoryLock;

impl Sealed for NoForm {}
impl Sealed for RowLock {}
impl Sealed for Lease {}
impl Sealed for AdvisoryLock {}

/// A queue that has no claim form yet.
#[diagnostic::on_unimplemented(
    message = "a queue has exactly one claim form",
    label = "a claim form was already chosen for this queue",
    note = "keep one of `.row_lock()`, `.lease(\"locked_until\")` or `.advisory_lock()`"
)]
pub trait NoFormYet: Sealed {}
impl NoFormYet for NoForm {}

/// A queue with a claim form.
#[diagnostic::on_unimplemented(
    message = "the queue has no claim form",
    label = "call `.row_lock()`, `.lease(\"locked_until\")` or `.advisory_lock()` before mounting"
)]
pub trait ClaimForm: Sealed {
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn into_form(self) -> FormKind;
}
impl ClaimForm for RowLock {
    fn into_form(self) -> FormKind {
        FormKind::RowLock
    }
}
impl ClaimForm for Lease {
    fn into_form(self) -> FormKind {
        FormKind::Lease {
            column: self.column,
            duration: self.duration,
        }
    }
}
impl ClaimForm for AdvisoryLock {
    fn into_form(self) -> FormKind {
        FormKind::Advisory
    }
}

/// What a queue's claim form, if it has one yet, says of its rows to the calls on the declared
/// queue (enqueue, cancel, counts): none before a form is chosen.
#[doc(hidden)]
pub trait FormState: Sealed {
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn kind(&self) -> Option<FormKind>;
    #[doc(hidden)]
    fn lease_column(&self) -> Option<&str> {
        None
    }
}
impl FormState for NoForm {
    fn kind(&self) -> Option<FormKind> {
        None
    }
}
impl FormState for RowLock {
    fn kind(&self) -> Option<FormKind> {
        Some(FormKind::RowLock)
    }
}
impl FormState for Lease {
    fn kind(&self) -> Option<FormKind> {
        Some(self.clone().into_form())
    }
    fn lease_column(&self) -> Option<&str> {
        Some(&self.column)
    }
}
impl FormState for AdvisoryLock {
    fn kind(&self) -> Option<FormKind> {
        Some(FormKind::Advisory)
    }
}

/// A queue whose claim form tells a job in work: what a cancellation and a unique job's
/// replace or debounce must leave alone.
#[diagnostic::on_unimplemented(
    message = "this call needs the queue's claim form: it tells a job in work",
    label = "declare the form first: `.row_lock()`, `.lease(\"locked_until\")` or `.advisory_lock()`"
)]
pub trait KnowsItsForm: FormState {}
impl KnowsItsForm for RowLock {}
impl KnowsItsForm for Lease {}
impl KnowsItsForm for AdvisoryLock {}

/// A queue whose unfinished jobs a unique enqueue can tell apart from jobs in work: the lease
/// and row lock forms (an advisory key is a session lock no other session can read, and the
/// runner refuses the advisory form on a table with a unique key).
#[diagnostic::on_unimplemented(
    message = "unique jobs need the lease or row lock form",
    label = "declare `.lease(\"locked_until\")` or `.row_lock()`",
    note = "a unique job's replace or debounce leaves a job in work alone, and the advisory \
            form's jobs in work cannot be seen by another session"
)]
pub trait UniqueForm: KnowsItsForm {}
impl UniqueForm for RowLock {}
impl UniqueForm for Lease {}

/// A claim form the database `DB` has.
#[diagnostic::on_unimplemented(
    message = "`{DB}` has no `{Self}` claim form",
    label = "this queue's claim form does not exist on `{DB}`",
    note = "SQLite has no row locks: use the lease form, `.lease(\"locked_until\")` \
            (or `.advisory_lock()` when one process uses the database)"
)]
pub trait FormOn<DB>: Sealed {}
// A missing form is reported by `ClaimForm` alone.
impl<DB> FormOn<DB> for NoForm {}
impl<DB> FormOn<DB> for Lease {}
impl<DB> FormOn<DB> for AdvisoryLock {}
#[cfg(feature = "postgres")]
impl FormOn<sqlx::Postgres> for RowLock {}
#[cfg(feature = "mysql")]
impl FormOn<sqlx::MySql> for RowLock {}

/// The lease form.
#[diagnostic::on_unimplemented(
    message = "`lease_duration` needs the lease form",
    label = "call `.lease(\"locked_until\")` first"
)]
pub trait HasLease: Sealed {
    #[doc(hidden)]
    fn set_duration(&mut self, duration: Duration);
}
impl HasLease for Lease {
    fn set_duration(&mut self, duration: Duration) {
        self.duration = duration;
    }
}

// ---- attempt column --------------------------------------------------------------------------

/// No attempt column: deliveries are not counted.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoAttempt;

/// An attempt column that counts deliveries.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct AttemptColumn(pub(crate) String);

impl Sealed for NoAttempt {}
impl Sealed for AttemptColumn {}

/// A queue without an attempt column yet.
#[diagnostic::on_unimplemented(
    message = "the queue already has an attempt column",
    label = "`.attempt(..)` was already called"
)]
pub trait NoAttemptYet: Sealed {}
impl NoAttemptYet for NoAttempt {}

/// A queue with an attempt column.
#[diagnostic::on_unimplemented(
    message = "`max_attempts` needs an attempt column",
    label = "call `.attempt(\"attempt\")` first"
)]
pub trait HasAttemptColumn: Sealed {}
impl HasAttemptColumn for AttemptColumn {}

/// The attempt column, if any, for the plain configuration.
#[doc(hidden)]
pub trait AttemptState: Sealed {
    #[doc(hidden)]
    fn into_column(self) -> Option<String>;
    #[doc(hidden)]
    fn column(&self) -> Option<&str>;
}
impl AttemptState for NoAttempt {
    fn into_column(self) -> Option<String> {
        None
    }
    fn column(&self) -> Option<&str> {
        None
    }
}
impl AttemptState for AttemptColumn {
    fn into_column(self) -> Option<String> {
        Some(self.0)
    }
    fn column(&self) -> Option<&str> {
        Some(&self.0)
    }
}

// ---- attempt cap and dead letter ---------------------------------------------------------------

/// No cap: a row is retried for as long as its handler asks.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoCap;

/// A cap without its dead letter yet: not mountable.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct MaxAttempts(pub(crate) u32);

/// A cap and where a row goes when it reaches it.
#[derive(Debug, Clone)]
#[doc(hidden)]
pub struct DeadLettered {
    pub(crate) max_attempts: u32,
    pub(crate) to: DeadLetter,
}

impl Sealed for NoCap {}
impl Sealed for MaxAttempts {}
impl Sealed for DeadLettered {}

/// A queue without a cap yet.
#[diagnostic::on_unimplemented(
    message = "the queue already has `max_attempts`",
    label = "`.max_attempts(..)` was already called"
)]
pub trait NoCapYet: Sealed {}
impl NoCapYet for NoCap {}

/// A queue with `max_attempts` and no dead letter yet.
#[diagnostic::on_unimplemented(
    message = "`dead_letter` needs `max_attempts`",
    label = "call `.max_attempts(n)` first: the dead letter is where a row goes at the cap"
)]
pub trait HasMaxAttempts: Sealed {
    #[doc(hidden)]
    fn max_attempts(&self) -> u32;
}
impl HasMaxAttempts for MaxAttempts {
    fn max_attempts(&self) -> u32 {
        self.0
    }
}

/// The queue's dead letter, if it has one yet, for the calls on the declared queue.
#[doc(hidden)]
pub trait CapState: Sealed {
    #[doc(hidden)]
    fn dead_letter(&self) -> Option<&DeadLetter>;
}
impl CapState for NoCap {
    fn dead_letter(&self) -> Option<&DeadLetter> {
        None
    }
}
impl CapState for MaxAttempts {
    fn dead_letter(&self) -> Option<&DeadLetter> {
        None
    }
}
impl CapState for DeadLettered {
    fn dead_letter(&self) -> Option<&DeadLetter> {
        Some(&self.to)
    }
}

/// A queue with a dead letter.
#[diagnostic::on_unimplemented(
    message = "this call reads the queue's dead letter, which it has none of",
    label = "declare it: `.max_attempts(n).dead_letter(DeadLetter::table(..))` (or `::group(..)`)"
)]
pub trait HasDeadLetter: CapState {}
impl HasDeadLetter for DeadLettered {}

/// A cap that is complete: none, or with its dead letter.
#[diagnostic::on_unimplemented(
    message = "a queue with `max_attempts` needs a dead letter",
    label = "call `.dead_letter(DeadLetter::table(..))` or `.dead_letter(DeadLetter::group(..))` \
             after `.max_attempts(n)`"
)]
pub trait CapComplete: Sealed {
    #[doc(hidden)]
    fn into_cap(self) -> Option<(u32, DeadLetter)>;
}
impl CapComplete for NoCap {
    fn into_cap(self) -> Option<(u32, DeadLetter)> {
        None
    }
}
impl CapComplete for DeadLettered {
    fn into_cap(self) -> Option<(u32, DeadLetter)> {
        Some((self.max_attempts, self.to))
    }
}

// ---- batches ---------------------------------------------------------------------------------

/// One row per delivery (the default).
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct Single;

/// Up to `n` rows per claim, handled together.
#[derive(Debug, Clone, Copy)]
#[doc(hidden)]
pub struct Batched(pub(crate) usize);

impl Sealed for Single {}
impl Sealed for Batched {}

/// Batch size, if any, for the plain configuration.
#[doc(hidden)]
pub trait BatchState: Sealed {
    #[doc(hidden)]
    fn size(&self) -> Option<usize>;
}
impl BatchState for Single {
    fn size(&self) -> Option<usize> {
        None
    }
}
impl BatchState for Batched {
    fn size(&self) -> Option<usize> {
        Some(self.0)
    }
}

/// A queue that takes no batches.
#[diagnostic::on_unimplemented(
    message = "a transactional queue serves single deliveries, not batches",
    label = "this queue has `.batch(n)`",
    note = "remove `.transactional()` or `.batch(n)`"
)]
pub trait NotBatched: Sealed {}
impl NotBatched for Single {}

/// A queue that takes one row per delivery.
#[diagnostic::on_unimplemented(
    message = "a batched queue takes a batch handler",
    label = "this queue has `.batch(n)`: use `.batch_handler(f)`"
)]
pub trait SingleDeliveries: Sealed {}
impl SingleDeliveries for Single {}

/// A queue that takes batches.
#[diagnostic::on_unimplemented(
    message = "`batch_handler` needs `.batch(n)`",
    label = "call `.batch(n)` first, or use `.handler(f)` for single deliveries"
)]
pub trait BatchedDeliveries: Sealed {}
impl BatchedDeliveries for Batched {}

// ---- handler ---------------------------------------------------------------------------------

/// No handler yet.
#[derive(Debug, Clone, Copy, Default)]
#[doc(hidden)]
pub struct NoHandler;

impl Sealed for NoHandler {}

/// A queue whose handler is not set yet.
#[diagnostic::on_unimplemented(
    message = "the queue's handler is already set",
    label = "`.transactional()`, `.batch(n)` and the handler come before `.handler(f)`, once"
)]
pub trait NoHandlerYet: Sealed {}
impl NoHandlerYet for NoHandler {}
