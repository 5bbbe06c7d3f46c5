//! What a cancellation leaves no longer: a lease row claimed ahead of its worker and cancelled
//! before its handler starts never starts where the runner listens (PostgreSQL), and requests
//! naming no unfinished row (left by a runner that died between a row's removal and its
//! request's) are swept by the runner.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Cancellation, Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::{Notify, mpsc};

use crate::queued::{enqueue, jobs};
use crate::support::{Ctx, Form, Spec, TestDb, recv, wait_for};

#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Started(i64),
    Cancelled(i64),
}

/// PostgreSQL, a lease queue listening on its table's channel, one worker: of two jobs claimed
/// together, the second waits for the worker while the first works. Cancelled then, it is
/// removed from the rows waiting at once (its settlement finds the lease taken away), and never
/// starts; the first, cancelled in work, is told at once too (not at a renewal: the lease is
/// 30 s).
pub(crate) async fn a_lease_row_cancelled_while_claimed_ahead_never_starts<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let table = jobs(&t);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let gate = Arc::clone(&go);
    let queue = table
        .clone()
        .listen_notify()
        .workers(1)
        .handler(move |d: Delivery<DB>| {
            let (tx, gate) = (tx.clone(), Arc::clone(&gate));
            async move {
                tx.send(Seen::Started(d.id())).unwrap();
                tokio::select! {
                    () = d.cancelled() => tx.send(Seen::Cancelled(d.id())).unwrap(),
                    () = gate.notified() => {}
                }
                Outcome::ack()
            }
        });
    let first = enqueue(&ctx, &table, Job::new("first")).await;
    let ahead = enqueue(&ctx, &table, Job::new("ahead")).await;
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    assert_eq!(
        recv(&mut rx, "the first handler to start", 5).await,
        Seen::Started(first)
    );
    ctx.wait_count(
        &t,
        &format!("id = {ahead} AND locked_until IS NOT NULL"),
        1,
        5,
    )
    .await;
    assert_eq!(
        table.cancel(&ctx.pool, ahead).await.unwrap(),
        Cancellation::Requested(ahead),
        "a row claimed ahead is in work for a cancellation"
    );
    wait_for(
        "the row claimed ahead to be removed from the rows waiting",
        Duration::from_secs(2),
        || {
            let stats = running.stats();
            async move { stats.lease_lost >= 1 }
        },
    )
    .await;
    let asked = tokio::time::Instant::now();
    assert_eq!(
        table.cancel(&ctx.pool, first).await.unwrap(),
        Cancellation::Requested(first)
    );
    let seen = tokio::time::timeout(Duration::from_secs(1), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("the handler in work was not told at once"));
    assert_eq!(
        seen,
        Some(Seen::Cancelled(first)),
        "after {:?}",
        asked.elapsed()
    );
    wait_for("the first's settlement", Duration::from_secs(5), || {
        let stats = running.stats();
        async move { stats.lease_lost >= 2 }
    })
    .await;
    go.notify_waiters();
    running.shutdown().await.unwrap();
    assert_eq!(
        rx.try_recv().ok(),
        None,
        "the row claimed ahead never started"
    );
    assert_eq!(ctx.count(&t, "1 = 1").await, 0);
    ctx.drop_tables().await;
}

/// Requests that name no row, or a finished one, are swept when a runner starts (more than one
/// sweep's worth), also while a row is in work (a row lock claim holds it: the sweep waits for
/// no lock); the requests of unfinished rows stay — a queued one's, and the one in work's, which
/// goes with its row when its handler returns.
pub(crate) async fn requests_naming_no_row_are_swept<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx
        .table(Spec {
            processed_at: true,
            ..Spec::lease()
        })
        .await;
    let cancels = format!("{t}_cancels");
    let id_type = if DB::LABEL == "sqlite" {
        "INTEGER"
    } else {
        "BIGINT"
    };
    ctx.exec(&format!(
        "CREATE TABLE {cancels} (id {id_type} PRIMARY KEY)"
    ))
    .await;
    let table = Table::new(&t)
        .retry_after("retry_after")
        .processed_at("processed_at")
        .cancel_requests(&cancels);
    let declared = F::apply(Queue::table(table.clone()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let go = Arc::new(Notify::new());
    let queue = || {
        let (tx, gate) = (tx.clone(), Arc::clone(&go));
        declared.clone().handler(move |d: Delivery<DB>| {
            let (tx, gate) = (tx.clone(), Arc::clone(&gate));
            async move {
                tx.send(Seen::Started(d.id())).unwrap();
                // The row stays held until the gate opens, also once cancelled.
                d.cancelled().await;
                tx.send(Seen::Cancelled(d.id())).unwrap();
                gate.notified().await;
                Outcome::ack()
            }
        })
    };
    let start = |queue| {
        Runner::new(ctx.pool.clone())
            .poll_interval(Duration::from_millis(200))
            .mount(queue)
            .start()
    };
    let holding = start(queue()).await.unwrap();
    let held = enqueue(&ctx, &declared, Job::new("held")).await;
    assert_eq!(
        recv(&mut rx, "the held row's handler to start", 5).await,
        Seen::Started(held)
    );
    let later = Duration::from_secs(3600);
    let waiting = enqueue(&ctx, &declared, Job::new("waiting").delay(later)).await;
    let finished = enqueue(&ctx, &declared, Job::new("finished").delay(later)).await;
    ctx.exec(&format!(
        "UPDATE {t} SET processed_at = retry_after WHERE id = {finished}"
    ))
    .await;
    let gone: Vec<String> = (0..150).map(|i| format!("({})", 1_000_000 + i)).collect();
    ctx.exec(&format!(
        "INSERT INTO {cancels} (id) VALUES ({held}), ({waiting}), ({finished}), {}",
        gone.join(", ")
    ))
    .await;
    // The first runner swept at its start; the second sweeps at its own.
    let sweeping = start(queue()).await.unwrap();
    ctx.wait_count(&cancels, "1 = 1", 2, 5).await;
    assert_eq!(
        ctx.count(&cancels, &format!("id IN ({held}, {waiting})"))
            .await,
        2,
        "the requests of unfinished rows stay"
    );
    assert_eq!(
        recv(&mut rx, "the held row's request to be read", 5).await,
        Seen::Cancelled(held)
    );
    go.notify_one();
    ctx.wait_count(&cancels, "1 = 1", 1, 5).await;
    ctx.wait_count(&t, &format!("id = {held} AND processed_at IS NULL"), 0, 5)
        .await;
    sweeping.shutdown().await.unwrap();
    holding.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {cancels}")).await;
    ctx.drop_tables().await;
}
