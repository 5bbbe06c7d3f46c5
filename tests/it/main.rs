//! Integration tests, one binary: every area's tests run on SQLite, PostgreSQL and MariaDB/MySQL.
//!
//! Each area is a module of generic tests, written once: `async fn name<DB: TestDb>()`, and for
//! the areas run once per claim form (`held`, `dead`, `transactional`, `batch`, `redelivery`,
//! `shutdown`, `poison`, `attempts`) `async fn name<DB: TestDb, F: Form<DB>>()`; what differs
//! between databases or forms is an item of `support::TestDb` or `support::Form`, or a branch on
//! it. Each area lists its tests in its `tests!` macro, and `per_database!` below writes one
//! module per database with one module per area (and form) in it, whose `#[tokio::test]`s run
//! the area's tests on that database, under their own names: `cargo test sqlite::` (or
//! `postgres::`, `mysql::`) runs one database's tests, `cargo test postgres::row_lock_batch::` one
//! form's batches there. PostgreSQL and MySQL tests read `SQLX_QUEUE_PG_URL` and
//! `SQLX_QUEUE_MYSQL_URL`, and skip themselves with a notice when those are not set (they fail
//! instead under `SQLX_QUEUE_REQUIRE_ALL=1`). Every PostgreSQL test runs again in `postgres18::`
//! on `SQLX_QUEUE_PG18_URL` (PostgreSQL 18 in CI; `support::servers` picks the URL).

/// `#[tokio::test]`s that run an area's generic tests with the type arguments given, under the
/// tests' own names: `instantiate!(lease<sqlx::Sqlite>: ack_deletes_the_row)` writes
/// `async fn ack_deletes_the_row()`, which runs `crate::lease::ack_deletes_the_row::<sqlx::Sqlite>()`;
/// `instantiate!(dead<sqlx::Sqlite, LeaseForm>: ..)` runs them on one claim form too.
macro_rules! instantiate {
    ($area:ident<$db:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::$area::$test::<$db>()).await;
        }
    )+};
    ($area:ident<$db:ty, $form:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::$area::$test::<$db, $form>())
                .await;
        }
    )+};
}
pub(crate) use instantiate;

mod examples;
mod support;

mod advisory_give_back;
mod advisory_keys;
mod ahead;
mod attempts;
mod batch;
mod custom_sql;
mod dead;
mod dead_table;
mod docs;
mod enqueue;
mod explain;
mod held;
mod identity;
mod isolation;
mod lease;
mod metrics;
mod notify;
mod order;
mod payload;
mod poison;
mod pooler;
mod redelivery;
mod refusals;
mod rows;
mod runner;
mod schema;
mod shutdown;
mod transactional;
mod unique;
mod unique_bulk;
mod unique_races;
mod unique_readme;
mod unique_work;
mod upkeep;

/// In a database's module, one module per area with the area's tests on `$db`:
/// `modules!(sqlx::Sqlite: lease)` writes `mod lease`, and
/// `modules!(sqlx::Sqlite: lease_dead => dead(LeaseForm))` writes `mod lease_dead` with the tests
/// of `dead.rs` on the lease form.
macro_rules! modules {
    ($db:ty: $($area:ident),+ $(,)?) => {$(
        mod $area {
            crate::$area::tests!($db);
        }
    )+};
    ($db:ty: $($module:ident => $area:ident($form:ident)),+ $(,)?) => {$(
        mod $module {
            crate::$area::tests!($db, crate::support::$form);
        }
    )+};
}

/// One module per database; `$row_lock` where the database has the row lock form.
macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $row_lock:ident)?);* $(;)?) => {$(
        mod $db {
            modules!($ty:
                lease, runner, enqueue, schema, docs, order, notify, explain, isolation, payload,
                rows, identity, dead_table, custom_sql, refusals, unique, unique_bulk, unique_races,
                unique_readme, ahead, upkeep, advisory_give_back, advisory_keys,
            );
            modules!($ty:
                advisory => held(AdvisoryForm),
                lease_dead => dead(LeaseForm),
                advisory_dead => dead(AdvisoryForm),
                lease_tx => transactional(LeaseForm),
                advisory_tx => transactional(AdvisoryForm),
                lease_batch => batch(LeaseForm),
                advisory_batch => batch(AdvisoryForm),
                lease_redelivery => redelivery(LeaseForm),
                advisory_redelivery => redelivery(AdvisoryForm),
                lease_shutdown => shutdown(LeaseForm),
                advisory_shutdown => shutdown(AdvisoryForm),
                lease_poison => poison(LeaseForm),
                advisory_poison => poison(AdvisoryForm),
                lease_attempts => attempts(LeaseForm),
                lease_unique => unique_work(LeaseForm),
                advisory_attempts => attempts(AdvisoryForm),
                lease_metrics => metrics(LeaseForm),
                advisory_metrics => metrics(AdvisoryForm),
            );
            $(
                modules!($ty:
                    $row_lock => held(RowLockForm),
                    row_lock_dead => dead(RowLockForm),
                    row_lock_tx => transactional(RowLockForm),
                    row_lock_batch => batch(RowLockForm),
                    row_lock_redelivery => redelivery(RowLockForm),
                    row_lock_shutdown => shutdown(RowLockForm),
                    row_lock_poison => poison(RowLockForm),
                    row_lock_attempts => attempts(RowLockForm),
                    row_lock_unique => unique_work(RowLockForm),
                    row_lock_metrics => metrics(RowLockForm),
                );
            )?
        }
    )*};
}

// SQLite has no row locks: `RowLockForm` is not a `Form<sqlx::Sqlite>`.
per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres, row_lock;
    postgres18 => sqlx::Postgres, row_lock;
    mysql => sqlx::MySql, row_lock;
}
