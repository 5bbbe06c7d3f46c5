// Clear errors where a driver's own words would not say what is wrong: a payload larger than
// MySQL/MariaDB take in one statement, a table name outside MySQL/MariaDB's identifiers, a table
// qualified PostgreSQL's way on SQLite; and what a bytes job does in a text payload column.

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Running, SchemaError, Table};

use crate::support::{Ctx, Spec, TestDb};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(refusals<$db>:
            a_payload_larger_than_max_allowed_packet_names_the_setting_and_its_size,
            a_name_beyond_mysqls_identifier_characters_is_an_identifier_error,
            a_table_qualified_postgresqls_way_on_sqlite_names_the_attached_databases,
            bytes_into_a_text_payload_column_do_what_the_docs_say,
        );
    };
}
pub(crate) use tests;

async fn start<DB: TestDb>(ctx: &Ctx<DB>, table: Table) -> sqlx_queue::Result<Running> {
    let queue = Queue::table(table)
        .lease("locked_until")
        .attempt("attempt")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    Runner::new(ctx.pool.clone()).mount(queue).start().await
}

/// Checks that `result` is `Error::PayloadTooLarge` for more than `limit` bytes.
fn too_large<T: std::fmt::Debug>(result: sqlx_queue::Result<T>, t: &str, limit: usize) {
    match result {
        Err(error @ Error::PayloadTooLarge { .. }) => {
            let Error::PayloadTooLarge {
                table,
                bytes,
                setting,
                ..
            } = &error
            else {
                unreachable!()
            };
            assert_eq!(table, t);
            assert!(*bytes > limit as u64, "{bytes} bytes, the limit is {limit}");
            assert_eq!(*setting, "max_allowed_packet");
            let message = error.to_string();
            assert!(message.contains("max_allowed_packet"), "{message}");
            assert!(message.contains(&bytes.to_string()), "{message}");
        }
        other => panic!("expected Error::PayloadTooLarge, got {other:?}"),
    }
}

pub(crate) async fn a_payload_larger_than_max_allowed_packet_names_the_setting_and_its_size<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    if DB::LABEL != "mysql" {
        return;
    }
    let t = ctx.table(Spec::lease()).await;
    let table = Table::new(&t);
    // The server's setting as it is (other tests share the server: it is not changed).
    let limit = DB::count(&ctx.pool, "SELECT CAST(@@max_allowed_packet AS SIGNED)")
        .await
        .unwrap();
    let limit = usize::try_from(limit).unwrap();

    let big = vec![b'x'; limit + 1];
    too_large(
        DB::enqueue(&ctx.pool, &table, Job::new(&big)).await,
        &t,
        limit,
    );
    // Two jobs that fit one by one, not together in one statement.
    let half = vec![b'y'; limit / 2 + 1];
    let both = [Job::new(&half), Job::new(&half)];
    too_large(DB::enqueue_many(&ctx.pool, &table, &both).await, &t, limit);
    // In the caller's transaction too; it rolls back as usual.
    let mut tx = ctx.pool.begin().await.unwrap();
    too_large(
        DB::enqueue_on(&mut *tx, &table, Job::new(&big)).await,
        &t,
        limit,
    );
    drop(tx);
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "nothing inserted");
    DB::enqueue_many(&ctx.pool, &table, &both[..1])
        .await
        .unwrap();
    assert_eq!(
        ctx.count(&t, "1 = 1").await,
        1,
        "a job that fits is inserted"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn a_name_beyond_mysqls_identifier_characters_is_an_identifier_error<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    if DB::LABEL != "mysql" {
        return;
    }
    let t = ctx.table(Spec::lease()).await;
    // A CJK letter beyond the Basic Multilingual Plane (U+20000), and an emoji.
    for suffix in ["\u{20000}", "\u{1F980}"] {
        let name = format!("{t}_{suffix}");
        let identifier = |result: &sqlx_queue::Result<_>| match result {
            Err(Error::Identifier {
                name: refused,
                reason,
            }) => {
                assert!(reason.contains("Basic Multilingual Plane"), "{reason}");
                refused.clone()
            }
            Err(other) => panic!("{name}: expected Error::Identifier, got {other}"),
            Ok(_) => panic!("{name}: accepted"),
        };
        assert_eq!(
            identifier(&start(&ctx, Table::new(&name)).await.map(drop)),
            name
        );
        let enqueued = DB::enqueue(&ctx.pool, &Table::new(&name), Job::new("x")).await;
        assert_eq!(identifier(&enqueued.map(drop)), name);
        let column = format!("payload_{suffix}");
        let started = start(&ctx, Table::new(&t).payload(&column)).await;
        assert_eq!(identifier(&started.map(drop)), column);
    }
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    ctx.drop_tables().await;
}

pub(crate) async fn a_table_qualified_postgresqls_way_on_sqlite_names_the_attached_databases<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    if DB::LABEL != "sqlite" {
        return;
    }
    let t = ctx.table(Spec::lease()).await;
    let public = format!("public.{t}");
    let schema_error = |result: sqlx_queue::Result<()>| -> SchemaError {
        match result {
            Err(Error::Schema(error)) => {
                assert_eq!(error.table, public);
                assert!(error.reason.contains("attached database"), "{error}");
                assert!(error.reason.contains(&format!("`main.{t}`")), "{error}");
                assert!(error.reason.contains("`public`"), "{error}");
                *error
            }
            Err(other) => panic!("expected Error::Schema, got {other}"),
            Ok(()) => panic!("{public}: accepted"),
        }
    };
    let error = schema_error(start(&ctx, Table::new(&public)).await.map(drop));
    assert!(
        error
            .reason
            .contains("is not an attached database (attached: main)"),
        "{error}"
    );
    schema_error(
        DB::enqueue(&ctx.pool, &Table::new(&public), Job::new("x"))
            .await
            .map(drop),
    );
    schema_error(
        DB::enqueue_many(&ctx.pool, &Table::new(&public), &[Job::new("x")])
            .await
            .map(drop),
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "nothing inserted");

    // SQLite's own qualification works.
    let main = format!("main.{t}");
    DB::enqueue(&ctx.pool, &Table::new(&main), Job::new("x"))
        .await
        .unwrap();
    start(&ctx, Table::new(&main))
        .await
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    ctx.drop_tables().await;
}

/// What each database does with a bytes job in a text payload column (a `Table` left at
/// `PayloadType::Bytes`), as `Table::payload_type` documents it; a runner refuses the table.
pub(crate) async fn bytes_into_a_text_payload_column_do_what_the_docs_say<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!("DROP TABLE {t}")).await;
    let (bytes, text) = match DB::LABEL {
        "postgres" => (" BYTEA NOT NULL", " TEXT NOT NULL"),
        "mysql" => (
            " LONGBLOB NOT NULL",
            " LONGTEXT CHARACTER SET utf8mb4 NOT NULL",
        ),
        _ => (" BLOB NOT NULL", " TEXT NOT NULL"),
    };
    ctx.exec(&DB::ddl(&t, Spec::lease()).replacen(bytes, text, 1))
        .await;
    let table = Table::new(&t);
    let utf8 = DB::enqueue(&ctx.pool, &table, Job::new("plain text")).await;
    let binary = DB::enqueue(&ctx.pool, &table, Job::new(&[0xff, 0xfe, 0x00])).await;
    match DB::LABEL {
        "postgres" => {
            // An assignment cast stores the bytes' hex text.
            utf8.unwrap();
            binary.unwrap();
            let hex = r"payload = '\x706c61696e2074657874' OR payload = '\xfffe00'";
            assert_eq!(ctx.count(&t, hex).await, 2);
        }
        "mysql" => {
            utf8.unwrap();
            assert_eq!(ctx.count(&t, "payload = 'plain text'").await, 1);
            let Err(Error::Database(error)) = binary else {
                panic!("bytes that are not UTF-8 in a utf8mb4 column: {binary:?}");
            };
            assert!(
                error.to_string().contains("Incorrect string value"),
                "{error}"
            );
        }
        _ => {
            // Stored as they are: a BLOB value in a TEXT column.
            utf8.unwrap();
            binary.unwrap();
            assert_eq!(ctx.count(&t, "typeof(payload) = 'blob'").await, 2);
        }
    }
    let Err(Error::Schema(error)) = start(&ctx, table).await else {
        panic!("a text payload column declared as bytes started");
    };
    assert_eq!(error.column.as_deref(), Some("payload"), "{error}");
    ctx.drop_tables().await;
}
