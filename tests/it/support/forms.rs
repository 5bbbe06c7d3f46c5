//! The claim forms as types, so that a test written once for every form runs on each (as the
//! reliability suite's `Form`).

use std::time::Duration;

use sqlx_queue::Queue;
use sqlx_queue::state::{AdvisoryLock, ClaimForm, FormOn, Lease, NoForm, RowLock};

use super::TestDb;

/// A claim form the database `DB` has.
pub(crate) trait Form<DB: TestDb>: Send + Sync + 'static {
    type F: ClaimForm + FormOn<DB> + Send + 'static;
    /// As the consumer example and the test modules name it: `lease`, `advisory`, `row_lock`.
    const NAME: &'static str;
    /// Whether the form counts the attempt when it takes the row (lease, advisory), so a row
    /// carries one attempt more than the row lock form leaves, which counts it in the statement
    /// that returns the row.
    const COUNTS_AT_TAKE: bool;
    /// Whether the form settles a batch in one transaction, all or nothing (row lock).
    const ALL_OR_NOTHING: bool;

    /// Gives `queue` this form; `lease` is the lease form's duration (the others have none).
    fn apply_leasing<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        lease: Duration,
    ) -> Queue<Self::F, A, C, M, B, H>;

    /// Gives `queue` this form, the lease form on `locked_until` with its default duration.
    fn apply<A, C, M, B, H>(queue: Queue<NoForm, A, C, M, B, H>) -> Queue<Self::F, A, C, M, B, H> {
        Self::apply_leasing(queue, sqlx_queue::DEFAULT_LEASE)
    }
}

/// The lease form, on its `locked_until` column.
pub(crate) struct LeaseForm;
/// The row lock form (PostgreSQL, MySQL/MariaDB).
pub(crate) struct RowLockForm;
/// The advisory lock form.
pub(crate) struct AdvisoryForm;

impl<DB: TestDb> Form<DB> for LeaseForm {
    type F = Lease;
    const NAME: &'static str = "lease";
    const COUNTS_AT_TAKE: bool = true;
    const ALL_OR_NOTHING: bool = false;

    fn apply_leasing<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        lease: Duration,
    ) -> Queue<Lease, A, C, M, B, H> {
        queue.lease("locked_until").lease_duration(lease)
    }
}

impl<DB: TestDb> Form<DB> for RowLockForm
where
    RowLock: FormOn<DB>,
{
    type F = RowLock;
    const NAME: &'static str = "row_lock";
    const COUNTS_AT_TAKE: bool = false;
    const ALL_OR_NOTHING: bool = true;

    fn apply_leasing<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        _lease: Duration,
    ) -> Queue<RowLock, A, C, M, B, H> {
        queue.row_lock()
    }
}

impl<DB: TestDb> Form<DB> for AdvisoryForm {
    type F = AdvisoryLock;
    const NAME: &'static str = "advisory";
    const COUNTS_AT_TAKE: bool = true;
    const ALL_OR_NOTHING: bool = false;

    fn apply_leasing<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        _lease: Duration,
    ) -> Queue<AdvisoryLock, A, C, M, B, H> {
        queue.advisory_lock()
    }
}
