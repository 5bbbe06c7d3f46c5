//! Scenario 3 — Killed connections: while handlers are in work, the server ends every session of
//! the runner's pool (`pg_terminate_backend`, MySQL `KILL`), three times during a drain. The
//! sessions are found by what they are: PostgreSQL by the pool's `application_name` in
//! `pg_stat_activity`, MariaDB by the ids the pool's connections recorded when they connected,
//! still open in `information_schema.PROCESSLIST`.
//!
//! Row lock and advisory rows whose session ended return to the queue at once — while their
//! first handler may still be working: the form's promise (no row in two handlers at once) lasts
//! as long as the session that holds the row, and the test checks that every overlap it sees
//! began with a kill. Lease rows stay leased; a settlement cut short leaves its row to the lease.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Outcome, Queue};
use tokio::time::Instant;

use crate::crash::fill;
use crate::support::{
    AdvisoryForm, ConnIds, Ctx, Form, Gate, Journal, RowLockForm, Spec, TestDb, assert_handled,
    assert_nothing_held, jobs, journaled, micros_now, ms, overlaps, pool_for, recv, report, spread,
    start_runner, unique, wait_for,
};

const ROWS: usize = 400;
const WORKERS: usize = 4;
const KILLS: usize = 3;
const WORK: Duration = Duration::from_millis(30);
const LEASE: Duration = Duration::from_secs(2);

every_form!(killed_connections: servers);

async fn killed_connections<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&t).await;
    let ids = fill(&ctx, &t, ROWS).await;
    let tag = format!("sqlxq-killed-{}", unique());
    let sessions = ConnIds::default();
    let pool = DB::connect_tagged(
        &ctx.url,
        pool_for(WORKERS),
        Duration::from_secs(10),
        &tag,
        Arc::clone(&sessions),
    )
    .await
    .unwrap();
    let journal = Arc::new(Journal::default());
    let running = start_runner(
        &pool,
        journaled::<DB, F>(&t, LEASE, WORKERS, &journal, WORK),
    )
    .await;
    let started = Instant::now();

    let mut kills = Vec::new();
    let mut ended_per_kill = Vec::new();
    for k in 1..=KILLS {
        let due = ROWS * k / (KILLS + 1);
        wait_for(
            &format!("{due} rows handled and deliveries in work"),
            Duration::from_secs(60),
            || async { journal.ended() >= due && journal.in_work() > 0 },
        )
        .await;
        let ids = sessions.lock().unwrap().clone();
        // A kill takes a while (MySQL: one `KILL` per session): from its start to its end.
        let began = micros_now();
        let ended = DB::kill_sessions(&ctx.pool, &tag, &ids).await.unwrap();
        kills.push((began, micros_now()));
        ended_per_kill.push(ended);
        assert!(ended > 0, "no session of the runner was found to end");
    }
    ctx.wait_none(&t, "1 = 1", 120).await;
    let drained = started.elapsed();
    let stats = running.stats();
    running.shutdown().await.unwrap();
    pool.close().await;

    let deliveries = journal.entries();
    assert_handled(&deliveries, &ids);
    ctx.assert_settled_once(&settled, &ids).await;
    assert_nothing_held::<DB, F>(&ctx, &t, Some(&settled)).await;
    let twice = overlaps(&deliveries, |_| None);
    if F::HOLDS {
        // Only a row whose session a kill ended may be taken while its handler still works: the
        // first delivery began before a kill ended, the second after it began.
        let unexplained: Vec<_> = twice
            .iter()
            .filter(|(first, then)| {
                !kills
                    .iter()
                    .any(|(began, ended)| first.start < *ended && *began <= then.start)
            })
            .collect();
        assert!(
            unexplained.is_empty(),
            "rows in two handlers at once with no kill between: {unexplained:?}; kills (began, ended): {kills:?}"
        );
    } else {
        // The leases were kept (extended or not yet due): no row was delivered twice at once.
        assert!(twice.is_empty(), "rows in two handlers at once: {twice:?}");
    }
    // Kill → next delivery of each row that was in work at a kill and came back.
    let mut back = Vec::new();
    for (k, _) in &kills {
        for d in deliveries
            .iter()
            .filter(|d| d.start < *k && d.end.is_none_or(|end| end > *k))
        {
            if let Some(next) = deliveries
                .iter()
                .filter(|n| n.id == d.id && n.start > d.start)
                .min_by_key(|n| n.start)
            {
                back.push(ms(next.start - k));
            }
        }
    }
    report(&format!(
        "killed connections: {} {}: {KILLS} kills ended {ended_per_kill:?} sessions; {ROWS} rows \
         drained in {:.1} s; {} deliveries ({} times a row in two handlers at once, each \
         after a kill), {} settlements failed, {} leases lost; kill -> next delivery of a row \
         in work: {}",
        DB::LABEL,
        F::NAME,
        drained.as_secs_f64(),
        deliveries.len(),
        twice.len(),
        stats.failed,
        stats.lease_lost,
        spread(&mut back),
    ));
    ctx.drop_tables().await;
}

cases! { second_handler_after_session_loss:
    postgres_row_lock_session_loss => sqlx::Postgres, RowLockForm;
    postgres_advisory_session_loss => sqlx::Postgres, AdvisoryForm;
    mysql_row_lock_session_loss => sqlx::MySql, RowLockForm;
    mysql_advisory_session_loss => sqlx::MySql, AdvisoryForm;
}

/// What the row lock and advisory forms promise ends with the session that holds the row: once
/// the server ends it, another runner takes the row at once, while the first handler — which
/// nothing stops — is still working. The first delivery's settlement then fails (counted in
/// `Stats::failed`), and the row is settled once, by the second.
async fn second_handler_after_session_loss<DB: TestDb, F: Form<DB>>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let settled = ctx.settled_ledger(&t).await;
    let ids = fill(&ctx, &t, 1).await;
    let tag = format!("sqlxq-loss-{}", unique());
    let sessions = ConnIds::default();
    let first_pool = DB::connect_tagged(
        &ctx.url,
        2,
        Duration::from_secs(10),
        &tag,
        Arc::clone(&sessions),
    )
    .await
    .unwrap();
    let (gate, mut first) = Gate::new();
    let first_gate = Arc::clone(&gate);
    let queue = F::apply_leasing(Queue::table(jobs(&t)), LEASE)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| first_gate.hold(d.id()));
    let first_runner = start_runner(&first_pool, |r| r.mount(queue)).await;
    assert_eq!(recv(&mut first, "the first delivery", 10).await, ids[0]);

    let second_pool = ctx.pool(2).await;
    let (second_started, mut second) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply_leasing(Queue::table(jobs(&t)), LEASE)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = second_started.send(d.id());
            async { Outcome::ack() }
        });
    let second_runner = start_runner(&second_pool, |r| r.mount(queue)).await;
    // The first runner's session holds the row.
    let held = match (F::NAME, DB::LABEL) {
        ("row_lock", _) => DB::nowait_all(&ctx.pool, &t).await.is_err(),
        (_, "postgres") => {
            let class = crate::support::fnv1a_32(&t);
            ctx.count(
                "pg_locks",
                &format!("locktype = 'advisory' AND classid = {class}"),
            )
            .await
                == 1
        }
        _ => {
            ctx.count(
                &t,
                &format!("IS_USED_LOCK(CONCAT(DATABASE(), '.{t}:', id)) IS NOT NULL"),
            )
            .await
                == 1
        }
    };
    assert!(held, "the first runner's session does not hold the row");

    let ids_of_first = sessions.lock().unwrap().clone();
    let ended = DB::kill_sessions(&ctx.pool, &tag, &ids_of_first)
        .await
        .unwrap();
    let killed = Instant::now();
    assert!(ended > 0, "no session of the first runner was found to end");
    assert_eq!(recv(&mut second, "the second delivery", 10).await, ids[0]);
    let second_after = killed.elapsed();
    // Both handlers are in work now: the first still waits at its gate.
    gate.open(1);
    wait_for(
        "the first delivery's settlement to fail",
        Duration::from_secs(20),
        || async { first_runner.stats().failed == 1 },
    )
    .await;
    wait_for(
        "the second delivery's ack",
        Duration::from_secs(10),
        || async { second_runner.stats().acked == 1 },
    )
    .await;
    ctx.wait_none(&t, "1 = 1", 10).await;
    let first_stats = first_runner.stats();
    assert_eq!(first_stats.acked, 0, "{first_stats:?}");
    first_runner.shutdown().await.unwrap();
    second_runner.shutdown().await.unwrap();
    first_pool.close().await;
    second_pool.close().await;
    ctx.assert_settled_once(&settled, &ids).await;
    report(&format!(
        "session loss: {} {}: the server ended the session holding a row in work; another \
         runner had the row {} ms later while the first handler still ran; the first's ack \
         failed, the row was settled once by the second",
        DB::LABEL,
        F::NAME,
        second_after.as_millis()
    ));
    ctx.drop_tables().await;
}
