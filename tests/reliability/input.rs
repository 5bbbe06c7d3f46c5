//! Scenario 7 — Bad input. Hostile table and column names — quotes, semicolons, comments, control
//! characters, over-long — are refused before any statement exists, or (letters of any script,
//! inner spaces) quoted and used as names; a canary table survives every one. Hostile group values
//! and payloads are data, bound as parameters. Payloads of 0 bytes, 1 MiB, non-UTF-8 bytes and NULs
//! round-trip byte for byte through every form. A column of the wrong type is an error naming the
//! column. A payload that does not decode as the JSON handler's type follows the decode policy —
//! dead-lettered where the queue has a dead letter, dropped where it has none — and the runner goes
//! on with the next rows.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx_queue::{DeadLetter, Delivery, Error, Job, Outcome, Queue, Runner, Running, Table};

use crate::support::{
    AdvisoryForm, Ctx, Form, LeaseForm, RowLockForm, Spec, TestDb, report, start_runner, unique,
    wait_for,
};

per_database! { hostile_names:
    postgres => sqlx::Postgres;
    mysql => sqlx::MySql;
    sqlite => sqlx::Sqlite;
}

per_database! { wrong_types:
    postgres_columns => sqlx::Postgres;
    mysql_columns => sqlx::MySql;
    sqlite_columns => sqlx::Sqlite;
}

cases! { payloads:
    postgres_lease_payloads => sqlx::Postgres, LeaseForm;
    postgres_row_lock_payloads => sqlx::Postgres, RowLockForm;
    postgres_advisory_payloads => sqlx::Postgres, AdvisoryForm;
    mysql_lease_payloads => sqlx::MySql, LeaseForm;
    mysql_row_lock_payloads => sqlx::MySql, RowLockForm;
    mysql_advisory_payloads => sqlx::MySql, AdvisoryForm;
    sqlite_lease_payloads => sqlx::Sqlite, LeaseForm;
    sqlite_advisory_payloads => sqlx::Sqlite, AdvisoryForm;
}

cases! { undecodable:
    postgres_lease_json => sqlx::Postgres, LeaseForm;
    postgres_row_lock_json => sqlx::Postgres, RowLockForm;
    postgres_advisory_json => sqlx::Postgres, AdvisoryForm;
    mysql_lease_json => sqlx::MySql, LeaseForm;
    mysql_row_lock_json => sqlx::MySql, RowLockForm;
    mysql_advisory_json => sqlx::MySql, AdvisoryForm;
    sqlite_lease_json => sqlx::Sqlite, LeaseForm;
    sqlite_advisory_json => sqlx::Sqlite, AdvisoryForm;
}

/// `name` quoted as the database quotes identifiers.
fn quoted<DB: TestDb>(name: &str) -> String {
    if DB::LABEL == "mysql" {
        format!("`{name}`")
    } else {
        format!("\"{name}\"")
    }
}

/// Starts a lease queue of `table` whose handler reports each payload.
async fn start<DB: TestDb>(
    ctx: &Ctx<DB>,
    table: Table,
    named: Option<&str>,
) -> (
    sqlx_queue::Result<Running>,
    Arc<Mutex<HashMap<i64, Vec<u8>>>>,
) {
    let seen: Arc<Mutex<HashMap<i64, Vec<u8>>>> = Arc::default();
    let reported = Arc::clone(&seen);
    let mut queue = Queue::table(table);
    if let Some(named) = named {
        queue = queue.named(named);
    }
    let queue = queue
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            reported
                .lock()
                .unwrap()
                .insert(d.id(), d.payload().to_vec());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await;
    (running, seen)
}

fn refused(what: &str, name: &str, result: Result<impl std::fmt::Debug, Error>) {
    match result {
        Err(Error::Identifier { .. }) => {}
        other => panic!("{what} {name:?} was not refused as an identifier: {other:?}"),
    }
}

async fn hostile_names<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let canary = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&canary).retry_after("retry_after");
    DB::enqueue(&ctx.pool, &jobs, Job::new("canary"))
        .await
        .unwrap();
    let hostile = [
        format!("{canary}\"; DROP TABLE {canary}; --"),
        format!("{canary}`; DROP TABLE {canary}; --"),
        format!("{canary}; DROP TABLE {canary}"),
        format!("{canary} -- comment"),
        format!("{canary}/* comment */"),
        format!("{canary}' OR '1' = '1"),
        format!("{canary}\\"),
        format!("{canary}\nDROP TABLE {canary}"),
        format!("{canary}\0"),
        format!("{canary}\u{202e}"),
        format!("x.{canary}.y"),
        format!(" {canary}"),
        String::new(),
        format!("{canary}{}", "x".repeat(300)),
    ];
    for name in &hostile {
        let name = name.as_str();
        refused("table", name, start(&ctx, Table::new(name), None).await.0);
        refused(
            "table",
            name,
            DB::enqueue(&ctx.pool, &Table::new(name), Job::new("x")).await,
        );
        for column in [
            Table::new(&canary).payload(name),
            Table::new(&canary).id(name),
            Table::new(&canary).retry_after(name),
        ] {
            refused("column", name, start(&ctx, column, None).await.0);
        }
        refused(
            "group column",
            name,
            start(&ctx, Table::new(&canary).group(name), Some("g"))
                .await
                .0,
        );
        let lease = Queue::table(Table::new(&canary))
            .lease(name)
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        refused(
            "lease column",
            name,
            Runner::new(ctx.pool.clone()).mount(lease).start().await,
        );
        let dead = Queue::table(Table::new(&canary))
            .lease("locked_until")
            .attempt("attempt")
            .max_attempts(2)
            .dead_letter(DeadLetter::table(name))
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        refused(
            "dead-letter table",
            name,
            Runner::new(ctx.pool.clone()).mount(dead).start().await,
        );
    }

    // Longer than the database keeps: PostgreSQL would cut the name to 63 bytes — the name of
    // another table here — and MySQL refuses more than 64 characters.
    let limit = match DB::LABEL {
        "postgres" => Some(63),
        "mysql" => Some(64),
        _ => None,
    };
    let mut long_note = "no limit on SQLite".to_owned();
    if let Some(limit) = limit {
        let mut kept = format!("r_{}_", unique());
        while kept.len() < limit {
            kept.push('k');
        }
        ctx.create(&kept, &DB::ddl(&kept, Spec::lease())).await;
        DB::enqueue(&ctx.pool, &Table::new(&kept), Job::new("kept"))
            .await
            .unwrap();
        let longer = format!("{kept}z");
        let (started, _) = start(&ctx, Table::new(&longer), None).await;
        let enqueued = DB::enqueue(&ctx.pool, &Table::new(&longer), Job::new("x")).await;
        let reason = match started {
            Err(Error::Identifier { reason, .. }) => reason,
            other => panic!("a {}-byte name was not refused: {other:?}", longer.len()),
        };
        refused("table", &longer, enqueued);
        assert_eq!(
            ctx.count(&kept, "1 = 1").await,
            1,
            "a longer name reached the table of its first {limit} bytes"
        );
        long_note = format!("a {}-byte name refused ({reason})", longer.len());
    }

    // Letters of any script and inner spaces are names: quoted, and used as given.
    let table = format!("r_{} jöbs 名前", unique());
    let column = "nutzlast ü";
    let ddl = DB::ddl(&quoted::<DB>(&table), Spec::lease())
        .replace("payload ", &format!("{} ", quoted::<DB>(column)));
    ctx.create(&quoted::<DB>(&table), &ddl).await;
    let jobs = Table::new(&table)
        .payload(column)
        .retry_after("retry_after");
    let id = DB::enqueue(&ctx.pool, &jobs, Job::new("ünïcödé"))
        .await
        .unwrap();
    let (running, seen) = start(&ctx, jobs.clone(), None).await;
    let running = running.unwrap();
    ctx.wait_none(&quoted::<DB>(&table), "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.lock().unwrap()[&id], "ünïcödé".as_bytes());

    // Hostile values are data: bound, never spliced.
    let grouped = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let value = format!("'); DROP TABLE {canary}; --");
    let jobs = Table::new(&grouped)
        .group("queue")
        .retry_after("retry_after");
    let id = DB::enqueue(&ctx.pool, &jobs, Job::new(&value).group(value.as_str()))
        .await
        .unwrap();
    let (running, seen) = start(&ctx, jobs, Some(&value)).await;
    let running = running.unwrap();
    ctx.wait_none(&grouped, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    assert_eq!(seen.lock().unwrap()[&id], value.as_bytes());

    assert_eq!(
        ctx.count(&canary, "1 = 1").await,
        1,
        "the canary table lost its row"
    );
    report(&format!(
        "bad input: {}: {} hostile names refused as tables, columns, group columns, lease \
         columns and dead-letter tables; {long_note}; a Unicode table and column with spaces \
         quoted and used; a hostile group value and payload bound as data; the canary survived",
        DB::LABEL,
        hostile.len()
    ));
    ctx.drop_tables().await;
}

async fn wrong_types<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (payload, time) = match DB::LABEL {
        "postgres" => ("BYTEA NOT NULL", "TIMESTAMPTZ"),
        "mysql" => ("LONGBLOB NOT NULL", "DATETIME(6)"),
        _ => ("BLOB NOT NULL", "TEXT"),
    };
    let cases = [
        (
            "payload",
            format!("payload {payload}"),
            "payload BIGINT NOT NULL".to_owned(),
        ),
        (
            "locked_until",
            format!("locked_until {time}"),
            "locked_until BIGINT".to_owned(),
        ),
        (
            "retry_after",
            format!("retry_after {time}"),
            "retry_after BIGINT".to_owned(),
        ),
        (
            "attempt",
            "attempt BIGINT NOT NULL DEFAULT 1".to_owned(),
            format!("attempt {payload}"),
        ),
    ];
    for (column, right, wrong) in cases {
        let table = format!("r_{}", unique());
        let ddl = DB::ddl(&table, Spec::lease());
        assert!(ddl.contains(&right), "{ddl}");
        ctx.create(&table, &ddl.replace(&right, &wrong)).await;
        let (started, _) = start(&ctx, Table::new(&table).retry_after("retry_after"), None).await;
        match started {
            Err(Error::Schema(error)) => {
                assert_eq!(error.column.as_deref(), Some(column), "{error}");
                assert!(error.to_string().contains(column), "{error}");
            }
            other => panic!("a {column} column of the wrong type: {other:?}"),
        }
    }
    report(&format!(
        "bad input: {}: payload, lease, retry_after and attempt columns of the wrong type each \
         refused at start with a schema error naming the column",
        DB::LABEL
    ));
    ctx.drop_tables().await;
}

/// 1 MiB of pseudo-random bytes (xorshift), every byte value among them.
fn mebibyte() -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3] // bits 24 to 31
        })
        .collect()
}

async fn payloads<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    let shapes: Vec<(&str, Vec<u8>)> = vec![
        ("0 bytes", Vec::new()),
        ("1 MiB", mebibyte()),
        (
            "non-UTF-8",
            vec![
                0xff, 0xfe, 0x00, 0xc3, 0x28, 0xa0, 0xa1, 0xe2, 0x28, 0xa1, 0x80,
            ],
        ),
        ("NULs and SQL", b"\0'; DROP TABLE x; --\0\r\n\\".to_vec()),
        ("Unicode", "ü 名前 🚀".as_bytes().to_vec()),
    ];
    let mut expected: HashMap<i64, &[u8]> = HashMap::new();
    for (_, bytes) in &shapes {
        let id = DB::enqueue(&ctx.pool, &jobs, Job::new(bytes))
            .await
            .unwrap();
        expected.insert(id, bytes);
    }
    let many: Vec<Job<'_>> = shapes.iter().map(|(_, bytes)| Job::new(bytes)).collect();
    DB::enqueue_many(&ctx.pool, &jobs, &many).await.unwrap();
    let mut ids = ctx.ids(&t, "id").await;
    ids.sort_unstable();
    for (id, (_, bytes)) in ids[shapes.len()..].iter().zip(&shapes) {
        expected.insert(*id, bytes);
    }
    assert_eq!(expected.len(), 2 * shapes.len());
    for (id, bytes) in &expected {
        let stored = DB::bytes(
            &ctx.pool,
            &format!("SELECT payload FROM {t} WHERE id = {id}"),
        )
        .await
        .unwrap();
        assert!(
            stored == *bytes,
            "row {id} stored {} bytes of {}",
            stored.len(),
            bytes.len()
        );
    }

    let seen: Arc<Mutex<HashMap<i64, Vec<u8>>>> = Arc::default();
    let reported = Arc::clone(&seen);
    let queue = F::apply_leasing(Queue::table(jobs), Duration::from_secs(30))
        .attempt("attempt")
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            reported
                .lock()
                .unwrap()
                .insert(d.id(), d.payload().to_vec());
            async { Outcome::ack() }
        });
    let running = start_runner(&ctx.pool, |r| r.mount(queue)).await;
    ctx.wait_none(&t, "1 = 1", 30).await;
    running.shutdown().await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    for (id, bytes) in &expected {
        let got = seen
            .get(id)
            .unwrap_or_else(|| panic!("row {id} never delivered"));
        assert!(
            got == bytes,
            "row {id}: {} bytes delivered of {}",
            got.len(),
            bytes.len()
        );
    }
    report(&format!(
        "bad input: {} {}: payloads of {} round-trip byte for byte (enqueue and enqueue_many)",
        DB::LABEL,
        F::NAME,
        shapes
            .iter()
            .map(|(what, _)| *what)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    ctx.drop_tables().await;
}

#[derive(serde::Deserialize)]
struct Signup {
    email: String,
}

async fn undecodable<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let bad: [&[u8]; 3] = [
        b"not json {",
        &[0xff, 0x00, 0xfe],
        br#"{"name": "no email"}"#,
    ];
    let good = |i: usize| Job::json(&serde_json::json!({ "email": format!("{i}@example.com") }));

    // Capped, with a dead-letter table: bad payloads move there, byte for byte.
    let t = ctx.table(Spec::lease()).await;
    let dead = format!("{t}_dead");
    ctx.create(&dead, &DB::ddl(&dead, Spec::lease())).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    let mut bad_ids = Vec::new();
    for (i, bytes) in bad.iter().enumerate() {
        DB::enqueue(&ctx.pool, &jobs, good(i).unwrap())
            .await
            .unwrap();
        bad_ids.push(
            DB::enqueue(&ctx.pool, &jobs, Job::new(bytes))
                .await
                .unwrap(),
        );
    }
    DB::enqueue(&ctx.pool, &jobs, good(9).unwrap())
        .await
        .unwrap();
    let emails: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&emails);
    let queue = F::apply_leasing(Queue::table(jobs.clone()), Duration::from_secs(30))
        .attempt("attempt")
        .max_attempts(3)
        .dead_letter(DeadLetter::table(&dead))
        .json_handler(move |signup: Signup, _: Delivery<DB>| {
            seen.lock().unwrap().push(signup.email);
            async { Outcome::ack() }
        });
    drain(
        &ctx,
        &t,
        |r| r.mount(queue),
        |s| s.acked == 4 && s.dead_lettered == 3,
    )
    .await;
    assert_eq!(
        emails.lock().unwrap().len(),
        4,
        "the good payloads around the bad ones"
    );
    for (id, bytes) in bad_ids.iter().zip(bad) {
        let moved = DB::bytes(
            &ctx.pool,
            &format!("SELECT payload FROM {dead} WHERE id = {id}"),
        )
        .await
        .unwrap_or_else(|e| panic!("row {id} is not in the dead letter: {e}"));
        assert_eq!(moved, bytes);
    }

    // Uncapped: bad payloads are dropped, and the runner goes on.
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    for (i, bytes) in bad.iter().enumerate() {
        DB::enqueue(&ctx.pool, &jobs, Job::new(bytes))
            .await
            .unwrap();
        DB::enqueue(&ctx.pool, &jobs, good(i).unwrap())
            .await
            .unwrap();
    }
    let emails: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&emails);
    let queue = F::apply_leasing(Queue::table(jobs), Duration::from_secs(30))
        .attempt("attempt")
        .json_handler(move |signup: Signup, _: Delivery<DB>| {
            seen.lock().unwrap().push(signup.email);
            async { Outcome::ack() }
        });
    drain(
        &ctx,
        &t,
        |r| r.mount(queue),
        |s| s.acked == 3 && s.dropped == 3,
    )
    .await;
    assert_eq!(emails.lock().unwrap().len(), 3);
    report(&format!(
        "bad input: {} {}: 3 undecodable payloads dead-lettered byte for byte (capped queue) \
         and dropped (uncapped), the good payloads around them handled",
        DB::LABEL,
        F::NAME
    ));
    ctx.drop_tables().await;
}

/// Runs the runner `mount` makes until `t` is empty and `settled` holds for its counters.
async fn drain<DB: TestDb>(
    ctx: &Ctx<DB>,
    t: &str,
    mount: impl FnOnce(Runner<DB>) -> Runner<DB>,
    settled: impl Fn(&sqlx_queue::Stats) -> bool,
) {
    let running = start_runner(&ctx.pool, mount).await;
    ctx.wait_none(t, "1 = 1", 30).await;
    wait_for(
        "every settlement counted",
        Duration::from_secs(10),
        || async { settled(&running.stats()) },
    )
    .await;
    running.shutdown().await.unwrap();
}
