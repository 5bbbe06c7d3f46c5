// The guide's unique key column and index for this database (`docs/guide/unique.md`), run as
// written on the guide's queue table (`docs/guide/table.md`, which keeps finished rows), hold one
// unfinished job per key, and a finished job frees its key.

use sqlx_queue::{Delivery, Enqueued, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, TestDb};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(unique_readme<$db>:
            the_readme_unique_index_holds_one_unfinished_job_per_key,
        );
    };
}
pub(crate) use tests;

/// The guide page's SQL block for this database after `section`, for a table named `name`.
fn readme_block<DB: TestDb>(page: &str, section: &str, name: &str) -> String {
    let marker = match DB::LABEL {
        "postgres" => "-- PostgreSQL",
        "mysql" => "-- MySQL",
        _ => "-- SQLite",
    };
    let from = page.find(section).expect("the page has the section");
    let start = from
        + page[from..]
            .find(marker)
            .expect("a block for this database");
    let block = &page[start..];
    let end = block.find("```").expect("the block ends");
    block[..end].replace("signup_jobs", name)
}

pub(crate) async fn the_readme_unique_index_holds_one_unfinished_job_per_key<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let name = format!("readme_u_{}", crate::support::unique());
    ctx.exec(&readme_block::<DB>(
        include_str!("../../docs/guide/table.md"),
        "## The DDL per database",
        &name,
    ))
    .await;
    let unique = readme_block::<DB>(
        include_str!("../../docs/guide/unique.md"),
        "## The key column and its index",
        &name,
    );
    assert!(unique.contains("dedupe"), "{unique}");
    ctx.exec(&unique).await;
    let table = Table::new(&name)
        .group("queue")
        .retry_after("retry_after")
        .processed_at("processed_at")
        .created_at("created_at")
        .unique_key("dedupe");
    let jobs = Queue::table(table).named("signups").lease("locked_until");
    let job = |payload: &'static str| Job::new(payload).unique("welcome:42");
    let Enqueued::New(first) = jobs.enqueue_unique(&ctx.pool, job("1")).await.unwrap() else {
        panic!("the key was free");
    };
    assert_eq!(
        jobs.enqueue_unique(&ctx.pool, job("2")).await.unwrap(),
        Enqueued::Duplicate(first)
    );
    let queue = jobs
        .clone()
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&name, "processed_at IS NULL", 10).await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&name, "processed_at IS NOT NULL").await, 1);
    let Enqueued::New(second) = jobs.enqueue_unique(&ctx.pool, job("3")).await.unwrap() else {
        panic!("the finished job freed its key");
    };
    assert_ne!(second, first, "the finished row stays");
    assert_eq!(ctx.payload(&name, second).await, b"3");
    assert_eq!(ctx.count(&name, "1 = 1").await, 2);
    let _ = DB::exec(&ctx.pool, &format!("DROP TABLE {name}")).await;
    ctx.drop_tables().await;
}
