//! What cannot be stored is refused at enqueue, never dropped or left to the driver's words;
//! what another writer stored that is not an object of strings is an undecodable row; a column
//! that cannot hold headers is refused at start.

use sqlx_queue::{Delivery, Error, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};
use crate::{column_types, table_with_headers};

fn invalid_job(result: sqlx_queue::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::InvalidJob { reason, .. }) => reason,
        other => panic!("an invalid job, not {other:?}"),
    }
}

pub(crate) async fn headers_into_a_table_without_the_column_are_refused<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t);
    let job = || Job::new("x").header("traceparent", "00-1-2-01");
    let why = invalid_job(DB::enqueue(&ctx.pool, &jobs, job()).await);
    assert!(why.contains("Table::headers"), "{why}");
    let why = invalid_job(DB::enqueue_many(&ctx.pool, &jobs, &[Job::new("y"), job()]).await);
    assert!(why.contains("Table::headers"), "{why}");
    ctx.exec(&format!("ALTER TABLE {t} ADD COLUMN dedupe {}", DB::TEXT))
        .await;
    ctx.exec(&format!("CREATE UNIQUE INDEX {t}_dedupe ON {t} (dedupe)"))
        .await;
    let unique = Queue::table(Table::new(&t).unique_key("dedupe")).lease("locked_until");
    let why = invalid_job(unique.enqueue_unique(&ctx.pool, job().unique("k")).await);
    assert!(why.contains("Table::headers"), "{why}");
    assert_eq!(ctx.count(&t, "1 = 1").await, 0, "nothing inserted");
    // Without headers the same table takes the job.
    DB::enqueue(&ctx.pool, &jobs, Job::new("x")).await.unwrap();
    ctx.drop_tables().await;
}

pub(crate) async fn a_header_with_a_nul_character_is_refused_at_enqueue<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    for ty in column_types::<DB>() {
        let t = table_with_headers(&mut ctx, Spec::lease(), ty).await;
        let jobs = Table::new(&t).headers("headers");
        for job in [
            Job::new("x").header("k", "a\0b"),
            Job::new("x").header("\0", "v"),
        ] {
            let why = invalid_job(DB::enqueue(&ctx.pool, &jobs, job.clone()).await);
            assert!(why.contains("NUL"), "{ty}: {why}");
            let why = invalid_job(DB::enqueue_many(&ctx.pool, &jobs, &[Job::new("ok"), job]).await);
            assert!(why.contains("NUL"), "{ty}: {why}");
        }
        assert_eq!(ctx.count(&t, "1 = 1").await, 0, "{ty}: nothing inserted");
    }
    ctx.drop_tables().await;
}

pub(crate) async fn stored_headers_that_are_not_an_object_of_strings_never_reach_a_handler<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let blob = match DB::LABEL {
        "postgres" => "BYTEA",
        "mysql" => "BINARY",
        _ => "BLOB",
    };
    for ty in column_types::<DB>() {
        let t = table_with_headers(&mut ctx, Spec::lease(), ty).await;
        let mut bad = vec![
            r#"{"a":1}"#,
            r#"["x"]"#,
            r#""s""#,
            r#"{"a":{"b":"c"}}"#,
            "null",
        ];
        if !ty.contains("JSON") {
            bad.extend(["not json", r#"{"a":"b""#]);
        }
        for text in &bad {
            ctx.exec(&format!(
                "INSERT INTO {t} (payload, headers) VALUES (CAST('bad' AS {blob}), '{text}')"
            ))
            .await;
        }
        let jobs = Table::new(&t).headers("headers");
        let good = DB::enqueue(&ctx.pool, &jobs, Job::new("good").header("k", "v"))
            .await
            .unwrap();
        let (tx, mut seen) = mpsc::unbounded_channel();
        let queue = Queue::table(jobs)
            .lease("locked_until")
            .handler(move |d: Delivery<DB>| {
                let _ = tx.send((d.id(), d.header("k").map(str::to_owned)));
                async { Outcome::ack() }
            });
        let running = Runner::new(ctx.pool.clone())
            .mount(queue)
            .start()
            .await
            .unwrap();
        assert_eq!(
            recv(&mut seen, "the good row", 30).await,
            (good, Some("v".to_owned()))
        );
        // No dead letter: an undecodable row is dropped, as an undecodable payload is.
        ctx.wait_none(&t, "1 = 1", 30).await;
        let rows = 1 + bad.len() as u64;
        let stats = || running.stats();
        wait_for(
            "every settlement counted",
            std::time::Duration::from_secs(5),
            || async { stats().acked + stats().dropped >= rows },
        )
        .await;
        let stats = running.stats();
        running.shutdown().await.unwrap();
        assert!(
            seen.try_recv().is_err(),
            "{ty}: a bad row reached the handler"
        );
        assert_eq!(
            (stats.acked, stats.dropped),
            (1, bad.len() as u64),
            "{ty}: {stats:?}"
        );
    }
    ctx.drop_tables().await;
}

pub(crate) async fn a_column_that_cannot_hold_headers_is_refused_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let not_null = format!("{} NOT NULL DEFAULT ''", DB::TEXT);
    for (ty, wanted) in [
        ("INTEGER", "has type"),
        (not_null.as_str(), "must take NULL"),
    ] {
        let t = table_with_headers(&mut ctx, Spec::lease(), ty).await;
        let queue = Queue::table(Table::new(&t).headers("headers"))
            .lease("locked_until")
            .handler(|_: Delivery<DB>| async { Outcome::ack() });
        match Runner::new(ctx.pool.clone()).mount(queue).start().await {
            Err(Error::Schema(schema)) => {
                assert_eq!(schema.column.as_deref(), Some("headers"), "{schema:?}");
                assert!(
                    schema.reason.contains("headers column"),
                    "{}",
                    schema.reason
                );
                assert!(schema.reason.contains(wanted), "{}", schema.reason);
            }
            Err(other) => panic!("{ty}: a schema error, not {other}"),
            Ok(running) => {
                running.shutdown().await.unwrap();
                panic!("{ty}: started on a column that cannot hold headers");
            }
        }
    }
    ctx.drop_tables().await;
}
