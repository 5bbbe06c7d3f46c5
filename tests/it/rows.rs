// Row mode (`Queue::row_handler`): the handler gets the claimed row whole, as the service's own
// `FromRow` type, on the connection that holds it; a row that does not decode is never handled.

use std::time::Duration;

use sqlx_queue::{Delivery, Job, Outcome, Queue, Runner, Table};
use tokio::sync::mpsc;

use crate::support::{Ctx, Spec, TestDb, TestRow, recv, wait_for};

/// This file's tests on one database, as `#[tokio::test]`s (`main.rs` writes them in each
/// database's module).
macro_rules! tests {
    ($db:ty) => {
        crate::instantiate!(rows<$db>:
            a_lease_row_handler_gets_its_row_whole,
            a_row_that_does_not_decode_is_dropped_unhandled,
            a_transactional_row_handler_reads_and_writes_in_its_transaction,
        );
    };
}
pub(crate) use tests;

/// The service's own row type: the queue's columns and one of its own.
#[derive(Debug, PartialEq)]
pub(crate) struct Email {
    id: i64,
    payload: Vec<u8>,
    recipient: String,
}

impl<R: TestRow> sqlx::FromRow<'_, R> for Email {
    fn from_row(row: &R) -> sqlx::Result<Self> {
        Ok(Email {
            id: row.int("id")?,
            payload: row.blob("payload")?,
            recipient: row.text("recipient")?,
        })
    }
}

/// A type the rows do not fit: it reads a column the table does not have.
#[derive(Debug)]
struct Missing;

impl<R: TestRow> sqlx::FromRow<'_, R> for Missing {
    fn from_row(row: &R) -> sqlx::Result<Self> {
        row.text("no_such_column").map(|_| Missing)
    }
}

fn jobs(table: &str) -> Table {
    Table::new(table).retry_after("retry_after")
}

/// A queue table with a `recipient` column of the service's own, and three rows in it.
pub(crate) async fn emails<DB: TestDb>(ctx: &mut Ctx<DB>) -> (String, Vec<Email>) {
    let t = ctx.table(Spec::lease()).await;
    ctx.exec(&format!(
        "ALTER TABLE {t} ADD COLUMN recipient VARCHAR(100)"
    ))
    .await;
    let mut want = Vec::new();
    for i in 0..3 {
        let payload = format!("welcome {i}");
        let id = DB::enqueue(&ctx.pool, &jobs(&t), Job::new(&payload))
            .await
            .unwrap();
        let recipient = format!("user{i}@example.com");
        ctx.exec(&format!(
            "UPDATE {t} SET recipient = '{recipient}' WHERE id = {id}"
        ))
        .await;
        want.push(Email {
            id,
            payload: payload.into_bytes(),
            recipient,
        });
    }
    (t, want)
}

/// Runs the runner `mount` makes until `t` is empty, and returns the rows its handler sent, in
/// id order.
pub(crate) async fn handled<DB: TestDb>(
    ctx: &Ctx<DB>,
    t: &str,
    rows: usize,
    mount: impl FnOnce(Runner<DB>) -> Runner<DB>,
    seen: &mut mpsc::UnboundedReceiver<Email>,
) -> Vec<Email> {
    let runner = Runner::new(ctx.pool.clone()).poll_interval(Duration::from_millis(50));
    let running = mount(runner).start().await.unwrap();
    let mut got = Vec::new();
    for _ in 0..rows {
        got.push(recv(seen, "a row mode delivery", 10).await);
    }
    ctx.wait_none(t, "1 = 1", 10).await;
    running.shutdown().await.unwrap();
    got.sort_by_key(|email| email.id);
    got
}

/// The row handler of these tests: it checks the row is its delivery's and sends it.
pub(crate) fn send_rows<DB: TestDb>(
    tx: mpsc::UnboundedSender<Email>,
) -> impl Fn(Email, Delivery<DB>) -> std::future::Ready<Outcome> + Send + Sync + 'static {
    move |email: Email, d: Delivery<DB>| {
        assert_eq!(email.id, d.id(), "the row of its own delivery");
        let _ = tx.send(email);
        std::future::ready(Outcome::ack())
    }
}

pub(crate) async fn a_lease_row_handler_gets_its_row_whole<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, want) = emails(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .workers(2)
        .row_handler(send_rows(tx));
    let got = handled(&ctx, &t, want.len(), |r| r.mount(queue), &mut seen).await;
    assert_eq!(got, want, "each row whole, with the service's own column");
    ctx.drop_tables().await;
}

pub(crate) async fn a_row_that_does_not_decode_is_dropped_unhandled<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, want) = emails(&mut ctx).await;
    let (tx, mut seen) = mpsc::unbounded_channel::<()>();
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .row_handler(move |_: Missing, _: Delivery<DB>| {
            let _ = tx.send(());
            async { Outcome::ack() }
        });
    let running = Runner::new(ctx.pool.clone())
        .poll_interval(Duration::from_millis(50))
        .mount(queue)
        .start()
        .await
        .unwrap();
    // Without a dead letter, an undecodable row is dropped (logged as an error).
    ctx.wait_none(&t, "1 = 1", 10).await;
    // The count follows the settlement's commit: wait for it rather than read it at once.
    wait_for("every drop counted", Duration::from_secs(5), || async {
        running.stats().dropped >= want.len() as u64
    })
    .await;
    let stats = running.stats();
    running.shutdown().await.unwrap();
    assert!(seen.try_recv().is_err(), "the handler never ran");
    assert_eq!(stats.dropped, want.len() as u64, "{stats:?}");
    ctx.drop_tables().await;
}

/// Transactional row mode: the row is read in the delivery's transaction, and the handler's
/// writes through it commit with the ack.
pub(crate) async fn a_transactional_row_handler_reads_and_writes_in_its_transaction<DB: TestDb>() {
    let Some(mut ctx) = Ctx::<DB>::new().await else {
        return;
    };
    let (t, want) = emails(&mut ctx).await;
    let sent = ctx.table(Spec::default()).await;
    let (tx, mut seen) = mpsc::unbounded_channel();
    let insert = format!(
        "INSERT INTO {sent} (payload) VALUES (CAST('x' AS {}))",
        match DB::LABEL {
            "postgres" => "BYTEA",
            "mysql" => "BINARY",
            _ => "BLOB",
        }
    );
    let queue = Queue::table(jobs(&t))
        .lease("locked_until")
        .attempt("attempt")
        .transactional()
        .row_handler(
            move |email: Email, mut d: Delivery<DB, sqlx_queue::Transactional>| {
                let (tx, insert) = (tx.clone(), insert.clone());
                async move {
                    DB::query_on(&mut *d.tx(), &insert).await.unwrap();
                    let _ = tx.send(email);
                    Outcome::ack()
                }
            },
        );
    let got = handled(&ctx, &t, want.len(), |r| r.mount(queue), &mut seen).await;
    assert_eq!(got, want, "each row whole, in the delivery's transaction");
    assert_eq!(
        ctx.count(&sent, "1 = 1").await,
        want.len() as i64,
        "the writes committed"
    );
    ctx.drop_tables().await;
}
