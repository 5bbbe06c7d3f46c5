//! The reliability suite (issue 8): the failure modes a job queue meets in production, each run
//! against the real databases, on every claim form that applies, asserting the same invariants —
//! every enqueued row handled at least once and settled exactly once, the queue table empty at
//! the end, no lease, row lock or advisory key left, and (row lock, advisory) no row in two
//! handlers at once while its session lives — and printing what it measured (`measured: ..`).
//!
//! 1. `crash`: a consumer process killed with SIGKILL three times during a drain.
//! 2. `restart`: dedicated PostgreSQL and MariaDB servers restarted in the middle of a drain.
//! 3. `killed`: the runner's database sessions ended by the server while handlers work.
//! 4. `pool`: pools smaller than a form needs, and pools of exactly its size under load.
//! 5. `expiry`: a handler outliving its lease while the extension is blocked.
//! 6. `shutdown`: `shutdown()` with 8 deliveries in work.
//! 7. `input`: hostile names, payloads of every shape, columns of the wrong type, bad JSON.
//! 8. `soak`: three consumer processes over many jobs with random outcomes (size:
//!    `SQLX_QUEUE_SOAK`).
//!
//! Databases follow `tests/it`: SQLite always; PostgreSQL and MariaDB/MySQL at
//! `SQLX_QUEUE_PG_URL` and `SQLX_QUEUE_MYSQL_URL`, skipped with a notice when unset (a failure
//! under `SQLX_QUEUE_REQUIRE_ALL=1`). `cargo test --test reliability postgres_` runs one database.

/// One test per database and claim form: `cases!(scenario: name => Db, Form; ..)`.
macro_rules! cases {
    ($scenario:ident: $($name:ident => $db:ty, $form:ty);* $(;)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $scenario::<$db, $form>().await;
        }
    )*};
}

/// `cases!` for every claim form on every database that has it, under the names the scenarios
/// share: `every_form!(scenario)` writes `postgres_lease` .. `sqlite_advisory` (SQLite has no row
/// lock form), `every_form!(scenario: servers)` only the six on PostgreSQL and MySQL/MariaDB.
macro_rules! every_form {
    ($scenario:ident) => {
        every_form!($scenario: servers);
        cases! { $scenario:
            sqlite_lease => sqlx::Sqlite, crate::support::LeaseForm;
            sqlite_advisory => sqlx::Sqlite, crate::support::AdvisoryForm;
        }
    };
    ($scenario:ident: servers) => {
        cases! { $scenario:
            postgres_lease => sqlx::Postgres, crate::support::LeaseForm;
            postgres_row_lock => sqlx::Postgres, crate::support::RowLockForm;
            postgres_advisory => sqlx::Postgres, crate::support::AdvisoryForm;
            mysql_lease => sqlx::MySql, crate::support::LeaseForm;
            mysql_row_lock => sqlx::MySql, crate::support::RowLockForm;
            mysql_advisory => sqlx::MySql, crate::support::AdvisoryForm;
        }
    };
}

/// One test per database: `per_database!(scenario: name => Db; ..)`.
macro_rules! per_database {
    ($scenario:ident: $($name:ident => $db:ty);* $(;)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            $scenario::<$db>().await;
        }
    )*};
}

mod support;

#[path = "../../examples/consumer/soak.rs"]
mod outcomes;

mod crash;
mod expiry;
mod input;
mod killed;
mod pool;
mod restart;
mod servers;
mod shutdown;
mod soak;
