//! Unique jobs' tests, a binary of their own: the `it` binary takes about 12 GB and many minutes
//! to compile. This one runs `tests/it`'s unique tests (`unique.rs`, `unique_work.rs`, included
//! by `#[path]` as `tests/periodic` includes the support) and the races of `races.rs` on every
//! database: `cargo test --test unique_more mysql::` runs MariaDB/MySQL's.
//!
//! What `races.rs` adds: an enqueuer that waits on the key of a transaction not yet ended gets
//! the key when that transaction rolls back and is told the committed job's id when it commits;
//! eight enqueuers of one key, each in its own transaction, half skipping and half replacing,
//! make one row and are each told the truth. `readme.rs` runs the README's unique column and
//! index for each database, as written, on the README's queue table. `bulk.rs`: a bulk enqueue
//! whose keys meet a job in work, a waiting job to debounce, and a key given twice.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

#[path = "../it/unique.rs"]
mod unique;
#[path = "../it/unique_work.rs"]
mod unique_work;

mod bulk;
mod races;
mod readme;

/// `#[tokio::test]`s that run an area's generic tests with the type arguments given, under the
/// tests' own names (as `tests/it/main.rs`'s).
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

/// One module per database, with one module per area (and form) in it; `postgres18` runs
/// PostgreSQL's on `SQLX_QUEUE_PG18_URL`; `$row_lock` where the database has the row lock form.
macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $row_lock:ident)?);* $(;)?) => {$(
        mod $db {
            mod unique {
                crate::unique::tests!($ty);
            }
            mod races {
                crate::races::tests!($ty);
            }
            mod readme {
                crate::readme::tests!($ty);
            }
            mod bulk {
                crate::bulk::tests!($ty);
            }
            mod lease_unique {
                crate::unique_work::tests!($ty, crate::support::LeaseForm);
            }
            $(
                mod $row_lock {
                    crate::unique_work::tests!($ty, crate::support::RowLockForm);
                }
            )?
        }
    )*};
}

// SQLite has no row locks: `RowLockForm` is not a `Form<sqlx::Sqlite>`.
per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres, row_lock_unique;
    postgres18 => sqlx::Postgres, row_lock_unique;
    mysql => sqlx::MySql, row_lock_unique;
}
