//! The claim forms as types, so that a test written once for every form runs on each.

use std::time::Duration;

use sqlx_queue::state::{AdvisoryLock, ClaimForm, FormOn, KnowsItsForm, Lease, NoForm, RowLock};
use sqlx_queue::{Backend, Queue};

/// A claim form the database `DB` has.
pub(crate) trait Form<DB: Backend>: Send + Sync + 'static {
    type F: ClaimForm + FormOn<DB> + KnowsItsForm + Clone + Send + Sync + 'static;
    /// As the consumer example and the test modules name it: `lease`, `advisory`, `row_lock`.
    const NAME: &'static str;
    /// Whether the form counts the attempt when it takes the row (lease, advisory), so a row
    /// carries one attempt more than the row lock form leaves, which counts it in the statement
    /// that returns the row.
    const COUNTS_AT_TAKE: bool;
    /// Whether the form settles a batch in one transaction, all or nothing (row lock).
    #[allow(dead_code, reason = "only tests/it runs batches")]
    const ALL_OR_NOTHING: bool;
    /// Whether the form holds each row on a session (row lock, advisory): no row is then in two
    /// handlers at once while that session lives.
    #[allow(dead_code, reason = "only tests/reliability ends sessions")]
    const HOLDS: bool;

    /// Gives `queue` this form; `lease` is the lease form's duration (the others have none).
    fn apply_leasing<A, C, M, B, H>(
        queue: Queue<NoForm, A, C, M, B, H>,
        lease: Duration,
    ) -> Queue<Self::F, A, C, M, B, H>;

    /// Gives `queue` this form, the lease form on `locked_until` with its default duration.
    #[allow(dead_code, reason = "tests/reliability gives every queue its lease")]
    fn apply<A, C, M, B, H>(queue: Queue<NoForm, A, C, M, B, H>) -> Queue<Self::F, A, C, M, B, H> {
        Self::apply_leasing(queue, std::time::Duration::from_secs(30))
    }
}

/// The lease form, on its `locked_until` column.
pub(crate) struct LeaseForm;
/// The row lock form (PostgreSQL, MySQL/MariaDB).
pub(crate) struct RowLockForm;
/// The advisory lock form.
pub(crate) struct AdvisoryForm;

/// `impl Form` for each form: the state its queue takes, its constants, and how it is given.
macro_rules! forms {
    ($(
        $form:ident: $state:ident {
            NAME: $name:literal,
            COUNTS_AT_TAKE: $counts_at_take:literal,
            ALL_OR_NOTHING: $all_or_nothing:literal,
            HOLDS: $holds:literal,
            apply_leasing: |$queue:ident, $lease:ident| $apply:expr $(,)?
        }
    )+) => {$(
        impl<DB: Backend> Form<DB> for $form
        where
            $state: FormOn<DB>,
        {
            type F = $state;
            const NAME: &'static str = $name;
            const COUNTS_AT_TAKE: bool = $counts_at_take;
            const ALL_OR_NOTHING: bool = $all_or_nothing;
            const HOLDS: bool = $holds;

            fn apply_leasing<A, C, M, B, H>(
                $queue: Queue<NoForm, A, C, M, B, H>,
                $lease: Duration,
            ) -> Queue<$state, A, C, M, B, H> {
                $apply
            }
        }
    )+};
}

forms! {
    LeaseForm: Lease {
        NAME: "lease",
        COUNTS_AT_TAKE: true,
        ALL_OR_NOTHING: false,
        HOLDS: false,
        apply_leasing: |queue, lease| queue.lease("locked_until").lease_duration(lease),
    }
    // `RowLock: FormOn<DB>` only on PostgreSQL and MySQL/MariaDB.
    RowLockForm: RowLock {
        NAME: "row_lock",
        COUNTS_AT_TAKE: false,
        ALL_OR_NOTHING: true,
        HOLDS: true,
        apply_leasing: |queue, _lease| queue.row_lock(),
    }
    AdvisoryForm: AdvisoryLock {
        NAME: "advisory",
        COUNTS_AT_TAKE: true,
        ALL_OR_NOTHING: false,
        HOLDS: true,
        apply_leasing: |queue, _lease| queue.advisory_lock(),
    }
}
