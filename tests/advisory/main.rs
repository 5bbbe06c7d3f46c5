//! The advisory lock form's settlement of grouped acks, a binary of its own: the `it` binary
//! takes about 12 GB and many minutes to compile. These tests follow `tests/it`'s pattern and
//! reuse its support (`tests/it/support`, with `tests/common`): each test is a generic function
//! written once, `async fn name<DB: TestDb>()`, and `per_database!` below writes one module per
//! database whose `#[tokio::test]`s run them there — `cargo test --test advisory mysql::` runs
//! MariaDB's.
//!
//! What is tested here (`settle.rs`), on plain queues of single deliveries (the grouped
//! sessions): each row delivered once across two runners of 8 workers and no key left after;
//! retries, drops and dead letters among the grouped acks of a session settle each as it should;
//! a session the server ends frees its rows to another runner, and its acks settle none of them,
//! and its handlers are told (`cancelled()`);
//! (`ahead.rs`) rows claimed ahead of the workers on a session the server ended are not
//! delivered on its lost keys, rows claimed ahead behind a worker that does not end go back to
//! other runners, and a claim too long to list its rows fills a deleted row's place;
//! and (`statements.rs`) an ack's settlement releases the key in the statement that deletes the
//! row (PostgreSQL; MySQL/MariaDB: in the same round trip), a claim takes its keys and reads its
//! rows in one statement (PostgreSQL; MySQL/MariaDB read and count in one round trip), a queue
//! whose name the statements carry as text claims its own group's rows only, and a row deleted
//! while the claim waits for it is passed over, its key released (PostgreSQL). Beside them (`batches.rs`), queues of batches of every form, whose workers
//! each claim on their own: each row once across two runners, and an idle queue woken.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod ahead;
mod batches;
mod keys;
mod settle;
mod statements;

/// One module per database, with the tests as `#[tokio::test]`s under their own names;
/// `postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`. The batch tests run once per claim
/// form the database has (`batches { name => form }`).
macro_rules! per_database {
    ($($db:ident => $ty:ty, batches { $($batches:ident => $form:ident),+ $(,)? });* $(;)?) => {$(
        mod $db {
            advisory_tests!($ty:
                each_row_once_across_two_runners_and_no_key_left =>
                    settle::each_row_once_across_two_runners_and_no_key_left,
                retries_drops_and_dead_letters_among_grouped_acks_settle =>
                    settle::retries_drops_and_dead_letters_among_grouped_acks_settle,
                a_killed_session_frees_its_rows_and_its_acks_settle_none =>
                    settle::a_killed_session_frees_its_rows_and_its_acks_settle_none,
                handlers_on_an_ended_session_are_told =>
                    settle::handlers_on_an_ended_session_are_told,
                rows_claimed_ahead_on_an_ended_session_are_not_delivered =>
                    ahead::rows_claimed_ahead_on_an_ended_session_are_not_delivered,
                a_claim_too_long_to_list_fills_a_deleted_rows_place =>
                    ahead::a_claim_too_long_to_list_fills_a_deleted_rows_place,
                rows_claimed_ahead_behind_a_stuck_worker_go_to_another_runner =>
                    ahead::rows_claimed_ahead_behind_a_stuck_worker_go_to_another_runner,
                acks_release_their_keys_in_the_settling_statement =>
                    statements::acks_release_their_keys_in_the_settling_statement,
                acks_release_their_hashed_keys_in_the_settling_statement =>
                    statements::acks_release_their_hashed_keys_in_the_settling_statement,
                claims_take_keys_and_rows_in_one_statement =>
                    statements::claims_take_keys_and_rows_in_one_statement,
                claims_read_and_count_their_rows_in_one_round_trip =>
                    statements::claims_read_and_count_their_rows_in_one_round_trip,
                a_group_name_written_into_the_statements_claims_its_rows_only =>
                    statements::a_group_name_written_into_the_statements_claims_its_rows_only,
                a_row_deleted_during_the_claim_is_passed_over_and_its_key_released =>
                    statements::a_row_deleted_during_the_claim_is_passed_over_and_its_key_released,
                full_batches_send_their_acks_with_the_next_claim =>
                    batches::full_batches_send_their_acks_with_the_next_claim,
                a_batch_whose_text_with_the_next_claim_fails_settles_on_its_own =>
                    batches::a_batch_whose_text_with_the_next_claim_fails_settles_on_its_own,
            );
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $batches() {
                    crate::statements::install();
                    crate::support::on_server_of(
                        module_path!(),
                        crate::batches::each_row_once_across_two_runners_and_an_idle_queue_woken::<
                            $ty,
                            crate::support::$form,
                        >(),
                    )
                    .await;
                }
            )+
        }
    )*};
}

macro_rules! advisory_tests {
    ($db:ty: $($name:ident => $module:ident::$test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            crate::statements::install();
            crate::support::on_server_of(module_path!(), crate::$module::$test::<$db>()).await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite, batches {
        lease_batches_of_eight_workers => LeaseForm,
        advisory_batches_of_eight_workers => AdvisoryForm,
    };
    postgres => sqlx::Postgres, batches {
        lease_batches_of_eight_workers => LeaseForm,
        row_lock_batches_of_eight_workers => RowLockForm,
        advisory_batches_of_eight_workers => AdvisoryForm,
    };
    postgres18 => sqlx::Postgres, batches {
        lease_batches_of_eight_workers => LeaseForm,
        row_lock_batches_of_eight_workers => RowLockForm,
        advisory_batches_of_eight_workers => AdvisoryForm,
    };
    mysql => sqlx::MySql, batches {
        lease_batches_of_eight_workers => LeaseForm,
        row_lock_batches_of_eight_workers => RowLockForm,
        advisory_batches_of_eight_workers => AdvisoryForm,
    };
}
