//! Unique enqueues under contention, a binary of their own (the `it` binary takes many minutes
//! to build): counted against ledgers over many rounds, on every database.
//!
//! `rollbacks.rs`: enqueues waiting for a key an open transaction took are told how it ended —
//! when it rolls back, exactly one of them makes the job and the others are told of it; with
//! transactions that commit and roll back in turns, the job is there once. `contention.rs`:
//! enqueues on a pool of the same keys in different orders, and replaces beside a runner, are
//! answered without an error: the crate takes keys in one order and runs its own transaction
//! again after a deadlock.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod contention;
mod rollbacks;

use sqlx_queue::state::Lease;
use sqlx_queue::{Queue, Table};

use support::{Ctx, Spec, TestDb};

/// A lease table with a `dedupe` unique key and a `created_at` default.
async fn unique_table<DB: TestDb>(ctx: &mut Ctx<DB>) -> String {
    let name = ctx.table(Spec::lease()).await;
    ctx.exec(&format!("DROP TABLE {name}")).await;
    let spec = Spec {
        created_at: true,
        ..Spec::lease()
    };
    let ddl = DB::ddl(&name, spec);
    let ddl = format!(
        "{}, dedupe {})",
        ddl.strip_suffix(')').expect("a CREATE TABLE"),
        DB::TEXT
    );
    ctx.exec(&ddl).await;
    ctx.exec(&format!(
        "CREATE UNIQUE INDEX {name}_dedupe ON {name} (dedupe)"
    ))
    .await;
    name
}

/// The lease queue on the table (its lease column tells a replace a job in work).
fn jobs(t: &str) -> Queue<Lease> {
    let table = Table::new(t)
        .unique_key("dedupe")
        .retry_after("retry_after")
        .created_at("created_at");
    Queue::table(table).lease("locked_until")
}

/// One module per database, with every test as a `#[tokio::test]` under its own name.
macro_rules! per_database {
    ($($db:ident => $ty:ty);* $(;)?) => {$(
        mod $db {
            cases!($ty:
                a_rollback_leaves_the_key_to_one_waiting_enqueue,
                commits_and_rollbacks_in_turns_leave_the_job_once,
                bulk_enqueues_of_one_key_set_in_any_order_all_succeed,
                replaces_beside_a_runner_all_succeed,
            );
        }
    )*};
}

macro_rules! cases {
    ($db:ty: $($test:ident),+ $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            crate::support::on_server_of(module_path!(), crate::cases::$test::<$db>()).await;
        }
    )+};
}

mod cases {
    pub(crate) use crate::contention::*;
    pub(crate) use crate::rollbacks::*;
}

per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres;
    postgres18 => sqlx::Postgres;
    mysql => sqlx::MySql;
}
