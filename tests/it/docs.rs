// The guide's `CREATE TABLE` for this database (`docs/guide/table.md`), run as written, serves a queue with every role.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, TestDb, recv};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(docs<$db>:
            the_readme_schema_serves_a_queue_with_every_role,
        );
    };
}
pub(crate) use tests;

/// The guide's SQL block for this database, for a table named `name`.
fn readme_schema<DB: TestDb>(name: &str) -> String {
    let marker = match DB::LABEL {
        "postgres" => "-- PostgreSQL",
        "mysql" => "-- MySQL",
        _ => "-- SQLite",
    };
    let readme = include_str!("../../docs/guide/table.md");
    let start = readme
        .find(marker)
        .expect("the guide has this database's schema");
    let block = &readme[start..];
    let end = block.find("```").expect("the block ends");
    block[..end].replace("signup_jobs", name)
}

pub(crate) async fn the_readme_schema_serves_a_queue_with_every_role<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let name = format!("readme_{}", crate::support::unique());
    ctx.exec(&readme_schema::<DB>(&name)).await;
    let jobs = Table::new(&name)
        .group("queue")
        .retry_after("retry_after")
        .processed_at("processed_at")
        .created_at("created_at");
    let first = DB::enqueue(&ctx.pool, &jobs, Job::new("a").group("signups"))
        .await
        .unwrap();
    let other = DB::enqueue(&ctx.pool, &jobs, Job::new("b").group("other"))
        .await
        .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs)
        .named("signups")
        .lease("locked_until")
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send((d.id(), d.attempt()));
            async move {
                if d.attempt() == 1 {
                    Outcome::retry_after(Duration::from_millis(10))
                } else {
                    Outcome::ack()
                }
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(recv(&mut seen, "the first delivery", 10).await, (first, 1));
    assert_eq!(recv(&mut seen, "the retry", 10).await, (first, 2));
    ctx.wait_count(
        &name,
        "processed_at IS NOT NULL AND locked_until IS NULL",
        1,
        10,
    )
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&name, &format!("id = {other} AND processed_at IS NULL"))
            .await,
        1
    );
    ctx.exec(&format!("DROP TABLE {name}")).await;
    ctx.drop_tables().await;
}
