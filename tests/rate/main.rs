//! Rate limits across runners, a binary of their own: the `it` binary takes about 12 GB and many
//! minutes to compile. They follow `tests/it`'s pattern and reuse its support
//! (`tests/it/support`, with `tests/common`): each test is a generic function written once,
//! `async fn name<DB: TestDb>()`, and `per_database!` below writes one module per database
//! whose `#[tokio::test]`s run them there — `cargo test --test rate sqlite::` runs SQLite's.
//!
//! What is tested here: three runners on one table keep to 200 starts a second over five
//! seconds (the burst allowed in the first), their throughput within 10 % of the limit; rows
//! arriving in bursts never start faster than the bucket allows, and a limited queue sleeps
//! rather than polls (its limiter statements are counted); the row lock and advisory forms
//! (one claim per worker) keep to the limit too; a limit without a limiter table is refused;
//! behind PgBouncer in transaction pooling (`pooler`, on `SQLX_QUEUE_PGBOUNCER_URL`) the limiter
//! works unprepared.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod limits;
mod pooler;

/// One module per database, with `limits.rs`'s tests on it as `#[tokio::test]`s under their
/// own names; `postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`.
/// The tests in brackets run on that database only (the row lock form's: not on SQLite).
macro_rules! per_database {
    ($($db:ident => $ty:ty [$($only:ident),*]);* $(;)?) => {$(
        mod $db {
            rate_tests!($ty:
                three_runners_keep_to_two_hundred_a_second,
                bursts_of_rows_never_exceed_the_bucket_and_nothing_polls,
                the_advisory_form_keeps_to_the_limit,
                a_limit_without_its_table_is_refused_at_start,
                $($only,)*
            );
        }
    )*};
}

macro_rules! rate_tests {
    ($db:ty: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::limits::$test::<$db>()).await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite [];
    postgres => sqlx::Postgres [the_row_lock_form_keeps_to_the_limit];
    postgres18 => sqlx::Postgres [the_row_lock_form_keeps_to_the_limit];
    mysql => sqlx::MySql [the_row_lock_form_keeps_to_the_limit];
}
