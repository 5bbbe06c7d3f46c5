//! The tables `Schema` creates, a binary of its own (the `it` binary takes many minutes to
//! build): on every database, each combination of roles the examples and tests declare is
//! created by `Runner::schema` / `Queue::schema` (twice: the statements are idempotent), a
//! runner starts on it, and jobs go through — acked (row deleted or marked), failed into the
//! dead letter (group or table), skipped as a unique duplicate, ticked by a schedule, cancelled
//! in work, rate limited — counted in the tables. `fixes.rs`: `Runner::start`'s errors for a
//! missing table, column or unique index name the statement that creates it, and running that
//! statement lets the runner start; the guide's queue-table blocks (`docs/guide/table.md`)
//! create tables a runner starts on. The text of the statements is unit-tested in `src/dialect/schema/tests.rs`.

#[allow(
    dead_code,
    unused_imports,
    reason = "`tests/it`'s support, of which these tests use a part"
)]
#[path = "../it/support/mod.rs"]
mod support;

mod fixes;
mod flows;
mod tables;

use sqlx_queue::Schema;

use support::{Ctx, TestDb};

/// A table name no other test uses, with this binary's prefix.
pub(crate) fn name() -> String {
    format!("schema_{}", support::unique())
}

/// Runs `schema` twice: the second run changes nothing.
pub(crate) async fn create<DB: TestDb>(ctx: &Ctx<DB>, schema: &Schema) {
    schema
        .create(&ctx.pool)
        .await
        .unwrap_or_else(|e| panic!("{schema}: {e}"));
    schema
        .create(&ctx.pool)
        .await
        .unwrap_or_else(|e| panic!("again, {schema}: {e}"));
}

/// Drops `tables` and ends the context.
pub(crate) async fn drop_all<DB: TestDb>(ctx: Ctx<DB>, tables: &[&str]) {
    for table in tables {
        let _ = DB::exec(&ctx.pool, &format!("DROP TABLE IF EXISTS {table}")).await;
    }
    ctx.drop_tables().await;
}

/// `#[tokio::test]`s running `$area`'s generic tests with the type arguments given.
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

/// One module per database (`postgres18` runs PostgreSQL's on `SQLX_QUEUE_PG18_URL`), with one
/// module per claim form for the flows; `$row_lock` where the database has row locks.
macro_rules! per_database {
    ($($db:ident => $ty:ty $(, $row_lock:ident)?);* $(;)?) => {$(
        mod $db {
            mod lease {
                instantiate!(flows<$ty, crate::support::LeaseForm>: every_role_on_a_created_table);
            }
            mod advisory {
                instantiate!(flows<$ty, crate::support::AdvisoryForm>: every_role_on_a_created_table);
            }
            $(mod $row_lock {
                instantiate!(flows<$ty, crate::support::RowLockForm>: every_role_on_a_created_table);
            })?
            instantiate!(flows<$ty>:
                a_dead_letter_table_takes_the_failed_rows,
                two_queues_on_one_table_share_one_created_table,
                keys_and_groups_differing_in_case_are_apart,
            );
            instantiate!(tables<$ty>:
                text_and_json_payloads_round_trip,
                a_rate_limited_queue_on_its_created_limiter,
                a_cancel_request_reaches_a_job_in_work,
                a_schedule_ticks_into_its_created_tables,
            );
            instantiate!(fixes<$ty>:
                a_missing_table_is_named_with_its_create_statement,
                a_missing_column_is_named_with_its_alter_statement,
                a_missing_unique_index_is_named_with_its_create_statement,
                the_guide_queue_table_blocks_start_a_runner,
            );
        }
    )*};
}

per_database! {
    sqlite => sqlx::Sqlite;
    postgres => sqlx::Postgres, row_lock;
    postgres18 => sqlx::Postgres, row_lock;
    mysql => sqlx::MySql, row_lock;
}
