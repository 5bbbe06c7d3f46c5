//! The claims' floor, a binary of its own: the `it` binary takes about 12 GB and many minutes to
//! compile, and these tests need none of its areas. They follow `tests/it`'s pattern and reuse
//! its support (`tests/it/support`, with `tests/common`): each test is a generic function written
//! once, `async fn name<DB: TestDb, F: Form<DB>>()`, and `per_database!` below writes one module
//! per database whose `#[tokio::test]`s run them there — `cargo test --test floor sqlite::` runs
//! SQLite's.
//!
//! What is tested here: a drain while a transaction holds PostgreSQL's `xmin` reads the entries
//! of the rows it settled a bounded number of times, not once per claim (`xmin.rs`); rows that
//! become claimable below the floor — a retry, a row given back — are delivered, while a backlog
//! keeps the claims at the floor (`below.rs`).

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod below;
mod xmin;

/// One module per database and in it one per form, with the tests as `#[tokio::test]`s under
/// their own names (`postgres::lease::..`); `postgres18` runs PostgreSQL's on
/// `SQLX_QUEUE_PG18_URL`. SQLite has no row lock form; `xmin` is PostgreSQL's.
macro_rules! per_database {
    ($($db:ident => $ty:ty: $($form:ident [$($module:ident::$test:ident),+]),+;)*) => {$(
        mod $db {$(
            mod $form {$(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    crate::support::on_server_of(
                        module_path!(),
                        crate::$module::$test::<$ty, form_of!($form)>(),
                    )
                    .await;
                }
            )+}
        )+}
    )*};
}

/// The test support's form type of a form's name.
macro_rules! form_of {
    (lease) => {
        crate::support::LeaseForm
    };
    (row_lock) => {
        crate::support::RowLockForm
    };
    (advisory) => {
        crate::support::AdvisoryForm
    };
}

per_database! {
    sqlite => sqlx::Sqlite:
        lease [below::rows_due_again_below_the_floor_are_delivered],
        advisory [below::rows_due_again_below_the_floor_are_delivered];
    postgres => sqlx::Postgres:
        lease [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries],
        row_lock [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries],
        advisory [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries];
    postgres18 => sqlx::Postgres:
        lease [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries],
        row_lock [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries],
        advisory [below::rows_due_again_below_the_floor_are_delivered, xmin::a_drain_with_xmin_held_reads_few_settled_entries];
    mysql => sqlx::MySql:
        lease [below::rows_due_again_below_the_floor_are_delivered],
        row_lock [below::rows_due_again_below_the_floor_are_delivered],
        advisory [below::rows_due_again_below_the_floor_are_delivered];
}
