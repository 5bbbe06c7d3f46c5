//! Scenario 5 — Slow handlers and lease expiry. A handler outlives its lease while the lease's
//! extension cannot run: another session holds the row (`SELECT .. FOR UPDATE`; SQLite: the
//! database's write lock, `BEGIN IMMEDIATE`), so the extension's `UPDATE` waits. That session, once
//! the lease has expired, takes the row as a later claim would — a new token, the attempt counted —
//! and commits. The extension then finds another token; the handler ends and acks; the late
//! settlement must fail with `LeaseLost` and leave the new holder's claim as it was, which the new
//! holder then settles itself.

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound as _, TimeDelta, Utc};
use sqlx_queue::{Delivery, Job, Outcome, Queue, Table};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

use crate::support::{Ctx, Spec, TestDb, report, start_runner, wait_for};

/// Long enough that the test takes the row before the first extension (at half the lease).
const LEASE: Duration = Duration::from_secs(3);

per_database! { lease_expiry:
    postgres_lease => sqlx::Postgres;
    mysql_lease => sqlx::MySql;
    sqlite_lease => sqlx::Sqlite;
}

async fn lease_expiry<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::lease()).await;
    let jobs = Table::new(&t).retry_after("retry_after");
    let id = DB::enqueue(&ctx.pool, &jobs, Job::new("slow"))
        .await
        .unwrap();
    let (started, mut deliveries) = mpsc::unbounded_channel();
    let go = Arc::new(Semaphore::new(0));
    let gate = Arc::clone(&go);
    let queue = Queue::table(jobs)
        .lease("locked_until")
        .lease_duration(LEASE)
        .attempt("attempt")
        .handler(move |d: Delivery<DB>| {
            let _ = started.send((d.id(), Instant::now()));
            let gate = Arc::clone(&gate);
            async move {
                let _permit = gate.acquire().await.unwrap();
                Outcome::ack()
            }
        });
    let running = start_runner(&ctx.pool, |r| r.mount(queue)).await;
    let (got, claimed) = tokio::time::timeout(Duration::from_secs(10), deliveries.recv())
        .await
        .expect("the delivery within 10 s")
        .unwrap();
    assert_eq!(got, id);

    // The other session takes the row (SQLite: the write lock) before the first extension.
    let mut holder = ctx.pool.acquire().await.unwrap();
    for sql in DB::lock_row(&t, id) {
        DB::exec_on(&mut holder, &sql).await.unwrap();
    }
    let locked = claimed.elapsed();
    assert!(
        locked < LEASE / 2,
        "the row was taken {locked:?} after the claim: the extension may have run first"
    );
    let blocked = match DB::LABEL {
        "postgres" => Some(format!(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND query LIKE 'UPDATE%{t}%'"
        )),
        // A statement on the row still in flight: InnoDB's own view (`INNODB_TRX`) does not
        // always list an autocommit statement waiting for a lock.
        "mysql" => Some(format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'UPDATE%{t}%'"
        )),
        _ => None, // SQLite shows no waiting writer; the lease's expiry below is the evidence.
    };
    if let Some(blocked) = &blocked {
        let deadline = claimed + LEASE;
        while DB::count(&ctx.pool, blocked).await.unwrap() != 1 {
            if Instant::now() > deadline {
                panic!(
                    "the lease extension was not seen waiting for the row {:?} after the claim \
                     (row locked {locked:?} after it): {}",
                    claimed.elapsed(),
                    diagnose::<DB>(&ctx, &t, id).await
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    // The lease expires: no extension got through.
    let expired = format!("SELECT COUNT(*) FROM {t} WHERE id = {id} AND locked_until < ?");
    wait_for("the lease to expire", LEASE * 2, || async {
        DB::count_time(&ctx.pool, &expired, Utc::now())
            .await
            .unwrap()
            == 1
    })
    .await;
    let outlived = claimed.elapsed();

    // The new holder's claim, committed; then the slow handler ends and acks.
    // To the microsecond, as the databases keep times.
    let token = (Utc::now() + TimeDelta::hours(1)).trunc_subsecs(6);
    let steal = format!("UPDATE {t} SET locked_until = ?, attempt = attempt + 1 WHERE id = {id}");
    assert_eq!(
        DB::exec_time_on(&mut holder, &steal, token).await.unwrap(),
        1
    );
    DB::exec_on(&mut holder, "COMMIT").await.unwrap();
    drop(holder);
    go.add_permits(1);
    wait_for(
        "the late ack to fail with LeaseLost",
        Duration::from_secs(15),
        || async { running.stats().lease_lost == 1 },
    )
    .await;
    let stats = running.stats();
    assert_eq!((stats.acked, stats.failed), (0, 0), "{stats:?}");

    // The new holder's claim is untouched, and is its to settle.
    let held = format!(
        "SELECT COUNT(*) FROM {t} WHERE id = {id} AND attempt = 3 AND retry_after IS NULL \
         AND locked_until = ?"
    );
    assert_eq!(
        DB::count_time(&ctx.pool, &held, token).await.unwrap(),
        1,
        "the late settlement changed the new holder's row"
    );
    let settle = format!("DELETE FROM {t} WHERE id = {id} AND locked_until = ?");
    assert_eq!(DB::exec_time(&ctx.pool, &settle, token).await.unwrap(), 1);
    running.shutdown().await.unwrap();
    assert!(
        deliveries.try_recv().is_err(),
        "the row was delivered again to the runner"
    );
    report(&format!(
        "lease expiry: {}: a handler outlived its {LEASE:?} lease ({:.1} s) while its extension \
         waited for another session's lock; the late ack failed with LeaseLost and left the new \
         holder's claim intact",
        DB::LABEL,
        outlived.as_secs_f64()
    ));
    ctx.drop_tables().await;
}

/// What the database says about row `id` of `t` and the sessions working on it.
async fn diagnose<DB: TestDb>(ctx: &Ctx<DB>, t: &str, id: i64) -> String {
    let now = Utc::now();
    let lease = |sql: String| async move { DB::count_time(&ctx.pool, &sql, now).await };
    let valid = lease(format!(
        "SELECT COUNT(*) FROM {t} WHERE id = {id} AND locked_until > ?"
    ))
    .await;
    let sessions = match DB::LABEL {
        "postgres" => format!(
            "SELECT pid, CAST(wait_event_type = 'Lock' AS INT) FROM pg_stat_activity \
             WHERE query LIKE '%{t}%'"
        ),
        _ => "SELECT CAST(trx_state = 'LOCK WAIT' AS SIGNED), LENGTH(trx_query), \
              CAST(trx_query LIKE 'UPDATE%' AS SIGNED) FROM information_schema.INNODB_TRX"
            .to_owned(),
    };
    let sessions = DB::ints(&ctx.pool, &sessions).await;
    let list = if DB::LABEL == "mysql" {
        let sql = format!(
            "SELECT TIME, LENGTH(INFO), CAST(INFO LIKE 'UPDATE%' AS SIGNED) \
             FROM information_schema.PROCESSLIST WHERE INFO LIKE '%{t}%'"
        );
        format!("{:?}", DB::ints(&ctx.pool, &sql).await)
    } else {
        String::new()
    };
    format!("lease still valid: {valid:?}; sessions: {sessions:?} {list}")
}
