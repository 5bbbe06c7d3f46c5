// What `start()` checks: tables, columns and their types, names, declarations.

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Spec, TestDb};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(schema<$db>:
            a_missing_column_is_named,
            a_missing_table_is_named,
            a_column_of_the_wrong_type_is_named,
            hostile_names_are_refused_and_never_executed,
            a_group_column_and_a_queue_name_go_together,
            a_time_column_that_cannot_be_null_or_a_payload_that_can_is_named,
            a_dead_letter_that_cannot_work_is_found_at_start,
            a_custom_statement_that_cannot_work_is_found_at_start,
        );
    };
}
pub(crate) use tests;

async fn start<DB: TestDb>(ctx: &Ctx<DB>, table: Table) -> sqlx_queue::Result<sqlx_queue::Running> {
    let queue = Queue::table(table)
        .lease("locked_until")
        .attempt("attempt")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    Runner::new(ctx.pool.clone()).mount(queue).start().await
}

fn schema_error(result: sqlx_queue::Result<sqlx_queue::Running>) -> sqlx_queue::SchemaError {
    match result {
        Err(Error::Schema(error)) => *error,
        Err(other) => panic!("expected a schema error, got {other}"),
        Ok(_) => panic!("expected a schema error, the queue started"),
    }
}

pub(crate) async fn a_missing_column_is_named<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            lease: false,
            ..Spec::lease()
        })
        .await;
    let error = schema_error(start(&ctx, Table::new(&t)).await);
    assert_eq!(error.table, t);
    assert_eq!(error.column.as_deref(), Some("locked_until"));
    assert!(error.to_string().contains("locked_until"), "{error}");

    let error = schema_error(start(&ctx, Table::new(&t).retry_after("not_before")).await);
    assert_eq!(error.column.as_deref(), Some("not_before"));
    ctx.drop_tables().await;
}

pub(crate) async fn a_missing_table_is_named<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let error = schema_error(start(&ctx, Table::new("no_such_table_here")).await);
    assert_eq!(error.table, "no_such_table_here");
    assert_eq!(error.column, None);
    ctx.drop_tables().await;
}

pub(crate) async fn a_column_of_the_wrong_type_is_named<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    // The payload column is the lease column's type, and the other way round.
    let error = schema_error(start(&ctx, Table::new(&t).payload("retry_after")).await);
    assert_eq!(error.column.as_deref(), Some("retry_after"));
    assert!(error.reason.contains("payload"), "{error}");
    let error = schema_error(start(&ctx, Table::new(&t).id("payload")).await);
    assert_eq!(error.column.as_deref(), Some("payload"));
    ctx.drop_tables().await;
}

pub(crate) async fn hostile_names_are_refused_and_never_executed<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let canary = ctx.table(Spec::lease()).await;
    let hostile = [
        format!("{canary}\"; DROP TABLE {canary}; --"),
        format!("{canary}`; DROP TABLE {canary}; --"),
        format!("{canary}; DROP TABLE {canary}"),
        format!("{canary} -- comment"),
        format!("{canary}/* c */"),
        format!("{canary}'"),
        "x".repeat(300),
    ];
    for name in &hostile {
        let started = start(&ctx, Table::new(name.as_str())).await;
        assert!(
            matches!(started, Err(Error::Identifier { .. })),
            "{name}: {started:?}"
        );
        let enqueued = DB::enqueue(&ctx.pool, &Table::new(name.as_str()), Job::new("x")).await;
        assert!(
            matches!(enqueued, Err(Error::Identifier { .. })),
            "{name}: {enqueued:?}"
        );
        let column = start(&ctx, Table::new(&canary).payload(name.as_str())).await;
        assert!(
            matches!(column, Err(Error::Identifier { .. })),
            "{name}: {column:?}"
        );
    }
    assert_eq!(
        ctx.count(&canary, "1 = 1").await,
        0,
        "the canary table survives"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_group_column_and_a_queue_name_go_together<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let unnamed = start(&ctx, Table::new(&t).group("queue")).await;
    assert!(
        matches!(unnamed, Err(Error::Declaration { .. })),
        "{unnamed:?}"
    );
    let queue = Queue::table(Table::new(&t))
        .named("mail")
        .lease("locked_until")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let no_column = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    assert!(
        matches!(no_column, Err(Error::Declaration { .. })),
        "{no_column:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_time_column_that_cannot_be_null_or_a_payload_that_can_is_named<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let strict = format!("{t}_strict");
    let time = DB::TIME;
    let ddl = DB::ddl(&strict, Spec::lease()).replace(
        &format!("locked_until {time}"),
        &format!("locked_until {time} NOT NULL"),
    );
    ctx.exec(&ddl).await;
    let error = schema_error(start(&ctx, Table::new(&strict)).await);
    assert_eq!(error.column.as_deref(), Some("locked_until"));
    assert!(error.reason.contains("NULL"), "{error}");
    ctx.exec(&format!("DROP TABLE {strict}")).await;

    let loose = format!("{t}_loose");
    let ddl = DB::ddl(&loose, Spec::lease()).replace(" NOT NULL,", ",");
    ctx.exec(&ddl).await;
    let error = schema_error(start(&ctx, Table::new(&loose)).await);
    assert_eq!(error.column.as_deref(), Some("payload"));
    ctx.exec(&format!("DROP TABLE {loose}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn a_dead_letter_that_cannot_work_is_found_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let capped = |dead: sqlx_queue::DeadLetter| {
        Queue::table(Table::new(&t))
            .lease("locked_until")
            .attempt("attempt")
            .max_attempts(3)
            .dead_letter(dead)
            .handler(|_: Delivery<DB>| async { Outcome::ack() })
    };
    let missing = Runner::new(ctx.pool.clone())
        .mount(capped(sqlx_queue::DeadLetter::table("no_such_dead_table")))
        .start()
        .await;
    let error = schema_error(missing);
    assert_eq!(
        (error.table.as_str(), error.column.as_deref()),
        ("no_such_dead_table", None)
    );

    let narrow = ctx
        .table(Spec {
            retry_after: false,
            ..Spec::lease()
        })
        .await;
    let lacking = Runner::new(ctx.pool.clone())
        .mount(capped(sqlx_queue::DeadLetter::table(&narrow)))
        .start()
        .await;
    let error = schema_error(lacking);
    assert_eq!(
        (error.table.as_str(), error.column.as_deref()),
        (narrow.as_str(), Some("retry_after"))
    );

    let no_group = Runner::new(ctx.pool.clone())
        .mount(capped(sqlx_queue::DeadLetter::group("dead")))
        .start()
        .await;
    assert!(
        matches!(no_group, Err(Error::Declaration { .. })),
        "{no_group:?}"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_custom_statement_that_cannot_work_is_found_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let with = |sql: String| {
        Queue::table(Table::new(&t))
            .lease("locked_until")
            .custom(sqlx_queue::Event::Ack, sql)
            .handler(|_: Delivery<DB>| async { Outcome::ack() })
    };
    let marker = Runner::new(ctx.pool.clone())
        .mount(with(format!("DELETE FROM {t} WHERE id = :row")))
        .start()
        .await;
    assert!(
        matches!(&marker, Err(Error::Declaration { reason, .. }) if reason.contains(":row")),
        "{marker:?}"
    );
    let refused = Runner::new(ctx.pool.clone())
        .mount(with(format!("DELETE FROM {t} WHERE no_such_column = :id")))
        .start()
        .await;
    let error = schema_error(refused);
    assert!(
        error
            .statement
            .is_some_and(|s| s.contains("no_such_column"))
    );
    ctx.drop_tables().await;
}
