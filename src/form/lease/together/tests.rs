//! A batch's settlement and the next claim in one transaction, on a SQLite file: the next rows
//! come back leased, a row whose lease was lost is reported while the others settle, and a
//! claim that fails takes the settlement back with it (one transaction), which the caller then
//! runs on its own.

use std::time::Duration;

use super::super::{LeaseForm, Token};
use crate::backend::{Clock, scratch};
use crate::config::{FormKind, QueueConfig};
use crate::delivery::Outcome;
use crate::error::Error;
use crate::form::{Conns, Form, check, measure_server};
use crate::table::Table;

/// A lease form on a fresh database file whose table `jobs` has `rows` rows, ids 1 up.
async fn form(name: &str, rows: i64) -> (LeaseForm, Conns<sqlx::Sqlite>, std::path::PathBuf) {
    let (pool, file) = scratch::open(&format!("together-{name}")).await;
    sqlx::raw_sql(
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, \
         attempt INTEGER NOT NULL DEFAULT 0, locked_until TEXT)",
    )
    .execute(&pool)
    .await
    .unwrap();
    for _ in 0..rows {
        sqlx::query("INSERT INTO jobs (payload) VALUES (x'00')")
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut config = QueueConfig::new(
        Table::new("jobs"),
        FormKind::Lease {
            column: "locked_until".to_owned(),
            duration: Duration::from_secs(60),
        },
    );
    config.attempt = Some("attempt".to_owned());
    config.batch = Some(16);
    let clock = Clock::default();
    let server = measure_server(&pool, &clock).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let checked = check::<sqlx::Sqlite>(&mut conn, &config, clock, server)
        .await
        .unwrap();
    let form = <LeaseForm as Form<sqlx::Sqlite>>::prepare(&mut conn, &config, checked)
        .await
        .unwrap();
    drop(conn);
    (form, Conns::new(pool, 1), file)
}

/// The ids left in the table and whether each is leased.
async fn left(conns: &Conns<sqlx::Sqlite>) -> Vec<(i64, bool)> {
    sqlx::query_as("SELECT id, locked_until IS NOT NULL FROM jobs ORDER BY id")
        .fetch_all(&conns.pool)
        .await
        .unwrap()
}

fn acks(ids: impl IntoIterator<Item = i64>) -> Vec<(i64, Outcome)> {
    ids.into_iter().map(|id| (id, Outcome::ack())).collect()
}

async fn first_batch(form: &LeaseForm, conns: &Conns<sqlx::Sqlite>) -> Vec<Token> {
    let (rows, tokens) = form
        .claim_each::<sqlx::Sqlite>(conns, 16, &[])
        .await
        .unwrap();
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, (1..=16).collect::<Vec<_>>());
    tokens
}

async fn close(conns: Conns<sqlx::Sqlite>, file: std::path::PathBuf) {
    conns.clear();
    scratch::remove(conns.pool.clone(), file).await;
}

#[tokio::test]
async fn a_batch_settles_and_the_next_comes_back_leased() {
    let (form, conns, file) = form("next", 40).await;
    let tokens = first_batch(&form, &conns).await;
    let (settled, (rows, next)) = form
        .settle_and_claim::<sqlx::Sqlite>(&conns, &acks(1..=16), tokens, 16)
        .await
        .unwrap_or_else(|_| panic!("settled and claimed together"));
    assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, (17..=32).collect::<Vec<_>>());
    assert!(
        rows.iter().all(|row| row.attempt == Some(0)),
        "counted once"
    );
    assert_eq!(next.len(), 16);
    let expected: Vec<(i64, bool)> = (17..=40).map(|id| (id, id <= 32)).collect();
    assert_eq!(left(&conns).await, expected, "batch gone, next leased");
    let attempts: Vec<i64> = sqlx::query_scalar("SELECT attempt FROM jobs WHERE id <= 32")
        .fetch_all(&conns.pool)
        .await
        .unwrap();
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");
    close(conns, file).await;
}

#[tokio::test]
async fn a_row_whose_lease_was_lost_is_reported_and_the_others_settle() {
    let (form, conns, file) = form("lost", 20).await;
    let tokens = first_batch(&form, &conns).await;
    // Another claim took row 3 after its lease ran out.
    sqlx::query("UPDATE jobs SET locked_until = '2999-01-01 00:00:00' WHERE id = 3")
        .execute(&conns.pool)
        .await
        .unwrap();
    let (settled, (rows, _)) = form
        .settle_and_claim::<sqlx::Sqlite>(&conns, &acks(1..=16), tokens, 16)
        .await
        .unwrap_or_else(|_| panic!("settled and claimed together"));
    for (id, result) in (1..=16).zip(&settled) {
        match id {
            3 => assert!(
                matches!(result, Err(Error::LeaseLost { id: 3, .. })),
                "{result:?}"
            ),
            _ => assert!(result.is_ok(), "row {id}: {result:?}"),
        }
    }
    let ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(ids, (17..=20).collect::<Vec<_>>());
    let expected: Vec<(i64, bool)> = [3]
        .into_iter()
        .chain(17..=20)
        .map(|id| (id, true))
        .collect();
    assert_eq!(left(&conns).await, expected);
    close(conns, file).await;
}

#[tokio::test]
async fn a_claim_that_fails_takes_the_settlement_back_with_it() {
    let (form, conns, file) = form("fails", 40).await;
    let tokens = first_batch(&form, &conns).await;
    sqlx::raw_sql(
        "CREATE TRIGGER refuse BEFORE UPDATE OF locked_until ON jobs WHEN NEW.id = 20 \
         BEGIN SELECT RAISE(ABORT, 'refused'); END",
    )
    .execute(&conns.pool)
    .await
    .unwrap();
    let Err(tokens) = form
        .settle_and_claim::<sqlx::Sqlite>(&conns, &acks(1..=16), tokens, 16)
        .await
    else {
        panic!("the claim fails on row 20");
    };
    let expected: Vec<(i64, bool)> = (1..=40).map(|id| (id, id <= 16)).collect();
    assert_eq!(
        left(&conns).await,
        expected,
        "one transaction: nothing settled"
    );
    // The caller settles the batch on its own.
    let settled = <LeaseForm as Form<sqlx::Sqlite>>::settle_batch(
        &form,
        &conns,
        &acks(1..=16),
        tokens,
        false,
    )
    .await
    .unwrap();
    assert!(settled.iter().all(Result::is_ok), "{settled:?}");
    let expected: Vec<(i64, bool)> = (17..=40).map(|id| (id, false)).collect();
    assert_eq!(left(&conns).await, expected);
    close(conns, file).await;
}

#[tokio::test]
async fn a_batch_with_a_retry_is_not_settled_with_a_claim() {
    let (form, conns, file) = form("retry", 40).await;
    let tokens = first_batch(&form, &conns).await;
    let mut settlements = acks(1..=16);
    settlements[4].1 = Outcome::retry();
    let given_back = form
        .settle_and_claim::<sqlx::Sqlite>(&conns, &settlements, tokens, 16)
        .await;
    assert!(matches!(&given_back, Err(tokens) if tokens.len() == 16));
    let expected: Vec<(i64, bool)> = (1..=40).map(|id| (id, id <= 16)).collect();
    assert_eq!(left(&conns).await, expected, "nothing ran");
    close(conns, file).await;
}
