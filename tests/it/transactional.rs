// Transactional mode (the seed's "Transactional") for one database `DB` and one form `F`. The
// handler writes an account (and a welcome job) through its delivery's transaction; what the
// tests read goes through the pool.

use std::sync::Arc;
use std::time::Duration;

use sqlx_queue::{DeadLetter, Delivery, Job, Outcome, Queue, Runner, Table, Transactional};
use tokio::sync::{Semaphore, mpsc};

use crate::support::{
    Ctx, Form, INTENDED_PANIC, Spec, TestDb, intended_panics_without_backtrace, recv, wait_for,
};

/// This file's tests on one database and claim form, as `#[tokio::test]`s (`main.rs`
/// writes them in each database's module, one module per form).
macro_rules! tests {
    ($db:ty, $form:ty) => {
        crate::instantiate!(transactional<$db, $form>:
            ack_commits_the_handlers_writes_with_the_settlement_and_not_before,
            every_other_outcome_rolls_the_writes_back_and_settles_as_without_the_step,
            the_dead_letter_and_a_panic_commit_nothing,
            a_delivery_that_escapes_its_handler_is_transaction_held_and_commits_nothing,
        );
    };
}
pub(crate) use tests;

type Tx<DB> = Delivery<DB, Transactional>;

/// The queue table, the accounts table and the welcome jobs table of one test.
async fn tables<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, String, String) {
    let jobs = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let welcome = ctx
        .table(Spec {
            group: true,
            ..Spec::lease()
        })
        .await;
    let accounts = format!("{jobs}_accounts");
    ctx.exec(&format!(
        "CREATE TABLE {accounts} (email VARCHAR(200) NOT NULL)"
    ))
    .await;
    (jobs, accounts, welcome)
}

fn jobs(t: &str) -> Table {
    Table::new(t).group("queue").retry_after("retry_after")
}

/// Opens the account of `d`'s payload and queues its welcome email, through `d.tx()`.
async fn open_account<DB: TestDb>(d: &mut Tx<DB>, accounts: &str, welcome: &str) {
    let email = String::from_utf8_lossy(d.payload()).into_owned();
    DB::query_on(
        &mut *d.tx(),
        &format!("INSERT INTO {accounts} (email) VALUES ('{email}')"),
    )
    .await
    .unwrap();
    DB::enqueue_on(
        &mut *d.tx(),
        &jobs(welcome),
        Job::new(&email).group("welcome"),
    )
    .await
    .unwrap();
}

/// The accounts written: the escaped delivery's must not be among them.
async fn accounts_written<DB: TestDb>(ctx: &Ctx<DB>, accounts: &str) -> i64 {
    ctx.count(accounts, "1 = 1").await
}

fn runner<DB: TestDb>(pool: &sqlx::Pool<DB>) -> Runner<DB> {
    Runner::new(pool.clone()).poll_interval(Duration::from_millis(50))
}

pub(crate) async fn ack_commits_the_handlers_writes_with_the_settlement_and_not_before<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, accounts, welcome) = tables(&mut ctx).await;
    DB::enqueue(
        &ctx.pool,
        &jobs(&t),
        Job::new("a@example.com").group("signups"),
    )
    .await
    .unwrap();
    let gate = Arc::new(Semaphore::new(0));
    let (tx, mut written) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)).named("signups"))
        .attempt("attempt")
        .transactional()
        .handler({
            let (accounts, welcome, gate) = (accounts.clone(), welcome.clone(), Arc::clone(&gate));
            move |mut d: Tx<DB>| {
                let (accounts, welcome, gate, tx) = (
                    accounts.clone(),
                    welcome.clone(),
                    Arc::clone(&gate),
                    tx.clone(),
                );
                async move {
                    open_account(&mut d, &accounts, &welcome).await;
                    let _ = tx.send(());
                    let _permit = gate.acquire().await.unwrap();
                    Outcome::ack()
                }
            }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    recv(&mut written, "the handler's writes", 10).await;
    assert_eq!(
        ctx.count(&accounts, "1 = 1").await,
        0,
        "not visible before the ack"
    );
    assert_eq!(ctx.count(&welcome, "1 = 1").await, 0, "nor its job");
    gate.add_permits(1);
    ctx.wait_none(&t, "1 = 1", 10).await;
    assert_eq!(ctx.count(&accounts, "email = 'a@example.com'").await, 1);
    assert_eq!(ctx.count(&welcome, "queue = 'welcome'").await, 1);
    running.shutdown().await.unwrap();
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn every_other_outcome_rolls_the_writes_back_and_settles_as_without_the_step<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, accounts, welcome) = tables(&mut ctx).await;
    let id = DB::enqueue(
        &ctx.pool,
        &jobs(&t),
        Job::new("b@example.com").group("signups"),
    )
    .await
    .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = F::apply(Queue::table(jobs(&t)).named("signups"))
        .attempt("attempt")
        .transactional()
        .handler({
            let (accounts, welcome) = (accounts.clone(), welcome.clone());
            move |mut d: Tx<DB>| {
                let (accounts, welcome, tx) = (accounts.clone(), welcome.clone(), tx.clone());
                async move {
                    open_account(&mut d, &accounts, &welcome).await;
                    let _ = tx.send(d.attempt());
                    match d.attempt() {
                        1 => Outcome::retry(),
                        2 => Outcome::retry_after(Duration::from_millis(1)),
                        _ => Outcome::drop(),
                    }
                }
            }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    for attempt in 1..=3 {
        assert_eq!(
            recv(&mut seen, "a delivery", 10).await,
            attempt,
            "the attempt counted"
        );
    }
    ctx.wait_none(&t, &format!("id = {id}"), 10).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        ctx.count(&accounts, "1 = 1").await,
        0,
        "retry, retry_after and drop roll back"
    );
    assert_eq!(ctx.count(&welcome, "1 = 1").await, 0);
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn the_dead_letter_and_a_panic_commit_nothing<DB: TestDb, F: Form<DB>>() {
    intended_panics_without_backtrace();
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, accounts, welcome) = tables(&mut ctx).await;
    let panics = DB::enqueue(
        &ctx.pool,
        &jobs(&t),
        Job::new("p@example.com").group("signups"),
    )
    .await
    .unwrap();
    let dies = DB::enqueue(
        &ctx.pool,
        &jobs(&t),
        Job::new("d@example.com").group("signups"),
    )
    .await
    .unwrap();
    let queue = F::apply(Queue::table(jobs(&t)).named("signups"))
        .attempt("attempt")
        .max_attempts(2)
        .dead_letter(DeadLetter::group("dead"))
        .transactional()
        .handler({
            let (accounts, welcome) = (accounts.clone(), welcome.clone());
            move |mut d: Tx<DB>| {
                let (accounts, welcome) = (accounts.clone(), welcome.clone());
                async move {
                    open_account(&mut d, &accounts, &welcome).await;
                    let panicking = d.payload() == b"p@example.com";
                    assert!(!panicking || d.attempt() > 1, "{INTENDED_PANIC}");
                    if panicking {
                        Outcome::ack()
                    } else {
                        Outcome::retry()
                    }
                }
            }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    ctx.wait_none(&t, &format!("id = {panics}"), 10).await;
    ctx.wait_count(&t, &format!("id = {dies} AND queue = 'dead'"), 1, 10)
        .await;
    running.shutdown().await.unwrap();
    // Only the panicking row's second, acknowledged delivery committed.
    assert_eq!(ctx.count(&accounts, "1 = 1").await, 1);
    assert_eq!(ctx.count(&accounts, "email = 'p@example.com'").await, 1);
    assert_eq!(ctx.count(&welcome, "1 = 1").await, 1);
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}

pub(crate) async fn a_delivery_that_escapes_its_handler_is_transaction_held_and_commits_nothing<
    DB: TestDb,
    F: Form<DB>,
>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, accounts, welcome) = tables(&mut ctx).await;
    let id = DB::enqueue(
        &ctx.pool,
        &jobs(&t),
        Job::new("e@example.com").group("signups"),
    )
    .await
    .unwrap();
    let (tx, mut seen) = mpsc::unbounded_channel();
    let escaped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let queue = F::apply(Queue::table(jobs(&t)).named("signups"))
        .attempt("attempt")
        .transactional()
        .handler({
            let (accounts, welcome) = (accounts.clone(), welcome.clone());
            move |mut d: Tx<DB>| {
                let (accounts, welcome, tx) = (accounts.clone(), welcome.clone(), tx.clone());
                let escape = !escaped.swap(true, std::sync::atomic::Ordering::SeqCst);
                async move {
                    open_account(&mut d, &accounts, &welcome).await;
                    let _ = tx.send(d.attempt());
                    if escape {
                        // The delivery, and its transaction, escape into a task.
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            drop(d);
                        });
                    }
                    Outcome::ack()
                }
            }
        });
    let running = runner(&ctx.pool).mount(queue).start().await.unwrap();
    assert_eq!(recv(&mut seen, "the escaping delivery", 10).await, 1);
    wait_for(
        "the held transaction counted",
        Duration::from_secs(10),
        || async { running.stats().failed == 1 },
    )
    .await;
    // The row was released unsettled; its next delivery stays in its handler.
    recv(&mut seen, "the next delivery", 15).await;
    ctx.wait_none(&t, &format!("id = {id}"), 10).await;
    running.shutdown().await.unwrap();
    assert_eq!(
        accounts_written(&ctx, &accounts).await,
        1,
        "only the second committed"
    );
    assert_eq!(ctx.count(&welcome, "1 = 1").await, 1);
    ctx.exec(&format!("DROP TABLE {accounts}")).await;
    ctx.drop_tables().await;
}
