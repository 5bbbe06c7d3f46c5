//! A batch's settlement joined with the next claim, on PostgreSQL (`SQLX_QUEUE_PG_URL`; skipped
//! with a notice when unset, unless `SQLX_QUEUE_REQUIRE_ALL=1`): the batch commits and the next
//! comes back held by the connection's new transaction; a `DELETE` that fails rolls the batch
//! back whole; a claim that fails past the `COMMIT` leaves the batch settled and nothing held.

use std::time::{Duration, Instant};

use super::super::RowLockForm;
use crate::backend::{Clock, HeldConn};
use crate::config::{FormKind, QueueConfig};
use crate::delivery::Outcome;
use crate::error::Error;
use crate::form::{Conns, Form, check, measure_server};
use crate::table::Table;

type Pg = sqlx::Postgres;

/// A row lock form of batches of 16 on a fresh table of `rows` rows (ids 1 up), its name made
/// of `name`; `None` without a PostgreSQL URL.
async fn form(name: &str, rows: i64) -> Option<(RowLockForm, Conns<Pg>, String)> {
    let url = match std::env::var("SQLX_QUEUE_PG_URL") {
        Ok(url) => url,
        Err(_) if std::env::var("SQLX_QUEUE_REQUIRE_ALL").as_deref() == Ok("1") => {
            panic!("SQLX_QUEUE_PG_URL is not set, and SQLX_QUEUE_REQUIRE_ALL=1 requires it")
        }
        Err(_) => {
            eprintln!("SQLX_QUEUE_PG_URL is not set: form::row_lock::together skipped");
            return None;
        }
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap();
    let t = format!("row_lock_together_{name}_{}", std::process::id());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {t}; \
         CREATE TABLE {t} (id BIGSERIAL PRIMARY KEY, payload BYTEA NOT NULL, \
         attempt INT NOT NULL DEFAULT 0); \
         INSERT INTO {t} (payload) SELECT '\\x00' FROM generate_series(1, {rows})"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let mut config = QueueConfig::new(Table::new(&t), FormKind::RowLock);
    config.attempt = Some("attempt".to_owned());
    config.batch = Some(16);
    let clock = Clock::default();
    let server = measure_server(&pool, &clock).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let checked = check::<Pg>(&mut conn, &config, clock, server)
        .await
        .unwrap();
    let form = <RowLockForm as Form<Pg>>::prepare(&mut conn, &config, checked)
        .await
        .unwrap();
    drop(conn);
    Some((form, Conns::new(pool, 2), t))
}

/// The ids in the table, and those another transaction can lock now (not held).
async fn left(conns: &Conns<Pg>, t: &str) -> (Vec<i64>, Vec<i64>) {
    let all = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {t} ORDER BY id"
    )))
    .fetch_all(&conns.pool)
    .await
    .unwrap();
    let mut tx = conns.pool.begin().await.unwrap();
    let free = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {t} ORDER BY id FOR UPDATE SKIP LOCKED"
    )))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    (all, free)
}

fn acks(ids: impl IntoIterator<Item = i64>) -> Vec<(i64, Outcome)> {
    ids.into_iter().map(|id| (id, Outcome::ack())).collect()
}

fn ids(from: i64, to: i64) -> Vec<i64> {
    (from..=to).collect()
}

/// Claims a batch of 16 and checks it took rows `from..from + 16`.
async fn claim(form: &RowLockForm, conns: &Conns<Pg>, from: i64) -> HeldConn<Pg> {
    let (rows, conn) = <RowLockForm as Form<Pg>>::claim_batch(form, conns, 16, &[])
        .await
        .unwrap();
    let claimed: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(claimed, ids(from, from + 15));
    conn
}

async fn close(conns: Conns<Pg>, t: &str) {
    conns.clear();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {t}")))
        .execute(&conns.pool)
        .await
        .unwrap();
    conns.pool.close().await;
}

#[tokio::test]
async fn a_batch_commits_and_the_next_comes_back_held() {
    let Some((form, conns, t)) = form("next", 40).await else {
        return;
    };
    let conn = claim(&form, &conns, 1).await;
    // Another worker's batch: the claim passes over its rows.
    let other = claim(&form, &conns, 17).await;
    let Ok((settled, Some((rows, conn)))) = form
        .settle_and_claim::<Pg>(&conns, &acks(1..=16), conn, 16)
        .await
    else {
        panic!("settled and claimed together");
    };
    assert!(settled.unwrap().iter().all(Result::is_ok));
    let claimed: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(claimed, ids(33, 40), "the free rows left");
    assert!(rows.iter().all(|row| row.attempt == Some(0)), "{rows:?}");
    assert_eq!(conn.depth(), 1, "the next batch's transaction is open");
    assert_eq!(
        left(&conns, &t).await,
        (ids(17, 40), Vec::new()),
        "the batch committed (seen from another session); the next batch and the other \
         worker's held"
    );
    // The next batch settles as any batch does.
    let settled =
        <RowLockForm as Form<Pg>>::settle_batch(&form, &conns, &acks(33..=40), conn, false)
            .await
            .unwrap();
    assert!(settled.iter().all(Result::is_ok));
    <RowLockForm as Form<Pg>>::release_batch(&form, &conns, &ids(17, 32), other).await;
    assert_eq!(left(&conns, &t).await, (ids(17, 32), ids(17, 32)));
    close(conns, &t).await;
}

#[tokio::test]
async fn a_delete_that_fails_rolls_the_batch_back_whole() {
    let Some((form, conns, t)) = form("refused", 40).await else {
        return;
    };
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION {t}_refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
         CREATE TRIGGER refuse BEFORE DELETE ON {t} FOR EACH ROW WHEN (OLD.id = 5) \
         EXECUTE FUNCTION {t}_refuse()"
    )))
    .execute(&conns.pool)
    .await
    .unwrap();
    let conn = claim(&form, &conns, 1).await;
    let Ok((settled, None)) = form
        .settle_and_claim::<Pg>(&conns, &acks(1..=16), conn, 16)
        .await
    else {
        panic!("the text ran, and claimed nothing");
    };
    let Err((None, Error::BatchRolledBack { rows: 16, .. })) = settled else {
        panic!("the batch rolled back, naming no row: {settled:?}");
    };
    assert_eq!(
        left(&conns, &t).await,
        (ids(1, 40), ids(1, 40)),
        "nothing deleted, nothing held"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TRIGGER refuse ON {t}; DROP FUNCTION {t}_refuse()"
    )))
    .execute(&conns.pool)
    .await
    .unwrap();
    close(conns, &t).await;
}

#[tokio::test]
async fn a_claim_that_fails_after_the_commit_leaves_the_batch_settled() {
    let Some((form, conns, t)) = form("claim", 40).await else {
        return;
    };
    let conn = claim(&form, &conns, 1).await;
    // A rename waits for the batch's transaction; once it commits, the rename goes first, and
    // the claim, which names the column, fails.
    let pool = conns.pool.clone();
    let rename = format!("ALTER TABLE {t} RENAME COLUMN attempt TO renamed");
    let renamed = tokio::spawn(async move {
        sqlx::raw_sql(sqlx::AssertSqlSafe(rename))
            .execute(&pool)
            .await
    });
    let began = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = '{t}'::regclass"
        )))
        .fetch_one(&conns.pool)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the rename never waited for the batch's transaction"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Ok((settled, None)) = form
        .settle_and_claim::<Pg>(&conns, &acks(1..=16), conn, 16)
        .await
    else {
        panic!("settled, and claimed nothing");
    };
    assert!(
        settled.unwrap().iter().all(Result::is_ok),
        "the batch settled"
    );
    renamed.await.unwrap().unwrap();
    assert_eq!(
        left(&conns, &t).await,
        (ids(17, 40), ids(17, 40)),
        "the batch gone, nothing held"
    );
    close(conns, &t).await;
}

#[tokio::test]
async fn a_batch_with_a_retry_is_not_settled_with_a_claim() {
    let Some((form, conns, t)) = form("retry", 40).await else {
        return;
    };
    let conn = claim(&form, &conns, 1).await;
    let mut settlements = acks(1..=16);
    settlements[4].1 = Outcome::retry();
    let Err(conn) = form
        .settle_and_claim::<Pg>(&conns, &settlements, conn, 16)
        .await
    else {
        panic!("not joined");
    };
    assert_eq!(
        left(&conns, &t).await,
        (ids(1, 40), ids(17, 40)),
        "nothing ran"
    );
    <RowLockForm as Form<Pg>>::release_batch(&form, &conns, &ids(1, 16), conn).await;
    close(conns, &t).await;
}
