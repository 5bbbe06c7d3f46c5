//! Jobs through tables `Schema` created: every role on each claim form, a dead-letter table,
//! two queues on one table.

use std::time::Duration;

use sqlx_queue::{Backoff, DeadLetter, Delivery, Enqueued, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Form, TestDb};
use crate::{create, drop_all, name};

const POLL: Duration = Duration::from_millis(50);

/// Every optional role of the queue table (group, retry_after, processed_at, priority,
/// created_at, headers, and but on the advisory form a unique key) with an attempt count and a group dead letter, on form `F`:
/// an acked job is marked, a failing one reaches the dead group, a unique duplicate is skipped.
pub(crate) async fn every_role_on_a_created_table<DB: TestDb, F: Form<DB>>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = name();
    let table = Table::new(&t)
        .group("queue")
        .retry_after("retry_after")
        .processed_at("processed_at")
        .priority("priority")
        .created_at("created_at")
        .headers("headers");
    // The advisory form serves no table with a unique key (a replace cannot see its holds).
    let unique = F::NAME != "advisory";
    let table = if unique {
        table.unique_key("dedupe")
    } else {
        table
    };
    let queue = F::apply(Queue::table(table.clone()).named("work"))
        .attempt("attempt")
        .max_attempts(2)
        .dead_letter(DeadLetter::group("dead"))
        .backoff(Backoff::none());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let runner = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(queue.clone().handler(move |d: Delivery<DB>| {
            let tx = tx.clone();
            async move {
                let payload = String::from_utf8_lossy(d.payload()).into_owned();
                let _ = tx.send((payload.clone(), d.header("trace").map(str::to_owned)));
                if payload == "fail" {
                    Outcome::fail()
                } else {
                    Outcome::ack()
                }
            }
        }));
    let schema = runner.schema().unwrap();
    create(&ctx, &schema).await;

    queue
        .enqueue(
            &ctx.pool,
            Job::new("ok").header("trace", "t-1").priority(-1),
        )
        .await
        .unwrap();
    queue.enqueue(&ctx.pool, Job::new("fail")).await.unwrap();
    if unique {
        // The queue's own form, spelled out: unique enqueues compile for the lease and row
        // lock forms only (the generic `F` may be the advisory form).
        let jobs = [Job::new("once").unique("k"), Job::new("twice").unique("k")];
        let done = if F::NAME == "lease" {
            let producer = Queue::table(table).named("work").lease("locked_until");
            producer.enqueue_many_unique(&ctx.pool, &jobs).await
        } else {
            let producer = Queue::table(table).named("work").row_lock();
            producer.enqueue_many_unique(&ctx.pool, &jobs).await
        };
        let [first, again] = done.unwrap()[..] else {
            panic!("two answers")
        };
        assert!(matches!(first, Enqueued::New(_)), "{first:?}");
        assert_eq!(again, Enqueued::Duplicate(first.id()));
    } else {
        queue.enqueue(&ctx.pool, Job::new("once")).await.unwrap();
    }
    assert_eq!(ctx.count(&t, "1 = 1").await, 3);

    let running = runner.start().await.unwrap();
    ctx.wait_count(&t, "processed_at IS NOT NULL", 2, 20).await;
    ctx.wait_count(&t, "queue = 'dead' AND processed_at IS NULL", 1, 20)
        .await;
    running.shutdown().await.unwrap();
    let mut seen = Vec::new();
    while let Ok(one) = rx.try_recv() {
        seen.push(one);
    }
    assert!(
        seen.contains(&("ok".to_owned(), Some("t-1".to_owned()))),
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|(p, _)| p == "fail").count(),
        2,
        "{seen:?}"
    );
    assert_eq!(
        seen.iter().filter(|(p, _)| p == "twice").count(),
        0,
        "{seen:?}"
    );
    assert_eq!(
        ctx.count(&t, "payload IS NOT NULL AND created_at IS NOT NULL")
            .await,
        3
    );
    assert_eq!(ctx.count(&t, "headers IS NOT NULL").await, 1);
    drop_all(ctx, &[&t]).await;
}

/// A lease queue counting attempts, dead-lettering into a table of its own: `Queue::schema`
/// says what `Runner::schema` says; the failing row moves to the dead table with its attempts,
/// the acked one is deleted, and a new row never gets an id given before.
pub(crate) async fn a_dead_letter_table_takes_the_failed_rows<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, dead) = (name(), name());
    let queue = Queue::table(Table::new(&t).retry_after("retry_after"))
        .lease("locked_until")
        .attempt("attempt")
        .max_attempts(2)
        .dead_letter(DeadLetter::table(&dead))
        .backoff(Backoff::none());
    let runner = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(queue.clone().handler(|d: Delivery<DB>| async move {
            if d.payload() == b"fail" {
                Outcome::fail()
            } else {
                Outcome::ack()
            }
        }));
    let schema = queue.schema::<DB>().unwrap();
    assert_eq!(schema, runner.schema().unwrap());
    create(&ctx, &schema).await;
    let ok = queue.enqueue(&ctx.pool, Job::new("ok")).await.unwrap();
    let fail = queue.enqueue(&ctx.pool, Job::new("fail")).await.unwrap();
    let running = runner.start().await.unwrap();
    ctx.wait_count(&dead, "1 = 1", 1, 20).await;
    ctx.wait_none(&t, "1 = 1", 20).await;
    running.shutdown().await.unwrap();
    assert_eq!(ctx.payload(&dead, fail).await, b"fail");
    assert_eq!(
        ctx.count(&dead, "attempt >= 2 AND locked_until IS NULL")
            .await,
        1
    );
    let next = queue.enqueue(&ctx.pool, Job::new("next")).await.unwrap();
    assert!(next > ok.max(fail), "id {next} given again");
    drop_all(ctx, &[&t, &dead]).await;
}

/// Two named queues of one table, with different roles (one leases and counts attempts, the
/// other keeps finished rows and delays): one table of the union of their roles, both served.
pub(crate) async fn two_queues_on_one_table_share_one_created_table<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = name();
    let base = Table::new(&t).group("queue");
    let a = Queue::table(base.clone().retry_after("retry_after"))
        .named("a")
        .lease("locked_until")
        .attempt("attempt");
    let b = Queue::table(base.processed_at("processed_at"))
        .named("b")
        .lease("locked_until");
    let ack = |_: Delivery<DB>| async { Outcome::ack() };
    let runner = Runner::new(ctx.pool.clone())
        .poll_interval(POLL)
        .mount(a.clone().handler(ack))
        .mount(b.clone().handler(ack));
    let schema = runner.schema().unwrap();
    let creates = schema
        .statements()
        .iter()
        .filter(|s| s.starts_with("CREATE TABLE"))
        .count();
    assert_eq!(creates, 1, "{schema}");
    create(&ctx, &schema).await;
    for n in 0..3 {
        a.enqueue(&ctx.pool, Job::from_vec(vec![n])).await.unwrap();
        b.enqueue(&ctx.pool, Job::from_vec(vec![n])).await.unwrap();
    }
    let running = runner.start().await.unwrap();
    ctx.wait_none(&t, "queue = 'a'", 20).await;
    ctx.wait_count(&t, "queue = 'b' AND processed_at IS NOT NULL", 3, 20)
        .await;
    running.shutdown().await.unwrap();
    drop_all(ctx, &[&t]).await;
}

/// Keys and groups that differ only in case are different keys and groups on every database:
/// on MySQL/MariaDB the generated columns compare bytes (a case-insensitive unique key made the
/// second enqueue below fail with `UniqueKeyHidden`, and queue `a` counted queue `A`'s jobs).
pub(crate) async fn keys_and_groups_differing_in_case_are_apart<DB: TestDb>() {
    let Some(ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = name();
    let table = Table::new(&t).group("queue").unique_key("dedupe");
    let upper = Queue::table(table.clone()).named("A").lease("locked_until");
    let lower = Queue::table(table).named("a").lease("locked_until");
    create(&ctx, &upper.schema::<DB>().unwrap()).await;
    let jobs = [
        Job::new("one").unique("Welcome:1"),
        Job::new("two").unique("welcome:1"),
    ];
    let done = upper.enqueue_many_unique(&ctx.pool, &jobs).await.unwrap();
    assert!(
        done.iter().all(|d| matches!(d, Enqueued::New(_))),
        "{done:?}"
    );
    let again = upper
        .enqueue_unique(&ctx.pool, Job::new("three").unique("welcome:1"))
        .await
        .unwrap();
    assert_eq!(again, Enqueued::Duplicate(done[1].id()));
    assert_eq!(upper.counts(&ctx.pool).await.unwrap().ready, 2);
    assert_eq!(lower.counts(&ctx.pool).await.unwrap().ready, 0);
    drop_all(ctx, &[&t]).await;
}
