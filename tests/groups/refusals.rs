//! What FIFO and `per_group` cannot serve is refused at start, with the reason.

use sqlx_queue::{Delivery, Error, Isolation, Outcome, Queue, Runner, Table};

use crate::support::{Ctx, Form, Spec, TestDb};

async fn reason<DB: TestDb>(ctx: &Ctx<DB>, queue: impl sqlx_queue::state::Mount<DB>) -> String {
    match Runner::new(ctx.pool.clone()).mount(queue).start().await {
        Err(Error::Declaration { reason, .. } | Error::Unsupported { reason, .. }) => reason,
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("the queue started"),
    }
}

fn handler<DB: TestDb>() -> impl Fn(Delivery<DB>) -> std::future::Ready<Outcome> + Clone {
    |_| std::future::ready(Outcome::ack())
}

/// Every database: `per_group(0)` (a panic at the call, as `workers(0)`), and what is refused
/// at start: the advisory form, a table without a group column.
pub(crate) async fn what_groups_need_is_said_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let zero = std::panic::catch_unwind(|| Queue::table(table.clone()).per_group(0));
    let panic = zero.expect_err("per_group(0) accepted");
    let message = (panic.downcast_ref::<&str>().copied())
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str));
    assert_eq!(message, Some("per_group must be at least 1, got 0"));
    let zero = std::panic::catch_unwind(|| Queue::table(table.clone()).workers(0));
    assert!(zero.is_err(), "workers(0) accepted");
    let advisory = Queue::table(table.clone())
        .advisory_lock()
        .fifo()
        .handler(handler::<DB>());
    assert!(reason(&ctx, advisory).await.contains("advisory key"));
    let ungrouped = Queue::table(Table::new(&t).retry_after("retry_after"))
        .lease("locked_until")
        .per_group(2)
        .handler(handler::<DB>());
    assert!(reason(&ctx, ungrouped).await.contains("group column"));
    ctx.drop_tables().await;
}

/// PostgreSQL and MySQL/MariaDB: the row lock form serves FIFO at READ COMMITTED only.
pub(crate) async fn what_the_row_lock_form_cannot_guard_is_said_at_start<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let serializable = F::apply(Queue::table(table.clone()))
        .fifo()
        .transactional()
        .isolation(DB::setting(
            Isolation::Serializable,
            sqlx_queue::SqliteMode::Deferred,
        ))
        .handler(|_: Delivery<DB, sqlx_queue::Transactional>| std::future::ready(Outcome::ack()));
    assert!(reason(&ctx, serializable).await.contains("READ COMMITTED"));
    ctx.drop_tables().await;
}

/// Every database: what `by_key` cannot serve.
pub(crate) async fn what_by_key_needs_is_said_at_start<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let table = Table::new(&t).group("queue").retry_after("retry_after");
    let named = Queue::table(table.clone())
        .lease("locked_until")
        .named("a")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler::<DB>());
    assert!(reason(&ctx, named).await.contains("named queue"));
    let ungrouped = Queue::table(Table::new(&t))
        .lease("locked_until")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler::<DB>());
    assert!(reason(&ctx, ungrouped).await.contains("group column"));
    let fifo = Queue::table(table.clone())
        .lease("locked_until")
        .fifo()
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .handler(handler::<DB>());
    assert!(reason(&ctx, fifo).await.contains("pick one"));
    let batch = Queue::table(table.clone())
        .lease("locked_until")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .batch(4)
        .batch_handler(|batch: Vec<Delivery<DB>>| {
            std::future::ready(batch.iter().map(|_| Outcome::ack()).collect::<Vec<_>>())
        });
    assert!(reason(&ctx, batch).await.contains("batch"));
    let rated = Queue::table(table.clone().limits("job_limits"))
        .lease("locked_until")
        .workers(2)
        .by_key(sqlx_queue::ByKey::group())
        .rate_limit(sqlx_queue::RateLimit::new(
            10,
            std::time::Duration::from_secs(1),
        ))
        .handler(handler::<DB>());
    assert!(reason(&ctx, rated).await.contains("rate limit"));
    ctx.drop_tables().await;
}
