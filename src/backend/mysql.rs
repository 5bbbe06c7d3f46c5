//! MySQL and MariaDB's driver calls: the insert id from the driver, `max_allowed_packet`, ending
//! a session with `KILL`.

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use sqlx::{MySql, SqlStr};

use super::driver::Driver;
use super::{Backend, InsertFailed, Q};
use crate::table::{Dialect, Value, ValueKind};

impl Backend for MySql {}

impl Driver for MySql {
    const DIALECT: Dialect = Dialect::MySql;

    driver_common!();
    prepare_untyped!();

    /// MySQL and MariaDB refuse a statement larger than their `max_allowed_packet` with
    /// error 1153 — or, when they close the connection first, with a reset while the
    /// statement is sent, which is taken for the same cause from 1 MiB on (no server takes
    /// less than 1 KiB, hardly any less than 1 MiB; below that a broken connection is more
    /// likely something else, and is reported as it is).
    fn too_large(error: &sqlx::Error, bytes: usize) -> Option<&'static str> {
        use std::io::ErrorKind;
        let too_large = match error {
            sqlx::Error::Database(e) => e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == 1153),
            sqlx::Error::Io(e) => {
                bytes >= 1 << 20
                    && matches!(
                        e.kind(),
                        ErrorKind::ConnectionReset
                            | ErrorKind::ConnectionAborted
                            | ErrorKind::BrokenPipe
                            | ErrorKind::UnexpectedEof
                    )
            }
            _ => false,
        };
        too_large.then_some("max_allowed_packet")
    }

    async fn insert_id_on(
        conn: &mut Self::Connection,
        query: Q<Self>,
    ) -> Result<i64, InsertFailed> {
        let id = query.execute(&mut *conn).await?.last_insert_id();
        i64::try_from(id).map_err(|_| InsertFailed::IdOutOfRange(id))
    }

    fn insert_id<'e, 'c: 'e, E>(
        executor: E,
        query: Q<Self>,
        _returning: bool,
    ) -> BoxFuture<'e, Result<i64, InsertFailed>>
    where
        E: 'e + sqlx::Executor<'c, Database = Self>,
    {
        Box::pin(async move {
            let id = query.execute(executor).await?.last_insert_id();
            i64::try_from(id).map_err(|_| InsertFailed::IdOutOfRange(id))
        })
    }

    async fn end_session(conn: &mut Self::Connection, session: i64) -> Result<(), sqlx::Error> {
        // An integer, formatted: `KILL` takes no placeholder on every server.
        let kill = format!("KILL {session}");
        match sqlx::raw_sql(sqlx::AssertSqlSafe(kill)).execute(conn).await {
            // 1094: no such thread — it ended meanwhile.
            Err(sqlx::Error::Database(error))
                if error.code().as_deref() == Some("HY000")
                    && error.message().contains("Unknown thread") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    async fn server(
        conn: &mut Self::Connection,
    ) -> Result<(String, Option<DateTime<Utc>>), sqlx::Error> {
        let (version, now): (String, DateTime<Utc>) =
            sqlx::query_as("SELECT CAST(VERSION() AS CHAR), UTC_TIMESTAMP(6)")
                .fetch_one(conn)
                .await?;
        Ok((version, Some(now)))
    }
}
