//! A batch's settlement and the next claim in one transaction, on a SQLite file: the next rows
//! come back held and counted, the batch's keys go; a claim that fails takes the settlement
//! back with it, the batch's keys still held (no other claim takes its rows), and the caller
//! then settles the batch on its own.

use super::super::AdvisoryForm;
use crate::backend::{Clock, HeldConn, Key, scratch};
use crate::config::{FormKind, QueueConfig};
use crate::delivery::Outcome;
use crate::form::{Conns, Form, check, measure_server};
use crate::table::Table;

type Sqlite = sqlx::Sqlite;

/// An advisory form of batches of 16 on a fresh database file whose table `jobs` has `rows`
/// rows, ids 1 up.
async fn form(name: &str, rows: i64) -> (AdvisoryForm, Conns<Sqlite>, std::path::PathBuf) {
    let (pool, file) = scratch::open(&format!("advisory-together-{name}")).await;
    sqlx::raw_sql(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, \
         attempt INTEGER NOT NULL DEFAULT 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
         INSERT INTO jobs (payload) SELECT x'00' FROM n",
    )
    .bind(rows)
    .execute(&pool)
    .await
    .unwrap();
    let mut config = QueueConfig::new(Table::new("jobs"), FormKind::Advisory);
    config.attempt = Some("attempt".to_owned());
    config.batch = Some(16);
    let clock = Clock::default();
    let server = measure_server(&pool, &clock).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let checked = check::<Sqlite>(&mut conn, &config, clock, server)
        .await
        .unwrap();
    let form = <AdvisoryForm as Form<Sqlite>>::prepare(&mut conn, &config, checked)
        .await
        .unwrap();
    drop(conn);
    (form, Conns::new(pool, 2), file)
}

/// The ids left in the table, with their attempts.
async fn left(conns: &Conns<Sqlite>) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT id, attempt FROM jobs ORDER BY id")
        .fetch_all(&conns.pool)
        .await
        .unwrap()
}

/// The ids whose keys `conn` holds, in order.
fn held(conn: &HeldConn<Sqlite>) -> Vec<i64> {
    let mut ids: Vec<i64> = conn
        .keys()
        .iter()
        .map(|key| match key {
            Key::InProcess(_, id) => *id,
            other => panic!("a SQLite key is held in the process: {other:?}"),
        })
        .collect();
    ids.sort_unstable();
    ids
}

fn acks(ids: impl IntoIterator<Item = i64>) -> Vec<(i64, Outcome)> {
    ids.into_iter().map(|id| (id, Outcome::ack())).collect()
}

/// Claims a batch of 16 and checks it took rows `from..from + 16`.
async fn claim(form: &AdvisoryForm, conns: &Conns<Sqlite>, from: i64) -> HeldConn<Sqlite> {
    let (rows, conn) = <AdvisoryForm as Form<Sqlite>>::claim_batch(form, conns, 16, &[])
        .await
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, (from..from + 16).collect::<Vec<_>>());
    assert_eq!(held(&conn), ids);
    conn
}

/// Releases the keys `conn` holds, as a runner stopping with the batch would.
async fn release(form: &AdvisoryForm, conns: &Conns<Sqlite>, conn: HeldConn<Sqlite>) {
    let ids = held(&conn);
    <AdvisoryForm as Form<Sqlite>>::release_batch(form, conns, &ids, conn).await;
}

async fn close(conns: Conns<Sqlite>, file: std::path::PathBuf) {
    conns.clear();
    scratch::remove(conns.pool.clone(), file).await;
}

#[tokio::test]
async fn a_batch_settles_and_the_next_comes_back_held_and_counted() {
    let (form, conns, file) = form("next", 40).await;
    let mut conn = claim(&form, &conns, 1).await;
    // Another worker's batch: the claim passes over its rows.
    let other = claim(&form, &conns, 17).await;
    let (settled, rows) = form
        .settle_and_claim::<Sqlite>(&mut conn, &acks(1..=16), 16)
        .await
        .expect("settled and claimed together");
    assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, (33..=40).collect::<Vec<_>>(), "the free rows left");
    assert!(rows.iter().all(|row| row.attempt == Some(0)), "{rows:?}");
    assert_eq!(
        held(&conn),
        ids,
        "the batch's keys went, the next's are held"
    );
    let expected: Vec<(i64, i64)> = (17..=40).map(|id| (id, 1)).collect();
    assert_eq!(
        left(&conns).await,
        expected,
        "batch gone, next counted once"
    );
    release(&form, &conns, conn).await;
    release(&form, &conns, other).await;
    close(conns, file).await;
}

#[tokio::test]
async fn a_claim_that_fails_takes_the_settlement_back_and_the_batch_stays_held() {
    let (form, conns, file) = form("fails", 40).await;
    let mut conn = claim(&form, &conns, 1).await;
    sqlx::raw_sql(
        "CREATE TRIGGER refuse BEFORE UPDATE OF attempt ON jobs WHEN NEW.id = 20 \
         BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .execute(&conns.pool)
    .await
    .unwrap();
    let together = form
        .settle_and_claim::<Sqlite>(&mut conn, &acks(1..=16), 16)
        .await;
    assert!(together.is_none(), "the claim fails on row 20");
    let expected: Vec<(i64, i64)> = (1..=40).map(|id| (id, i64::from(id <= 16))).collect();
    assert_eq!(
        left(&conns).await,
        expected,
        "one transaction: nothing settled, nothing counted"
    );
    assert_eq!(
        held(&conn),
        (1..=16).collect::<Vec<_>>(),
        "the batch's keys held, the claim's gone"
    );
    // Until its settlement, no other claim takes the batch's rows.
    sqlx::raw_sql("DROP TRIGGER refuse")
        .execute(&conns.pool)
        .await
        .unwrap();
    let other = claim(&form, &conns, 17).await;
    let settled =
        <AdvisoryForm as Form<Sqlite>>::settle_batch(&form, &conns, &acks(1..=16), conn, false)
            .await
            .unwrap();
    assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    let expected: Vec<(i64, i64)> = (17..=40).map(|id| (id, i64::from(id <= 32))).collect();
    assert_eq!(left(&conns).await, expected);
    release(&form, &conns, other).await;
    close(conns, file).await;
}

#[tokio::test]
async fn a_batch_with_a_retry_is_not_settled_with_a_claim() {
    let (form, conns, file) = form("retry", 40).await;
    let mut conn = claim(&form, &conns, 1).await;
    let mut settlements = acks(1..=16);
    settlements[4].1 = Outcome::retry();
    let together = form
        .settle_and_claim::<Sqlite>(&mut conn, &settlements, 16)
        .await;
    assert!(together.is_none());
    assert_eq!(held(&conn), (1..=16).collect::<Vec<_>>());
    let expected: Vec<(i64, i64)> = (1..=40).map(|id| (id, i64::from(id <= 16))).collect();
    assert_eq!(left(&conns).await, expected, "nothing ran");
    release(&form, &conns, conn).await;
    close(conns, file).await;
}
