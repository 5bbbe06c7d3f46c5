//! Cancellation's tests, a binary of their own (the `it` binary takes about 12 GB and many
//! minutes to compile). They follow `tests/periodic`'s pattern and reuse `tests/it`'s support:
//! each test is a generic function written once, and `per_database!` below writes one module
//! per database whose `#[tokio::test]`s run them there — `cargo test --test cancel sqlite::`
//! runs SQLite's.
//!
//! What is tested here (`queued.rs`, `in_work.rs`): a queued job cancelled is removed (or marked) and never
//! delivered, also by its unique key and inside a transaction that rolls back (then nothing is
//! cancelled); a finished job is "not found"; a job in work on the lease form loses its lease,
//! its handler sees `Delivery::cancelled()` within half a lease, and its transactional writes do
//! not commit; a row lock claim's job is said in work without waiting for its lock; the shutdown
//! timeout fires `cancelled()`. `batch.rs`: a batch's row cancelled in work is told alone and
//! removed, on each form. `gaps.rs`: a lease row claimed ahead and cancelled never starts
//! (PostgreSQL, listening); requests naming no row are swept. `pooler.rs`: cancellations of jobs
//! in work through PgBouncer in transaction pooling (row lock and lease forms).
//! `sqlite_advisory.rs`: SQLite's advisory form, whose keys are held in the process — a job in
//! work gets a request, a queued one is removed, no cancellation leaves a key held. `races.rs`:
//! cancellations racing settlements on the row lock and advisory forms, counted against a
//! ledger — no `Requested` job commits its writes or starts again.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod batch;
mod gaps;
mod in_work;
mod pooler;
mod queued;
mod races;
mod sqlite_advisory;

/// Every test, under one path for the macros below.
mod cases {
    pub(crate) use crate::batch::*;
    pub(crate) use crate::gaps::*;
    pub(crate) use crate::in_work::*;
    pub(crate) use crate::queued::*;
    pub(crate) use crate::races::*;

    use crate::support::{AdvisoryForm, RowLockForm, TestDb};

    /// The sweep of requests naming no row, on the form each database reads requests for.
    pub(crate) async fn requests_naming_no_row_are_swept_by_row_lock<DB: TestDb>()
    where
        RowLockForm: crate::support::Form<DB>,
    {
        requests_naming_no_row_are_swept::<DB, RowLockForm>().await;
    }

    pub(crate) async fn requests_naming_no_row_are_swept_by_advisory<DB: TestDb>()
    where
        AdvisoryForm: crate::support::Form<DB>,
    {
        requests_naming_no_row_are_swept::<DB, AdvisoryForm>().await;
    }
}

/// One module per database, with `cases.rs`'s tests on it as `#[tokio::test]`s under their own
/// names; `postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`. The row lock form's test
/// runs where the form is (not on SQLite).
macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $server:ident)*);* $(;)?) => {$(
        mod $db {
            cases_tests!($ty:
                a_queued_job_is_removed_and_never_delivered,
                a_queued_job_is_marked_where_the_table_keeps_finished_rows,
                a_job_is_cancelled_by_its_unique_key,
                a_cancel_in_a_transaction_rolled_back_cancels_nothing,
                a_finished_job_is_not_found,
                a_leased_job_in_work_loses_its_lease_and_its_handler_is_told,
                a_leased_job_in_work_is_marked_where_the_table_keeps_finished_rows,
                the_shutdown_timeout_fires_cancelled,
                a_queued_job_with_requests_declared_is_removed_at_once,
                a_missing_requests_table_is_refused_at_start,
                a_leased_batch_row_is_cancelled_alone,
            );
            $(cases_tests!($ty: $server);)*
        }
    )*};
}

macro_rules! cases_tests {
    ($db:ty: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::cases::$test::<$db>()).await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite, requests_naming_no_row_are_swept_by_advisory,
        an_advisory_batch_row_is_cancelled_alone,
        requested_advisory_jobs_commit_nothing,
        requested_advisory_jobs_never_start_again;
    postgres => sqlx::Postgres, a_row_lock_claims_job_is_said_in_work_without_waiting,
        a_cancelled_transactional_delivery_commits_nothing,
        a_row_lock_job_in_work_is_cancelled_by_request,
        an_advisory_job_in_work_is_cancelled_by_request,
        a_request_outlives_a_delivery_released_unsettled,
        a_row_lock_batch_row_is_cancelled_alone,
        an_advisory_batch_row_is_cancelled_alone,
        a_lease_row_cancelled_while_claimed_ahead_never_starts,
        requests_naming_no_row_are_swept_by_row_lock,
        requested_row_lock_jobs_commit_nothing,
        requested_advisory_jobs_commit_nothing,
        requested_row_lock_jobs_never_start_again,
        requested_advisory_jobs_never_start_again;
    postgres18 => sqlx::Postgres, a_row_lock_claims_job_is_said_in_work_without_waiting,
        a_cancelled_transactional_delivery_commits_nothing,
        a_row_lock_job_in_work_is_cancelled_by_request,
        an_advisory_job_in_work_is_cancelled_by_request,
        a_request_outlives_a_delivery_released_unsettled,
        a_row_lock_batch_row_is_cancelled_alone,
        an_advisory_batch_row_is_cancelled_alone,
        a_lease_row_cancelled_while_claimed_ahead_never_starts,
        requests_naming_no_row_are_swept_by_row_lock,
        requested_row_lock_jobs_commit_nothing,
        requested_advisory_jobs_commit_nothing,
        requested_row_lock_jobs_never_start_again,
        requested_advisory_jobs_never_start_again;
    mysql => sqlx::MySql, a_row_lock_claims_job_is_said_in_work_without_waiting,
        a_cancelled_transactional_delivery_commits_nothing,
        a_row_lock_job_in_work_is_cancelled_by_request,
        an_advisory_job_in_work_is_cancelled_by_request,
        a_request_outlives_a_delivery_released_unsettled,
        a_row_lock_batch_row_is_cancelled_alone,
        an_advisory_batch_row_is_cancelled_alone,
        requests_naming_no_row_are_swept_by_row_lock,
        requested_row_lock_jobs_commit_nothing,
        requested_advisory_jobs_commit_nothing,
        requested_row_lock_jobs_never_start_again,
        requested_advisory_jobs_never_start_again;
}
