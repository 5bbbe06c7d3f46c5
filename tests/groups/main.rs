//! Limits per group's tests, a binary of their own: the `it` binary takes about 12 GB and many
//! minutes to compile, and these tests need none of its areas. They follow `tests/it`'s pattern
//! and reuse its support (`tests/it/support`, with `tests/common`): each test is a generic
//! function written once, `async fn name<DB: TestDb>()`, and `per_database!` below writes one
//! module per database whose `#[tokio::test]`s run them there — `cargo test --test groups
//! sqlite::` runs SQLite's.
//!
//! What is tested here, on the lease and row lock forms: FIFO (`per_group(1)`) over 3 groups × 100 rows with
//! two runners of 8 workers, one of them a process SIGKILLed in the middle of its deliveries —
//! per group strictly in id order (but the killed row's redelivery) and never two in work
//! (`fifo.rs`); `per_group(3)` — never more than 3 in work per group at any instant, as the
//! handlers see it, while the groups of fast rows drain past a saturated slow group
//! (`per_group.rs`). On every form: `.workers(8).by_key(..)` — within one runner, per key in id order
//! and never two in work, keys in parallel; and (lease and plain advisory) a slow key holding
//! back none of the others (`by_key.rs`); rows waiting for their key's worker released at shutdown,
//! and (lease) given back uncounted at half their lease (`by_key_hold.rs`).

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod by_key;
mod by_key_hold;
mod delayed;
mod fifo;
mod per_group;
mod refusals;

/// One module per database, with the tests as `#[tokio::test]`s under their own names (a test
/// of every form once per form: `_lease`, `_row_lock`); `postgres18` runs PostgreSQL's on
/// `SQLX_QUEUE_PG18_URL`. SQLite has no row lock form.
macro_rules! per_database {
    ($($db:ident => $ty:ty, $($form:ident)+);* $(;)?) => {$(
        mod $db {
            group_tests!($ty:
                what_groups_need_is_said_at_start =>
                    refusals::what_groups_need_is_said_at_start,
                what_by_key_needs_is_said_at_start =>
                    refusals::what_by_key_needs_is_said_at_start,
            );
            $(paste_form!($ty, $form);)+
        }
    )*};
}

/// The tests written for every form, on `$form`.
macro_rules! paste_form {
    ($ty:ty, lease) => {
        group_tests!($ty:
            fifo_groups_stay_in_order_across_runners_and_a_killed_one_lease =>
                fifo::fifo_groups_stay_in_order_across_runners_and_a_killed_one::<crate::support::LeaseForm>,
            a_fifo_row_due_again_waits_for_the_later_row_in_work_lease =>
                delayed::a_fifo_row_due_again_waits_for_the_later_row_in_work::<crate::support::LeaseForm>,
            by_key_keeps_each_key_in_order_lease =>
                by_key::by_key_keeps_each_key_in_order::<crate::support::LeaseForm>,
            rows_waiting_for_their_key_are_released_at_shutdown_lease =>
                by_key_hold::rows_waiting_for_their_key_are_released_at_shutdown::<crate::support::LeaseForm>,
            a_slow_key_holds_back_no_other_lease =>
                by_key::a_slow_key_holds_back_no_other::<crate::support::LeaseForm>,
            a_row_waiting_past_half_its_lease_goes_back_uncounted =>
                by_key_hold::a_row_waiting_past_half_its_lease_goes_back_uncounted,
            per_group_caps_each_group_and_never_blocks_the_others_lease =>
                per_group::per_group_caps_each_group_and_never_blocks_the_others::<crate::support::LeaseForm>,
        );
    };
    ($ty:ty, advisory) => {
        group_tests!($ty:
            by_key_keeps_each_key_in_order_advisory =>
                by_key::by_key_keeps_each_key_in_order::<crate::support::AdvisoryForm>,
            rows_waiting_for_their_key_are_released_at_shutdown_advisory =>
                by_key_hold::rows_waiting_for_their_key_are_released_at_shutdown::<crate::support::AdvisoryForm>,
            a_slow_key_holds_back_no_other_advisory =>
                by_key::a_slow_key_holds_back_no_other::<crate::support::AdvisoryForm>,
        );
    };
    ($ty:ty, row_lock) => {
        group_tests!($ty:
            fifo_groups_stay_in_order_across_runners_and_a_killed_one_row_lock =>
                fifo::fifo_groups_stay_in_order_across_runners_and_a_killed_one::<crate::support::RowLockForm>,
            a_fifo_row_due_again_waits_for_the_later_row_in_work_row_lock =>
                delayed::a_fifo_row_due_again_waits_for_the_later_row_in_work::<crate::support::RowLockForm>,
            per_group_caps_each_group_and_never_blocks_the_others_row_lock =>
                per_group::per_group_caps_each_group_and_never_blocks_the_others::<crate::support::RowLockForm>,
            what_the_row_lock_form_cannot_guard_is_said_at_start =>
                refusals::what_the_row_lock_form_cannot_guard_is_said_at_start::<crate::support::RowLockForm>,
            by_key_keeps_each_key_in_order_row_lock =>
                by_key::by_key_keeps_each_key_in_order::<crate::support::RowLockForm>,
            rows_waiting_for_their_key_are_released_at_shutdown_row_lock =>
                by_key_hold::rows_waiting_for_their_key_are_released_at_shutdown::<crate::support::RowLockForm>,
        );
    };
}

macro_rules! group_tests {
    ($db:ty: $($name:ident => $module:ident::$test:ident $(::<$($arg:ty),+>)?),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            crate::support::on_server_of(
                module_path!(),
                crate::$module::$test::<$db $($(, $arg)+)?>(),
            )
            .await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite, lease advisory;
    postgres => sqlx::Postgres, lease row_lock advisory;
    postgres18 => sqlx::Postgres, lease row_lock advisory;
    mysql => sqlx::MySql, lease row_lock advisory;
}
