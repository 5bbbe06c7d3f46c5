//! Periodic jobs' tests, a binary of their own: the `it` binary takes about 12 GB and many
//! minutes to compile, and these tests need none of its areas. They follow `tests/it`'s pattern
//! and reuse its support (`tests/it/support`, with `tests/common`): each test is a generic
//! function written once, `async fn name<DB: TestDb>()`, and `per_database!` below writes one
//! module per database whose `#[tokio::test]`s run them there — `cargo test --test periodic
//! sqlite::` runs SQLite's. The ten-second test of three runners runs once for every database
//! at once (`three_runners::every_database`).
//!
//! What is tested here: each tick makes one job however many runners carry its schedule, also
//! when its job finished (row deleted, unique key free) before a late runner reached the tick;
//! ticks missed while no runner ran are skipped, or the latest caught up once; a changed
//! schedule takes effect at its next tick; what a schedule needs is refused at start. The ticks'
//! times (cron expressions, time zones across DST) are unit tests in
//! `src/runner/schedule/tests.rs`.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod example;
mod three_runners;
mod ticks;

/// One module per database, with `ticks.rs`'s tests on it as `#[tokio::test]`s under their own
/// names; `postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`.
macro_rules! per_database {
    ($($db:ident => $ty:ty);* $(;)?) => {$(
        mod $db {
            ticks_tests!($ty:
                a_tick_whose_job_finished_is_not_enqueued_again_by_a_late_runner,
                a_restarted_runner_skips_the_ticks_it_missed,
                a_restarted_runner_catches_up_the_latest_missed_tick_once,
                a_changed_schedule_takes_effect_at_its_next_tick,
                what_a_schedule_needs_is_said_at_start,
            );
        }
    )*};
}

macro_rules! ticks_tests {
    ($db:ty: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::ticks::$test::<$db>()).await;
        }
    )+};
}

per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres;
    postgres18 => sqlx::Postgres;
    mysql => sqlx::MySql;
}
