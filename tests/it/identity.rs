// A table's identity: every spelling of one table (bare, schema- or database-qualified, resolved
// through PostgreSQL's search_path) gets the same advisory keys and the same notification channel,
// so runners that spell it differently never hand a row to two handlers.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::time::Instant;

use crate::support::{Ctx, Spec, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(identity<$db>:
            runners_spelling_one_table_differently_share_its_advisory_keys,
            a_bare_name_resolved_through_the_search_path_shares_the_qualified_names_keys,
            every_spelling_of_a_table_notifies_one_channel,
        );
    };
}
pub(crate) use tests;

fn is_postgres<DB: TestDb>() -> bool {
    DB::LABEL == "postgres"
}

/// `t` qualified by its schema (PostgreSQL `public`), database (MySQL) or attached database
/// (SQLite `main`).
async fn qualified<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> String {
    let schema = match DB::LABEL {
        "postgres" => "public".to_owned(),
        "sqlite" => "main".to_owned(),
        _ => DB::text(&ctx.pool, "SELECT CAST(DATABASE() AS CHAR)")
            .await
            .unwrap(),
    };
    format!("{schema}.{t}")
}

/// Drains `rows` jobs of `t` with one runner per spelling, each on a pool of its own, and checks
/// that every row was handled once.
async fn drain_with<DB: TestDb>(
    ctx: &mut Ctx<DB>,
    t: &str,
    spellings: &[(sqlx::Pool<DB>, String)],
) {
    const ROWS: usize = 400;
    let ledger = format!("{t}_ledger");
    ctx.exec(&format!("CREATE TABLE {ledger} (id BIGINT NOT NULL)"))
        .await;
    let payloads: Vec<String> = (0..ROWS).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(t), &jobs)
        .await
        .unwrap();
    let mut running = Vec::new();
    for (pool, spelling) in spellings {
        let queue = Queue::table(Table::new(spelling))
            .advisory_lock()
            .attempt("attempt")
            .transactional()
            .workers(4)
            .handler(handler(&ledger));
        running.push(
            Runner::new(pool.clone())
                .poll_interval(Duration::from_millis(20))
                .mount(queue)
                .start()
                .await
                .unwrap_or_else(|e| panic!("{spelling}: {e}")),
        );
    }
    ctx.wait_none(t, "1 = 1", 120).await;
    for running in running {
        running.shutdown().await.unwrap();
    }
    let twice = ctx
        .count(
            &format!("(SELECT id FROM {ledger} GROUP BY id HAVING COUNT(*) > 1) AS d"),
            "1 = 1",
        )
        .await;
    let spelled: Vec<&str> = spellings.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        twice, 0,
        "rows handled twice by runners spelling the table {spelled:?}"
    );
    assert_eq!(
        ctx.count(&ledger, "1 = 1").await,
        ROWS as i64,
        "every row handled once"
    );
    ctx.exec(&format!("DROP TABLE {ledger}")).await;
}

fn handler<DB: TestDb>(
    ledger: &str,
) -> impl Fn(
    Delivery<DB, Transactional>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send>>
+ Send
+ Sync
+ 'static {
    let ledger = ledger.to_owned();
    move |mut d: Delivery<DB, Transactional>| {
        let ledger = ledger.clone();
        Box::pin(async move {
            let insert = format!("INSERT INTO {ledger} (id) VALUES ({})", d.id());
            DB::query_on(&mut *d.tx(), &insert).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
            Outcome::ack()
        })
    }
}

pub(crate) async fn runners_spelling_one_table_differently_share_its_advisory_keys<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let mut spellings = vec![
        (ctx.pool(6).await, t.clone()),
        (ctx.pool(6).await, qualified(&ctx, &t).await),
    ];
    if is_postgres::<DB>() {
        // Quoted parts name the same relation (the crate's names are case-sensitive already).
        spellings.push((ctx.pool(6).await, format!("\"public\".\"{t}\"")));
    }
    drain_with(&mut ctx, &t, &spellings).await;
    ctx.drop_tables().await;
}

/// A schema of its own holding a table, and a pool whose sessions find it through `search_path`.
async fn in_schema<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, String, sqlx::Pool<DB>) {
    let schema = format!("s_{}", crate::support::unique());
    let t = format!("q_{}", crate::support::unique());
    ctx.exec(&format!("CREATE SCHEMA {schema}")).await;
    ctx.exec(&DB::ddl(&format!("{schema}.{t}"), Spec::lease()))
        .await;
    let path = format!("SET search_path TO {schema}");
    let options = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(6)
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move {
                DB::exec_on(conn, &path).await?;
                Ok(())
            })
        });
    let pool = ctx.pool_with(options).await;
    (schema, t, pool)
}

pub(crate) async fn a_bare_name_resolved_through_the_search_path_shares_the_qualified_names_keys<
    DB: TestDb,
>() {
    if !is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (schema, t, pool) = in_schema(&mut ctx).await;
    let qualified = format!("{schema}.{t}");
    let spellings = vec![(pool, t.clone()), (ctx.pool(6).await, qualified.clone())];
    drain_with(&mut ctx, &qualified, &spellings).await;
    ctx.exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn every_spelling_of_a_table_notifies_one_channel<DB: TestDb>() {
    if !is_postgres::<DB>() {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let (schema, s_t, s_pool) = in_schema(&mut ctx).await;
    let url = ctx.url.clone().expect("a URL");
    // `DB` is PostgreSQL here; the other databases returned above.
    let pg = |pool: &sqlx::Pool<DB>| crate::support::as_pg(pool).expect("PostgreSQL");
    let public = pg(&ctx.pool);
    let channel = Table::new(&t).notify_channel(&public).await.unwrap();
    for spelling in [format!("public.{t}"), format!("\"public\".\"{t}\"")] {
        assert_eq!(
            Table::new(&spelling).notify_channel(&public).await.unwrap(),
            channel,
            "{spelling}"
        );
    }
    let s_channel = Table::new(&s_t).notify_channel(&pg(&s_pool)).await.unwrap();
    assert_eq!(
        Table::new(format!("{schema}.{s_t}"))
            .notify_channel(&public)
            .await
            .unwrap(),
        s_channel
    );
    assert_ne!(s_channel, channel, "two tables, two channels");

    // An enqueue through another spelling notifies the channel a runner of the bare name hears.
    let mut listener = sqlx::postgres::PgListener::connect(&url).await.unwrap();
    listener.listen(&channel).await.unwrap();
    DB::enqueue(
        &ctx.pool,
        &Table::new(format!("public.{t}")).notify(),
        Job::new("x"),
    )
    .await
    .unwrap();
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await;
    assert!(
        heard.is_ok(),
        "the enqueue through `public.{t}` notified the channel of `{t}`"
    );

    // And a runner listening as the bare name wakes at once for it (a 10 s poll otherwise).
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = Queue::table(Table::new(&t))
        .lease("locked_until")
        .listen_notify()
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), Instant::now()));
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_secs(10))
        .mount(queue)
        .start()
        .await
        .unwrap();
    recv(&mut seen, "the first job, found at start", 5).await;
    let sent = Instant::now();
    // Inserted by hand and notified through the qualified spelling's channel, so no wake-up of
    // this process's own can reach the runner.
    let qualified_channel = Table::new(format!("public.{t}"))
        .notify_channel(&public)
        .await
        .unwrap();
    ctx.exec(&format!(
        "INSERT INTO public.{t} (payload) VALUES ('y'); SELECT pg_notify('{qualified_channel}', '')"
    ))
    .await;
    let (_, started) = recv(&mut seen, "the job woken by its notification", 5).await;
    assert!(
        started - sent < Duration::from_secs(2),
        "woken after {:?}",
        started - sent
    );
    running.shutdown().await.unwrap();
    ctx.exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
    ctx.drop_tables().await;
}
