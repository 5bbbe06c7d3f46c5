// A service's own settlement statement is one statement: a second one is refused at start on
// every database, and `;` or a marker inside a string or a comment is text.

use std::time::Duration;

use sqlx_queue::{Delivery, Error, Event, Job, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Spec, TestDb};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(custom_sql<$db>:
            a_second_statement_in_custom_sql_is_refused_at_start,
            semicolons_and_markers_in_strings_and_comments_are_text,
        );
    };
}
pub(crate) use tests;

fn jobs(t: &str) -> Table {
    Table::new(t).group("queue").retry_after("retry_after")
}

/// A lease queue of `t`'s group `mail` that acks every row through `ack`.
fn acking<DB: TestDb>(ctx: &Ctx<DB>, t: &str, ack: String) -> Runner<DB> {
    let queue = Queue::table(jobs(t))
        .named("mail")
        .lease("locked_until")
        .attempt("attempt")
        .custom(Event::Ack, ack)
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
}

pub(crate) async fn a_second_statement_in_custom_sql_is_refused_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let canary = ctx.table(Spec::default()).await;
    let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new("x").group("mail"))
        .await
        .unwrap();
    for ack in [
        format!("DELETE FROM {t} WHERE id = :id AND locked_until = :token; DROP TABLE {canary}"),
        format!("DELETE FROM {t} WHERE id = :id /* ; */; -- done\nDROP TABLE {canary};"),
        format!("DELETE FROM {t} WHERE id = :id AND queue <> 'a;b'; DROP TABLE {canary}"),
    ] {
        match acking(&ctx, &t, ack.clone()).start().await {
            Err(Error::Declaration { reason, .. }) => {
                assert!(reason.contains("Ack"), "names the event: {reason}");
                assert!(reason.contains("one statement"), "{reason}");
            }
            Err(other) => panic!("{ack}: expected Error::Declaration, got {other}"),
            Ok(running) => {
                running.shutdown().await.unwrap();
                panic!("{ack}: started");
            }
        }
    }
    assert_eq!(
        ctx.count(&canary, "1 = 1").await,
        0,
        "the canary table is still there"
    );
    let untouched = format!("id = {id} AND locked_until IS NULL AND attempt = 1");
    assert_eq!(ctx.count(&t, &untouched).await, 1, "nothing was claimed");
    ctx.drop_tables().await;
}

pub(crate) async fn semicolons_and_markers_in_strings_and_comments_are_text<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = jobs(&t);
    for payload in ["a", "b", "c"] {
        DB::enqueue(&ctx.pool, &table, Job::new(payload).group("mail"))
            .await
            .unwrap();
    }
    let ack = format!(
        "UPDATE {t} SET queue = 'done; at :now', locked_until = NULL /* not :token; */ \
         WHERE id = :id AND locked_until = :token; -- acked by :worker"
    );
    let running = acking(&ctx, &t, ack).start().await.unwrap();
    ctx.wait_count(
        &t,
        "queue = 'done; at :now' AND locked_until IS NULL",
        3,
        10,
    )
    .await;
    running.shutdown().await.unwrap();
    ctx.drop_tables().await;
}
