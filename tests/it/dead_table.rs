// A dead-letter table must take every row its queue moves into it: `start()` refuses one that
// could not, naming the table and the column, and accepts columns that fill themselves.

use std::time::Duration;

use sqlx_queue::{DeadLetter, Delivery, Error, Job, Outcome, Queue, Runner, SchemaError, Table};

use crate::support::{Ctx, Spec, TestDb};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(dead_table<$db>:
            a_not_null_column_of_the_dead_letter_tables_own_without_a_default_is_refused,
            columns_that_fill_themselves_and_a_wider_attempt_take_moved_rows,
            a_dead_letter_column_of_another_type_is_refused,
        );
    };
}
pub(crate) use tests;

/// Replaces the lease table `name` (created by `ctx.table`, so dropped at the end) by one whose
/// DDL is the usual one changed by `edit`.
async fn recreate<DB: TestDb>(ctx: &Ctx<DB>, name: &str, edit: impl FnOnce(String) -> String) {
    ctx.exec(&format!("DROP TABLE {name}")).await;
    ctx.exec(&edit(DB::ddl(name, Spec::lease()))).await;
}

/// `columns` added at the end of a table's DDL.
fn with_columns(ddl: String, columns: &str) -> String {
    let body = ddl.strip_suffix(')').expect("a CREATE TABLE");
    format!("{body}, {columns})")
}

/// A runner of one queue of `t` that moves every row to the table `dead` at its first failure.
fn capped<DB: TestDb>(ctx: &Ctx<DB>, t: &str, dead: &str) -> Runner<DB> {
    let queue = Queue::table(Table::new(t).retry_after("retry_after"))
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(1)
        .dead_letter(DeadLetter::table(dead))
        .handler(|_: Delivery<DB>| async { Outcome::retry() });
    Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
}

async fn refused<DB: TestDb>(ctx: &Ctx<DB>, t: &str, dead: &str) -> SchemaError {
    let started = capped(ctx, t, dead).start().await;
    match started {
        Err(Error::Schema(error)) => *error,
        Err(other) => panic!("expected a schema error naming `{dead}`, got {other}"),
        Ok(_) => panic!("a queue whose dead-letter table `{dead}` cannot take its rows started"),
    }
}

pub(crate) async fn a_not_null_column_of_the_dead_letter_tables_own_without_a_default_is_refused<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let dead = ctx.table(Spec::lease()).await;
    recreate(&ctx, &dead, |ddl| {
        with_columns(ddl, "reason VARCHAR(16) NOT NULL")
    })
    .await;
    let error = refused(&ctx, &t, &dead).await;
    assert_eq!(
        (error.table.as_str(), error.column.as_deref()),
        (dead.as_str(), Some("reason"))
    );
    assert!(error.to_string().contains("NOT NULL"), "{error}");

    // A column the queue table lets be NULL, which the dead-letter table does not.
    let time = DB::TIME;
    recreate(&ctx, &dead, |ddl| {
        ddl.replace(
            &format!("retry_after {time}"),
            &format!("retry_after {time} NOT NULL"),
        )
    })
    .await;
    let error = refused(&ctx, &t, &dead).await;
    assert_eq!(
        (error.table.as_str(), error.column.as_deref()),
        (dead.as_str(), Some("retry_after"))
    );
    ctx.drop_tables().await;
}

pub(crate) async fn columns_that_fill_themselves_and_a_wider_attempt_take_moved_rows<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let dead = ctx.table(Spec::lease()).await;
    // The dead-letter table's own key (serial, AUTO_INCREMENT, SQLite's rowid alias), a NOT NULL
    // column with a default, and a wider attempt column.
    let (key, id, int, wide) = match DB::LABEL {
        "postgres" => ("BIGSERIAL", "BIGINT", "INT", "BIGINT"),
        "mysql" => ("BIGINT AUTO_INCREMENT", "BIGINT", "INT", "BIGINT"),
        _ => ("INTEGER", "INTEGER", "INTEGER", "BIGINT"),
    };
    recreate(&ctx, &dead, |ddl| {
        let own_id = ddl
            .split(['(', ','])
            .nth(1)
            .expect("the id column first")
            .trim()
            .to_owned();
        let ddl = ddl
            .replace(
                &own_id,
                &format!("dead_id {key} PRIMARY KEY, id {id} NOT NULL"),
            )
            .replace(&format!("attempt {int} "), &format!("attempt {wide} "));
        with_columns(ddl, "reason VARCHAR(16) NOT NULL DEFAULT 'dead'")
    })
    .await;
    let table = Table::new(&t).retry_after("retry_after");
    let a = DB::enqueue(&ctx.pool, &table, Job::new("a")).await.unwrap();
    let b = DB::enqueue(&ctx.pool, &table, Job::new("b")).await.unwrap();
    let running = capped(&ctx, &t, &dead).start().await.unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    let moved =
        format!("id IN ({a}, {b}) AND reason = 'dead' AND dead_id IS NOT NULL AND attempt = 2");
    assert_eq!(
        ctx.count(&dead, &moved).await,
        2,
        "both rows moved, their own columns filled"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_dead_letter_column_of_another_type_is_refused<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let dead = ctx.table(Spec::lease()).await;
    let time = DB::TIME;
    recreate(&ctx, &dead, |ddl| {
        ddl.replace(&format!("retry_after {time}"), "retry_after INTEGER")
    })
    .await;
    let error = refused(&ctx, &t, &dead).await;
    assert_eq!(
        (error.table.as_str(), error.column.as_deref()),
        (dead.as_str(), Some("retry_after"))
    );
    assert!(error.reason.contains("type"), "{error}");

    // A narrower attempt column (SQLite's integers are all 64-bit: same affinity, accepted).
    if DB::LABEL != "sqlite" {
        recreate(&ctx, &dead, |ddl| {
            ddl.replace("attempt INT ", "attempt SMALLINT ")
        })
        .await;
        let error = refused(&ctx, &t, &dead).await;
        assert_eq!(
            (error.table.as_str(), error.column.as_deref()),
            (dead.as_str(), Some("attempt"))
        );
    }
    ctx.drop_tables().await;
}
