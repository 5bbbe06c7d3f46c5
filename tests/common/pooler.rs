//! PostgreSQL behind a transaction pooler: PgBouncer in `pool_mode = transaction` (`.ci/run`
//! starts one on port 6432 in front of the PostgreSQL of `SQLX_QUEUE_PG_URL`), whose URL is
//! `SQLX_QUEUE_PGBOUNCER_URL`. The binaries that test through it (`cancel`, `rate`) connect here.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};

/// The variable that holds the pooler's URL.
const URL_VAR: &str = "SQLX_QUEUE_PGBOUNCER_URL";

/// A pool of `max` connections through the pooler, or `None` (with a notice) when its URL is
/// not set and not required (`SQLX_QUEUE_REQUIRE_ALL=1` requires it).
pub(crate) async fn pooled(max: u32) -> Option<PgPool> {
    let url = match std::env::var(URL_VAR) {
        Ok(url) => url,
        Err(_) if super::required() => {
            panic!("{URL_VAR} is not set, and SQLX_QUEUE_REQUIRE_ALL=1 requires every database")
        }
        Err(_) => {
            super::note_once(format!(
                "note: {URL_VAR} is not set: the PgBouncer tests are skipped (set it, or run \
                 .ci/run)"
            ));
            return None;
        }
    };
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(20))
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PgBouncer at {url}: {e}"));
    Some(pool)
}
