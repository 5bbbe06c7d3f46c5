//! Integration tests, one binary: every area's tests run on SQLite, PostgreSQL and MariaDB/MySQL.
//!
//! Each area file is written once against the alias `Db` and included in one module per
//! database, so `cargo test sqlite::` (or `postgres::`, `mysql::`) runs one database's tests.
//! PostgreSQL and MySQL tests read `SQLX_QUEUE_PG_URL` and `SQLX_QUEUE_MYSQL_URL`, and skip
//! themselves with a notice when those are not set (they fail instead under
//! `SQLX_QUEUE_REQUIRE_ALL=1`).

/// `#[tokio::test]`s that run an area's generic tests with the type arguments given, under the
/// tests' own names: `instantiate!(lease<sqlx::Sqlite>: ack_deletes_the_row)` writes
/// `async fn ack_deletes_the_row()`, which runs `crate::lease::ack_deletes_the_row::<sqlx::Sqlite>()`;
/// `instantiate!(dead<sqlx::Sqlite, LeaseForm>: ..)` runs them on one claim form too.
macro_rules! instantiate {
    ($area:ident<$db:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::$area::$test::<$db>().await;
        }
    )+};
    ($area:ident<$db:ty, $form:ty>: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::$area::$test::<$db, $form>().await;
        }
    )+};
}
pub(crate) use instantiate;

mod examples;
mod support;

mod custom_sql;
mod dead_table;
mod docs;
mod enqueue;
mod explain;
mod identity;
mod isolation;
mod lease;
mod notify;
mod order;
mod payload;
mod refusals;
mod rows;
mod runner;
mod schema;

include!("held.rs");
include!("dead.rs");
include!("transactional.rs");
include!("batch.rs");
include!("redelivery.rs");
include!("shutdown.rs");
include!("poison.rs");
include!("attempts.rs");

macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $row_lock:ident)?);* $(;)?) => {$(
        mod $db {
            #[allow(unused_imports)]
            use crate::support::{Ctx, Spec, recv, wait_for};
            type Db = $ty;

            mod lease {
                crate::lease::tests!($ty);
            }
            mod runner {
                crate::runner::tests!($ty);
            }
            mod enqueue {
                crate::enqueue::tests!($ty);
            }
            mod schema {
                crate::schema::tests!($ty);
            }
            mod docs {
                crate::docs::tests!($ty);
            }
            mod order {
                crate::order::tests!($ty);
            }
            mod notify {
                crate::notify::tests!($ty);
            }
            mod explain {
                crate::explain::tests!($ty);
            }
            mod isolation {
                crate::isolation::tests!($ty);
            }
            mod payload {
                crate::payload::tests!($ty);
            }
            mod rows {
                crate::rows::tests!($ty);
            }
            mod identity {
                crate::identity::tests!($ty);
            }
            mod dead_table {
                crate::dead_table::tests!($ty);
            }
            mod custom_sql {
                crate::custom_sql::tests!($ty);
            }
            mod refusals {
                crate::refusals::tests!($ty);
            }
            held_form_tests!(advisory, advisory_lock, true);
            dead_letter_tests!(lease_dead, true, lease("locked_until"));
            dead_letter_tests!(advisory_dead, true, advisory_lock());
            transactional_tests!(lease_tx, lease("locked_until"));
            transactional_tests!(advisory_tx, advisory_lock());
            batch_tests!(lease_batch, false, lease("locked_until"));
            batch_tests!(advisory_batch, false, advisory_lock());
            redelivery_tests!(lease_redelivery, lease("locked_until"));
            redelivery_tests!(advisory_redelivery, advisory_lock());
            shutdown_tests!(lease_shutdown, lease("locked_until"));
            shutdown_tests!(advisory_shutdown, advisory_lock());
            poison_tests!(
                lease_poison,
                true,
                lease("locked_until").lease_duration(std::time::Duration::from_millis(300))
            );
            poison_tests!(advisory_poison, true, advisory_lock());
            attempt_column_tests!(lease_attempts, true, lease("locked_until"));
            attempt_column_tests!(advisory_attempts, true, advisory_lock());
            $(
                held_form_tests!($row_lock, row_lock, false);
                dead_letter_tests!(row_lock_dead, false, $row_lock());
                transactional_tests!(row_lock_tx, $row_lock());
                batch_tests!(row_lock_batch, true, $row_lock());
                redelivery_tests!(row_lock_redelivery, $row_lock());
                shutdown_tests!(row_lock_shutdown, $row_lock());
                poison_tests!(row_lock_poison, false, $row_lock());
                attempt_column_tests!(row_lock_attempts, false, $row_lock());
            )?
        }
    )*};
}

// SQLite has no row locks: `.row_lock()` does not compile there.
per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres, row_lock;
    mysql => sqlx::MySql, row_lock;
}
