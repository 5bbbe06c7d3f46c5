// Shutdown of a transactional queue whose handler is stuck in a statement on its delivery's
// transaction: `shutdown()` returns within its timeout plus the documented grace (two seconds),
// the row returns as its form promises, and nothing the handler wrote commits. PostgreSQL and
// MariaDB (on SQLite the tests return at once), for one database `DB` and one form `F`.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::time::Instant;

use crate::support::{Ctx, Form, Spec, TestDb, recv};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(shutdown<$db, $form>:
            a_handler_asleep_in_its_transaction_does_not_hold_shutdown,
            a_handler_waiting_for_a_lock_does_not_hold_shutdown,
        );
    };
}
pub(crate) use tests;

const TIMEOUT: Duration = Duration::from_millis(500);
/// `Running::shutdown`'s documented bound past its timeout.
const GRACE: Duration = Duration::from_secs(2);

/// What the handler is stuck in.
#[derive(Debug, Clone, Copy)]
enum Stuck {
    /// An 8 s sleep in a statement.
    Sleep,
    /// An `UPDATE` waiting for a row lock another session holds until the test ends.
    LockWait,
}

async fn stuck_in_a_statement<DB: TestDb, F: Form<DB>>(stuck: Stuck) {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    if DB::LABEL == "sqlite" {
        return;
    }
    let t = ctx.table(Spec::lease()).await;
    let accounts = format!("{t}_accounts");
    let locked = format!("{t}_locked");
    ctx.exec(&format!(
        "CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)"
    ))
    .await;
    ctx.exec(&format!(
        "CREATE TABLE {locked} (id INT PRIMARY KEY, n INT NOT NULL)"
    ))
    .await;
    ctx.exec(&format!("INSERT INTO {locked} (id, n) VALUES (1, 0)"))
        .await;
    let mut holder = ctx.pool.begin().await.unwrap();
    DB::query_on(
        &mut *holder,
        &format!("UPDATE {locked} SET n = n + 1 WHERE id = 1"),
    )
    .await
    .unwrap();
    let jobs = Table::new(&t).retry_after("retry_after");
    DB::enqueue(&ctx.pool, &jobs, Job::new("a@example.com"))
        .await
        .unwrap();

    let statement = match (stuck, DB::LABEL) {
        (Stuck::Sleep, "postgres") => "SELECT pg_sleep(8)".to_owned(),
        (Stuck::Sleep, _) => "SELECT SLEEP(8)".to_owned(),
        (Stuck::LockWait, _) => format!("UPDATE {locked} SET n = n + 10 WHERE id = 1"),
    };
    let (started, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs.clone()))
        .attempt("attempt")
        .transactional()
        .handler({
            let (accounts, statement) = (accounts.clone(), statement.clone());
            move |mut d: Delivery<DB, Transactional>| {
                let (accounts, statement, started) =
                    (accounts.clone(), statement.clone(), started.clone());
                async move {
                    DB::query_on(
                        &mut *d.tx(),
                        &format!("INSERT INTO {accounts} (email) VALUES ('a@example.com')"),
                    )
                    .await
                    .unwrap();
                    let _ = started.send(());
                    let _ = DB::query_on(&mut *d.tx(), &statement).await;
                    Outcome::ack()
                }
            }
        });
    let pool = ctx.pool(4).await;
    let running = Runner::new(pool.clone())
        .shutdown_timeout(TIMEOUT)
        .mount(queue)
        .start()
        .await
        .unwrap();
    recv(&mut seen, "the handler's start", 10).await;
    // The statement is running (or waiting for its lock) on the server.
    let running_now = match DB::LABEL {
        "postgres" => format!(
            "(SELECT 1 FROM pg_stat_activity WHERE state = 'active' \
             AND query = '{}') AS a",
            statement.replace('\'', "''")
        ),
        _ => format!(
            "(SELECT 1 FROM information_schema.PROCESSLIST WHERE INFO = '{}') AS a",
            statement.replace('\'', "''")
        ),
    };
    ctx.wait_count(&running_now, "1 = 1", 1, 10).await;

    let began = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(30), running.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{stuck:?}: shutdown did not return in 30 s"))
        .unwrap();
    let took = began.elapsed();
    assert!(
        took < TIMEOUT + GRACE,
        "{stuck:?}: shutdown took {took:?}: {report:?}"
    );
    assert_eq!(
        (report.cancelled, report.released, report.unreleased),
        (1, 1, 0),
        "{stuck:?}: {report:?}"
    );

    // The row returns as the form promises: another runner has it at once.
    let again = F::apply(Queue::table(jobs))
        .attempt("attempt")
        .handler(|_: Delivery<DB>| async { Outcome::ack() });
    let other = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(20))
        .mount(again)
        .start()
        .await
        .unwrap();
    ctx.wait_none(&t, "1 = 1", 3).await;
    other.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&accounts, "1 = 1").await,
        0,
        "{stuck:?}: nothing committed"
    );

    holder.rollback().await.unwrap();
    // The stuck statement's session ends (killed, or on noticing its closed
    // connection); what it wrote never commits.
    ctx.wait_count(&running_now, "1 = 1", 0, 30).await;
    assert_eq!(
        ctx.count(&accounts, "1 = 1").await,
        0,
        "{stuck:?}: nothing committed"
    );
    assert_eq!(
        ctx.count(&locked, "n = 0").await,
        1,
        "{stuck:?}: nothing committed"
    );
    pool.close().await;
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.exec(&format!("DROP TABLE {locked}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn a_handler_asleep_in_its_transaction_does_not_hold_shutdown<
    DB: TestDb,
    F: Form<DB>,
>() {
    stuck_in_a_statement::<DB, F>(Stuck::Sleep).await;
}

pub(crate) async fn a_handler_waiting_for_a_lock_does_not_hold_shutdown<DB: TestDb, F: Form<DB>>() {
    stuck_in_a_statement::<DB, F>(Stuck::LockWait).await;
}
