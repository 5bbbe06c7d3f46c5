// Text and JSON payload columns (`Table::payload_type`): jobs are stored as text, handlers read
// the text's bytes, on every form; bad payloads and mismatched declarations are refused.

use std::time::Duration;

use serde::Deserialize;
use sqlx_queue::{DeadLetter, Delivery, Error, Job, Outcome, PayloadType, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{AdvisoryForm, Ctx, Form, LeaseForm, Spec, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(payload<$db>:
            text_payloads_are_stored_as_text_and_read_as_their_bytes,
            json_payloads_round_trip_as_values,
            a_text_payload_moves_to_its_dead_letter_table_as_it_was,
            payloads_and_declarations_that_do_not_fit_are_refused,
            a_dead_letter_table_of_another_payload_type_is_refused_at_start,
            a_latin1_text_payload_is_read_as_utf8,
        );
    };
}
pub(crate) use tests;

/// The payload column's type for `payload_type` here.
fn column_type<DB: TestDb>(payload_type: PayloadType) -> &'static str {
    match (DB::LABEL, payload_type) {
        ("postgres", PayloadType::Json) => "JSON",
        ("postgres", PayloadType::Jsonb) => "JSONB",
        ("mysql", PayloadType::Json | PayloadType::Jsonb) => "JSON",
        ("mysql", _) => "LONGTEXT CHARACTER SET utf8mb4",
        ("sqlite", PayloadType::Json | PayloadType::Jsonb) => "TEXT",
        _ => "TEXT",
    }
}

/// A fresh queue table (with attempt, lease and `retry_after`) whose payload column is `ty`.
async fn table_with_payload<DB: TestDb>(ctx: &mut Ctx<DB>, ty: &str) -> String {
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!("DROP TABLE {t}")).await;
    let bytes = match DB::LABEL {
        "postgres" => " BYTEA NOT NULL",
        "mysql" => " LONGBLOB NOT NULL",
        _ => " BLOB NOT NULL",
    };
    let ddl = DB::ddl(&t, Spec::lease());
    assert!(ddl.contains(bytes), "{ddl}");
    ctx.exec(&ddl.replacen(bytes, &format!(" {ty} NOT NULL"), 1))
        .await;
    t
}

fn jobs(t: &str, payload_type: PayloadType) -> Table {
    Table::new(t)
        .retry_after("retry_after")
        .payload_type(payload_type)
}

#[derive(Debug, Deserialize, PartialEq)]
struct Body {
    name: String,
    n: Vec<i64>,
}

const TEXT: &str = "héllo ✓ 'quoted' \"double\" ; -- not a comment";

/// Enqueues two jobs (one alone, one in a bulk insert), drains them with the form `F`, and
/// returns the payloads the handler saw.
async fn drain<DB: TestDb, F: Form<DB>>(
    ctx: &Ctx<DB>,
    t: &str,
    payload_type: PayloadType,
    payloads: &[&str],
) -> Vec<Vec<u8>> {
    let table = jobs(t, payload_type);
    DB::enqueue(&ctx.pool, &table, Job::new(payloads[0]))
        .await
        .unwrap();
    let rest: Vec<Job<'_>> = payloads[1..].iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &table, &rest).await.unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(table))
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.into_payload());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in payloads {
        got.push(recv(&mut seen, "a text payload's delivery", 10).await);
    }
    ctx.wait_none(t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    got.sort();
    got
}

pub(crate) async fn text_payloads_are_stored_as_text_and_read_as_their_bytes<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let ty = column_type::<DB>(PayloadType::Text);
    let mut want = vec![TEXT.as_bytes().to_vec(), b"".to_vec(), b"plain".to_vec()];
    want.sort();

    let t = table_with_payload(&mut ctx, ty).await;
    // Stored as text: the database compares it with a text literal.
    DB::enqueue(&ctx.pool, &jobs(&t, PayloadType::Text), Job::new("probe"))
        .await
        .unwrap();
    assert_eq!(
        ctx.count(&t, "payload = 'probe'").await,
        1,
        "the payload is stored as text"
    );
    ctx.exec(&format!("DELETE FROM {t}")).await;

    let got = drain::<DB, LeaseForm>(&ctx, &t, PayloadType::Text, &[TEXT, "", "plain"]).await;
    assert_eq!(got, want, "lease");
    let t = table_with_payload(&mut ctx, ty).await;
    let got = drain::<DB, AdvisoryForm>(&ctx, &t, PayloadType::Text, &[TEXT, "", "plain"]).await;
    assert_eq!(got, want, "advisory lock");
    ctx.drop_tables().await;
}

pub(crate) async fn json_payloads_round_trip_as_values<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let json = r#"{"name": "héllo ✓", "n": [1, 2, 3]}"#;
    let other = r#"{"n":[],"name":""}"#;
    for payload_type in [PayloadType::Json, PayloadType::Jsonb] {
        let t = table_with_payload(&mut ctx, column_type::<DB>(payload_type)).await;
        let got = drain::<DB, LeaseForm>(&ctx, &t, payload_type, &[json, other]).await;
        let mut bodies: Vec<Body> = got
            .iter()
            .map(|bytes| serde_json::from_slice(bytes).expect("the handler reads JSON"))
            .collect();
        bodies.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            bodies,
            [
                Body {
                    name: String::new(),
                    n: vec![]
                },
                Body {
                    name: "héllo ✓".into(),
                    n: vec![1, 2, 3]
                },
            ],
            "{payload_type:?}"
        );
    }
    ctx.drop_tables().await;
}

pub(crate) async fn a_text_payload_moves_to_its_dead_letter_table_as_it_was<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let ty = column_type::<DB>(PayloadType::Text);
    let t = table_with_payload(&mut ctx, ty).await;
    let dead = table_with_payload(&mut ctx, ty).await;
    DB::enqueue(&ctx.pool, &jobs(&t, PayloadType::Text), Job::new(TEXT))
        .await
        .unwrap();
    let queue = Queue::table(jobs(&t, PayloadType::Text))
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(1)
        .dead_letter(DeadLetter::table(dead.clone()))
        .handler(|_: Delivery<DB>| async { Outcome::retry() });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    let quoted = TEXT.replace('\'', "''");
    assert_eq!(
        ctx.count(&dead, &format!("payload = '{quoted}'")).await,
        1,
        "the dead-lettered row keeps its text"
    );
    ctx.drop_tables().await;
}

pub(crate) async fn payloads_and_declarations_that_do_not_fit_are_refused<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = table_with_payload(&mut ctx, column_type::<DB>(PayloadType::Text)).await;
    // Bytes that are not UTF-8 cannot be text: refused before any statement.
    let refused = DB::enqueue(
        &ctx.pool,
        &jobs(&t, PayloadType::Text),
        Job::new(&[0xff, 0xfe, 0x00][..]),
    )
    .await;
    match refused {
        Err(Error::InvalidJob { reason, .. }) => assert!(reason.contains("UTF-8"), "{reason}"),
        other => panic!("a non-UTF-8 payload for a text column: {other:?}"),
    }
    let nul = DB::enqueue(&ctx.pool, &jobs(&t, PayloadType::Text), Job::new("a\0b")).await;
    assert!(
        matches!(nul, Err(Error::InvalidJob { .. })),
        "a NUL byte in text: {nul:?}"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);

    // A text column declared as bytes (the default), and a bytes column declared as text.
    let bytes = ctx.table(Spec::lease()).await;
    let pool = ctx.pool.clone();
    let start = |table: Table| {
        let queue = Queue::table(table)
            .lease("locked_until")
            .attempt("attempt")
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        Runner::new(pool.clone()).mount(queue).start()
    };
    let Err(Error::Schema(error)) = start(jobs(&t, PayloadType::Bytes)).await else {
        panic!("a text payload column declared as bytes started");
    };
    assert_eq!(error.column.as_deref(), Some("payload"), "{error}");
    assert!(error.to_string().contains("payload_type"), "{error}");
    let Err(Error::Schema(error)) = start(jobs(&bytes, PayloadType::Text)).await else {
        panic!("a bytes payload column declared as text started");
    };
    assert_eq!(error.column.as_deref(), Some("payload"), "{error}");

    if DB::LABEL == "sqlite" {
        // A column declared JSON has numeric affinity on SQLite: it would turn `1e2` into 100.0.
        let json = table_with_payload(&mut ctx, "JSON").await;
        let Err(Error::Schema(error)) = start(jobs(&json, PayloadType::Json)).await else {
            panic!("a SQLite JSON (numeric affinity) column started as a JSON payload");
        };
        assert!(error.to_string().contains("affinity"), "{error}");
    }
    ctx.drop_tables().await;
}

pub(crate) async fn a_dead_letter_table_of_another_payload_type_is_refused_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = table_with_payload(&mut ctx, column_type::<DB>(PayloadType::Text)).await;
    let bytes = ctx.table(Spec::lease()).await;
    let queue = Queue::table(jobs(&t, PayloadType::Text))
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::table(bytes.clone()))
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let started = Runner::new(ctx.pool.clone()).mount(queue).start().await;
    let Err(Error::Schema(error)) = started else {
        panic!("a text queue with a bytes dead-letter table started");
    };
    assert_eq!(error.table, bytes, "{error}");
    assert_eq!(error.column.as_deref(), Some("payload"), "{error}");
    ctx.drop_tables().await;
}

/// MySQL/MariaDB: a text column in another character set is still read as UTF-8.
pub(crate) async fn a_latin1_text_payload_is_read_as_utf8<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    if DB::LABEL != "mysql" {
        return;
    }
    let t = table_with_payload(&mut ctx, "TEXT CHARACTER SET latin1").await;
    let got = drain::<DB, LeaseForm>(&ctx, &t, PayloadType::Text, &["café", "naïve"]).await;
    assert_eq!(
        got,
        ["café".as_bytes(), "naïve".as_bytes()],
        "UTF-8 from a latin1 column"
    );
    ctx.drop_tables().await;
}
