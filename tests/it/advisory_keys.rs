//! The keys an advisory queue holds on the server are exactly its rows in hand: a claim's one
//! lock statement takes no key beyond its limit (PostgreSQL's `pg_try_advisory_lock` in a
//! derived table under a `LIMIT`, MySQL/MariaDB's `GET_LOCK` over a materialised window), rows
//! claimed ahead of workers that do not end go back, and a shutdown leaves none. SQLite's keys
//! are held in the process: nothing to read on a server.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::Semaphore;

use crate::support::{Ctx, Spec, TestDb, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(advisory_keys<$db>:
            the_keys_held_are_the_rows_in_work_and_none_after_shutdown,
            a_row_whose_ack_fails_keeps_no_key_and_its_session_settles_the_others,
        );
    };
}
pub(crate) use tests;

/// The 32-bit FNV-1a hash, the high half of a PostgreSQL key (docs/guide/claim_forms.md).
fn fnv1a_32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// How many keys of table `t`'s rows, deleted ones among them, some session holds.
async fn keys_held<DB: TestDb>(ctx: &Ctx<DB>, t: &str) -> i64 {
    let sql = match DB::LABEL {
        "postgres" => format!(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
             AND objsubid = 1 AND classid::bigint = {}",
            fnv1a_32(t)
        ),
        // Every id the table gave out, its deleted rows' too.
        _ => format!(
            "WITH RECURSIVE n (id) AS (SELECT 1 UNION ALL SELECT id + 1 FROM n WHERE id < \
             (SELECT AUTO_INCREMENT - 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = \
             DATABASE() AND TABLE_NAME = '{t}')) SELECT COUNT(*) FROM n \
             WHERE IS_USED_LOCK(CONCAT(DATABASE(), '.', '{t}', ':', id)) IS NOT NULL"
        ),
    };
    DB::count(&ctx.pool, &sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

pub(crate) async fn the_keys_held_are_the_rows_in_work_and_none_after_shutdown<DB: TestDb>() {
    if DB::LABEL == "sqlite" {
        return;
    }
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::default()).await;
    let payloads: Vec<String> = (0..40).map(|i| format!("job {i}")).collect();
    let jobs: Vec<Job<'_>> = payloads.iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
        .await
        .unwrap();
    // Handlers wait for the gate: three rows in work, and the claim loop has nothing to fill.
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let handler_gate = Arc::clone(&gate);
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .workers(3)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(d.id());
            let gate = Arc::clone(&handler_gate);
            async move {
                gate.acquire().await.expect("never closed").forget();
                Outcome::ack()
            }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    for _ in 0..3 {
        recv(&mut started, "three handlers started", 30).await;
    }
    // The first claim took a row for each worker and three ahead of each, none more.
    let first = keys_held(&ctx, &t).await;
    assert!(
        (3..=12).contains(&first),
        "a key for each row in work or claimed ahead, none beyond the claim: {first}"
    );
    // The rows ahead of workers that do not end go back (their keys with them), and the
    // runner, its workers slower than it thought, claims none ahead again.
    wait_for(
        "a key for each row in work, none more",
        Duration::from_secs(10),
        || async { keys_held(&ctx, &t).await == 3 },
    )
    .await;
    // Twenty rows more, then a shutdown with three handlers in work again: 23 started, 20
    // let through. Their acks delete the rows before releasing the keys: wait for the keys.
    gate.add_permits(20);
    for _ in 0..20 {
        recv(&mut started, "twenty more handlers started", 30).await;
    }
    ctx.wait_count(&t, "1 = 1", 20, 30).await;
    wait_for(
        "the keys of three rows in work",
        Duration::from_secs(10),
        || async { keys_held(&ctx, &t).await == 3 },
    )
    .await;
    let shutdown = tokio::spawn(running.shutdown());
    gate.add_permits(3);
    shutdown.await.unwrap().unwrap();
    assert_eq!(keys_held(&ctx, &t).await, 0, "no key left after shutdown");
    ctx.drop_tables().await;
}

/// A trigger refusing the delete of the row whose payload is `bad`.
fn refusing_bad<DB: TestDb>(t: &str) -> String {
    match DB::LABEL {
        "postgres" => format!(
            "CREATE FUNCTION {t}_refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN IF OLD.payload = 'bad'::bytea THEN RAISE EXCEPTION 'refused'; END IF; \
             RETURN OLD; END $$; \
             CREATE TRIGGER {t}_refuse BEFORE DELETE ON {t} \
             FOR EACH ROW EXECUTE FUNCTION {t}_refuse()"
        ),
        "mysql" => format!(
            "CREATE TRIGGER {t}_refuse BEFORE DELETE ON {t} FOR EACH ROW \
             IF OLD.payload = 'bad' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused'; \
             END IF"
        ),
        _ => format!(
            "CREATE TRIGGER {t}_refuse BEFORE DELETE ON {t} \
             WHEN CAST(OLD.payload AS TEXT) = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END"
        ),
    }
}

pub(crate) async fn a_row_whose_ack_fails_keeps_no_key_and_its_session_settles_the_others<
    DB: TestDb,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let t = ctx.table(Spec::default()).await;
    ctx.exec(&refusing_bad::<DB>(&t)).await;
    let jobs: Vec<Job<'_>> = ["a", "bad", "c", "d"].iter().map(Job::new).collect();
    DB::enqueue_many(&ctx.pool, &Table::new(&t), &jobs)
        .await
        .unwrap();
    let (tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    // Four workers: one claim takes the four rows on one session; every ack is grouped there.
    let queue = Queue::table(Table::new(&t))
        .advisory_lock()
        .workers(4)
        .handler(move |d: Delivery<DB>| {
            let _ = tx.send(String::from_utf8_lossy(d.payload()).into_owned());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .mount(queue)
        .start()
        .await
        .unwrap();
    for _ in 0..4 {
        recv(&mut seen, "the four rows delivered", 30).await;
    }
    ctx.wait_count(&t, "1 = 1", 1, 30).await;
    if DB::LABEL != "sqlite" {
        // Held back for a second after its ack failed: its key released meanwhile.
        wait_for("no key held", Duration::from_secs(10), || async {
            keys_held(&ctx, &t).await == 0
        })
        .await;
    }
    running.shutdown().await.unwrap();
    assert_eq!(ctx.count(&t, "1 = 1").await, 1, "the refused row is kept");
    if DB::LABEL != "sqlite" {
        assert_eq!(keys_held(&ctx, &t).await, 0, "no key left after shutdown");
    }
    ctx.drop_tables().await;
}
